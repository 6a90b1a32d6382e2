import Foundation
import Postgres
import TestSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The real `trunk-sync serve` in a child process, on its own freshly migrated database and
/// a port the kernel chose. `stop()` (or `cleanUp()`) ends it; `cleanUp()` also drops the database.
final class ServerProcess {
    /// A JWT secret `serve` accepts: random, as operators make theirs (tests sign nothing
    /// with it).
    static let jwtSecret = TestSecrets.random()
    /// The key encryption key every server here gets (and `migrate`, `keys add`).
    static let keyEncryptionKey = TestSecrets.random()

    let process: Process
    let database: PostgresConfiguration
    let environment: [String: String]
    let stderr: OutputCollector
    let stdout: OutputCollector
    /// The port from the server's `listening` log line (0 until it was seen).
    private(set) var port = 0
    /// The admin listener's port, from its `admin listening` line (0 until it was seen).
    private(set) var adminPort = 0
    private var cleanedUp = false
    /// Whether `cleanUp()` drops the database (false for one the test brought).
    private let ownsDatabase: Bool

    private init(
        process: Process, database: PostgresConfiguration, environment: [String: String], stdout: OutputCollector,
        stderr: OutputCollector, ownsDatabase: Bool = true
    ) {
        self.process = process
        self.ownsDatabase = ownsDatabase
        self.database = database
        self.environment = environment
        self.stdout = stdout
        self.stderr = stderr
    }

    /// The environment `serve` gets: a database, a secret, port 0 (also for the admin
    /// listener: tests run beside each other), the repository's migrations, then `overrides`.
    static func serveEnvironment(databaseURL: String, overrides: [String: String]) -> [String: String] {
        var variables = [
            "TRUNK_SYNC_DATABASE_URL": databaseURL,
            "TRUNK_SYNC_JWT_SECRET": jwtSecret,
            "TRUNK_SYNC_KEY_ENCRYPTION_KEY": keyEncryptionKey,
            "TRUNK_SYNC_PORT": "0",
            "TRUNK_SYNC_ADMIN_PORT": "0",
            "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
        ]
        variables.merge(overrides) { $1 }
        return Command.environment(variables)
    }

    /// Creates and migrates a database, starts `serve` with `overrides` added to its
    /// environment and waits (at most `timeout`) until it logs the port it listens on.
    /// `launcher` is a command that runs the server (e.g. `prlimit …`), the binary and
    /// `serve` appended to it.
    static func start(_ overrides: [String: String] = [:], launcher: [String] = [], timeout: Double = 15) throws
        -> ServerProcess
    {
        let server = try launch(overrides, launcher: launcher)
        do {
            try server.waitUntilListening(timeout: timeout)
        } catch {
            server.cleanUp()
            throw error
        }
        return server
    }

    /// Like `start`, without waiting for the server to listen (for start-up failures).
    static func launch(_ overrides: [String: String] = [:], launcher: [String] = []) throws -> ServerProcess {
        let database = try TestDatabase.create(prefix: "e2e")
        do {
            let url = try TestDatabase.url(of: database)
            let migration = try Command.run(
                Command.trunkSyncBinary(), ["migrate"], environment: serveEnvironment(databaseURL: url, overrides: [:]))
            guard migration.status == 0 else {
                throw ClientError("trunk-sync migrate failed (\(migration.status)): \(migration.stderr)")
            }
            let environment = serveEnvironment(databaseURL: url, overrides: overrides)
            let (process, stdoutPipe, stderrPipe) = try Command.start(
                launcher.first ?? Command.trunkSyncBinary(),
                launcher.dropFirst() + (launcher.isEmpty ? [] : [Command.trunkSyncBinary()]) + ["serve"],
                environment: environment)
            return ServerProcess(
                process: process, database: database, environment: environment,
                stdout: OutputCollector(reading: stdoutPipe.fileHandleForReading),
                stderr: OutputCollector(reading: stderrPipe.fileHandleForReading))
        } catch {
            try? TestDatabase.drop(database)
            throw error
        }
    }

    /// Launches `serve` on `database` as it is (not migrated here, not dropped by `cleanUp`)
    /// with `serveEnvironment` for it plus `overrides` (a nil value removes the variable).
    static func launch(on database: PostgresConfiguration, _ overrides: [String: String?]) throws -> ServerProcess {
        var environment = serveEnvironment(databaseURL: try TestDatabase.url(of: database), overrides: [:])
        for (name, value) in overrides { environment[name] = value }
        let (process, stdoutPipe, stderrPipe) = try Command.start(
            Command.trunkSyncBinary(), ["serve"], environment: environment)
        return ServerProcess(
            process: process, database: database, environment: environment,
            stdout: OutputCollector(reading: stdoutPipe.fileHandleForReading),
            stderr: OutputCollector(reading: stderrPipe.fileHandleForReading), ownsDatabase: false)
    }

