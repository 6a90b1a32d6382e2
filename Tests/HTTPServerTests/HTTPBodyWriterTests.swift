import Synchronization
import XCTest

@testable import HTTPServer

/// The writer between a streamed body's producer and the event loop, without a loop: the
/// test plays the loop (`take`, `close`).
final class HTTPBodyWriterTests: XCTestCase {
    final class Wakes: Sendable {
        let count = Atomic<Int>(0)
    }

    func testWakesTheLoopOncePerTakeAndHandsOverWritesInOrder() {
        let wakes = Wakes()
        let writer = HTTPBodyWriter(bufferLimit: 100) { wakes.count.add(1, ordering: .relaxed) }
        XCTAssertEqual(writer.writeIfRoom([1, 2]), .written)
        XCTAssertEqual(writer.writeIfRoom([3]), .written)
        XCTAssertEqual(wakes.count.load(ordering: .relaxed), 1, "one wake-up until the loop takes")
        let (chunks, end) = writer.take()
        XCTAssertEqual(chunks, [[1, 2], [3]])
        XCTAssertEqual(end, .open)
        XCTAssertEqual(writer.bufferedByteCount, 3, "taken but not yet sent still counts")
        XCTAssertEqual(writer.writeIfRoom([4]), .written)
        XCTAssertEqual(wakes.count.load(ordering: .relaxed), 2)
        XCTAssertEqual(writer.take().bytes, [[4]])
        XCTAssertEqual(writer.bufferedByteCount, 1, "the first three bytes were sent")
        XCTAssertEqual(writer.take().bytes, [])
        XCTAssertEqual(writer.bufferedByteCount, 0)
    }

    func testWriteIfRoomRefusesOnceTheLimitIsReachedAndWritesNothing() {
        let writer = HTTPBodyWriter(bufferLimit: 10) {}
        XCTAssertEqual(writer.writeIfRoom(Array(repeating: 0, count: 25)), .written, "one write may pass the limit")
        XCTAssertEqual(writer.writeIfRoom([1]), .full)
        XCTAssertEqual(writer.bufferedByteCount, 25)
        _ = writer.take()
        XCTAssertEqual(writer.writeIfRoom([1]), .full, "taken is not sent")
        _ = writer.take()
        XCTAssertEqual(writer.writeIfRoom([1]), .written)
    }

    func testWriteWaitsForRoomAndResumesWhenTheLoopHasSentWhatItTook() async throws {
        let writer = HTTPBodyWriter(bufferLimit: 4) {}
        try await writer.write([1, 2, 3, 4])
        let second = Task { try await writer.write([5]) }
        try await waitForAWaitingWrite(writer)
        XCTAssertEqual(writer.bufferedByteCount, 4, "the second write waits")
        XCTAssertEqual(writer.take().bytes, [[1, 2, 3, 4]])
        XCTAssertEqual(writer.take().bytes, [], "the first four bytes sent: room again")
        try await second.value
        XCTAssertEqual(writer.take().bytes, [[5]])
    }

    /// `write` counts the write itself: the buffer never passes the limit (issue 23: a slow
    /// reader held "limit plus one write", a 6.4 MB page). Only a write larger than the limit
    /// passes it, alone, and producers write pieces no larger (`write(_:inPiecesOf:)`).
    func testWriteWaitsUntilTheWholeWriteFitsUnderTheLimit() async throws {
        let writer = HTTPBodyWriter(bufferLimit: 10) {}
        try await writer.write(Array(repeating: 1, count: 6))
        let second = Task { try await writer.write(Array(repeating: 2, count: 6)) }
        try await waitForAWaitingWrite(writer)
        XCTAssertEqual(writer.bufferedByteCount, 6, "6 + 6 would pass 10: the second write waits")
        XCTAssertEqual(writer.take().bytes.map(\.count), [6])
        XCTAssertEqual(writer.bufferedByteCount, 6, "taken, not yet sent")
        _ = writer.take()
        try await second.value
        XCTAssertEqual(writer.bufferedByteCount, 6)
        _ = writer.take()
        _ = writer.take()
        // A page larger than the limit, in pieces: never more than the limit buffered.
        let page = (0..<35).map { UInt8($0) }
        let pieces = Task { try await writer.write(page, inPiecesOf: 10) }
        var sent: [UInt8] = []
        var most = 0
        while sent.count < page.count {
            most = max(most, writer.bufferedByteCount)
            sent += writer.take().bytes.joined()
            await Task.yield()
        }
        try await pieces.value
        XCTAssertEqual(sent, page)
        XCTAssertLessThanOrEqual(most, 10)
    }

