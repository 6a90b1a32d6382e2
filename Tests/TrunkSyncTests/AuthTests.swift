import Foundation
import Postgres
import TestSupport
import TrunkCrypto
import XCTest

@testable import TrunkSync

final class AuthTests: XCTestCase {
    var app: AppHarness!

    override func setUp() async throws { app = try await AppHarness() }
    override func tearDown() async throws { await app.stop() }

    func assertAuthError(
        _ response: AppHarness.Response, _ status: Int, _ code: String, file: StaticString = #filePath,
        line: UInt = #line
    ) {
        XCTAssertEqual(response.status, status, response.text, file: file, line: line)
        XCTAssertEqual(response.json["code"] as? String, code, response.text, file: file, line: line)
        XCTAssertEqual(response.json["error_code"] as? String, code, file: file, line: line)
        XCTAssertNotNil(response.json["message"] as? String, file: file, line: line)
        XCTAssertEqual(response.json["msg"] as? String, response.json["message"] as? String, file: file, line: line)
        XCTAssertEqual(response.headers["x-supabase-api-version"], "2024-01-01", file: file, line: line)
    }

    // MARK: - Sign-in

    func testSignInFlowIssuesASessionInTheClientsShape() async throws {
        let session = try await app.signIn("  Alice@Example.COM ")
        XCTAssertEqual(session["token_type"] as? String, "bearer")
        XCTAssertEqual(session["expires_in"] as? Int, 3600)
        let expiresAt = try XCTUnwrap(session["expires_at"] as? Int)
        XCTAssertEqual(Double(expiresAt), Date().timeIntervalSince1970 + 3600, accuracy: 10)
        XCTAssertEqual((session["refresh_token"] as? String)?.count, 43)
        let user = try XCTUnwrap(session["user"] as? [String: Any])
        XCTAssertEqual(user["email"] as? String, "alice@example.com")
        XCTAssertNotNil(UUID(uuidString: user["id"] as? String ?? ""))
        for key in [
            "aud", "role", "phone", "email_confirmed_at", "confirmed_at", "last_sign_in_at", "app_metadata",
            "user_metadata", "identities", "created_at", "updated_at", "is_anonymous",
        ] {
            XCTAssertNotNil(user[key], key)
        }
        XCTAssertEqual(user["aud"] as? String, "authenticated")
        // The same person signing in again is the same user.
        let again = try await app.signInAfterResendInterval("alice@example.com")
        XCTAssertEqual((again["user"] as? [String: Any])?["id"] as? String, user["id"] as? String)
    }

