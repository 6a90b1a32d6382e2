import HTTPServer
import XCTest

// MARK: - Harness

/// One request as the tests see it, whatever the body mode.
private struct ParsedRequest: Equatable {
    var head: HTTPRequestHead
    var body: [UInt8]
}

/// Everything the parser reported for an input, normalised so that outcomes can be
/// compared across body modes and chunkings.
private struct Outcome: Equatable {
    var requests: [ParsedRequest] = []
    var error: HTTPParserError?
    /// A head reported whose request did not complete.
    var pendingHead: HTTPRequestHead?
    var closed = false
    var violations: [String] = []
}

private enum Feeding: CustomStringConvertible {
    case whole
    case split(at: Int)
    case byteByByte

    var description: String {
        switch self {
        case .whole: "whole"
        case .split(let at): "split at \(at)"
        case .byteByByte: "byte by byte"
        }
    }

    func chunks(_ input: [UInt8]) -> [ArraySlice<UInt8>] {
        switch self {
        case .whole: [input[...]]
        case .split(let at): [input[..<at], input[at...]]
        case .byteByByte: input.indices.map { input[$0...$0] }
        }
    }
}

private func parse(
    _ input: [UInt8], limits: HTTPParserLimits = .default, mode: HTTPRequestParser.BodyMode = .collect,
    feeding: Feeding = .whole
) -> Outcome {
    var parser = HTTPRequestParser(limits: limits, bodyMode: mode)
    var outcome = Outcome()
    var pendingBody: [UInt8] = []
    for chunk in feeding.chunks(input) {
        parser.feed(chunk)
        while let event = parser.next() {
            if outcome.error != nil { outcome.violations.append("event after error: \(event)") }
            switch event {
            case .head(let head):
                if outcome.pendingHead != nil { outcome.violations.append("head before previous request ended") }
                outcome.pendingHead = head
                pendingBody = []
            case .body(let bytes):
                if mode != .stream || outcome.pendingHead == nil { outcome.violations.append("unexpected body") }
                if bytes.isEmpty { outcome.violations.append("empty body event") }
                pendingBody += bytes
            case .end:
                guard mode == .stream, let head = outcome.pendingHead else {
                    outcome.violations.append("unexpected end")
                    continue
                }
                outcome.requests.append(ParsedRequest(head: head, body: pendingBody))
                outcome.pendingHead = nil
            case .request(let head, let body):
                if mode != .collect || outcome.pendingHead != head { outcome.violations.append("unexpected request") }
                outcome.requests.append(ParsedRequest(head: head, body: body))
                outcome.pendingHead = nil
            case .error(let error):
                outcome.error = error
                if parser.error != error || !parser.isClosed { outcome.violations.append("error state not kept") }
            }
        }
    }
    outcome.closed = parser.isClosed
    return outcome
}

private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// What a test expects of one parsed request; `nil` fields are not checked.
private struct Expected {
    var method: HTTPMethod = .get
    var target: String?
    var path = "/"
    var query: String?
    var version: HTTPVersion = .http11
    var keepAlive = true
    var expectsContinue = false
    var framing: HTTPRequestHead.BodyFraming?
    var headers: [(String, String)]?
    var body = ""

    func check(_ request: ParsedRequest, _ name: String, file: StaticString = #filePath, line: UInt = #line) {
        let head = request.head
        XCTAssertEqual(head.method, method, name, file: file, line: line)
        if let target { XCTAssertEqual(head.target, target, name, file: file, line: line) }
        XCTAssertEqual(head.path, path, name, file: file, line: line)
        XCTAssertEqual(head.query, query, name, file: file, line: line)
        XCTAssertEqual(head.version, version, name, file: file, line: line)
        XCTAssertEqual(head.keepAlive, keepAlive, "\(name): keepAlive", file: file, line: line)
        XCTAssertEqual(head.expectsContinue, expectsContinue, "\(name): expectsContinue", file: file, line: line)
        if let framing { XCTAssertEqual(head.bodyFraming, framing, name, file: file, line: line) }
        if let headers {
            XCTAssertEqual(head.headers.map(\.name), headers.map(\.0), name, file: file, line: line)
            XCTAssertEqual(head.headers.map(\.value), headers.map(\.1), name, file: file, line: line)
        }
        XCTAssertEqual(String(decoding: request.body, as: UTF8.self), body, "\(name): body", file: file, line: line)
    }
}

/// Small limits so that boundary cases stay short enough to split at every byte.
private let tinyLimits = HTTPParserLimits(
    maxRequestLineLength: 32, maxHeaderSectionSize: 64, maxHeaderCount: 3, maxBodySize: 16,
    maxChunkHeaderLength: 8)

// MARK: - Sample tables

private struct ValidCase {
    var name: String
    var input: String
    var limits: HTTPParserLimits = .default
    var expected: [Expected]
    var closedAfter = false
}

