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

    // MARK: - The server's total (the output ByteBudget)

    /// What a writer holds counts in the server's total from the write that queues it until
    /// the loop has sent it (or the connection ends); while the total is full, a body with
    /// bytes waiting for its client gets nothing more, however much room its own buffer has:
    /// `writeIfRoom` says `.full`, `write` waits for an empty buffer. A body with nothing
    /// waiting is not held back.
    func testWhileTheTotalIsFullABodyWithBytesWaitingGetsNothingMoreAndAnEmptyOneGoesOn() async throws {
        let budget = ByteBudget(limit: 1000)
        let slow = HTTPBodyWriter(bufferLimit: 1 << 20, budget: budget) {}
        let keepingUp = HTTPBodyWriter(bufferLimit: 1 << 20, budget: budget) {}
        XCTAssertEqual(slow.writeIfRoom(Array(repeating: 1, count: 600)), .written)
        XCTAssertEqual(budget.heldBytes, 600, "counted when queued")
        XCTAssertEqual(slow.writeIfRoom(Array(repeating: 2, count: 300)), .written, "under the total")
        XCTAssertEqual(budget.heldBytes, 900)
        XCTAssertEqual(slow.take().bytes.count, 2, "the loop took both; its socket did not send them all")
        XCTAssertEqual(keepingUp.writeIfRoom(Array(repeating: 3, count: 200)), .written)
        XCTAssertEqual(budget.heldBytes, 1100, "past the total by one write")

        XCTAssertEqual(slow.writeIfRoom([4]), .full, "full total, bytes waiting: nothing more")
        XCTAssertEqual(keepingUp.writeIfRoom([4]), .full, "not yet taken is waiting too")
        XCTAssertEqual(budget.heldBytes, 1100, "a refused write counts nothing")
        let waiting = Task { try await slow.write([6]) }
        try await waitForAWaitingWrite(slow)
        XCTAssertEqual(keepingUp.take().bytes.count, 1)
        XCTAssertEqual(keepingUp.take().bytes, [], "its client read it all")
        XCTAssertEqual(budget.heldBytes, 900)
        budget.adjust(by: 1000)  // others' answers keep the total full
        XCTAssertEqual(keepingUp.writeIfRoom([5]), .written, "nothing waiting: not held back by the full total")
        XCTAssertTrue(slow.hasWaitingWrite, "the write waits while bytes wait and the total is full")
        XCTAssertEqual(slow.take().bytes, [], "all sent: the buffer is empty")
        try await waiting.value
        budget.adjust(by: -1000)
        XCTAssertEqual(budget.heldBytes, 2, "an empty buffer takes a write whatever the total")

        // The end of the body taken: what is left is the connection's (counted as an answer's).
        keepingUp.finish()
        let (chunks, end) = keepingUp.take()
        XCTAssertEqual(chunks, [[5]])
        XCTAssertEqual(end, .finished)
        XCTAssertEqual(budget.heldBytes, 1, "the writer counts nothing once its end is taken")
        slow.close()
        XCTAssertEqual(budget.heldBytes, 0, "closing gives back what the writer held")
        slow.close()
        _ = keepingUp.take()
        XCTAssertEqual(budget.heldBytes, 0, "once")
    }

    /// A fan-out's write to a body with nothing waiting is not queued (the loop sends it): it
    /// counts nothing unless the socket leaves some of it, which then counts until sent.
    func testAClaimedWriteCountsOnlyWhatTheSocketLeft() {
        let budget = ByteBudget(limit: 1000)
        let writer = HTTPBodyWriter(bufferLimit: 1 << 20, budget: budget) {}
        guard case .claimed = writer.writeIfRoomOrClaim(Array(repeating: 1, count: 5000)) else {
            return XCTFail("a body with nothing waiting is claimed")
        }
        XCTAssertEqual(budget.heldBytes, 0, "sent whole: nothing counted")
        writer.holdUnsent(2000)
        XCTAssertEqual(budget.heldBytes, 2000)
        guard case .result(.full) = writer.writeIfRoomOrClaim([2]) else {
            return XCTFail("slow, and the total is full")
        }
        XCTAssertEqual(writer.take().bytes, [])
        XCTAssertEqual(budget.heldBytes, 0, "sent")
        guard case .claimed = writer.writeIfRoomOrClaim([3]) else { return XCTFail("caught up again") }
    }
}
