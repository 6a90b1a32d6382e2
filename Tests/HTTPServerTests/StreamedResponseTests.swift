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
        /// The writers of `/parked` bodies, in the order their producers returned.
        let parked = Mutex<[HTTPBodyWriter]>([])
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
            case "/parked":
                // A body its producer hands over and returns from, as an event stream is parked:
                // the test writes to it (`HTTPBodyFanOut`) and ends it.
                return .now(
                    .streamed(.ok, bufferLimit: 16 * 1024, shutdown: .cancel) { writer in
                        writer.detach { _ in writer.finish() }
                        try? await writer.write(Array("open\n".utf8))
                        probe.parked.withLock { $0.append(writer) }
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

    // MARK: - The loop's table of streamed bodies, and fan-outs

    /// Opens `count` `/parked` bodies, each read up to its first chunk; returns the clients and
    /// the writers, in the same order.
    func openParked(_ count: Int, receiveBuffer: Int32? = nil) throws -> [(TestClient, HTTPBodyWriter)] {
        var opened: [(TestClient, HTTPBodyWriter)] = []
        for index in 0..<count {
            let client = try TestClient(port: server.port, receiveBuffer: receiveBuffer)
            try client.send("GET /parked HTTP/1.1\r\nHost: x\r\n\r\n")
            _ = try client.readHead()
            XCTAssertEqual(try client.readChunk(), "open\n")
            try eventually { probe.parked.withLock { $0.count } == index + 1 }
            opened.append((client, try XCTUnwrap(probe.parked.withLock { $0.last })))
        }
        return opened
    }

    /// Runs `body` on `writer`'s loop's thread, as a fan-out's share runs.
    func onLoop<T: Sendable>(of writer: HTTPBodyWriter, _ body: @escaping @Sendable () -> T) async -> T {
        await Task(executorPreference: writer.loop) { body() }.value
    }

    func testAStreamedBodyLeavesItsLoopsTableWhenItEndsOrItsConnectionCloses() async throws {
        let opened = try openParked(4)
        XCTAssertEqual(server.streamedBodyCount, 4)
        // The client goes away.
        opened[0].0.close()
        try eventually { server.streamedBodyCount == 3 }
        // The body is finished: the connection goes on to its next request.
        opened[1].1.finish()
        XCTAssertEqual(try opened[1].0.readChunkedBody(), "")
        try eventually { server.streamedBodyCount == 2 }
        // A body whose producer returns without finishing (abandoned) and a finished one on
        // one connection, in turn: neither stays.
        try opened[1].0.send("GET /abandon HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try opened[1].0.readHead()
        XCTAssertEqual(String(decoding: try opened[1].0.readUntilClose(), as: UTF8.self), "7\r\npartial\r\n")
        try eventually { server.streamedBodyCount == 2 }
        // The others still get what is written to them (the table's places moved).
        let bytes = Array("still here\n".utf8)
        for (client, writer) in opened[2...] {
            let result = await onLoop(of: writer) {
                var result = HTTPBodyWriter.WriteResult.closed
                HTTPBodyFanOut.write(bytes) { result = $0.writeIfRoom(writer) }
                return result
            }
            XCTAssertEqual(result, .written)
            XCTAssertEqual(try client.readChunk(), "still here\n")
        }
        // Shutdown ends the rest.
        server.shutdown()
        await server.waitUntilStopped()
        XCTAssertEqual(server.streamedBodyCount, 0)
    }

    func testFanOutSendsEveryBodyTheBytesOnceAndAfterWhatWaitsBeforeThem() async throws {
        let opened = try openParked(3)
        let writers = opened.map(\.1)
        let event = Array("event\n".utf8)
        // One body has a write waiting, made on the loop just before: it goes first. The others
        // had nothing waiting: their sockets have the bytes when the fan-out returns.
        let (results, buffered) = await onLoop(of: writers[0]) { () -> ([HTTPBodyWriter.WriteResult], [Int]) in
            _ = writers[0].writeIfRoom(Array("first\n".utf8))
            var results: [HTTPBodyWriter.WriteResult] = []
            HTTPBodyFanOut.write(event) { fanOut in
                for writer in writers { results.append(fanOut.writeIfRoom(writer)) }
            }
            return (results, writers.map(\.bufferedByteCount))
        }
        XCTAssertEqual(results, [.written, .written, .written])
        XCTAssertEqual(buffered[1...], [0, 0], "sent by the time the fan-out returned")
        XCTAssertGreaterThan(buffered[0], 0, "queued behind the waiting write")
        XCTAssertEqual(try opened[0].0.readChunk(), "first\nevent\n")
        XCTAssertEqual(try opened[1].0.readChunk(), "event\n")
        XCTAssertEqual(try opened[2].0.readChunk(), "event\n")
        // Off the loop's thread: written as `writeIfRoom` writes, sent by the loop.
        var offLoop: [HTTPBodyWriter.WriteResult] = []
        HTTPBodyFanOut.write(Array("later\n".utf8)) { fanOut in
            for writer in writers { offLoop.append(fanOut.writeIfRoom(writer)) }
        }
        XCTAssertEqual(offLoop, [.written, .written, .written])
        for (client, _) in opened { XCTAssertEqual(try client.readChunk(), "later\n") }
        // An ended body takes nothing; the others go on.
        writers[1].finish()
        XCTAssertEqual(try opened[1].0.readChunkedBody(), "")
        let last = await onLoop(of: writers[0]) { () -> [HTTPBodyWriter.WriteResult] in
            var results: [HTTPBodyWriter.WriteResult] = []
            HTTPBodyFanOut.write(event) { fanOut in
                for writer in writers { results.append(fanOut.writeIfRoom(writer)) }
            }
            return results
        }
        XCTAssertEqual(last, [.written, .closed, .written])
        XCTAssertEqual(try opened[0].0.readChunk(), "event\n")
        XCTAssertEqual(try opened[2].0.readChunk(), "event\n")
    }

    func testFanOutToAClientThatDoesNotReadHoldsBoundedBytesAndSendsThemWholeInOrder() async throws {
        let opened = try openParked(1, receiveBuffer: 4096)
        let (client, writer) = opened[0]
        // Blocks of 4 KiB, each of its own letter, until the body refuses one: what the socket
        // did not take is held, then queued up to the limit (16 KiB), never more.
        var sent: [UInt8] = []
        var mostBuffered = 0
        var refused = false
        for index in 0..<2000 {
            let block = [UInt8](repeating: UInt8(ascii: "a") + UInt8(index % 26), count: 4096)
            let (result, buffered) = await onLoop(of: writer) { () -> (HTTPBodyWriter.WriteResult, Int) in
                var result = HTTPBodyWriter.WriteResult.closed
                HTTPBodyFanOut.write(block) { result = $0.writeIfRoom(writer) }
                return (result, writer.bufferedByteCount)
            }
            mostBuffered = max(mostBuffered, buffered)
            if result == .full {
                refused = true
                break
            }
            XCTAssertEqual(result, .written)
            sent += block
        }
        XCTAssertTrue(refused, "the client reads nothing: the body fills up")
        XCTAssertLessThanOrEqual(mostBuffered, 16 * 1024 + 4096 + 16, "the limit and one write (and its framing)")
        writer.finish()
        let body = try client.readChunkedBody()
        XCTAssertEqual(body.utf8.count, sent.count)
        XCTAssertTrue(body.utf8.elementsEqual(sent), "every block whole, in order")
    }
}
