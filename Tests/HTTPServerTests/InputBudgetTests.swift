import Foundation
import Logging
import Synchronization
import XCTest

@testable import HTTPServer

/// The budget for request bodies being read (the input `ByteBudget`,
/// `HTTPServerConfiguration.maxBufferedInput`): through a real server on
/// loopback sockets that a large body over it is refused with the responder's `503` from
/// its head (before a byte of it is sent) or, chunked, as it grows past it, while small
/// bodies still pass, and that what a request holds is given back however it ends (handed
/// over, aborted, timed out, malformed, shut down); and that one owner (an account the
/// responder names, else a client address) holds at most its share of it
/// (`HTTPServerConfiguration.maxBufferedInputPerClient`), given back on all the same paths.
final class InputBudgetTests: XCTestCase {
    // The total's arithmetic is ByteBudget's, tested in OutputBudgetTests.

    func testASharePassesUpToItsLimitPerOwnerAndForgetsOwnersAtZero() {
        let shares = Shares(limit: 100)
        let first = ShareKey.account(Self.account(1))
        let second = ShareKey.account(Self.account(2))
        XCTAssertTrue(shares.admit(60, for: first))
        XCTAssertFalse(shares.admit(41, for: first), "past the limit: nothing counted")
        XCTAssertTrue(shares.admit(40, for: first))
        XCTAssertTrue(shares.admit(100, for: second), "each owner has its own")
        // An IPv6 client is its /64.
        XCTAssertTrue(shares.admit(70, for: .client(IPAddress("2001:db8::1")!)))
        XCTAssertEqual(shares.heldBytes(of: .client(IPAddress("2001:db8::ffff")!)), 70)
        XCTAssertFalse(shares.admit(31, for: .client(IPAddress("2001:db8::2")!)))
        XCTAssertEqual(shares.heldBytes(of: .client(IPAddress("2001:db8:0:1::1")!)), 0)
        XCTAssertEqual(shares.owners, 3)
        shares.release(60, of: first)
        XCTAssertEqual(shares.heldBytes(of: first), 40)
        shares.release(40, of: first)
        shares.release(100, of: second)
        shares.release(70, of: .client(IPAddress("2001:db8::3")!))
        XCTAssertEqual(shares.owners, 0, "an owner's entry goes with its last byte")
    }

    // MARK: - Through a server

    /// Room for one 800 KiB body, not for another 300 KiB.
    static let limit = 1024 * 1024
    static let holderSize = 800 * 1024

    final class Probe: Sendable {
        let refused = Atomic<Int>(0)
        /// The limit of each refusal, in order.
        let refusedOver = Mutex<[BudgetLimit]>([])
        let received = Mutex<[Int]>([])
        let warnings = Mutex<[String]>([])
        let gate = MultiLoopTests.Gate()
        let laterGate = MultiLoopTests.Gate()
    }

    struct Responder: HTTPResponder {
        let probe: Probe

        /// The context is the account the request names in `X-Account` (0: none).
        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> {
            .readBody(bodyLimit: 10 * 1024 * 1024, head.headers["x-account"].flatMap { Int($0) } ?? 0)
        }

        func shareKey(context: Int) -> ShareKey? {
            context == 0 ? nil : .account(InputBudgetTests.account(context))
        }

        func respond(to request: HTTPRequest, context: Int) -> Reply<Int> {
            probe.received.withLock { $0.append(request.body.count) }
            let size = Array("\(request.body.count)".utf8)
            if request.path == "/hold" || request.path == "/hold-later" {
                let gate = request.path == "/hold" ? probe.gate : probe.laterGate
                return .later {
                    await gate.wait()
                    return (HTTPResponse(status: .ok, body: size), 0)
                }
            }
            return .now(HTTPResponse(status: .ok, body: size), 0)
        }

        func complete(_ response: inout HTTPResponse, context: Int) {}
        func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse {
            HTTPResponse(status: HTTPStatus(error.status))
        }
        func refuseConnection() -> HTTPResponse { HTTPResponse(status: .serviceUnavailable) }
        func refuseBody(context: Int, over limit: BudgetLimit) -> HTTPResponse {
            probe.refused.add(1, ordering: .relaxed)
            probe.refusedOver.withLock { $0.append(limit) }
            return HTTPResponse(status: .serviceUnavailable, headers: ["Retry-After": "1"], body: Array("busy".utf8))
        }
    }

