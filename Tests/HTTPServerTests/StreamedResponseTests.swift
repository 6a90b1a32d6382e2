import Foundation
import Logging
import Synchronization
import XCTest

@testable import HTTPServer

/// Streamed responses through a real `HTTPServer` on a loopback socket: framing, keep-alive
/// after the body, backpressure from a client that does not read, a producer that gives up,
/// a client that goes away, and shutdown.
final class StreamedResponseTests: XCTestCase {
    /// What the producers of the test routes saw.
    final class Probe: Sendable {
        let producerEnded = Atomic<Int>(0)
        let sawClosed = Atomic<Int>(0)
        let sawCancelled = Atomic<Int>(0)
        let written = Atomic<Int>(0)
        let mostBuffered = Atomic<Int>(0)
        /// A detached body's writer, once its producer returned, and what its `onClose` got.
        let detached = Mutex<HTTPBodyWriter?>(nil)
        let closeReasons = Mutex<[HTTPBodyWriter.CloseReason]>([])
        /// Writes made on the writer's own loop thread.
        let writesOnLoop = Atomic<Int>(0)
    }

    struct Responder: HTTPResponder {
        let probe: Probe

        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> { .readBody(bodyLimit: 1024, 0) }

        func respond(to request: HTTPRequest, context: Int) -> Reply<Int> {
            let probe = self.probe
            let n = Int(request.queryValue("n") ?? "") ?? 3
            switch request.path {
            case "/count":
                return .now(
                    .streamed(.ok, headers: ["Content-Type": "text/plain"]) { writer in
                        for index in 0..<n { try? await writer.write(Array("line \(index)\n".utf8)) }
                        writer.finish()
                    }, 0)
            case "/empty":
                return .now(.streamed(.ok) { writer in writer.finish() }, 0)
            case "/later":
                // From a task, as an application's handlers answer.
                return .later {
                    (
                        .streamed(.ok) { writer in
                            try? await writer.write(Array("from a task".utf8))
                            writer.finish()
                        }, 0
                    )
                }
            case "/flood":
                // Writes until the connection is gone, waiting for room: flat memory however
                // much it has to send and however slowly the client reads.
                return .now(
                    .streamed(.ok, bufferLimit: 64 * 1024) { writer in
                        let block = [UInt8](repeating: UInt8(ascii: "x"), count: 16 * 1024)
                        do {
                            while true {
                                try await writer.write(block)
                                probe.written.add(block.count, ordering: .relaxed)
                                probe.mostBuffered.max(writer.bufferedByteCount, ordering: .relaxed)
                            }
                        } catch {
                            probe.sawClosed.add(1, ordering: .relaxed)
                        }
                        probe.producerEnded.add(1, ordering: .relaxed)
                    }, 0)
            case "/on-loop":
                // Writes on its connection's loop thread, as a fan-out's share does (the loop
                // takes them without its mailbox), each waiting for the room the loop's sends
                // free: n blocks of 16 KiB through a buffer of one.
                return .now(
                    .streamed(.ok, bufferLimit: 16 * 1024) { writer in
                        await Task(executorPreference: writer.loop) {
                            let block = [UInt8](repeating: UInt8(ascii: "x"), count: 16 * 1024)
                            for _ in 0..<n {
                                guard (try? await writer.write(block)) != nil else { break }
                                if let loop = writer.loop, LoopExecutor.current === loop {
                                    probe.writesOnLoop.add(1, ordering: .relaxed)
                                }
                            }
                            writer.finish()
                        }.value
                    }, 0)
            case "/abandon":
                return .now(
                    .streamed(.ok) { writer in
                        try? await writer.write(Array("partial".utf8))
                    }, 0)
            case "/endless":
                // Waits for ever; ends cleanly when cancelled at shutdown.
                return .now(
                    .streamed(.ok, shutdown: .cancel) { writer in
                        try? await writer.write(Array("open\n".utf8))
                        while !Task.isCancelled { try? await Task.sleep(for: .seconds(60)) }
                        probe.sawCancelled.add(1, ordering: .relaxed)
                        _ = writer.writeIfRoom(Array("bye\n".utf8))
                        writer.finish()
                    }, 0)
            case "/detached":
                // Hands the body over and returns: the test writes and ends it; when the
                // connection goes or shutdown begins, the close handler ends it (once).
                return .now(
                    .streamed(.ok, shutdown: .cancel) { writer in
                        writer.detach { reason in
                            probe.closeReasons.withLock { $0.append(reason) }
                            _ = writer.writeIfRoom(Array("bye\n".utf8))
                            writer.finish()
                        }
                        try? await writer.write(Array("open\n".utf8))
                        probe.detached.withLock { $0 = writer }
                        probe.producerEnded.add(1, ordering: .relaxed)
                    }, 0)
            case "/head-only":
                return .now(
                    .streamed(.noContent) { writer in
                        if writer.isClosed { probe.sawClosed.add(1, ordering: .relaxed) }
                        probe.producerEnded.add(1, ordering: .relaxed)
                    }, 0)
            default:
                return .now(HTTPResponse(status: .notFound, body: Array("no".utf8)), 0)
            }
        }

