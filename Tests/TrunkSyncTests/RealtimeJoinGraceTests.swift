import Foundation
import Logging
import TestSupport
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// A Realtime socket takes one of the instance's slots from its upgrade on: one that joins
/// no channel within its grace is closed, so idle sockets (heartbeats only) from a few
/// addresses cannot hold every slot. One that joined once is never closed for it. The grace
/// is ended by hand here (the timer's part) except in the test of the timer itself.
final class RealtimeJoinGraceTests: XCTestCase {
    /// A session on an in-process socket: messages are delivered to it and what it sends is
    /// read back, as the event loop would.
    final class Harness: @unchecked Sendable {
        let feed: RealtimeFeed
        let socket = WebSocket(settings: WebSocketSettings(), wake: {})
        let grace: RealtimeJoinGrace
        let logs = LogLines()
        /// The feed's revocations (told nothing by the database): a test records its own.
        let revocations: SessionRevocations
        private let task: Task<Void, Never>
        /// What the session sent so far, as far as `waitFor` read it.
        private(set) var sent = ""

        /// `feed`: another harness's, for several sockets on one feed. `apiKey`: the `apikey`
        /// the socket was opened with. `configure`: the feed's other settings.
        init(
            _ app: AppHarness, grace duration: Duration, maxChannelsPerUser: Int = 100, maxChannelsPerSocket: Int = 100,
            feed shared: RealtimeFeed? = nil, apiKey: String? = nil,
            configure: (inout RealtimeFeed.Settings) -> Void = { _ in }
        )
            throws
        {
            var settings = RealtimeFeed.Settings()
            settings.joinGrace = duration
            settings.maxChannelsPerUser = maxChannelsPerUser
            settings.maxChannelsPerSocket = maxChannelsPerSocket
            configure(&settings)
            let logs = self.logs
            var logger = Logger(label: "realtime-grace-test", factory: { _ in CapturingLogHandler(lines: logs) })
            logger.logLevel = .info
            revocations = shared?.revocations ?? SessionRevocations(database: nil, logger: logger)
            feed =
                shared
                ?? RealtimeFeed(
                    settings: settings, database: app.application.database, notifier: app.application.notifier,
                    revocations: revocations, tokens: app.application.tokens, metrics: Metrics(), logger: logger)
            try feed.openSocket()
            let session = RealtimeSession(
                feed: feed, socket: socket, version: .v2, address: "203.0.113.7", apiKey: apiKey)
            grace = session.grace
            task = Task {
                var session = session
                await session.run()
            }
        }

        func send(_ text: String) { _ = socket.deliver(.text(Array(text.utf8))) }

        /// Waits until the session has sent `needle` (a readiness check, not a timing); false
        /// if the socket was closed without it.
        @discardableResult
        func waitFor(_ needle: String) async throws -> Bool {
            let deadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < deadline {
                let closed = socket.isClosed
                sent += String(decoding: socket.writer.take().bytes.joined(), as: UTF8.self)
                if sent.contains(needle) { return true }
                if closed { return false }
                try await Task.sleep(for: .milliseconds(5))
            }
            XCTFail("the session never sent \(needle): \(sent)")
            return false
        }

