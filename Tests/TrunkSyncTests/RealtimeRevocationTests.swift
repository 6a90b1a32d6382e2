import Foundation
import Logging
import TestSupport
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// Which channels a user's hub writes to. A channel of a signed-out session ends within a
/// second even when no wake-up reaches its hub: a channel registered just after the
/// revocation's wake-up (its token was checked before the revocation), or a revocation loaded
/// after the listener reconnected. A channel whose token expired gets no row, and channels the
/// server ended leave their socket. A channel that joins while the hub reads gets what
/// commits after its join.
final class RealtimeRevocationTests: XCTestCase {
    /// Runs `body` with an application, stopped however `body` ends.
    func withApp(_ body: (AppHarness) async throws -> Void) async throws {
        let app = try await AppHarness()
        do {
            try await body(app)
        } catch {
            await app.stop()
            throw error
        }
        await app.stop()
    }

    /// A channel of `email`'s new session (expiring at `expiresAt`, else when its token does),
    /// with `bindings`, joined on a feed of `app` whose revocations wake nobody (nothing follows
    /// the listener) and know only what a test records.
    func joinedChannel(
        _ app: AppHarness, _ email: String, expiresAt: Int64? = nil, bindings: [RealtimeBinding] = [],
        settings: RealtimeFeed.Settings = RealtimeFeed.Settings()
    ) async throws -> (feed: RealtimeFeed, revocations: SessionRevocations, channel: RealtimeChannel, token: String) {
        let session = try await app.application.auth.issueSession(email: try XCTUnwrap(Email(email)))
        let claims = try app.application.tokens.verify(session.accessToken, now: AuthService.now())
        let logger = Logger(label: "realtime-revocation-test")
        let revocations = SessionRevocations(database: nil, logger: logger)
        let feed = RealtimeFeed(
            settings: settings, database: app.application.database,
            notifier: app.application.notifier, revocations: revocations, tokens: app.application.tokens,
            metrics: Metrics(), logger: logger)
        let channel = RealtimeChannel(
            id: feed.nextChannelID(), user: claims.userID, session: claims.sessionID,
            expiresAt: expiresAt ?? claims.expiresAt, socket: WebSocket(settings: WebSocketSettings(), wake: {}),
            version: .v2, topic: "realtime:room", joinRef: "1", bindings: bindings)
        try await feed.join(channel)
        return (feed, revocations, channel, session.accessToken)
    }

    /// A binding of every insert into `public.events`.
    static let inserts = try! RealtimeBinding.parse(
        .object(["event": .string("INSERT"), "schema": .string("public"), "table": .string("events")]), id: 1)

    /// Pushes one event of `type` with `token`.
    static func push(_ app: AppHarness, _ token: String, type: String = "note") async throws {
        let event: [String: Any] = [
            "client_id": UUID().uuidString.lowercased(), "type": type, "payload": ["n": 1],
            "client_timestamp": "2026-11-22T04:10:02.123Z",
        ]
        let pushed = try await app.request("POST", "/sync/v1/events", json: ["events": [event]], bearer: token)
        XCTAssertEqual(pushed.status, 200, pushed.text)
    }

    /// What `channel`'s socket was sent, read until it holds `needle` (at most 30 s).
    func sent(to channel: RealtimeChannel, until needle: String) async throws -> String {
        var sent = ""
        let deadline = ContinuousClock.now + .seconds(30)
        while !sent.contains(needle), ContinuousClock.now < deadline {
            sent += String(decoding: channel.socket.writer.take().bytes.joined(), as: UTF8.self)
            try await Task.sleep(for: .milliseconds(5))
        }
        return sent
    }

