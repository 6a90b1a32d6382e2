import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The client side failed (could not connect, the server closed early, a wait ran out).
struct ClientError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A point in time to wait until, on the monotonic clock.
struct Deadline {
    let end: ContinuousClock.Instant

    init(seconds: Double) {
        end = ContinuousClock.now.advanced(by: .milliseconds(Int64(seconds * 1000)))
    }

    var hasPassed: Bool { ContinuousClock.now >= end }

    /// Milliseconds left, for `poll(2)` (0 once passed).
    var pollTimeout: Int32 {
        let left = ContinuousClock.now.duration(to: end)
        if left <= .zero { return 0 }
        let (seconds, attoseconds) = left.components
        return Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
    }
}

/// Calls `condition` until it holds or `seconds` pass, pausing `interval` between tries.
/// Returns whether it held.
func eventually(within seconds: Double, interval: Duration = .milliseconds(10), _ condition: () throws -> Bool)
    rethrows -> Bool
{
    let deadline = Deadline(seconds: seconds)
    while true {
        if try condition() { return true }
        if deadline.hasPassed { return false }
        Thread.sleep(
            forTimeInterval: Double(interval.components.attoseconds) / 1e18 + Double(interval.components.seconds))
    }
}

/// One HTTP response exactly as the server sent it.
struct RawResponse {
    var version: String
    var status: Int
    var reason: String
    var headers: [(name: String, value: String)]
    var body: [UInt8]

    /// The first value of a header field (case-insensitive name).
    func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    /// Every value of a header field (case-insensitive name).
    func headerValues(_ name: String) -> [String] {
        headers.filter { $0.name.lowercased() == name.lowercased() }.map(\.value)
    }

    /// Whether the response announces `Connection: close`.
    var closesConnection: Bool { header("connection")?.lowercased() == "close" }

    var bodyText: String { String(decoding: body, as: UTF8.self) }

    /// The header lines that two answers to the same question must share: all but
    /// `X-Request-Id` and `Date` (for checks that an answer reveals nothing).
    var comparableHeaders: [String] {
        headers.filter { !["x-request-id", "date"].contains($0.name.lowercased()) }.map { "\($0.name): \($0.value)" }
    }

    /// The body as a JSON object, or nil.
    var jsonObject: [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any]
    }
}

/// A blocking-by-poll TCP client on raw POSIX sockets: sends exact bytes, reads exact
/// responses, and notices when the server closes. Every wait is bounded.
final class RawClient {
    enum ConnectOutcome {
        case connected(RawClient)
        case refused
        case failed(String)
    }

    let fd: Int32
    /// Bytes received and not consumed yet.
    private(set) var pending: [UInt8] = []
    /// The server closed its side (EOF) or reset the connection.
    private(set) var closedByPeer = false
    /// The server reset the connection (RST).
    private(set) var wasReset = false
    private var isClosed = false

    private init(fd: Int32) {
        self.fd = fd
    }

    deinit { close() }

    /// Connects to 127.0.0.1:`port` within `timeout`, or throws. `source`: the local
    /// address to connect from (any of 127.0.0.0/8, which Linux routes to the loopback
    /// interface), so one test can be many clients.
    static func connect(port: Int, from source: String? = nil, timeout: Double = 5) throws -> RawClient {
        switch tryConnect(port: port, from: source, timeout: timeout) {
        case .connected(let client): return client
        case .refused: throw ClientError("connection to port \(port) refused")
        case .failed(let reason): throw ClientError("cannot connect to port \(port): \(reason)")
        }
    }

