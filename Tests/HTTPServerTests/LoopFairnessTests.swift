import Foundation
import Logging
import Synchronization
import XCTest

@testable import HTTPServer

/// One connection cannot keep its event loop to itself: a client that pipelines requests
/// the loop answers at once (`/healthz`, a `404`), as fast as it reads the answers, yields
/// to the loop's other connections after a turn (`EventLoop.driveRoundsPerTurn`).
final class LoopFairnessTests: XCTestCase {
    /// A number shared across threads.
    final class Cell: Sendable {
        private let cell: Atomic<Int>
        init(_ value: Int) { cell = Atomic(value) }
        var value: Int { get { cell.load(ordering: .relaxed) } }
        func set(_ value: Int) { cell.store(value, ordering: .relaxed) }
        func add() { cell.wrappingAdd(1, ordering: .relaxed) }
    }

    /// Answers on the loop, at once. `/hold` keeps the loop (the test's stand-in for a busy
    /// moment) until the test releases it; `/probe` notes how many `/flood` requests were
    /// answered before it.
    struct Responder: HTTPResponder {
        let holding = Cell(0)
        let released = Cell(0)
        let flooded = Cell(0)
        let floodedBeforeProbe = Cell(-1)

        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> { .readBody(bodyLimit: 16, 0) }

        func respond(to request: HTTPRequest, context: Int) -> Reply<Int> {
            switch request.path {
            case "/hold":
                holding.set(1)
                // Bounded, so a test that never releases fails instead of hanging.
                for _ in 0..<30_000 where released.value == 0 { usleep(1000) }
            case "/probe": floodedBeforeProbe.set(flooded.value)
            default: flooded.add()
            }
            return .now(HTTPResponse(status: .ok, body: Array("ok".utf8)), 0)
        }

        func complete(_ response: inout HTTPResponse, context: Int) {}
        func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse {
            HTTPResponse(status: HTTPStatus(error.status))
        }
        func refuseConnection() -> HTTPResponse { HTTPResponse(status: .serviceUnavailable) }
    }

    private var server: HTTPServer<Responder>?

    override func tearDown() async throws {
        server?.shutdown()
        await server?.waitUntilStopped()
    }

    func testPipelinedRequestsAnsweredOnTheLoopDoNotStarveAnotherConnection() throws {
        let responder = Responder()
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        configuration.loops = 1  // the flood and the probe share it
        configuration.shutdownTimeout = .seconds(5)
        let server = HTTPServer(configuration: configuration, responder: responder, logger: Logger(label: "test"))
        self.server = server
        try server.start()

        // Room for every answer, and a thread reading them: the loop is never held up by
        // its output.
        let flooder = try TestClient(port: server.port, receiveBuffer: 4 << 20)
        let fd = flooder.fd
        let reader = Thread {
            var buffer = [UInt8](repeating: 0, count: 1 << 20)
            while buffer.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, 0) }) > 0 {}
        }
        reader.start()
        defer { _ = shutdown(fd, Int32(SHUT_RDWR)) }
        try flooder.send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        try eventually { responder.holding.value == 1 }
        // While the loop is held: 1,500 pipelined requests (52 KB, within the socket's first
        // receive window), and another client's one request.
        let count = 1500
        try flooder.send(String(repeating: "GET /flood HTTP/1.1\r\nHost: x\r\n\r\n", count: count))
        let probe = try TestClient(port: server.port)
        try probe.send("GET /probe HTTP/1.1\r\nHost: x\r\n\r\n")
        responder.released.set(1)

        XCTAssertEqual(try probe.readResponse().status, 200)
        XCTAssertGreaterThanOrEqual(responder.floodedBeforeProbe.value, 0)
        // Without turns the loop answered every request the flooder had sent before it
        // looked at anything else.
        XCTAssertLessThan(
            responder.floodedBeforeProbe.value, count / 2,
            "the probe was answered after \(responder.floodedBeforeProbe.value) of the flooder's \(count) requests")
    }
}
