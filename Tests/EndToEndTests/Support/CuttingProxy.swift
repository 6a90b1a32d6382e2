import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A TCP proxy in front of PostgreSQL that reads the client's side of the protocol and,
/// when armed, cuts a connection just before a statement that calls `pg_notify` reaches the
/// server: the statements before it (a push's `commit`) run, the notification never does,
/// and the client then sees its connection lost with no answer. Everything else is passed
/// through unchanged, both ways. For the lost-notification tests (issue 23).
///
/// Each connection has two threads (one per direction) and the proxy one accepting; `stop()`
/// closes every socket and joins them all.
final class CuttingProxy: @unchecked Sendable {  // mutable state behind `state`
    private struct State {
        var cutsLeft = 0
        var cuts = 0
        var sockets: Set<Int32> = []
        var stopped = false
    }

    let port: Int
    private let listener: Int32
    private let targetPort: Int
    private let state = Mutex(State())
    private let done = DispatchGroup()

    /// Listens on a port of 127.0.0.1 the kernel chooses and forwards to `targetPort` there.
    init(targetPort: Int) throws {
        self.targetPort = targetPort
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw ClientError("proxy: socket failed") }
        var address = Self.loopback(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, Glibc.listen(listener, 64) == 0 else {
            close(listener)
            throw ClientError("proxy: bind/listen failed")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        self.listener = listener
        port = Int(UInt16(bigEndian: address.sin_port))
        spawn { [self] in acceptLoop() }
    }

    /// The next `count` statements calling `pg_notify` are cut off (each with its connection).
    func cutBeforeNotify(count: Int = 1) { state.withLock { $0.cutsLeft = count } }

    /// Connections cut so far.
    var cuts: Int { state.withLock { $0.cuts } }

    /// `url` (a `postgres://…@127.0.0.1:PORT/db` URL) through the proxy instead.
    func proxied(_ url: String) -> String {
        url.replacingOccurrences(of: "127.0.0.1:\(targetPort)/", with: "127.0.0.1:\(port)/")
            + (url.contains("?") ? "&" : "?") + "sslmode=disable&gssencmode=disable"
    }

    /// Closes every socket and joins every thread.
    func stop() {
        let sockets = state.withLock { state -> Set<Int32> in
            state.stopped = true
            return state.sockets
        }
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        for fd in sockets { shutdown(fd, Int32(SHUT_RDWR)) }
        done.wait()
        for fd in state.withLock({ $0.sockets }) { close(fd) }
    }

    private static func loopback(port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return address
    }

    private func spawn(_ body: @escaping @Sendable () -> Void) {
        done.enter()
        let thread = Thread { [done] in
            body()
            done.leave()
        }
        thread.start()
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                return
            }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = Self.loopback(port: UInt16(targetPort))
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            let admitted = state.withLock { state -> Bool in
                guard !state.stopped, connected == 0 else { return false }
                state.sockets.formUnion([client, server])
                return true
            }
            guard admitted else {
                close(client)
                close(server)
                continue
            }
            spawn { [self] in frontend(from: client, to: server) }
            spawn { Self.pump(from: server, to: client) }
        }
    }

    /// Server to client: bytes as they come.
    private static func pump(from source: Int32, to target: Int32) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(source, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count > 0, send(target, buffer, count) else { break }
        }
        shutdown(target, Int32(SHUT_RDWR))
        shutdown(source, Int32(SHUT_RDWR))
    }

    /// Writes `count` bytes; false once the peer is gone (`MSG_NOSIGNAL`: a closed peer is
    /// `EPIPE`, not a `SIGPIPE` that ends the test process).
    private static func send(_ fd: Int32, _ bytes: [UInt8], _ count: Int) -> Bool {
        var offset = 0
        while offset < count {
            let written = bytes.withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress! + offset, count - offset, Int32(MSG_NOSIGNAL))
            }
            if written < 0, errno == EINTR { continue }
            guard written > 0 else { return false }
            offset += written
        }
        return true
    }

    /// Client to server, message by message: the start-up messages (no type byte), then
    /// typed ones. `Parse` names a statement's text; a `Parse` or `Bind` of a text calling
    /// `pg_notify` is where an armed proxy cuts (what came before it is forwarded).
    private func frontend(from client: Int32, to server: Int32) {
        var pending: [UInt8] = []
        var startup = true
        var statements: [String: String] = [:]
        var buffer = [UInt8](repeating: 0, count: 65536)
        reading: while true {
            let count = buffer.withUnsafeMutableBytes { read(client, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { break }
            pending.append(contentsOf: buffer[0..<count])
            var forward = 0  // bytes of `pending` that are whole messages to pass on
            var cut = false
            while true {
                let header = startup ? 4 : 5
                guard pending.count - forward >= header else { break }
                let lengthAt = forward + (startup ? 0 : 1)
                let length = pending[lengthAt..<lengthAt + 4].reduce(0) { $0 << 8 | Int($1) }
                let total = length + (startup ? 0 : 1)
                guard length >= 4, pending.count - forward >= total else { break }
                if startup {
                    // SSLRequest / GSSENCRequest are followed by another start-up message.
                    let code = pending[forward + 4..<forward + 8].reduce(0) { $0 << 8 | Int($1) }
                    startup = code == 80_877_103 || code == 80_877_104
                } else {
                    let body = Array(pending[forward + 5..<forward + total])
                    let strings = body.split(separator: 0, maxSplits: 2, omittingEmptySubsequences: false).map {
                        String(decoding: $0, as: UTF8.self)
                    }
                    var text: String? = nil
                    switch pending[forward] {
                    case UInt8(ascii: "P") where strings.count >= 2:
                        statements[strings[0]] = strings[1]
                        text = strings[1]
                    case UInt8(ascii: "B") where strings.count >= 2:
                        text = statements[strings[1]]
                    default: break
                    }
                    if let text, text.contains("pg_notify"), takeCut() {
                        cut = true
                        break
                    }
                }
                forward += total
            }
            guard Self.send(server, pending, forward) else { break }
            pending.removeFirst(forward)
            if cut { break reading }
        }
        // The server reads what it was sent, then the end: it runs those statements, and
        // only once it has closed its side does the client see the connection end (the
        // other thread), as when a connection is cut after the server did its part.
        shutdown(server, Int32(SHUT_WR))
    }

    private func takeCut() -> Bool {
        state.withLock { state in
            guard state.cutsLeft > 0 else { return false }
            state.cutsLeft -= 1
            state.cuts += 1
            return true
        }
    }
}
