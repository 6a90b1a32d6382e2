import Foundation
import Glibc
import HTTPServer
import TestSupport
import TrunkSync
import XCTest

/// The attack on the input side: connections that announce large bodies (a 10 MiB push) and
/// send them slowly, or never. A route that needs a signed-in caller answers `401` from the
/// head, before a byte of the body is read; a signed-in caller's large bodies are held only
/// up to `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT` in all, past which a body is `503 server_busy`
/// (the route's shape, `Retry-After: 1`) instead of being read. Nothing is stored by a
/// refused request, and what the bodies held comes back however they end (docs/api.md,
/// "Limits and errors"; config/README.md, "Bodies on their way"). One account holds at most
/// `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT_PER_CLIENT` of it: past that, its large bodies are
/// refused the same way while other users' still pass.
final class InputBudgetTests: XCTestCase {
    /// The smallest the setting takes: room for one 900 KB body, not for another 200 KB.
    static let limit = 1024 * 1024
    static let holderSize = 900_000

    var app: AppHarness!
    var token: String!

    /// A server on a new database with the small budget (and a short body timeout when given;
    /// a share per account when given, else the default, larger than the budget: none).
    func start(bodyTimeout: Int = 30, perClient: Int? = nil) async throws {
        var environment = [
            "TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT": "\(Self.limit)", "TRUNK_SYNC_HTTP_BODY_TIMEOUT": "\(bodyTimeout)",
        ]
        if let perClient { environment["TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT_PER_CLIENT"] = "\(perClient)" }
        app = try await AppHarness(environment: environment)
        token = try await app.token("input@example.com")
    }

    override func tearDown() async throws { await app?.stop() }

    // MARK: - Raw requests: a head, and as much of the body as the test says

    struct Answer {
        var status: Int
        var headers: [String: String]
        var body: Data
        var json: [String: Any] { (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] ?? [:] }
    }

    func open() throws -> Int32 { try connectedSocket(port: app.server.port) }

    func send(_ socket: Int32, _ text: String) {
        let bytes = Array(text.utf8)
        var sent = 0
        while sent < bytes.count {
            let count = bytes[sent...].withUnsafeBufferPointer {
                Glibc.send(socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            guard count > 0 else { return }
            sent += count
        }
    }

    func head(
        _ method: String, _ path: String, length: Int? = nil, chunked: Bool = false, bearer: String? = nil,
        _ extra: [String: String] = [:]
    ) -> String {
        var text = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        if let length { text += "Content-Length: \(length)\r\n" }
        if chunked { text += "Transfer-Encoding: chunked\r\n" }
        if let bearer { text += "Authorization: Bearer \(bearer)\r\n" }
        for (name, value) in extra { text += "\(name): \(value)\r\n" }
        return text + "\r\n"
    }

    /// The next answer on `socket` (a `Content-Length` one).
    func answer(_ socket: Int32) throws -> Answer {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        func fill() throws {
            let count = recv(socket, &buffer, buffer.count, 0)
            guard count > 0 else { throw TestEnvironmentError("closed or timed out after \(received.count) bytes") }
            received += buffer[0..<count]
        }
        var end: Int? = nil
        while end == nil {
            try fill()
            end = (0..<max(0, received.count - 3)).first { received[$0..<$0 + 4].elementsEqual([13, 10, 13, 10]) }
        }
        let lines = String(decoding: received[0..<end!], as: UTF8.self).split(separator: "\r\n")
        let status = Int(lines[0].split(separator: " ")[1]) ?? 0
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                in: .whitespaces)
        }
        let length = Int(headers["content-length"] ?? "0") ?? 0
        while received.count < end! + 4 + length { try fill() }
        return Answer(status: status, headers: headers, body: Data(received[(end! + 4)..<(end! + 4 + length)]))
    }

