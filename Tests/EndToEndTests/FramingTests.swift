import XCTest

/// Message framing and the parser's defences against smuggling and malformed input.
final class FramingTests: EndToEndTestCase {
    func testContentLengthWithTransferEncodingGets400AndClose() throws {
        let server = try startServer()
        let (response, client) = try server.exchange(
            request(
                "POST", "/healthz", headers: [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
                body: "0\r\n\r\n"))
        assertJSONError(response, status: 400, code: "content_length_with_transfer_encoding")
        assertClosesConnection(response, on: client)
    }

    func testDifferingContentLengthsGet400AndClose() throws {
        let server = try startServer()
        for headers in [[("Content-Length", "3"), ("Content-Length", "4")], [("Content-Length", "3, 4")]] {
            let (response, client) = try server.exchange(request("POST", "/healthz", headers: headers, body: "abcd"))
            assertJSONError(response, status: 400, code: "conflicting_content_length")
            assertClosesConnection(response, on: client)
        }
    }

    func testTransferCodingOtherThanChunkedGets501AndClose() throws {
        let server = try startServer()
        for coding in ["gzip", "gzip, chunked"] {
            let (response, client) = try server.exchange(
                request("POST", "/healthz", headers: [("Transfer-Encoding", coding)]))
            assertJSONError(response, status: 501, code: "unsupported_transfer_encoding")
            assertClosesConnection(response, on: client)
        }
    }

    func testMalformedRequestsGet400AndClose() throws {
        let server = try startServer()
        let cases: [(String, String, String)] = [
            ("invalid method character", "G(ET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "invalid_method"),
            ("control character in target", "GET /health\u{01}z HTTP/1.1\r\nHost: x\r\n\r\n", "invalid_target"),
            ("non-ASCII target", "GET /h\u{e9}althz HTTP/1.1\r\nHost: x\r\n\r\n", "invalid_target"),
            ("space in target", "GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", "invalid_version"),
            (
                "invalid header name character", "GET /healthz HTTP/1.1\r\nHost: x\r\nX@Y: 1\r\n\r\n",
                "invalid_header_name"
            ),
            (
                "whitespace before colon", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n",
                "whitespace_before_colon"
            ),
            (
                "obsolete line folding", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  2\r\n\r\n",
                "obsolete_line_folding"
            ),
            (
                "control character in value", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1\u{00}2\r\n\r\n",
                "invalid_header_value"
            ),
            ("bare LF", "GET /healthz HTTP/1.1\nHost: x\n\n", "bare_lf"),
            ("missing Host", "GET /healthz HTTP/1.1\r\n\r\n", "missing_host"),
            ("two Hosts", "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "duplicate_host"),
            (
                "negative Content-Length", "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                "invalid_content_length"
            ),
            (
                "bad chunk size", "POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "invalid_chunk_size"
            ),
        ]
        for (name, text, code) in cases {
            let (response, client) = try server.exchange(text)
            assertJSONError(response, status: 400, code: code)
            XCTAssertTrue(response.closesConnection, name)
            XCTAssertTrue(try client.waitForClose(), name)
        }
        let (version, _) = try server.exchange("GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n")
        assertJSONError(version, status: 505, code: "unsupported_version")
        assertServerHealthy(server)
    }

    func testChunkedBodyIsConsumedAndTheConnectionStaysUsable() throws {
        let server = try startServer()
        let client = try server.connect()
        // Sent in pieces, with a chunk extension and a trailer field.
        try client.send("POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhel")
        try client.send("lo\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
        let response = try client.readResponse()
        assertJSONError(response, status: 405, code: "method_not_allowed")
        XCTAssertFalse(response.closesConnection)
        // Had the body not been consumed, its bytes would be parsed as the next request.
        assertConnectionUsable(client)
    }

    func testContentLengthBodyIsConsumedAndTheConnectionStaysUsable() throws {
        let server = try startServer()
        let client = try server.connect()
        try client.send(request("POST", "/healthz", body: "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"))
        assertJSONError(try client.readResponse(), status: 405, code: "method_not_allowed")
        assertConnectionUsable(client)
    }

    func testPipelinedRequestsAreAnsweredInOrder() throws {
        let server = try startServer()
        let client = try server.connect()
        // The first one is answered by a handler on the task pool, the others on the loop:
        // they must still come back in request order.
        try client.send(
            request("GET", "/readyz", headers: [("X-Request-Id", "first")])
                + request("GET", "/nowhere", headers: [("X-Request-Id", "second")])
                + request("GET", "/healthz", headers: [("X-Request-Id", "third")]))
        let responses = try (0..<3).map { _ in try client.readResponse() }
        XCTAssertEqual(responses.map(\.status), [200, 404, 200])
        XCTAssertEqual(responses.map { $0.header("x-request-id") }, ["first", "second", "third"])
        XCTAssertEqual(responses[0].bodyText, #"{"status":"ready"}"#)
        XCTAssertTrue(responses.allSatisfy { !$0.closesConnection })
        assertConnectionUsable(client)
    }

    func testGarbageBytesGet400AndTheServerKeepsServing() throws {
        let server = try startServer()
        var generator = SplitMix64(seed: 0x7275_6e6b)
        for round in 0..<20 {
            let length = 16 + Int(generator.next() % 2000)
            var garbage = (0..<length).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
            // Start with a byte that cannot begin an (ignored) empty line, end with a line break.
            garbage[0] = 0xFF
            garbage += Array("\r\n\r\n".utf8)
            let client = try server.connect()
            try client.send(garbage)
            let response = try client.readResponse()
            assertJSONError(response, status: 400)
            XCTAssertTrue(response.closesConnection, "round \(round)")
            XCTAssertTrue(try client.waitForClose(), "round \(round)")
        }
        assertServerHealthy(server)
    }
}

/// A small deterministic random number generator (the garbage must be reproducible).
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D4_9BB5_8B13_3111
        return z ^ (z >> 31)
    }
}
