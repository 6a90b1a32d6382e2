import Foundation
import Glibc
import TestSupport
import XCTest

@testable import TrunkSync

/// A parked stream has no task: its client going away and the server shutting down reach it
/// through its writer's close handler, which ends it once, with its slot, its metric and a
/// clean end of its body (the rest of the stream is in `EventStreamTests`, end to end).
final class EventStreamEndTests: XCTestCase {
    /// A raw connection reading one stream's chunked body.
    final class StreamReader {
        let descriptor: Int32
        private(set) var received = ""

        init(port: Int, token: String) throws {
            descriptor = try connectedSocket(port: port)
            let head =
                "GET /sync/v1/stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
                + "Authorization: Bearer \(token)\r\n\r\n"
            _ = head.withCString { send(descriptor, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        }

        deinit { close(descriptor) }

        /// Reads until `text` has arrived or the connection ends; whether it arrived.
        func read(until text: String) -> Bool {
            var buffer = [UInt8](repeating: 0, count: 4096)
            while !received.contains(text) {
                let count = recv(descriptor, &buffer, buffer.count, 0)
                if count <= 0 { return false }
                received += String(decoding: buffer[0..<count], as: UTF8.self)
            }
            return true
        }

        /// Reads until the server closes the connection.
        func readToEnd() {
            _ = read(until: "\u{0}never")
        }

        func hangUp() { shutdown(descriptor, Int32(SHUT_RDWR)) }
    }

    static func ended(_ app: AppHarness, _ reason: String) -> Bool {
        app.application.metrics.render().contains(#"trunk_sync_streams_ended_total{reason="\#(reason)"} 1"#)
    }

    func testClientGoneAndShutdownEndAParkedStreamOnceAndFreeItsSlot() async throws {
        let app = try await AppHarness()
        let streams = app.application.streams
        let port = try XCTUnwrap(Int(app.baseURL.split(separator: ":").last ?? ""))
        let token = try await app.token("parked@example.com")
        let leaving = try StreamReader(port: port, token: token)
        let staying = try StreamReader(port: port, token: token)
        XCTAssertTrue(leaving.read(until: "retry: 1000\n\n"))
        XCTAssertTrue(staying.read(until: "retry: 1000\n\n"))
        XCTAssertEqual(streams.openCount, 2)

        leaving.hangUp()
        let gone = await waitUntil(10) { streams.openCount == 1 && Self.ended(app, "client_gone") }
        XCTAssertTrue(gone, "the parked stream ended, its slot back, when its client left")
        XCTAssertEqual(streams.userCount, 1, "the user's other stream keeps the hub")

        await app.stop()
        staying.readToEnd()
        XCTAssertTrue(staying.received.hasSuffix("\r\n0\r\n\r\n"), "a clean end: \(staying.received)")
        XCTAssertEqual(streams.openCount, 0, "nothing left after Application.close()")
        XCTAssertEqual(streams.userCount, 0, "the hub stopped")
        XCTAssertTrue(Self.ended(app, "shutdown"))
        XCTAssertTrue(Self.ended(app, "client_gone"), "counted once")
    }
}
