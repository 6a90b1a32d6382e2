import XCTest

@testable import HTTPServer

/// The inbox between the event loop (`deliver`) and a WebSocket session (`receive`), without
/// a loop: the test plays the loop.
final class WebSocketInboxTests: XCTestCase {
    /// Messages the session has not taken are bounded in bytes (64 KiB) and in number (1024):
    /// empty frames weigh no bytes, and a client sending them while its session waited (a
    /// join's database read) queued them without end.
    func testMessagesNotYetTakenAreBoundedInBytesAndInNumber() async {
        let socket = WebSocket(settings: WebSocketSettings(), wake: {})
        for index in 0..<1024 {
            XCTAssertTrue(socket.deliver(.text([])), "message \(index)")
        }
        XCTAssertFalse(socket.deliver(.text([])), "a 1025th empty message waiting is too many")
        for _ in 0..<1024 {
            let message = await socket.receive()
            XCTAssertEqual(message, .text([]))
        }
        // Taken: room again; bytes still count, and one message alone may pass the limit.
        XCTAssertTrue(socket.deliver(.binary(Array(repeating: 1, count: 40 * 1024))))
        XCTAssertFalse(socket.deliver(.binary(Array(repeating: 2, count: 40 * 1024))), "80 KiB waiting is over 64")
        let first = await socket.receive()
        XCTAssertEqual(first, .binary(Array(repeating: 1, count: 40 * 1024)))
        XCTAssertTrue(socket.deliver(.binary(Array(repeating: 3, count: 100 * 1024))))
    }
}
