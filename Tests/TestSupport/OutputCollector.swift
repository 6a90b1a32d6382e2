import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Drains one output pipe of a child on a thread of its own (so the child never blocks on a
/// full pipe; the thread ends at the pipe's end) and lets a test wait for lines instead of
/// sleeping.
public final class OutputCollector: @unchecked Sendable {  // state guarded by `condition`
    private let condition = NSCondition()
    private var bytes: [UInt8] = []
    private var ended = false

    /// Starts reading `handle` (a duplicate of its descriptor, closed at EOF).
    public init(reading handle: FileHandle) {
        let fd = dup(handle.fileDescriptor)
        if fd < 0 {
            bytes = Array("[test harness: cannot read the pipe: errno \(errno)]\n".utf8)
            ended = true
            return
        }
        let thread = Thread { [self] in
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count < 0 && errno == EINTR { continue }
                let failure = count < 0 ? "[test harness: reading the pipe failed: errno \(errno)]\n" : ""
                condition.lock()
                if count > 0 { bytes.append(contentsOf: chunk[0..<count]) } else { ended = true }
                bytes.append(contentsOf: failure.utf8)
                condition.broadcast()
                condition.unlock()
                if count <= 0 { break }
            }
            close(fd)
        }
        thread.start()
    }

    /// Everything read so far.
    public var text: String {
        condition.lock()
        defer { condition.unlock() }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Complete lines containing `needle`, in order.
    public func lines(containing needle: String) -> [String] {
        condition.lock()
        defer { condition.unlock() }
        return Self.completeLines(bytes).filter { $0.contains(needle) }
    }

    /// Waits until a complete line containing `needle` arrived and returns it; nil when the
    /// pipe ended or `timeout` passed first.
    public func waitForLine(containing needle: String, timeout: Double) -> String? {
        waitForLines(containing: needle, timeout: timeout)?.first
    }

    /// Waits until at least `count` complete lines contain `needle` (a server started again
    /// logs the same lines again); returns them, or nil when the pipe ended or `timeout`
    /// passed first.
    public func waitForLines(containing needle: String, count: Int = 1, timeout: Double) -> [String]? {
        let limit = Date(timeIntervalSinceNow: timeout)
        condition.lock()
        defer { condition.unlock() }
        while true {
            let lines = Self.completeLines(bytes).filter { $0.contains(needle) }
            if lines.count >= count { return lines }
            if ended || !condition.wait(until: limit) { return nil }
        }
    }

    /// Waits until the pipe ended (the child and everything it started exited).
    public func waitForEnd(timeout: Double) -> Bool {
        let limit = Date(timeIntervalSinceNow: timeout)
        condition.lock()
        defer { condition.unlock() }
        while !ended {
            if !condition.wait(until: limit) { return ended }
        }
        return true
    }

    /// The complete lines of `bytes` (the last element of a split is an unfinished line, or
    /// empty after a final newline).
    private static func completeLines(_ bytes: [UInt8]) -> [String] {
        String(decoding: bytes, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).dropLast()
            .map(String.init)
    }
}
