import Foundation
import HTTPServer
import Synchronization

/// The access log: one line per answered request, in the log's format (text or JSON) and
/// with the same fields a `Logger` line would have, written to standard error.
///
/// Lines are formatted straight into bytes and written in batches (when the event loop is
/// about to wait, or when a batch nears 4 KiB), not one `write(2)` per request: the log
/// stays on at the default level without costing throughput. A batch stays under
/// `PIPE_BUF`, so lines from other threads never land inside one.
final class AccessLog: Sendable {
    struct Entry {
        var method: String
        var path: String
        var status: Int
        var nanoseconds: UInt64
        var requestID: String
        var userID: UUID?
        /// The client's address (the peer, or whom a trusted proxy forwarded). Written as it
        /// is: the event loop made it from a socket address or a parsed `IPAddress`, so it holds
        /// only `[0-9a-f.:]`. Empty: no `client` field.
        var client: String = ""
    }

    private let format: Configuration.LogFormat
    private let label: String
    private let state = Mutex(State())

    private struct State {
        var buffer: [UInt8] = []
        var second = -1
        var secondPrefix: [UInt8] = []
    }

    private static let batchLimit = 3 * 1024

    init(format: Configuration.LogFormat, label: String = "trunk-sync.http") {
        self.format = format
        self.label = label
    }

    func record(_ entry: Entry) {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        state.withLock { state in
            if state.buffer.capacity == 0 { state.buffer.reserveCapacity(4096) }
            if time.tv_sec != state.second {
                state.second = time.tv_sec
                state.secondPrefix = Self.secondPrefix(time.tv_sec)
            }
            let before = state.buffer.count
            append(entry, milliseconds: Int(time.tv_nsec / 1_000_000), prefix: state.secondPrefix, to: &state.buffer)
            if state.buffer.count > Self.batchLimit {
                // Write what came before this line, keep this line for the next batch.
                let line = Array(state.buffer[before...])
                state.buffer.removeLast(state.buffer.count - before)
                Self.write(state.buffer)
                state.buffer.removeAll(keepingCapacity: true)
                state.buffer.append(contentsOf: line)
            }
        }
    }

    /// Writes what is buffered.
    func flush() {
        state.withLock { state in
            guard !state.buffer.isEmpty else { return }
            Self.write(state.buffer)
            state.buffer.removeAll(keepingCapacity: true)
        }
    }

