import Foundation
import Logging
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// Signing out, deleting a user and reusing a refresh token end the session's access
/// tokens on every route of every instance within a second.
final class RevocationTests: XCTestCase {
    var app: AppHarness!
    var second: AppHarness!

    override func setUp() async throws {
        app = try await AppHarness()
        second = try await AppHarness(sharing: app)
    }

    override func tearDown() async throws {
        await second.stop()
        await app.stop()
    }

    /// A route of each family that takes an access token.
    static let routes = ["/sync/v1/events", "/rest/v1/events", "/auth/v1/user"]

    func assertAccepted(_ token: String, on instances: [AppHarness], file: StaticString = #filePath, line: UInt = #line)
        async throws
    {
        for instance in instances {
            for path in Self.routes {
                let response = try await instance.request("GET", path, bearer: token)
                XCTAssertEqual(response.status, 200, "\(path): \(response.text)", file: file, line: line)
            }
        }
    }

    /// Every route of every instance answers `401` to `token` by one second after `since`
    /// (polled, not slept: the bound is the assertion).
    func assertRefusedWithinASecond(
        _ token: String, on instances: [AppHarness], since: ContinuousClock.Instant, file: StaticString = #filePath,
        line: UInt = #line
    ) async throws {
        let deadline = since + .seconds(1)
        for (index, instance) in instances.enumerated() {
            for path in Self.routes {
                var response = try await instance.request("GET", path, bearer: token)
                while response.status != 401, ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(10))
                    response = try await instance.request("GET", path, bearer: token)
                }
                XCTAssertEqual(
                    response.status, 401,
                    "instance \(index), \(path) still accepts the token after a second: \(response.text)",
                    file: file, line: line)
            }
        }
        let push = try await instances[instances.count - 1].request(
            "POST", "/sync/v1/events", json: ["events": [SyncTests.event()]], bearer: token)
        XCTAssertEqual(push.status, 401, file: file, line: line)
    }

    func testLogoutEndsTheAccessTokenOnEveryRouteOfEveryInstanceWithinASecond() async throws {
        let session = try await app.signIn("leaving@example.com")
        let token = try XCTUnwrap(session["access_token"] as? String)
        // On both: each route's pool then holds an open connection (the sign-out below needs one).
        try await assertAccepted(token, on: [app, second])
        let logout = try await app.request("POST", "/auth/v1/logout?scope=local", bearer: token)
        XCTAssertEqual(logout.status, 204)
        let loggedOut = ContinuousClock.now
        // The instance that signed out knows before it answers; the other within a second.
        let same = try await app.request("GET", "/sync/v1/events", bearer: token)
        XCTAssertEqual(same.status, 401)
        try await assertRefusedWithinASecond(token, on: [app, second], since: loggedOut)
        let user = try await second.request("GET", "/auth/v1/user", bearer: token)
        XCTAssertEqual(user.json["code"] as? String, "session_not_found")
        XCTAssertEqual(user.json["error_code"] as? String, "session_not_found")
        // An instance started afterwards loads the revocation before it serves.
        let third = try await AppHarness(sharing: app)
        for path in Self.routes {
            let response = try await third.request("GET", path, bearer: token)
            XCTAssertEqual(response.status, 401, path)
        }
        await third.stop()
    }

    func testGlobalLogoutThroughTheOtherInstanceEndsEverySession() async throws {
        let firstSession = try await app.signIn("many@example.com")
        let secondSession = try await app.signInAfterResendInterval("many@example.com")
        let one = try XCTUnwrap(firstSession["access_token"] as? String)
        let two = try XCTUnwrap(secondSession["access_token"] as? String)
        let other = try await app.token("bystander@example.com")
        let logout = try await second.request("POST", "/auth/v1/logout", bearer: two)
        XCTAssertEqual(logout.status, 204)
        let loggedOut = ContinuousClock.now
        try await assertRefusedWithinASecond(one, on: [app, second], since: loggedOut)
        try await assertRefusedWithinASecond(two, on: [app, second], since: loggedOut)
        try await assertAccepted(other, on: [app, second])
    }

    func testUsersDeleteEndsTheUsersTokensEverywhere() async throws {
        let token = try await app.token("deleted@example.com")
        // On both: each route's pool then holds an open connection (the sign-out below needs one).
        try await assertAccepted(token, on: [app, second])
        let result = try Command.run(
            Command.trunkSyncBinary(), ["users", "delete", "--yes", "deleted@example.com"],
            environment: Command.environment([
                "TRUNK_SYNC_DATABASE_URL": try TestDatabase.url(of: app.database),
                "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
            ]))
        XCTAssertEqual(result.status, 0, result.stderr)
        try await assertRefusedWithinASecond(token, on: [app, second], since: .now)
    }

    func testRefreshTokenReuseEndsTheSessionsAccessTokensEverywhere() async throws {
        let session = try await app.signIn("stolen@example.com")
        let first = try XCTUnwrap(session["access_token"] as? String)
        let refresh = try XCTUnwrap(session["refresh_token"] as? String)
        let rotated = try await second.request(
            "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": refresh])
        XCTAssertEqual(rotated.status, 200, rotated.text)
        let newer = try XCTUnwrap(rotated.json["access_token"] as? String)
        try await assertAccepted(newer, on: [app, second])
        // The owner's device rotates again; the thief replays the first token a minute later.
        let rotatedAgain = try await app.request(
            "POST", "/auth/v1/token?grant_type=refresh_token",
            json: ["refresh_token": try XCTUnwrap(rotated.json["refresh_token"] as? String)])
        XCTAssertEqual(rotatedAgain.status, 200, rotatedAgain.text)
        try app.owner().query(
            "update refresh_tokens set rotated_at = now() - interval '1 minute' where rotated_at is not null")
        let reused = try await app.request(
            "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": refresh])
        XCTAssertEqual(reused.json["code"] as? String, "refresh_token_already_used")
        let detected = ContinuousClock.now
        try await assertRefusedWithinASecond(first, on: [app, second], since: detected)
        try await assertRefusedWithinASecond(newer, on: [app, second], since: detected)
        let newest = try XCTUnwrap(rotatedAgain.json["access_token"] as? String)
        try await assertRefusedWithinASecond(newest, on: [app, second], since: detected)
        // The revocation lasts as long as the newest token issued for the session.
        let expiry = try app.owner().query(
            "select floor(extract(epoch from expires_at))::int8 from session_revocations")[0].decode(
                Int64.self, column: 0)
        XCTAssertEqual(expiry, Int64(try XCTUnwrap(rotatedAgain.json["expires_at"] as? Int)))
    }

    /// A long-poll of `token` on the second instance, returned once it waits.
    func longPollOnSecond(_ token: String, wait: Int, file: StaticString = #filePath, line: UInt = #line)
        async throws -> Task<AppHarness.Response, any Error>
    {
        let polling = Task { [second] in
            try await second!.request("GET", "/sync/v1/events?after=0&wait=\(wait)", bearer: token)
        }
        let deadline = ContinuousClock.now + .seconds(10)
        while second.application.notifier.waiting == 0, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        XCTAssertEqual(second.application.notifier.waiting, 1, file: file, line: line)
        return polling
    }

    /// Returns once the second instance's listener is down (the outage cut it), at most 5 s.
    func waitUntilSecondStopsListening() async throws {
        let deadline = ContinuousClock.now + .seconds(5)
        while second.application.notifier.isListening, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    func testALongPollOfARevokedSessionEnds() async throws {
        let token = try await app.token("polling@example.com")
        let polling = try await longPollOnSecond(token, wait: 30)
        let logout = try await app.request("POST", "/auth/v1/logout", bearer: token)
        XCTAssertEqual(logout.status, 204)
        let loggedOut = ContinuousClock.now
        let answer = try await polling.value
        XCTAssertLessThan(loggedOut.duration(to: .now), .seconds(1))
        XCTAssertEqual(answer.status, 401, answer.text)
        XCTAssertEqual(second.application.notifier.waiting, 0)
    }

    func testAnInstanceThatLostItsListenerReloadsTheRevocationsItMissed() async throws {
        let token = try await app.token("missed@example.com")
        // On both: each route's pool then holds an open connection (the sign-out below needs one).
        try await assertAccepted(token, on: [app, second])
        // No new connection to the database for a moment, and both listeners cut: the
        // notification of the sign-out below reaches no one.
        let outage = try app.cutListeners()
        defer { outage.end() }
        XCTAssertEqual(outage.listenersCut, 2)
        try await waitUntilSecondStopsListening()
        let logout = try await app.request("POST", "/auth/v1/logout", bearer: token)
        XCTAssertEqual(logout.status, 204)
        try await Task.sleep(for: .milliseconds(300))
        let missed = try await second.request("GET", "/sync/v1/events", bearer: token)
        // The token still passes on the second instance: the notification was lost. (While new
        // connections are refused, the pull itself may find its loop's share of the pool without
        // an open connection and answer 503; the token was checked before, in memory.)
        XCTAssertTrue(
            [200, 503].contains(missed.status), "the notification was not lost; the test proves nothing: \(missed.text)"
        )
        // Connections allowed again: the listener reconnects and reloads what it missed.
        outage.end()
        let reconnected = ContinuousClock.now
        var response = missed
        while response.status != 401, ContinuousClock.now < reconnected + .seconds(10) {
            try await Task.sleep(for: .milliseconds(20))
            response = try await second.request("GET", "/sync/v1/events", bearer: token)
        }
        XCTAssertEqual(response.status, 401)
    }

    /// A long-poll waiting through a listener outage ends when the reload brings the sign-out
    /// it missed, not when its wait runs out: the reconnect wakes every waiter before the
    /// reload has answered, so the reload wakes the users it learnt of again.
    func testALongPollOfASessionRevokedDuringAnOutageEndsWithTheReload() async throws {
        let token = try await app.token("missed-poll@example.com")
        try await assertAccepted(token, on: [app, second])
        let polling = try await longPollOnSecond(token, wait: 50)
        let outage = try app.cutListeners()
        defer { outage.end() }
        try await waitUntilSecondStopsListening()
        let logout = try await app.request("POST", "/auth/v1/logout", bearer: token)
        XCTAssertEqual(logout.status, 204)
        let missed = try await second.request("GET", "/sync/v1/events", bearer: token)
        // The token still passes on the second instance: the notification was lost. (While new
        // connections are refused, the pull itself may find its loop's share of the pool without
        // an open connection and answer 503; the token was checked before, in memory.)
        XCTAssertTrue(
            [200, 503].contains(missed.status), "the notification was not lost; the test proves nothing: \(missed.text)"
        )
        outage.end()
        let reconnected = ContinuousClock.now
        let answer = try await polling.value
        XCTAssertEqual(answer.status, 401, answer.text)
        // The listener retries within 5 s; the wait would have run out 50 s after it began.
        XCTAssertLessThan(reconnected.duration(to: .now), .seconds(30), "the long-poll waited for its own end")
    }
}

/// The in-memory set on its own: bounded by the tokens' lifetime.
final class SessionRevocationsTests: XCTestCase {
    func testEntriesLastAsLongAsTheSessionsTokensThenGo() {
        let revocations = SessionRevocations(database: nil, logger: TestDatabase.quietLogger)
        let now: Int64 = 1_800_000_000
        let (fresh, stale, user) = (UUID(), UUID(), UUID())
        XCTAssertFalse(revocations.isRevoked(fresh))
        revocations.record([(fresh, user, now + 3600), (stale, user, now - 3600)], now: now)
        XCTAssertTrue(revocations.isRevoked(fresh))
        XCTAssertFalse(revocations.isRevoked(stale), "its tokens expired long ago: not kept")
        XCTAssertEqual(revocations.count, 1)
        // Still there while a token of the session could verify (expiry + leeway + a minute).
        revocations.record([(UUID(), user, now + 7200)], now: now + 3600 + SessionRevocations.margin)
        XCTAssertTrue(revocations.isRevoked(fresh))
        revocations.record([(UUID(), user, now + 7200)], now: now + 3600 + SessionRevocations.margin + 61)
        XCTAssertFalse(revocations.isRevoked(fresh))
        XCTAssertEqual(revocations.count, 2)
    }

    /// A pass over a user's streams (the hub's fan-out) asks per stream, mostly of one session.
    func testRevokedSessionsAnswersPerSessionAsTheSetDoes() {
        let revocations = SessionRevocations(database: nil, logger: TestDatabase.quietLogger)
        let now: Int64 = 1_800_000_000
        let (signedOut, active, other, user) = (UUID(), UUID(), UUID(), UUID())
        revocations.record([(signedOut, user, now + 3600)], now: now)
        var pass = RevokedSessions(revocations)
        // In runs and interleaved: the last one remembered, the others looked up once.
        for session in [active, active, signedOut, signedOut, active, other, signedOut, other, other] {
            XCTAssertEqual(pass.contains(session), session == signedOut, "\(session)")
        }
        // Revoked after the pass began: the next pass sees it.
        revocations.record([(active, user, now + 3600)], now: now)
        var next = RevokedSessions(revocations)
        XCTAssertTrue(next.contains(active))
        XCTAssertFalse(next.contains(other))
    }

    func testNotificationPayloads() {
        let (session, user) = (UUID(), UUID())
        let parsed = SessionRevocations.parse(
            "\(session.uuidString.lowercased()) \(user.uuidString.lowercased()) 1800000000")
        XCTAssertEqual(parsed?.session, session)
        XCTAssertEqual(parsed?.user, user)
        XCTAssertEqual(parsed?.tokensExpireAt, 1_800_000_000)
        for bad in ["", "x y z", "\(session) \(user)", "\(session) \(user) soon", "\(user)"] {
            XCTAssertNil(SessionRevocations.parse(bad), bad)
        }
    }
}
