import Foundation

/// A real SMTP server for the tests: `scripts/smtp-sink.py` (aiosmtpd) on a free port of
/// 127.0.0.1, writing what it receives to a temporary directory. Ready when it prints
/// `ready PORT`; it exits when `stop()` closes its standard input (or this process ends).
public final class SMTPSink: @unchecked Sendable {
    /// One message the sink received.
    public struct Received {
        /// The message bytes as received (dot-stuffing undone).
        public let raw: [UInt8]
        public let mailFrom: String
        public let recipients: [String]
        /// What the client said in EHLO/HELO.
        public let helo: String?
        /// Whether the message came over TLS (STARTTLS or implicit).
        public let tls: Bool
        /// `[mechanism, user]` when the client signed in.
        public let auth: [String]?
        /// The message as Python's `email` package decodes it.
        public let parsed: [String: Any]

        public var subject: String? { parsed["subject"] as? String }
        /// The decoded body with line endings made `\n`.
        public var body: String? { (parsed["body"] as? String)?.replacingOccurrences(of: "\r\n", with: "\n") }
        public var defects: [String] { parsed["defects"] as? [String] ?? [] }
        /// Raw header lines (folded lines joined), before decoding.
        public var rawHeaderSection: String {
            let text = String(decoding: raw, as: UTF8.self)
            guard let end = text.range(of: "\r\n\r\n") else { return text }
            return String(text[..<end.lowerBound]).replacingOccurrences(of: "\r\n ", with: " ")
        }
        /// The first raw header named `name` (case-insensitive), unfolded, not decoded.
        public func rawHeader(_ name: String) -> String? {
            for line in rawHeaderSection.components(separatedBy: "\r\n") {
                guard let colon = line.firstIndex(of: ":") else { continue }
                if line[..<colon].lowercased() == name.lowercased() {
                    return line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                }
            }
            return nil
        }
    }

    public let port: Int
    public let directory: URL
    private let process: Process
    private let input: Pipe
    private let errorOutput: Pipe

    /// The Python that has aiosmtpd: `TRUNK_SYNC_TEST_PYTHON`, else Debian's `/usr/bin/python3`
    /// (where `python3-aiosmtpd` installs), else `python3` from `PATH`.
    public static func python() -> (executable: String, prefix: [String]) {
        if let python = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"], !python.isEmpty {
            return (python, [])
        }
        if FileManager.default.isExecutableFile(atPath: "/usr/bin/python3") { return ("/usr/bin/python3", []) }
        return ("/usr/bin/env", ["python3"])
    }

    /// Starts a sink with extra `arguments` (see the script's help) and waits, at most
    /// 20 s, for its `ready PORT` line.
    public init(_ arguments: [String] = []) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("smtp-sink-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let (python, prefix) = Self.python()
        process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = prefix + [repositoryRoot() + "/scripts/smtp-sink.py", "--dir", directory.path] + arguments
        input = Pipe()
        let output = Pipe()
        errorOutput = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errorOutput
        try process.run()

        // The readiness line, read on a thread of its own so the wait is bounded.
        let line = LineBox()
        let ready = DispatchSemaphore(value: 0)
        let reader = output.fileHandleForReading
        Thread.detachNewThread {
            var bytes: [UInt8] = []
            while true {
                let chunk = reader.availableData
                if chunk.isEmpty { break }
                bytes.append(contentsOf: chunk)
                if bytes.contains(UInt8(ascii: "\n")) { break }
            }
            line.set(String(decoding: bytes, as: UTF8.self))
            ready.signal()
        }
        let finished = ready.wait(timeout: .now() + 20) == .success
        let text = line.get().trimmingCharacters(in: .whitespacesAndNewlines)
        guard finished, text.hasPrefix("ready "), let port = Int(text.dropFirst(6)) else {
            process.terminate()
            let stderr = String(decoding: errorOutput.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            throw TestEnvironmentError(
                "the SMTP sink did not start (\(finished ? "said \(text.debugDescription)" : "no ready line within 20 s")); "
                    + "is python3-aiosmtpd installed (scripts/deps.sh)? stderr: \(stderr)")
        }
        self.port = port
    }

    /// Ends the sink (closing its stdin) and waits for it, at most 10 s.
    public func stop() {
        try? input.fileHandleForWriting.close()
        let deadline = Date().addingTimeInterval(10)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { process.terminate() }
        try? FileManager.default.removeItem(at: directory)
    }

    deinit { if process.isRunning { process.terminate() } }

    /// The messages received so far, in order.
    public func received() throws -> [Received] {
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        let numbers = names.compactMap { $0.hasSuffix(".json") ? Int($0.dropLast(5)) : nil }.sorted()
        return try numbers.map { number in
            let base = directory.appendingPathComponent(String(number))
            let record = try JSONSerialization.jsonObject(with: Data(contentsOf: base.appendingPathExtension("json")))
            guard let record = record as? [String: Any] else { throw TestEnvironmentError("bad sink record") }
            let raw = try Data(contentsOf: base.appendingPathExtension("eml"))
            return Received(
                raw: Array(raw), mailFrom: record["mail_from"] as? String ?? "",
                recipients: record["rcpt_tos"] as? [String] ?? [], helo: record["helo"] as? String,
                tls: record["tls"] as? Bool ?? false, auth: record["auth"] as? [String],
                parsed: record["parsed"] as? [String: Any] ?? [:])
        }
    }
}

/// A string handed from the reader thread to the test.
private final class LineBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value = ""
    func set(_ text: String) { lock.withLock { value = text } }
    func get() -> String { lock.withLock { value } }
}

/// A self-signed certificate for `localhost` (made with the `openssl` command), in a
/// temporary directory.
public struct TestCertificate {
    public let certificatePath: String
    public let keyPath: String

    public static func make() throws -> TestCertificate {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("smtp-cert-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let certificate = directory.appendingPathComponent("cert.pem").path
        let key = directory.appendingPathComponent("key.pem").path
        let result = try Command.run(
            "/usr/bin/env",
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                "-addext", "subjectAltName=DNS:localhost", "-days", "1", "-keyout", key, "-out", certificate,
            ])
        guard result.status == 0 else {
            throw TestEnvironmentError("openssl req failed (\(result.status)): \(result.stderr)")
        }
        return TestCertificate(certificatePath: certificate, keyPath: key)
    }

    /// The sink arguments that serve this certificate.
    public var sinkArguments: [String] { ["--tls-cert", certificatePath, "--tls-key", keyPath] }
}