    /// Returns once a write waits for room in `writer` (fails after 10 s).
    func waitForAWaitingWrite(_ writer: HTTPBodyWriter, file: StaticString = #filePath, line: UInt = #line)
        async throws
    {
        let deadline = ContinuousClock.now + .seconds(10)
        while !writer.hasWaitingWrite {
            guard ContinuousClock.now < deadline else { return XCTFail("no write waits", file: file, line: line) }
            try await Task.sleep(for: .milliseconds(1))
        }
    }

    /// A writer whose one byte of room is taken, and a task waiting to write more: it
    /// returns whether that write threw.
    func fullWriterWithAWaitingWrite() async throws -> (HTTPBodyWriter, Task<Bool, Never>) {
        let writer = HTTPBodyWriter(bufferLimit: 1) {}
        try await writer.write([1])
        let waiting = Task { () -> Bool in
            do {
                try await writer.write([2])
                return false
            } catch {
                return true
            }
        }
        try await waitForAWaitingWrite(writer)
        return (writer, waiting)
    }

    func testClosingFailsWritesAndResumesAWaitingOne() async throws {
        let (writer, waiting) = try await fullWriterWithAWaitingWrite()
        writer.close()
        let threw = await waiting.value
        XCTAssertTrue(threw)
        XCTAssertTrue(writer.isClosed)
        XCTAssertEqual(writer.writeIfRoom([3]), .closed)
    }

    func testCancellingAWaitingWriteThrows() async throws {
        let (writer, waiting) = try await fullWriterWithAWaitingWrite()
        waiting.cancel()
        let threw = await waiting.value
        XCTAssertTrue(threw)
        XCTAssertFalse(writer.isClosed, "the connection is still there: the producer may finish")
    }

    func testFinishEndsTheBodyAndAProducerReturningWithoutItAbandonsIt() {
        let writer = HTTPBodyWriter(bufferLimit: 10) {}
        XCTAssertEqual(writer.writeIfRoom([1]), .written)
        writer.finish()
        XCTAssertEqual(writer.writeIfRoom([2]), .closed, "nothing after the end")
        writer.producerReturned()
        let (chunks, end) = writer.take()
        XCTAssertEqual(chunks, [[1]])
        XCTAssertEqual(end, .finished, "returning after finishing is the normal way")

        let abandoned = HTTPBodyWriter(bufferLimit: 10) {}
        XCTAssertEqual(abandoned.writeIfRoom([1]), .written)
        abandoned.producerReturned()
        XCTAssertEqual(abandoned.take().end, .abandoned)
    }

    func testFinishingFromElsewhereFailsAWaitingWrite() async throws {
        let (writer, waiting) = try await fullWriterWithAWaitingWrite()
        writer.finish()  // the body's holder ended it while its producer waited for room
        let threw = await waiting.value
        XCTAssertTrue(threw)
        XCTAssertEqual(writer.take().end, .finished)
    }

    func testADetachedProducerReturningLeavesTheBodyOpenAndTheHandlerRunsOnce() {
        let writer = HTTPBodyWriter(bufferLimit: 10) {}
        let reasons = Mutex<[HTTPBodyWriter.CloseReason]>([])
        writer.detach { reason in reasons.withLock { $0.append(reason) } }
        writer.producerReturned()
        XCTAssertEqual(writer.take().end, .open, "not abandoned")
        XCTAssertEqual(writer.writeIfRoom([1]), .written)
        writer.shutdownBegan()
        writer.close()
        writer.shutdownBegan()
        XCTAssertEqual(reasons.withLock { $0 }, [.shutdown], "once")

        let finished = HTTPBodyWriter(bufferLimit: 10) {}
        finished.detach { reason in reasons.withLock { $0.append(reason) } }
        finished.finish()
        finished.close()
        XCTAssertEqual(reasons.withLock { $0 }, [.shutdown], "not after finish()")
    }
}
