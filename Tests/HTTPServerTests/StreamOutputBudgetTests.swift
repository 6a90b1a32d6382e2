import Foundation
import Logging
import Synchronization
import XCTest

@testable import HTTPServer

/// Streamed bodies and WebSocket messages in the server's total for output held for clients
/// (the output `ByteBudget`, `HTTPServerConfiguration.maxBufferedOutput`), through a real server on
/// loopback sockets: what their writers hold is counted, a body or socket whose client is
/// behind gets nothing more while the total is full (its own buffer has room: 64 MiB), one
/// that keeps up goes on, a waiting `write` goes on once its client reads, and every end
/// (the body's, a reset, the write timeout, shutdown, a close frame either way) gives the
/// bytes back.
final class StreamOutputBudgetTests: XCTestCase {
    /// The server's total: far less than one held write.
    static let limit = 1024 * 1024
    /// Every body's and socket's own buffer: never what refuses here.
    static let ownBuffer = 64 * 1024 * 1024
    /// A write a client that reads nothing cannot take (the kernel takes a few MiB at most,
    /// `tcp_wmem`): held until it reads.
    static let heldSize = 12 * 1024 * 1024

    final class Probe: Sendable {
        let writers = Mutex<[HTTPBodyWriter]>([])
        let sockets = Mutex<[WebSocket]>([])

        func writer(_ index: Int) -> HTTPBodyWriter { writers.withLock { $0[index] } }
        func socket(_ index: Int) -> WebSocket { sockets.withLock { $0[index] } }
    }

    struct Responder: HTTPResponder {
        let probe: Probe

        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> { .readBody(bodyLimit: 1024, 0) }

        func respond(to request: HTTPRequest, context: Int) -> Reply<Int> {
            let probe = self.probe
            if request.path == "/ws", case .success(let accept) = WebSocketHandshake.accept(request) {
                var settings = WebSocketSettings()
                settings.outputBufferLimit = StreamOutputBudgetTests.ownBuffer
                return .now(
                    .webSocket(accept: accept, settings: settings) { socket in
                        probe.sockets.withLock { $0.append(socket) }
                        while await socket.receive() != nil {}
                    }, 0)
            }
            // A body the test writes (the stream's holder): ended by the test, or by the
            // server at shutdown.
            return .now(
                .streamed(.ok, bufferLimit: StreamOutputBudgetTests.ownBuffer, shutdown: .cancel) { writer in
                    writer.detach { reason in if reason == .shutdown { writer.finish() } }
                    probe.writers.withLock { $0.append(writer) }
                }, 0)
        }

        func complete(_ response: inout HTTPResponse, context: Int) {}
        func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse {
            HTTPResponse(status: HTTPStatus(error.status))
        }
        func refuseConnection() -> HTTPResponse { HTTPResponse(status: .serviceUnavailable) }
        func refuseAnswer(context: Int, over limit: BudgetLimit) -> HTTPResponse {
            HTTPResponse(status: .serviceUnavailable)
        }
    }

    private var server: HTTPServer<Responder>?
    private let probe = Probe()

    override func tearDown() async throws {
        server?.shutdown()
        await server?.waitUntilStopped()
    }

