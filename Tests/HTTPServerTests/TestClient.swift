import Foundation
import XCTest

/// Polls `condition` until it holds, failing after `seconds`.
func eventually(
    within seconds: Double = 10, file: StaticString = #filePath, line: UInt = #line, _ condition: () throws -> Bool
) throws {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return }
        Thread.sleep(forTimeInterval: 0.01)
    }
    XCTFail("condition not met within \(seconds) s", file: file, line: line)
}

/// A blocking loopback client with a receive timeout.
final class TestClient {
    struct Failure: Error, CustomStringConvertible { let description: String }

    let fd: Int32
    private var pending: [UInt8] = []
    private var closed = false
    /// The server closed the connection (or reset it).
    private(set) var isClosedByPeer = false

    init(port: Int, receiveBuffer: Int32? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        if var size = receiveBuffer {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else { throw Failure(description: "connect: errno \(errno)") }
    }

    deinit { close() }

    func close() {
        guard !closed else { return }
        closed = true
        Glibc.close(fd)
    }

    func send(_ text: String) throws {
        let bytes = Array(text.utf8)
        let sent = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard sent == bytes.count else { throw Failure(description: "send: errno \(errno)") }
    }

    /// Reads more into `pending`; false at EOF.
    private func receive() throws -> Bool {
        var buffer = [UInt8](repeating: 0, count: 65536)
        let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count > 0 {
            pending.append(contentsOf: buffer[0..<count])
            return true
        }
        if count == 0 || errno == ECONNRESET {
            isClosedByPeer = true
            return false
        }
        throw Failure(description: "recv: errno \(errno) with \(pending.count) bytes pending")
    }

    private func line() throws -> String {
        while true {
            if let end = pending.firstIndex(of: 10), end > 0, pending[end - 1] == 13 {
                let text = String(decoding: pending[..<(end - 1)], as: UTF8.self)
                pending.removeFirst(end + 1)
                return text
            }
            guard try receive() else { throw Failure(description: "closed before a line ended") }
        }
    }

    /// Status and body of the next response (a `Content-Length` one).
    func readResponse() throws -> (status: Int, body: String) {
        let head = try readHead()
        let lines = head.split(separator: "\r\n")
        let status = lines.first.flatMap { Int($0.split(separator: " ")[1]) } ?? 0
        let length =
            lines.first { $0.lowercased().hasPrefix("content-length:") }
            .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
        while pending.count < length {
            guard try receive() else { throw Failure(description: "closed inside a body") }
        }
        defer { pending.removeFirst(length) }
        return (status, String(decoding: pending[..<length], as: UTF8.self))
    }

    func readHead() throws -> String {
        var head = ""
        while true {
            let next = try line()
            if next.isEmpty { return head }
            head += next + "\r\n"
        }
    }

    /// One chunk's data; nil for the last chunk.
    func readChunk() throws -> String? {
        guard let size = Int(try line(), radix: 16) else { throw Failure(description: "bad chunk size") }
        while pending.count < size + 2 {
            guard try receive() else { throw Failure(description: "closed inside a chunk") }
        }
        let data = String(decoding: pending[..<size], as: UTF8.self)
        pending.removeFirst(size + 2)
        return size == 0 ? nil : data
    }

    func readChunkedBody() throws -> String {
        var body = ""
        while let chunk = try readChunk() { body += chunk }
        return body
    }

    func readUntilClose() throws -> [UInt8] {
        while try receive() {}
        defer { pending = [] }
        return pending
    }

    func waitForClose() throws -> Bool {
        while try receive() {}
        return true
    }
}
