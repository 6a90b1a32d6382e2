import Foundation
import Logging
import Synchronization
import XCTest

@testable import HTTPServer

/// The budget for answers held in output buffers (output `ByteBudget`,
/// `HTTPServerConfiguration.maxBufferedOutput`): its arithmetic, and through a real server
/// on loopback sockets that large answers over it are refused with the responder's `503`
/// while small ones still go, and that what a connection holds is given back however it
/// ends (read, reset, write timeout, shutdown).
final class OutputBudgetTests: XCTestCase {
    // MARK: - The arithmetic

    func testLargeAnswersAreCountedWhileTheyFit() {
        // Small answers never reach `admit` (`EventLoop.queueAnswer` counts them only if they
        // stay unsent): the server-level tests below hold that rule.
        let budget = ByteBudget(limit: 1_000_000)
        XCTAssertTrue(budget.admit(600_000))
        XCTAssertEqual(budget.heldBytes, 600_000)
        XCTAssertFalse(budget.admit(400_001))
        XCTAssertEqual(budget.heldBytes, 600_000, "a refused answer counts nothing")
        XCTAssertTrue(budget.admit(400_000), "up to the limit itself")
        XCTAssertEqual(budget.heldBytes, 1_000_000)
        XCTAssertTrue(budget.isFull)
        budget.adjust(by: 50_000)  // small answers left unsent may take it past the limit
        XCTAssertFalse(budget.admit(ByteBudget.smallAnswer + 1))
        budget.adjust(by: -1_050_000)
        XCTAssertEqual(budget.heldBytes, 0)
        XCTAssertFalse(budget.isFull)
        XCTAssertFalse(ByteBudget(limit: 100_000).admit(100_001), "an answer larger than the budget never fits")
    }

    // MARK: - Through a server

    /// 12 MiB: more than the kernel takes into a loopback socket whose client reads nothing
    /// (its send buffer grows to a few MiB at most, `tcp_wmem`), so most of it stays in the
    /// connection's output.
    static let largeSize = 12 * 1024 * 1024
    static let large = [UInt8](repeating: UInt8(ascii: "x"), count: largeSize)
    /// Room for one large answer, not for two.
    static let limit = 16 * 1024 * 1024

    final class Probe: Sendable {
        let refused = Atomic<Int>(0)
        let warnings = Mutex<[String]>([])
        let gate = MultiLoopTests.Gate()
    }

    struct Responder: HTTPResponder {
        let probe: Probe

        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> { .readBody(bodyLimit: 1024, 0) }

        func respond(to request: HTTPRequest, context: Int) -> Reply<Int> {
            switch request.path {
            case "/large": return .now(HTTPResponse(status: .ok, body: OutputBudgetTests.large), 0)
            case "/large-later":
                return .later { (HTTPResponse(status: .ok, body: OutputBudgetTests.large), 0) }
            case "/200k":
                return .now(HTTPResponse(status: .ok, body: [UInt8](repeating: 0x7A, count: 200 * 1024)), 0)
            case "/hold":
                let gate = probe.gate
                return .later {
                    await gate.wait()
                    return (HTTPResponse(status: .ok, body: Array("held".utf8)), 0)
                }
            case "/medium":
                return .now(HTTPResponse(status: .ok, body: [UInt8](repeating: 0x79, count: 60 * 1024)), 0)
            default: return .now(HTTPResponse(status: .ok, body: Array("ok".utf8)), 0)
            }
        }

        func complete(_ response: inout HTTPResponse, context: Int) {}
        func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse {
            HTTPResponse(status: HTTPStatus(error.status))
        }
        func refuseConnection() -> HTTPResponse { HTTPResponse(status: .serviceUnavailable) }
        func refuseAnswer(context: Int, over limit: BudgetLimit) -> HTTPResponse {
            probe.refused.add(1, ordering: .relaxed)
            return HTTPResponse(status: .serviceUnavailable, headers: ["Retry-After": "1"], body: Array("busy".utf8))
        }
    }

