import Foundation
import Glibc
import TestSupport
import XCTest

@testable import TrunkSync

/// The attack: clients that open event streams, Realtime sockets and exports and never read
/// them, while their accounts push. Their bytes count in `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT`
/// with every answer's; once it is reached, a live event for a stream whose client is behind
/// ends the stream (it resumes with `Last-Event-ID`, nothing lost), a Realtime message for
/// such a socket closes it with `1013`, and an export waits for its client. Each stream's and
/// socket's own buffer here is 64 MiB, so only the total can stop them (config/README.md,
/// "Answers nobody reads").
final class UnreadOutputTests: XCTestCase {
    /// The smallest total the setting allows, far less than what the accounts push.
    static let limit = 1_048_576
    /// 240 events of 50,000 bytes: ~12 MB, more than the kernel takes into the socket of a
    /// client that reads nothing (a few MiB, `tcp_wmem`).
    static let events = 240
    static let payloadBytes = 50_000
    /// For Realtime: 3,000 events of 2,000 bytes (~6 MB).
    static let realtimeEvents = 3_000

    var app: AppHarness!
    var token: String!
    var port: Int { app.server.port }

    override func setUp() async throws {
        app = try await AppHarness(environment: [
            "TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT": "\(Self.limit)", "TRUNK_SYNC_STREAM_BUFFER": "67108864",
            "TRUNK_SYNC_REALTIME_BUFFER": "67108864", "TRUNK_SYNC_HTTP_WRITE_TIMEOUT": "300",
        ])
        token = try await app.token("unread@example.com")
        // Commits reach the streams' and Realtime's hubs through the listener.
        let notifier = app.application.notifier
        let listening = await waitUntil(10) { notifier.isListening }
        XCTAssertTrue(listening)
    }

    override func tearDown() async throws { await app.stop() }

    /// A raw connection; with `receiveBuffer`, one that leaves what it does not read in the
    /// server's output.
    final class Connection {
        let descriptor: Int32
        private(set) var received: [UInt8] = []
        private(set) var closedByServer = false

        init(port: Int, receiveBuffer: Int32? = nil, _ request: String) throws {
            descriptor = try connectedSocket(port: port, receiveBuffer: receiveBuffer)
            send(Array(request.utf8))
        }

        deinit { close(descriptor) }

        func send(_ bytes: [UInt8]) {
            let sent = bytes.withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            XCTAssertEqual(sent, bytes.count)
        }

        /// Reads once; false at the end (or after 10 s without a byte).
        private func receive() -> Bool {
            var buffer = [UInt8](repeating: 0, count: 64 * 1024)
            let count = recv(descriptor, &buffer, buffer.count, 0)
            guard count > 0 else {
                closedByServer = count == 0
                return false
            }
            received += buffer[0..<count]
            return true
        }

        /// Reads until `done` holds of what arrived; whether it did.
        func read(until done: ([UInt8]) -> Bool) -> Bool {
            while !done(received) {
                guard receive() else { return false }
            }
            return true
        }

        /// Reads until `text` has arrived (in the first few KiB: looked for in all of it).
        func read(until text: String) -> Bool {
            let bytes = Array(text.utf8)
            return read { Self.contains($0, bytes) }
        }

        /// Reads until what arrived ends with `text` (a body's end).
        func read(untilEndsWith text: String) -> Bool {
            let bytes = Array(text.utf8)
            return read { $0.suffix(bytes.count).elementsEqual(bytes) }
        }

        /// Reads until the server closes the connection; whether it did.
        func readToEnd() -> Bool {
            while receive() {}
            return closedByServer
        }

        static func contains(_ bytes: [UInt8], _ part: [UInt8]) -> Bool {
            guard bytes.count >= part.count else { return false }
            return (0...(bytes.count - part.count)).contains { bytes[$0..<$0 + part.count].elementsEqual(part) }
        }
    }