    private var server: HTTPServer<Responder>?
    private let probe = Probe()
    /// The loop's warnings.
    private let log = OutputBudgetTests.Probe()

    /// Account `number`'s id.
    static func account(_ number: Int) -> UUID {
        UUID(uuidString: String(format: "00000000-0000-0000-0000-%012d", number))!
    }

    /// A server of two loops (one budget for both) with `limit` for request bodies (and
    /// `perClient` for each owner's, whose default is larger than `limit`: no share).
    private func start(
        bodyTimeout: Duration = .seconds(30), shutdownTimeout: Duration = .seconds(5),
        perClient: Int = HTTPServerConfiguration().maxBufferedInputPerClient,
        trustedProxies: TrustedProxies = TrustedProxies()
    ) throws -> HTTPServer<Responder> {
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        configuration.loops = 2
        configuration.maxBufferedInput = Self.limit
        configuration.maxBufferedInputPerClient = perClient
        configuration.trustedProxies = trustedProxies
        configuration.bodyTimeout = bodyTimeout
        configuration.shutdownTimeout = shutdownTimeout
        let started = try HTTPServer.started(configuration, Responder(probe: probe), warningsTo: log)
        server = started
        return started
    }

    override func tearDown() async throws {
        server?.shutdown()
        await server?.waitUntilStopped()
    }

    private func head(_ path: String, length: Int, _ extra: String = "") -> String {
        "POST \(path) HTTP/1.1\r\nHost: x\r\nContent-Length: \(length)\r\n\(extra)\r\n"
    }

    /// A client that announced an 800 KiB body and sent a few bytes of it, once the server
    /// counts it.
    private func holder(
        _ server: HTTPServer<Responder>, path: String = "/upload", _ extra: String = ""
    ) throws -> TestClient {
        let client = try TestClient(port: server.port)
        try client.send(head(path, length: Self.holderSize, extra) + "abc")
        try eventually { server.bufferedInputBytes == Self.holderSize }
        return client
    }

    func testALargeBodyOverTheBudgetGets503FromItsHeadWhileSmallOnesPass() throws {
        let server = try start()
        let holder = try holder(server)

        // Only the head is sent: the answer comes without a byte of the body.
        let refused = try TestClient(port: server.port)
        try refused.send(head("/upload", length: 300 * 1024))
        let answer = try refused.readResponse()
        XCTAssertEqual(answer.status, 503)
        XCTAssertEqual(answer.body, "busy")
        XCTAssertTrue(try refused.waitForClose(), "the body was never read: the connection closes")
        // Expect: 100-continue gets the final answer instead of 100 Continue.
        let expecting = try TestClient(port: server.port)
        try expecting.send(head("/upload", length: 300 * 1024, "Expect: 100-continue\r\n"))
        XCTAssertEqual(try expecting.readResponse().status, 503)
        XCTAssertTrue(try expecting.waitForClose())
        XCTAssertEqual(probe.refused.load(ordering: .relaxed), 2)
        XCTAssertEqual(server.bufferedInputBytes, Self.holderSize, "a refused body counts nothing")
        try eventually { log.warnings.withLock { $0.contains { $0.hasPrefix("request bodies refused") } } }
        let warning = log.warnings.withLock { $0.first { $0.hasPrefix("request bodies refused") } } ?? ""
        XCTAssertTrue(warning.contains("limit_bytes=\(Self.limit)"), warning)

        // A small body always passes, and is not counted.
        let small = try TestClient(port: server.port)
        let smallBody = String(repeating: "s", count: ByteBudget.smallBody)
        try small.send(head("/upload", length: smallBody.utf8.count) + smallBody)
        XCTAssertEqual(try small.readResponse().body, "\(ByteBudget.smallBody)")
        try small.send(head("/upload", length: 5) + "hello")
        XCTAssertEqual(try small.readResponse().body, "5", "the connection stays usable")

        // The holder's body completes: handed over, it counts no more, and a large body fits.
        try holder.send(String(repeating: "h", count: Self.holderSize - 3))
        XCTAssertEqual(try holder.readResponse().body, "\(Self.holderSize)")
        try eventually { server.bufferedInputBytes == 0 }
        let large = String(repeating: "l", count: 300 * 1024)
        try small.send(head("/upload", length: large.utf8.count) + large)
        XCTAssertEqual(try small.readResponse().body, "\(300 * 1024)")
        try eventually { server.bufferedInputBytes == 0 }
    }

