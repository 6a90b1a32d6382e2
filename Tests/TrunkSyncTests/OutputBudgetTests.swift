import Foundation
import Glibc
import TestSupport
import TrunkSync
import XCTest

/// The attack: one account, a few MB of its own events, connections that ask for a large
/// REST answer and never read it. The server holds at most
/// `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT` of such answers; past it a large answer is `503
/// server_busy` (the route's shape, `Retry-After: 1`), small ones still go, and once the
/// readers are gone large answers go again (docs/api.md, "Limits and errors").
final class OutputBudgetTests: XCTestCase {
    /// Room for one ~12 MB answer, not for two (the kernel takes a few MiB of the first at
    /// most: `tcp_wmem`).
    static let limit = 16 * 1024 * 1024
    static let events = 200
    static let largeRead = "/rest/v1/events?select=*&limit=1000"

    var app: AppHarness!
    var token: String!

    override func setUp() async throws {
        app = try await AppHarness(environment: ["TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT": "\(Self.limit)"])
        token = try await app.token("budget@example.com")
        // 200 events of 60 KB: a REST read of all of them answers ~12 MB.
        let text = String(repeating: "x", count: 60_000)
        for _ in 0..<2 {
            let events: [[String: Any]] = (0..<(Self.events / 2)).map { _ in
                [
                    "client_id": UUID().uuidString, "type": "note", "payload": ["text": text],
                    "client_timestamp": "2026-11-22T04:10:02.123Z",
                ]
            }
            let pushed = try await app.request("POST", "/sync/v1/events", json: ["events": events], bearer: token)
            XCTAssertEqual(pushed.status, 200, pushed.text)
        }
    }

    override func tearDown() async throws { await app.stop() }

    /// A connection that asks for the large read and reads nothing, once the server holds
    /// part of its answer.
    func nonReader() async throws -> Int32 {
        let socket = try connectedSocket(port: app.server.port, receiveBuffer: 4096)
        let request = "GET \(Self.largeRead) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(token!)\r\n\r\n"
        let sent = Array(request.utf8).withUnsafeBytes { send(socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        XCTAssertEqual(sent, request.utf8.count)
        let server = app.server
        let holding = await waitUntil(30) { server.bufferedOutputBytes > 0 }
        XCTAssertTrue(holding, "the server never held the answer")
        return socket
    }

    func testLargeAnswersOverTheBudgetAre503WhileSmallOnesGoAndTheBytesComeBack() async throws {
        let server = app.server
        let first = try await nonReader()
        let held = server.bufferedOutputBytes
        XCTAssertGreaterThan(held + Self.events * 60_000, Self.limit, "precondition: a second answer must not fit")

        let refused = try await app.request("GET", Self.largeRead, bearer: token)
        XCTAssertEqual(refused.status, 503, String(refused.text.prefix(300)))
        XCTAssertEqual(refused.json["code"] as? String, "server_busy", String(refused.text.prefix(300)))
        XCTAssertNotNil(refused.json["message"] as? String)
        XCTAssertTrue(
            refused.json.keys.contains("details") && refused.json.keys.contains("hint"),
            String(refused.text.prefix(300)))
        XCTAssertEqual(refused.headers["retry-after"], "1")
        XCTAssertEqual(refused.headers["proxy-status"], "PostgREST; error=server_busy")
        XCTAssertNotNil(refused.headers["x-request-id"])
        XCTAssertFalse(refused.text.contains(token), "no secret in the answer")

        // Small answers go: health, readiness, an ordinary REST read and a pull.
        for path in ["/healthz", "/readyz"] {
            let answer = try await app.request("GET", path)
            XCTAssertEqual(answer.status, 200, path)
        }
        let small = try await app.request("GET", "/rest/v1/events?select=seq&order=seq&limit=3", bearer: token)
        XCTAssertEqual(small.status, 200, small.text)
        XCTAssertEqual(small.text, #"[{"seq":1},{"seq":2},{"seq":3}]"#)
        let pull = try await app.request("GET", "/sync/v1/events?after=0&limit=1", bearer: token)
        XCTAssertEqual(pull.status, 200, pull.text)

        // An insert is stored and answered whatever the budget: a client that retried it
        // would not get the rows again (only the rows a request stored are answered).
        let text = String(repeating: "y", count: 60_000)
        let rows: [[String: Any]] = (0..<2).map { _ in
            ["client_id": UUID().uuidString, "type": "note", "payload": ["text": text]]
        }
        let inserted = try await app.request(
            "POST", "/rest/v1/events", json: rows, bearer: token, headers: ["Prefer": "return=representation"])
        XCTAssertEqual(inserted.status, 201, String(inserted.text.prefix(300)))
        XCTAssertGreaterThan(inserted.body.count, 64 * 1024)
        XCTAssertEqual((try JSONSerialization.jsonObject(with: inserted.body) as? [Any])?.count, 2)

        let refusedTotal = try await app.metric(#"trunk_sync_http_answers_refused_total{limit="total"}"#)
        XCTAssertEqual(refusedTotal, 1)
        let heldNow = try await app.metric("trunk_sync_http_output_buffered_bytes") ?? 0
        XCTAssertGreaterThan(heldNow, 0)

        // The non-reader goes (with unread bytes: a reset): its bytes come back, and large
        // answers go again.
        close(first)
        let released = await waitUntil(30) { server.bufferedOutputBytes == 0 }
        XCTAssertTrue(released, "still held: \(server.bufferedOutputBytes)")
        let answer = try await app.request("GET", Self.largeRead, bearer: token)
        XCTAssertEqual(answer.status, 200)
        let all = try JSONSerialization.jsonObject(with: answer.body) as? [Any]
        XCTAssertEqual(all?.count, Self.events + 2)

        // A non-reader that starts reading gives its bytes back as it goes.
        let second = try await nonReader()
        defer { close(second) }
        var received = 0
        var buffer = [UInt8](repeating: 0, count: 256 * 1024)
        var head: String? = nil
        var length = Int.max
        while received < length {
            let count = recv(second, &buffer, buffer.count, 0)
            guard count > 0 else { break }
            received += count
            if head == nil,
                let end = (3..<count).first(where: { buffer[$0 - 3..<$0 + 1].elementsEqual([13, 10, 13, 10]) })
            {
                head = String(decoding: buffer[0..<end - 3], as: UTF8.self)
                let field = head?.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                let value = field?.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)
                length = end + 1 + (value.flatMap { Int($0) } ?? 0)
            }
        }
        XCTAssertTrue(head?.hasPrefix("HTTP/1.1 200") ?? false, head ?? "no head")
        XCTAssertEqual(received, length)
        let drained = await waitUntil(30) { server.bufferedOutputBytes == 0 }
        XCTAssertTrue(drained, "still held: \(server.bufferedOutputBytes)")
        let heldAtEnd = try await app.metric("trunk_sync_http_output_buffered_bytes")
        XCTAssertEqual(heldAtEnd, 0)
    }
}