    /// Connects to 127.0.0.1:`port` (from `source`, if given) within `timeout` and reports a
    /// refusal as such.
    static func tryConnect(port: Int, from source: String? = nil, timeout: Double = 5) -> ConnectOutcome {
        let fd = socket(
            AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failed("socket: errno \(errno)") }
        if let source {
            // Bound before connecting, so the server sees this address as the peer.
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            local.sin_port = 0
            local.sin_addr.s_addr = inet_addr(source)
            let bound = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard bound == 0 else {
                let code = errno
                Glibc.close(fd)
                return .failed("bind to \(source): errno \(code)")
            }
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        if result != 0 {
            if errno == ECONNREFUSED {
                Glibc.close(fd)
                return .refused
            }
            guard errno == EINPROGRESS else {
                let code = errno
                Glibc.close(fd)
                return .failed("connect: errno \(code)")
            }
            var entry = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            let deadline = Deadline(seconds: timeout)
            var ready: Int32 = 0
            repeat {
                ready = poll(&entry, 1, deadline.pollTimeout)
            } while ready < 0 && errno == EINTR
            guard ready > 0 else {
                Glibc.close(fd)
                return .failed("connect timed out")
            }
            var error: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
            if error == ECONNREFUSED {
                Glibc.close(fd)
                return .refused
            }
            if error != 0 {
                Glibc.close(fd)
                return .failed("connect: errno \(error)")
            }
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        return .connected(RawClient(fd: fd))
    }

    // MARK: - Sending

    /// Sends `text` as UTF-8 (all of it, within `timeout`).
    func send(_ text: String, timeout: Double = 5) throws {
        try send(Array(text.utf8), timeout: timeout)
    }

    /// Sends `bytes` (all of them, within `timeout`). Throws if the server closed or reset.
    func send(_ bytes: [UInt8], timeout: Double = 5) throws {
        let deadline = Deadline(seconds: timeout)
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { buffer in
                Glibc.send(fd, buffer.baseAddress.map { $0 + offset }, buffer.count - offset, Int32(MSG_NOSIGNAL))
            }
            if sent > 0 {
                offset += sent
                continue
            }
            if sent < 0 && errno == EINTR { continue }
            guard sent < 0, errno == EAGAIN || errno == EWOULDBLOCK else {
                throw ClientError("send failed after \(offset) of \(bytes.count) bytes: errno \(errno)")
            }
            guard try waitFor(Int16(POLLOUT), deadline: deadline) else {
                throw ClientError("send timed out after \(offset) of \(bytes.count) bytes")
            }
        }
    }

    // MARK: - Receiving

    /// Reads once (after waiting up to the deadline) into `pending`. False when nothing more
    /// will come (EOF, reset) or the deadline passed.
    @discardableResult
    private func receiveSome(deadline: Deadline) throws -> Bool {
        if closedByPeer { return false }
        while true {
            var chunk = [UInt8](repeating: 0, count: 65536)
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                pending.append(contentsOf: chunk[0..<count])
                return true
            }
            if count == 0 {
                closedByPeer = true
                return false
            }
            switch errno {
            case EINTR: continue
            case ECONNRESET, EPIPE:
                closedByPeer = true
                wasReset = true
                return false
            case EAGAIN, EWOULDBLOCK:
                guard try waitFor(Int16(POLLIN), deadline: deadline) else { return false }
            default:
                throw ClientError("recv failed: errno \(errno)")
            }
        }
    }

    private func waitFor(_ events: Int16, deadline: Deadline) throws -> Bool {
        var entry = pollfd(fd: fd, events: events, revents: 0)
        while true {
            let ready = poll(&entry, 1, deadline.pollTimeout)
            if ready > 0 { return true }
            if ready == 0 { return false }
            if errno != EINTR { throw ClientError("poll failed: errno \(errno)") }
        }
    }

