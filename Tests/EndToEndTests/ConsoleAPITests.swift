import Foundation
import Postgres
import TestSupport
import XCTest

/// The operator console's API (`/admin/v1`) and page (`/console/`) through the real binary:
/// served on the admin listener only, sign-in by mailed code for `TRUNK_SYNC_ADMIN_EMAILS`
/// only, console sessions apart from app sessions, and every route's authorisation, paging
/// and refusals of bad input (each a 4xx JSON error that changes nothing).
final class ConsoleAPITests: EndToEndTestCase {
    static let operatorEmail = "ops@example.com"

    /// A server that mails through `sink` and lets `ops@example.com` into the console.
    func startConsoleServer(_ sink: SMTPSink, _ extra: [String: String] = [:]) throws -> ServerProcess {
        try startServer(
            [
                "TRUNK_SYNC_MAILER": "smtp", "TRUNK_SYNC_SMTP_URL": "smtp://127.0.0.1:\(sink.port)?tls=none",
                "TRUNK_SYNC_ADMIN_EMAILS": "\(Self.operatorEmail), second-op@example.com",
            ].merging(extra) { $1 })
    }

    /// A request to the admin listener with the console's cookie and header (or `bearer`).
    func admin(
        _ server: ServerProcess, _ method: String, _ path: String, body: String? = nil, cookie: String? = nil,
        bearer: String? = nil, consoleHeader: Bool = true
    ) throws -> RawResponse {
        var headers: [(String, String)] = []
        if body != nil { headers.append(("Content-Type", "application/json")) }
        if let cookie {
            headers.append(("Cookie", "other=1; trunk_sync_console=\(cookie)"))
            if consoleHeader { headers.append(("X-Trunk-Sync-Console", "1")) }
        }
        if let bearer { headers.append(("Authorization", "Bearer \(bearer)")) }
        return try server.adminExchange(request(method, path, headers: headers, body: body), timeout: 10)
    }

    /// The code of the `index`-th mail (1-based) the sink received for `email`.
    func mailedCode(_ sink: SMTPSink, to email: String, count: Int = 1) throws -> String {
        var code: String?
        XCTAssertTrue(
            try eventually(within: 10) {
                let mails = try sink.received().filter { $0.recipients.contains(email) }
                guard mails.count >= count, let body = mails[count - 1].body,
                    let match = body.firstMatch(of: /\b(\d{6})\b/)
                else { return false }
                code = String(match.1)
                return true
            }, "no mail with a code for \(email)")
        return try XCTUnwrap(code)
    }

