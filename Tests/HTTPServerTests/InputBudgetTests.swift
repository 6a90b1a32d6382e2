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
/// over, aborted, timed out, malformed, shut down).
final class InputBudgetTests: XCTestCase {
    // The arithmetic is ByteBudget's, tested in OutputBudgetTests.

    // MARK: - Through a server

    /// Room for one 800 KiB body, not for another 300 KiB.
    static let limit = 1024 * 1024
    static let holderSize = 800 * 1024

    final class Probe: Sendable {
        let refused = Atomic<Int>(0)
        let received = Mutex<[Int]>([])
        let warnings = Mutex<[String]>([])
        let gate = MultiLoopTests.Gate()
        let laterGate = MultiLoopTests.Gate()
    }

    struct Responder: HTTPResponder {
        let probe: Probe

        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> {
            .readBody(bodyLimit: 10 * 1024 * 1024, 0)
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
        func refuseBody(context: Int) -> HTTPResponse {
            probe.refused.add(1, ordering: .relaxed)
            return HTTPResponse(status: .serviceUnavailable, headers: ["Retry-After": "1"], body: Array("busy".utf8))
        }
    }

    private var server: HTTPServer<Responder>?
    private let probe = Probe()
    /// The loop's warnings.
    private let log = OutputBudgetTests.Probe()

    /// A server of two loops (one budget for both) with `limit` for request bodies.
    private func start(
        bodyTimeout: Duration = .seconds(30), shutdownTimeout: Duration = .seconds(5)
    ) throws -> HTTPServer<Responder> {
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        configuration.loops = 2
        configuration.maxBufferedInput = Self.limit
        configuration.bodyTimeout = bodyTimeout
        configuration.shutdownTimeout = shutdownTimeout
        let log = self.log
        let started = HTTPServer(
            configuration: configuration, responder: Responder(probe: probe),
            logger: Logger(label: "test") { _ in OutputBudgetTests.WarningLog(probe: log) })
        try started.start()
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
    private func holder(_ server: HTTPServer<Responder>, path: String = "/upload") throws -> TestClient {
        let client = try TestClient(port: server.port)
        try client.send(head(path, length: Self.holderSize) + "abc")
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

        let chunked = try TestClient(port: server.port)
        try chunked.send("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        // Small chunks pass until the body's buffer grows past what is left of the budget.
        let chunk = String(repeating: "c", count: 16 * 1024)
        for _ in 0..<64 {
            do {
                try chunked.send("4000\r\n\(chunk)\r\n")
            } catch {
                break  // the server stopped reading: the answer is waiting
            }
            if server.bufferedInputBytes == Self.holderSize, probe.refused.load(ordering: .relaxed) == 1 { break }
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
        let server = try start(shutdownTimeout: .milliseconds(500))
        let client = try holder(server)
        server.shutdown()
        await server.waitUntilStopped()
        self.server = nil
        XCTAssertEqual(server.bufferedInputBytes, 0)
        client.close()
    }
}
