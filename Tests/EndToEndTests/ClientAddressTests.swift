import Foundation
import Postgres
import TestSupport
import XCTest

/// Who the client is: the peer, or behind a trusted reverse proxy the address it forwarded;
/// an IPv6 client counted by its /64; and sign-in limits per email address that hold
/// whichever client asks. Clients are told apart by connecting from different loopback
/// addresses (127.0.0.2, …), which Linux routes to the loopback interface.
final class ClientAddressTests: EndToEndTestCase {
    /// `POST /auth/v1/otp` for `email`, with an `X-Forwarded-For` when given.
    func otp(
        _ server: ServerProcess, _ email: String, createUser: Bool = true, forwardedFor: String? = nil,
        from source: String? = nil
    ) throws -> RawResponse {
        var headers = [("Content-Type", "application/json")]
        if let forwardedFor { headers.append(("X-Forwarded-For", forwardedFor)) }
        let body = #"{"email":"\#(email)","create_user":\#(createUser)}"#
        return try server.exchange(request("POST", "/auth/v1/otp", headers: headers, body: body), from: source).0
    }

    /// `POST /auth/v1/verify` for `email` with `code`.
    func verify(
        _ server: ServerProcess, _ email: String, code: String, forwardedFor: String? = nil, from source: String? = nil
    ) throws -> RawResponse {
        var headers = [("Content-Type", "application/json")]
        if let forwardedFor { headers.append(("X-Forwarded-For", forwardedFor)) }
        let body = #"{"email":"\#(email)","token":"\#(code)","type":"email"}"#
        return try server.exchange(request("POST", "/auth/v1/verify", headers: headers, body: body), from: source).0
    }

    /// A rate-limit refusal in the GoTrue shape.
    func assertRateLimited(
        _ response: RawResponse, code: String, file: StaticString = #filePath, line: UInt = #line
    ) {
        assertJSONError(response, status: 429, code: code, file: file, line: line)
        XCTAssertEqual(response.jsonObject?["error_code"] as? String, code, file: file, line: line)
        XCTAssertNotNil(response.jsonObject?["msg"], file: file, line: line)
        XCTAssertGreaterThan(Int(response.header("retry-after") ?? "") ?? 0, 0, file: file, line: line)
    }

    // MARK: - X-Forwarded-For

    func testBehindATrustedProxyEachForwardedClientHasItsOwnLimit() throws {
        let server = try startServer([
            "TRUNK_SYNC_TRUSTED_PROXIES": "127.0.0.1/32", "TRUNK_SYNC_RATE_LIMIT_OTP": "2/\(rateWindow())",
        ])
        XCTAssertEqual(try otp(server, "a1@example.com", forwardedFor: "203.0.113.5").status, 200)
        XCTAssertEqual(try otp(server, "a2@example.com", forwardedFor: "198.51.100.9, 203.0.113.5").status, 200)
        assertRateLimited(
            try otp(server, "a3@example.com", forwardedFor: "203.0.113.5"), code: "over_request_rate_limit")
        // Another client behind the same proxy is not locked out by the first one.
        let other = try otp(server, "a4@example.com", forwardedFor: "203.0.113.6")
        XCTAssertEqual(other.status, 200, other.bodyText)
        // A second proxy hop (also trusted) is looked through.
        let chained = try otp(server, "a5@example.com", forwardedFor: "203.0.113.7, 127.0.0.1")
        XCTAssertEqual(chained.status, 200, chained.bodyText)
    }

    func testForwardedForFromAnUntrustedPeerOrWithGarbageIsIgnored() throws {
        let server = try startServer([
            "TRUNK_SYNC_TRUSTED_PROXIES": "127.0.0.1/32", "TRUNK_SYNC_RATE_LIMIT_OTP": "2/\(rateWindow())",
        ])
        // 127.0.0.2 is no proxy of ours: what it claims does not matter, it is one client.
        for (index, claimed) in ["203.0.113.10", "203.0.113.11"].enumerated() {
            XCTAssertEqual(
                try otp(server, "u\(index)@example.com", forwardedFor: claimed, from: "127.0.0.2").status, 200)
        }
        assertRateLimited(
            try otp(server, "u9@example.com", forwardedFor: "203.0.113.12", from: "127.0.0.2"),
            code: "over_request_rate_limit")
        // From the trusted proxy, an entry that is not exactly an address means the proxy
        // itself is the client: garbage cannot pick a fresh bucket for every request.
        for (index, garbage) in ["203.0.113.20:4711", "unknown"].enumerated() {
            XCTAssertEqual(try otp(server, "g\(index)@example.com", forwardedFor: garbage).status, 200)
        }
        assertRateLimited(
            try otp(server, "g9@example.com", forwardedFor: "[2001:db8::1]"), code: "over_request_rate_limit")
        XCTAssertEqual(try otp(server, "g10@example.com", forwardedFor: "203.0.113.21").status, 200)
    }