        func complete(_ response: inout HTTPResponse, context: Int) {}
        func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse {
            HTTPResponse(status: HTTPStatus(error.status))
        }
        func refuseConnection() -> HTTPResponse { HTTPResponse(status: .serviceUnavailable) }
    }

    var server: HTTPServer<Responder>!
    let probe = Probe()

    override func setUpWithError() throws {
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        configuration.writeTimeout = .seconds(3)
        configuration.shutdownTimeout = .seconds(5)
        server = HTTPServer(
            configuration: configuration, responder: Responder(probe: probe), logger: Logger(label: "test"))
        try server.start()
    }

    override func tearDown() async throws {
        server.shutdown()
        await server.waitUntilStopped()
    }

    func testChunkedBodyEndsWithTheLastChunkAndTheConnectionTakesTheNextRequest() throws {
        let client = try TestClient(port: server.port)
        try client.send("GET /count?n=3 HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = try client.readHead()
        XCTAssertTrue(head.hasPrefix("HTTP/1.1 200 OK\r\n"), head)
        XCTAssertTrue(head.contains("Transfer-Encoding: chunked\r\n"), head)
        XCTAssertFalse(head.lowercased().contains("content-length"), head)
        XCTAssertTrue(head.contains("Connection: keep-alive\r\n"), head)
        XCTAssertEqual(try client.readChunkedBody(), "line 0\nline 1\nline 2\n")

        try client.send("GET /empty HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertTrue(try client.readHead().contains("Transfer-Encoding: chunked"))
        XCTAssertEqual(try client.readChunkedBody(), "")

        try client.send("GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try client.readHead()
        XCTAssertEqual(try client.readChunkedBody(), "from a task")
    }

    func testBodyWrittenOnItsLoopsThreadIsSentWholeAndTheConnectionGoesOn() throws {
        let client = try TestClient(port: server.port)
        try client.send("GET /on-loop?n=40 HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertTrue(try client.readHead().contains("Transfer-Encoding: chunked\r\n"))
        let body = try client.readChunkedBody()
        XCTAssertEqual(body.utf8.count, 40 * 16 * 1024)
        XCTAssertTrue(body.utf8.allSatisfy { $0 == UInt8(ascii: "x") })
        XCTAssertEqual(probe.writesOnLoop.load(ordering: .relaxed), 40, "every write was made on the loop's thread")
        try client.send("GET /count?n=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try client.readHead()
        XCTAssertEqual(try client.readChunkedBody(), "line 0\n")
    }

    func testHTTP10ClientGetsABodyDelimitedByClose() throws {
        let client = try TestClient(port: server.port)
        try client.send("GET /count?n=2 HTTP/1.0\r\n\r\n")
        let head = try client.readHead()
        XCTAssertFalse(head.contains("Transfer-Encoding"), head)
        XCTAssertTrue(head.contains("Connection: close\r\n"), head)
        XCTAssertEqual(String(decoding: try client.readUntilClose(), as: UTF8.self), "line 0\nline 1\n")
    }

    func testHeadRequestAndBodylessStatusSendOnlyTheHeadAndStillRunTheProducerOnce() throws {
        let client = try TestClient(port: server.port)
        try client.send("GET /head-only HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = try client.readHead()
        XCTAssertTrue(head.hasPrefix("HTTP/1.1 204"), head)
        try eventually { probe.producerEnded.load(ordering: .relaxed) == 1 }
        XCTAssertEqual(probe.sawClosed.load(ordering: .relaxed), 1, "its writer was closed: nobody to send to")
        try client.send("HEAD /count HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertTrue(try client.readHead().hasPrefix("HTTP/1.1 200"))
        try client.send("GET /count?n=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try client.readHead()
        XCTAssertEqual(try client.readChunkedBody(), "line 0\n", "no body followed the HEAD answer")
    }

    func testClientThatDoesNotReadHoldsBackTheProducerAndItsGoingAwayEndsIt() throws {
        let client = try TestClient(port: server.port, receiveBuffer: 4096)
        try client.send("GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        // The socket buffers fill, then the producer waits: the total written stops growing.
        var last = -1
        try eventually(within: 10) {
            let now = probe.written.load(ordering: .relaxed)
            defer { last = now }
            Thread.sleep(forTimeInterval: 0.2)
            return now > 0 && now == last
        }
        XCTAssertLessThanOrEqual(
            probe.mostBuffered.load(ordering: .relaxed), 64 * 1024 + 16 * 1024,
            "never more than the limit and one write")
        XCTAssertEqual(probe.producerEnded.load(ordering: .relaxed), 0, "still waiting for room")
        client.close()
        try eventually { probe.producerEnded.load(ordering: .relaxed) == 1 }
        XCTAssertEqual(probe.sawClosed.load(ordering: .relaxed), 1, "the producer's write threw")
    }

    func testClientThatStopsReadingIsDroppedAfterTheWriteTimeout() throws {
        let client = try TestClient(port: server.port, receiveBuffer: 4096)
        try client.send("GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        try eventually(within: 10) { probe.producerEnded.load(ordering: .relaxed) == 1 }
        XCTAssertEqual(probe.sawClosed.load(ordering: .relaxed), 1)
    }

    func testProducerReturningWithoutFinishingClosesWithoutTheLastChunk() throws {
        let client = try TestClient(port: server.port)
        try client.send("GET /abandon HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try client.readHead()
        let rest = String(decoding: try client.readUntilClose(), as: UTF8.self)
        XCTAssertEqual(rest, "7\r\npartial\r\n", "the body is cut off: no terminating chunk")
    }

    func testShutdownCancelsEndlessProducersWhichEndTheirBodyCleanly() async throws {
        let client = try TestClient(port: server.port)
        try client.send("GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try client.readHead()
        XCTAssertEqual(try client.readChunk(), "open\n")
        let started = Date()
        server.shutdown()
        XCTAssertEqual(try client.readChunkedBody(), "bye\n")
        XCTAssertTrue(try client.waitForClose())
        // Below the 5 s shutdown timeout, which is what a producer that ignored cancellation
        // would take; not a tighter figure, which a loaded machine could miss.
        XCTAssertLessThan(Date().timeIntervalSince(started), 4, "promptly, not after the shutdown timeout")
        XCTAssertEqual(probe.sawCancelled.load(ordering: .relaxed), 1)
    }

    // MARK: - Detached bodies

    /// Opens `/detached` and waits until its producer has returned.
    func openDetached() throws -> (TestClient, HTTPBodyWriter) {
        let client = try TestClient(port: server.port)
        try client.send("GET /detached HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try client.readHead()
        XCTAssertEqual(try client.readChunk(), "open\n")
        try eventually { probe.producerEnded.load(ordering: .relaxed) == 1 }
        let writer = try XCTUnwrap(probe.detached.withLock { $0 })
        return (client, writer)
    }

    func testDetachedBodyStaysOpenAndWritableAfterItsProducerReturned() async throws {
        let (client, writer) = try openDetached()
        XCTAssertFalse(writer.isClosed, "the producer returning did not end the body")
        XCTAssertEqual(writer.writeIfRoom(Array("later\n".utf8)), .written)
        XCTAssertEqual(try client.readChunk(), "later\n")
        writer.finish()
        XCTAssertEqual(try client.readChunkedBody(), "", "ended with the last chunk")
        // The connection takes the next request; the close handler was not called (the
        // body's holder ended it), not even when the connection closes later.
        try client.send("GET /count?n=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try client.readHead()
        XCTAssertEqual(try client.readChunkedBody(), "line 0\n")
        client.close()
        server.shutdown()
        await server.waitUntilStopped()
        XCTAssertEqual(probe.closeReasons.withLock { $0 }, [])
    }

    func testDetachedBodysCloseHandlerRunsOnceWhenTheClientGoesAway() async throws {
        let (client, writer) = try openDetached()
        client.close()
        try eventually { !probe.closeReasons.withLock { $0 }.isEmpty }
        XCTAssertEqual(writer.writeIfRoom(Array("x".utf8)), .closed)
        server.shutdown()
        await server.waitUntilStopped()
        XCTAssertEqual(probe.closeReasons.withLock { $0 }, [.connectionClosed], "once, though shutdown followed")
    }

    func testDetachedBodysCloseHandlerRunsOnceAtShutdownAndEndsTheBodyCleanly() async throws {
        let (client, _) = try openDetached()
        server.shutdown()
        XCTAssertEqual(try client.readChunkedBody(), "bye\n", "the handler's last words and the last chunk")
        XCTAssertTrue(try client.waitForClose())
        await server.waitUntilStopped()
        XCTAssertEqual(probe.closeReasons.withLock { $0 }, [.shutdown], "once, though the connection closed after")
    }

    func testDetachingAClosedWriterCallsTheHandlerAtOnce() {
        let writer = HTTPBodyWriter.closed()
        let reasons = Mutex<[HTTPBodyWriter.CloseReason]>([])
        writer.detach { reason in reasons.withLock { $0.append(reason) } }
        writer.detach { _ in reasons.withLock { $0.append(.shutdown) } }  // ignored
        XCTAssertEqual(reasons.withLock { $0 }, [.connectionClosed])
    }
}