    /// Appends the line of `entry` (newline included) to `out`: `prefix` is the
    /// `secondPrefix` of the current second, `milliseconds` the part after it.
    func append(_ entry: Entry, milliseconds: Int, prefix: [UInt8], to out: inout [UInt8]) {
        let duration = entry.nanoseconds / 10_000  // hundredths of a millisecond
        switch format {
        case .text:
            out.append(contentsOf: prefix)
            Self.appendPadded(milliseconds, width: 3, to: &out)
            out.append(contentsOf: "Z info ".utf8)
            out.append(contentsOf: label.utf8)
            out.append(contentsOf: ": request".utf8)
            if !entry.client.isEmpty {
                out.append(contentsOf: " client=".utf8)
                out.append(contentsOf: entry.client.utf8)
            }
            out.append(contentsOf: " duration_ms=".utf8)
            Self.appendHundredths(duration, to: &out)
            out.append(contentsOf: " method=".utf8)
            out.append(contentsOf: entry.method.utf8)
            out.append(contentsOf: " path=".utf8)
            out.append(contentsOf: entry.path.utf8)
            out.append(contentsOf: " request_id=".utf8)
            out.append(contentsOf: entry.requestID.utf8)
            out.append(contentsOf: " status=".utf8)
            Self.appendPadded(entry.status, width: 1, to: &out)
            if let user = entry.userID {
                out.append(contentsOf: " user_id=".utf8)
                out.append(contentsOf: UUIDText.lowercase(user).utf8)
            }
        case .json:
            out.append(contentsOf: "{\"ts\":\"".utf8)
            out.append(contentsOf: prefix)
            Self.appendPadded(milliseconds, width: 3, to: &out)
            out.append(contentsOf: "Z\",\"level\":\"info\",\"logger\":".utf8)
            out.append(contentsOf: JSONText.quote(label).utf8)
            out.append(contentsOf: ",\"msg\":\"request\",".utf8)
            if !entry.client.isEmpty {
                out.append(contentsOf: "\"client\":\"".utf8)
                out.append(contentsOf: entry.client.utf8)
                out.append(contentsOf: "\",".utf8)
            }
            out.append(contentsOf: "\"duration_ms\":\"".utf8)
            Self.appendHundredths(duration, to: &out)
            out.append(contentsOf: "\",\"method\":".utf8)
            out.append(contentsOf: JSONText.quote(entry.method).utf8)
            out.append(contentsOf: ",\"path\":".utf8)
            out.append(contentsOf: JSONText.quote(entry.path).utf8)
            out.append(contentsOf: ",\"request_id\":\"".utf8)
            out.append(contentsOf: entry.requestID.utf8)  // [A-Za-z0-9._:-] only
            out.append(contentsOf: "\",\"status\":\"".utf8)
            Self.appendPadded(entry.status, width: 1, to: &out)
            out.append(UInt8(ascii: "\""))
            if let user = entry.userID {
                out.append(contentsOf: ",\"user_id\":\"".utf8)
                out.append(contentsOf: UUIDText.lowercase(user).utf8)
                out.append(UInt8(ascii: "\""))
            }
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "\n"))
    }

    /// `YYYY-MM-DDTHH:MM:SS.` for a second of UTC.
    static func secondPrefix(_ second: Int) -> [UInt8] {
        var seconds = time_t(second)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        var out: [UInt8] = []
        appendPadded(Int(parts.tm_year) + 1900, width: 4, to: &out)
        out.append(UInt8(ascii: "-"))
        appendPadded(Int(parts.tm_mon) + 1, width: 2, to: &out)
        out.append(UInt8(ascii: "-"))
        appendPadded(Int(parts.tm_mday), width: 2, to: &out)
        out.append(UInt8(ascii: "T"))
        appendPadded(Int(parts.tm_hour), width: 2, to: &out)
        out.append(UInt8(ascii: ":"))
        appendPadded(Int(parts.tm_min), width: 2, to: &out)
        out.append(UInt8(ascii: ":"))
        appendPadded(Int(parts.tm_sec), width: 2, to: &out)
        out.append(UInt8(ascii: "."))
        return out
    }

    /// `value` in decimal, left-padded with zeros to `width` digits (no allocation).
    static func appendPadded(_ value: Int, width: Int, to out: inout [UInt8]) {
        var rest = max(value, 0)
        var count = 1
        var power = 10
        while rest >= power, count < 19 {
            count += 1
            power &*= 10
        }
        if count < width { out.append(contentsOf: repeatElement(UInt8(ascii: "0"), count: width - count)) }
        let start = out.count
        out.append(contentsOf: repeatElement(UInt8(ascii: "0"), count: count))
        var index = start + count - 1
        repeat {
            out[index] = UInt8(ascii: "0") + UInt8(rest % 10)
            rest /= 10
            index -= 1
        } while rest > 0
    }

    /// Hundredths as `12.34`.
    static func appendHundredths(_ hundredths: UInt64, to out: inout [UInt8]) {
        appendPadded(Int(hundredths / 100), width: 1, to: &out)
        out.append(UInt8(ascii: "."))
        appendPadded(Int(hundredths % 100), width: 2, to: &out)
    }

    private static func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { buffer in
            guard let base = buffer.baseAddress else { return }
            var offset = 0
            while offset < buffer.count {
                let written = Foundation.write(STDERR_FILENO, base + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    return
                }
                offset += written
            }
        }
    }
}
