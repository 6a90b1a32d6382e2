import ArgumentParser
import CSystem
import Dispatch
import Foundation
import Logging
import Postgres
import TrunkSync

@main
struct TrunkSyncCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "trunk-sync",
        abstract: "Self-hosted sync server for local-first apps.",
        version: TrunkSyncVersion.current,
        subcommands: [
            Serve.self, Migrate.self, TokenCommand.self, UsersCommand.self, KeysCommand.self, ConfigCommand.self,
            ImportCommand.self,
        ]
    )
}

/// Options every command that reads the configuration accepts.
struct CommonOptions: ParsableArguments {
    @Option(name: .customLong("config"), help: "JSON configuration file (see config/defaults.json).")
    var configFile: String?

    @Option(help: "PostgreSQL URL; overrides TRUNK_SYNC_DATABASE_URL.")
    var databaseURL: String?

    @Option(name: .customLong("migrations"), help: "Directory of migration files; overrides TRUNK_SYNC_MIGRATIONS_DIR.")
    var migrationsDirectory: String?

    @Option(help: "trace, debug, info, notice, warning, error or critical; overrides TRUNK_SYNC_LOG_LEVEL.")
    var logLevel: String?

    @Option(help: "text or json; overrides TRUNK_SYNC_LOG_FORMAT.")
    var logFormat: String?

    var flags: [String: String] {
        var flags: [String: String] = [:]
        flags["database_url"] = databaseURL
        flags["migrations_dir"] = migrationsDirectory
        flags["log_level"] = logLevel
        flags["log_format"] = logFormat
        return flags
    }

    /// Loads the configuration and sets up logging.
    func load(extraFlags: [String: String] = [:]) throws -> Configuration {
        let configuration = try Configuration.load(file: configFile, flags: flags.merging(extraFlags) { $1 })
        TrunkLogHandler.bootstrap(level: configuration.logLevel, format: configuration.logFormat)
        return configuration
    }
}

/// Work to finish before the process exits (closing databases and the application: their
/// loops' threads must not be cut off mid-query by `exit`; each `Database.close()` ends its
/// loop's thread).
private let exitWork = ExitWork()

private final class ExitWork: @unchecked Sendable {
    private let lock = NSLock()
    private var work: [@Sendable () async -> Void] = []
    func add(_ item: @escaping @Sendable () async -> Void) { lock.withLock { work.append(item) } }
    func run() async {
        let items = lock.withLock { () -> [@Sendable () async -> Void] in
            defer { work = [] }
            return work
        }
        for item in items.reversed() { await item() }
    }
}

/// Registers `work` to run when the command finishes, whether it succeeded or failed.
func onExit(_ work: @escaping @Sendable () async -> Void) { exitWork.add(work) }

/// Runs `body`, turning the errors an operator can act on into one line on stderr and exit 1.
/// Either way, what `onExit` registered runs (in reverse order: the databases close), and
/// then, last, every thread the process started is joined before it exits.
func reportingErrors(_ body: () async throws -> Void) async throws {
    do {
        try await body()
        await exitWork.run()
        await joinThreads()
    } catch {
        await exitWork.run()
        await joinThreads()
        try report(error)
    }
}

/// Joins every thread the process started (the databases' loops, which the listener runs
/// on too, the host-name look-ups of the connections they open, the event loops', the
/// mailer's, `onOwnThread`'s: all go through `csystem_thread_start`), once everything owning
/// one has been closed: a thread still inside libpq or OpenSSL while `exit` runs their
/// clean-up corrupts the heap. Waits at most 10 seconds (a connection attempt under way),
/// then says how many are left. The wait runs on a Dispatch thread, not on Swift's
/// cooperative pool.
func joinThreads() async {
    let left = await withCheckedContinuation { (continuation: CheckedContinuation<Int32, Never>) in
        DispatchQueue.global().async { continuation.resume(returning: csystem_threads_join_all(10_000)) }
    }
    if left > 0 {
        FileHandle.standardError.write(Data("trunk-sync: \(left) thread(s) still running at exit\n".utf8))
    }
}

private func report(_ error: Error) throws {
    do {
        throw error
    } catch let error as ExitCode {
        throw error
    } catch let error as CleanExit {
        throw error
    } catch let error as ValidationError {
        throw error
    } catch {
        FileHandle.standardError.write(Data("trunk-sync: \(error)\n".utf8))
        throw ExitCode(1)
    }
}

/// The owner's login for the command-line tools (`keys`, `users`, `migrate status`):
/// `TRUNK_SYNC_MIGRATION_DATABASE_URL` (default `TRUNK_SYNC_DATABASE_URL`), one connection
/// on the database's own loop, closed when the command ends (`onExit`: its loop's thread
/// ends there). Queries go through the door with `.server` (the owner sees every row).
func commandDatabase(_ configuration: Configuration, logger: Logger) throws -> Database {
    var settings = Database.Settings()
    settings.maxConnections = 1
    settings.acquireTimeout = .seconds(3600)
    let database = try Database(try configuration.ownerDatabase(), settings: settings, logger: logger)
    onExit { await database.close() }
    return database
}

/// `commandDatabase`, after checking that it logs in as a role that sees every row (the
/// owner), not as the server's login.
func ownerDatabase(_ configuration: Configuration, logger: Logger) async throws -> Database {
    let database = try commandDatabase(configuration, logger: logger)
    try await database.read(as: .server) { try await DatabaseRoles.requireOwner(on: $0) }
    return database
}

/// The owner's login as a blocking connection on a thread of its own, for `body`: `migrate`
/// (multi-statement files need the simple-query protocol; libpq's password encryption
/// blocks). Closed when `body` returns, on that thread, which the command joins at exit.
func withOwnerConnection<T: Sendable>(
    _ configuration: Configuration, _ body: @escaping @Sendable (PostgresConnection) throws -> T
) async throws -> T {
    try await withBlockingConnection(try configuration.ownerDatabase(), thread: "migrate", body)
}