    /// Reads the log until the `listening … port=N` and `admin listening … port=M` lines and
    /// remembers N and M.
    func waitUntilListening(timeout: Double) throws {
        // Text logs say `listening … port=N`, JSON logs `"msg":"listening",…,"port":"N"`.
        // The public line comes first; the admin line follows it.
        guard let line = stderr.waitForLine(containing: "listening", timeout: timeout),
            !line.contains("admin listening")
        else {
            throw ClientError("server did not report listening within \(timeout) s; log:\n\(logs)")
        }
        port = try Self.port(in: line)
        guard let adminLine = stderr.waitForLine(containing: "admin listening", timeout: timeout) else {
            throw ClientError("server did not report its admin listener within \(timeout) s; log:\n\(logs)")
        }
        adminPort = try Self.port(in: adminLine)
    }

    private static func port(in line: String) throws -> Int {
        guard let match = line.firstMatch(of: /port(?:=|":")(\d+)/), let port = Int(match.1), port > 0 else {
            throw ClientError("no port in \(line.debugDescription)")
        }
        return port
    }

    /// Everything the server wrote to stderr and stdout so far.
    var logs: String { stderr.text + stdout.text }

    var isRunning: Bool { process.isRunning }

    // MARK: - Talking to it

    /// A new connection to the server (from `source`, a loopback address, when given).
    func connect(from source: String? = nil, timeout: Double = 5) throws -> RawClient {
        try RawClient.connect(port: port, from: source, timeout: timeout)
    }

    /// Sends `request` on a new connection (from `source`, a loopback address such as
    /// `127.0.0.2`, when given) and reads one response.
    func exchange(_ request: String, from source: String? = nil, bodyExpected: Bool = true, timeout: Double = 5) throws
        -> (RawResponse, RawClient)
    {
        let client = try RawClient.connect(port: port, from: source)
        try client.send(request)
        return (try client.readResponse(timeout: timeout, bodyExpected: bodyExpected), client)
    }

    /// Sends `request` to the admin listener on a new connection and reads one response.
    func adminExchange(_ request: String, timeout: Double = 5) throws -> RawResponse {
        let client = try RawClient.connect(port: adminPort)
        try client.send(request)
        return try client.readResponse(timeout: timeout)
    }

    /// The admin listener's `/metrics` as sample name (with labels, as written) → value.
    func metrics() throws -> [String: Double] {
        let response = try adminExchange(request("GET", "/metrics"))
        guard response.status == 200 else { throw ClientError("admin /metrics answered \(response.status)") }
        var samples: [String: Double] = [:]
        for line in response.bodyText.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else {
                continue
            }
            samples[String(line[..<space])] = value
        }
        return samples
    }

    /// Whether a new connection can still be opened (false once the listener is closed).
    func acceptsConnections() -> Bool {
        if case .connected = RawClient.tryConnect(port: port, timeout: 2) { return true }
        return false
    }

    // MARK: - Stopping

    /// Sends a signal to the server process.
    func signal(_ number: Int32) {
        if process.isRunning { kill(process.processIdentifier, number) }
    }

    /// Waits for the process to exit; its exit status (128 + signal when killed), or nil if
    /// it still runs after `timeout`.
    func waitForExit(timeout: Double) -> Int32? {
        let exited = eventually(within: timeout, interval: .milliseconds(5)) { !process.isRunning }
        guard exited else { return nil }
        return process.terminationReason == .exit ? process.terminationStatus : 128 + process.terminationStatus
    }

    /// SIGTERM, then waits for the exit status (nil: still running after `timeout`).
    func stop(timeout: Double = 10) -> Int32? {
        signal(SIGTERM)
        return waitForExit(timeout: timeout)
    }

    /// Kills the process if it still runs and drops its database. Safe to call twice.
    func cleanUp() {
        guard !cleanedUp else { return }
        cleanedUp = true
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            _ = waitForExit(timeout: 10)
        }
        _ = stderr.waitForEnd(timeout: 5)
        _ = stdout.waitForEnd(timeout: 5)
        if ownsDatabase { try? TestDatabase.drop(database) }
    }
}

/// An HTTP/1.1 request as text: request line, `Host`, `headers`, then `body` (with its
/// `Content-Length` when `body` is given and no framing header is among `headers`).
func request(
    _ method: String = "GET", _ target: String, version: String = "HTTP/1.1", headers: [(String, String)] = [],
    body: String? = nil
) -> String {
    var text = "\(method) \(target) \(version)\r\n"
    if version == "HTTP/1.1" { text += "Host: localhost\r\n" }
    for (name, value) in headers { text += "\(name): \(value)\r\n" }
    if let body, !headers.contains(where: { ["content-length", "transfer-encoding"].contains($0.0.lowercased()) }) {
        text += "Content-Length: \(body.utf8.count)\r\n"
    }
    return text + "\r\n" + (body ?? "")
}
