import Foundation
import Logging
import Postgres

/// A problem with the test environment itself (not a failed assertion).
public struct TestEnvironmentError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Access to the private PostgreSQL cluster `make test` starts (scripts/test.sh), and a
/// fresh database per test.
public enum TestDatabase {
    /// The cluster's superuser URL (database `postgres`), from `TRUNK_SYNC_TEST_DATABASE_URL`.
    public static func adminConfiguration() throws -> PostgresConfiguration {
        guard let url = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_DATABASE_URL"], !url.isEmpty else {
            throw TestEnvironmentError(
                "TRUNK_SYNC_TEST_DATABASE_URL is not set: run the tests with `make test`, which starts a private PostgreSQL"
            )
        }
        return try PostgresConfiguration(url)
    }

    /// Creates an empty database with a unique name and returns its configuration.
    public static func create(prefix: String = "test") throws -> PostgresConfiguration {
        let admin = try adminConfiguration()
        let name = "\(prefix)_\(UUID().uuidString.prefix(8).lowercased())"
        let connection = try PostgresConnection.connect(admin)
        try connection.execute("create database \(try connection.quoteIdentifier(name))")
        return admin.withDatabase(name)
    }

    /// Drops a database made by `create`, closing its other connections first.
    public static func drop(_ configuration: PostgresConfiguration) throws {
        guard let name = configuration["dbname"] else { return }
        let connection = try PostgresConnection.connect(try adminConfiguration())
        try connection.execute("drop database if exists \(try connection.quoteIdentifier(name)) with (force)")
    }

    /// The URL of a database made by `create`, for child processes.
    public static func url(of configuration: PostgresConfiguration) throws -> String {
        let admin = try adminConfiguration()
        guard let base = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_DATABASE_URL"],
            let database = configuration["dbname"], let adminDatabase = admin["dbname"],
            base.hasSuffix("/" + adminDatabase)
        else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_DATABASE_URL must be a postgres:// URL ending in /DATABASE")
        }
        return String(base.dropLast(adminDatabase.count)) + database
    }

    /// The URL of a database made by `create` for another login role (`user`, `password`).
    public static func url(of configuration: PostgresConfiguration, user: String, password: String) throws -> String {
        let admin = try adminConfiguration()
        guard let host = admin["host"], let port = admin["port"], let database = configuration["dbname"] else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_DATABASE_URL must name host and port")
        }
        return "postgres://\(user):\(password)@\(host):\(port)/\(database)"
    }

    /// A unique name for a login role of one test (roles are cluster-wide), and a way to drop
    /// it afterwards.
    public static func roleName(_ prefix: String) -> String { "\(prefix)_\(UUID().uuidString.prefix(8).lowercased())" }

    /// Drops a role made by a test (after the databases it had rights in are dropped).
    public static func dropRole(_ name: String) {
        guard let admin = try? PostgresConnection.connect(try adminConfiguration()),
            let quoted = try? admin.quoteIdentifier(name)
        else { return }
        _ = try? admin.execute("drop role if exists \(quoted)")
    }

    /// Restarts the whole cluster (`pg_ctl restart -m fast`), dropping every connection.
    public static func restartServer() throws {
        guard let directory = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PGDIR"] else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_PGDIR is not set: run the tests with `make test`")
        }
        let status = try Command.spawnAndWait(repositoryRoot() + "/scripts/pg.sh", ["restart", directory])
        guard status == 0 else { throw TestEnvironmentError("pg.sh restart failed with status \(status)") }
    }

    /// A logger that discards everything (tests assert on behaviour, not log lines).
    public static let quietLogger: Logger = {
        var logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        logger.logLevel = .critical
        return logger
    }()
}

/// The repository's root directory (from this file's location).
public func repositoryRoot() -> String {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
}

/// Runs external programs (the real `trunk-sync` binary, scripts) and captures their output.
public enum Command {
    /// What a finished process did.
    public struct Result: Sendable {
        public var status: Int32
        public var stdout: String
        public var stderr: String
    }