    /// Pushes `count` events of `payloadBytes` each, `perPush` to a push.
    func pushEvents(
        _ count: Int = events, payloadBytes: Int = payloadBytes, perPush: Int = 60
    ) async throws {
        let text = String(repeating: "x", count: payloadBytes)
        for _ in 0..<(count / perPush) {
            let events: [[String: Any]] = (0..<perPush).map { _ in
                [
                    "client_id": UUID().uuidString, "type": "note", "payload": ["text": text],
                    "client_timestamp": "2026-11-22T04:10:02.123Z",
                ]
            }
            let pushed = try await app.request("POST", "/sync/v1/events", json: ["events": events], bearer: token)
            XCTAssertEqual(pushed.status, 200, pushed.text)
        }
    }

    func streamRequest(lastEventID: Int? = nil) -> String {
        "GET /sync/v1/stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nAuthorization: Bearer \(token!)\r\n"
            + (lastEventID.map { "Last-Event-ID: \($0)\r\n" } ?? "") + "\r\n"
    }

    /// The ids of the stream's messages in `bytes`, in order.
    static func ids(_ bytes: [UInt8]) -> [Int] {
        // Split as bytes: a chunk's size line ends with CRLF, one `Character` in a `String`.
        bytes.split(separator: 10).compactMap { line in
            line.starts(with: Array("id: ".utf8)) ? Int(String(decoding: line.dropFirst(4), as: UTF8.self)) : nil
        }
    }

