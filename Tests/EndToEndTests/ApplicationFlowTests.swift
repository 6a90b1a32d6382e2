import Foundation
import TestSupport
import XCTest

/// The application's flows through the real binary: sign-in by real mail with the real
/// supabase-py client, a long-poll answered on SIGTERM, request ids in the logs.
final class ApplicationFlowTests: EndToEndTestCase {
    func python() throws -> String {
        guard let path = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"], !path.isEmpty else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_PYTHON is not set: run the tests with `make test`")
        }
        return path
    }

    /// The apps' code paths with the unmodified Python client, the code read from a mail a
    /// real SMTP server received.
    func testSupabasePythonClientRunsTheAppsFlows() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startServer([
            "TRUNK_SYNC_MAILER": "smtp", "TRUNK_SYNC_SMTP_URL": "smtp://127.0.0.1:\(sink.port)?tls=none",
            "TRUNK_SYNC_MAIL_FROM": "Trunk <no-reply@trunk.example>",
        ])
        let result = try Command.run(
            try python(),
            [
                repositoryRoot() + "/Tests/Compat/supabase_flow.py", "http://127.0.0.1:\(server.port)",
                sink.directory.path,
            ])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        for step in [
            "sign_in_with_otp", "verify_otp", "insert one", "insert a batch of three with one duplicate",
            "select ordered by created_at", "select gt the first row's created_at",
            "match refused with PGRST100 naming it",
            "upsert ignore_duplicates", "in_ and is_ filters", "not_, like and ilike filters", "or_ filters",
            "profiles select full_name single() after update_user", "update the profile", "refresh_session", "sign_out",
        ] {
            XCTAssertTrue(
                result.stdout.contains("ok \(step)"), "missing step \(step): \(result.stdout)\(result.stderr)")
        }
        let mail = try XCTUnwrap(try sink.received().first)
        XCTAssertEqual(mail.subject?.hasPrefix("Your sign-in code"), true)
        XCTAssertFalse(
            server.logs.contains(try XCTUnwrap(mail.body?.firstMatch(of: /\b\d{6}\b/)).output),
            "the code never appears in the server's log")
    }

    func session(_ server: ServerProcess, _ email: String) throws -> [String: Any] {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", email], environment: server.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
    }

    func testSIGTERMAnswersAWaitingLongPollAndExitsZero() throws {
        let server = try startServer()
        let token = try XCTUnwrap(try session(server, "poll@example.com")["access_token"] as? String)
        let client = try server.connect()
        try client.send(
            request("GET", "/sync/v1/events?after=0&wait=60", headers: [("Authorization", "Bearer \(token)")]))
        // Wait until the server counts the long-poll as waiting.
        let waiting = eventually(within: 10, interval: .milliseconds(10)) {
            (try? server.metrics())?["trunk_sync_longpolls_waiting"] == 1
        }
        XCTAssertTrue(waiting)
        let signalledAt = Date()
        server.signal(SIGTERM)
        let response = try client.readResponse(timeout: 5)
        XCTAssertLessThan(Date().timeIntervalSince(signalledAt), 3)
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual((response.jsonObject?["events"] as? [Any])?.count, 0)
        XCTAssertEqual(server.waitForExit(timeout: 15), 0)
    }

    func testEveryLogLineOfARequestCarriesItsRequestID() throws {
        let server = try startServer(["TRUNK_SYNC_LOG_FORMAT": "json"])
        let (response, _) = try server.exchange(
            request(
                "POST", "/auth/v1/otp",
                headers: [("X-Request-Id", "req-flow-42"), ("Content-Type", "application/json")],
                body: #"{"email":"logs@example.com"}"#))
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.header("x-request-id"), "req-flow-42")
        let codeLine = try XCTUnwrap(
            server.stderr.waitForLine(containing: "sign-in code for logs@example.com", timeout: 5))
        let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(codeLine.utf8)) as? [String: Any])
        XCTAssertEqual(object["request_id"] as? String, "req-flow-42")
        let accessLine = try XCTUnwrap(server.stderr.waitForLine(containing: "\"path\":\"/auth/v1/otp\"", timeout: 5))
        XCTAssertTrue(accessLine.contains("\"request_id\":\"req-flow-42\""), accessLine)
        XCTAssertFalse(accessLine.contains("logs@example.com"), "the access log has no body or query")
    }
}
