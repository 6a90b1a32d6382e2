import Foundation
import Postgres
import TestSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The real `trunk-sync serve` on a freshly migrated database of the test cluster, on a
/// port that stays the same when the server is killed and started again (the client's
/// storage is per server URL).
final class SyncServer: @unchecked Sendable {  // mutable state guarded by `lock`
    static let jwtSecret = TestSecrets.random()
    static let keyEncryptionKey = TestSecrets.random()

    let database: PostgresConfiguration
    let port: Int
    let environment: [String: String]
    private let lock = NSLock()
    private var process: Process?
    private var collectors: [OutputCollector] = []
    private var cleanedUp = false

    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }
    /// The admin listener (`/metrics`), on a port of its own.
    var adminURL: URL { URL(string: "http://127.0.0.1:\(environment["TRUNK_SYNC_ADMIN_PORT"] ?? "0")")! }

    private init(database: PostgresConfiguration, port: Int, environment: [String: String]) {
        self.database = database
        self.port = port
        self.environment = environment
    }

    /// Creates and migrates a database and starts the server with `overrides` in its
    /// environment (the log mailer by default: codes appear in its log).
    static func start(_ overrides: [String: String] = [:]) throws -> SyncServer {
        let database = try TestDatabase.create(prefix: "client")
        do {
            let url = try TestDatabase.url(of: database)
            let port = try freePort()
            var variables = [
                "TRUNK_SYNC_DATABASE_URL": url, "TRUNK_SYNC_JWT_SECRET": jwtSecret, "TRUNK_SYNC_PORT": String(port),
                "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations", "TRUNK_SYNC_OTP_RESEND_INTERVAL": "0",
                "TRUNK_SYNC_ADMIN_PORT": String(try freePort()), "TRUNK_SYNC_KEY_ENCRYPTION_KEY": keyEncryptionKey,
            ]
            variables.merge(overrides) { $1 }
            let environment = Command.environment(variables)
            let migration = try Command.run(Command.trunkSyncBinary(), ["migrate"], environment: environment)
            guard migration.status == 0 else {
                throw TestEnvironmentError("trunk-sync migrate failed (\(migration.status)): \(migration.stderr)")
            }
            let server = SyncServer(database: database, port: port, environment: environment)
            try server.launch()
            return server
        } catch {
            try? TestDatabase.drop(database)
            throw error
        }
    }

    /// A port nobody listens on now (the kernel's choice).
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestEnvironmentError("socket: errno \(errno)") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else { throw TestEnvironmentError("bind: errno \(errno)") }
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { throw TestEnvironmentError("getsockname: errno \(errno)") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// Starts the process and waits (at most 20 s) for its `listening` line.
    private func launch() throws {
        let (process, stdout, stderr) = try Command.start(
            Command.trunkSyncBinary(), ["serve"], environment: environment)
        let errors = OutputCollector(reading: stderr.fileHandleForReading)
        let output = OutputCollector(reading: stdout.fileHandleForReading)
        lock.withLock {
            self.process = process
            collectors += [errors, output]
        }
        guard errors.waitForLines(containing: "listening", timeout: 20) != nil else {
            throw TestEnvironmentError("the server did not listen on \(port) within 20 s; log:\n\(logs)")
        }
    }

    var isRunning: Bool { lock.withLock { process?.isRunning ?? false } }

    /// SIGKILL, and waits for the process to be gone.
    func kill() {
        guard let process = lock.withLock({ self.process }) else { return }
        if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    /// Kills the server (if it runs) and starts it again on the same port and database.
    func restart() throws {
        kill()
        try launch()
    }

    /// Everything every run of the server logged.
    var logs: String { lock.withLock { collectors }.map(\.text).joined() }

    /// The sign-in code the log mailer printed for `email` the `number`-th time (1-based),
    /// waiting for it at most `timeout` seconds.
    func code(for email: String, number: Int = 1, timeout: Double = 10) throws -> String {
        let needle = "sign-in code for \(email): "
        let deadline = Date(timeIntervalSinceNow: timeout)
        while true {
            let lines = lock.withLock { collectors }.flatMap { $0.lines(containing: needle) }
            if lines.count >= number {
                guard let match = lines[number - 1].firstMatch(of: /: (\d{6})\b/) else {
                    throw TestEnvironmentError("no code in \(lines[number - 1])")
                }
                return String(match.1)
            }
            guard Date() < deadline else {
                throw TestEnvironmentError("no code number \(number) for \(email) in the log:\n\(logs)")
            }
            Thread.sleep(forTimeInterval: 0.01)
        }
    }

    /// A connection to the server's database, as the cluster's superuser.
    func connect() throws -> PostgresConnection { try PostgresConnection.connect(database) }

    /// `select` rows as text.
    func rows(_ sql: String) throws -> [[String]] {
        let result = try connect().query(sql)
        return try result.map { row in
            try (0..<result.columnCount).map { try row.decode(String?.self, column: $0) ?? "" }
        }
    }

    /// Kills the server and drops its database. Safe to call twice.
    func cleanUp() {
        guard
            lock.withLock({
                defer { cleanedUp = true }
                return !cleanedUp
            })
        else { return }
        kill()
        for collector in lock.withLock({ collectors }) { _ = collector.waitForEnd(timeout: 5) }
        try? TestDatabase.drop(database)
    }
}