    func testAnIPv6ClientIsLimitedPerSlash64() throws {
        let server = try startServer([
            "TRUNK_SYNC_TRUSTED_PROXIES": "127.0.0.1/32", "TRUNK_SYNC_RATE_LIMIT_OTP": "2/\(rateWindow())",
        ])
        XCTAssertEqual(try otp(server, "v1@example.com", forwardedFor: "2001:db8:1:2::1").status, 200)
        XCTAssertEqual(try otp(server, "v2@example.com", forwardedFor: "2001:db8:1:2:ffff:eeee:dddd:cccc").status, 200)
        // A third address of the same /64 is the same client.
        assertRateLimited(
            try otp(server, "v3@example.com", forwardedFor: "2001:DB8:1:2::abcd"), code: "over_request_rate_limit")
        // The next /64 is another one.
        XCTAssertEqual(try otp(server, "v4@example.com", forwardedFor: "2001:db8:1:3::1").status, 200)
    }

    func testSessionsAndTheAccessLogRecordTheForwardedClient() throws {
        let server = try startServer(["TRUNK_SYNC_TRUSTED_PROXIES": "127.0.0.0/8"])
        let email = "forwarded@example.com"
        XCTAssertEqual(try otp(server, email, forwardedFor: "203.0.113.77").status, 200)
        let codeLine = try XCTUnwrap(server.stderr.waitForLine(containing: "sign-in code for \(email)", timeout: 5))
        let code = String(try XCTUnwrap(codeLine.firstMatch(of: /: (\d{6})/)).output.1)
        let signedIn = try verify(server, email, code: code, forwardedFor: "2001:db8::77, 127.0.0.9", from: "127.0.0.3")
        XCTAssertEqual(signedIn.status, 200, signedIn.bodyText)

        let connection = try PostgresConnection.connect(server.database)
        let addresses = try connection.query("select ip from sessions").map { try $0.decode(String.self, column: 0) }
        XCTAssertEqual(addresses, ["2001:db8::77"])
        XCTAssertNotNil(
            server.stderr.waitForLine(containing: "client=203.0.113.77 duration_ms=", timeout: 5), server.logs)
        XCTAssertNotNil(server.stderr.waitForLine(containing: "client=2001:db8::77 duration_ms=", timeout: 5))
        // Without a forwarded address, the peer.
        _ = try server.exchange(request("GET", "/healthz"), from: "127.0.0.4")
        XCTAssertNotNil(server.stderr.waitForLine(containing: "client=127.0.0.4 duration_ms=", timeout: 5))
    }

    // MARK: - Per email address

    func testPerAddressLimitsHoldWhicheverClientAsksAndRevealNoAccount() throws {
        let server = try startServer([
            "TRUNK_SYNC_RATE_LIMIT_OTP_EMAIL": "3/\(rateWindow())",
            "TRUNK_SYNC_RATE_LIMIT_VERIFY_EMAIL": "3/\(rateWindow())",
            "TRUNK_SYNC_OTP_RESEND_INTERVAL": "0",
        ])
        let token = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", "known@example.com"], environment: server.environment)
        XCTAssertEqual(token.status, 0, token.stderr)

        var answers: [String: [String]] = [:]
        for email in ["known@example.com", "nobody@example.com"] {
            var seen: [String] = []
            // Three clients ask for a code: allowed. A fourth client is refused all the same.
            for client in 2...4 {
                let response = try otp(server, email, createUser: false, from: "127.0.0.\(client)")
                XCTAssertEqual(response.status, 200, "\(email) from client \(client): \(response.bodyText)")
                seen.append("\(response.status) \(response.bodyText)")
            }
            let refused = try otp(server, email, createUser: false, from: "127.0.0.5")
            assertRateLimited(refused, code: "over_email_send_rate_limit")
            seen.append("\(refused.status) \(refused.jsonObject?["code"] ?? "")")
            // Guesses at the code, each from another client: the fourth is refused before
            // the code is even looked at.
            for client in 6...8 {
                let response = try verify(server, email, code: "000000", from: "127.0.0.\(client)")
                assertJSONError(response, status: 403, code: "otp_expired")
                seen.append("\(response.status) \(response.bodyText)")
            }
            let locked = try verify(server, email, code: "000000", from: "127.0.0.9")
            assertRateLimited(locked, code: "over_request_rate_limit")
            seen.append("\(locked.status) \(locked.jsonObject?["code"] ?? "")")
            answers[email] = seen
        }
        XCTAssertEqual(answers["known@example.com"], answers["nobody@example.com"], "an account shows")
        // The address is the key: the same clients may still ask for another address.
        XCTAssertEqual(try otp(server, "other@example.com", from: "127.0.0.5").status, 200)

        let metrics = try server.metrics()
        XCTAssertEqual(metrics["trunk_sync_rate_limited_total{limit=\"otp_email\"}"], 2)
        XCTAssertEqual(metrics["trunk_sync_rate_limited_total{limit=\"verify_email\"}"], 2)
    }
}
