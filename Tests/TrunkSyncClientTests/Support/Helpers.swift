import Foundation
import TestSupport

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// One plain HTTP exchange (not through the client library), for checks like "is this
/// token still accepted".
func rawRequest(
    _ method: String, _ url: URL, token: String? = nil, body: String? = nil, timeout: TimeInterval = 30
) async throws -> (status: Int, body: String) {
    var request = URLRequest(url: url)
    request.httpMethod = method
    request.timeoutInterval = timeout
    if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
    if let body {
        request.httpBody = Data(body.utf8)
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
    }
    return try await withCheckedThrowingContinuation { continuation in
        URLSession.shared.dataTask(with: request) { data, response, error in
            if let error {
                continuation.resume(throwing: error)
            } else {
                continuation.resume(
                    returning: (
                        (response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data ?? Data(), as: UTF8.self)
                    ))
            }
        }.resume()
    }
}

/// The example executable in a child process, with pipes on stdin, stdout and stderr.
final class ExampleProcess {
    let process = Process()
    let stdin = Pipe()
    let stdout: OutputCollector
    let stderr: OutputCollector

    init(_ executable: String, _ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = Command.environment([:])
        let out = Pipe()
        let err = Pipe()
        process.standardInput = stdin
        process.standardOutput = out
        process.standardError = err
        try process.run()
        stdout = OutputCollector(reading: out.fileHandleForReading)
        stderr = OutputCollector(reading: err.fileHandleForReading)
    }

    func write(_ text: String) { stdin.fileHandleForWriting.write(Data(text.utf8)) }

    /// Waits for the exit (at most `timeout`); its status, or nil if it still runs.
    func waitForExit(timeout: Double) -> Int32? {
        let deadline = Date(timeIntervalSinceNow: timeout)
        while process.isRunning {
            if Date() > deadline { return nil }
            Thread.sleep(forTimeInterval: 0.01)
        }
        _ = stdout.waitForEnd(timeout: 5)
        _ = stderr.waitForEnd(timeout: 5)
        return process.terminationStatus
    }

    func kill() {
        if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    var output: String { stdout.text + stderr.text }
}

/// A counter shared with callbacks.
final class Counter: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var value = 0
    func increment() -> Int {
        lock.withLock {
            value += 1
            return value
        }
    }
    var current: Int { lock.withLock { value } }
}

/// Something a background thread finishes and a test waits for.
final class Done: @unchecked Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    func signal() { semaphore.signal() }
    func wait(timeout: Double) -> Bool { semaphore.wait(timeout: .now() + timeout) == .success }
}

/// Opens once; every wait after that returns at once.
final class Latch: @unchecked Sendable {  // guarded by `condition`
    private let condition = NSCondition()
    private var isOpen = false

    func open() {
        condition.withLock {
            isOpen = true
            condition.broadcast()
        }
    }

    /// Whether it opened within `timeout` seconds.
    func wait(timeout: Double) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        return condition.withLock {
            while !isOpen { if !condition.wait(until: deadline) { return isOpen } }
            return true
        }
    }
}
