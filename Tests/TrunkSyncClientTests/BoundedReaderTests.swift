import Foundation
import XCTest

@testable import TrunkSyncClient

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// How the session's delegate collects an answer's body (`BoundedReader`), piece by piece.
final class BoundedReaderTests: XCTestCase {
    private var session: URLSession!

    override func setUp() { session = URLSession(configuration: .ephemeral) }
    override func tearDown() { session.invalidateAndCancel() }

    /// A reader expecting a task of `session` (never resumed: the test calls the delegate as
    /// the session would) and the outcome it hands over once the task completed.
    private func reading(limit: Int) throws -> (
        BoundedReader, URLSessionDataTask, LockedBox<(body: Data, cutOff: Bool)?>
    ) {
        let reader = BoundedReader()
        let task = session.dataTask(with: try XCTUnwrap(URL(string: "http://127.0.0.1:9/")))
        let finished = LockedBox<(body: Data, cutOff: Bool)?>(nil)
        reader.expect(task, limit: limit) { _, body, cutOff, _ in finished.set((body, cutOff)) }
        return (reader, task, finished)
    }

    /// Each piece is appended to the body collected so far in place: the body moves in memory
    /// only when it outgrows its buffer (a few times, the buffer growing geometrically), not
    /// at every piece. (Each piece copied the whole body before it: quadratic in the answer's
    /// size, some 32 MiB copied for a 1 MiB pull page in 16 KiB pieces, GiBs for an answer
    /// near `maxAnswerBytes`.)
    func testEachPieceIsAppendedWithoutCopyingTheBodyBeforeIt() throws {
        let (reader, task, finished) = try reading(limit: 8 * 1024 * 1024)
        let piece = Data(repeating: 0x61, count: 1024)
        var moves = 0
        var last: UnsafeRawPointer? = nil
        for _ in 0..<2048 {
            reader.urlSession(session, dataTask: task, didReceive: piece)
            let address = reader.bodyAddress(of: task)
            if address != last { moves += 1 }
            last = address
        }
        XCTAssertLessThan(moves, 200, "the body moved \(moves) times in 2048 pieces")

        reader.urlSession(session, task: task, didCompleteWithError: nil)
        let outcome = try XCTUnwrap(finished.get())
        XCTAssertFalse(outcome.cutOff)
        XCTAssertEqual(outcome.body, Data(repeating: 0x61, count: 2048 * 1024))
    }

    /// Past the limit the body is dropped and what comes after is not kept.
    func testABodyPastTheLimitIsDropped() throws {
        let (reader, task, finished) = try reading(limit: 3000)
        for _ in 0..<5 { reader.urlSession(session, dataTask: task, didReceive: Data(repeating: 1, count: 1000)) }
        reader.urlSession(session, task: task, didCompleteWithError: nil)
        let outcome = try XCTUnwrap(finished.get())
        XCTAssertTrue(outcome.cutOff)
        XCTAssertEqual(outcome.body, Data())
    }
}

/// A value set from one thread and read from another.
private final class LockedBox<Value>: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func set(_ newValue: Value) { lock.withLock { value = newValue } }
    func get() -> Value { lock.withLock { value } }
}
