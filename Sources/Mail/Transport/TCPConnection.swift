import Glibc

/// A point on the monotonic clock by which an operation must finish.
struct Deadline: Sendable {
    let uptimeNanoseconds: UInt64

    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    /// `duration` from now.
    static func after(_ duration: Duration) -> Deadline {
        let (seconds, attoseconds) = duration.components
        let nanoseconds = max(0, seconds) * 1_000_000_000 + max(0, attoseconds) / 1_000_000_000
        return Deadline(uptimeNanoseconds: now() &+ UInt64(clamping: nanoseconds))
    }

    /// Milliseconds left, rounded up, for poll(2); 0 once passed.
    var remainingMilliseconds: Int32 {
        let current = Self.now()
        guard uptimeNanoseconds > current else { return 0 }
        return Int32(clamping: (uptimeNanoseconds - current + 999_999) / 1_000_000)
    }
}

/// Why a socket operation failed; `SMTPSession` turns it into a `MailError` with context.
enum SocketFailure: Error, Equatable {
    /// The deadline passed.
    case timedOut
    /// The peer closed the connection.
    case closed
    /// A system call failed with this errno.
    case system(Int32)

    /// `strerror` text.
    var reason: String {
        switch self {
        case .timedOut: return "timed out"
        case .closed: return "connection closed"
        case .system(let code): return String(cString: strerror(code))
        }
    }
}

/// A TCP connection made of the raw Glibc calls: a non-blocking socket that one thread
/// drives with poll(2), so every connect, read and write ends by its deadline. Writes use
/// `MSG_NOSIGNAL`: a peer that went away gives `EPIPE`, never `SIGPIPE`.
final class TCPConnection {
    let descriptor: Int32
    private var isClosed = false

    private init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    deinit { close() }

    /// Resolves `host` (blocking, as getaddrinfo is) and connects to the first of its
    /// addresses that accepts within `timeout` (each address gets the full timeout).
    /// - Throws: `MailError` of kind `.connectionFailed`.
    static func connect(host: String, port: Int, timeout: Duration, endpoint: String) throws -> TCPConnection {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var results: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &results)
        guard status == 0, let first = results else {
            let reason = status == EAI_SYSTEM ? String(cString: strerror(errno)) : String(cString: gai_strerror(status))
            throw MailError(.connectionFailed, "cannot resolve SMTP server \(endpoint): \(reason)")
        }
        defer { freeaddrinfo(results) }

        var lastFailure = SocketFailure.system(ECONNREFUSED)
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let address = entry {
            entry = address.pointee.ai_next
            let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
            let descriptor = socket(address.pointee.ai_family, type, address.pointee.ai_protocol)
            guard descriptor >= 0 else {
                lastFailure = .system(errno)
                continue
            }
            let connection = TCPConnection(descriptor: descriptor)
            do {
                try connection.finishConnect(to: address.pointee, deadline: .after(timeout))
                return connection
            } catch {
                lastFailure = error
            }
        }
        if lastFailure == .timedOut {
            throw MailError(
                .connectionFailed,
                "cannot connect to SMTP server \(endpoint): no answer within \(Self.seconds(timeout))")
        }
        throw MailError(.connectionFailed, "cannot connect to SMTP server \(endpoint): \(lastFailure.reason)")
    }

    private func finishConnect(to address: addrinfo, deadline: Deadline) throws(SocketFailure) {
        if Glibc.connect(descriptor, address.ai_addr, address.ai_addrlen) == 0 { return }
        // A non-blocking connect interrupted by a signal goes on in the background, like EINPROGRESS.
        guard errno == EINPROGRESS || errno == EINTR else { throw .system(errno) }
        try wait(for: Int16(POLLOUT), deadline: deadline)
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(descriptor, SOL_SOCKET, SO_ERROR, &error, &length) == 0 else { throw .system(errno) }
        guard error == 0 else { throw .system(error) }
    }

    /// Waits until the socket is ready for `events` (POLLIN/POLLOUT) or the deadline passes.
    private func wait(for events: Int16, deadline: Deadline) throws(SocketFailure) {
        while true {
            var descriptorSet = pollfd(fd: descriptor, events: events, revents: 0)
            let timeout = deadline.remainingMilliseconds
            guard timeout > 0 else { throw .timedOut }
            let ready = poll(&descriptorSet, 1, timeout)
            if ready > 0 { return }  // Errors and hang-ups surface in the call that follows.
            if ready == 0 { throw .timedOut }
            guard errno == EINTR else { throw .system(errno) }
        }
    }

    /// Writes all of `bytes` by `deadline`.
    func write(_ bytes: ArraySlice<UInt8>, deadline: Deadline) throws(SocketFailure) {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { raw in
                send(descriptor, raw.baseAddress.map { $0 + offset }, raw.count - offset, Int32(MSG_NOSIGNAL))
            }
            if sent >= 0 {
                offset += sent
                continue
            }
            switch errno {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK: try wait(for: Int16(POLLOUT), deadline: deadline)
            case EPIPE, ECONNRESET: throw .closed
            case let code: throw .system(code)
            }
        }
    }

    /// Reads what is available (at least one byte) into the start of `buffer` by `deadline`.
    /// - Returns: the number of bytes read.
    /// - Throws: `.closed` when the peer closed the connection.
    func read(into buffer: inout [UInt8], deadline: Deadline) throws(SocketFailure) -> Int {
        guard !buffer.isEmpty else { return 0 }
        while true {
            let received = buffer.withUnsafeMutableBytes { raw in recv(descriptor, raw.baseAddress, raw.count, 0) }
            if received > 0 { return received }
            if received == 0 { throw .closed }
            switch errno {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK: try wait(for: Int16(POLLIN), deadline: deadline)
            case ECONNRESET: throw .closed
            case let code: throw .system(code)
            }
        }
    }

    /// This end's address as an SMTP address literal (`[192.0.2.1]`, `[IPv6:2001:db8::1]`),
    /// for `EHLO` when the machine has no fully qualified name.
    func localAddressLiteral() -> String? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let status = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        guard status == 0 else { return nil }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        switch Int32(storage.ss_family) {
        case AF_INET:
            let converted = withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { address in
                    withUnsafePointer(to: address.pointee.sin_addr) {
                        inet_ntop(AF_INET, $0, &text, socklen_t(text.count))
                    }
                }
            }
            guard converted != nil else { return nil }
            return "[\(String(nulTerminated: text))]"
        case AF_INET6:
            let converted = withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { address in
                    withUnsafePointer(to: address.pointee.sin6_addr) {
                        inet_ntop(AF_INET6, $0, &text, socklen_t(text.count))
                    }
                }
            }
            guard converted != nil else { return nil }
            return "[IPv6:\(String(nulTerminated: text))]"
        default:
            return nil
        }
    }

    /// Closes the socket (once).
    func close() {
        guard !isClosed else { return }
        isClosed = true
        // close(2) is not retried on EINTR on Linux: the descriptor is released either way.
        _ = Glibc.close(descriptor)
    }

    /// `1.5 s`, `10 s`: how errors show a timeout.
    static func seconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        let tenths = attoseconds / 100_000_000_000_000_000
        return tenths == 0 ? "\(seconds) s" : "\(seconds).\(tenths) s"
    }
}

extension String {
    /// The UTF-8 text in `buffer` up to its first NUL.
    init(nulTerminated buffer: [CChar]) {
        self.init(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