    /// Signs `email` in to the console; the token from the cookie.
    func signIn(_ server: ServerProcess, _ sink: SMTPSink, _ email: String = operatorEmail) throws -> String {
        let asked = try admin(server, "POST", "/admin/v1/auth/otp", body: #"{"email":"\#(email)"}"#)
        XCTAssertEqual(asked.status, 200, asked.bodyText)
        let code = try mailedCode(sink, to: email)
        let verified = try admin(
            server, "POST", "/admin/v1/auth/verify", body: #"{"email":"\#(email)","code":"\#(code)"}"#)
        XCTAssertEqual(verified.status, 200, verified.bodyText)
        let cookie = try XCTUnwrap(verified.header("set-cookie"))
        let token = try XCTUnwrap(cookie.firstMatch(of: /^trunk_sync_console=(tsc_[A-Za-z0-9_-]+);/)?.1)
        return String(token)
    }

    /// An app session for `email` (creating the user).
    func appSession(_ server: ServerProcess, _ email: String) throws -> (token: String, user: String) {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", email], environment: server.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        let session = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let user = try XCTUnwrap((session["user"] as? [String: Any])?["id"] as? String)
        return (try XCTUnwrap(session["access_token"] as? String), user)
    }

    /// Pushes events `(type, payload)` for the token's user.
    func push(_ server: ServerProcess, _ token: String, _ events: [(String, String)]) throws {
        let items = events.map { type, payload in
            #"{"client_id":"\#(UUID().uuidString.lowercased())","type":"\#(type)","payload":\#(payload),"client_timestamp":"2026-11-22T04:10:02.123Z"}"#
        }
        let pushed = try send(
            server, "POST", "/sync/v1/events", body: #"{"events":[\#(items.joined(separator: ","))]}"#, token: token)
        XCTAssertEqual(pushed.status, 200, pushed.bodyText)
    }

    func json(_ response: RawResponse, file: StaticString = #filePath, line: UInt = #line) throws -> [String: Any] {
        XCTAssertEqual(response.status, 200, response.bodyText, file: file, line: line)
        return try XCTUnwrap(response.jsonObject, response.bodyText, file: file, line: line)
    }

    // MARK: - Where it is served

    func testThePublicListenerServesNeitherTheConsoleNorItsAPI() throws {
        let server = try startServer(["TRUNK_SYNC_ADMIN_EMAILS": Self.operatorEmail])
        for path in [
            "/console", "/console/", "/console/app.js", "/admin/v1/session", "/admin/v1/users", "/admin/v1/overview",
        ] {
            assertJSONError(try send(server, "GET", path), status: 404, code: "not_found")
        }
        assertJSONError(
            try send(server, "POST", "/admin/v1/auth/otp", body: #"{"email":"ops@example.com"}"#), status: 404,
            code: "not_found")
    }

    /// The admin listener is not a second door to the app: no app route answers there, with an
    /// app user's token or without.
    func testTheAdminListenerServesNoAppRoute() throws {
        let server = try startServer(["TRUNK_SYNC_ADMIN_EMAILS": Self.operatorEmail])
        let (appToken, user) = try appSession(server, "member@example.com")
        XCTAssertEqual(try send(server, "GET", "/auth/v1/user", token: appToken).status, 200)
        for (method, path, body) in [
            ("POST", "/auth/v1/otp", #"{"email":"ops@example.com"}"#), ("GET", "/auth/v1/user", nil),
            ("POST", "/auth/v1/logout", nil), ("GET", "/sync/v1/events?after=0", nil), ("GET", "/sync/v1/export", nil),
            ("GET", "/rest/v1/events?select=*", nil), ("GET", "/openapi.json", nil),
            ("GET", "/realtime/v1/websocket", nil), ("GET", "/clients/web/trunk-sync.js", nil),
            ("GET", "/admin/v1/users/\(user)/../../../sync/v1/events", nil),
        ] {
            for bearer in [nil, appToken] {
                // In the shape of the path's family, as on the public listener (PostgREST's for /rest/v1).
                assertJSONError(
                    try admin(server, method, path, body: body, bearer: bearer), status: 404,
                    code: path.hasPrefix("/rest/v1/") ? "PGRST125" : "not_found")
            }
        }
        XCTAssertEqual(try send(server, "GET", "/auth/v1/user", token: appToken).status, 200, "the session is live")
    }

    /// An app's origin that `TRUNK_SYNC_CORS_ORIGINS` allows (or `*`) gets CORS from the public
    /// listener only: the admin listener grants it no preflight and answers none of its
    /// requests, so its pages cannot call the console's API with the operator's cookie.
    func testCORSOriginsOpenNothingOnTheAdminListener() throws {
        for origins in ["http://app.example", "*"] {
            let sink = try SMTPSink()
            defer { sink.stop() }
            let server = try startConsoleServer(sink, ["TRUNK_SYNC_CORS_ORIGINS": origins])
            let preflight = [
                ("Origin", "http://app.example"), ("Access-Control-Request-Method", "DELETE"),
                ("Access-Control-Request-Headers", "content-type, x-trunk-sync-console"),
            ]
            let (granted, _) = try server.exchange(request("OPTIONS", "/auth/v1/user", headers: preflight))
            XCTAssertNotNil(granted.header("access-control-allow-origin"), "the setting is on: \(origins)")
            let token = try signIn(server, sink)
            let user = try appSession(server, "member-\(UUID().uuidString.prefix(8))@example.com").user
            for path in ["/admin/v1/users/\(user)", "/admin/v1/users", "/admin/v1/session", "/metrics", "/console/"] {
                let refused = try server.adminExchange(request("OPTIONS", path, headers: preflight))
                assertJSONError(refused, status: 403, code: "origin_not_allowed")
                XCTAssertNil(refused.header("access-control-allow-origin"), path)
                XCTAssertNil(refused.header("access-control-allow-methods"), path)
                let asked = try server.adminExchange(
                    request(
                        "GET", path,
                        headers: [
                            ("Origin", "http://app.example"), ("Cookie", "trunk_sync_console=\(token)"),
                            ("X-Trunk-Sync-Console", "1"),
                        ]))
                assertJSONError(asked, status: 403, code: "origin_not_allowed")
                XCTAssertNil(asked.header("access-control-allow-origin"), path)
            }
            let deletion = try server.adminExchange(
                request(
                    "DELETE", "/admin/v1/users/\(user)",
                    headers: [
                        ("Origin", "http://app.example"), ("Cookie", "trunk_sync_console=\(token)"),
                        ("X-Trunk-Sync-Console", "1"), ("Content-Type", "application/json"),
                    ], body: #"{"confirm_email":"x@example.com"}"#))
            assertJSONError(deletion, status: 403, code: "origin_not_allowed")
            XCTAssertEqual(try admin(server, "GET", "/admin/v1/users/\(user)", cookie: token).status, 200)
            XCTAssertEqual(server.stop(), 0)
        }
    }

    func testThePageIsServedWithAStrictContentSecurityPolicy() throws {
        let server = try startServer()
        let redirect = try admin(server, "GET", "/console")
        XCTAssertEqual(redirect.status, 301)
        XCTAssertEqual(redirect.header("location"), "/console/")

        let page = try admin(server, "GET", "/console/")
        XCTAssertEqual(page.status, 200)
        XCTAssertEqual(page.header("content-type"), "text/html; charset=utf-8")
        let policy = try XCTUnwrap(page.header("content-security-policy"))
        XCTAssertTrue(policy.hasPrefix("default-src 'self';"), policy)
        XCTAssertFalse(policy.contains("unsafe"), policy)
        XCTAssertEqual(page.header("x-content-type-options"), "nosniff")
        XCTAssertEqual(page.header("x-frame-options"), "DENY")
        // The browser refuses HTML and script from strings (Trusted Types, no policy), and a
        // window of another origin that opens the console gets no handle on it.
        XCTAssertTrue(policy.contains("; require-trusted-types-for 'script'; trusted-types 'none'"), policy)
        XCTAssertEqual(page.header("cross-origin-opener-policy"), "same-origin")
        XCTAssertEqual(page.header("referrer-policy"), "no-referrer")
        // Every file the page names is served, with the type a module needs.
        for match in page.bodyText.matches(of: /(?:src|href)="(\/console\/[a-z.]+)"/) {
            XCTAssertEqual(try admin(server, "GET", String(match.1)).status, 200, String(match.1))
        }
        let module = try admin(server, "GET", "/console/app.js")
        XCTAssertEqual(module.header("content-type"), "text/javascript; charset=utf-8")
        XCTAssertNotNil(module.header("content-security-policy"))
        assertJSONError(try admin(server, "GET", "/console/nothing.js"), status: 404, code: "not_found")
        assertJSONError(try admin(server, "GET", "/console/..%2Fmetrics"), status: 404, code: "not_found")
    }

    // MARK: - Sign-in

    func testWithoutAdminEmailsSignInIsDisabledAndSaysSo() throws {
        let server = try startServer()
        let state = try json(try admin(server, "GET", "/admin/v1/session"))
        XCTAssertEqual(state["sign_in_enabled"] as? Bool, false)
        XCTAssertEqual(state["signed_in"] as? Bool, false)
        let asked = try admin(server, "POST", "/admin/v1/auth/otp", body: #"{"email":"ops@example.com"}"#)
        assertJSONError(asked, status: 403, code: "console_disabled")
        XCTAssertTrue(asked.bodyText.contains("TRUNK_SYNC_ADMIN_EMAILS"), asked.bodyText)
        assertJSONError(
            try admin(server, "POST", "/admin/v1/auth/verify", body: #"{"email":"ops@example.com","code":"123456"}"#),
            status: 403, code: "console_disabled")
    }

    func testOnlyOperatorsGetACodeAndOthersTheSameNeutralAnswer() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink)
        _ = try appSession(server, "member@example.com")  // an app user, not an operator

        let outsider = try admin(server, "POST", "/admin/v1/auth/otp", body: #"{"email":"member@example.com"}"#)
        let insider = try admin(server, "POST", "/admin/v1/auth/otp", body: #"{"email":"OPS@example.com"}"#)
        for response in [outsider, insider] {
            XCTAssertEqual(response.status, 200, response.bodyText)
            XCTAssertEqual(response.bodyText, "{}")
        }
        XCTAssertEqual(outsider.comparableHeaders, insider.comparableHeaders)
        let code = try mailedCode(sink, to: Self.operatorEmail)
        XCTAssertEqual(try sink.received().count, 1, "no mail for the app user")

        // The outsider cannot sign in whatever the code; no session, no cookie.
        for guess in ["000000", code] {
            let refused = try admin(
                server, "POST", "/admin/v1/auth/verify", body: #"{"email":"member@example.com","code":"\#(guess)"}"#)
            assertJSONError(refused, status: 403, code: "otp_expired")
            XCTAssertNil(refused.header("set-cookie"))
        }
        // A console code signs nobody in to the app, and an app code nobody in to the console.
        let appSignIn = try send(
            server, "POST", "/auth/v1/verify", body: #"{"email":"ops@example.com","token":"\#(code)","type":"email"}"#)
        XCTAssertEqual(appSignIn.status, 403, appSignIn.bodyText)
        XCTAssertEqual(try send(server, "POST", "/auth/v1/otp", body: #"{"email":"ops@example.com"}"#).status, 200)
        let appCode = try mailedCode(sink, to: Self.operatorEmail, count: 2)
        if appCode != code {
            assertJSONError(
                try admin(
                    server, "POST", "/admin/v1/auth/verify", body: #"{"email":"ops@example.com","code":"\#(appCode)"}"#),
                status: 403, code: "otp_expired")
        }

        let verified = try admin(
            server, "POST", "/admin/v1/auth/verify", body: #"{"email":"ops@example.com","code":"\#(code)"}"#)
        let body = try json(verified)
        XCTAssertEqual(body["email"] as? String, Self.operatorEmail)
        let expiresAt = try XCTUnwrap(body["expires_at"] as? Int)
        XCTAssertEqual(Double(expiresAt), Date().timeIntervalSince1970 + 1800, accuracy: 60, "short-lived: 30 minutes")
        XCTAssertNil(body["token"], "the token is in the HttpOnly cookie only")
        let cookie = try XCTUnwrap(verified.header("set-cookie"))
        for attribute in ["Path=/admin/v1", "Max-Age=1800", "HttpOnly", "SameSite=Strict"] {
            XCTAssertTrue(cookie.contains(attribute), cookie)
        }
        assertJSONError(
            try admin(server, "POST", "/admin/v1/auth/verify", body: #"{"email":"ops@example.com","code":"\#(code)"}"#),
            status: 403, code: "otp_expired")  // used once
        XCTAssertFalse(server.logs.contains(code), "the code never appears in the log")
        let line = try XCTUnwrap(server.stderr.waitForLine(containing: "console sign-in admin=", timeout: 5))
        XCTAssertTrue(line.contains("admin=ops@example.com"), line)
    }

    func testSignInRefusesBadInputWithJSONErrors() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink)
        for (path, body, code) in [
            ("/admin/v1/auth/otp", "not json", "bad_json"),
            ("/admin/v1/auth/otp", "[]", "bad_json"),
            ("/admin/v1/auth/otp", "{}", "validation_failed"),
            ("/admin/v1/auth/otp", #"{"email":"no-at-sign"}"#, "validation_failed"),
            ("/admin/v1/auth/otp", #"{"email":42}"#, "validation_failed"),
            ("/admin/v1/auth/verify", #"{"email":"ops@example.com"}"#, "validation_failed"),
            ("/admin/v1/auth/verify", #"{"email":"ops@example.com","code":"12345x"}"#, "otp_expired"),
        ] {
            assertJSONError(
                try admin(server, "POST", path, body: body), status: code == "otp_expired" ? 403 : 400, code: code)
        }
        let large = try server.adminExchange(
            request(
                "POST", "/admin/v1/auth/otp",
                headers: [("Content-Type", "application/json"), ("Content-Length", "5000")]))
        assertJSONError(large, status: 413, code: "body_too_large")
        XCTAssertEqual(try sink.received().count, 0)
    }

    /// Brute force: a console code dies after `TRUNK_SYNC_OTP_MAX_ATTEMPTS` wrong guesses, the
    /// address locks after `TRUNK_SYNC_OTP_FAILURE_LIMIT` refusals (the right code refused
    /// too), and a client is held to the verify rate limit. Each is counted apart from the
    /// app's: guessing at the console locks nobody out of the app.
    func testConsoleCodesDieAfterTheirAttemptsAndTheAddressLocks() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(
            sink,
            [
                "TRUNK_SYNC_OTP_MAX_ATTEMPTS": "3", "TRUNK_SYNC_OTP_FAILURE_LIMIT": "5/3600",
                "TRUNK_SYNC_OTP_RESEND_INTERVAL": "0", "TRUNK_SYNC_RATE_LIMIT_VERIFY": "6/\(rateWindow())",
            ])
        func verify(_ code: String) throws -> RawResponse {
            try admin(server, "POST", "/admin/v1/auth/verify", body: #"{"email":"ops@example.com","code":"\#(code)"}"#)
        }
        func askForCode() throws {
            let asked = try admin(server, "POST", "/admin/v1/auth/otp", body: #"{"email":"ops@example.com"}"#)
            XCTAssertEqual(asked.status, 200, asked.bodyText)
        }
        func wrong(_ code: String) -> String { code == "000000" ? "111111" : "000000" }

        try askForCode()
        let first = try mailedCode(sink, to: Self.operatorEmail)
        for _ in 1...3 { assertJSONError(try verify(wrong(first)), status: 403, code: "otp_expired") }
        let dead = try verify(first)
        assertJSONError(dead, status: 403, code: "otp_expired")
        XCTAssertNil(dead.header("set-cookie"), "the code died after 3 wrong guesses")

        // Five refusals for the address: it is locked, and a fresh code's right value is refused.
        try askForCode()
        let second = try mailedCode(sink, to: Self.operatorEmail, count: 2)
        assertJSONError(try verify(wrong(second)), status: 403, code: "otp_expired")
        let locked = try verify(second)
        assertJSONError(locked, status: 403, code: "otp_expired")
        XCTAssertNil(locked.header("set-cookie"), "locked")
        XCTAssertNotNil(server.stderr.waitForLine(containing: "sign-in locked", timeout: 5))

        // The client's seventh console verify in the window: 429, before anything is checked.
        XCTAssertEqual(try verify(second).status, 429)

        // The app's sign-in for the same address, from the same client, is counted apart.
        XCTAssertEqual(try send(server, "POST", "/auth/v1/otp", body: #"{"email":"ops@example.com"}"#).status, 200)
        let appCode = try mailedCode(sink, to: Self.operatorEmail, count: 3)
        let appSignIn = try send(
            server, "POST", "/auth/v1/verify",
            body: #"{"email":"ops@example.com","token":"\#(appCode)","type":"email"}"#)
        XCTAssertEqual(appSignIn.status, 200, appSignIn.bodyText)
    }

    // MARK: - Authorisation

    func testEveryRouteWantsAConsoleSessionAndNothingElse() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink)
        let (appToken, user) = try appSession(server, "member@example.com")
        let session = UUID().uuidString.lowercased()
        let routes: [(String, String, String?)] = [
            ("GET", "/admin/v1/overview", nil), ("GET", "/admin/v1/users", nil),
            ("GET", "/admin/v1/users/\(user)", nil),
            ("DELETE", "/admin/v1/users/\(user)", #"{"confirm_email":"member@example.com"}"#),
            ("GET", "/admin/v1/users/\(user)/sessions", nil),
            ("DELETE", "/admin/v1/users/\(user)/sessions/\(session)", nil),
            ("GET", "/admin/v1/users/\(user)/events", nil), ("GET", "/admin/v1/users/\(user)/export", nil),
            ("POST", "/admin/v1/auth/logout", nil),
        ]
        for (method, path, body) in routes {
            assertJSONError(try admin(server, method, path, body: body), status: 401, code: "console_unauthorized")
            // An app user's access token is not a console session.
            assertJSONError(
                try admin(server, method, path, body: body, bearer: appToken), status: 401, code: "console_unauthorized"
            )
            assertJSONError(
                try admin(server, method, path, body: body, cookie: appToken), status: 401, code: "console_unauthorized"
            )
            assertJSONError(
                try admin(server, method, path, body: body, cookie: "tsc_" + String(repeating: "A", count: 43)),
                status: 401, code: "console_unauthorized")
        }
        let token = try signIn(server, sink)
        // The cookie without the console's header (what a cross-site form would send): refused.
        for (method, path, body) in routes {
            assertJSONError(
                try admin(server, method, path, body: body, cookie: token, consoleHeader: false), status: 403,
                code: "console_header_required")
        }
        let state = try json(try admin(server, "GET", "/admin/v1/session", cookie: token, consoleHeader: false))
        XCTAssertEqual(state["signed_in"] as? Bool, false)
        // The console's token is not an app token either.
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: token).status, 401)
        XCTAssertEqual(try send(server, "GET", "/auth/v1/user", token: token).status, 401)
        // The app user is untouched by all of the above.
        XCTAssertEqual(try send(server, "GET", "/auth/v1/user", token: appToken).status, 200)

        // Cookie with header, and bearer, both work; sign-out ends the session.
        XCTAssertEqual(try admin(server, "GET", "/admin/v1/overview", cookie: token).status, 200)
        XCTAssertEqual(try admin(server, "GET", "/admin/v1/overview", bearer: token).status, 200)
        let me = try json(try admin(server, "GET", "/admin/v1/session", cookie: token))
        XCTAssertEqual(me["signed_in"] as? Bool, true)
        XCTAssertEqual(me["email"] as? String, Self.operatorEmail)
        let out = try admin(server, "POST", "/admin/v1/auth/logout", cookie: token)
        XCTAssertEqual(out.status, 204)
        XCTAssertTrue(out.header("set-cookie")?.contains("Max-Age=0") ?? false, out.header("set-cookie") ?? "none")
        assertJSONError(
            try admin(server, "GET", "/admin/v1/overview", cookie: token), status: 401, code: "console_unauthorized")
    }

    func testRemovingAnAddressFromAdminEmailsEndsItsSessions() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let first = try startConsoleServer(sink)
        let token = try signIn(first, sink)
        XCTAssertEqual(first.stop(), 0)
        let second = try launchServer(
            on: first.database, ["TRUNK_SYNC_ADMIN_EMAILS": "someone-else@example.com", "TRUNK_SYNC_MAILER": nil])
        try second.waitUntilListening(timeout: 15)
        assertJSONError(
            try admin(second, "GET", "/admin/v1/overview", cookie: token), status: 401, code: "console_unauthorized")
    }

    // MARK: - Overview and users

    func testOverviewReportsTheServersFigures() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink)
        let (appToken, _) = try appSession(server, "member@example.com")
        try push(server, appToken, [("note", #"{"n":1}"#), ("note", #"{"n":2}"#), ("task", #"{"n":3}"#)])
        let token = try signIn(server, sink)
        let before = Date().timeIntervalSince1970
        let overview = try json(try admin(server, "GET", "/admin/v1/overview", cookie: token))
        let after = Date().timeIntervalSince1970
        XCTAssertEqual(overview["users"] as? Int, 1)
        XCTAssertEqual(overview["events_last_24h"] as? Int, 3)
        XCTAssertGreaterThanOrEqual(overview["requests_total"] as? Int ?? 0, 1, "the push, at least")
        XCTAssertEqual(overview["server_errors_total"] as? Int, 0)
        // The newest migration file shipped.
        let newest = try FileManager.default.contentsOfDirectory(atPath: repositoryRoot() + "/migrations")
            .filter { $0.hasSuffix(".sql") }.max().map { String($0.dropLast(4)) }
        XCTAssertEqual(overview["schema_version"] as? String, newest)
        XCTAssertEqual(overview["pending_migrations"] as? Int, 0)
        XCTAssertEqual(overview["long_polls_waiting"] as? Int, 0)
        XCTAssertFalse((overview["version"] as? String ?? "").isEmpty)
        XCTAssertNotNil(overview["sampled_at"] as? Double)
        let pool = try XCTUnwrap(overview["database_pool"] as? [String: Any])
        // The HTTP loops' 10 (TRUNK_SYNC_DB_POOL_SIZE) and the own loop's 2 for work off them.
        XCTAssertEqual(pool["max"] as? Int, 12)
        XCTAssertNotNil(pool["in_use"] as? Int)

        // Requests: one entry per minute since the server started (at most 60), oldest first,
        // the last the current minute; the push and the sign-in were counted, no 5xx.
        let minutes = try XCTUnwrap(overview["requests_per_minute"] as? [[String: Any]])
        XCTAssertTrue((1...60).contains(minutes.count), "\(minutes.count) minutes")
        let starts = minutes.compactMap { $0["start"] as? Int }
        XCTAssertEqual(starts.count, minutes.count)
        XCTAssertEqual(starts, starts.sorted())
        XCTAssertTrue(zip(starts, starts.dropFirst()).allSatisfy { $1 - $0 == 60 }, "consecutive minutes: \(starts)")
        let last = try XCTUnwrap(starts.last)
        XCTAssertTrue(
            (Int(before / 60) * 60...Int(after / 60) * 60).contains(last), "the current minute: \(last), \(before)")
        let requests = minutes.compactMap { ($0["requests_per_second"] as? NSNumber)?.doubleValue }
        XCTAssertEqual(requests.count, minutes.count)
        XCTAssertGreaterThan(requests.reduce(0, +), 0, "the push and the sign-in were counted")
        XCTAssertEqual(minutes.compactMap { ($0["errors_per_second"] as? NSNumber)?.doubleValue }.reduce(0, +), 0)

        // Events: the last 30 days (UTC), today last with the three pushed, zeros before.
        let days = try XCTUnwrap(overview["events_per_day"] as? [[String: Any]])
        XCTAssertEqual(days.count, 30)
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd"
        let today = formatter.string(from: Date(timeIntervalSince1970: after))
        let dayOfRequest = formatter.string(from: Date(timeIntervalSince1970: before))
        XCTAssertTrue(
            [today, dayOfRequest].contains(days.last?["day"] as? String ?? ""), "\(String(describing: days.last))")
        XCTAssertEqual(
            days.first?["day"] as? String,
            formatter.string(
                from: Date(
                    timeIntervalSince1970: (formatter.date(from: days.last?["day"] as? String ?? "")?
                        .timeIntervalSince1970 ?? 0) - 29 * 86_400)))
        XCTAssertEqual(days.last?["events"] as? Int, 3)
        XCTAssertEqual(days.compactMap { $0["events"] as? Int }, Array(repeating: 0, count: 29) + [3])
    }

    func testUsersAreListedSearchedAndPaged() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink)
        for email in ["a1@alpha.example", "a2@alpha.example", "a3@alpha.example", "b1@beta.example", "b2@beta.example"]
        {
            _ = try appSession(server, email)
        }
        let token = try signIn(server, sink)
        let all = try json(try admin(server, "GET", "/admin/v1/users?limit=2", cookie: token))
        XCTAssertEqual(all["total"] as? Int, 5)
        let first = try XCTUnwrap(all["users"] as? [[String: Any]])
        XCTAssertEqual(first.map { $0["email"] as? String }, ["b2@beta.example", "b1@beta.example"], "newest first")
        XCTAssertEqual(first[0]["active_sessions"] as? Int, 1)
        XCTAssertEqual(first[0]["events"] as? Int, 0)
        let third = try json(try admin(server, "GET", "/admin/v1/users?limit=2&offset=4", cookie: token))
        XCTAssertEqual((third["users"] as? [[String: Any]])?.map { $0["email"] as? String }, ["a1@alpha.example"])
        let alpha = try json(try admin(server, "GET", "/admin/v1/users?q=ALPHA", cookie: token))
        XCTAssertEqual(alpha["total"] as? Int, 3)
        // The search is text, not a pattern.
        for q in ["%25", "_", "a%25"] {
            XCTAssertEqual(
                try json(try admin(server, "GET", "/admin/v1/users?q=\(q)", cookie: token))["total"] as? Int, 0, q)
        }
        for query in [
            "limit=0", "limit=101", "limit=abc", "limit=-1", "offset=-1", "offset=1000001", "offset=1e3",
            "q=" + String(repeating: "x", count: 321), "q=%01", "q=alpha%00", "q=%00",
        ] {
            assertJSONError(
                try admin(server, "GET", "/admin/v1/users?\(query)", cookie: token), status: 400,
                code: "validation_failed")
        }
    }

    func testReadsSearchesAndFailedSignInsAreLogged() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink)
        let (_, user) = try appSession(server, "member@example.com")

        // Failed sign-ins leave a line before any lockout: an operator's address by name, any
        // other only by its tag (never in clear), and no code.
        XCTAssertEqual(
            try admin(server, "POST", "/admin/v1/auth/otp", body: #"{"email":"ops@example.com"}"#).status, 200)
        let code = try mailedCode(sink, to: Self.operatorEmail)
        let wrong = code == "000000" ? "111111" : "000000"
        assertJSONError(
            try admin(
                server, "POST", "/admin/v1/auth/verify", body: #"{"email":"ops@example.com","code":"\#(wrong)"}"#),
            status: 403, code: "otp_expired")
        let failed = try XCTUnwrap(server.stderr.waitForLine(containing: "console sign-in failed", timeout: 5))
        XCTAssertTrue(failed.contains("admin=ops@example.com"), failed)
        XCTAssertFalse(failed.contains(wrong), failed)
        assertJSONError(
            try admin(
                server, "POST", "/admin/v1/auth/verify", body: #"{"email":"stranger@example.com","code":"123456"}"#),
            status: 403, code: "otp_expired")
        XCTAssertTrue(
            eventually(within: 5) {
                server.logs.split(separator: "\n").filter { $0.contains("console sign-in failed") }.count == 2
            })
        let outsider = try XCTUnwrap(
            server.logs.split(separator: "\n").last { $0.contains("console sign-in failed") }.map(String.init))
        XCTAssertTrue(outsider.firstMatch(of: /address=[0-9a-f]{16}/) != nil, outsider)
        XCTAssertFalse(server.logs.contains("stranger@example.com"), "no address in clear")

        // Listing, searching and a user's sessions (their addresses and user agents) are logged.
        let verified = try admin(
            server, "POST", "/admin/v1/auth/verify", body: #"{"email":"ops@example.com","code":"\#(code)"}"#)
        XCTAssertEqual(verified.status, 200, verified.bodyText)
        let token = String(
            try XCTUnwrap(verified.header("set-cookie")?.firstMatch(of: /^trunk_sync_console=(tsc_[A-Za-z0-9_-]+);/)?.1)
        )
        XCTAssertEqual(try admin(server, "GET", "/admin/v1/users", cookie: token).status, 200)
        let listed = try XCTUnwrap(server.stderr.waitForLine(containing: "console: users listed", timeout: 5))
        XCTAssertTrue(listed.contains("admin=ops@example.com"), listed)
        XCTAssertEqual(try admin(server, "GET", "/admin/v1/users?q=member", cookie: token).status, 200)
        let searched = try XCTUnwrap(server.stderr.waitForLine(containing: "console: users searched", timeout: 5))
        XCTAssertTrue(
            searched.contains("admin=ops@example.com") && searched.contains("member") && searched.contains("found=1"),
            searched)
        XCTAssertEqual(try admin(server, "GET", "/admin/v1/users/\(user)/sessions", cookie: token).status, 200)
        let viewed = try XCTUnwrap(server.stderr.waitForLine(containing: "console: sessions viewed", timeout: 5))
        XCTAssertTrue(viewed.contains("admin=ops@example.com") && viewed.contains("user_id=\(user)"), viewed)
    }

    func testOverHTTPSThroughATrustedProxyTheCookieIsSecureWithTheHostPrefix() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink, ["TRUNK_SYNC_TRUSTED_PROXIES": "127.0.0.1/32"])
        let https = [("X-Forwarded-Proto", "https"), ("X-Forwarded-For", "203.0.113.9")]
        func exchange(_ method: String, _ path: String, _ headers: [(String, String)], body: String? = nil) throws
            -> RawResponse
        {
            try server.adminExchange(request(method, path, headers: headers, body: body), timeout: 10)
        }
        let json = [("Content-Type", "application/json")]
        XCTAssertEqual(
            try exchange("POST", "/admin/v1/auth/otp", https + json, body: #"{"email":"ops@example.com"}"#).status, 200)
        let code = try mailedCode(sink, to: Self.operatorEmail)
        let verified = try exchange(
            "POST", "/admin/v1/auth/verify", https + json, body: #"{"email":"ops@example.com","code":"\#(code)"}"#)
        XCTAssertEqual(verified.status, 200, verified.bodyText)
        let cookie = try XCTUnwrap(verified.header("set-cookie"))
        let token = String(try XCTUnwrap(cookie.firstMatch(of: /^__Host-trunk_sync_console=(tsc_[A-Za-z0-9_-]+);/)?.1))
        for attribute in ["; Path=/;", "Max-Age=1800", "; Secure", "HttpOnly", "SameSite=Strict"] {
            XCTAssertTrue(cookie.contains(attribute), cookie)
        }
        XCTAssertFalse(cookie.contains("Domain"), cookie)
        let console = [("X-Trunk-Sync-Console", "1")]
        // Over HTTPS only the __Host- cookie counts; over plain HTTP only the plain one.
        XCTAssertEqual(
            try exchange(
                "GET", "/admin/v1/overview", https + console + [("Cookie", "__Host-trunk_sync_console=\(token)")]
            )
            .status, 200)
        assertJSONError(
            try exchange("GET", "/admin/v1/overview", https + console + [("Cookie", "trunk_sync_console=\(token)")]),
            status: 401, code: "console_unauthorized")
        assertJSONError(
            try exchange("GET", "/admin/v1/overview", console + [("Cookie", "__Host-trunk_sync_console=\(token)")]),
            status: 401, code: "console_unauthorized")
        XCTAssertEqual(
            try exchange("GET", "/admin/v1/overview", console + [("Cookie", "trunk_sync_console=\(token)")]).status, 200
        )
        let signedOut = try exchange(
            "POST", "/admin/v1/auth/logout", https + console + [("Cookie", "__Host-trunk_sync_console=\(token)")])
        XCTAssertEqual(signedOut.status, 204)
        XCTAssertEqual(
            signedOut.header("set-cookie"),
            "__Host-trunk_sync_console=; Path=/; Max-Age=0; Secure; HttpOnly; SameSite=Strict")

        // Plain loopback keeps the plain cookie, and a peer that is not a trusted proxy cannot
        // claim HTTPS.
        let direct = try startConsoleServer(sink)
        XCTAssertEqual(
            try direct.adminExchange(
                request("POST", "/admin/v1/auth/otp", headers: https + json, body: #"{"email":"ops@example.com"}"#)
            ).status, 200)
        let second = try mailedCode(sink, to: Self.operatorEmail, count: 2)
        let plain = try direct.adminExchange(
            request(
                "POST", "/admin/v1/auth/verify", headers: https + json,
                body: #"{"email":"ops@example.com","code":"\#(second)"}"#), timeout: 10)
        XCTAssertEqual(plain.status, 200, plain.bodyText)
        let plainCookie = try XCTUnwrap(plain.header("set-cookie"))
        XCTAssertTrue(plainCookie.hasPrefix("trunk_sync_console=tsc_"), plainCookie)
        XCTAssertFalse(plainCookie.contains("Secure"), plainCookie)
    }

    // MARK: - One user

    /// The audit's case: 200,000 events of `{}` made a 73 MB body the console built in memory
    /// (its cap counted payload bytes only). Now streamed as the account export is: a reader
    /// that stops holds nothing more, a whole download keeps memory flat, and the account's
    /// one export lease holds across instances and kinds of export.
    func testTheExportIsStreamedInFlatMemoryWithTheAccountsLease() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink)
        let other = try launchServer(on: server.database)
        try other.waitUntilListening(timeout: 15)
        let (appToken, user) = try appSession(server, "many@example.com")
        let owner = try PostgresConnection.connect(server.database)
        try owner.query(
            """
            insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
            select $1::uuid, n, 'note', '{}', gen_random_uuid(), now(), now() + n * interval '1 millisecond'
            from generate_series(1, 200000) n
            """, user)
        try owner.query("update users set last_seq = 200000 where id = $1::uuid", user)
        let token = try signIn(server, sink)
        let path = "/admin/v1/users/\(user)/export"
        let exportRequest = request(
            "GET", path, headers: [("Cookie", "trunk_sync_console=\(token)"), ("X-Trunk-Sync-Console", "1")])
        XCTAssertNotNil(try json(try admin(server, "GET", "/admin/v1/users/\(user)", cookie: token))["user"])
        usleep(200_000)
        let pid = server.process.processIdentifier
        let idle = AccountTests.residentKiB(pid: pid)

        // A reader that takes the head, then nothing: the body is streamed, and waits for it.
        let stalled = try RawClient.connect(port: server.adminPort)
        try stalled.send(exportRequest)
        let head = try stalled.readResponse(timeout: 10, bodyExpected: false)
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(head.header("transfer-encoding"), "chunked")
        XCTAssertNil(head.header("content-length"))
        let stalledPeak = AccountTests.peakResidentKiB(pid: pid) { usleep(1_000_000) }
        XCTAssertLessThan(stalledPeak - idle, 8 * 1024, "a reader that stops makes the server build nothing more")
        // One export of the account at a time, whichever instance and route asks.
        assertJSONError(try admin(server, "GET", path, cookie: token), status: 409, code: "export_in_progress")
        assertJSONError(
            try send(other, "GET", "/sync/v1/export", token: appToken), status: 409, code: "export_in_progress")
        stalled.close()

        // A whole download, read as it comes: every line, in flat memory.
        var lines = 0
        var status = 0
        var last: [UInt8] = []
        let peak = try AccountTests.peakResidentKiB(pid: pid) {
            XCTAssertTrue(
                try eventually(within: 10, interval: .milliseconds(50)) {
                    let client = try RawClient.connect(port: server.adminPort)
                    defer { client.close() }
                    try client.send(exportRequest)
                    let head = try client.readResponse(timeout: 10, bodyExpected: false)
                    status = head.status
                    guard status == 200 else { return false }  // the stalled export's lease, until it ends
                    while let chunk = try client.readChunk(timeout: 30) {
                        lines += chunk.reduce(0) { $0 + ($1 == 10 ? 1 : 0) }
                        last = Array((last + chunk).suffix(64))
                    }
                    return true
                }, "status \(status)")
        }
        XCTAssertEqual(lines, 200_002, "the account line, every event and the end line")
        XCTAssertTrue(
            String(decoding: last, as: UTF8.self).hasSuffix(
                "\n" + #"{"kind":"end","events":200000,"last_seq":200000}"# + "\n"),
            String(decoding: last, as: UTF8.self))
        print("console export of 200,000 events: RSS idle \(idle) KiB, stalled \(stalledPeak) KiB, peak \(peak) KiB")
        XCTAssertLessThan(peak - idle, 16 * 1024, "the server's memory stays flat while it streams")
        XCTAssertNotNil(server.stderr.waitForLine(containing: "console: user exported", timeout: 5))
    }

    func testAUsersEventsSessionsExportAndDeletion() throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startConsoleServer(sink)
        let (appToken, user) = try appSession(server, "member@example.com")
        let (otherToken, _) = try appSession(server, "member@example.com")
        try push(
            server, appToken,
            [
                ("note", #"{"text":"one"}"#), ("task", #"{"done":false}"#), ("note", #"{"text":"three"}"#),
                ("note", #"{"nested":{"list":[1,2]}}"#), ("task", #"{"done":true}"#),
            ])
        let token = try signIn(server, sink)

        let detail = try json(try admin(server, "GET", "/admin/v1/users/\(user)", cookie: token))
        let profile = try XCTUnwrap(detail["user"] as? [String: Any])
        XCTAssertEqual(profile["email"] as? String, "member@example.com")
        XCTAssertEqual(profile["events"] as? Int, 5)
        XCTAssertEqual(profile["active_sessions"] as? Int, 2)
        XCTAssertEqual(detail["event_types"] as? [String], ["note", "task"])

        // Events: newest first, paged with next_before, filtered by type and time.
        let page1 = try json(try admin(server, "GET", "/admin/v1/users/\(user)/events?limit=2", cookie: token))
        XCTAssertEqual((page1["events"] as? [[String: Any]])?.map { $0["seq"] as? Int }, [5, 4])
        XCTAssertEqual(page1["has_more"] as? Bool, true)
        XCTAssertEqual(page1["next_before"] as? Int, 4)
        let page2 = try json(try admin(server, "GET", "/admin/v1/users/\(user)/events?limit=2&before=4", cookie: token))
        XCTAssertEqual((page2["events"] as? [[String: Any]])?.map { $0["seq"] as? Int }, [3, 2])
        let last = try json(try admin(server, "GET", "/admin/v1/users/\(user)/events?limit=2&before=2", cookie: token))
        XCTAssertEqual((last["events"] as? [[String: Any]])?.map { $0["seq"] as? Int }, [1])
        XCTAssertEqual(last["has_more"] as? Bool, false)
        XCTAssertTrue(last["next_before"] is NSNull)
        let first = try XCTUnwrap((last["events"] as? [[String: Any]])?.first)
        XCTAssertEqual(first["payload"] as? [String: String], ["text": "one"])
        XCTAssertEqual(first["type"] as? String, "note")
        let tasks = try json(try admin(server, "GET", "/admin/v1/users/\(user)/events?type=task", cookie: token))
        XCTAssertEqual((tasks["events"] as? [[String: Any]])?.map { $0["seq"] as? Int }, [5, 2])
        let future = try json(
            try admin(server, "GET", "/admin/v1/users/\(user)/events?from=2999-01-01T00:00:00Z", cookie: token))
        XCTAssertEqual((future["events"] as? [[String: Any]])?.count, 0)
        let past = try json(
            try admin(
                server, "GET", "/admin/v1/users/\(user)/events?from=2000-01-01T00:00:00Z&to=2999-01-01T00:00:00Z",
                cookie: token))
        XCTAssertEqual((past["events"] as? [[String: Any]])?.count, 5)
        for query in [
            "limit=0", "limit=201", "before=0", "before=x", "from=yesterday", "to=2026-13-01T00:00:00Z",
            "from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", "type=" + String(repeating: "t", count: 129),
            // PostgreSQL text cannot hold NUL: libpq would cut `task%00x` to `task` (as REST, refused).
            "type=task%00x", "type=%00", "type=task%0A",
        ] {
            assertJSONError(
                try admin(server, "GET", "/admin/v1/users/\(user)/events?\(query)", cookie: token), status: 400,
                code: "validation_failed")
        }
        for path in [
            "/admin/v1/users/not-a-uuid", "/admin/v1/users/not-a-uuid/events", "/admin/v1/users/not-a-uuid/sessions",
        ] {
            assertJSONError(try admin(server, "GET", path, cookie: token), status: 400, code: "validation_failed")
        }
        let nobody = UUID().uuidString.lowercased()
        for path in ["", "/events", "/sessions", "/export"] {
            assertJSONError(
                try admin(server, "GET", "/admin/v1/users/\(nobody)\(path)", cookie: token), status: 404,
                code: "user_not_found")
        }

        // Sessions: revoking one refuses its token at once, and only its token.
        let sessions = try XCTUnwrap(
            try json(try admin(server, "GET", "/admin/v1/users/\(user)/sessions", cookie: token))["sessions"]
                as? [[String: Any]])
        XCTAssertEqual(sessions.count, 2)
        let claims = try XCTUnwrap(
            try JSONSerialization.jsonObject(
                with: XCTUnwrap(Data(base64URLEncoded: String(appToken.split(separator: ".")[1])))) as? [String: Any])
        let sessionID = try XCTUnwrap(claims["session_id"] as? String)
        XCTAssertTrue(sessions.contains { $0["id"] as? String == sessionID && $0["active"] as? Bool == true })
        assertJSONError(
            try admin(server, "DELETE", "/admin/v1/users/\(user)/sessions/not-a-uuid", cookie: token), status: 400,
            code: "validation_failed")
        assertJSONError(
            try admin(server, "DELETE", "/admin/v1/users/\(user)/sessions/\(nobody)", cookie: token), status: 404,
            code: "session_not_found")
        XCTAssertEqual(
            try admin(server, "DELETE", "/admin/v1/users/\(user)/sessions/\(sessionID)", cookie: token).status, 204)
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: appToken).status, 401)
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: otherToken).status, 200)
        assertJSONError(
            try admin(server, "DELETE", "/admin/v1/users/\(user)/sessions/\(sessionID)", cookie: token), status: 404,
            code: "session_not_found")
        let revokedLine = try XCTUnwrap(server.stderr.waitForLine(containing: "console: session revoked", timeout: 5))
        XCTAssertTrue(
            revokedLine.contains("admin=ops@example.com") && revokedLine.contains("user_id=\(user)"), revokedLine)

        // Export: the account, then its events, then the end line, as JSON lines (the format
        // of /sync/v1/export).
        let exporting = try RawClient.connect(port: server.adminPort)
        try exporting.send(
            request(
                "GET", "/admin/v1/users/\(user)/export",
                headers: [("Cookie", "trunk_sync_console=\(token)"), ("X-Trunk-Sync-Console", "1")]))
        var export = try exporting.readResponse(timeout: 10, bodyExpected: false)
        while let chunk = try exporting.readChunk(timeout: 10) { export.body += chunk }
        exporting.close()
        XCTAssertEqual(export.status, 200)
        XCTAssertEqual(export.header("content-type"), "application/x-ndjson; charset=utf-8")
        XCTAssertTrue(export.header("content-disposition")?.hasPrefix("attachment;") ?? false)
        var lines = export.bodyText.split(separator: "\n")
        XCTAssertEqual(lines.count, 7)
        XCTAssertEqual(lines.removeLast(), #"{"kind":"end","events":5,"last_seq":5}"#)
        let account = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(lines.removeFirst().utf8)) as? [String: Any])
        XCTAssertEqual(account["kind"] as? String, "account")
        XCTAssertEqual(account["id"] as? String, user.lowercased())
        XCTAssertEqual(
            try lines.map { try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }.map {
                $0?["seq"] as? Int
            },
            [1, 2, 3, 4, 5])
        XCTAssertNotNil(server.stderr.waitForLine(containing: "console: user exported", timeout: 5))

        // Deletion: only with the address typed again; then gone, with every session.
        for body in ["{}", #"{"confirm_email":"someone@example.com"}"#, #"{"confirm_email":"nope"}"#] {
            assertJSONError(
                try admin(server, "DELETE", "/admin/v1/users/\(user)", body: body, cookie: token), status: 400,
                code: "confirmation_mismatch")
        }
        assertJSONError(
            try admin(server, "DELETE", "/admin/v1/users/\(user)", body: "[", cookie: token), status: 400,
            code: "bad_json")
        XCTAssertEqual(
            try send(server, "GET", "/sync/v1/events?after=0", token: otherToken).status, 200, "nothing deleted")
        let deleted = try json(
            try admin(
                server, "DELETE", "/admin/v1/users/\(user)", body: #"{"confirm_email":"Member@Example.com"}"#,
                cookie: token))
        XCTAssertEqual(deleted["deleted"] as? Bool, true)
        XCTAssertEqual(deleted["events"] as? Int, 5)
        XCTAssertEqual(deleted["sessions_revoked"] as? Int, 1)
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: otherToken).status, 401)
        assertJSONError(
            try admin(server, "GET", "/admin/v1/users/\(user)", cookie: token), status: 404, code: "user_not_found")
        let deletedLine = try XCTUnwrap(server.stderr.waitForLine(containing: "console: user deleted", timeout: 5))
        XCTAssertTrue(
            deletedLine.contains("admin=ops@example.com") && deletedLine.contains("user_id=\(user)"), deletedLine)
        XCTAssertEqual(try json(try admin(server, "GET", "/admin/v1/users", cookie: token))["total"] as? Int, 0)
    }
}

extension Data {
    /// Base64url without padding, as in a JWT.
    init?(base64URLEncoded text: String) {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        self.init(base64Encoded: base64)
    }
}
