import Foundation
import Glibc

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