    /// Keeps the loop's warnings.
    struct WarningLog: LogHandler {
        let probe: Probe
        var logLevel: Logger.Level = .trace
        var metadata: Logger.Metadata = [:]
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            guard event.level == .warning else { return }
            let fields = (event.metadata ?? [:]).map { "\($0.key)=\($0.value)" }.sorted().joined(separator: " ")
            probe.warnings.withLock { $0.append("\(event.message) \(fields)") }
        }
    }

    private var server: HTTPServer<Responder>?
    private let probe = Probe()

    /// A server of two loops (one budget for both) with `limit` for its output.
    private func start(
        writeTimeout: Duration = .seconds(30), shutdownTimeout: Duration = .seconds(5)
    ) throws -> HTTPServer<Responder> {
        let started = try HTTPServer.started(
            .budgetTest(limit: Self.limit, writeTimeout: writeTimeout, shutdownTimeout: shutdownTimeout),
            Responder(probe: probe), warningsTo: probe)
        server = started
        return started
    }

    override func tearDown() async throws {
        server?.shutdown()
        await server?.waitUntilStopped()
    }

    /// A client that asks for `path` and reads nothing (a small receive buffer), once the
    /// server holds part of its answer.
    private func nonReader(_ server: HTTPServer<Responder>, _ path: String = "/large") throws -> TestClient {
        let client = try TestClient(port: server.port, receiveBuffer: 4096)
        try client.send("GET \(path) HTTP/1.1\r\nHost: x\r\n\r\n")
        try eventually { server.bufferedOutputBytes > 0 }
        return client
    }

    func testLargeAnswerOverTheBudgetGets503WhileSmallOnesGoUntilTheNonReaderLeaves() throws {
        let server = try start()
        let nonReader = try nonReader(server)
        let held = server.bufferedOutputBytes
        XCTAssertLessThanOrEqual(held, Self.largeSize + 1024, "at most the answer and its head")
        XCTAssertGreaterThan(held + Self.largeSize, Self.limit, "the kernel took so much that a second one fits")

        let client = try TestClient(port: server.port)
        for path in ["/large", "/large-later"] {
            try client.send("GET \(path) HTTP/1.1\r\nHost: x\r\n\r\n")
            let refused = try client.readResponse()
            XCTAssertEqual(refused.status, 503, path)
            XCTAssertEqual(refused.body, "busy", path)
        }
        XCTAssertEqual(probe.refused.load(ordering: .relaxed), 2)
        try client.send("HEAD /large HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = try client.readHead()
        XCTAssertTrue(head.hasPrefix("HTTP/1.1 200"), "a HEAD holds no body: \(head)")
        XCTAssertTrue(head.contains("Content-Length: \(Self.largeSize)\r\n"), head)
        try client.send("POST /large HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        let changed = try client.readResponse()
        XCTAssertEqual(changed.status, 200, "an answer to a request that may have changed something is never refused")
        XCTAssertEqual(changed.body.utf8.count, Self.largeSize)
        XCTAssertEqual(probe.refused.load(ordering: .relaxed), 2)
        try client.send("GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 200, "small answers always go, on the same connection")
        XCTAssertLessThanOrEqual(server.bufferedOutputBytes, held, "refused and sent answers hold nothing")
        try eventually { probe.warnings.withLock { $0.contains { $0.hasPrefix("answers refused") } } }
        let warning = probe.warnings.withLock { $0.first { $0.hasPrefix("answers refused") } } ?? ""
        XCTAssertTrue(warning.contains("limit_bytes=\(Self.limit)"), warning)

        nonReader.close()  // unread bytes in its buffer: the kernel resets the connection
        try eventually { server.bufferedOutputBytes == 0 }
        try client.send("GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        let answer = try client.readResponse()
        XCTAssertEqual(answer.status, 200)
        XCTAssertEqual(answer.body.utf8.count, Self.largeSize)
        try eventually { server.bufferedOutputBytes == 0 }
    }

    func testAClientThatReadsItsAnswerGivesItsBytesBack() throws {
        let server = try start()
        let client = try nonReader(server)
        let answer = try client.readResponse()
        XCTAssertEqual(answer.body.utf8.count, Self.largeSize)
        try eventually { server.bufferedOutputBytes == 0 }
    }

    func testTheWriteTimeoutGivesTheBytesBack() throws {
        let server = try start(writeTimeout: .seconds(1))
        let client = try nonReader(server)
        try eventually { server.bufferedOutputBytes == 0 }
        XCTAssertTrue(try client.waitForClose(), "the server dropped the client that did not read")
    }

    func testShutdownGivesTheBytesBack() async throws {
        // Shutdown waits for the answer until its deadline, then resets the connection.
        let server = try start(shutdownTimeout: .milliseconds(500))
        let client = try nonReader(server)
        server.shutdown()
        await server.waitUntilStopped()
        self.server = nil
        XCTAssertEqual(server.bufferedOutputBytes, 0)
        client.close()
    }

    func testASentAnswersBufferIsFreedNotKeptForTheNextRequest() async throws {
        let server = try start()
        // The next request is already there when the answer is sent: the connection goes from
        // writing to handling a request that waits (a long-poll), never idle in between.
        let client = try TestClient(port: server.port)
        try client.send("GET /200k HTTP/1.1\r\nHost: x\r\n\r\nGET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        let answer = try client.readResponse()
        XCTAssertEqual(answer.body.utf8.count, 200 * 1024)
        try eventually { server.statistics.inFlight == 1 }
        let kept = await server.outputCapacity()
        XCTAssertLessThan(kept, 100 * 1024, "the 200 KiB answer's buffer is freed once sent")
        XCTAssertEqual(server.bufferedOutputBytes, 0)
        probe.gate.open()
        XCTAssertEqual(try client.readResponse().body, "held")
    }

    func testSmallAnswersLeftUnsentAreCountedNeverRefused() throws {
        let server = try start()
        // Pipelined 60 KiB answers nobody reads: each is queued once the one before is sent,
        // until the socket is full; what is left of the last is held, and counted.
        let client = try TestClient(port: server.port, receiveBuffer: 4096)
        try client.send(String(repeating: "GET /medium HTTP/1.1\r\nHost: x\r\n\r\n", count: 200))
        try eventually { server.bufferedOutputBytes > 0 }
        XCTAssertLessThanOrEqual(server.bufferedOutputBytes, 61 * 1024)
        XCTAssertEqual(probe.refused.load(ordering: .relaxed), 0)
        client.close()
        try eventually { server.bufferedOutputBytes == 0 }
    }
}

extension HTTPServer {
    /// A started server answering with `responder` whose loops' warnings go to `probe`.
    static func started(
        _ configuration: HTTPServerConfiguration, _ responder: Responder, warningsTo probe: OutputBudgetTests.Probe
    ) throws -> HTTPServer {
        let server = HTTPServer(
            configuration: configuration, responder: responder,
            logger: Logger(label: "test") { _ in OutputBudgetTests.WarningLog(probe: probe) })
        try server.start()
        return server
    }
}

extension HTTPServerConfiguration {
    /// A server of two loops (one output budget for both) on a free port, holding at most
    /// `limit` bytes of output for clients that do not read.
    static func budgetTest(limit: Int, writeTimeout: Duration, shutdownTimeout: Duration) -> HTTPServerConfiguration {
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        configuration.loops = 2
        configuration.maxBufferedOutput = limit
        configuration.writeTimeout = writeTimeout
        configuration.shutdownTimeout = shutdownTimeout
        return configuration
    }
}