private let validCases: [ValidCase] = [
    ValidCase(
        name: "simple GET", input: "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
        expected: [Expected(target: "/", framing: .empty, headers: [("Host", "example.com")])]),
    ValidCase(
        name: "query and header order, case and OWS",
        input:
            "GET /a/b%20c?x=1&y=%2F HTTP/1.1\r\nhost: h\r\nX-A:  one \t\r\nx-a:two\r\nX-Empty:\r\nX-Tab:\tin\tside\t\r\n\r\n",
        expected: [
            Expected(
                target: "/a/b%20c?x=1&y=%2F", path: "/a/b%20c", query: "x=1&y=%2F",
                headers: [("host", "h"), ("X-A", "one"), ("x-a", "two"), ("X-Empty", ""), ("X-Tab", "in\tside")])
        ]),
    ValidCase(
        name: "empty query", input: "GET /a? HTTP/1.1\r\nHost: h\r\n\r\n",
        expected: [Expected(path: "/a", query: "")]),
    ValidCase(
        name: "POST with Content-Length",
        input: "POST /events HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world",
        expected: [Expected(method: .post, path: "/events", framing: .contentLength(11), body: "hello world")]),
    ValidCase(
        name: "Content-Length 0", input: "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
        expected: [Expected(method: .post, framing: .contentLength(0))]),
    ValidCase(
        name: "identical Content-Length duplicates",
        input: "PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\nContent-Length: 3\r\n\r\nabc",
        expected: [Expected(method: .put, framing: .contentLength(3), body: "abc")]),
    ValidCase(
        name: "Content-Length with leading zeros",
        input: "PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 003\r\n\r\nabc",
        expected: [Expected(method: .put, framing: .contentLength(3), body: "abc")]),
    ValidCase(
        name: "chunked with extensions and trailers",
        input:
            "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            + "5;name=value\r\nhello\r\n"
            + "6 ; a=\"quoted;\" ;b\r\n world\r\n"
            + "A\r\n0123456789\r\n"
            + "0;last\r\nX-Trailer: t\r\nChecksum: abc\r\n\r\n",
        expected: [Expected(method: .post, path: "/c", framing: .chunked, body: "hello world0123456789")]),
    ValidCase(
        name: "chunked, case-insensitive coding and hex",
        input:
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: CHUNKED\r\n\r\n1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n",
        expected: [Expected(method: .post, framing: .chunked, body: "abcdefghijklmnopqrstuvwxyz")]),
    ValidCase(
        name: "chunked with empty body",
        input: "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        expected: [Expected(method: .post, framing: .chunked)]),
    ValidCase(
        name: "HEAD", input: "HEAD /healthz HTTP/1.1\r\nHost: h\r\n\r\n",
        expected: [Expected(method: .head, path: "/healthz")]),
    ValidCase(
        name: "OPTIONS *", input: "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
        expected: [Expected(method: .options, target: "*", path: "*")]),
    ValidCase(
        name: "OPTIONS path", input: "OPTIONS /auth/v1/otp HTTP/1.1\r\nHost: h\r\nOrigin: https://app\r\n\r\n",
        expected: [Expected(method: .options, path: "/auth/v1/otp")]),
    ValidCase(
        name: "absolute-form", input: "GET http://example.com:8080/a/b?c=d HTTP/1.1\r\nHost: example.com\r\n\r\n",
        expected: [Expected(target: "http://example.com:8080/a/b?c=d", path: "/a/b", query: "c=d")]),
    ValidCase(
        name: "absolute-form without path", input: "GET HTTPS://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n",
        expected: [Expected(path: "/")]),
    ValidCase(
        name: "absolute-form with query only", input: "GET http://example.com?q HTTP/1.1\r\nHost: example.com\r\n\r\n",
        expected: [Expected(path: "/", query: "q")]),
    ValidCase(
        name: "extension method", input: "PROPFIND /x HTTP/1.1\r\nHost: h\r\n\r\n",
        expected: [Expected(method: HTTPMethod(rawValue: "PROPFIND"), path: "/x")]),
    ValidCase(
        name: "HTTP/1.0 without Host closes", input: "GET / HTTP/1.0\r\n\r\n",
        expected: [Expected(version: .http10, keepAlive: false)], closedAfter: true),
    ValidCase(
        name: "HTTP/1.0 keep-alive", input: "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
        expected: [Expected(version: .http10, keepAlive: true)]),
    ValidCase(
        name: "HTTP/1.1 Connection: close", input: "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        expected: [Expected(keepAlive: false)], closedAfter: true),
    ValidCase(
        name: "bytes after Connection: close are dropped",
        input: "GET /1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\n\r\n",
        expected: [Expected(path: "/1", keepAlive: false)], closedAfter: true),
    ValidCase(
        name: "Expect: 100-continue",
        input: "POST /e HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\nok",
        expected: [Expected(method: .post, path: "/e", expectsContinue: true, body: "ok")]),
    ValidCase(
        name: "leading empty lines ignored", input: "\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
        expected: [Expected()]),
    ValidCase(
        name: "obs-text in a value is kept",
        input: "GET / HTTP/1.1\r\nHost: h\r\nX-Name: caf\u{E9}\r\n\r\n",
        expected: [Expected(headers: [("Host", "h"), ("X-Name", "caf\u{E9}")])]),
    ValidCase(
        name: "three pipelined requests",
        input:
            "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n"
            + "POST /2 HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nbody"
            + "POST /3 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        expected: [
            Expected(path: "/1"), Expected(method: .post, path: "/2", body: "body"),
            Expected(method: .post, path: "/3", body: "abc"),
        ]),
    // Exactly at the (tiny) limits.
    ValidCase(
        name: "tiny: request line at limit",
        input: "GET /\(String(repeating: "a", count: 18)) HTTP/1.1\r\nHost: h\r\n\r\n",
        limits: tinyLimits, expected: [Expected(path: "/" + String(repeating: "a", count: 18))]),
    ValidCase(
        name: "tiny: header section at limit",
        input: "GET / HTTP/1.1\r\nHost: h\r\nX: \(String(repeating: "v", count: 48))\r\n\r\n",
        limits: tinyLimits, expected: [Expected()]),
    ValidCase(
        name: "tiny: header count at limit", input: "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\n\r\n",
        limits: tinyLimits, expected: [Expected()]),
    ValidCase(
        name: "tiny: body at limit",
        input: "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 16\r\n\r\n0123456789abcdef",
        limits: tinyLimits, expected: [Expected(method: .post, body: "0123456789abcdef")]),
    ValidCase(
        name: "tiny: chunked body at limit",
        input:
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n8\r\n89abcdef\r\n0\r\n\r\n",
        limits: tinyLimits, expected: [Expected(method: .post, body: "0123456789abcdef")]),
    ValidCase(
        name: "tiny: chunk header at limit",
        input: "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1;abcdef\r\nx\r\n0\r\n\r\n",
        limits: tinyLimits, expected: [Expected(method: .post, body: "x")]),
]

private struct RejectedCase {
    var name: String
    var input: String
    var limits: HTTPParserLimits = .default
    var error: HTTPParserError
    var requestsBefore = 0
    /// Whether the error is found in the body, after the request's head was reported.
    var afterHead = false
}

private let host = "Host: h\r\n"

private let rejectedCases: [RejectedCase] = [
    // Request smuggling defences.
    RejectedCase(
        name: "Content-Length with Transfer-Encoding",
        input: "POST / HTTP/1.1\r\n\(host)Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        error: .contentLengthWithTransferEncoding),
    RejectedCase(
        name: "Transfer-Encoding with Content-Length",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        error: .contentLengthWithTransferEncoding),
    RejectedCase(
        name: "differing Content-Length fields",
        input: "POST / HTTP/1.1\r\n\(host)Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        error: .conflictingContentLength),
    RejectedCase(
        name: "differing Content-Length list", input: "POST / HTTP/1.1\r\n\(host)Content-Length: 5, 6\r\n\r\nhello!",
        error: .conflictingContentLength),
    RejectedCase(
        name: "negative Content-Length", input: "POST / HTTP/1.1\r\n\(host)Content-Length: -1\r\n\r\n",
        error: .invalidContentLength),
    RejectedCase(
        name: "plus sign Content-Length", input: "POST / HTTP/1.1\r\n\(host)Content-Length: +1\r\n\r\nx",
        error: .invalidContentLength),
    RejectedCase(
        name: "non-numeric Content-Length", input: "POST / HTTP/1.1\r\n\(host)Content-Length: abc\r\n\r\n",
        error: .invalidContentLength),
    RejectedCase(
        name: "hex Content-Length", input: "POST / HTTP/1.1\r\n\(host)Content-Length: 0x10\r\n\r\n",
        error: .invalidContentLength),
    RejectedCase(
        name: "empty Content-Length", input: "POST / HTTP/1.1\r\n\(host)Content-Length: \r\n\r\n",
        error: .invalidContentLength),
    RejectedCase(
        name: "Content-Length with inner space", input: "POST / HTTP/1.1\r\n\(host)Content-Length: 1 2\r\n\r\n",
        error: .invalidContentLength),
    RejectedCase(
        name: "Content-Length empty list element", input: "POST / HTTP/1.1\r\n\(host)Content-Length: 1,,1\r\n\r\n",
        error: .invalidContentLength),
    RejectedCase(
        name: "overflowing Content-Length",
        input: "POST / HTTP/1.1\r\n\(host)Content-Length: 99999999999999999999\r\n\r\n",
        error: .invalidContentLength),
    RejectedCase(
        name: "Transfer-Encoding gzip", input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: gzip\r\n\r\n",
        error: .unsupportedTransferEncoding),
    RejectedCase(
        name: "Transfer-Encoding gzip, chunked",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        error: .unsupportedTransferEncoding),
    RejectedCase(
        name: "Transfer-Encoding chunked then identity field",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n",
        error: .unsupportedTransferEncoding),
    RejectedCase(
        name: "Transfer-Encoding with parameter",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n",
        error: .unsupportedTransferEncoding),
    RejectedCase(
        name: "Transfer-Encoding chunked twice",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        error: .invalidTransferEncoding),
    RejectedCase(
        name: "Transfer-Encoding empty", input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: \r\n\r\n",
        error: .invalidTransferEncoding),
    RejectedCase(
        name: "Transfer-Encoding in HTTP/1.0",
        input: "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", error: .invalidTransferEncoding),
    RejectedCase(
        name: "bare LF after request line", input: "GET / HTTP/1.1\n\(host)\r\n", error: .bareLineFeed),
    RejectedCase(name: "bare LF after a field", input: "GET / HTTP/1.1\r\nHost: h\n\r\n", error: .bareLineFeed),
    RejectedCase(name: "bare LF ending the head", input: "GET / HTTP/1.1\r\n\(host)\n", error: .bareLineFeed),
    RejectedCase(name: "bare LF before the request", input: "\nGET / HTTP/1.1\r\n\(host)\r\n", error: .bareLineFeed),
    RejectedCase(
        name: "bare CR in a value", input: "GET / HTTP/1.1\r\n\(host)X: a\rb\r\n\r\n", error: .invalidHeaderValue),
    RejectedCase(
        name: "obsolete line folding",
        input: "GET / HTTP/1.1\r\n\(host)X-Long: a\r\n  continued\r\n\r\n", error: .obsoleteLineFolding),
    RejectedCase(
        name: "whitespace before the first field", input: "GET / HTTP/1.1\r\n \(host)\r\n",
        error: .obsoleteLineFolding),
    RejectedCase(
        name: "tab folding", input: "GET / HTTP/1.1\r\n\(host)X: a\r\n\tb\r\n\r\n", error: .obsoleteLineFolding),
    RejectedCase(
        name: "space before colon", input: "GET / HTTP/1.1\r\nHost : h\r\n\r\n", error: .whitespaceBeforeColon),
    RejectedCase(
        name: "tab before colon",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding\t: chunked\r\n\r\n", error: .whitespaceBeforeColon),
    RejectedCase(
        name: "header line without colon", input: "GET / HTTP/1.1\r\n\(host)NoColon\r\n\r\n",
        error: .invalidHeaderLine),
    RejectedCase(
        name: "header line with space, no colon", input: "GET / HTTP/1.1\r\n\(host)No Colon\r\n\r\n",
        error: .invalidHeaderLine),
    RejectedCase(name: "empty field name", input: "GET / HTTP/1.1\r\n\(host): v\r\n\r\n", error: .invalidHeaderName),
    RejectedCase(
        name: "separator in field name", input: "GET / HTTP/1.1\r\n\(host)X(y): v\r\n\r\n", error: .invalidHeaderName),
    RejectedCase(
        name: "non-ASCII field name", input: "GET / HTTP/1.1\r\n\(host)X-\u{E9}: v\r\n\r\n", error: .invalidHeaderName),
    RejectedCase(
        name: "control character in value", input: "GET / HTTP/1.1\r\n\(host)X: a\u{01}b\r\n\r\n",
        error: .invalidHeaderValue),
    RejectedCase(
        name: "DEL in value", input: "GET / HTTP/1.1\r\n\(host)X: a\u{7F}\r\n\r\n", error: .invalidHeaderValue),
    RejectedCase(
        name: "NUL in value", input: "GET / HTTP/1.1\r\n\(host)X: a\u{0}\r\n\r\n", error: .invalidHeaderValue),
    RejectedCase(name: "missing Host", input: "GET / HTTP/1.1\r\n\r\n", error: .missingHost),
    RejectedCase(
        name: "duplicate Host", input: "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", error: .duplicateHost),
    // Request line.
    RejectedCase(name: "separator in method", input: "G(T / HTTP/1.1\r\n\(host)\r\n", error: .invalidMethod),
    RejectedCase(name: "non-ASCII method", input: "G\u{C9}T / HTTP/1.1\r\n\(host)\r\n", error: .invalidMethod),
    RejectedCase(name: "empty method", input: " / HTTP/1.1\r\n\(host)\r\n", error: .invalidRequestLine),
    RejectedCase(name: "double space", input: "GET  / HTTP/1.1\r\n\(host)\r\n", error: .invalidRequestLine),
    RejectedCase(name: "no version", input: "GET /\r\n\(host)\r\n", error: .invalidRequestLine),
    RejectedCase(name: "method only", input: "GET\r\n\(host)\r\n", error: .invalidRequestLine),
    RejectedCase(name: "trailing space", input: "GET / HTTP/1.1 \r\n\(host)\r\n", error: .invalidVersion),
    RejectedCase(name: "lowercase version", input: "GET / http/1.1\r\n\(host)\r\n", error: .invalidVersion),
    RejectedCase(name: "malformed version", input: "GET / HTTP/1.x\r\n\(host)\r\n", error: .invalidVersion),
    RejectedCase(name: "HTTP/2.0", input: "GET / HTTP/2.0\r\n\(host)\r\n", error: .unsupportedVersion),
    RejectedCase(name: "HTTP/1.2", input: "GET / HTTP/1.2\r\n\(host)\r\n", error: .unsupportedVersion),
    RejectedCase(name: "HTTP/0.9", input: "GET / HTTP/0.9\r\n\(host)\r\n", error: .unsupportedVersion),
    RejectedCase(name: "relative target", input: "GET foo HTTP/1.1\r\n\(host)\r\n", error: .invalidTarget),
    RejectedCase(name: "asterisk with GET", input: "GET * HTTP/1.1\r\n\(host)\r\n", error: .invalidTarget),
    RejectedCase(
        name: "authority-form", input: "CONNECT example.com:443 HTTP/1.1\r\n\(host)\r\n", error: .invalidTarget),
    RejectedCase(
        name: "absolute-form without authority", input: "GET http:///a HTTP/1.1\r\n\(host)\r\n",
        error: .invalidTarget),
    RejectedCase(name: "other scheme", input: "GET ftp://h/a HTTP/1.1\r\n\(host)\r\n", error: .invalidTarget),
    RejectedCase(
        name: "control character in target", input: "GET /a\u{01} HTTP/1.1\r\n\(host)\r\n", error: .invalidTarget),
    RejectedCase(name: "DEL in target", input: "GET /a\u{7F} HTTP/1.1\r\n\(host)\r\n", error: .invalidTarget),
    RejectedCase(name: "tab in target", input: "GET /a\tb HTTP/1.1\r\n\(host)\r\n", error: .invalidTarget),
    RejectedCase(name: "non-ASCII target", input: "GET /caf\u{E9} HTTP/1.1\r\n\(host)\r\n", error: .invalidTarget),
    RejectedCase(
        name: "TLS handshake bytes", input: "\u{16}\u{03}\u{01}\u{02}\u{00}\u{01}\r\n", error: .invalidRequestLine),
    // Chunked framing.
    RejectedCase(
        name: "non-hex chunk size",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\nzz\r\n", error: .invalidChunkSize,
        afterHead: true),
    RejectedCase(
        name: "empty chunk size", input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n\r\n",
        error: .invalidChunkSize, afterHead: true),
    RejectedCase(
        name: "negative chunk size", input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n-1\r\n",
        error: .invalidChunkSize, afterHead: true),
    RejectedCase(
        name: "chunk size 0x prefix", input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n0x5\r\n",
        error: .invalidChunkSize, afterHead: true),
    RejectedCase(
        name: "overflowing chunk size",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
        error: .invalidChunkSize, afterHead: true),
    RejectedCase(
        name: "whitespace after chunk size without extension",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
        error: .invalidChunkSize, afterHead: true),
    RejectedCase(
        name: "control character in chunk extension",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n5;a\u{01}\r\nhello\r\n0\r\n\r\n",
        error: .invalidChunkExtension, afterHead: true),
    RejectedCase(
        name: "chunk data too long",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n5\r\nhello!\r\n0\r\n\r\n",
        error: .invalidChunkTerminator, afterHead: true),
    RejectedCase(
        name: "chunk data followed by bare LF",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n",
        error: .invalidChunkTerminator, afterHead: true),
    RejectedCase(
        name: "bare LF after chunk size",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
        error: .bareLineFeed, afterHead: true),
    RejectedCase(
        name: "invalid trailer field",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n0\r\nBad Trailer\r\n\r\n",
        error: .invalidHeaderLine, afterHead: true),
    RejectedCase(
        name: "folded trailer",
        input: "POST / HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\n\r\n0\r\nT: a\r\n b\r\n\r\n",
        error: .obsoleteLineFolding, afterHead: true),
    // An error after valid pipelined requests.
    RejectedCase(
        name: "garbage after a valid request",
        input: "GET / HTTP/1.1\r\n\(host)\r\nGET / HTTP/1.1\r\n\(host)X:\u{01}\r\n\r\n", error: .invalidHeaderValue,
        requestsBefore: 1),
    // One past each (tiny) limit.
    RejectedCase(
        name: "tiny: request line past limit", input: "GET /\(String(repeating: "a", count: 19)) HTTP/1.1\r\n\r\n",
        limits: tinyLimits, error: .requestLineTooLong),
    RejectedCase(
        name: "tiny: request line past limit with bare LF",
        input: "GET /\(String(repeating: "a", count: 20)) HTTP/1.1\n\r\n", limits: tinyLimits,
        error: .requestLineTooLong),
    RejectedCase(
        name: "tiny: header section past limit",
        input: "GET / HTTP/1.1\r\nHost: h\r\nX: \(String(repeating: "v", count: 49))\r\n\r\n", limits: tinyLimits,
        error: .headerTooLarge),
    RejectedCase(
        name: "tiny: header count past limit", input: "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n",
        limits: tinyLimits, error: .tooManyHeaders),
    RejectedCase(
        name: "tiny: Content-Length past limit",
        input: "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 17\r\n\r\n0123456789abcdefg", limits: tinyLimits,
        error: .bodyTooLarge),
    RejectedCase(
        name: "tiny: chunked body past limit",
        input:
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n9\r\n89abcdefg\r\n0\r\n\r\n",
        limits: tinyLimits, error: .bodyTooLarge, afterHead: true),
    RejectedCase(
        name: "tiny: huge chunk size",
        input: "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\n",
        limits: tinyLimits, error: .bodyTooLarge, afterHead: true),
    RejectedCase(
        name: "tiny: chunk header past limit",
        input: "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1;abcdefg\r\nx\r\n0\r\n\r\n",
        limits: tinyLimits, error: .chunkHeaderTooLong, afterHead: true),
    RejectedCase(
        name: "tiny: trailer section past limit",
        input:
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: \(String(repeating: "t", count: 58))\r\n\r\n",
        limits: tinyLimits, error: .headerTooLarge, afterHead: true),
    RejectedCase(
        name: "tiny: trailer count past limit",
        input:
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n",
        limits: tinyLimits, error: .tooManyHeaders, afterHead: true),
]

// MARK: - Tests

final class HTTPRequestParserTests: XCTestCase {
    func testValidSamples() {
        for sample in validCases {
            for mode in [HTTPRequestParser.BodyMode.collect, .stream] {
                let outcome = parse(bytes(sample.input), limits: sample.limits, mode: mode)
                let name = "\(sample.name) (\(mode))"
                XCTAssertNil(outcome.error, name)
                XCTAssertNil(outcome.pendingHead, name)
                XCTAssertEqual(outcome.violations, [], name)
                XCTAssertEqual(outcome.closed, sample.closedAfter, "\(name): closed")
                XCTAssertEqual(outcome.requests.count, sample.expected.count, name)
                for (request, expected) in zip(outcome.requests, sample.expected) {
                    expected.check(request, name)
                }
            }
        }
    }

    func testRejectedSamples() {
        for sample in rejectedCases {
            for mode in [HTTPRequestParser.BodyMode.collect, .stream] {
                let outcome = parse(bytes(sample.input), limits: sample.limits, mode: mode)
                let name = "\(sample.name) (\(mode))"
                XCTAssertEqual(outcome.error?.code, sample.error.code, name)
                XCTAssertEqual(outcome.error?.status, sample.error.status, name)
                XCTAssertEqual(outcome.requests.count, sample.requestsBefore, name)
                XCTAssertEqual(outcome.pendingHead != nil, sample.afterHead, "\(name): head before the error")
                XCTAssertTrue(outcome.closed, name)
                XCTAssertEqual(outcome.violations, [], name)
            }
        }
    }

    /// Every sample, split in two at every byte and fed one byte at a time, gives the same
    /// outcome as fed whole, in both body modes.
    func testOutcomeDoesNotDependOnChunking() {
        let samples =
            validCases.map { ($0.name, $0.input, $0.limits) } + rejectedCases.map { ($0.name, $0.input, $0.limits) }
        for (name, text, limits) in samples {
            let input = bytes(text)
            let reference = parse(input, limits: limits, mode: .collect)
            XCTAssertEqual(parse(input, limits: limits, mode: .stream), reference, "\(name): stream vs collect")
            for mode in [HTTPRequestParser.BodyMode.collect, .stream] {
                let feedings = (1..<input.count).map { Feeding.split(at: $0) } + [.byteByByte]
                for feeding in feedings {
                    let outcome = parse(input, limits: limits, mode: mode, feeding: feeding)
                    if outcome != reference {
                        XCTFail("\(name) (\(mode), \(feeding)): \(outcome) != \(reference)")
                        break
                    }
                }
            }
        }
    }

    /// Random mutations of the samples: the parser never traps, and the outcome still does
    /// not depend on how the bytes are split.
    func testMutatedSamplesDoNotDependOnChunking() {
        var random = SplitMix64(seed: 0x7472_756E_6B)
        let interesting: [UInt8] = [0x0D, 0x0A, 0x20, 0x09, 0x3A, 0x2C, 0x3B, 0x30, 0x61, 0x46, 0x00, 0x7F, 0xFF]
        let samples = (validCases.map(\.input) + rejectedCases.map(\.input)).map(bytes)
        for iteration in 0..<2000 {
            var input = samples[Int(random.next() % UInt64(samples.count))]
            for _ in 0..<(1 + random.next() % 3) where !input.isEmpty {
                let at = Int(random.next() % UInt64(input.count))
                let byte =
                    random.next() % 2 == 0
                    ? interesting[Int(random.next() % UInt64(interesting.count))]
                    : UInt8(truncatingIfNeeded: random.next())
                switch random.next() % 3 {
                case 0: input[at] = byte
                case 1: input.insert(byte, at: at)
                default: input.remove(at: at)
                }
            }
            let limits = iteration % 2 == 0 ? HTTPParserLimits.default : tinyLimits
            let mode: HTTPRequestParser.BodyMode = iteration % 3 == 0 ? .stream : .collect
            let reference = parse(input, limits: limits, mode: mode)
            XCTAssertEqual(reference.violations, [])
            let split = Feeding.split(at: input.isEmpty ? 0 : Int(random.next() % UInt64(input.count)))
            for feeding in [split, .byteByByte] {
                let outcome = parse(input, limits: limits, mode: mode, feeding: feeding)
                XCTAssertEqual(
                    outcome, reference, "\(String(decoding: input, as: UTF8.self).debugDescription) \(feeding)")
            }
        }
    }

    /// An idle keep-alive connection gives its buffer back between requests; bytes of a
    /// pipelined request or a partial head are kept.
    func testBufferIsReleasedOnlyBetweenRequests() {
        var parser = HTTPRequestParser()
        /// The next complete request's path (heads skipped).
        func nextPath() -> String? {
            while let event = parser.next() {
                if case .request(let head, _) = event { return head.path }
            }
            return nil
        }
        parser.feed(bytes("GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HT"))
        XCTAssertEqual(nextPath(), "/a")
        XCTAssertNil(nextPath())
        parser.releaseBufferBetweenRequests()  // a partial head is buffered: kept
        parser.feed(bytes("TP/1.1\r\nHost: h\r\n\r\n"))
        XCTAssertEqual(nextPath(), "/b")
        XCTAssertEqual(parser.bufferedByteCount, 0)
        parser.releaseBufferBetweenRequests()
        parser.releaseBufferBetweenRequests()
        parser.feed(bytes("GET /c HTTP/1.1\r\nHost: h\r\n\r\n"))
        XCTAssertEqual(nextPath(), "/c")
    }

    /// A released buffer is handed back (empty when nothing was released) and another parser
    /// adopts it: what it still contains is never parsed.
    func testAReleasedBufferServesAnotherParser() {
        var first = HTTPRequestParser()
        var second = HTTPRequestParser()
        XCTAssertTrue(first.hasNoBuffer)
        XCTAssertEqual(first.releaseBufferBetweenRequests(), [], "nothing to release yet")
        first.feed(bytes("GET /secret HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer t\r\n\r\nGET /b HT"))
        guard case .head = first.next(), case .request = first.next() else { return XCTFail("first request") }
        XCTAssertEqual(first.releaseBufferBetweenRequests(), [], "a partial head is kept")
        XCTAssertFalse(first.hasNoBuffer)
        first.feed(bytes("TP/1.1\r\nHost: h\r\n\r\n"))
        guard case .head = first.next(), case .request = first.next() else { return XCTFail("second request") }
        var spare = first.releaseBufferBetweenRequests()
        XCTAssertFalse(spare.isEmpty)
        XCTAssertTrue(first.hasNoBuffer)

        second.adopt(&spare)
        XCTAssertTrue(spare.isEmpty, "taken, not copied")
        XCTAssertFalse(second.hasNoBuffer)
        XCTAssertEqual(second.bufferedByteCount, 0)
        XCTAssertNil(second.next(), "the old bytes are not input")
        second.feed(bytes("GET /c HTTP/1.1\r\nHost: h\r\n\r\n"))
        guard case .head(let head) = second.next() else { return XCTFail("head") }
        XCTAssertEqual(head.path, "/c")
        XCTAssertEqual(head.headers.count, 1)
        guard case .request = second.next() else { return XCTFail("request") }
        XCTAssertNil(second.next())

        // A parser that has a buffer keeps it.
        var other = [UInt8](repeating: 0, count: 512)
        second.feed(bytes("GET /d HT"))
        second.adopt(&other)
        XCTAssertEqual(other.count, 512, "not taken")
        second.feed(bytes("TP/1.1\r\nHost: h\r\n\r\n"))
        guard case .head(let last) = second.next() else { return XCTFail("head") }
        XCTAssertEqual(last.path, "/d")
    }

    // MARK: Default limits, at and one past each boundary

    func testRequestLineLimit() {
        // "GET " + target + " HTTP/1.1" is 13 bytes plus the target.
        for (length, error) in [(8192, nil), (8193, HTTPParserError.requestLineTooLong)] {
            let target = "/" + String(repeating: "a", count: length - 14)
            let input = bytes("GET \(target) HTTP/1.1\r\nHost: h\r\n\r\n")
            for feeding in [Feeding.whole, .byteByByte, .split(at: 8000)] {
                let outcome = parse(input, feeding: feeding)
                XCTAssertEqual(outcome.error, error, "\(length) \(feeding)")
                XCTAssertEqual(outcome.requests.count, error == nil ? 1 : 0, "\(length) \(feeding)")
                XCTAssertEqual(outcome.requests.first?.head.path, error == nil ? target : nil)
            }
        }
        // Rejected before the line ends.
        var parser = HTTPRequestParser()
        parser.feed(bytes("GET /" + String(repeating: "a", count: 8188)))
        XCTAssertNil(parser.next())
        parser.feed(bytes("a"))
        XCTAssertEqual(parser.next(), .error(.requestLineTooLong))
    }

    func testHeaderSectionSizeLimit() {
        // Section = "Host: h\r\n" (9) + "X-Pad: " (7) + pad + CRLF + final CRLF.
        for (size, error) in [(32768, nil), (32769, HTTPParserError.headerTooLarge)] {
            let pad = String(repeating: "p", count: size - 20)
            let input = bytes("GET / HTTP/1.1\r\nHost: h\r\nX-Pad: \(pad)\r\n\r\n")
            for feeding in [Feeding.whole, .byteByByte, .split(at: 30000)] {
                let outcome = parse(input, feeding: feeding)
                XCTAssertEqual(outcome.error, error, "\(size) \(feeding)")
                XCTAssertEqual(outcome.requests.first?.head.headers["x-pad"], error == nil ? pad : nil)
            }
        }
        // Rejected before the head ends.
        var parser = HTTPRequestParser()
        parser.feed(bytes("GET / HTTP/1.1\r\nX: " + String(repeating: "v", count: 32765)))
        XCTAssertNil(parser.next())
        parser.feed(bytes("v"))
        XCTAssertEqual(parser.next(), .error(.headerTooLarge))
    }

    func testHeaderCountLimit() {
        for (count, error) in [(100, nil), (101, HTTPParserError.tooManyHeaders)] {
            let fields = (1..<count).map { "X-\($0): \($0)\r\n" }.joined()
            let input = bytes("GET / HTTP/1.1\r\nHost: h\r\n\(fields)\r\n")
            for feeding in [Feeding.whole, .byteByByte] {
                let outcome = parse(input, feeding: feeding)
                XCTAssertEqual(outcome.error, error, "\(count) \(feeding)")
                XCTAssertEqual(outcome.requests.first?.head.headers.count, error == nil ? count : nil)
            }
        }
    }

    func testContentLengthLimit() {
        let limit = 10 * 1024 * 1024
        for (length, error) in [(limit, nil), (limit + 1, HTTPParserError.bodyTooLarge)] {
            let head = bytes("POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: \(length)\r\n\r\n")
            // Decided from the head alone, before any body byte.
            var parser = HTTPRequestParser()
            parser.feed(head)
            if let error {
                XCTAssertEqual(parser.next(), .error(error))
                XCTAssertTrue(parser.isClosed)
                continue
            }
            guard case .head(let parsed) = parser.next() else { return XCTFail("no head") }
            XCTAssertEqual(parsed.bodyFraming, .contentLength(limit))
            XCTAssertNil(parser.next())
            let body = [UInt8](repeating: 0x61, count: length)
            let input = head + body
            for (mode, feeding) in [
                (HTTPRequestParser.BodyMode.collect, Feeding.whole), (.stream, .split(at: head.count + 1)),
                (.collect, .split(at: head.count + length / 2)),
            ] {
                let outcome = parse(input, mode: mode, feeding: feeding)
                XCTAssertNil(outcome.error)
                XCTAssertEqual(outcome.requests.first?.body.count, length, "\(mode) \(feeding)")
            }
        }
    }

    func testChunkedBodyLimit() {
        let half = 5 * 1024 * 1024
        let chunk = bytes(String(half, radix: 16) + "\r\n") + [UInt8](repeating: 0x62, count: half) + bytes("\r\n")
        let head = bytes("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        let input = head + chunk + chunk + bytes("0\r\n\r\n")
        let atLimit = parse(input)
        XCTAssertNil(atLimit.error)
        XCTAssertEqual(atLimit.requests.first?.body.count, 2 * half)
        XCTAssertEqual(parse(input, mode: .stream, feeding: .split(at: half)), atLimit)

        // One more byte is refused at its chunk-size line, before its data arrives.
        var parser = HTTPRequestParser(bodyMode: .stream)
        parser.feed(head + chunk + chunk)
        var received = 0
        while let event = parser.next() {
            if case .body(let bytes) = event { received += bytes.count }
        }
        XCTAssertEqual(received, 2 * half)
        parser.feed(bytes("1\r\n"))
        XCTAssertEqual(parser.next(), .error(.bodyTooLarge))
    }

    func testChunkHeaderLimit() {
        let head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        for (length, error) in [(4096, nil), (4097, HTTPParserError.chunkHeaderTooLong)] {
            let line = "3;" + String(repeating: "e", count: length - 2)
            let outcome = parse(bytes(head + line + "\r\nabc\r\n0\r\n\r\n"))
            XCTAssertEqual(outcome.error, error, "\(length)")
            XCTAssertEqual(outcome.requests.first?.body, error == nil ? bytes("abc") : nil)
        }
    }

    func testLimitsAreConfigurable() {
        let limits = HTTPParserLimits(maxHeaderCount: 1)
        XCTAssertEqual(parse(bytes("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), limits: limits).requests.count, 1)
        XCTAssertEqual(
            parse(bytes("GET / HTTP/1.1\r\nHost: h\r\nA: b\r\n\r\n"), limits: limits).error, .tooManyHeaders)
        XCTAssertEqual(HTTPParserLimits.default.maxRequestLineLength, 8192)
        XCTAssertEqual(HTTPParserLimits.default.maxHeaderSectionSize, 32768)
        XCTAssertEqual(HTTPParserLimits.default.maxHeaderCount, 100)
        XCTAssertEqual(HTTPParserLimits.default.maxBodySize, 10_485_760)
    }

    // MARK: Connection semantics

    func testKeepAliveRules() {
        let table: [(version: String, connection: String?, keepAlive: Bool)] = [
            ("1.1", nil, true),
            ("1.1", "keep-alive", true),
            ("1.1", "close", false),
            ("1.1", "Close", false),
            ("1.1", "Upgrade, close", false),
            ("1.1", "keep-alive, close", false),
            ("1.1", "closed", true),
            ("1.0", nil, false),
            ("1.0", "keep-alive", true),
            ("1.0", "KEEP-ALIVE", true),
            ("1.0", "foo , keep-alive", true),
            ("1.0", "close", false),
            ("1.0", "keep-alive, close", false),
        ]
        for row in table {
            let connection = row.connection.map { "Connection: \($0)\r\n" } ?? ""
            let outcome = parse(bytes("GET / HTTP/\(row.version)\r\nHost: h\r\n\(connection)\r\n"))
            XCTAssertEqual(outcome.requests.first?.head.keepAlive, row.keepAlive, "\(row)")
            XCTAssertEqual(outcome.closed, !row.keepAlive, "\(row)")
        }
    }

    func testExpectContinue() {
        let table: [(request: String, expects: Bool)] = [
            ("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", true),
            ("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-CONTINUE\r\nTransfer-Encoding: chunked\r\n\r\n", true),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n", false),
            ("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n", false),
            ("GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n", false),
            ("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", false),
            ("POST / HTTP/1.1\r\nHost: h\r\nExpect: something-else\r\nContent-Length: 3\r\n\r\n", false),
        ]
        for row in table {
            // The head is reported without waiting for the body.
            var parser = HTTPRequestParser()
            parser.feed(bytes(row.request))
            guard case .head(let head) = parser.next() else {
                XCTFail("no head for \(row.request)")
                continue
            }
            XCTAssertEqual(head.expectsContinue, row.expects, row.request)
            if head.hasBody { XCTAssertNil(parser.next()) }
        }
    }

    func testParserStopsAfterAnError() {
        var parser = HTTPRequestParser()
        parser.feed(bytes("GET / HTTP/1.1\r\nHost: h\r\nBad Header\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n"))
        XCTAssertEqual(parser.next(), .error(.invalidHeaderLine))
        XCTAssertNil(parser.next())
        parser.feed(bytes("GET / HTTP/1.1\r\nHost: h\r\n\r\n"))
        XCTAssertNil(parser.next())
        XCTAssertTrue(parser.isClosed)
        XCTAssertEqual(parser.error, .invalidHeaderLine)
        XCTAssertEqual(parser.bufferedByteCount, 0)
    }

    // MARK: Pipelining and buffering

    func testPipelinedRequestsKeepFollowingBytes() {
        var parser = HTTPRequestParser(bodyMode: .stream)
        parser.feed(
            bytes(
                "GET /1 HTTP/1.1\r\nHost: h\r\n\r\nPOST /2 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
                    + "DELETE /3 HTTP/1.1\r\nHost: h\r\n\r\nGET /4 HTTP/1.1\r\nHo"))
        var events: [String] = []
        while let event = parser.next() {
            switch event {
            case .head(let head): events.append("head \(head.method) \(head.path)")
            case .body(let body): events.append("body \(String(decoding: body, as: UTF8.self))")
            case .end: events.append("end")
            case .request, .error: events.append("unexpected \(event)")
            }
        }
        XCTAssertEqual(
            events, ["head GET /1", "end", "head POST /2", "body abc", "end", "head DELETE /3", "end"])
        XCTAssertFalse(parser.isIdle)
        // The fourth request line is parsed already; its unfinished field line waits.
        XCTAssertEqual(parser.bufferedByteCount, 2)
        parser.feed(bytes("st: h\r\n\r\n"))
        guard case .head(let fourth) = parser.next() else { return XCTFail("fourth request lost") }
        XCTAssertEqual(fourth.path, "/4")
        XCTAssertEqual(parser.next(), .end)
        XCTAssertNil(parser.next())
        XCTAssertTrue(parser.isIdle)
    }

    func testFillReadsStraightIntoTheBuffer() {
        let wire = bytes(
            "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\nHost: h\r\n\r\n")
        var parser = HTTPRequestParser()
        var offset = 0
        var requests: [ParsedRequest] = []
        while offset < wire.count {
            let read = parser.fill(upTo: 7) { buffer in
                let count = min(buffer.count, wire.count - offset)
                wire.withUnsafeBytes { source in
                    buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[offset..<offset + count]))
                }
                return count
            }
            XCTAssertLessThanOrEqual(read, 7)
            offset += read
            while let event = parser.next() {
                if case .request(let head, let body) = event { requests.append(ParsedRequest(head: head, body: body)) }
            }
        }
        XCTAssertEqual(requests.map(\.head.path), ["/x", "/"])
        XCTAssertEqual(requests.first?.body, bytes("hello"))
        XCTAssertEqual(parser.fill(upTo: 16) { _ in 0 }, 0)
        XCTAssertEqual(parser.fill(upTo: 16) { _ in -1 }, -1)
        XCTAssertTrue(parser.isIdle)
    }

    // MARK: Types

    func testMethodsAreTakenAsSent() {
        for (method, expected) in [
            ("GET", HTTPMethod.get), ("HEAD", .head), ("POST", .post), ("PUT", .put), ("DELETE", .delete),
            ("PATCH", .patch), ("OPTIONS", .options), ("PROPFIND", HTTPMethod(rawValue: "PROPFIND")),
            ("get", HTTPMethod(rawValue: "get")), ("GETS", HTTPMethod(rawValue: "GETS")),
            ("POS", HTTPMethod(rawValue: "POS")),
        ] {
            var parser = HTTPRequestParser()
            parser.feed(Array("\(method) / HTTP/1.1\r\nHost: a\r\n\r\n".utf8))
            guard case .head(let head)? = parser.next() else { return XCTFail(method) }
            XCTAssertEqual(head.method, expected, method)
            XCTAssertEqual(head.method.rawValue, method)
        }
    }

    func testHeadersLookup() {
        var headers: HTTPHeaders = ["Content-Type": "application/json", "X-Multi": "a"]
        headers.append(name: "x-multi", value: "b")
        XCTAssertEqual(headers["content-type"], "application/json")
        XCTAssertEqual(headers["CONTENT-TYPE"], "application/json")
        XCTAssertNil(headers["content-typ"])
        XCTAssertEqual(headers.values(for: "X-MULTI"), ["a", "b"])
        XCTAssertTrue(headers.contains("x-Multi"))
        XCTAssertFalse(headers.contains("x-multi2"))
        XCTAssertEqual(headers.map(\.name), ["Content-Type", "X-Multi", "x-multi"])
    }

    func testErrorCodesAreDistinctAndStatusesAsSpecified() {
        let statuses: [HTTPParserError: Int] = [
            .requestLineTooLong: 414, .headerTooLarge: 431, .tooManyHeaders: 431, .bodyTooLarge: 413,
            .unsupportedTransferEncoding: 501, .unsupportedVersion: 505, .contentLengthWithTransferEncoding: 400,
            .conflictingContentLength: 400, .invalidContentLength: 400, .missingHost: 400, .bareLineFeed: 400,
            .obsoleteLineFolding: 400, .whitespaceBeforeColon: 400,
        ]
        for (error, status) in statuses { XCTAssertEqual(error.status, status, error.code) }
        let codes = rejectedCases.map(\.error.code)
        XCTAssertEqual(Set(codes).count, Dictionary(grouping: rejectedCases, by: \.error).count)
        XCTAssertEqual(HTTPParserError.headerTooLarge.code, "header_too_large")
    }
}

/// A small deterministic generator, so that a failing mutation can be replayed.
private struct SplitMix64 {
    var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE5_E4B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