    /// The `trunk-sync` binary under test: `TRUNK_SYNC_BIN`, else beside the test bundle.
    public static func trunkSyncBinary() -> String {
        if let path = ProcessInfo.processInfo.environment["TRUNK_SYNC_BIN"], !path.isEmpty { return path }
        let bundleDirectory = URL(fileURLWithPath: CommandLine.arguments.first ?? "").deletingLastPathComponent()
        return bundleDirectory.appendingPathComponent("trunk-sync").path
    }

    /// Runs `executable` with inherited output and waits for it with `waitpid` (for scripts
    /// that start daemons, which Foundation's `Process` waits on poorly).
    public static func spawnAndWait(_ executable: String, _ arguments: [String]) throws -> Int32 {
        var pid: pid_t = 0
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let spawned = posix_spawn(&pid, executable, nil, nil, argv, environ)
        guard spawned == 0 else { throw TestEnvironmentError("cannot start \(executable): errno \(spawned)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else { throw TestEnvironmentError("waitpid failed: errno \(errno)") }
        }
        return (status >> 8) & 0xff
    }

    /// Starts `executable` and returns the running process with pipes for its output.
    public static func start(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        currentDirectory: String? = nil
    ) throws -> (Process, Pipe, Pipe) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment { process.environment = environment }
        if let currentDirectory { process.currentDirectoryURL = URL(fileURLWithPath: currentDirectory) }
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardOutput = stdout
        process.standardError = stderr
        process.standardInput = FileHandle.nullDevice
        try process.run()
        return (process, stdout, stderr)
    }

    /// Runs `executable` to completion.
    public static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        currentDirectory: String? = nil
    ) throws -> Result {
        let (process, stdout, stderr) = try start(
            executable, arguments, environment: environment, currentDirectory: currentDirectory)
        return finish(process, stdout, stderr)
    }

    /// Waits for a started process and collects its output.
    public static func finish(_ process: Process, _ stdout: Pipe, _ stderr: Pipe) -> Result {
        // Read both pipes to the end before waiting, so a chatty child never blocks on a full pipe.
        let group = DispatchGroup()
        nonisolated(unsafe) var errorData = Data()
        group.enter()
        DispatchQueue.global().async {
            errorData = stderr.fileHandleForReading.readDataToEndOfFile()
            group.leave()
        }
        let outputData = stdout.fileHandleForReading.readDataToEndOfFile()
        group.wait()
        process.waitUntilExit()
        return Result(
            status: process.terminationStatus, stdout: String(decoding: outputData, as: UTF8.self),
            stderr: String(decoding: errorData, as: UTF8.self))
    }

    /// The environment of this process with `TRUNK_SYNC_*` variables removed and `overrides` added.
    public static func environment(_ overrides: [String: String]) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("TRUNK_SYNC_") }
        environment.merge(overrides) { $1 }
        return environment
    }
}

/// Fails with a timeout error unless `body` finishes within `seconds`.
public func withTimeout<T: Sendable>(
    _ seconds: Double, _ what: String = "operation", _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            throw TestEnvironmentError("\(what) did not finish within \(seconds) s")
        }
        guard let first = try await group.next() else { throw TestEnvironmentError("no result") }
        group.cancelAll()
        return first
    }
}

/// Secrets for tests, made as operators are told to (`openssl rand -base64 48`): fresh random
/// bytes each time, so no test depends on a fixed, guessable value that `serve` refuses.
public enum TestSecrets {
    /// 48 random bytes in base64 (64 characters).
    public static func random() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<48).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return Data(bytes).base64EncodedString()
    }

    /// 32 random bytes in hex (64 characters), as `openssl rand -hex 32`: for passwords that
    /// go into URLs unescaped.
    public static func randomHex() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
    }
}

/// Waits (a readiness check, at most ~5 s) until the server process `pid` has left
/// `pg_stat_activity`: after `pg_terminate_backend`, before a test relies on it being gone.
public func waitUntilGone(pid: Int32, admin: PostgresConnection) async throws {
    for _ in 0..<500 {
        let alive = try admin.query("select count(*) from pg_stat_activity where pid = $1", Int32(pid))[0]
            .decode(Int.self, column: 0)
        if alive == 0 { return }
        try await Task.sleep(for: .milliseconds(10))
    }
    throw TestEnvironmentError("backend \(pid) did not exit")
}