    /// Whether the server closes `socket` (reads until EOF; what else arrives is dropped).
    func closes(_ socket: Int32) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = recv(socket, &buffer, buffer.count, 0)
            if count == 0 { return true }
            if count < 0 { return errno == ECONNRESET }
        }
    }

    func storedEvents() throws -> Int {
        try app.owner().query("select count(*)::int8 from events")[0].decode(Int.self, column: 0)
    }

    /// A push body of `count` events of `size` bytes of text each.
    func pushBody(events count: Int, size: Int) throws -> String {
        let text = String(repeating: "p", count: size)
        let events: [[String: Any]] = (0..<count).map { _ in
            [
                "client_id": UUID().uuidString, "type": "note", "payload": ["text": text],
                "client_timestamp": "2026-11-22T04:10:02.123Z",
            ]
        }
        return String(decoding: try JSONSerialization.data(withJSONObject: ["events": events]), as: UTF8.self)
    }

    // MARK: - Authentication from the head

    func testASignedOutCallerIsRefusedFromTheHeadBeforeItsBodyIsSent() async throws {
        try await start()
        let signedOut = try await app.token("signed-out@example.com")
        let logout = try await app.request("POST", "/auth/v1/logout", bearer: signedOut)
        XCTAssertEqual(logout.status, 204, String(decoding: logout.body, as: UTF8.self))

        // 5 MiB announced, or 4,000 bytes to Auth's small route whose client waits for
        // `100 Continue` (a small body that comes anyway is read: the next test), not a byte
        // of it sent: the answer comes anyway.
        let waits = ["Expect": "100-continue"]
        let cases: [(String, String, String?, [String: String], Int, String)] = [
            ("POST", "/sync/v1/events", nil, [:], 401, "unauthorized"),
            ("POST", "/sync/v1/events", "not-a-token", [:], 401, "unauthorized"),
            ("POST", "/sync/v1/events", signedOut, [:], 401, "unauthorized"),
            ("POST", "/sync/v1/events", nil, waits, 401, "unauthorized"),
            ("POST", "/rest/v1/events", nil, [:], 401, "PGRST301"),
            ("POST", "/rest/v1/events", signedOut, ["Prefer": "return=minimal"], 401, "PGRST301"),
            ("PUT", "/auth/v1/user", nil, waits, 401, "no_authorization"),
            ("PUT", "/auth/v1/user", "not-a-token", waits, 401, "bad_jwt"),
            ("PUT", "/auth/v1/user", signedOut, waits, 401, "session_not_found"),
        ]
        for (method, path, bearer, extra, status, code) in cases {
            let socket = try open()
            defer { close(socket) }
            let length = path.hasPrefix("/auth") ? 4000 : 5 * 1024 * 1024
            send(socket, head(method, path, length: length, bearer: bearer, extra))
            let refused = try answer(socket)
            let label = "\(method) \(path) \(bearer == nil ? "without" : "with a bad") token \(extra)"
            XCTAssertEqual(refused.status, status, label)
            XCTAssertEqual(refused.json["code"] as? String, code, label)
            XCTAssertEqual(refused.headers["connection"], "close", label)
            XCTAssertTrue(closes(socket), "the body was never read: the connection ends (\(label))")
        }
        XCTAssertEqual(app.server.bufferedInputBytes, 0, "nothing was held for them")
        XCTAssertEqual(try storedEvents(), 0)

        // A pull (no body) refused from its head keeps its connection.
        let socket = try open()
        defer { close(socket) }
        send(socket, head("GET", "/sync/v1/events?after=0"))
        XCTAssertEqual(try answer(socket).status, 401)
        send(socket, head("GET", "/sync/v1/events?after=0", bearer: token))
        XCTAssertEqual(try answer(socket).status, 200, "the same connection serves the next request")

        // A valid token still pushes, through the same head check.
        let pushed = try await app.request(
            "POST", "/sync/v1/events", rawBody: try pushBody(events: 1, size: 10), bearer: token)
        XCTAssertEqual(pushed.status, 200, String(decoding: pushed.body, as: UTF8.self))
        XCTAssertEqual(try storedEvents(), 1)
    }

    /// The usual case: a client whose token expired pushes (or inserts) a small body. The body
    /// is read and dropped, then refused, and the connection stays for the refresh and retry.
    func testASmallBodyOfASignedOutCallerIsReadAndTheConnectionKept() async throws {
        try await start()
        let signedOut = try await app.token("small-signed-out@example.com")
        let logout = try await app.request("POST", "/auth/v1/logout", bearer: signedOut)
        XCTAssertEqual(logout.status, 204, String(decoding: logout.body, as: UTF8.self))
        let push = try pushBody(events: 2, size: 20)
        let cases: [(String, String, String?, String, String)] = [
            ("POST", "/sync/v1/events", signedOut, push, "unauthorized"),
            ("POST", "/sync/v1/events", nil, push, "unauthorized"),
            (
                "POST", "/rest/v1/events", signedOut, #"{"client_id":"\#(UUID())","type":"note","payload":{}}"#,
                "PGRST301"
            ),
            ("PUT", "/auth/v1/user", signedOut, #"{"data":{"name":"x"}}"#, "session_not_found"),
            ("PUT", "/auth/v1/user", "not-a-token", #"{"data":{"name":"x"}}"#, "bad_jwt"),
        ]
        for (method, path, bearer, body, code) in cases {
            let label = "\(method) \(path) \(bearer == nil ? "without" : "with a bad") token"
            let socket = try open()
            defer { close(socket) }
            send(socket, head(method, path, length: body.utf8.count, bearer: bearer) + body)
            let refused = try answer(socket)
            XCTAssertEqual(refused.status, 401, label)
            XCTAssertEqual(refused.json["code"] as? String, code, label)
            XCTAssertNotEqual(refused.headers["connection"], "close", label)
            send(socket, head("GET", "/sync/v1/events?after=0", bearer: token))
            XCTAssertEqual(try answer(socket).status, 200, "the same connection serves the retry (\(label))")
        }
        XCTAssertEqual(try storedEvents(), 0)
        XCTAssertEqual(app.server.bufferedInputBytes, 0)
    }

    // MARK: - The budget

    /// A signed-in push that announced `holderSize` and sent a few bytes, once counted.
    func holder() async throws -> Int32 {
        let socket = try open()
        send(socket, head("POST", "/sync/v1/events", length: Self.holderSize, bearer: token) + #"{"ev"#)
        let server = app.server
        let holding = await waitUntil(10) { server.bufferedInputBytes == Self.holderSize }
        XCTAssertTrue(holding, "the server never counted the body: \(server.bufferedInputBytes)")
        return socket
    }

    func testBodiesOverTheBudgetAre503InTheRoutesShapeAndNothingIsStored() async throws {
        try await start()
        let first = try await holder()
        let body = try pushBody(events: 4, size: 50_000)  // ~200 KB
        let expectations: [(String, String, [String: String])] = [
            ("/sync/v1/events", "server_busy", [:]),
            ("/rest/v1/events", "server_busy", ["Prefer": "return=minimal"]),
        ]
        for (path, code, extra) in expectations {
            for expectContinue in [false, true] {
                let socket = try open()
                defer { close(socket) }
                var fields = extra
                if expectContinue { fields["Expect"] = "100-continue" }
                send(socket, head("POST", path, length: body.utf8.count, bearer: token, fields))
                let refused = try answer(socket)
                XCTAssertEqual(refused.status, 503, path)
                XCTAssertEqual(refused.json["code"] as? String, code, path)
                XCTAssertNotNil(refused.json["message"] as? String)
                XCTAssertEqual(refused.headers["retry-after"], "1", path)
                XCTAssertEqual(refused.headers["connection"], "close", path)
                XCTAssertNotNil(refused.headers["x-request-id"])
                if path.hasPrefix("/rest") {
                    XCTAssertEqual(refused.headers["proxy-status"], "PostgREST; error=server_busy")
                    XCTAssertTrue(refused.json.keys.contains("details") && refused.json.keys.contains("hint"))
                }
                XCTAssertTrue(closes(socket), path)
            }
        }
        // A chunked push that grows past the budget is cut off the same way.
        let chunked = try open()
        defer { close(chunked) }
        send(chunked, head("POST", "/sync/v1/events", chunked: true, bearer: token))
        let piece = String(repeating: " ", count: 16 * 1024)
        for _ in 0..<16 { send(chunked, String(16 * 1024, radix: 16) + "\r\n" + piece + "\r\n") }
        let cut = try answer(chunked)
        XCTAssertEqual(cut.status, 503)
        XCTAssertEqual(cut.json["code"] as? String, "server_busy")
        XCTAssertEqual(cut.headers["retry-after"], "1")

        // Small bodies pass while the budget is full.
        let small = try await app.request(
            "POST", "/sync/v1/events", rawBody: try pushBody(events: 1, size: 1000), bearer: token)
        XCTAssertEqual(small.status, 200, String(decoding: small.body, as: UTF8.self))
        XCTAssertEqual(try storedEvents(), 1, "nothing of the refused requests was stored")
        let refusedTotal = try await app.metric(#"trunk_sync_http_bodies_refused_total{limit="total"}"#)
        XCTAssertEqual(refusedTotal, 5)
        let refusedPerClient = try await app.metric(#"trunk_sync_http_bodies_refused_total{limit="per_client"}"#)
        XCTAssertEqual(refusedPerClient, 0, "the default share is larger than this budget: none")
        let held = try await app.metric("trunk_sync_http_input_buffered_bytes")
        XCTAssertEqual(held, Double(Self.holderSize))

        // The holder gives up: its bytes come back and the large push goes through.
        close(first)
        let server = app.server
        let released = await waitUntil(10) { server.bufferedInputBytes == 0 }
        XCTAssertTrue(released, "still held: \(server.bufferedInputBytes)")
        let large = try await app.request("POST", "/sync/v1/events", rawBody: body, bearer: token)
        XCTAssertEqual(large.status, 200, String(decoding: large.body.prefix(300), as: UTF8.self))
        XCTAssertEqual(try storedEvents(), 5)
        let heldAtEnd = try await app.metric("trunk_sync_http_input_buffered_bytes")
        XCTAssertEqual(heldAtEnd, 0)
    }

    /// A body read whole is still in memory while its handler works on it: a push waiting for
    /// the database keeps its share of the budget until it is answered, so pushes piling up
    /// behind a slow database cannot hold more than the budget between them.
    func testABodyCountsUntilItsRequestIsAnsweredNotJustUntilItIsRead() async throws {
        try await start()
        let server = app.server
        let blocker = try app.owner()
        try blocker.execute("begin")
        try blocker.execute("lock table events in share mode")  // inserts wait
        let waiting = try pushBody(events: 15, size: 60_000)  // ~900 KB
        let socket = try open()
        defer { close(socket) }
        send(socket, head("POST", "/sync/v1/events", length: waiting.utf8.count, bearer: token) + waiting)
        let harness = app!
        let blocked = try await waitUntil(20) {
            try harness.owner().query(
                """
                select count(*) from pg_stat_activity
                where datname = current_database() and wait_event_type = 'Lock' and query ilike '%insert%'
                """)[0].decode(Int64.self, column: 0) == 1
        }
        XCTAssertTrue(blocked, "the push never reached the database")
        XCTAssertEqual(server.bufferedInputBytes, waiting.utf8.count, "read whole, handed over, still held")

        let another = try await app.request(
            "POST", "/sync/v1/events", rawBody: try pushBody(events: 4, size: 50_000), bearer: token)
        XCTAssertEqual(another.status, 503, "the budget is the waiting push's")
        XCTAssertEqual(another.json["code"] as? String, "server_busy")

        try blocker.execute("rollback")
        let answered = try answer(socket)
        XCTAssertEqual(answered.status, 200, String(decoding: answered.body.prefix(300), as: UTF8.self))
        let released = await waitUntil(10) { server.bufferedInputBytes == 0 }
        XCTAssertTrue(released, "still held after the answer: \(server.bufferedInputBytes)")
        XCTAssertEqual(try storedEvents(), 15)
    }

    /// One user (sign-up is open) with a push waiting for the database holds a share of the
    /// budget, not all of it: their next large push is `503 server_busy` while another
    /// user's large push is read and goes through.
    func testAUserOverTheirShareIs503WhileAnotherUsersLargePushGoesThrough() async throws {
        let share = 600_000
        try await start(perClient: share)
        let server = app.server
        let other = try await app.token("other-input@example.com")
        func account(_ email: String) throws -> ShareKey {
            .account(
                try app.owner().query("select id from users where email = '\(email)'")[0].decode(UUID.self, column: 0))
        }
        let mine = try account("input@example.com")
        let theirs = try account("other-input@example.com")
        let blocker = try app.owner()
        try blocker.execute("begin")
        try blocker.execute("lock table events in share mode")  // inserts wait
        let harness = app!
        /// Whether `count` inserts wait for the lock.
        func waiting(_ count: Int) async throws -> Bool {
            try await waitUntil(20) {
                try harness.owner().query(
                    """
                    select count(*) from pg_stat_activity
                    where datname = current_database() and wait_event_type = 'Lock' and query ilike '%insert%'
                    """)[0].decode(Int64.self, column: 0) == count
            }
        }

        // This user's push of ~500 KB, read whole, waits for the database holding its body.
        let held = try pushBody(events: 8, size: 60_000)
        let first = try open()
        defer { close(first) }
        send(first, head("POST", "/sync/v1/events", length: held.utf8.count, bearer: token) + held)
        let blocked = try await waiting(1)
        XCTAssertTrue(blocked, "the push never reached the database")
        XCTAssertEqual(server.bufferedInputBytes(of: mine), held.utf8.count, "read whole, handed over, still held")

        // Their next large push would take them past their share: refused from its head,
        // though the budget has room for it, in the route's shape.
        let next = try pushBody(events: 4, size: 50_000)  // ~200 KB
        for (path, extra) in [("/sync/v1/events", [:]), ("/rest/v1/events", ["Prefer": "return=minimal"])] {
            let socket = try open()
            defer { close(socket) }
            send(socket, head("POST", path, length: next.utf8.count, bearer: token, extra))
            let refused = try answer(socket)
            XCTAssertEqual(refused.status, 503, path)
            XCTAssertEqual(refused.json["code"] as? String, "server_busy", path)
            XCTAssertEqual(refused.headers["retry-after"], "1", path)
            XCTAssertEqual(refused.headers["connection"], "close", path)
            XCTAssertTrue(closes(socket), "the body was never read (\(path))")
        }
        XCTAssertEqual(server.bufferedInputBytes, held.utf8.count, "nothing more held for them")

        // Another user's push of the same size is read and handed over: it waits for the lock too.
        let another = try open()
        defer { close(another) }
        send(another, head("POST", "/sync/v1/events", length: next.utf8.count, bearer: other) + next)
        let bothWaiting = try await waiting(2)
        XCTAssertTrue(bothWaiting, "the other user's push never reached the database")
        XCTAssertEqual(server.bufferedInputBytes(of: theirs), next.utf8.count)
        XCTAssertEqual(server.bufferedInputBytes, held.utf8.count + next.utf8.count)

        let refusedPerClient = try await app.metric(#"trunk_sync_http_bodies_refused_total{limit="per_client"}"#)
        XCTAssertEqual(refusedPerClient, 2)
        let refusedTotal = try await app.metric(#"trunk_sync_http_bodies_refused_total{limit="total"}"#)
        XCTAssertEqual(refusedTotal, 0)

        try blocker.execute("rollback")
        let answered = try answer(first)
        XCTAssertEqual(answered.status, 200, String(decoding: answered.body.prefix(300), as: UTF8.self))
        let theirsAnswered = try answer(another)
        XCTAssertEqual(theirsAnswered.status, 200, String(decoding: theirsAnswered.body.prefix(300), as: UTF8.self))
        let released = await waitUntil(10) {
            server.bufferedInputBytes == 0 && server.bufferedInputBytes(of: mine) == 0
                && server.bufferedInputBytes(of: theirs) == 0
        }
        XCTAssertTrue(released, "still held after the answers: \(server.bufferedInputBytes)")
        XCTAssertEqual(try storedEvents(), 12)

        // With their push answered, the same large push of theirs goes through.
        let again = try await app.request("POST", "/sync/v1/events", rawBody: next, bearer: token)
        XCTAssertEqual(again.status, 200, String(decoding: again.body.prefix(300), as: UTF8.self))
        XCTAssertEqual(try storedEvents(), 16)
    }

    func testBodiesOfRoutesThatOnlyRefuseThemAreReadAndDroppedNeverHeld() async throws {
        try await start()
        let server = app.server
        // No token needed to reach them: each takes a body as large as an insert, to refuse it.
        for (method, path, code) in [
            ("POST", "/rest/v1/no_such_table", "PGRST205"), ("PATCH", "/rest/v1/events", "PGRST105"),
            ("DELETE", "/rest/v1/events", "PGRST105"),
        ] {
            let socket = try open()
            defer { close(socket) }
            send(socket, head(method, path, length: Self.holderSize, ["Expect": "100-continue"]))
            // The head is admitted (a held body would be counted by now): the body is welcome.
            XCTAssertEqual(try answer(socket).status, 100, "\(method) \(path)")
            send(socket, "[")
            XCTAssertEqual(server.bufferedInputBytes, 0, "\(method) \(path): nothing held while the body arrives")
            send(socket, String(repeating: " ", count: Self.holderSize - 1))
            let refused = try answer(socket)
            XCTAssertEqual(refused.json["code"] as? String, code, "\(method) \(path)")
            XCTAssertNotEqual(refused.headers["connection"], "close", "the body was read: the connection stays usable")
            send(socket, head("GET", "/rest/v1/events?select=seq", bearer: token))
            XCTAssertEqual(try answer(socket).status, 200)
        }
        let refusedTotal = try await app.metric(#"trunk_sync_http_bodies_refused_total{limit="total"}"#)
        XCTAssertEqual(refusedTotal, 0)
    }

    func testTheCounterReturnsToZeroHoweverABodyEnds() async throws {
        try await start(bodyTimeout: 2)
        let server = app.server
        // Completed: handed to the push's handler, which answers (a malformed body: 400).
        let completed = try await holder()
        send(completed, String(repeating: " ", count: Self.holderSize - 4))
        let answered = try answer(completed)
        XCTAssertEqual(answered.status, 400)
        close(completed)
        XCTAssertEqual(server.bufferedInputBytes, 0)

        // Timed out: the body does not arrive within TRUNK_SYNC_HTTP_BODY_TIMEOUT (2 s).
        let slow = try await holder()
        XCTAssertEqual(try answer(slow).status, 408)
        close(slow)
        var drained = await waitUntil(10) { server.bufferedInputBytes == 0 }
        XCTAssertTrue(drained, "408: still held \(server.bufferedInputBytes)")

        // Reset by the client mid-body.
        let reset = try await holder()
        var option = linger(l_onoff: 1, l_linger: 0)
        setsockopt(reset, SOL_SOCKET, SO_LINGER, &option, socklen_t(MemoryLayout<linger>.size))
        close(reset)
        drained = await waitUntil(10) { server.bufferedInputBytes == 0 }
        XCTAssertTrue(drained, "reset: still held \(server.bufferedInputBytes)")

        // Malformed framing after it was counted: 400, closed.
        let malformed = try open()
        defer { close(malformed) }
        send(malformed, head("POST", "/sync/v1/events", chunked: true, bearer: token))
        send(malformed, "20000\r\n" + String(repeating: " ", count: 0x20000) + "\r\n")
        let counted = await waitUntil(10) { server.bufferedInputBytes > 0 }
        XCTAssertTrue(counted)
        send(malformed, "not-a-size\r\n")
        XCTAssertEqual(try answer(malformed).status, 400)
        drained = await waitUntil(10) { server.bufferedInputBytes == 0 }
        XCTAssertTrue(drained, "400: still held \(server.bufferedInputBytes)")
        XCTAssertEqual(try storedEvents(), 0)
    }
}
