import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

/// Empty pulls answered from memory (`LastSeqCache`), against the real database and
/// listener: never staler than the notification of a commit, on any instance, and not
/// at all while the listener is away.
final class PullCacheTests: XCTestCase {
    var app: AppHarness!

    override func setUp() async throws {
        app = try await AppHarness()
        try await waitUntilListening(app)
    }
    override func tearDown() async throws { await app.stop() }

    func waitUntilListening(_ harness: AppHarness, _ listening: Bool = true) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while harness.application.notifier.isListening != listening, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        XCTAssertEqual(harness.application.notifier.isListening, listening)
    }

    func pull(_ harness: AppHarness, after: Int, token: String) async throws -> AppHarness.Response {
        let response = try await harness.request("GET", "/sync/v1/events?after=\(after)", bearer: token)
        XCTAssertEqual(response.status, 200, response.text)
        return response
    }

    func push(_ harness: AppHarness, token: String) async throws {
        let pushed = try await harness.request(
            "POST", "/sync/v1/events", json: ["events": [SyncTests.event()]], bearer: token)
        XCTAssertEqual(pushed.status, 200, pushed.text)
    }

    func events(_ response: AppHarness.Response) -> Int { (response.json["events"] as? [Any])?.count ?? -1 }

    func testAnEmptyPullIsAnsweredFromMemoryOnceTheDatabaseSaidSo() async throws {
        let token = try await app.token("memory@example.com")
        var first: AppHarness.Response?
        let asked = try await app.statements.during { first = try await pull(app, after: 0, token: token) }
        XCTAssertFalse(asked.isEmpty, "the first pull asks the database")
        var second: AppHarness.Response?
        let again = try await app.statements.during { second = try await pull(app, after: 0, token: token) }
        XCTAssertEqual(again, [], "known to be empty: no query")
        XCTAssertEqual(second?.body, first?.body, "the same answer, byte for byte")
        XCTAssertEqual(second?.json["next_after"] as? Int, 0)
        XCTAssertEqual(second?.json["has_more"] as? Bool, false)
    }

    func testAPushOnThisInstanceIsInTheVeryNextPull() async throws {
        let token = try await app.token("own@example.com")
        _ = try await pull(app, after: 0, token: token)
        try await push(app, token: token)
        let pulled = try await pull(app, after: 0, token: token)
        XCTAssertEqual(events(pulled), 1)
        // A full page that ends at the newest event teaches that too.
        _ = try await pull(app, after: 1, token: token)
        var next: AppHarness.Response?
        let known = try await app.statements.during { next = try await pull(app, after: 1, token: token) }
        XCTAssertEqual(known, [])
        XCTAssertEqual(next.map(events), 0)
    }

    func testAPushThroughAnotherInstanceIsSeenWithinTheNotificationDelay() async throws {
        let second = try await AppHarness(sharing: app)
        try await waitUntilListening(second)
        let token = try await app.token("elsewhere@example.com")
        _ = try await pull(app, after: 0, token: token)
        try await push(second, token: token)
        let pushed = ContinuousClock.now
        var seen = 0
        while seen == 0, ContinuousClock.now < pushed + .seconds(5) {
            seen = events(try await pull(app, after: 0, token: token))
        }
        XCTAssertEqual(seen, 1)
        XCTAssertLessThan(pushed.duration(to: .now), .seconds(1))
        await second.stop()
    }

    func testWhileTheListenerIsAwayEveryPullAsksTheDatabase() async throws {
        let second = try await AppHarness(sharing: app)
        let token = try await app.token("away@example.com")
        _ = try await pull(second, after: 0, token: token)  // opens the second instance's connection
        _ = try await pull(app, after: 0, token: token)
        let known = try await app.statements.during { _ = try await pull(app, after: 0, token: token) }
        XCTAssertEqual(known, [])
        // No new connection to the database for a moment, and both listeners cut: the
        // notification of the push below reaches no one.
        let outage = try app.cutListeners()
        defer { outage.end() }
        XCTAssertEqual(outage.listenersCut, 2)
        try await waitUntilListening(app, false)
        try await push(second, token: token)
        let asked = try await pull(app, after: 0, token: token)
        XCTAssertEqual(events(asked), 1, "asked the database")
        // Back: everything known before was forgotten, and it learns again.
        outage.end()
        try await waitUntilListening(app)
        try await push(second, token: token)
        var seen = 0
        let pushed = ContinuousClock.now
        while seen < 2, ContinuousClock.now < pushed + .seconds(5) {
            seen = events(try await pull(app, after: 0, token: token))
        }
        XCTAssertEqual(seen, 2)
        _ = try await pull(app, after: 2, token: token)
        let relearned = try await app.statements.during { _ = try await pull(app, after: 2, token: token) }
        XCTAssertEqual(relearned, [])
        await second.stop()
    }
}
