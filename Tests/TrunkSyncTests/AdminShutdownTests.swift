import Foundation
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// The admin listener at shutdown, as `serve` stops both listeners on one signal.
final class AdminShutdownTests: XCTestCase {
    /// An admin request in flight when the server stops is answered. Its queries ran on the
    /// first HTTP loop's pool share (the admin listener's loop has none), and that loop
    /// stops once the public loops have drained: the answer was never read, and the request
    /// hung until the admin listener's shutdown deadline (10 s), then lost its connection.
    /// They now run on the database's own loop, which closes after both listeners.
    func testAnAdminRequestInFlightAtShutdownIsAnswered() async throws {
        let harness = try await AppHarness(environment: ["TRUNK_SYNC_EVENT_LOOPS": "2"])
        let owner = try harness.owner()
        // The admin /readyz reads schema_migrations: held until the commit below.
        try owner.execute("begin")
        try owner.execute("lock table schema_migrations in access exclusive mode")
        let readiness = Task { try await harness.request("GET", "/readyz", admin: true) }
        let waiting = try await waitUntil(30) {
            let observer = try harness.owner()
            return try observer.query(
                """
                select count(*) from pg_stat_activity
                where datname = current_database() and wait_event_type = 'Lock' and query like '%schema_migrations%'
                """)[0].decode(Int64.self, column: 0) > 0
        }
        XCTAssertTrue(waiting, "the admin request's query waits for the lock")
        harness.server.shutdown()
        harness.admin.shutdown()
        // The public listener had nothing in flight: its loops stop.
        await harness.server.waitUntilStopped()
        try owner.execute("commit")
        let response = try await readiness.value
        XCTAssertEqual(response.status, 200, response.text)
        await harness.stop()
    }
}