    /// A server of two loops (one total for both) holding at most `limit`.
    private func start(
        writeTimeout: Duration = .seconds(30), shutdownTimeout: Duration = .seconds(5)
    ) throws -> HTTPServer<Responder> {
        let started = HTTPServer(
            configuration: .budgetTest(
                limit: Self.limit, writeTimeout: writeTimeout, shutdownTimeout: shutdownTimeout),
            responder: Responder(probe: probe), logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() })
        try started.start()
        server = started
        return started
    }

    /// A stream's client (one that reads nothing: a small receive buffer, unless `reading`),
    /// once its body's writer is there; the writer is the probe's `index`th.
    private func stream(
        _ server: HTTPServer<Responder>, _ index: Int, reading: Bool = false
    ) throws -> (TestClient, HTTPBodyWriter) {
        let client = try TestClient(port: server.port, receiveBuffer: reading ? nil : 4096)
        try client.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertTrue(try client.readHead().hasPrefix("HTTP/1.1 200"))
        try eventually { probe.writers.withLock { $0.count } > index }
        return (client, probe.writer(index))
    }

    /// A stream whose client reads nothing and whose writer holds `heldSize` bytes it has not
    /// read: behind, and the total full.
    private func heldStream(_ server: HTTPServer<Responder>, _ index: Int) throws -> (TestClient, HTTPBodyWriter) {
        let (client, writer) = try stream(server, index)
        XCTAssertEqual(writer.writeIfRoom([UInt8](repeating: UInt8(ascii: "x"), count: Self.heldSize)), .written)
        try eventually { server.bufferedOutputBytes >= Self.heldSize }
        return (client, writer)
    }

    func testAStreamBehindWhileTheTotalIsFullGetsNothingMoreWhileOneThatReadsGoesOn() async throws {
        let server = try start()
        let (nonReader, held) = try heldStream(server, 0)
        // Its own 64 MiB buffer has room; the total has none, and its client is behind (once
        // the loop has given its socket the bytes).
        try eventually { held.writeIfRoom([UInt8(ascii: "y")]) == .full }

        let (reader, readers) = try stream(server, 1, reading: true)
        XCTAssertEqual(readers.writeIfRoom(Array("live".utf8)), .written, "a stream that keeps up is not held back")
        XCTAssertEqual(try reader.readChunk(), "live")

        // A producer writing at its client's pace (an export) waits rather than fails (16 MiB:
        // more than the kernel takes, less than its own buffer), and finishes once its client
        // reads.
        let (lateReader, export) = try stream(server, 2)
        let piece = [UInt8](repeating: UInt8(ascii: "e"), count: 64 * 1024)
        let exporting = Task.detached {  // not on the test's actor, which waits below
            for _ in 0..<256 { try await export.write(piece) }
            export.finish()
        }
        try eventually { export.hasWaitingWrite }
        var received = 0
        while let chunk = try lateReader.readChunk() { received += chunk.utf8.count }
        try await exporting.value
        XCTAssertEqual(received, 256 * piece.count, "the whole body, read late")

        nonReader.close()  // unread bytes: a reset
        readers.finish()
        XCTAssertEqual(try reader.readChunk(), nil)
        try eventually { server.bufferedOutputBytes == 0 }
        XCTAssertEqual(server.streamedBodyCount, 0)
    }

    func testEveryEndOfAStreamGivesItsBytesBack() async throws {
        let server = try start(writeTimeout: .seconds(2), shutdownTimeout: .milliseconds(500))
        // The body ends and its client reads it all.
        let (client, writer) = try heldStream(server, 0)
        writer.finish()
        var received = 0
        while let chunk = try client.readChunk() { received += chunk.utf8.count }
        XCTAssertEqual(received, Self.heldSize)
        try eventually { server.bufferedOutputBytes == 0 }

        try await resetTimeoutAndShutdownGiveTheBytesBack(server, from: 1) { try heldStream(server, $0).0 }
    }

    /// What the clients `held` opens (the `index`th of the probe's bodies or sockets, from
    /// `first`) hold, bytes they do not read, is given back when the client resets its
    /// connection, when the write timeout drops it (the server's is short), and at shutdown.
    private func resetTimeoutAndShutdownGiveTheBytesBack(
        _ server: HTTPServer<Responder>, from first: Int, _ held: (Int) throws -> TestClient
    ) async throws {
        let resetting = try held(first)
        resetting.close()
        try eventually { server.bufferedOutputBytes == 0 }

        let stalled = try held(first + 1)
        try eventually { server.bufferedOutputBytes == 0 }
        XCTAssertTrue(try stalled.waitForClose(), "dropped by the write timeout")

        // A stream is ended, a WebSocket closed (1001); its client reads nothing; the deadline
        // resets it.
        let atShutdown = try held(first + 2)
        server.shutdown()
        await server.waitUntilStopped()
        self.server = nil
        XCTAssertEqual(server.bufferedOutputBytes, 0)
        atShutdown.close()
    }

    // MARK: - WebSocket

    /// A WebSocket's client that reads nothing past the `101`, once its session is there (the
    /// probe's `index`th socket).
    private func webSocket(_ server: HTTPServer<Responder>, _ index: Int) throws -> (TestClient, WebSocket) {
        let client = try TestClient(port: server.port, receiveBuffer: 4096)
        try client.send(
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        XCTAssertTrue(try client.readHead().hasPrefix("HTTP/1.1 101"))
        try eventually { probe.sockets.withLock { $0.count } > index }
        return (client, probe.socket(index))
    }

    /// A WebSocket whose client reads nothing and that holds a `heldSize` message.
    private func heldWebSocket(_ server: HTTPServer<Responder>, _ index: Int) throws -> (TestClient, WebSocket) {
        let (client, socket) = try webSocket(server, index)
        XCTAssertEqual(socket.send(text: [UInt8](repeating: UInt8(ascii: "x"), count: Self.heldSize)), .written)
        try eventually { server.bufferedOutputBytes >= Self.heldSize }
        return (client, socket)
    }

    /// The client's close frame (masked), code 1000.
    private static let closeFrame: [UInt8] = [0x88, 0x82, 1, 2, 3, 4, 0x03 ^ 1, 0xE8 ^ 2]
    /// The header of a `heldSize` text frame from the server: opcode, 127, 64-bit length.
    private static let heldHeader = 10

    func testAWebSocketBehindWhileTheTotalIsFullIsRefusedAndEveryEndGivesItsBytesBack() async throws {
        let server = try start(writeTimeout: .seconds(2), shutdownTimeout: .milliseconds(500))
        let (slow, socket) = try heldWebSocket(server, 0)
        try eventually { socket.send(text: Array("later".utf8)) == .full }
        // The session closes it, as Realtime does (1013): the close frame follows the message
        // (and any message queued before the loop gave the socket the large one);
        // once the client has read both, nothing is held.
        socket.close(.tryAgainLater, reason: "slow")
        let received = try slow.readUntilClose()
        XCTAssertGreaterThanOrEqual(received.count, Self.heldHeader + Self.heldSize + 8, "and what went before")
        XCTAssertEqual(Array(received.suffix(8)), [0x88, 6, 0x03, 0xF5] + Array("slow".utf8))
        try eventually { server.bufferedOutputBytes == 0 }
        slow.close()

        // The client reads the message, then closes.
        let (closing, _) = try heldWebSocket(server, 1)
        var read = 0
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while read < Self.heldHeader + Self.heldSize {
            let count = recv(closing.fd, &buffer, buffer.count, 0)
            guard count > 0 else { return XCTFail("closed after \(read) bytes") }
            read += count
        }
        _ = Self.closeFrame.withUnsafeBytes { send(closing.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        XCTAssertTrue(try closing.waitForClose())
        try eventually { server.bufferedOutputBytes == 0 }

        try await resetTimeoutAndShutdownGiveTheBytesBack(server, from: 2) { try heldWebSocket(server, $0).0 }
    }
}