    func testOtpAnswersEmptyObjectAndNeverRevealsWhetherAnAccountExists() async throws {
        let unknown = try await app.request(
            "POST", "/auth/v1/otp", json: ["email": "nobody@example.com", "create_user": false])
        XCTAssertEqual(unknown.status, 200)
        XCTAssertEqual(unknown.text, "{}")
        XCTAssertEqual(app.sender.count(for: "nobody@example.com"), 0, "nothing is sent to an unknown address")
        // Asking again right away is limited exactly as for a real account.
        let again = try await app.request(
            "POST", "/auth/v1/otp", json: ["email": "nobody@example.com", "create_user": false])
        assertAuthError(again, 429, "over_email_send_rate_limit")
        // No code works for it, and no user appears.
        let verify = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "nobody@example.com", "token": "123456", "type": "email"])
        assertAuthError(verify, 403, "otp_expired")
        let users = try app.owner().query("select count(*) from users")[0].decode(Int.self, column: 0)
        XCTAssertEqual(users, 0)
    }

    func testWrongExpiredUsedCodesAndUnknownEmailsGetTheSameAnswer() async throws {
        _ = try await app.request("POST", "/auth/v1/otp", json: ["email": "a@example.com"])
        let code = try await app.sender.code(for: "a@example.com")
        let wrong = code == "000000" ? "111111" : "000000"
        let wrongAnswer = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "a@example.com", "token": wrong, "type": "email"])
        assertAuthError(wrongAnswer, 403, "otp_expired")
        let unknown = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "zz@example.com", "token": code, "type": "email"])
        assertAuthError(unknown, 403, "otp_expired")
        XCTAssertEqual(wrongAnswer.body, unknown.body)
        let good = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "a@example.com", "token": code, "type": "email"])
        XCTAssertEqual(good.status, 200)
        let reused = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "a@example.com", "token": code, "type": "email"])
        assertAuthError(reused, 403, "otp_expired")
        XCTAssertEqual(reused.body, unknown.body)
    }

    func testExpiredCodeIsRefused() async throws {
        _ = try await app.request("POST", "/auth/v1/otp", json: ["email": "late@example.com"])
        let code = try await app.sender.code(for: "late@example.com")
        try app.owner().query(
            "update otp_codes set expires_at = now() - interval '1 second' where email = 'late@example.com'")
        let response = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "late@example.com", "token": code, "type": "email"])
        assertAuthError(response, 403, "otp_expired")
    }

    func testFiveWrongGuessesKillTheCode() async throws {
        _ = try await app.request("POST", "/auth/v1/otp", json: ["email": "g@example.com"])
        let code = try await app.sender.code(for: "g@example.com")
        let wrong = (0..<10).map { String(repeating: String($0), count: 6) }.filter { $0 != code }
        for guess in wrong.prefix(5) {
            let response = try await app.request(
                "POST", "/auth/v1/verify", json: ["email": "g@example.com", "token": guess, "type": "email"])
            assertAuthError(response, 403, "otp_expired")
        }
        let right = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "g@example.com", "token": code, "type": "email"])
        assertAuthError(right, 403, "otp_expired")
    }

    func testCodesAreStoredOnlyAsKeyedHashes() async throws {
        _ = try await app.request("POST", "/auth/v1/otp", json: ["email": "h@example.com"])
        let code = try await app.sender.code(for: "h@example.com")
        let stored = try app.owner().query("select code_hash from otp_codes")[0].decode(PostgresBytes.self, column: 0)
            .bytes
        XCTAssertEqual(stored.count, 32)
        XCTAssertNotEqual(stored, SHA256.hash(code))
        XCTAssertNotEqual(stored, SHA256.hash("h@example.com:" + code))
        XCTAssertNil(String(decoding: stored, as: UTF8.self).range(of: code))
    }

    func testResendIntervalAnswers429WithRetryAfter() async throws {
        let first = try await app.request("POST", "/auth/v1/otp", json: ["email": "r@example.com"])
        XCTAssertEqual(first.status, 200)
        let second = try await app.request("POST", "/auth/v1/otp", json: ["email": "r@example.com"])
        assertAuthError(second, 429, "over_email_send_rate_limit")
        let retry = Int(second.headers["retry-after"] ?? "") ?? 0
        XCTAssertTrue((1...60).contains(retry), "\(retry)")
        _ = try await app.sender.code(for: "r@example.com")
        XCTAssertEqual(app.sender.count(for: "r@example.com"), 1)
    }

    func testMalformedInputIs400AndChangesNothing() async throws {
        let cases: [(String, String, Any?, String?, String)] = [
            ("POST", "/auth/v1/otp", ["email": "not-an-email"], nil, "validation_failed"),
            ("POST", "/auth/v1/otp", ["email": "a b@example.com"], nil, "validation_failed"),
            ("POST", "/auth/v1/otp", [String: String](), nil, "validation_failed"),
            ("POST", "/auth/v1/otp", ["email": 42], nil, "validation_failed"),
            ("POST", "/auth/v1/otp", nil, "{not json", "bad_json"),
            ("POST", "/auth/v1/otp", nil, "[1,2]", "bad_json"),
            (
                "POST", "/auth/v1/verify", ["email": "a@example.com", "token": "123456", "type": "sms"], nil,
                "validation_failed"
            ),
            ("POST", "/auth/v1/verify", ["email": "a@example.com", "type": "email"], nil, "validation_failed"),
            ("POST", "/auth/v1/token?grant_type=refresh_token", [String: String](), nil, "validation_failed"),
            ("POST", "/auth/v1/token?grant_type=password", ["refresh_token": "x"], nil, "unsupported_grant_type"),
            ("POST", "/auth/v1/token", ["refresh_token": "x"], nil, "validation_failed"),
        ]
        for (method, path, json, raw, code) in cases {
            let response = try await app.request(method, path, json: json, rawBody: raw)
            assertAuthError(response, 400, code)
        }
        let rows = try app.owner().query("select (select count(*) from otp_codes) + (select count(*) from users)")[0]
            .decode(Int.self, column: 0)
        XCTAssertEqual(rows, 0)
    }

    func testMailFailureIsLoggedAndCountedButNeverShown() async throws {
        app.sender.setFailing(true)
        let failed = try await app.request("POST", "/auth/v1/otp", json: ["email": "m@example.com"])
        XCTAssertEqual(failed.status, 200, failed.text)
        XCTAssertEqual(failed.text, "{}")
        let deadline = ContinuousClock.now + .seconds(5)
        // The sender counts the failure, then logs it: wait for both.
        while app.application.metrics.mailFailures.value == 0
            || !app.logs.lines.contains(where: { $0.contains("sign-in mail failed") }),
            ContinuousClock.now < deadline
        {
            try await Task.sleep(for: .milliseconds(5))
        }
        XCTAssertEqual(app.application.metrics.mailFailures.value, 1)
        XCTAssertTrue(app.application.metrics.render().contains("trunk_sync_mail_failures_total 1\n"))
        let line = try XCTUnwrap(app.logs.lines.first { $0.contains("sign-in mail failed") }, "\(app.logs.lines)")
        XCTAssertFalse(line.contains("m@example.com"), line)
        XCTAssertTrue(line.contains("<recipient>"), line)
        // Nor the code, which the server's reply quoted.
        let code = try XCTUnwrap(app.sender.lastFailed(for: "m@example.com"))
        XCTAssertFalse(line.contains(code), line)
        XCTAssertTrue(line.contains("<code>"), line)
        XCTAssertTrue(
            line.contains("address=" + app.application.auth.addressTag(try XCTUnwrap(Email("m@example.com")))), line)
        // The address waits for the resend interval like any other: answering otherwise would
        // tell an address with an account (whose mail failed) from one without (no mail).
        app.sender.setFailing(false)
        let again = try await app.request("POST", "/auth/v1/otp", json: ["email": "m@example.com"])
        assertAuthError(again, 429, "over_email_send_rate_limit")
        let later = try await app.signInAfterResendInterval("m@example.com")
        XCTAssertNotNil(later["access_token"] as? String)
    }

    func testStaleCodesAreRemovedAndEveryLiveLimitKept() async throws {
        // A live code, asked for through the route (the row any address gets).
        let asked = try await app.request("POST", "/auth/v1/otp", json: ["email": "live@example.com"])
        XCTAssertEqual(asked.status, 200, asked.text)
        let owner = try app.owner()
        let user = UUID()
        try owner.execute(
            """
            insert into otp_codes (email, code_hash, created_at, expires_at, signup_data) values
              ('stale@example.com', '\\x00', now() - interval '3 days', now() - interval '2 days', '{"full_name":"Stale"}'),
              ('stale2@example.com', '\\x00', now() - interval '3 days', now() - interval '2 days', null),
              ('stale3@example.com', '\\x00', now() - interval '3 days', now() - interval '2 days', null),
              ('locked@example.com', '\\x00', now() - interval '3 days', now() - interval '2 days', null),
              ('failed@example.com', '\\x00', now() - interval '3 days', now() - interval '2 days', null),
              ('recent@example.com', '\\x00', now() - interval '2 hours', now() - interval '1 hour', null);
            update otp_codes set failures = 10, failures_since = now() - interval '3 days',
              locked_until = now() + interval '1 hour' where email = 'locked@example.com';
            update otp_codes set failures = 3, failures_since = now() - interval '2 hours' where email = 'failed@example.com';
            insert into users (id, email) values ('\(user.uuidString.lowercased())', 'confirm@example.com');
            insert into reauthentication_codes (user_id, code_hash, created_at, expires_at)
              values ('\(user.uuidString.lowercased())', '\\x00', now() - interval '3 days', now() - interval '2 days');
            """)
        func addresses() throws -> [String] {
            try owner.query("select email from otp_codes order by email").map { try $0.decode(String.self, column: 0) }
        }

        // At most `maxRows` of each table a call.
        let first = try await app.application.trimStaleCodes(maxRows: 2)
        XCTAssertEqual(first.signIn, 2)
        XCTAssertEqual(first.confirmation, 1)
        let second = try await app.application.trimStaleCodes()
        XCTAssertEqual(second.signIn, 1)
        XCTAssertEqual(second.confirmation, 0)
        // Kept: the live code, a code of the last hours, a refused attempt within the failure
        // window (at most a day), a lock still running.
        XCTAssertEqual(
            try addresses(), ["failed@example.com", "live@example.com", "locked@example.com", "recent@example.com"])
        let third = try await app.application.trimStaleCodes()
        XCTAssertEqual(third.signIn, 0)
        XCTAssertEqual(
            try owner.query("select count(*) from reauthentication_codes")[0].decode(Int.self, column: 0), 0)
        // The lock still holds: the address's verification is refused.
        let locked = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "locked@example.com", "token": "123456", "type": "email"])
        assertAuthError(locked, 403, "otp_expired")

        // What `serve` starts does it on its own (and `close()` stops it).
        try owner.execute(
            """
            insert into otp_codes (email, code_hash, created_at, expires_at)
              values ('later@example.com', '\\x00', now() - interval '3 days', now() - interval '2 days')
            """)
        app.application.startHousekeeping(every: .milliseconds(20), first: .zero)
        let deadline = Date().addingTimeInterval(30)
        while try addresses().contains("later@example.com"), Date() < deadline { await Task.yield() }
        XCTAssertFalse(try addresses().contains("later@example.com"))
    }

    // MARK: - Tokens

    func testAccessTokenVerifiesWithAnIndependentImplementation() async throws {
        let session = try await app.signIn("jwt@example.com")
        let token = try XCTUnwrap(session["access_token"] as? String)
        let script = """
            import jwt, sys, json
            claims = jwt.decode(sys.argv[1], sys.argv[2], algorithms=["HS256"], audience="authenticated")
            print(json.dumps(claims))
            """
        let result = try Command.run("/usr/bin/python3", ["-c", script, token, app.secret])
        XCTAssertEqual(result.status, 0, result.stderr)
        let claims = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        XCTAssertEqual(claims["sub"] as? String, (session["user"] as? [String: Any])?["id"] as? String)
        XCTAssertEqual(claims["role"] as? String, "authenticated")
        XCTAssertEqual(claims["email"] as? String, "jwt@example.com")
        for key in ["exp", "iat", "iss", "session_id", "aal", "amr", "app_metadata", "user_metadata", "is_anonymous"] {
            XCTAssertNotNil(claims[key], key)
        }
        let wrongKey = try Command.run("/usr/bin/python3", ["-c", script, token, app.secret + "x"])
        XCTAssertNotEqual(wrongKey.status, 0)
    }

    func testForgedNoneExpiredAndWrongAudienceTokensAre401() async throws {
        let session = try await app.signIn("forge@example.com")
        let token = try XCTUnwrap(session["access_token"] as? String)
        let parts = token.split(separator: ".").map(String.init)
        let payload = try XCTUnwrap(Base64URL.decode(parts[1]))
        var claims = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any])
        func sign(_ claims: [String: Any], header: String = #"{"alg":"HS256","typ":"JWT"}"#, secret: String) throws
            -> String
        {
            let body = Base64URL.encode(Array(try JSONSerialization.data(withJSONObject: claims)))
            let input = Base64URL.encode(header) + "." + body
            return input + "." + Base64URL.encode(HMAC.sha256(key: Array(secret.utf8), message: input))
        }
        var tampered = claims
        tampered["sub"] = UUID().uuidString.lowercased()
        let forged =
            parts[0] + "." + Base64URL.encode(Array(try JSONSerialization.data(withJSONObject: tampered))) + "."
            + parts[2]
        let none = Base64URL.encode(#"{"alg":"none","typ":"JWT"}"#) + "." + parts[1] + "."
        claims["exp"] = Int(Date().timeIntervalSince1970) - 120
        let expired = try sign(claims, secret: app.secret)
        claims["exp"] = Int(Date().timeIntervalSince1970) + 600
        claims["aud"] = "anon"
        let wrongAudience = try sign(claims, secret: app.secret)
        claims["aud"] = "authenticated"
        let otherSecret = try sign(claims, secret: "another-secret-another-secret-another")
        // A kid on an HS256 token is only a hint (hosted Supabase puts one on tokens signed
        // with the project's secret): with another secret it is refused like any forgery.
        let kidOtherSecret = try sign(
            claims, header: #"{"alg":"HS256","typ":"JWT","kid":"k9"}"#, secret: "another-secret-another-secret-another")
        for bad in [forged, none, expired, wrongAudience, otherSecret, kidOtherSecret, "garbage", "a.b.c", ""] {
            let response = try await app.request("GET", "/auth/v1/user", bearer: bad)
            XCTAssertEqual(response.status, 401, bad)
        }
        let valid = try sign(claims, secret: app.secret)
        let accepted = try await app.request("GET", "/auth/v1/user", bearer: valid)
        XCTAssertEqual(accepted.status, 200, accepted.text)
        let withKid = try sign(claims, header: #"{"alg":"HS256","typ":"JWT","kid":"k9"}"#, secret: app.secret)
        let hinted = try await app.request("GET", "/auth/v1/user", bearer: withKid)
        XCTAssertEqual(hinted.status, 200, hinted.text)
        let noHeader = try await app.request("GET", "/auth/v1/user")
        assertAuthError(noHeader, 401, "no_authorization")
    }

    func testTokensOfAnotherIssuerOrFromTheFutureAre401OnEveryRouteFamily() async throws {
        let session = try await app.signIn("claims@example.com")
        let token = try XCTUnwrap(session["access_token"] as? String)
        let payload = try XCTUnwrap(Base64URL.decode(String(token.split(separator: ".")[1])))
        let claims = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any])
        XCTAssertEqual(claims["iss"] as? String, app.application.configuration.publicURL + "/auth/v1")
        // Signed with the right key: only the claims are wrong.
        func sign(_ change: (inout [String: Any]) -> Void) throws -> String {
            var changed = claims
            change(&changed)
            let input =
                Base64URL.encode(#"{"alg":"HS256","typ":"JWT"}"#) + "."
                + Base64URL.encode(Array(try JSONSerialization.data(withJSONObject: changed)))
            return input + "." + Base64URL.encode(HMAC.sha256(key: Array(app.secret.utf8), message: input))
        }
        let now = Int(Date().timeIntervalSince1970)
        let bad: [(String, String)] = [
            ("another issuer", try sign { $0["iss"] = "https://elsewhere.example/auth/v1" }),
            ("no issuer", try sign { $0["iss"] = nil }),
            ("issuer not a string", try sign { $0["iss"] = 1 }),
            ("issued in the future", try sign { $0["iat"] = now + 120 }),
            ("valid only in the future", try sign { $0["nbf"] = now + 120 }),
            ("no issue time", try sign { $0["iat"] = nil }),
            ("no session", try sign { $0["session_id"] = nil }),
            ("no audience", try sign { $0["aud"] = nil }),
        ]
        let routes = ["/sync/v1/events", "/rest/v1/events", "/auth/v1/user"]
        for (name, forged) in bad {
            for path in routes {
                let response = try await app.request("GET", path, bearer: forged)
                XCTAssertEqual(response.status, 401, "\(name) on \(path): \(response.text)")
            }
            let push = try await app.request(
                "POST", "/sync/v1/events", json: ["events": [SyncTests.event()]], bearer: forged)
            XCTAssertEqual(push.status, 401, "\(name) on push")
        }
        // The same claims re-signed unchanged, and a little clock skew, are accepted.
        for (name, good) in [
            ("unchanged", try sign { _ in }), ("issued 10 s ahead", try sign { $0["iat"] = now + 10 }),
            ("valid from a minute ago", try sign { $0["nbf"] = now - 60 }),
        ] {
            for path in routes {
                let response = try await app.request("GET", path, bearer: good)
                XCTAssertEqual(response.status, 200, "\(name) on \(path): \(response.text)")
            }
        }
        XCTAssertEqual(try app.owner().query("select count(*) from events")[0].decode(Int.self, column: 0), 0)
    }

    /// `POST /auth/v1/token?grant_type=refresh_token` with `token`.
    func refresh(_ token: String) async throws -> AppHarness.Response {
        try await app.request("POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": token])
    }

    /// Refreshes `token`, which must succeed; the answer and its new refresh token.
    func rotate(_ token: String, file: StaticString = #filePath, line: UInt = #line) async throws -> (
        AppHarness.Response, String
    ) {
        let answer = try await refresh(token)
        XCTAssertEqual(answer.status, 200, answer.text, file: file, line: line)
        return (answer, try XCTUnwrap(answer.json["refresh_token"] as? String, file: file, line: line))
    }

    func testRefreshRotatesAndLateReuseRevokesTheSession() async throws {
        let session = try await app.signIn("rot@example.com")
        let first = try XCTUnwrap(session["refresh_token"] as? String)
        let (rotated, second) = try await rotate(first)
        XCTAssertNotEqual(first, second)
        XCTAssertNotNil(rotated.json["user"] as? [String: Any])
        // The second is used in turn, so the first was exchanged for a token that has been
        // used: reused long after its rotation (a replay), it revokes the whole session.
        let (again, third) = try await rotate(second)
        try app.owner().query(
            "update refresh_tokens set rotated_at = now() - interval '11 seconds' where rotated_at is not null")
        let reused = try await refresh(first)
        assertAuthError(reused, 400, "refresh_token_already_used")
        let descendant = try await refresh(third)
        assertAuthError(descendant, 400, "refresh_token_not_found")
        let access = try XCTUnwrap(again.json["access_token"] as? String)
        let user = try await app.request("GET", "/auth/v1/user", bearer: access)
        assertAuthError(user, 401, "session_not_found")
    }

    /// A refresh whose answer was lost (a timeout, a dropped connection, storage full): the
    /// client still holds the rotated token and presents it again, long after. Its successor
    /// was never used, so the session goes on — as Supabase Auth gives such a client the
    /// active token — with a new token; the lost one is superseded, and presenting it later
    /// is a replay that revokes the session.
    func testARefreshWhoseAnswerWasLostCanBeRetriedLate() async throws {
        let session = try await app.signIn("lost@example.com")
        let first = try XCTUnwrap(session["refresh_token"] as? String)
        let (_, neverReceived) = try await rotate(first)
        try app.owner().query(
            "update refresh_tokens set rotated_at = now() - interval '1 hour' where rotated_at is not null")
        let (retried, next) = try await rotate(first)
        XCTAssertNotEqual(next, neverReceived)
        let access = try XCTUnwrap(retried.json["access_token"] as? String)
        let user = try await app.request("GET", "/auth/v1/user", bearer: access)
        XCTAssertEqual(user.status, 200, user.text)
        // Another tab retrying the same token at the same time gets a token of the session
        // too (the reuse interval counts from the retry), and both go on rotating.
        let (_, tabs) = try await rotate(first)
        for token in [next, tabs] { _ = try await rotate(token) }
        // The superseded token, presented after all: somebody else held it. The session ends.
        let replayed = try await refresh(neverReceived)
        assertAuthError(replayed, 400, "refresh_token_already_used")
        let after = try await app.request("GET", "/auth/v1/user", bearer: access)
        assertAuthError(after, 401, "session_not_found")
    }

    /// A refresh locks its session before its token: one waiting for the session holds no
    /// token, so a late retry of the token's parent (which holds the session) can supersede
    /// it without a deadlock (with the token locked first, PostgreSQL aborted one of the two:
    /// a 500). The test holds the session as such a retry does.
    func testARefreshWaitingForItsSessionHoldsNoTokenLock() async throws {
        let session = try await app.signIn("order@example.com")
        let (_, successor) = try await rotate(try XCTUnwrap(session["refresh_token"] as? String))
        let holder = try app.owner()
        try holder.execute("begin")
        try holder.query(
            """
            select from sessions where id = (select t.session_id from refresh_tokens t join users u on u.id = t.user_id
                                             where u.email = 'order@example.com' and t.parent_id is not null)
            for update
            """)
        let harness: AppHarness = app
        let pending = Task {
            try await harness.request(
                "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": successor])
        }
        // Ready once the refresh waits on a lock (the session's).
        let watcher = try app.owner()
        let deadline = Date().addingTimeInterval(20)
        while try watcher.query(
            "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()")[0]
            .decode(Int64.self, column: 0) == 0, Date() < deadline
        {
            try await Task.sleep(for: .milliseconds(5))
        }
        try holder.execute("set local lock_timeout = '10s'")
        try holder.query(
            """
            update refresh_tokens t set rotated_at = now(), revoked_at = now()
            from users u where u.id = t.user_id and u.email = 'order@example.com' and t.parent_id is not null
            """)
        try holder.execute("commit")
        // The waiting refresh then finds its token superseded: a replay, the session revoked.
        assertAuthError(try await pending.value, 400, "refresh_token_already_used")
    }

    func testConcurrentRefreshOfOneTokenGivesBothTabsASession() async throws {
        let session = try await app.signIn("tabs@example.com")
        let token = try XCTUnwrap(session["refresh_token"] as? String)
        let harness: AppHarness = app
        async let one = harness.request(
            "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": token])
        async let two = harness.request(
            "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": token])
        let (a, b) = try await (one, two)
        XCTAssertEqual([a.status, b.status], [200, 200], a.text + b.text)
        let tokens = [a.json["refresh_token"] as? String, b.json["refresh_token"] as? String].compactMap { $0 }
        XCTAssertEqual(Set(tokens).count, 2)
        // Both new tokens keep working: neither tab is signed out.
        for next in tokens {
            let refreshed = try await app.request(
                "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": next])
            XCTAssertEqual(refreshed.status, 200, refreshed.text)
        }
    }

    func testUnknownRefreshTokenIsRefused() async throws {
        let response = try await app.request(
            "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": "nope"])
        assertAuthError(response, 400, "refresh_token_not_found")
    }

    // MARK: - Logout and user

    func testLogoutScopes() async throws {
        var sessions: [[String: Any]] = []
        for _ in 0..<3 { sessions.append(try await app.signInAfterResendInterval("out@example.com")) }
        let tokens = sessions.compactMap { $0["access_token"] as? String }
        let refresh = sessions.compactMap { $0["refresh_token"] as? String }
        // others: the caller stays, the rest go.
        let others = try await app.request("POST", "/auth/v1/logout?scope=others", bearer: tokens[0])
        XCTAssertEqual(others.status, 204)
        XCTAssertTrue(others.body.isEmpty)
        let keep = try await app.request("GET", "/auth/v1/user", bearer: tokens[0])
        XCTAssertEqual(keep.status, 200)
        let gone = try await app.request("GET", "/auth/v1/user", bearer: tokens[1])
        assertAuthError(gone, 401, "session_not_found")
        let goneRefresh = try await app.request(
            "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": refresh[2]])
        XCTAssertEqual(goneRefresh.status, 400)
        // local: the caller's session ends and can never refresh.
        let local = try await app.request("POST", "/auth/v1/logout?scope=local", bearer: tokens[0])
        XCTAssertEqual(local.status, 204)
        let after = try await app.request(
            "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": refresh[0]])
        assertAuthError(after, 400, "refresh_token_not_found")
        // global on a fresh sign-in ends every session.
        let a = try await app.signInAfterResendInterval("out@example.com")
        let b = try await app.signInAfterResendInterval("out@example.com")
        let global = try await app.request("POST", "/auth/v1/logout", bearer: a["access_token"] as? String)
        XCTAssertEqual(global.status, 204)
        let bUser = try await app.request("GET", "/auth/v1/user", bearer: b["access_token"] as? String)
        assertAuthError(bUser, 401, "session_not_found")
        let c = try await app.signInAfterResendInterval("out@example.com")
        let badScope = try await app.request(
            "POST", "/auth/v1/logout?scope=everyone", bearer: c["access_token"] as? String)
        XCTAssertEqual(badScope.status, 400)
        let noToken = try await app.request("POST", "/auth/v1/logout")
        XCTAssertEqual(noToken.status, 401)
    }

    func testUpdateUserMergesMetadataAndSetsFullName() async throws {
        let session = try await app.signIn("meta@example.com")
        let token = try XCTUnwrap(session["access_token"] as? String)
        let first = try await app.request(
            "PUT", "/auth/v1/user", json: ["data": ["full_name": "Ada L", "theme": "dark"]], bearer: token)
        XCTAssertEqual(first.status, 200, first.text)
        let second = try await app.request("PUT", "/auth/v1/user", json: ["data": ["lang": "en"]], bearer: token)
        let metadata = try XCTUnwrap(second.json["user_metadata"] as? [String: Any])
        XCTAssertEqual(metadata["full_name"] as? String, "Ada L")
        XCTAssertEqual(metadata["theme"] as? String, "dark")
        XCTAssertEqual(metadata["lang"] as? String, "en")
        let stored = try app.owner().query("select full_name from users")[0].decode(String.self, column: 0)
        XCTAssertEqual(stored, "Ada L")
        let email = try await app.request("PUT", "/auth/v1/user", json: ["email": "new@example.com"], bearer: token)
        assertAuthError(email, 422, "feature_not_supported")
        let badName = try await app.request("PUT", "/auth/v1/user", json: ["data": ["full_name": 7]], bearer: token)
        assertAuthError(badName, 400, "validation_failed")
    }

    /// `signInWithOtp({email, options: {data}})`: as Supabase Auth does, `data` becomes the
    /// metadata of the user the code signs up (the profile's name with it); one who already
    /// has an account keeps theirs. The code's copy is cleared once used.
    func testOtpDataIsTheMetadataOfTheUserItSignsUp() async throws {
        let session = try await app.signIn("new@example.com", data: ["full_name": "Ada", "theme": "dark"])
        let user = try XCTUnwrap(session["user"] as? [String: Any])
        let metadata = try XCTUnwrap(user["user_metadata"] as? [String: Any])
        XCTAssertEqual(metadata["full_name"] as? String, "Ada", "\(user)")
        XCTAssertEqual(metadata["theme"] as? String, "dark")
        let token = try XCTUnwrap(session["access_token"] as? String)
        let profile = try await app.request(
            "GET", "/rest/v1/profiles?select=full_name", bearer: token, headers: ["apikey": "anon"])
        XCTAssertEqual(profile.text, #"[{"full_name":"Ada"}]"#)
        let claims = try JSONSerialization.jsonObject(
            with: XCTUnwrap(Base64URL.decode(String(token.split(separator: ".")[1])).map { Data($0) }))
        XCTAssertEqual(
            ((claims as? [String: Any])?["user_metadata"] as? [String: Any])?["theme"] as? String, "dark")
        let left = try app.owner().query("select count(*) from otp_codes where signup_data is not null")
        XCTAssertEqual(try left[0].decode(Int.self, column: 0), 0, "the code's copy is cleared")

        // Signing in again with other data changes nothing of an existing account.
        let again = try await app.signInAfterResendInterval("new@example.com", data: ["full_name": "Eve"])
        let kept = try XCTUnwrap((again["user"] as? [String: Any])?["user_metadata"] as? [String: Any])
        XCTAssertEqual(kept["full_name"] as? String, "Ada")
        let stored = try app.owner().query("select full_name from users")[0].decode(String.self, column: 0)
        XCTAssertEqual(stored, "Ada")

        // Without data, a new user's metadata is empty; a name that is not a string is refused.
        let plain = try await app.signIn("plain@example.com")
        XCTAssertEqual(((plain["user"] as? [String: Any])?["user_metadata"] as? [String: Any])?.count, 0)
        let badName = try await app.request(
            "POST", "/auth/v1/otp", json: ["email": "bad@example.com", "data": ["full_name": 7]])
        assertAuthError(badName, 400, "validation_failed")
        let nullData = try await app.request(
            "POST", "/auth/v1/otp", json: ["email": "null@example.com", "data": NSNull()])
        XCTAssertEqual(nullData.status, 200, nullData.text)
    }

    /// Supabase Auth removes a top-level key set to `null` (how `updateUser({data: {key: null}})`
    /// deletes one); nested `null`s and keys not named stay.
    func testUpdateUserRemovesTheKeysSetToNull() async throws {
        let session = try await app.signIn("forget@example.com")
        let token = try XCTUnwrap(session["access_token"] as? String)
        let first = try await app.request(
            "PUT", "/auth/v1/user",
            json: ["data": ["full_name": "Ada", "theme": "dark", "keep": ["inner": NSNull()]]], bearer: token)
        XCTAssertEqual(first.status, 200, first.text)
        let second = try await app.request(
            "PUT", "/auth/v1/user", json: ["data": ["theme": NSNull(), "full_name": NSNull(), "lang": "en"]],
            bearer: token)
        XCTAssertEqual(second.status, 200, second.text)
        let metadata = try XCTUnwrap(second.json["user_metadata"] as? [String: Any])
        XCTAssertEqual(metadata.keys.sorted(), ["keep", "lang"], second.text)
        XCTAssertEqual((metadata["keep"] as? [String: Any])?.keys.sorted(), ["inner"])
        let stored = try app.owner().query("select full_name, user_metadata::text from users")[0]
        XCTAssertNil(try stored.decode(String?.self, column: 0))
        XCTAssertFalse(try stored.decode(String.self, column: 1).contains("theme"))
        let user = try await app.request("GET", "/auth/v1/user", bearer: token)
        XCTAssertEqual((user.json["user_metadata"] as? [String: Any])?.keys.sorted(), ["keep", "lang"], user.text)
    }

    /// Every access token carries `user_metadata`. Whatever the user could store, the next
    /// token verifies on every route: a string over 4 KiB, nesting 20 deep, a number
    /// PostgreSQL prints with 301 digits (each once signed the user out of everything at the
    /// next refresh, for good: fixing the metadata needs a token). Metadata too large for a
    /// token in a request header is refused, by both APIs that write it, and changes nothing.
    func testTokensVerifyWhateverMetadataTheyCarryAndOversizedMetadataIsRefused() async throws {
        let session = try await app.signIn("meta-big@example.com")
        let token = try XCTUnwrap(session["access_token"] as? String)
        let refresh = try XCTUnwrap(session["refresh_token"] as? String)
        let deep = String(repeating: #"{"n":"#, count: 20) + #""deep""# + String(repeating: "}", count: 20)
        let bio = String(repeating: "b", count: 5000)
        let stored = try await app.request(
            "PUT", "/auth/v1/user", rawBody: #"{"data":{"bio":"\#(bio)","big":1e300,"deep":\#(deep)}}"#, bearer: token)
        XCTAssertEqual(stored.status, 200, stored.text)
        let refreshed = try await app.request(
            "POST", "/auth/v1/token?grant_type=refresh_token", json: ["refresh_token": refresh])
        XCTAssertEqual(refreshed.status, 200, refreshed.text)
        let next = try XCTUnwrap(refreshed.json["access_token"] as? String)
        let user = try await app.request("GET", "/auth/v1/user", bearer: next)
        XCTAssertEqual(user.status, 200, user.text)
        XCTAssertEqual((user.json["user_metadata"] as? [String: Any])?["bio"] as? String, bio)
        let rest = try await app.request("GET", "/rest/v1/events", bearer: next)
        XCTAssertEqual(rest.status, 200, rest.text)
        let pull = try await app.request("GET", "/sync/v1/events", bearer: next)
        XCTAssertEqual(pull.status, 200, pull.text)

        let pad = String(repeating: "p", count: 16 * 1024)  // UserRecord.maxMetadataBytes
        let tooLarge = try await app.request("PUT", "/auth/v1/user", json: ["data": ["pad": pad]], bearer: next)
        assertAuthError(tooLarge, 400, "validation_failed")
        let longName = try await app.request(
            "PATCH", "/rest/v1/profiles", json: ["full_name": pad], bearer: next,
            headers: ["Prefer": "return=representation"])
        XCTAssertEqual(longName.status, 400, longName.text)
        XCTAssertEqual(longName.json["code"] as? String, "validation_failed")
        let unchanged = try await app.request("GET", "/auth/v1/user", bearer: next)
        let metadata = try XCTUnwrap(unchanged.json["user_metadata"] as? [String: Any])
        XCTAssertNil(metadata["pad"])
        XCTAssertNil(metadata["full_name"])
        XCTAssertEqual(metadata["bio"] as? String, bio)
        // Just under the limit is kept, and its tokens still verify.
        let name = String(repeating: "n", count: 1000)
        let named = try await app.request("PATCH", "/rest/v1/profiles", json: ["full_name": name], bearer: next)
        XCTAssertEqual(named.status, 204, named.text)
        let again = try await app.request(
            "POST", "/auth/v1/token?grant_type=refresh_token",
            json: ["refresh_token": try XCTUnwrap(refreshed.json["refresh_token"] as? String)])
        let latest = try await app.request(
            "GET", "/auth/v1/user", bearer: try XCTUnwrap(again.json["access_token"] as? String))
        XCTAssertEqual((latest.json["user_metadata"] as? [String: Any])?["full_name"] as? String, name)
    }

    func testJWKSIsPublicAndEmptyForHS256() async throws {
        let response = try await app.request("GET", "/auth/v1/.well-known/jwks.json")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.text, #"{"keys":[]}"#)
        XCTAssertEqual(response.headers["cache-control"], "public, max-age=600")
    }
}

final class AuthRateLimitTests: XCTestCase {
    func testPerIPLimitsAnswer429WithRetryAfterAndAreSharedThroughPostgres() async throws {
        let window = rateWindow()
        let app = try await AppHarness(environment: [
            "TRUNK_SYNC_RATE_LIMIT_OTP": "3/\(window)", "TRUNK_SYNC_RATE_LIMIT_VERIFY": "2/\(window)",
        ])
        defer { Task { await app.stop() } }
        for index in 0..<3 {
            let ok = try await app.request("POST", "/auth/v1/otp", json: ["email": "u\(index)@example.com"])
            XCTAssertEqual(ok.status, 200)
        }
        let limited = try await app.request("POST", "/auth/v1/otp", json: ["email": "u9@example.com"])
        XCTAssertEqual(limited.status, 429)
        XCTAssertEqual(limited.json["code"] as? String, "over_request_rate_limit")
        XCTAssertTrue((1...window).contains(Int(limited.headers["retry-after"] ?? "") ?? 0))
        for _ in 0..<2 {
            _ = try await app.request(
                "POST", "/auth/v1/verify", json: ["email": "u0@example.com", "token": "000000", "type": "email"])
        }
        let verifyLimited = try await app.request(
            "POST", "/auth/v1/verify", json: ["email": "u0@example.com", "token": "000000", "type": "email"])
        XCTAssertEqual(verifyLimited.status, 429)
        let counted = try app.owner().query("select sum(hits) from rate_limits where bucket like 'ip:otp:%'")[0].decode(
            Int.self, column: 0)
        XCTAssertEqual(counted, 4)
    }

    func testGlobalMailCapCountsEveryAddressAlike() async throws {
        let app = try await AppHarness(environment: ["TRUNK_SYNC_RATE_LIMIT_MAIL": "2/\(rateWindow(3600))"])
        defer { Task { await app.stop() } }
        _ = try await app.token("known@example.com")
        // Requests that send no mail (no account, create_user false) count as well: the cap
        // must not answer an address with an account differently from one without.
        for index in 0..<2 {
            let ok = try await app.request(
                "POST", "/auth/v1/otp", json: ["email": "cap\(index)@example.com", "create_user": false])
            XCTAssertEqual(ok.status, 200)
        }
        let known = try await app.request(
            "POST", "/auth/v1/otp", json: ["email": "known@example.com", "create_user": false])
        let unknown = try await app.request(
            "POST", "/auth/v1/otp", json: ["email": "cap9@example.com", "create_user": false])
        for capped in [known, unknown] {
            XCTAssertEqual(capped.status, 429)
            XCTAssertEqual(capped.json["code"] as? String, "over_email_send_rate_limit")
        }
        // The same but for the seconds left, which may tick between the two.
        XCTAssertEqual(known.text.filter { !$0.isNumber }, unknown.text.filter { !$0.isNumber })
        XCTAssertEqual(app.sender.count(for: "known@example.com"), 0)
    }
}

extension AppHarness {
    /// Signs in again regardless of the resend interval (by ageing the last code's row).
    func signInAfterResendInterval(_ email: String, data: [String: Any]? = nil) async throws -> [String: Any] {
        try owner().query("update otp_codes set created_at = created_at - interval '1 hour'")
        return try await signIn(email, data: data)
    }
}