    /// Reads one response. `bodyExpected: false` for answers to `HEAD` (no body follows
    /// whatever `Content-Length` says). 1xx, 204 and 304 never have a body.
    func readResponse(timeout: Double = 5, bodyExpected: Bool = true) throws -> RawResponse {
        let deadline = Deadline(seconds: timeout)
        let terminator: [UInt8] = [13, 10, 13, 10]
        var headEnd: Int? = nil
        while true {
            if let end = firstRange(of: terminator, in: pending) {
                headEnd = end
                break
            }
            guard try receiveSome(deadline: deadline) else { break }
        }
        guard let headEnd else {
            let what = closedByPeer ? (wasReset ? "reset" : "closed") : "timed out"
            throw ClientError(
                "connection \(what) before a complete response head; got \(pending.count) bytes: \(String(decoding: pending.prefix(300), as: UTF8.self).debugDescription)"
            )
        }
        let headText = String(decoding: pending[0..<headEnd], as: UTF8.self)
        pending.removeFirst(headEnd + 4)
        var lines = headText.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst()
        let parts = statusLine.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count >= 2, let status = Int(parts[1]) else {
            throw ClientError("bad status line \(statusLine.debugDescription)")
        }
        var headers: [(name: String, value: String)] = []
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else {
                throw ClientError("bad header line \(line.debugDescription)")
            }
            headers.append(
                (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        var response = RawResponse(
            version: String(parts[0]), status: status, reason: parts.count > 2 ? String(parts[2]) : "",
            headers: headers,
            body: [])
        if !bodyExpected || status < 200 || status == 204 || status == 304 { return response }
        if let lengthText = response.header("content-length") {
            guard let length = Int(lengthText) else { throw ClientError("bad Content-Length \(lengthText)") }
            while pending.count < length {
                guard try receiveSome(deadline: deadline) else {
                    throw ClientError("body incomplete: \(pending.count) of \(length) bytes")
                }
            }
            response.body = Array(pending[0..<length])
            pending.removeFirst(length)
        } else {
            while try receiveSome(deadline: deadline) {}
            guard closedByPeer else { throw ClientError("body without Content-Length did not end") }
            response.body = pending
            pending = []
        }
        return response
    }

    /// Reads one chunk of a chunked body (after its head was read with `bodyExpected:
    /// false`): its data, or nil for the last chunk (whose trailer line is consumed too).
    func readChunk(timeout: Double = 5) throws -> [UInt8]? {
        let deadline = Deadline(seconds: timeout)
        let crlf: [UInt8] = [13, 10]
        var lineEnd: Int? = firstRange(of: crlf, in: pending)
        while lineEnd == nil {
            guard try receiveSome(deadline: deadline) else {
                throw ClientError(closedByPeer ? "connection closed before a chunk" : "no chunk within \(timeout) s")
            }
            lineEnd = firstRange(of: crlf, in: pending)
        }
        guard let lineEnd else { return nil }
        let sizeText = String(decoding: pending[0..<lineEnd], as: UTF8.self)
        guard let size = Int(sizeText.split(separator: ";").first ?? "", radix: 16) else {
            throw ClientError("bad chunk size line \(sizeText.debugDescription)")
        }
        while pending.count < lineEnd + 2 + size + 2 {
            guard try receiveSome(deadline: deadline) else {
                throw ClientError(
                    closedByPeer ? "connection closed inside a chunk" : "chunk incomplete after \(timeout) s")
            }
        }
        let data = Array(pending[(lineEnd + 2)..<(lineEnd + 2 + size)])
        pending.removeFirst(lineEnd + 2 + size + 2)
        return size == 0 ? nil : data
    }

    /// Waits until the server closes the connection (EOF or reset), discarding what arrives
    /// meanwhile. True when it closed within `timeout`.
    func waitForClose(timeout: Double = 5) throws -> Bool {
        let deadline = Deadline(seconds: timeout)
        while try receiveSome(deadline: deadline) {
            pending = []
        }
        return closedByPeer
    }

    /// Whether nothing (no data, no EOF) arrives within `timeout`.
    func staysSilent(for timeout: Double) throws -> Bool {
        let deadline = Deadline(seconds: timeout)
        if !pending.isEmpty || closedByPeer { return false }
        _ = try receiveSome(deadline: deadline)
        return pending.isEmpty && !closedByPeer
    }

    /// Whether the connection is still open, without waiting: no EOF, reset or error is
    /// pending (unread data does not count as closed).
    var looksOpen: Bool {
        if closedByPeer { return false }
        var entry = pollfd(fd: fd, events: Int16(POLLIN) | pollReadHangUp, revents: 0)
        let ready = poll(&entry, 1, 0)
        if ready <= 0 { return true }
        return entry.revents & (pollReadHangUp | Int16(POLLHUP) | Int16(POLLERR)) == 0
    }

    // MARK: - Closing

    /// Closes the socket (FIN).
    func close() {
        guard !isClosed else { return }
        isClosed = true
        Glibc.close(fd)
    }

    /// Closes the socket with a reset (RST) instead of FIN.
    func reset() {
        guard !isClosed else { return }
        var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        close()
    }

    /// Shuts down the sending side (the server reads EOF; responses can still arrive).
    func shutdownWrite() {
        Glibc.shutdown(fd, Int32(SHUT_WR))
    }
}

/// `POLLRDHUP` (Linux; Glibc's module does not export it without _GNU_SOURCE).
private let pollReadHangUp: Int16 = 0x2000

private func firstRange(of needle: [UInt8], in haystack: [UInt8]) -> Int? {
    guard haystack.count >= needle.count else { return nil }
    var index = 0
    while index + needle.count <= haystack.count {
        if haystack[index] == needle[0] && Array(haystack[index..<index + needle.count]) == needle { return index }
        index += 1
    }
    return nil
}
