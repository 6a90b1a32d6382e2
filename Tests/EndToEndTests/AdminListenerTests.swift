import Foundation
import TestSupport
import XCTest

/// Operator endpoints live on a listener of their own (`TRUNK_SYNC_ADMIN_HOST` /
/// `TRUNK_SYNC_ADMIN_PORT`, loopback by default); the public `/healthz` and `/readyz` say
/// nothing beyond their status.
final class AdminListenerTests: EndToEndTestCase {
    func testMetricsAreServedOnlyOnTheAdminListener() throws {
        let server = try startServer()
        let (publicMetrics, _) = try server.exchange(request("GET", "/metrics"))
        assertJSONError(publicMetrics, status: 404, code: "not_found")
        XCTAssertFalse(publicMetrics.bodyText.contains("trunk_sync"))

        let metrics = try server.adminExchange(request("GET", "/metrics"))
        XCTAssertEqual(metrics.status, 200)
        XCTAssertEqual(metrics.header("content-type"), "text/plain; version=0.0.4; charset=utf-8")
        XCTAssertTrue(metrics.bodyText.contains("# TYPE trunk_sync_http_requests_total counter"), metrics.bodyText)
        // The public 404 above was counted; the admin listener's own requests are not.
        XCTAssertTrue(metrics.bodyText.contains(#"route="unmatched",status="404"} 1"#), metrics.bodyText)
        XCTAssertFalse(metrics.bodyText.contains(#"route="/metrics""#), metrics.bodyText)
        XCTAssertEqual(try server.adminExchange(request("GET", "/healthz")).status, 200)

        let line = try XCTUnwrap(server.stderr.waitForLine(containing: "admin listening", timeout: 1))
        XCTAssertTrue(line.contains("address=127.0.0.1"), "loopback by default: \(line)")
        XCTAssertNotEqual(server.adminPort, server.port)
    }

    func testPublicReadinessRevealsNoReasonWhileTheAdminListenerAndTheLogDo() throws {
        // The server's migrations directory has one migration the database lacks.
        let directory = NSTemporaryDirectory() + "migrations-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let shipped = repositoryRoot() + "/migrations"
        for file in try FileManager.default.contentsOfDirectory(atPath: shipped) where file.hasSuffix(".sql") {
            try FileManager.default.copyItem(atPath: shipped + "/" + file, toPath: directory + "/" + file)
        }
        try "select 1;\n".write(toFile: directory + "/9999_not_yet_applied.sql", atomically: true, encoding: .utf8)
        let server = try startServer(["TRUNK_SYNC_MIGRATIONS_DIR": directory])

        let (ready, _) = try server.exchange(request("GET", "/readyz"))
        assertJSONError(ready, status: 503, code: "not_ready")
        let body = ready.bodyText.lowercased()
        for secret in ["migration", "pending", "1", "database", "signing"] {
            XCTAssertFalse(
                body.contains(secret), "the public /readyz says \(secret.debugDescription): \(ready.bodyText)")
        }
        let (healthy, _) = try server.exchange(request("GET", "/healthz"))
        XCTAssertEqual(healthy.bodyText, #"{"status":"ok"}"#)

        let detailed = try server.adminExchange(request("GET", "/readyz"))
        assertJSONError(detailed, status: 503, code: "migrations_pending")
        XCTAssertTrue(detailed.bodyText.contains("1 migration(s) pending"), detailed.bodyText)
        let logged = try XCTUnwrap(server.stderr.waitForLine(containing: "not ready", timeout: 5))
        XCTAssertTrue(logged.contains("1 migration(s) pending"), logged)
        // Logged when the reason changes, not on every probe.
        _ = try server.exchange(request("GET", "/readyz"))
        _ = try server.adminExchange(request("GET", "/readyz"))
        XCTAssertEqual(server.logs.components(separatedBy: "not ready").count - 1, 1, server.logs)
    }

    func testAnAdminPortInUseStopsServeWithOneLine() throws {
        let first = try startServer()
        let second = try launchServer(["TRUNK_SYNC_ADMIN_PORT": "\(first.adminPort)"])
        XCTAssertEqual(second.waitForExit(timeout: 15), 1)
        let lines = second.stderr.text.split(separator: "\n").filter { $0.hasPrefix("trunk-sync:") }
        XCTAssertEqual(lines.count, 1, second.logs)
        XCTAssertTrue(lines.first?.contains("TRUNK_SYNC_ADMIN_PORT") ?? false, second.logs)
    }

    func testConfigCheckShowsTheAdminListenerDefaults() throws {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"],
            environment: Command.environment([
                "TRUNK_SYNC_DATABASE_URL": "postgres://u:pw@h/d",
                "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
            ]))
        XCTAssertEqual(result.status, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("TRUNK_SYNC_ADMIN_HOST=127.0.0.1  [default]"), result.stdout)
        XCTAssertTrue(result.stdout.contains("TRUNK_SYNC_ADMIN_PORT=9090  [default]"), result.stdout)
    }
}
