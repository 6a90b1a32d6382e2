import Foundation
import Glibc
import Synchronization

/// A TCP socket listening on 127.0.0.1 at a free port that never accepts: the kernel
/// completes connections into its backlog, and then nothing is ever said.
public final class SilentServer: Sendable {
    /// Where it listens.
    public let port: Int
    private let descriptor: Int32

    /// Listens at a free port.
    public init() throws {
        (descriptor, port) = try listeningSocket()
    }

    deinit { close(descriptor) }
}

/// A TCP server on 127.0.0.1 at a free port that accepts every connection, holds it open
/// and never says anything, counting what it accepted: a database that does not answer,
/// with a way to tell that a client's next connection attempt has begun.
public final class MuteServer: Sendable {
    /// Where it listens.
    public let port: Int
    private let descriptor: Int32
    private let shared = Shared()
    private let ended = DispatchSemaphore(value: 0)

    private final class Shared: Sendable {
        let state = Mutex<(accepted: [Int32], stopped: Bool)>(([], false))
    }

    /// Listens at a free port and accepts on a thread of its own until `stop()`.
    public init() throws {
        (descriptor, port) = try listeningSocket()
        Thread { [descriptor, shared, ended] in
            while true {
                let client = accept(descriptor, nil, nil)
                let stop = shared.state.withLock { state in
                    if client >= 0 { state.accepted.append(client) }
                    return state.stopped
                }
                if stop || (client < 0 && errno != EINTR && errno != ECONNABORTED) { break }
            }
            ended.signal()
        }.start()
    }

    /// How many connections it accepted so far.
    public var accepted: Int { shared.state.withLock { $0.accepted.count } }

    /// Stops accepting and closes every connection. Safe to call twice.
    public func stop() {
        let sockets = shared.state.withLock { state -> [Int32]? in
            guard !state.stopped else { return nil }
            state.stopped = true
            defer { state.accepted = [] }
            return state.accepted
        }
        guard let sockets else { return }
        shutdown(descriptor, Int32(SHUT_RDWR))  // wakes the accept
        ended.wait()
        close(descriptor)
        sockets.forEach { close($0) }
    }

    deinit { stop() }
}

/// A port on 127.0.0.1 where nothing listens (bound once, then released).
public func unusedPort() throws -> Int {
    let (descriptor, port) = try listeningSocket()
    close(descriptor)
    return port
}

/// A socket listening on 127.0.0.1 at a free port, and the port.
public func listeningSocket() throws -> (Int32, Int) {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard descriptor >= 0 else { throw TestEnvironmentError("socket failed: errno \(errno)") }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(descriptor, pointer, length) == 0 && listen(descriptor, 16) == 0
                && getsockname(descriptor, pointer, &length) == 0
        }
    }
    guard bound else {
        close(descriptor)
        throw TestEnvironmentError("cannot listen on 127.0.0.1: errno \(errno)")
    }
    return (descriptor, Int(UInt16(bigEndian: address.sin_port)))
}

/// A port for a server a test starts itself (on any address), free now and below the
/// kernel's ephemeral range (`ip_local_port_range`): neither an outgoing connection's local
/// port nor another test's port-0 listener (both taken from that range) can take it before
/// the server binds it, as one picked by binding port 0 could be.
public func serverPort() throws -> Int {
    let range = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
    let low = range.split(whereSeparator: \.isWhitespace).first.flatMap { Int($0) } ?? 32768
    let candidates = low > 11000 ? 10000..<low : 1024..<low
    for _ in 0..<200 {
        let port = Int.random(in: candidates)
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw TestEnvironmentError("socket failed: errno \(errno)") }
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = INADDR_ANY
        address.sin_port = UInt16(port).bigEndian
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
        if bound { return port }
    }
    throw TestEnvironmentError("no free port below \(low)")
}

/// Sends `request` (bytes as written, any method with any body) to 127.0.0.1:`port` and
/// returns everything the server answers until it closes the connection (send
/// `Connection: close`), or what arrived within 10 s. For requests URLSession would not send
/// as written (a `GET` with a body).
public func rawExchange(port: Int, _ request: String) throws -> String {
    let descriptor = try connectedSocket(port: port)
    defer { close(descriptor) }
    let bytes = Array(request.utf8)
    var sent = 0
    while sent < bytes.count {
        let count = bytes[sent...].withUnsafeBufferPointer {
            send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
        }
        // The server may answer (and stop reading) before the whole request is sent.
        if count <= 0 { break }
        sent += count
    }
    var received: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let count = recv(descriptor, &buffer, buffer.count, 0)
        if count <= 0 { break }
        received += buffer[0..<count]
    }
    return String(decoding: received, as: UTF8.self)
}

/// A TCP connection to 127.0.0.1:`port` whose reads give up after 10 s (the caller closes it);
/// with `receiveBuffer`, its receive buffer is that small (a client that reads nothing then
/// leaves most of an answer in the server's output).
public func connectedSocket(port: Int, receiveBuffer: Int32? = nil) throws -> Int32 {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard descriptor >= 0 else { throw TestEnvironmentError("socket failed: errno \(errno)") }
    if var size = receiveBuffer {
        setsockopt(descriptor, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = UInt16(port).bigEndian
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
        }
    }
    guard connected else {
        let error = errno
        close(descriptor)
        throw TestEnvironmentError("connect to \(port) failed: errno \(error)")
    }
    var timeout = timeval(tv_sec: 10, tv_usec: 0)
    setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    return descriptor
}
