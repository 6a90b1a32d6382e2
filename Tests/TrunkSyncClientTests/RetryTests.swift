import Foundation
import Postgres
import TestSupport
import TrunkSyncClient
import XCTest

/// `429` and `503` from the real server are retried after the `Retry-After` it sent.
final class RetryTests: ClientTestCase {
    /// The server's per-IP limit on `/auth/v1/token` (1 per 2 s here) answers `429` with
    /// `Retry-After`; the client waits that long and the refresh then succeeds.
    func testA429IsRetriedAfterItsRetryAfter() async throws {
        let server = try startServer(["TRUNK_SYNC_RATE_LIMIT_TOKEN": "1/2"])
        let events = EventLogBox()
        let client = try makeClient(server, storage: try makeStorage(), events: events)
        try await signIn(client, server, as: "limited@example.com")
        // Three refreshes at once: at least two fall in one 2-second window.
        for _ in 0..<3 { try await client.refreshSession() }
        XCTAssertEqual(events.refreshes.count, 3, "every refresh succeeded in the end")
        let limited = events.retries.filter { $0.status == 429 }
        XCTAssertFalse(limited.isEmpty, "no 429 seen")
        let sent = events.requests("POST", "/auth/v1/token")
        for retry in limited {
            let retryAfter = try XCTUnwrap(retry.retryAfter)
            XCTAssertGreaterThanOrEqual(retryAfter, 1)
            XCTAssertGreaterThanOrEqual(retry.delay, retryAfter)
            let next = try XCTUnwrap(sent.first { $0 > retry.at }, "no request after the 429")
            XCTAssertGreaterThanOrEqual(next.timeIntervalSince(retry.at), retryAfter - 0.01, "waited Retry-After")
        }
        _ = try await client.record(type: "note", payload: ["after": "429"])
        try await assertEqual(try await client.push().pushed, 1, "the refreshed session works")
    }

    /// With one pool connection held by a request stuck on a lock, a push gets `503
    /// database_busy` with `Retry-After: 1`; the client waits a second and succeeds.
    func testA503IsRetriedAfterItsRetryAfter() async throws {
        // One loop, so one pool of one connection: the pull below holds it (with N loops, each
        // has its own share, and the push would find a free one and wait on the lock).
        let server = try startServer([
            "TRUNK_SYNC_DB_POOL_SIZE": "1", "TRUNK_SYNC_DB_POOL_TIMEOUT": "1", "TRUNK_SYNC_EVENT_LOOPS": "1",
        ])
        let events = EventLogBox()
        let client = try makeClient(server, storage: try makeStorage(), events: events)
        try await signIn(client, server, as: "busy@example.com")
        for index in 0..<5 { _ = try await client.record(type: "busy", payload: ["index": index]) }
        let token = try await client.accessToken()

        // Hold the only pool connection: a pull waits on a lock the test holds.
        let (blocker, stuck) = try await holdThePoolConnection(server, token: token)

        // Let it go once the client was told to come back.
        let released = Done()
        events.onEvent { event in
            guard case .retrying(_, "/sync/v1/events", 503, _, _, _, _) = event else { return }
            Thread.detachNewThread {
                try? blocker.run("commit")
                released.signal()
            }
        }
        let report = try await withTimeout(30, "push through a busy pool") { try await client.push() }
        XCTAssertTrue(released.wait(timeout: 10))
        XCTAssertEqual(report.pushed, 5)
        try await assertEqual((try await stuck.value).status, 200)

        let busy = try XCTUnwrap(events.retries.first { $0.status == 503 })
        XCTAssertEqual(busy.retryAfter, 1)
        let next = try XCTUnwrap(events.requests("POST", "/sync/v1/events").first { $0 > busy.at })
        XCTAssertGreaterThanOrEqual(next.timeIntervalSince(busy.at), 1 - 0.01, "waited Retry-After")
        XCTAssertEqual(try serverEvents(server, "busy@example.com").count, 5)
    }
}

extension ClientTestCase {
    /// On a server with one pool connection (`TRUNK_SYNC_DB_POOL_SIZE` 1, one event loop),
    /// takes that connection: a pull waits on a lock the test holds until `blocker` commits.
    func holdThePoolConnection(
        _ server: SyncServer, token: String
    ) async throws -> (blocker: LockedConnection, stuck: Task<(status: Int, body: String), Error>) {
        let blocker = LockedConnection(try server.connect())
        try blocker.run("begin; lock table events in access exclusive mode")
        let pullURL = URL(string: "\(server.url.absoluteString)/sync/v1/events?after=0")!
        let stuck = Task { try await rawRequest("GET", pullURL, token: token) }
        let observer = LockedConnection(try server.connect())
        let holding = await waitUntil(10) {
            let waiting = try? observer.text(
                "select count(*)::text from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'"
            )
            return waiting == "1"
        }
        XCTAssertTrue(holding, "the pull did not take the pool's connection")
        return (blocker, stuck)
    }
}

/// A database connection used from the test and from one background thread, one at a time.
final class LockedConnection: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private let connection: PostgresConnection
    init(_ connection: PostgresConnection) { self.connection = connection }
    func run(_ sql: String) throws { try lock.withLock { try connection.execute(sql) } }
    /// The first column of the first row.
    func text(_ sql: String) throws -> String? {
        try lock.withLock {
            let rows = try connection.query(sql)
            return rows.isEmpty ? nil : try rows[0].decode(String?.self, column: 0)
        }
    }
}
