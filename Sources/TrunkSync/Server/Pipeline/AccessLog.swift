import Foundation
import HTTPServer
import Synchronization

/// The access log: one line per answered request, in the log's format (text or JSON) and
/// with the same fields a `Logger` line would have, written to standard error.
///
/// Lines are formatted straight into bytes and written in batches, not one `write(2)` per
/// request: the log stays on at the default level without costing throughput. Each event
/// loop has a buffer of its own (no lock or cache line shared between loops on a request's
/// path). A loop writes its buffer when it is about to wait and its oldest line has waited
/// `linger` (10 ms; until then the loop sleeps no longer than that), when it stops, or when the
/// buffer nears its limit: a busy loop writes about once per `linger`, not once per batch of
/// events. The limit is 3 KiB when standard error is a pipe or anything but a regular file, so
/// a batch stays under `PIPE_BUF` and lines from other threads never land inside one; 32 KiB
/// when it is a regular file (an append is not interleaved there). Lines recorded on any other
/// thread share one more buffer, written by the next loop that waits (or `flush()`).
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
    /// What follows the milliseconds up to the first field, the same on every line:
    /// `Z info <label>: request` (text), `Z","level":"info","logger":"<label>","msg":"request",` (JSON).
    private let lineHead: [UInt8]
    private let output: Int32
    /// Bytes a buffer holds before it is written.
    let batchLimit: Int
    /// How long (nanoseconds) a line may wait in a loop's buffer.
    let linger: Int
    /// The time of a line (`CLOCK_REALTIME`; a test's clock).
    private let clock: @Sendable () -> timespec
    /// One buffer per event loop (by `LoopExecutor.index`), then one for every other thread.
    private let shards: [Shard]
    /// Lines wait in the last (shared) buffer: the next loop to wait writes them.
    private let othersPending = Atomic<Bool>(false)

    private final class Shard: Sendable {
        // Locked by its own loop only, except `flush()`: the lock is never contended on a
        // request's path. The padding keeps two loops' shards off one cache line.
        let state = Mutex(State())
        let padding: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0, 0)
    }

    private struct State {
        var buffer: [UInt8] = []
        /// When the buffer's oldest line was recorded (nanoseconds of `clock`).
        var oldestLine = 0
        var second = -1
        var secondPrefix: [UInt8] = []
    }

    /// Loops with a buffer of their own; a server with more (or another thread) shares the last one.
    static let loopBuffers = 64

    /// `output`: where lines go (standard error; a test's file). `linger`: the longest a line
    /// waits in a loop's buffer, in nanoseconds.
    init(
        format: Configuration.LogFormat, label: String = "trunk-sync.http", output: Int32 = STDERR_FILENO,
        linger: Int = 10_000_000, clock: @escaping @Sendable () -> timespec = AccessLog.realtime
    ) {
        self.format = format
        self.linger = linger
        self.clock = clock
        self.label = label
        lineHead = Array(
            (format == .text
                ? "Z info \(label): request"
                : "Z\",\"level\":\"info\",\"logger\":\(JSONText.quote(label)),\"msg\":\"request\",").utf8)
        self.output = output
        var status = stat()
        let regularFile = fstat(output, &status) == 0 && (status.st_mode & S_IFMT) == S_IFREG
        batchLimit = regularFile ? 32 * 1024 : 3 * 1024
        shards = (0...Self.loopBuffers).map { _ in Shard() }
    }

    @Sendable static func realtime() -> timespec {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return time
    }

    private static func nanoseconds(_ time: timespec) -> Int { time.tv_sec * 1_000_000_000 + time.tv_nsec }

    func record(_ entry: Entry) {
        let time = clock()
        let index = LoopExecutor.current.map { min($0.index, Self.loopBuffers) } ?? Self.loopBuffers
        shards[index].state.withLock { state in
            if state.buffer.capacity == 0 { state.buffer.reserveCapacity(batchLimit + 1024) }
            if time.tv_sec != state.second {
                state.second = time.tv_sec
                state.secondPrefix = Self.secondPrefix(time.tv_sec)
            }
            let before = state.buffer.count
            append(entry, milliseconds: Int(time.tv_nsec / 1_000_000), prefix: state.secondPrefix, to: &state.buffer)
            if before == 0 { state.oldestLine = Self.nanoseconds(time) }
            if state.buffer.count > batchLimit {
                // Write what came before this line, keep this line for the next batch.
                state.buffer.withUnsafeBytes { write(UnsafeRawBufferPointer(rebasing: $0[..<before])) }
                state.buffer.removeSubrange(..<before)
                state.oldestLine = Self.nanoseconds(time)
            }
        }
        if index == Self.loopBuffers { othersPending.store(true, ordering: .releasing) }
    }

    /// The calling loop is about to wait: writes its buffer if its oldest line has waited
    /// `linger` (and what other threads recorded). Returns the milliseconds until the lines
    /// it keeps are due, nil when it keeps none. On any other thread, the same as `flush()`.
    func loopWillWait() -> Int32? {
        guard let loop = LoopExecutor.current, loop.index < Self.loopBuffers else {
            flush()
            return nil
        }
        if othersPending.load(ordering: .relaxed) { writeOthers() }
        let now = Self.nanoseconds(clock())
        return shards[loop.index].state.withLock { state -> Int32? in
            guard !state.buffer.isEmpty else { return nil }
            let waited = now - state.oldestLine
            // A clock set back (waited < 0) writes at once rather than holding lines.
            if waited >= 0 && waited < linger { return Int32((linger - waited + 999_999) / 1_000_000) }
            state.buffer.withUnsafeBytes { write($0) }
            state.buffer.removeAll(keepingCapacity: true)
            return nil
        }
    }

    /// The calling loop stops: writes its buffer (and what other threads recorded). On any
    /// other thread, the same as `flush()`.
    func loopDidStop() {
        guard let loop = LoopExecutor.current, loop.index < Self.loopBuffers else { return flush() }
        write(shards[loop.index])
        writeOthers()
    }

    /// Writes everything buffered.
    func flush() {
        for shard in shards.dropLast() { write(shard) }
        writeOthers()
    }

    private func writeOthers() {
        othersPending.store(false, ordering: .relaxed)
        write(shards[Self.loopBuffers])
    }

    private func write(_ shard: Shard) {
        shard.state.withLock { state in
            guard !state.buffer.isEmpty else { return }
            state.buffer.withUnsafeBytes { write($0) }
            state.buffer.removeAll(keepingCapacity: true)
        }
    }

    /// Appends the line of `entry` (newline included) to `out`: `prefix` is the
    /// `secondPrefix` of the current second, `milliseconds` the part after it.
    func append(_ entry: Entry, milliseconds: Int, prefix: [UInt8], to out: inout [UInt8]) {
        let method = Self.cut(entry.method, to: Self.maxMethodBytes)
        let path = Self.cut(entry.path, to: Self.maxPathBytes)
        let duration = entry.nanoseconds / 10_000  // hundredths of a millisecond
        switch format {
        case .text:
            // Written on the stack and appended with one copy (a line is a dozen pieces).
            let variable =
                entry.client.utf8.count + method.utf8.count + path.utf8.count + entry.requestID.utf8.count
            ByteWriter.append(to: &out, capacity: Self.textLineFixedBytes + prefix.count + lineHead.count + variable) {
                line in
                line.write(prefix)
                line.writeDecimal(milliseconds, width: 3)
                line.write(lineHead)
                if !entry.client.isEmpty {
                    line.write(" client=")
                    line.write(entry.client)
                }
                line.write(" duration_ms=")
                line.writeDecimal(Int(duration / 100))
                line.write(UInt8(ascii: "."))
                line.writeDecimal(Int(duration % 100), width: 2)
                line.write(" method=")
                line.write(method)
                line.write(" path=")
                line.write(path)
                line.write(" request_id=")
                line.write(entry.requestID)
                line.write(" status=")
                line.writeDecimal(entry.status)
                if let user = entry.userID {
                    line.write(" user_id=")
                    line.write(UUIDText.lowercase(user))
                }
                line.write(UInt8(ascii: "\n"))
            }
            return
        case .json:
            out.append(utf8: "{\"ts\":\"")
            out.append(contentsOf: prefix)
            Self.appendPadded(milliseconds, width: 3, to: &out)
            out.append(contentsOf: lineHead)
            if !entry.client.isEmpty {
                out.append(utf8: "\"client\":\"")
                out.append(utf8: entry.client)
                out.append(utf8: "\",")
            }
            out.append(utf8: "\"duration_ms\":\"")
            Self.appendHundredths(duration, to: &out)
            out.append(utf8: "\",\"method\":")
            out.append(utf8: JSONText.quote(method))
            out.append(utf8: ",\"path\":")
            out.append(utf8: JSONText.quote(path))
            out.append(utf8: ",\"request_id\":\"")
            out.append(utf8: entry.requestID)  // [A-Za-z0-9._:-] only
            out.append(utf8: "\",\"status\":\"")
            Self.appendPadded(entry.status, width: 1, to: &out)
            out.append(UInt8(ascii: "\""))
            if let user = entry.userID {
                out.append(utf8: ",\"user_id\":\"")
                out.append(utf8: UUIDText.lowercase(user))
                out.append(UInt8(ascii: "\""))
            }
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "\n"))
    }

    /// The most bytes of a request's path and method a line holds (a request line may have
    /// 8 KiB): with them every line stays well under a pipe's batch (3 KiB), so a write is
    /// never split and interleaved with another thread's. A longer one is cut and ends in
    /// `…`, which no request target holds (they are visible ASCII).
    static let maxPathBytes = 1024
    static let maxMethodBytes = 32

    /// `text`, or its first `limit` bytes and `…` when it is longer.
    static func cut(_ text: String, to limit: Int) -> String {
        guard text.utf8.count > limit else { return text }
        return String(decoding: text.utf8.prefix(limit), as: UTF8.self) + "…"
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
        ByteWriter.append(to: &out, capacity: 20) { $0.writeDecimal(value, width: width) }
    }

    /// The most a text line holds besides its prefix, head and the fields' text: field
    /// names, numbers (at most 20 digits each), a user id, the newline.
    private static let textLineFixedBytes = 192

    /// Hundredths as `12.34`.
    static func appendHundredths(_ hundredths: UInt64, to out: inout [UInt8]) {
        appendPadded(Int(hundredths / 100), width: 1, to: &out)
        out.append(UInt8(ascii: "."))
        appendPadded(Int(hundredths % 100), width: 2, to: &out)
    }

    private func write(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress else { return }
        var offset = 0
        while offset < bytes.count {
            let written = Foundation.write(output, base + offset, bytes.count - offset)
            if written < 0 {
                if errno == EINTR { continue }
                return
            }
            offset += written
        }
    }
}
