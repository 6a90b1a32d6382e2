import Foundation
import XCTest

/// What every response carries, routing answers (`HEAD`, `OPTIONS`, 404, 405) and CORS.
final class ResponseTests: EndToEndTestCase {
    func testHeadHasContentLengthButNoBody() throws {
        let server = try startServer()
        let client = try server.connect()
        // HEAD then GET in one write: were a body sent after the HEAD answer, the GET answer
        // would not parse.
        try client.send(request("HEAD", "/healthz") + request("GET", "/healthz"))
        let head = try client.readResponse(bodyExpected: false)
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(head.header("content-length"), "15")
        let get = try client.readResponse()
        XCTAssertEqual(get.status, 200)
        XCTAssertEqual(get.bodyText, #"{"status":"ok"}"#)
        XCTAssertTrue(try client.staysSilent(for: 0.1))
    }

    func testOptionsAnd405CarryAllow() throws {
        let server = try startServer()
        let (options, _) = try server.exchange(request("OPTIONS", "/healthz"))
        XCTAssertEqual(options.status, 204)
        XCTAssertEqual(allowSet(options), ["GET", "HEAD", "OPTIONS"])
        XCTAssertNil(options.header("content-length"), "204 has no Content-Length")

        let (asterisk, _) = try server.exchange(request("OPTIONS", "*"))
        XCTAssertEqual(asterisk.status, 204)
        XCTAssertNotNil(asterisk.header("allow"))

        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            let (response, client) = try server.exchange(request(method, "/healthz", body: "{}"))
            assertJSONError(response, status: 405, code: "method_not_allowed")
            XCTAssertEqual(allowSet(response), ["GET", "HEAD", "OPTIONS"], method)
            XCTAssertFalse(response.closesConnection)
            assertConnectionUsable(client)
        }
    }

    func testUnknownPathGets404JSON() throws {
        let server = try startServer()
        // `/` answers a pointer to the documentation (OpenAPITests).
        for target in ["/nowhere", "/healthz/extra", "/index.html", "/auth/v1/unknown?x=1", "http://localhost/nope"] {
            let (response, client) = try server.exchange(request("GET", target))
            assertJSONError(response, status: 404, code: "not_found")
            XCTAssertFalse(response.closesConnection, target)
            assertConnectionUsable(client)
        }
        let (head, _) = try server.exchange(request("HEAD", "/nowhere"), bodyExpected: false)
        XCTAssertEqual(head.status, 404)
        let (options, _) = try server.exchange(request("OPTIONS", "/nowhere"))
        assertJSONError(options, status: 404, code: "not_found")
    }

    func testRequestIDIsEchoedWhenSaneAndGeneratedOtherwise() throws {
        let server = try startServer()
        let sane = "req-123_abc.DEF:9"
        let (echoed, _) = try server.exchange(request("GET", "/healthz", headers: [("X-Request-Id", sane)]))
        XCTAssertEqual(echoed.header("x-request-id"), sane)
        let (echoedOn404, _) = try server.exchange(request("GET", "/nope", headers: [("X-Request-Id", sane)]))
        XCTAssertEqual(echoedOn404.header("x-request-id"), sane)

        var generated: Set<String> = []
        for value in [nil, "has space", "quote\"d", "<script>", String(repeating: "x", count: 129), ""] {
            let headers = value.map { [("X-Request-Id", $0)] } ?? []
            let (response, _) = try server.exchange(request("GET", "/healthz", headers: headers))
            let id = try XCTUnwrap(response.header("x-request-id"), "\(value ?? "none")")
            XCTAssertNotEqual(id, value)
            XCTAssertTrue(id.allSatisfy { $0.isLetter || $0.isNumber || "-_.:".contains($0) }, id)
            XCTAssertFalse(id.isEmpty)
            generated.insert(id)
        }
        XCTAssertEqual(generated.count, 6, "generated ids are unique")

        // Rejected requests get an id too.
        let (rejected, _) = try server.exchange("BAD\r\n\r\n")
        XCTAssertEqual(rejected.status, 400)
        XCTAssertFalse((rejected.header("x-request-id") ?? "").isEmpty)
    }

    func testDateAndServerHeadersOnEveryResponse() throws {
        let server = try startServer()
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        let requests = [
            request("GET", "/healthz"), request("GET", "/nope"), request("POST", "/healthz", body: "x"),
            request("OPTIONS", "/healthz"), "GARBAGE\r\n\r\n",
        ]
        for text in requests {
            let (response, _) = try server.exchange(text)
            XCTAssertEqual(response.header("server"), "trunk-sync")
            let date = try XCTUnwrap(response.header("date"))
            let parsed = try XCTUnwrap(formatter.date(from: date), "Date \(date) is not an IMF-fixdate")
            XCTAssertLessThan(abs(parsed.timeIntervalSinceNow), 5)
        }
    }

    func testCORSAnswersOnlyTheConfiguredOrigin() throws {
        let server = try startServer(["TRUNK_SYNC_CORS_ORIGINS": "https://app.example"])
        func preflight(origin: String) throws -> RawResponse {
            try server.exchange(
                request(
                    "OPTIONS", "/healthz",
                    headers: [
                        ("Origin", origin), ("Access-Control-Request-Method", "GET"),
                        ("Access-Control-Request-Headers", "authorization, content-type"),
                    ])
            ).0
        }
        let allowed = try preflight(origin: "https://app.example")
        XCTAssertTrue([200, 204].contains(allowed.status))
        XCTAssertEqual(allowed.header("access-control-allow-origin"), "https://app.example")
        XCTAssertTrue(allowed.header("access-control-allow-methods")?.contains("GET") ?? false)
        let allowedHeaders = allowed.header("access-control-allow-headers")?.lowercased() ?? ""
        XCTAssertTrue(
            allowedHeaders.contains("authorization") && allowedHeaders.contains("content-type"), allowedHeaders)

        let foreign = try preflight(origin: "https://evil.example")
        for name in ["access-control-allow-origin", "access-control-allow-methods", "access-control-allow-headers"] {
            XCTAssertNil(foreign.header(name), name)
        }

        let (simple, _) = try server.exchange(request("GET", "/healthz", headers: [("Origin", "https://app.example")]))
        XCTAssertEqual(simple.header("access-control-allow-origin"), "https://app.example")
        XCTAssertTrue(simple.headerValues("vary").contains { $0.lowercased().contains("origin") })
        let (simpleForeign, _) = try server.exchange(
            request("GET", "/healthz", headers: [("Origin", "https://evil.example")]))
        XCTAssertNil(simpleForeign.header("access-control-allow-origin"))
        let (errorResponse, _) = try server.exchange(
            request("GET", "/nope", headers: [("Origin", "https://app.example")]))
        XCTAssertEqual(errorResponse.header("access-control-allow-origin"), "https://app.example")
    }

    func testNoCORSHeadersWithoutConfiguredOrigins() throws {
        let server = try startServer()
        let (response, _) = try server.exchange(
            request(
                "OPTIONS", "/healthz",
                headers: [("Origin", "https://app.example"), ("Access-Control-Request-Method", "GET")]))
        XCTAssertNil(response.header("access-control-allow-origin"))
    }

    private func allowSet(_ response: RawResponse) -> Set<String> {
        Set((response.header("allow") ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
    }
}
