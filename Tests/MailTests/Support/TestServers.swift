import Foundation
import Glibc
import TestSupport

/// A one-connection SMTP server that follows a script, for what aiosmtpd will not do
/// (no EHLO, malformed replies, data injected after STARTTLS). It runs on a thread of
/// its own; every read is bounded by a 10 s receive timeout.
final class ScriptedServer: @unchecked Sendable {
    enum Step {
        /// Send these bytes.
        case send(String)
        /// Read one command line, which must start with the prefix.
        case expect(String)
        /// Read message data up to the `.` line.
        case readData
        /// Close the connection.
        case close
    }

    let port: Int
    private let listener: Int32
    private let lock = NSLock()
    private var log: [String] = []
    private var storedData = ""
    private let finished = DispatchSemaphore(value: 0)

    init(_ script: [Step]) throws {
        (listener, port) = try listeningSocket()
        let listener = self.listener
        Thread.detachNewThread { [self] in
            defer { finished.signal() }
            var poller = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 10_000) == 1 else { return record("no connection") }
            let connection = accept(listener, nil, nil)
            guard connection >= 0 else { return record("accept failed") }
            defer { Glibc.close(connection) }
            var timeout = timeval(tv_sec: 10, tv_usec: 0)
            setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var pending: [UInt8] = []
            func readLine() -> String? {
                while true {
                    if let newline = pending.firstIndex(of: 0x0A) {
                        let line = String(decoding: pending[..<newline], as: UTF8.self)
                        pending.removeSubrange(...newline)
                        return line.hasSuffix("\r") ? String(line.dropLast()) : line
                    }
                    var chunk = [UInt8](repeating: 0, count: 4096)
                    let count = recv(connection, &chunk, chunk.count, 0)
                    guard count > 0 else { return nil }
                    pending += chunk[..<count]
                }
            }
            for step in script {
                switch step {
                case .send(let text):
                    _ = Array(text.utf8).withUnsafeBytes {
                        send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                    }
                case .expect(let prefix):
                    guard let line = readLine() else { return record("connection ended, expected \(prefix)") }
                    record(line)
                    guard line.hasPrefix(prefix) else { return record("unexpected: wanted \(prefix)") }
                case .readData:
                    var lines: [String] = []
                    while let line = readLine(), line != "." { lines.append(line) }
                    lock.withLock { storedData = lines.joined(separator: "\n") }
                case .close:
                    return
                }
            }
        }
    }

    deinit { close(listener) }

    private func record(_ line: String) { lock.withLock { log.append(line) } }

    /// Waits (at most 15 s) for the script to end, then returns the lines it read.
    func transcript() -> [String] {
        _ = finished.wait(timeout: .now() + 15)
        return lock.withLock { log }
    }

    /// The message data read by `.readData`, lines joined with `\n`, dot-stuffing kept.
    var data: String { lock.withLock { storedData } }
}
