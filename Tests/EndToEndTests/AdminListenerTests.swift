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
        // Its root names what it serves, not the public port's API description.
        let root = try server.adminExchange(request("GET", "/"))
        XCTAssertEqual(root.status, 200)
        let pointer = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(root.bodyText.utf8)) as? [String: Any])
        XCTAssertEqual(pointer["console"] as? String, "/console/")
        XCTAssertNil(pointer["openapi"], "only the public port serves /openapi.json")
        XCTAssertEqual(try server.adminExchange(request("GET", "/console/")).status, 200)

        let line = try XCTUnwrap(server.stderr.waitForLine(containing: "admin listening", timeout: 1))
        XCTAssertTrue(line.contains("address=127.0.0.1"), "loopback by default: \(line)")
        XCTAssertNotEqual(server.adminPort, server.port)
    }

    /// A request with exactly the given `Host` (or none) and headers.
    private func raw(
        _ method: String, _ path: String, host: String?, headers: [(String, String)] = [], body: String? = nil
    ) -> String {
        var text = "\(method) \(path) HTTP/\(host == nil ? "1.0" : "1.1")\r\n"
        if let host { text += "Host: \(host)\r\n" }
        for (name, value) in headers { text += "\(name): \(value)\r\n" }
        if let body { text += "Content-Length: \(body.utf8.count)\r\n" }
        return text + "\r\n" + (body ?? "")
    }

    /// DNS rebinding and cross-site requests: the admin listener answers only to its own
    /// names, refuses other sites' `Origin`, and never reads a body that is not JSON. Each
    /// refusal is a 4xx JSON error from the head that changes nothing.
    func testTheAdminListenerRefusesForeignHostsOriginsAndNonJSONBodies() throws {
        let server = try startServer([
            "TRUNK_SYNC_ADMIN_EMAILS": "ops@example.com", "TRUNK_SYNC_ADMIN_HOSTNAMES": "Console.Internal",
        ])
        let port = server.adminPort
        for host in [
            "localhost", "localhost:\(port)", "LOCALHOST.", "127.0.0.1", "127.0.0.1:\(port)", "[::1]:\(port)",
            "console.internal", "console.internal:443",
        ] {
            XCTAssertEqual(try server.adminExchange(raw("GET", "/metrics", host: host)).status, 200, host)
        }
        XCTAssertEqual(try server.adminExchange(raw("GET", "/metrics", host: nil)).status, 200, "HTTP/1.0, no Host")
        for host in [
            "rebind.example", "rebind.example:\(port)", "localhost.rebind.example", "192.0.2.1", "10.0.0.1:\(port)",
            "localhost:port", "[::1", "",
        ] {
            for (method, path) in [("GET", "/metrics"), ("GET", "/console/"), ("GET", "/admin/v1/session")] {
                assertJSONError(
                    try server.adminExchange(raw(method, path, host: host)), status: 421, code: "host_not_allowed")
            }
        }
        let verify = #"{"email":"ops@example.com","code":"000000"}"#
        assertJSONError(
            try server.adminExchange(
                raw(
                    "POST", "/admin/v1/auth/verify", host: "rebind.example:\(port)",
                    headers: [("Content-Type", "application/json")], body: verify)),
            status: 421, code: "host_not_allowed")

        // Origin: only the listener itself.
        let host = "localhost:\(port)"
        for origin in ["http://\(host)", "https://\(host)", "HTTP://LOCALHOST:\(port)"] {
            XCTAssertEqual(
                try server.adminExchange(raw("GET", "/metrics", host: host, headers: [("Origin", origin)])).status, 200,
                origin)
        }
        for origin in [
            "http://evil.example", "null", "http://localhost:1", "http://localhost", "file://", "http://\(host).evil",
        ] {
            assertJSONError(
                try server.adminExchange(raw("GET", "/metrics", host: host, headers: [("Origin", origin)])),
                status: 403, code: "origin_not_allowed")
            assertJSONError(
                try server.adminExchange(
                    raw(
                        "POST", "/admin/v1/auth/verify", host: host,
                        headers: [("Origin", origin), ("Content-Type", "application/json")], body: verify)),
                status: 403, code: "origin_not_allowed")
        }

        // A "simple" cross-site POST (text/plain, form types, none) is not parsed as JSON.
        for contentType in [
            "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx", nil,
        ] {
            let headers = contentType.map { [("Content-Type", $0)] } ?? []
            assertJSONError(
                try server.adminExchange(
                    raw("POST", "/admin/v1/auth/verify", host: host, headers: headers, body: verify)),
                status: 415, code: "unsupported_media_type")
        }
        XCTAssertFalse(server.logs.contains("console sign-in failed"), "no refused request reached the code check")
        // JSON is read (and here refused as a wrong code), with or without parameters.
        for contentType in ["application/json", "Application/JSON; charset=utf-8"] {
            assertJSONError(
                try server.adminExchange(
                    raw(
                        "POST", "/admin/v1/auth/verify", host: host, headers: [("Content-Type", contentType)],
                        body: verify)),
                status: 403, code: "otp_expired")
        }
        // A route without a body takes none of this: logout needs only its session.
        assertJSONError(
            try server.adminExchange(raw("POST", "/admin/v1/auth/logout", host: host, body: "")), status: 401,
            code: "console_unauthorized")
    }

    /// Every answer of the admin listener, whoever gives it (a route, the router's `404`, the
    /// guard's refusals, the console's errors), is never cached, never read as another type,
    /// and loaded by no page of another origin (`Cross-Origin-Resource-Policy`): an app's page
    /// on the same host could otherwise embed `/metrics` or any answer with `<img>` or a
    /// `no-cors` fetch. Only the page's own files may be kept, and revalidated (`no-cache`).
    func testEveryAdminAnswerIsUncachedUnsniffedAndForItsOwnOriginOnly() throws {
        let server = try startServer(["TRUNK_SYNC_ADMIN_EMAILS": "ops@example.com"])
        let host = "localhost:\(server.adminPort)"
        let json = [("Content-Type", "application/json")]
        let verify = #"{"email":"ops@example.com","code":"000000"}"#
        let cases: [(String, String, String, [(String, String)], String?, Int)] = [
            ("GET", "/metrics", host, [], nil, 200), ("GET", "/healthz", host, [], nil, 200),
            ("GET", "/readyz", host, [], nil, 200), ("GET", "/", host, [], nil, 200),
            ("GET", "/admin/v1/session", host, [], nil, 200), ("OPTIONS", "/admin/v1/users", host, [], nil, 204),
            ("GET", "/nothing-here", host, [], nil, 404), ("DELETE", "/metrics", host, [], nil, 405),
            ("GET", "/console/nothing.js", host, [], nil, 404), ("GET", "/admin/v1/users", host, [], nil, 401),
            ("GET", "/admin/v1/users", host, [("Cookie", "trunk_sync_console=tsc_x")], nil, 403),
            ("POST", "/admin/v1/auth/verify", host, json, verify, 403),
            ("POST", "/admin/v1/auth/verify", host, [("Content-Type", "text/plain")], verify, 415),
            ("POST", "/admin/v1/auth/otp", host, json, "{", 400),
            ("GET", "/metrics", "rebind.example", [], nil, 421),
            ("GET", "/admin/v1/session", host, [("Origin", "http://localhost:1")], nil, 403),
        ]
        for (method, path, host, headers, body, status) in cases {
            let answer = try server.adminExchange(raw(method, path, host: host, headers: headers, body: body))
            let name = "\(method) \(path) (\(status))"
            XCTAssertEqual(answer.status, status, "\(name): \(answer.bodyText)")
            XCTAssertEqual(answer.header("cache-control"), "no-store", name)
            XCTAssertEqual(answer.header("x-content-type-options"), "nosniff", name)
            XCTAssertEqual(answer.header("cross-origin-resource-policy"), "same-origin", name)
        }
        for file in ["/console/", "/console/app.js", "/console/icon.svg"] {
            let answer = try server.adminExchange(raw("GET", file, host: host))
            XCTAssertEqual(answer.status, 200, file)
            XCTAssertEqual(answer.header("cache-control"), "no-cache", file)
            XCTAssertEqual(answer.header("x-content-type-options"), "nosniff", file)
            XCTAssertEqual(answer.header("cross-origin-resource-policy"), "same-origin", file)
        }
        // The public listener is not made same-origin-only: apps on other origins use it.
        let (publicAnswer, _) = try server.exchange(request("GET", "/healthz"))
        XCTAssertNil(publicAnswer.header("cross-origin-resource-policy"))
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

    /// `serve` on a database `migrate` never ran on keeps retrying its start-up loads, and each
    /// of their lines says to run `migrate`, not only PostgreSQL's `42P01 (undefined table)`.
    func testAServerOnADatabaseMigrateNeverRanOnSaysToRunIt() throws {
        let database = try TestDatabase.create(prefix: "e2e")
        defer { try? TestDatabase.drop(database) }
        let server = try launchServer(on: database)
        defer { server.cleanUp() }  // before the database is dropped
        try server.waitUntilListening(timeout: 15)
        for load in ["cannot load signing keys", "cannot load revoked sessions"] {
            let line = try XCTUnwrap(server.stderr.waitForLine(containing: load, timeout: 10), server.logs)
            XCTAssertTrue(line.contains("42P01 (undefined table)"), line)
            XCTAssertTrue(
                line.contains(
                    "this database lacks trunk-sync's tables or their newest migrations: run trunk-sync migrate"),
                line)
        }
        let detailed = try server.adminExchange(request("GET", "/readyz"))
        assertJSONError(detailed, status: 503, code: "migrations_pending")
    }

    /// A port in use stops `serve` with its one line and exit code 1, after closing what it
    /// had opened: the pools, the listener's connection (which may still be connecting), the
    /// other listener, every thread joined. Exiting with a pool thread inside libpq made
    /// OpenSSL's clean-up crash (exit 139) in about 3 runs in 100, and closing the application
    /// hung when the public listener never ran (its loop-driven pool waited for the loop), so
    /// each case runs several times (scripts/startup-crash-check.sh runs hundreds).
    func testAPortInUseStopsServeWithOneLineAndNothingLeftRunning() throws {
        let first = try startServer()
        let cases: [([String: String?], String)] = [
            (["TRUNK_SYNC_ADMIN_PORT": "\(first.adminPort)"], "TRUNK_SYNC_ADMIN_PORT"),  // before the public listener
            (["TRUNK_SYNC_PORT": "\(first.port)"], "TRUNK_SYNC_PORT"),  // the admin listener already runs
        ]
        for (overrides, setting) in cases {
            for run in 1...10 {
                let second = try launchServer(on: first.database, overrides)
                XCTAssertEqual(second.waitForExit(timeout: 30), 1, "\(setting), run \(run): \(second.logs)")
                // The pipe may still hold the last lines when the exit is seen: read it to its end.
                XCTAssertTrue(second.stderr.waitForEnd(timeout: 10), second.logs)
                let lines = second.stderr.text.split(separator: "\n").filter { $0.hasPrefix("trunk-sync:") }
                XCTAssertEqual(lines.count, 1, second.logs)
                XCTAssertTrue(lines.first?.contains(setting) ?? false, second.logs)
                XCTAssertTrue(lines.first?.contains("in use") ?? false, second.logs)
                XCTAssertFalse(second.logs.contains("still running at exit"), second.logs)
            }
        }
        assertServerHealthy(first)
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
