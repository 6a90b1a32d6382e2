import Foundation
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// Wrong codes are counted per address across codes: asking for a new code does not buy
/// more guesses.
final class SignInLockoutTests: XCTestCase {
    var app: AppHarness!

    override func setUp() async throws { app = try await AppHarness() }
    override func tearDown() async throws { await app.stop() }

    func verify(_ email: String, _ code: String) async throws -> AppHarness.Response {
        try await app.request("POST", "/auth/v1/verify", json: ["email": email, "token": code, "type": "email"])
    }

    /// A new code for `email` (the resend interval aged away first), read from the mailer.
    func newCode(_ email: String) async throws -> String {
        try app.owner().query(
            "update otp_codes set created_at = created_at - interval '1 hour' where email = $1", email)
        let sent = app.sender.count(for: email)
        let otp = try await app.request("POST", "/auth/v1/otp", json: ["email": email])
        XCTAssertEqual(otp.status, 200, otp.text)
        return try await app.sender.code(for: email, after: sent)
    }

    func wrong(_ code: String) -> [String] {
        (0..<10).map { String(repeating: String($0), count: 6) }.filter { $0 != code }
    }

    func testTenWrongCodesAcrossCodesLockTheAddressEvenForTheRightCode() async throws {
        let email = "victim@example.com"
        _ = try await app.token(email)
        // Two codes, five wrong guesses each (each code dies after five, as before).
        var firstWrong: AppHarness.Response?
        for _ in 0..<2 {
            let code = try await newCode(email)
            for guess in wrong(code).prefix(5) {
                let response = try await verify(email, guess)
                XCTAssertEqual(response.status, 403)
                XCTAssertEqual(response.json["code"] as? String, "otp_expired")
                if firstWrong == nil { firstWrong = response }
            }
        }
        // A third code, the right one: refused exactly like a wrong one.
        let code = try await newCode(email)
        let locked = try await verify(email, code)
        XCTAssertEqual(locked.status, 403, locked.text)
        XCTAssertEqual(locked.body, firstWrong?.body)
        XCTAssertNil(locked.json["access_token"])
        let state = try app.owner().query(
            "select failures, locked_until > now() + interval '59 minutes', locked_until < now() + interval '61 minutes' from otp_codes where email = $1",
            email)[0]
        XCTAssertEqual(try state.decode(Int.self, column: 0), 10)
        XCTAssertTrue(try state.decode(Bool.self, column: 1))
        XCTAssertTrue(
            try state.decode(Bool.self, column: 2), "locked for an hour; requests while locked do not extend it")

        // The lock is logged once, with its end; neither the address nor a code appears.
        let tag = app.application.auth.addressTag(try XCTUnwrap(Email(email)))
        let lockLines = app.logs.lines.filter { $0.contains("sign-in locked") }
        XCTAssertEqual(lockLines.count, 1, "\(app.logs.lines)")
        let lockLine = try XCTUnwrap(lockLines.first)
        XCTAssertTrue(lockLine.contains("address=\(tag)"), lockLine)
        XCTAssertTrue(lockLine.contains("until=20"), lockLine)
        XCTAssertTrue(lockLine.contains("failures=10"), lockLine)
        let userID = try app.owner().query("select id from users where email = $1", email)[0].decode(
            UUID.self, column: 0)
        XCTAssertTrue(lockLine.contains("user_id=\(userID.uuidString.lowercased())"), lockLine)
        for line in app.logs.lines {
            XCTAssertFalse(line.contains(email), line)
            XCTAssertFalse(line.contains(code), line)
        }

        // When the lock has run out, the right code works and the end is logged.
        try app.owner().query("update otp_codes set locked_until = now() - interval '1 second' where email = $1", email)
        let after = try await verify(email, code)
        XCTAssertEqual(after.status, 200, after.text)
        XCTAssertTrue(app.logs.lines.contains { $0.contains("sign-in lock ended") && $0.contains("address=\(tag)") })
        let reset = try app.owner().query(
            "select failures, locked_until is null from otp_codes where email = $1", email)[0]
        XCTAssertEqual(try reset.decode(Int.self, column: 0), 0)
        XCTAssertTrue(try reset.decode(Bool.self, column: 1))
    }

    func testAnAddressWithoutAnAccountIsCountedAndLockedAlike() async throws {
        var answers: [String: [Int]] = [:]
        for email in ["member@example.com", "stranger@example.com"] {
            if email == "member@example.com" { _ = try await app.token(email) }
            try app.owner().query("update otp_codes set created_at = created_at - interval '1 hour'")
            let otp = try await app.request("POST", "/auth/v1/otp", json: ["email": email, "create_user": false])
            XCTAssertEqual(otp.status, 200)
            for _ in 0..<11 {
                // Keep the code live: only the count across codes is under test.
                try app.owner().query("update otp_codes set attempts = 0 where email = $1", email)
                answers[email, default: []].append(try await verify(email, "000000").status)
            }
            let locked = try app.owner().query("select locked_until > now() from otp_codes where email = $1", email)[0]
            XCTAssertTrue(try locked.decode(Bool.self, column: 0), email)
        }
        XCTAssertEqual(answers["member@example.com"], answers["stranger@example.com"])
        XCTAssertEqual(app.logs.lines.filter { $0.contains("sign-in locked") && $0.contains("user_id=none") }.count, 1)
    }

    func testFailuresOutsideTheWindowDoNotCount() async throws {
        let email = "slowpoke@example.com"
        let code = try await newCode(email)
        for guess in wrong(code).prefix(4) { _ = try await verify(email, guess) }
        let code2 = try await newCode(email)
        for guess in wrong(code2).prefix(5) { _ = try await verify(email, guess) }
        // Nine in the last hour; the window started over an hour ago, so the tenth starts a
        // new count instead of locking.
        try app.owner().query(
            "update otp_codes set failures_since = now() - interval '61 minutes' where email = $1", email)
        let code3 = try await newCode(email)
        _ = try await verify(email, wrong(code3)[0])
        let state = try app.owner().query(
            "select failures, locked_until is null from otp_codes where email = $1", email)[0]
        XCTAssertEqual(try state.decode(Int.self, column: 0), 1)
        XCTAssertTrue(try state.decode(Bool.self, column: 1))
        let good = try await verify(email, code3)
        XCTAssertEqual(good.status, 200, good.text)
    }

    func testTheLimitsAreSettings() async throws {
        await app.stop()
        app = try await AppHarness(environment: [
            "TRUNK_SYNC_OTP_FAILURE_LIMIT": "2/60", "TRUNK_SYNC_OTP_LOCKOUT": "120",
        ])
        let email = "strict@example.com"
        let code = try await newCode(email)
        for guess in wrong(code).prefix(2) { _ = try await verify(email, guess) }
        let locked = try await verify(email, code)
        XCTAssertEqual(locked.status, 403)
        let until = try app.owner().query(
            "select locked_until between now() + interval '110 seconds' and now() + interval '130 seconds' from otp_codes where email = $1",
            email)[0]
        XCTAssertTrue(try until.decode(Bool.self, column: 0))
        XCTAssertThrowsError(try Configuration.load(environment: ["TRUNK_SYNC_OTP_FAILURE_LIMIT": "ten"])) { error in
            XCTAssertTrue("\(error)".hasPrefix("TRUNK_SYNC_OTP_FAILURE_LIMIT must look like"), "\(error)")
        }
        XCTAssertThrowsError(try Configuration.load(environment: ["TRUNK_SYNC_OTP_LOCKOUT": "0"]))
    }
}
