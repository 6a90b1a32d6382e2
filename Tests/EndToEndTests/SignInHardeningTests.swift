import Foundation
import TestSupport
import XCTest

/// Sign-in abuse and session ends through the real binary: /otp reveals nothing even when
/// mail fails, wrong codes lock an address across codes, tokens from another issuer are
/// refused, and signing out ends the access token on every route at once.
final class SignInHardeningTests: EndToEndTestCase {
    func session(_ server: ServerProcess, _ email: String) throws -> [String: Any] {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", email], environment: server.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
    }

    func testAFailingMailServerIsNeitherShownNorSlowsTheAnswer() throws {
        // Nothing listens on this port: every mail fails.
        let closed = try serverPort()
        let server = try startServer([
            "TRUNK_SYNC_MAILER": "smtp",
            "TRUNK_SYNC_SMTP_URL":
                "smtp://127.0.0.1:\(closed)?tls=none",
        ])
        _ = try session(server, "member@example.com")
        let known = try send(
            server, "POST", "/auth/v1/otp", body: #"{"email":"member@example.com","create_user":false}"#)
        let unknown = try send(
            server, "POST", "/auth/v1/otp", body: #"{"email":"stranger@example.com","create_user":false}"#)
        for response in [known, unknown] {
            XCTAssertEqual(response.status, 200, response.bodyText)
            XCTAssertEqual(response.bodyText, "{}")
        }
        XCTAssertEqual(known.comparableHeaders, unknown.comparableHeaders)
        let line = try XCTUnwrap(server.stderr.waitForLine(containing: "sign-in mail failed", timeout: 10), server.logs)
        XCTAssertFalse(line.contains("member@example.com"), line)
        XCTAssertTrue(
            eventually(within: 5) {
                let metrics = (try? server.adminExchange(request("GET", "/metrics")))?.bodyText ?? ""
                return metrics.contains("trunk_sync_mail_failures_total 1\n")
            })
        XCTAssertFalse(server.logs.contains("stranger@example.com"))
    }

    func testWrongCodesLockTheAddressAcrossCodes() throws {
        let server = try startServer(["TRUNK_SYNC_OTP_RESEND_INTERVAL": "0", "TRUNK_SYNC_OTP_FAILURE_LIMIT": "6/3600"])
        let email = "target@example.com"
        var code = ""
        for round in 0..<3 {
            XCTAssertEqual(try send(server, "POST", "/auth/v1/otp", body: #"{"email":"\#(email)"}"#).status, 200)
            // The log mailer prints each code; take the newest.
            XCTAssertTrue(
                eventually(within: 5) {
                    server.logs.components(separatedBy: "sign-in code for \(email)").count > round + 1
                })
            let lines = server.logs.split(separator: "\n").filter { $0.contains("sign-in code for \(email)") }
            code = String(try XCTUnwrap(lines.last?.firstMatch(of: /: (\d{6})/)).output.1)
            if round == 2 { break }
            for guess in ["000000", "111111", "222222", "333333"].filter({ $0 != code }).prefix(3) {
                let wrong = try send(
                    server, "POST", "/auth/v1/verify",
                    body: #"{"email":"\#(email)","token":"\#(guess)","type":"email"}"#)
                XCTAssertEqual(wrong.status, 403)
            }
        }
        let right = try send(
            server, "POST", "/auth/v1/verify", body: #"{"email":"\#(email)","token":"\#(code)","type":"email"}"#)
        XCTAssertEqual(right.status, 403, "locked: the right code is refused like a wrong one")
        XCTAssertEqual(right.jsonObject?["code"] as? String, "otp_expired")
        let locked = try XCTUnwrap(server.stderr.waitForLine(containing: "sign-in locked", timeout: 5))
        XCTAssertTrue(locked.contains("until="), locked)
        XCTAssertFalse(locked.contains(email), locked)
    }

    func testTokensOfAnotherIssuerAreRefused() throws {
        let server = try startServer()
        let token = try XCTUnwrap(try session(server, "iss@example.com")["access_token"] as? String)
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events", token: token).status, 200)
        // Re-signed with the server's own secret by an independent implementation (PyJWT):
        // only the issuer differs.
        let script = """
            import jwt, sys
            claims = jwt.decode(sys.argv[1], options={"verify_signature": False})
            claims["iss"] = "https://another-deployment.example/auth/v1"
            print(jwt.encode(claims, sys.argv[2], algorithm="HS256"))
            """
        let signed = try Command.run("/usr/bin/python3", ["-c", script, token, ServerProcess.jwtSecret])
        XCTAssertEqual(signed.status, 0, signed.stderr)
        let forged = signed.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        for path in ["/sync/v1/events", "/rest/v1/events", "/auth/v1/user"] {
            XCTAssertEqual(try send(server, "GET", path, token: forged).status, 401, path)
        }
    }

    func testLogoutEndsTheAccessTokenAndItsLongPollAtOnce() throws {
        let server = try startServer()
        let token = try XCTUnwrap(try session(server, "bye@example.com")["access_token"] as? String)
        let polling = try server.connect()
        try polling.send(
            request("GET", "/sync/v1/events?after=0&wait=30", headers: [("Authorization", "Bearer \(token)")]))
        XCTAssertTrue(
            eventually(within: 10) {
                ((try? server.adminExchange(request("GET", "/metrics")))?.bodyText ?? "").contains(
                    "trunk_sync_longpolls_waiting 1\n")
            })
        let logout = try send(server, "POST", "/auth/v1/logout", token: token)
        XCTAssertEqual(logout.status, 204)
        let loggedOut = Date()
        for path in ["/sync/v1/events", "/rest/v1/events", "/auth/v1/user"] {
            XCTAssertEqual(try send(server, "GET", path, token: token).status, 401, path)
        }
        let ended = try polling.readResponse(timeout: 5)
        XCTAssertEqual(ended.status, 401)
        XCTAssertLessThan(Date().timeIntervalSince(loggedOut), 1)
    }
}