    static func slowReaderEnds(_ application: Application) -> Int {
        let text = application.metrics.render()
        let line = text.split(separator: "\n").first {
            $0.hasPrefix(#"trunk_sync_streams_ended_total{reason="slow_reader"} "#)
        }
        return line.flatMap { Int($0.split(separator: " ").last ?? "") } ?? 0
    }

    func testAStreamBehindWhileTheTotalIsFullEndsAndResumesWithNothingLost() async throws {
        let slow = try Connection(port: port, receiveBuffer: 4096, streamRequest())
        XCTAssertTrue(slow.read(until: "retry: 1000\n\n"))
        let streams = app.application.streams
        let open = await waitUntil(10) { streams.openCount == 1 }
        XCTAssertTrue(open)
        try await pushEvents()
        let application = app.application
        let ended = await waitUntil(60) { Self.slowReaderEnds(application) == 1 }
        XCTAssertTrue(ended, "the stream that read nothing was not ended; held: \(app.server.bufferedOutputBytes)")

        // Its client reads what was sent: a clean end, events 1 to k.
        XCTAssertTrue(slow.read(untilEndsWith: "\r\n0\r\n\r\n"), "a clean end of the body")
        let first = Self.ids(slow.received)
        XCTAssertEqual(first, Array(1...max(1, first.count)))
        XCTAssertLessThan(first.count, Self.events, "ended before it had everything")

        // It resumes from its last id, losing nothing.
        let resumed = try Connection(port: port, streamRequest(lastEventID: first.last ?? 0))
        // The last event's message, then the end of its chunk.
        let last = Array("id: \(Self.events)\n".utf8)
        let resumedToTheEnd = resumed.read { bytes in
            bytes.suffix(4).elementsEqual([10, 10, 13, 10])
                && Connection.contains(Array(bytes.suffix(Self.payloadBytes + 4096)), last)
        }
        XCTAssertTrue(resumedToTheEnd, "resumed up to the last event")
        XCTAssertEqual(first + Self.ids(resumed.received), Array(1...Self.events))

        withExtendedLifetime(slow) {}
        withExtendedLifetime(resumed) {}
        let server = app.server
        let released = await waitUntil(30) { server.bufferedOutputBytes == 0 }
        XCTAssertTrue(released, "still held: \(server.bufferedOutputBytes)")
    }

    /// A client frame (masked) with `text`.
    static func textFrame(_ text: String) -> [UInt8] {
        let payload = Array(text.utf8)
        var frame: [UInt8] = [0x81]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else {
            frame += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        }
        let mask: [UInt8] = [0x11, 0x22, 0x33, 0x44]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        return frame
    }

    /// The server's frames in `bytes` (after the handshake's head): opcode and payload.
    static func frames(_ bytes: [UInt8]) -> [(opcode: UInt8, payload: ArraySlice<UInt8>)] {
        var frames: [(opcode: UInt8, payload: ArraySlice<UInt8>)] = []
        var at = 0
        while at + 2 <= bytes.count {
            var length = Int(bytes[at + 1] & 0x7F)
            var start = at + 2
            if length == 126 {
                guard start + 2 <= bytes.count else { break }
                length = Int(bytes[start]) << 8 | Int(bytes[start + 1])
                start += 2
            } else if length == 127 {
                guard start + 8 <= bytes.count else { break }
                length = bytes[start..<start + 8].reduce(0) { $0 << 8 | Int($1) }
                start += 8
            }
            guard start + length <= bytes.count else { break }
            frames.append((bytes[at] & 0x0F, bytes[start..<start + length]))
            at = start + length
        }
        return frames
    }

    func testARealtimeSocketBehindWhileTheTotalIsFullClosesWith1013AndAnExportWaitsForItsReader() async throws {
        let realtime = try Connection(
            port: port, receiveBuffer: 4096,
            "GET /realtime/v1/websocket?vsn=1.0.0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        XCTAssertTrue(realtime.read(until: "\r\n\r\n"))
        XCTAssertTrue(String(decoding: realtime.received, as: UTF8.self).hasPrefix("HTTP/1.1 101"))
        let headLength = realtime.received.count
        realtime.send(
            Self.textFrame(
                #"{"topic":"realtime:room","event":"phx_join","ref":"1","join_ref":"1","payload":{"config":"#
                    + #"{"postgres_changes":[{"event":"INSERT","schema":"public","table":"events"}]},"#
                    + #""access_token":"\#(token!)"}}"#))
        XCTAssertTrue(realtime.read(until: #""status":"ok""#), "joined")

        // Small events (~2 KB messages), many: a burst of messages one database read brings
        // (100) is far below the total, so the total fills only once the kernel holds all it
        // takes of the socket's (a few MiB) and the rest waits in the server, as for any client
        // that stopped reading. (A burst over it, queued faster than the loop sends it, would
        // be refused at once: the socket closed while its bytes are still in the kernel, and
        // reset by the lingering close before this client, which reads late, got them.)
        try await pushEvents(Self.realtimeEvents, payloadBytes: 2_000, perPush: 1_000)
        let server = app.server
        let full = await waitUntil(60) { server.bufferedOutputBytes >= Self.limit }
        XCTAssertTrue(full, "the socket's unread messages are not counted: \(server.bufferedOutputBytes)")

        // While the total is full, an export to a client that reads late waits for it and is
        // complete once read.
        let export = try Connection(
            port: port, receiveBuffer: 4096,
            "GET /sync/v1/export HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token!)\r\n\r\n")
        XCTAssertTrue(export.read(untilEndsWith: "\r\n0\r\n\r\n"), "the export's end")
        let lines = String(decoding: export.received, as: UTF8.self).components(separatedBy: #"{"kind":"event""#)
        XCTAssertEqual(lines.count - 1, Self.realtimeEvents, "every event exported")
        XCTAssertTrue(String(decoding: export.received.prefix(20), as: UTF8.self).hasPrefix("HTTP/1.1 200"))

        // The Realtime client reads what was queued for it: its socket was closed with 1013.
        XCTAssertTrue(realtime.readToEnd(), "the server closed the socket")
        let frames = Self.frames(Array(realtime.received[headLength...]))
        let close = try XCTUnwrap(frames.last)
        XCTAssertEqual(close.opcode, 8)
        XCTAssertEqual(Array(close.payload.prefix(2)), [0x03, 0xF5], "1013")
        let changes = frames.filter {
            $0.opcode == 1 && Connection.contains(Array($0.payload), Array("postgres_changes".utf8))
        }
        XCTAssertLessThan(changes.count, Self.realtimeEvents, "closed before every change was sent")

        withExtendedLifetime(realtime) {}
        withExtendedLifetime(export) {}
        let released = await waitUntil(30) { server.bufferedOutputBytes == 0 }
        XCTAssertTrue(released, "still held: \(server.bufferedOutputBytes)")
    }
}
