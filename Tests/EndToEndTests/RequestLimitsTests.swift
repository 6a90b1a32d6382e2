import XCTest

/// Size limits on the request line, header section and body, and `Expect: 100-continue`.
final class RequestLimitsTests: EndToEndTestCase {
    func testRequestLineLongerThan8KiBGets414AndClose() throws {
        let server = try startServer()
        let (response, client) = try server.exchange(request("GET", "/" + String(repeating: "a", count: 9000)))
        assertJSONError(response, status: 414, code: "request_line_too_long")
        assertClosesConnection(response, on: client)

        // A request line of exactly 8 KiB is still parsed (and then not found).
        let path = "/" + String(repeating: "b", count: 8192 - "GET / HTTP/1.1".count)
        let (atLimit, _) = try server.exchange(request("GET", path))
        assertJSONError(atLimit, status: 404, code: "not_found")
    }

    func testHeaderSectionLargerThan32KiBGets431AndClose() throws {
        let server = try startServer()
        let large = (0..<40).map { ("X-Filler-\($0)", String(repeating: "v", count: 1000)) }
        let (response, client) = try server.exchange(request("GET", "/healthz", headers: large))
        assertJSONError(response, status: 431, code: "header_too_large")
        assertClosesConnection(response, on: client)

        let fits = (0..<30).map { ("X-Filler-\($0)", String(repeating: "v", count: 1000)) }
        let (accepted, _) = try server.exchange(request("GET", "/healthz", headers: fits))
        XCTAssertEqual(accepted.status, 200)
    }

    func testMoreThan100HeaderFieldsGets431AndClose() throws {
        let server = try startServer()
        // Host is one of the fields: 100 more make 101.
        let many = (0..<100).map { ("X-Field-\($0)", "1") }
        let (response, client) = try server.exchange(request("GET", "/healthz", headers: many))
        assertJSONError(response, status: 431, code: "too_many_headers")
        assertClosesConnection(response, on: client)

        let (accepted, _) = try server.exchange(request("GET", "/healthz", headers: Array(many.prefix(99))))
        XCTAssertEqual(accepted.status, 200)
    }

    func testContentLengthOver10MiBGets413BeforeTheBodyIsSent() throws {
        let server = try startServer()
        for expectContinue in [false, true] {
            let client = try server.connect()
            var headers = [("Content-Length", "10485761"), ("Content-Type", "application/json")]
            if expectContinue { headers.append(("Expect", "100-continue")) }
            // Only the head goes out: the answer must come without a single body byte.
            try client.send(request("POST", "/healthz", headers: headers))
            let response = try client.readResponse()
            assertJSONError(response, status: 413, code: "body_too_large")
            assertClosesConnection(response, on: client)
        }
        // Exactly 10 MiB is within the limit: the head is accepted (100 Continue), not refused.
        let client = try server.connect()
        try client.send(
            request("POST", "/healthz", headers: [("Content-Length", "10485760"), ("Expect", "100-continue")]))
        XCTAssertEqual(try client.readResponse().status, 100)
    }

    func testExpectContinueGetsContinueThenTheFinalAnswer() throws {
        let server = try startServer()
        let client = try server.connect()
        try client.send(
            request("POST", "/healthz", headers: [("Content-Length", "11"), ("Expect", "100-continue")]))
        let interim = try client.readResponse()
        XCTAssertEqual(interim.status, 100)
        XCTAssertTrue(interim.headers.isEmpty)
        XCTAssertTrue(try client.staysSilent(for: 0.2), "the final answer must wait for the body")

        try client.send(#"{"a":"bcd"}"#)
        let final = try client.readResponse()
        assertJSONError(final, status: 405, code: "method_not_allowed")
        XCTAssertFalse(final.closesConnection)
        assertConnectionUsable(client)
    }
}