        /// A heartbeat; false if the socket was closed before its answer.
        @discardableResult
        func heartbeat(_ ref: Int) async throws -> Bool {
            send(#"[null,"h\#(ref)","phoenix","heartbeat",{}]"#)
            return try await waitFor(#""h\#(ref)","phoenix","phx_reply",{"status":"ok""#)
        }

        func join(_ ref: String, topic: String = "realtime:room", token: String) async throws -> Bool {
            send(
                #"["\#(ref)","\#(ref)","\#(topic)","phx_join",{"config":{"postgres_changes":[]},"access_token":"\#(token)"}]"#
            )
            try await waitFor(#""\#(ref)","\#(topic)","phx_reply",{"status":""#)
            return sent.contains(#""\#(ref)","\#(topic)","phx_reply",{"status":"ok""#)
        }

        /// The connection ends (as the event loop ends it), and the session with it; then
        /// the feed is closed unless `keepFeed`.
        func finish(keepFeed: Bool = false) async {
            socket.connectionEnded()
            await task.value
            if !keepFeed { feed.close() }
        }
    }

    func withApp(_ body: (AppHarness, String) async throws -> Void) async throws {
        try await Self.withApp("realtime-grace@example.com", body)
    }

    /// Runs `body` with an application and an access token of `email`, the application
    /// stopped however `body` ends.
    static func withApp(_ email: String, _ body: (AppHarness, String) async throws -> Void) async throws {
        let app = try await AppHarness()
        do {
            let session = try await app.application.auth.issueSession(email: try XCTUnwrap(Email(email)))
            try await body(app, session.accessToken)
        } catch {
            await app.stop()
            throw error
        }
        await app.stop()
    }

    /// The timer itself, with a short grace: heartbeats answered all along do not keep a
    /// socket that never joined; it is closed with `1000` and a reason, and logged.
    func testASocketThatNeverJoinsIsClosedWhenItsGraceEndsHeartbeatsOrNot() async throws {
        try await withApp { app, _ in
            // Heartbeats as fast as they are answered: far more than a socket's message rate.
            let harness = try Harness(app, grace: .milliseconds(50)) { $0.maxMessagesPerSecond = 100_000 }
            var beats = 0
            let deadline = ContinuousClock.now + .seconds(30)
            while !harness.socket.isClosed, ContinuousClock.now < deadline {
                beats += 1
                try await harness.heartbeat(beats)
            }
            XCTAssertTrue(harness.socket.isClosed, "a socket without a channel was kept \(beats) heartbeats")
            XCTAssertTrue(harness.grace.isOver)
            let (code, reason) = harness.socket.closeRequest
            XCTAssertEqual(code, .normal)
            XCTAssertEqual(reason, "no channel joined within 50 ms")
            XCTAssertEqual(harness.feed.closedWithoutJoin.value, 1)
            XCTAssertTrue(
                harness.logs.lines.contains {
                    $0.hasPrefix("info realtime socket closed") && $0.contains("ip=203.0.113.7")
                },
                "\(harness.logs.lines)")
            await harness.finish()
            XCTAssertEqual(harness.feed.socketCount, 0, "the closed socket's slot was not given back")
        }
    }

    /// A socket that joined is kept when the grace ends, also once it left its last channel
    /// (the clients keep their socket then; closing it would make them reconnect in a loop;
    /// such sockets are capped per account instead, below).
    func testASocketThatJoinedIsKeptEvenAfterLeavingEveryChannel() async throws {
        try await withApp { app, token in
            let harness = try Harness(app, grace: .seconds(3600))
            let joined = try await harness.join("1", token: token)
            XCTAssertTrue(joined, "the join was refused")
            harness.send(#"["1","2","realtime:room","phx_leave",{}]"#)
            let closed = try await harness.waitFor(#""realtime:room","phx_close""#)
            XCTAssertTrue(closed, "no phx_close after phx_leave")
            XCTAssertEqual(harness.feed.channelCount, 0)
            harness.grace.end()
            let answered = try await harness.heartbeat(1)
            XCTAssertTrue(answered)
            XCTAssertFalse(harness.socket.isClosed, "a socket that had joined was closed")
            XCTAssertFalse(harness.logs.lines.contains { $0.contains("realtime socket closed") })
            await harness.finish()
        }
    }

    /// A channel joined with the app's key (no user yet: signed out, or before sign-in) is a
    /// joined channel: the socket is kept (realtime-js does not reconnect after a close with
    /// `1000`, so an app waiting on its sign-in screen would be left without Realtime).
    func testASocketThatJoinedWithTheAppsKeyIsKept() async throws {
        try await withApp { app, _ in
            let harness = try Harness(app, grace: .seconds(3600), apiKey: "anon-key")
            let joined = try await harness.join("1", token: "anon-key")
            XCTAssertTrue(joined, harness.sent)
            harness.grace.end()
            let answered = try await harness.heartbeat(1)
            XCTAssertTrue(answered)
            XCTAssertFalse(harness.socket.isClosed, "a socket with a channel joined with the key was closed")
            XCTAssertEqual(harness.feed.closedWithoutJoin.value, 0)
            await harness.finish()
        }
    }

    /// A socket that left its last channel stays open, but one account keeps at most
    /// `maxChannelsPerUser` of them: joining and leaving on socket after socket closes the
    /// oldest, so one account cannot hold every slot. A socket with a channel again is not
    /// counted; another account's are counted apart; ended sockets are forgotten.
    func testAnAccountsSocketsWithoutAChannelAreCapped() async throws {
        try await withApp { app, token in
            let first = try Harness(app, grace: .seconds(3600), maxChannelsPerUser: 2)
            let feed = first.feed
            var sockets = [first]
            for _ in 0..<3 { sockets.append(try Harness(app, grace: .seconds(3600), feed: feed)) }
            for harness in sockets.prefix(3) {
                let joined = try await harness.join("1", token: token)
                XCTAssertTrue(joined, "the join was refused")
                harness.send(#"["1","2","realtime:room","phx_leave",{}]"#)
                let closed = try await harness.waitFor(#""realtime:room","phx_close""#)
                XCTAssertTrue(closed, "no phx_close after phx_leave")
            }
            XCTAssertTrue(sockets[0].socket.isClosed, "the oldest of three sockets without a channel was kept")
            XCTAssertEqual(sockets[0].socket.closeRequest.0, .normal)
            XCTAssertEqual(sockets[0].socket.closeRequest.1, "this account has more than 2 sockets without a channel")
            XCTAssertFalse(sockets[1].socket.isClosed)
            XCTAssertFalse(sockets[2].socket.isClosed)
            XCTAssertEqual(feed.closedIdleOverCap.value, 1)
            XCTAssertEqual(feed.closedWithoutJoin.value, 0)
            XCTAssertEqual(feed.idleSocketCount, 2)
            XCTAssertTrue(
                first.logs.lines.contains { $0.contains("more sockets without a channel") }, "\(first.logs.lines)")

            // Joined again: not idle. Another account's idle socket counts apart.
            let rejoined = try await sockets[1].join("3", topic: "realtime:other", token: token)
            XCTAssertTrue(rejoined)
            XCTAssertEqual(feed.idleSocketCount, 1)
            let other = try await app.application.auth.issueSession(email: try XCTUnwrap(Email("other@example.com")))
            let joined = try await sockets[3].join("1", token: other.accessToken)
            XCTAssertTrue(joined)
            sockets[3].send(#"["1","2","realtime:room","phx_leave",{}]"#)
            let left = try await sockets[3].waitFor(#""realtime:room","phx_close""#)
            XCTAssertTrue(left)
            XCTAssertEqual(feed.idleSocketCount, 2)
            XCTAssertFalse(sockets[2].socket.isClosed, "another account's socket closed one of this account's")

            for harness in sockets { await harness.finish(keepFeed: true) }
            XCTAssertEqual(feed.socketCount, 0)
            XCTAssertEqual(feed.idleSocketCount, 0, "ended sockets were still counted")
            XCTAssertEqual(feed.channelCount, 0)
            feed.close()
        }
    }

    /// Refused joins (a bad token, a refused topic, none at all) do not count as joined.
    func testASocketWhoseJoinsWereAllRefusedIsClosed() async throws {
        try await withApp { app, token in
            let harness = try Harness(app, grace: .seconds(3600))
            var joined = try await harness.join("1", token: "not-a-token")
            XCTAssertFalse(joined)
            joined = try await harness.join("2", topic: "realtime:" + String(repeating: "t", count: 300), token: token)
            XCTAssertFalse(joined)
            joined = try await harness.join("3", token: "")
            XCTAssertFalse(joined)
            let answered = try await harness.heartbeat(1)
            XCTAssertTrue(answered)
            XCTAssertFalse(harness.socket.isClosed, "closed before the grace ended")
            harness.grace.end()
            XCTAssertTrue(harness.socket.isClosed, "a socket whose joins were all refused was kept")
            XCTAssertEqual(harness.feed.closedWithoutJoin.value, 1)
            XCTAssertEqual(harness.socket.closeRequest.0, .normal)
            await harness.finish()
        }
    }

    /// A join under way when the grace ends decides: a refused one closes the socket, an
    /// accepted one keeps it.
    func testAJoinUnderWayWhenTheGraceEndsDecides() async throws {
        try await withApp { app, _ in
            let refused = try Harness(app, grace: .seconds(3600))
            refused.grace.joinStarted()
            refused.grace.end()
            XCTAssertFalse(refused.socket.isClosed, "closed while a join was under way")
            refused.grace.joinEnded(succeeded: false)
            XCTAssertTrue(refused.socket.isClosed, "kept after its join was refused past the grace")
            await refused.finish()

            let accepted = try Harness(app, grace: .seconds(3600))
            accepted.grace.joinStarted()
            accepted.grace.end()
            accepted.grace.joinEnded(succeeded: true)
            XCTAssertFalse(accepted.socket.isClosed, "closed although its join was accepted")
            await accepted.finish()
        }
    }
}
