import Foundation
import TestSupport
import XCTest

/// The real binary against its description (docs/openapi.json): it serves the document
/// itself, schemathesis finds no answer the description does not allow, and real answers of
/// every kind match their documented schemas.
final class OpenAPITests: EndToEndTestCase {
    static let documentPath = repositoryRoot() + "/docs/openapi.json"

    /// The test venv's directory of scripts (`TRUNK_SYNC_TEST_PYTHON` is its python).
    func venvScript(_ name: String) throws -> String {
        guard let python = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"], !python.isEmpty else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_PYTHON is not set: run the tests with `make test`")
        }
        return URL(fileURLWithPath: python).deletingLastPathComponent().appendingPathComponent(name).path
    }

    /// An access token for `email`, from `trunk-sync token` with the server's environment.
    func accessToken(_ server: ServerProcess, _ email: String) throws -> String {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", email], environment: server.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        let session = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        return try XCTUnwrap(session["access_token"] as? String)
    }

    func testServesTheCheckedInDocument() throws {
        let server = try startServer()
        let (response, _) = try server.exchange(request("GET", "/openapi.json"))
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.header("content-type"), "application/json; charset=utf-8")
        let file = try Data(contentsOf: URL(fileURLWithPath: Self.documentPath))
        XCTAssertTrue(response.body == Array(file), "GET /openapi.json is not docs/openapi.json byte for byte")
    }

    /// schemathesis (Tests/OpenAPI/schemathesis.toml) generates requests for every operation,
    /// valid and invalid, from the document the server serves: no `5xx`, and every answer's
    /// status, media type, body and headers as documented. The server is alive afterwards.
    func testSchemathesisFindsNoAnswerTheDescriptionDoesNotAllow() throws {
        // Limits generous enough that the sign-in routes parse what they are sent instead of
        // answering `429` (documented too) to almost everything.
        let server = try startServer([
            "TRUNK_SYNC_RATE_LIMIT_OTP": "1000000/300", "TRUNK_SYNC_RATE_LIMIT_VERIFY": "1000000/300",
            "TRUNK_SYNC_RATE_LIMIT_TOKEN": "1000000/300", "TRUNK_SYNC_RATE_LIMIT_MAIL": "1000000/3600",
            "TRUNK_SYNC_OTP_RESEND_INTERVAL": "0",
        ])
        let work = NSTemporaryDirectory() + "schemathesis-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        var environment = ProcessInfo.processInfo.environment
        environment["TRUNK_SYNC_FUZZ_TOKEN"] = try accessToken(server, "fuzz@example.com")
        environment["TRUNK_SYNC_FUZZ_LOGOUT_TOKEN"] = try accessToken(server, "fuzz-logout@example.com")
        environment["TRUNK_SYNC_FUZZ_HOOKS"] = repositoryRoot() + "/Tests/OpenAPI/hooks.py"
        environment["NO_COLOR"] = "1"
        environment["PYTHONDONTWRITEBYTECODE"] = "1"  // nothing left in Tests/OpenAPI
        // `make fuzz-api` (scripts/fuzz-api.sh): another seed and more examples than the
        // fixed run of `make test`.
        var options: [String] = []
        if let seed = environment["TRUNK_SYNC_FUZZ_API_SEED"], !seed.isEmpty { options += ["--seed", seed] }
        if let examples = environment["TRUNK_SYNC_FUZZ_API_EXAMPLES"], !examples.isEmpty {
            options += ["--max-examples", examples]
        }
        let started = Date()
        let result = try Command.run(
            try venvScript("schemathesis"),
            [
                "--config-file", repositoryRoot() + "/Tests/OpenAPI/schemathesis.toml", "run", "--no-color",
            ] + options + ["http://127.0.0.1:\(server.port)/openapi.json"],
            environment: environment, currentDirectory: work)
        let seconds = Date().timeIntervalSince(started)
        print("schemathesis ran for \(String(format: "%.1f", seconds)) s")
        let summary = result.stdout.split(separator: "\n").filter { $0.contains("generated") || $0.hasPrefix("===") }
        print(summary.joined(separator: "\n"))
        XCTAssertEqual(result.status, 0, "schemathesis failed:\n\(result.stdout)\(result.stderr)")
        assertServerHealthy(server)
    }

    // MARK: - Real answers against their schemas

    struct Answer {
        var label: String
        var path: String
        var method: String
        var response: RawResponse
        /// A schema for a body the description leaves open (a `201` with a representation).
        var schema: String? = nil

        var json: [String: Any] {
            var headers: [String: String] = [:]
            for (name, value) in response.headers where headers[name.lowercased()] == nil {
                headers[name.lowercased()] = value
            }
            var object: [String: Any] = [
                "label": label, "path": path, "method": method, "status": response.status, "headers": headers,
                "body": response.bodyText,
            ]
            if let schema { object["schema"] = schema }
            return object
        }
    }

    func testRealAnswersMatchTheirDocumentedSchemas() throws {
        let server = try startServer()
        var answers: [Answer] = []
        /// Sends `method target` and records the answer under the documented `path`.
        @discardableResult
        func exchange(
            _ label: String, _ method: String, _ target: String, path: String? = nil, headers: [(String, String)] = [],
            body: String? = nil, schema: String? = nil
        ) throws -> RawResponse {
            let (response, _) = try server.exchange(
                request(method, target, headers: headers, body: body), timeout: 10)
            let documented = path ?? String(target.prefix { $0 != "?" })
            answers.append(Answer(label: label, path: documented, method: method, response: response, schema: schema))
            return response
        }

        // Operations.
        let root = try exchange("the pointer to the documentation", "GET", "/")
        XCTAssertEqual(root.status, 200)
        XCTAssertEqual(root.jsonObject?["openapi"] as? String, "/openapi.json")
        XCTAssertEqual(root.jsonObject?["service"] as? String, "trunk-sync")
        try exchange("health", "GET", "/healthz")
        try exchange("readiness", "GET", "/readyz")
        try exchange("this description", "GET", "/openapi.json")
        try exchange(
            "body over the limit of a route without a body", "GET", "/healthz",
            body: String(repeating: "x", count: 2000))

        // Auth: a whole sign-in, then the routes of a session.
        let email = "answers@example.com"
        try exchange("code requested", "POST", "/auth/v1/otp", body: #"{"email":"\#(email)"}"#)
        let line = try XCTUnwrap(server.stderr.waitForLine(containing: "sign-in code for \(email)", timeout: 5))
        let code = String(try XCTUnwrap(line.firstMatch(of: /: (\d{6})/)).output.1)
        try exchange(
            "wrong code", "POST", "/auth/v1/verify", body: #"{"email":"\#(email)","token":"000000x","type":"email"}"#)
        let signIn = try exchange(
            "session", "POST", "/auth/v1/verify", body: #"{"email":"\#(email)","token":"\#(code)","type":"email"}"#)
        let session = try XCTUnwrap(signIn.jsonObject)
        let refresh = try XCTUnwrap(session["refresh_token"] as? String)
        let refreshed = try exchange(
            "refreshed session", "POST", "/auth/v1/token?grant_type=refresh_token",
            body: #"{"refresh_token":"\#(refresh)"}"#)
        let token = try XCTUnwrap(refreshed.jsonObject?["access_token"] as? String)
        let bearer = [("Authorization", "Bearer \(token)")]
        try exchange(
            "unknown refresh token", "POST", "/auth/v1/token?grant_type=refresh_token",
            body: #"{"refresh_token":"nope"}"#)
        try exchange("unsupported grant", "POST", "/auth/v1/token?grant_type=password", body: "{}")
        try exchange("user", "GET", "/auth/v1/user", headers: bearer)
        try exchange(
            "user updated", "PUT", "/auth/v1/user", headers: bearer,
            body: #"{"data":{"full_name":"Ann","theme":"dark"}}"#)
        try exchange(
            "email change refused", "PUT", "/auth/v1/user", headers: bearer, body: #"{"email":"b@example.com"}"#)
        try exchange("not JSON", "PUT", "/auth/v1/user", headers: bearer, body: "[1]")
        try exchange("no token", "GET", "/auth/v1/user")
        try exchange("bad token", "GET", "/auth/v1/user", headers: [("Authorization", "Bearer x.y.z")])
        try exchange("no address", "POST", "/auth/v1/otp", body: "{}")
        try exchange(
            "sign-in body over 4 KiB", "POST", "/auth/v1/otp",
            body: #"{"email":"a@example.com","x":""# + String(repeating: "a", count: 4096) + #""}"#)
        try exchange("JWKS", "GET", "/auth/v1/.well-known/jwks.json")
        try exchange("settings", "GET", "/auth/v1/settings")
        try exchange("bad scope", "POST", "/auth/v1/logout?scope=everyone", headers: bearer)
        try exchange("others signed out", "POST", "/auth/v1/logout?scope=others", headers: bearer)

        // Native sync.
        let events = (1...2).map { index in
            #"{"client_id":"\#(UUID().uuidString)","type":"note","payload":{"n":\#(index),"text":"é\n\"x\""},"client_timestamp":"2026-11-22T04:10:02.123+01:00"}"#
        }
        let push = #"{"events":[\#(events.joined(separator: ","))]}"#
        try exchange("push", "POST", "/sync/v1/events", headers: bearer, body: push)
        try exchange("push again: duplicates", "POST", "/sync/v1/events", headers: bearer, body: push)
        try exchange(
            "invalid events", "POST", "/sync/v1/events", headers: bearer,
            body: #"{"events":[{"client_id":"x","type":"","payload":[],"client_timestamp":"yesterday"},7]}"#)
        try exchange("not a push", "POST", "/sync/v1/events", headers: bearer, body: #"{"events":[]}"#)
        try exchange("pull", "GET", "/sync/v1/events?after=0&limit=1", headers: bearer)
        try exchange("empty pull", "GET", "/sync/v1/events?after=1000", headers: bearer)
        try exchange("bad limit", "GET", "/sync/v1/events?limit=0", headers: bearer)
        try exchange("unauthenticated push", "POST", "/sync/v1/events", body: push)
        // The stream's refusals (its body, endless, is checked in EventStreamTests).
        let eventStream = ("Accept", "text/event-stream")
        try exchange("stream without Accept", "GET", "/sync/v1/stream", headers: bearer)
        try exchange("stream with bad after", "GET", "/sync/v1/stream?after=x", headers: bearer + [eventStream])
        try exchange(
            "stream with bad Last-Event-ID", "GET", "/sync/v1/stream",
            headers: bearer + [eventStream, ("Last-Event-ID", "x")])
        try exchange("stream without token", "GET", "/sync/v1/stream", headers: [eventStream])

        // REST.
        let user = try XCTUnwrap((session["user"] as? [String: Any])?["id"] as? String)
        try exchange(
            "rows", "GET", "/rest/v1/events?select=seq,payload,created_at&order=seq.desc&seq=gt.0",
            headers: bearer + [("Prefer", "count=exact")])
        try exchange("all columns", "GET", "/rest/v1/events?limit=1&offset=1", headers: bearer)
        try exchange(
            "one object", "GET", "/rest/v1/events?seq=eq.1",
            headers: bearer + [("Accept", "application/vnd.pgrst.object+json")])
        try exchange(
            "one object asked, two rows", "GET", "/rest/v1/events",
            headers: bearer + [("Accept", "application/vnd.pgrst.object+json")])
        try exchange("no such column", "GET", "/rest/v1/events?colour=eq.red", headers: bearer)
        try exchange("bad filter value", "GET", "/rest/v1/events?seq=gt.x", headers: bearer)
        try exchange("no token", "GET", "/rest/v1/events")
        let row = #"{"client_id":"\#(UUID().uuidString)","type":"note","payload":{"a":[1,2]},"user_id":"\#(user)"}"#
        try exchange(
            "inserted, with representation", "POST", "/rest/v1/events",
            headers: bearer + [("Prefer", "return=representation")],
            body: "[\(row)]", schema: "#/components/schemas/EventRows")
        try exchange(
            "inserted", "POST", "/rest/v1/events", headers: bearer,
            body: row.replacingOccurrences(of: "note", with: "other"))
        try exchange(
            "another user's row", "POST", "/rest/v1/events", headers: bearer,
            body: #"{"client_id":"\#(UUID().uuidString)","type":"note","user_id":"\#(UUID().uuidString)"}"#)
        try exchange(
            "row without type", "POST", "/rest/v1/events", headers: bearer,
            body: #"{"client_id":"\#(UUID().uuidString)"}"#)
        try exchange("append-only", "DELETE", "/rest/v1/events?seq=eq.1")
        try exchange("profile", "GET", "/rest/v1/profiles?select=full_name&id=eq.\(user)", headers: bearer)
        try exchange(
            "profile updated, with representation", "PATCH", "/rest/v1/profiles?id=eq.\(user)",
            headers: bearer + [("Prefer", "return=representation")], body: #"{"full_name":"Bo"}"#)
        try exchange("profile updated", "PATCH", "/rest/v1/profiles", headers: bearer, body: #"{"full_name":null}"#)
        try exchange(
            "profile upserted", "POST", "/rest/v1/profiles?on_conflict=id",
            headers: bearer + [("Prefer", "return=representation,resolution=merge-duplicates")],
            body: #"[{"id":"\#(user)","full_name":"Cy"}]"#, schema: "#/components/schemas/ProfileRows")
        try exchange(
            "another user's profile", "PATCH", "/rest/v1/profiles", headers: bearer,
            body: #"{"id":"\#(UUID().uuidString)","full_name":"Eve"}"#)
        try exchange("unknown table", "GET", "/rest/v1/todos", path: "/rest/v1/{table}")

        let answersFile = NSTemporaryDirectory() + "answers-\(UUID().uuidString).json"
        let data = try JSONSerialization.data(withJSONObject: answers.map(\.json))
        try data.write(to: URL(fileURLWithPath: answersFile))
        defer { try? FileManager.default.removeItem(atPath: answersFile) }
        let result = try Command.run(
            try venvScript("python"),
            [repositoryRoot() + "/Tests/OpenAPI/check_answers.py", Self.documentPath, answersFile])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        // Every family's errors were among them.
        for status in [200, 201, 204, 400, 401, 403, 404, 405, 406, 413, 422] {
            XCTAssertTrue(answers.contains { $0.response.status == status }, "no \(status) answer checked")
        }
    }
}