    func testARevokedSessionEndsItsChannelWithoutAWakeUp() async throws {
        try await withApp { app in
            let (feed, revocations, channel, _) = try await joinedChannel(app, "realtime-revoked@example.com")
            revocations.record([(channel.auth.session, channel.user, channel.auth.expiresAt)])
            let deadline = ContinuousClock.now + .seconds(30)
            while !channel.isEnded, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
            }
            XCTAssertTrue(channel.isEnded, "the channel of a signed-out session is still joined")
            let sent = String(decoding: channel.socket.writer.take().bytes.joined(), as: UTF8.self)
            XCTAssertTrue(sent.contains("The session was signed out"), sent)
            XCTAssertTrue(sent.contains("phx_close"), sent)
            XCTAssertEqual(feed.channelCount, 0)
            feed.close()
        }
    }

    /// A channel whose token's `exp` passed gets no row: the fan-out ends it before it sends,
    /// not only the tick once a second. (Here the row is pushed right after the join, well
    /// before the tick's first round.)
    func testAChannelWhoseTokenExpiredGetsNoRow() async throws {
        try await withApp { app in
            let (feed, _, channel, token) = try await joinedChannel(
                app, "realtime-expired@example.com", expiresAt: AuthService.now() - 1, bindings: [Self.inserts])
            try await Self.push(app, token)
            let sent = try await sent(to: channel, until: "phx_close")
            XCTAssertTrue(channel.isEnded, "the channel of an expired token is still joined")
            XCTAssertTrue(sent.contains("Token has expired"), sent)
            XCTAssertFalse(sent.contains("postgres_changes\",{"), "a row went to an expired token: \(sent)")
            feed.close()
        }
    }

    /// A channel that joins while its hub reads new rows gets a row committed after its join:
    /// the hub sends to the channels there are once it has read, so its cursor does not move
    /// past that row without it. (The read is held until the join and the commit are done.)
    func testAChannelJoinedDuringAReadGetsWhatCommitsAfterItsJoin() async throws {
        let gate = ReadGate()
        var settings = RealtimeFeed.Settings()
        settings.beforeEventsRead = { await gate.pass() }
        try await withApp { app in
            let (feed, _, first, token) = try await joinedChannel(
                app, "realtime-race@example.com", bindings: [Self.inserts], settings: settings)
            try await Self.push(app, token)  // the hub wakes and reads, held at the gate
            let deadline = ContinuousClock.now + .seconds(30)
            while await gate.reads == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
            let reads = await gate.reads
            XCTAssertEqual(reads, 1, "the hub did not read")
            let second = RealtimeChannel(
                id: feed.nextChannelID(), user: first.user, session: first.auth.session,
                expiresAt: first.auth.expiresAt, socket: WebSocket(settings: WebSocketSettings(), wake: {}),
                version: .v2, topic: "realtime:late", joinRef: "2", bindings: [Self.inserts])
            try await feed.join(second)
            try await Self.push(app, token, type: "after-the-join")
            await gate.open()
            let sent = try await sent(to: second, until: "after-the-join")
            XCTAssertTrue(sent.contains("after-the-join"), "a row committed after the join was not sent: \(sent)")
            feed.close()
        }
    }

    /// A change that commits while a join is under way (its channel live with the hub, its
    /// reply not sent yet) comes after the join's `ok` and `system` message: the clients
    /// match changes by the ids the reply gives and drop one that comes before it. (The join
    /// is held there until the hub has sent the change.)
    func testAChangeDuringAJoinComesAfterItsReply() async throws {
        let gate = ReadGate()
        try await withApp { app in
            let token = try await app.token("realtime-order@example.com")
            let harness = try RealtimeJoinGraceTests.Harness(app, grace: .seconds(3600)) {
                $0.afterJoinRegistered = { await gate.pass() }
            }
            harness.send(RealtimeAccessTokenTests.join("1", token: token))
            let deadline = ContinuousClock.now + .seconds(30)
            while await gate.reads == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
            try await Self.push(app, token, type: "during-the-join")
            while harness.feed.sent.value == 0, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(5))
            }
            XCTAssertEqual(harness.feed.sent.value, 1, "the hub did not send the change")
            await gate.open()
            let arrived = try await harness.waitFor("during-the-join")
            XCTAssertTrue(arrived)
            let replied = try await harness.waitFor(#""phx_reply",{"status":"ok""#)
            XCTAssertTrue(replied)
            let sent = harness.sent
            let reply = try XCTUnwrap(sent.range(of: #""phx_reply",{"status":"ok""#), sent)
            let system = try XCTUnwrap(sent.range(of: "Subscribed to PostgreSQL"), sent)
            let change = try XCTUnwrap(sent.range(of: "during-the-join"), sent)
            XCTAssertLessThan(reply.lowerBound, system.lowerBound, sent)
            XCTAssertLessThan(system.lowerBound, change.lowerBound, "a change came before the join's reply: \(sent)")
            await harness.finish()
        }
    }

    /// A channel on the app's key (its client signed out) keeps the session and expiry of its
    /// last user token: it ends at that `exp` as any channel does.
    func testAWithheldChannelStillEndsAtItsLastTokensExpiry() async throws {
        try await withApp { app in
            let (feed, _, channel, _) = try await joinedChannel(
                app, "realtime-withheld@example.com", bindings: [Self.inserts])
            let auth = channel.auth
            channel.withhold()
            XCTAssertFalse(channel.auth.delivering)
            XCTAssertEqual(channel.auth.session, auth.session)
            XCTAssertEqual(channel.auth.expiresAt, auth.expiresAt)
            XCTAssertFalse(feed.endIfUnauthorized(channel, now: auth.expiresAt - 1))
            XCTAssertTrue(feed.endIfUnauthorized(channel, now: auth.expiresAt), "a withheld channel outlived its exp")
            XCTAssertEqual(feed.channelCount, 0)
            feed.close()
        }
    }

    /// Channels the server ended (here a signed-out session's) leave their socket's count: a
    /// socket at its channel limit can join again, and an `access_token` for the ended topic is
    /// answered as for a topic not joined, not `ok`.
    func testChannelsTheServerEndedLeaveTheirSocket() async throws {
        try await withApp { app in
            let email = try XCTUnwrap(Email("realtime-ended@example.com"))
            let first = try await app.application.auth.issueSession(email: email)
            let claims = try app.application.tokens.verify(first.accessToken, now: AuthService.now())
            let harness = try RealtimeJoinGraceTests.Harness(app, grace: .seconds(3600), maxChannelsPerSocket: 1)
            let joined = try await harness.join("1", topic: "realtime:a", token: first.accessToken)
            XCTAssertTrue(joined, "the join was refused")
            harness.revocations.record([(claims.sessionID, claims.userID, claims.expiresAt)])
            let ended = try await harness.waitFor(#""realtime:a","phx_close""#)
            XCTAssertTrue(ended, "the signed-out session's channel was not ended")

            let second = try await app.application.auth.issueSession(email: email)
            let rejoined = try await harness.join("2", topic: "realtime:b", token: second.accessToken)
            XCTAssertTrue(rejoined, "the ended channel still counted against the socket's limit")
            harness.send(#"["1","3","realtime:a","access_token",{"access_token":"\#(second.accessToken)"}]"#)
            let refused = try await harness.waitFor(
                #""3","realtime:a","phx_reply",{"status":"error","response":{"reason":"unmatched topic"}}"#)
            XCTAssertTrue(refused, "an access_token for an ended channel was not refused")
            await harness.finish()
        }
    }
}

/// Holds the first read until `open` (later reads pass), and counts them.
actor ReadGate {
    private(set) var reads = 0
    private var opened = false
    private var held: CheckedContinuation<Void, Never>? = nil

    func pass() async {
        reads += 1
        guard !opened else { return }
        await withCheckedContinuation { held = $0 }
    }

    func open() {
        opened = true
        held?.resume()
        held = nil
    }
}