    func testAChunkedBodyThatGrowsPastTheBudgetIsCutOff() throws {
        let server = try start()
        let holder = try holder(server)

        // Small chunks pass until the body's buffer grows past what is left of the budget.
        let chunked = try chunkedUpload(server) {
            server.bufferedInputBytes == Self.holderSize && probe.refused.load(ordering: .relaxed) == 1
        }
        let answer = try chunked.readResponse()
        XCTAssertEqual(answer.status, 503)
        XCTAssertEqual(answer.body, "busy")
        XCTAssertEqual(probe.refused.load(ordering: .relaxed), 1)
        XCTAssertEqual(server.bufferedInputBytes, Self.holderSize, "the cut-off body gave its bytes back")
        XCTAssertEqual(probe.received.withLock { $0 }, [], "no request was handed over")

        // A chunked body that fits is counted as it grows and handed over whole.
        holder.close()
        try eventually { server.bufferedInputBytes == 0 }
        let fits = try TestClient(port: server.port)
        try fits.send("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        let chunk = String(repeating: "c", count: 16 * 1024)
        for _ in 0..<20 { try fits.send("4000\r\n\(chunk)\r\n") }
        try fits.send("0\r\n\r\n")
        XCTAssertEqual(try fits.readResponse().body, "\(20 * 16 * 1024)")
        try eventually { server.bufferedInputBytes == 0 }
    }

    func testHeldBytesComeBackHoweverTheRequestEnds() throws {
        let server = try start(bodyTimeout: .seconds(1))

        // Handed over: the body is in memory while its handler runs, and counts until it answers.
        let handled = try holder(server, path: "/hold")
        try handled.send(String(repeating: "h", count: Self.holderSize - 3))
        try eventually { server.statistics.inFlight == 1 }
        XCTAssertEqual(server.bufferedInputBytes, Self.holderSize)
        probe.gate.open()
        XCTAssertEqual(try handled.readResponse().body, "\(Self.holderSize)")
        try eventually { server.bufferedInputBytes == 0 }

        // Its client resets the connection while the handler runs: the handler still holds the body.
        let gone = try holder(server, path: "/hold-later")
        try gone.send(String(repeating: "h", count: Self.holderSize - 3))
        try eventually { server.statistics.inFlight == 1 }
        let open = server.statistics.connections
        var reset = linger(l_onoff: 1, l_linger: 0)  // a reset: the server drops the connection at once
        setsockopt(gone.fd, SOL_SOCKET, SO_LINGER, &reset, socklen_t(MemoryLayout<linger>.size))
        gone.close()
        try eventually { server.statistics.connections == open - 1 }
        XCTAssertEqual(server.bufferedInputBytes, Self.holderSize)
        probe.laterGate.open()
        try eventually { server.bufferedInputBytes == 0 }

        // The client gives up mid-body.
        let aborted = try holder(server)
        aborted.close()
        try eventually { server.bufferedInputBytes == 0 }

        // The body does not arrive before the body timeout: 408, closed.
        let slow = try holder(server)
        XCTAssertEqual(try slow.readResponse().status, 408)
        try eventually { server.bufferedInputBytes == 0 }

        // A chunked body turns malformed after it was counted.
        let malformed = try TestClient(port: server.port)
        try malformed.send("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        try malformed.send("30000\r\n" + String(repeating: "m", count: 0x30000) + "\r\n")
        try eventually { server.bufferedInputBytes > 0 }
        try malformed.send("zz\r\n")
        XCTAssertEqual(try malformed.readResponse().status, 400)
        try eventually { server.bufferedInputBytes == 0 }
    }

    func testShutdownGivesTheBytesBack() async throws {
        let server = try start(shutdownTimeout: .milliseconds(500), perClient: 900 * 1024)
        let client = try holder(server, "X-Account: 1\r\n")
        XCTAssertEqual(server.bufferedInputBytes(of: .account(Self.account(1))), Self.holderSize)
        server.shutdown()
        await server.waitUntilStopped()
        self.server = nil
        XCTAssertEqual(server.bufferedInputBytes, 0)
        XCTAssertEqual(server.bufferedInputBytes(of: .account(Self.account(1))), 0)
        XCTAssertEqual(server.inputShareOwners, 0)
        client.close()
    }

    // MARK: - One owner's share

    /// Sends the head of a body of `length` bytes (and `sent` of it) on a new connection.
    private func announce(
        _ server: HTTPServer<Responder>, length: Int, _ extra: String = "", sent: String = ""
    ) throws -> TestClient {
        let client = try TestClient(port: server.port)
        try client.send(head("/upload", length: length, extra) + sent)
        return client
    }

    /// A chunked upload (with `extra` fields) on a new connection, its body sent in 16 KiB
    /// chunks (1 MiB at most) until `done` or the server stops reading it.
    private func chunkedUpload(
        _ server: HTTPServer<Responder>, _ extra: String = "", until done: () -> Bool
    ) throws -> TestClient {
        let client = try TestClient(port: server.port)
        try client.send("POST /upload HTTP/1.1\r\nHost: x\r\n\(extra)Transfer-Encoding: chunked\r\n\r\n")
        try sendChunks(client, until: done)
        return client
    }

    /// Sends a chunked body's 16 KiB chunks (1 MiB at most) until `done` or the server stops
    /// reading it.
    private func sendChunks(_ client: TestClient, until done: () -> Bool) throws {
        let chunk = String(repeating: "c", count: 16 * 1024)
        for _ in 0..<64 {
            do {
                try client.send("4000\r\n\(chunk)\r\n")
            } catch {
                break  // the server stopped reading: the answer is waiting
            }
            if done() { break }
        }
    }

    /// The answer on `client` is the refusal of a body over `limit`, and the connection closes.
    private func assertRefused(
        _ client: TestClient, over limit: BudgetLimit, file: StaticString = #filePath, line: UInt = #line
    ) throws {
        let answer = try client.readResponse()
        XCTAssertEqual(answer.status, 503, file: file, line: line)
        XCTAssertEqual(answer.body, "busy", file: file, line: line)
        XCTAssertEqual(probe.refusedOver.withLock { $0.last }, limit, file: file, line: line)
        XCTAssertTrue(
            try client.waitForClose(), "the body was never read: the connection closes", file: file, line: line)
    }

    func testOneAccountsSecondLargeBodyIsRefusedWhileAnothersIsAdmitted() throws {
        let share = 400 * 1024
        let size = 300 * 1024
        let server = try start(perClient: share)
        let first = ShareKey.account(Self.account(1))

        // Account 1 announces 300 KiB and sends 3 bytes of it: counted in all and in its share.
        let holder = try announce(server, length: size, "X-Account: 1\r\n", sent: "abc")
        try eventually { server.bufferedInputBytes(of: first) == size }
        XCTAssertEqual(server.bufferedInputBytes, size)
        XCTAssertEqual(server.inputShareOwners, 1)

        // Its second would take it past its share: 503 from the head, though the budget has room.
        try assertRefused(try announce(server, length: size, "X-Account: 1\r\n"), over: .perClient)
        XCTAssertEqual(server.bufferedInputBytes, size, "a refused body counts nothing")
        XCTAssertEqual(server.bufferedInputBytes(of: first), size)
        try eventually {
            log.warnings.withLock { $0.contains { $0.hasPrefix("request bodies refused: their account") } }
        }
        let warning = log.warnings.withLock { $0.first { $0.hasPrefix("request bodies refused: their") } } ?? ""
        XCTAssertTrue(warning.contains("limit_bytes=\(share)"), warning)

        // Another account's body of the same size is read and handed over meanwhile.
        let other = try announce(server, length: size, "X-Account: 2\r\n", sent: String(repeating: "o", count: size))
        XCTAssertEqual(try other.readResponse().body, "\(size)")
        try eventually { server.bufferedInputBytes == size }
        XCTAssertEqual(server.bufferedInputBytes(of: .account(Self.account(2))), 0, "given back once answered")
        XCTAssertEqual(server.inputShareOwners, 1, "an owner's entry goes with its last byte")

        // Account 1's small bodies always pass, uncounted.
        let small = String(repeating: "s", count: ByteBudget.smallBody)
        let smallClient = try announce(server, length: small.utf8.count, "X-Account: 1\r\n", sent: small)
        XCTAssertEqual(try smallClient.readResponse().body, "\(ByteBudget.smallBody)")

        // A chunked body of account 1 is cut off once its buffer takes the account past its share.
        let chunked = try chunkedUpload(server, "X-Account: 1\r\n") { probe.refused.load(ordering: .relaxed) == 2 }
        try assertRefused(chunked, over: .perClient)
        XCTAssertEqual(server.bufferedInputBytes(of: first), size, "the cut-off body gave its growth back")
        XCTAssertEqual(server.bufferedInputBytes, size)

        // Once the holder goes, account 1's large body fits again.
        holder.close()
        try eventually { server.bufferedInputBytes == 0 && server.inputShareOwners == 0 }
        let again = try announce(server, length: size, "X-Account: 1\r\n", sent: String(repeating: "a", count: size))
        XCTAssertEqual(try again.readResponse().body, "\(size)")
        try eventually { server.bufferedInputBytes == 0 && server.inputShareOwners == 0 }
        XCTAssertEqual(probe.refusedOver.withLock { $0 }, [.perClient, .perClient])
    }

    func testWithoutAnAccountABodyCountsForItsClientAddress() throws {
        let share = 300 * 1024
        let size = 200 * 1024
        // Without trusted proxies: the peer, 127.0.0.1.
        let server = try start(perClient: share)
        let peer = ShareKey.client(IPAddress("127.0.0.1")!)
        let holder = try announce(server, length: size, sent: "abc")
        try eventually { server.bufferedInputBytes(of: peer) == size }
        try assertRefused(try announce(server, length: size), over: .perClient)
        // A forwarded client from a peer that is not a trusted proxy is the client's own
        // word: it names no other share.
        try assertRefused(try announce(server, length: size, "X-Forwarded-For: 192.0.2.9\r\n"), over: .perClient)
        XCTAssertEqual(server.bufferedInputBytes(of: .client(IPAddress("192.0.2.9")!)), 0)
        // An account's body from the same address counts for the account, not the address.
        let account = try announce(server, length: size, "X-Account: 3\r\n", sent: "abc")
        try eventually { server.bufferedInputBytes(of: .account(Self.account(3))) == size }
        XCTAssertEqual(server.bufferedInputBytes(of: peer), size)
        holder.close()
        account.close()
        try eventually { server.bufferedInputBytes == 0 && server.inputShareOwners == 0 }
    }

    /// Behind a trusted proxy: the client it forwarded (an IPv6 client by its /64), as for the
    /// rate limits, not the proxy its connections all come from.
    func testBehindATrustedProxyABodyCountsForTheClientItForwarded() throws {
        let share = 300 * 1024
        let size = 200 * 1024
        let server = try start(perClient: share, trustedProxies: TrustedProxies([IPNetwork("127.0.0.1")!]))
        let peer = ShareKey.client(IPAddress("127.0.0.1")!)
        var held: [TestClient] = []
        for client in ["192.0.2.1", "192.0.2.2", "2001:db8::1"] {
            held.append(try announce(server, length: size, "X-Forwarded-For: \(client)\r\n", sent: "abc"))
            let key = ShareKey.client(IPAddress(client)!)
            try eventually { server.bufferedInputBytes(of: key) == size }
        }
        XCTAssertEqual(server.bufferedInputBytes(of: peer), 0, "the proxy holds no share of its own")
        try assertRefused(try announce(server, length: size, "X-Forwarded-For: 192.0.2.1\r\n"), over: .perClient)
        // The same IPv4 client written IPv4-mapped is the same client.
        try assertRefused(
            try announce(server, length: size, "X-Forwarded-For: ::ffff:192.0.2.1\r\n"), over: .perClient)
        try assertRefused(try announce(server, length: size, "X-Forwarded-For: 2001:db8::2\r\n"), over: .perClient)
        XCTAssertEqual(server.bufferedInputBytes, 3 * size)
        XCTAssertEqual(server.inputShareOwners, 3)
        for client in held { client.close() }
        try eventually { server.bufferedInputBytes == 0 && server.inputShareOwners == 0 }
    }

    func testAnAccountsShareComesBackHoweverItsRequestEnds() throws {
        let server = try start(bodyTimeout: .seconds(1), perClient: 900 * 1024)
        let owner = ShareKey.account(Self.account(1))
        let account = "X-Account: 1\r\n"
        /// Account 1 holds nothing any more, and the table is empty.
        func released(_ path: String, file: StaticString = #filePath, line: UInt = #line) throws {
            try eventually { server.bufferedInputBytes == 0 && server.inputShareOwners == 0 }
            XCTAssertEqual(server.bufferedInputBytes(of: owner), 0, path, file: file, line: line)
        }

        // Answered at once (`.now`).
        let answered = try holder(server, account)
        XCTAssertEqual(server.bufferedInputBytes(of: owner), Self.holderSize)
        try answered.send(String(repeating: "h", count: Self.holderSize - 3))
        XCTAssertEqual(try answered.readResponse().body, "\(Self.holderSize)")
        try released("answered")

        // Handed over to a handler's task: held until the task returns.
        let handled = try holder(server, path: "/hold", account)
        try handled.send(String(repeating: "h", count: Self.holderSize - 3))
        try eventually { server.statistics.inFlight == 1 }
        XCTAssertEqual(server.bufferedInputBytes(of: owner), Self.holderSize, "the handler still holds the body")
        probe.gate.open()
        XCTAssertEqual(try handled.readResponse().body, "\(Self.holderSize)")
        try released("handler's task done")

        // Its client resets the connection while the handler runs: given back when the task ends.
        let gone = try holder(server, path: "/hold-later", account)
        try gone.send(String(repeating: "h", count: Self.holderSize - 3))
        try eventually { server.statistics.inFlight == 1 }
        let open = server.statistics.connections
        var reset = linger(l_onoff: 1, l_linger: 0)
        setsockopt(gone.fd, SOL_SOCKET, SO_LINGER, &reset, socklen_t(MemoryLayout<linger>.size))
        gone.close()
        try eventually { server.statistics.connections == open - 1 }
        XCTAssertEqual(server.bufferedInputBytes(of: owner), Self.holderSize)
        probe.laterGate.open()
        try released("reset during the handler")

        // The client gives up mid-body.
        let aborted = try holder(server, account)
        aborted.close()
        try released("closed mid-body")

        // The body does not arrive before the body timeout: 408, closed.
        let slow = try holder(server, account)
        XCTAssertEqual(try slow.readResponse().status, 408)
        try released("408")

        /// A chunked body of account 1 whose first 192 KiB are counted.
        func countedChunkedBody() throws -> TestClient {
            let client = try TestClient(port: server.port)
            try client.send("POST /upload HTTP/1.1\r\nHost: x\r\n\(account)Transfer-Encoding: chunked\r\n\r\n")
            try client.send("30000\r\n" + String(repeating: "m", count: 0x30000) + "\r\n")
            try eventually { server.bufferedInputBytes(of: owner) > 0 }
            return client
        }

        // A chunked body turns malformed after it was counted.
        let malformed = try countedChunkedBody()
        try malformed.send("zz\r\n")
        XCTAssertEqual(try malformed.readResponse().status, 400)
        try released("400")

        // A chunked body cut off as it grows: what it held before is dropped with it.
        let cut = try countedChunkedBody()
        try sendChunks(cut) { probe.refused.load(ordering: .relaxed) == 1 }
        XCTAssertEqual(try cut.readResponse().status, 503)
        try released("cut off")
    }
}
