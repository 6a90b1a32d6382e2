import Foundation
import Logging
import Postgres

/// Applies versioned SQL migrations and reports their state.
///
/// `migrate` holds a session-level advisory lock for its whole run, so of two operators
/// running it at once one applies and the other waits, then finds nothing to do. Each file
/// runs in its own transaction together with its row in `schema_migrations` (version, name,
/// SHA-256 checksum, time). Before applying anything, every applied migration is checked
/// against its file: an edited or removed file stops the run.
public struct Migrator: Sendable {
    /// An applied migration as recorded in `schema_migrations`.
    public struct AppliedMigration: Sendable, Equatable {
        public var version: Int64
        public var name: String
        public var checksum: String
        public var appliedAt: PostgresTimestamp
    }

    /// Applied and pending migrations.
    public struct Status: Sendable {
        public var applied: [AppliedMigration]
        public var pending: [Migration]
    }

    /// The files this migrator applies, in version order.
    public let migrations: [Migration]
    private let logger: Logger

    /// A lock key private to trunk-sync migrations ("trunksyn" in ASCII).
    static let advisoryLockKey: Int64 = 0x7472_756e_6b73_796e

    static let createTable = """
        create table if not exists schema_migrations (
          version    bigint primary key,
          name       text not null,
          checksum   text not null,
          applied_at timestamptz not null default now()
        )
        """

    /// A migrator for `migrations` (see `Migration.load(from:)`).
    public init(migrations: [Migration], logger: Logger) {
        self.migrations = migrations
        self.logger = logger
    }

    /// What is applied and what is pending; fails if an applied file was edited or removed.
    /// On a blocking connection: `migrate` and the import, under their own thread.
    public func status(on connection: PostgresConnection, allowNewer: Bool = false) throws -> Status {
        let exists = try connection.query(Self.tableExists)[0].decode(Bool.self, column: 0)
        let applied = exists ? try connection.query(Self.selectApplied).map(Self.appliedMigration) : []
        return try status(applied: applied, allowNewer: allowNewer)
    }

    /// `status(on:)` through the door (`Database.read(as: .server)`): the server's readiness
    /// and console, `migrate status`. The same statements, each its own round trip.
    public func status(on tx: Transaction, allowNewer: Bool = false) async throws -> Status {
        let exists = try await tx.query(Self.tableExists)[0].decode(Bool.self, column: 0)
        let applied = exists ? try await tx.query(Self.selectApplied).map(Self.appliedMigration) : []
        return try status(applied: applied, allowNewer: allowNewer)
    }

    private func status(applied: [AppliedMigration], allowNewer: Bool) throws -> Status {
        try verify(applied, allowNewer: allowNewer)
        let appliedVersions = Set(applied.map(\.version))
        return Status(applied: applied, pending: migrations.filter { !appliedVersions.contains($0.version) })
    }

    /// Applies every pending migration in order and returns those it applied.
    ///
    /// `before` runs under the lock once the applied files are verified and before anything
    /// is applied: it may refuse the run (its error is rethrown as is, nothing changed).
    /// `after` runs under the lock once every migration is applied, for upgrade steps that
    /// need code rather than SQL (encrypting stored keys, the server's login role).
    /// `applied` is told of each migration as soon as it is committed: should a later one (or
    /// `after`) fail, those stay applied, and the run's caller still says which they are.
    public func migrate(
        on connection: PostgresConnection, before: (PostgresConnection) throws -> Void = { _ in },
        after: (PostgresConnection) throws -> Void = { _ in }, applied told: (Migration) -> Void = { _ in }
    ) throws -> [Migration] {
        let locked = try connection.query("select pg_try_advisory_lock($1)", Self.advisoryLockKey)[0]
            .decode(Bool.self, column: 0)
        if !locked {
            logger.info("another trunk-sync migrate is running; waiting for it to finish")
            try connection.query("select pg_advisory_lock($1)", Self.advisoryLockKey)
        }
        defer { _ = try? connection.query("select pg_advisory_unlock($1)", Self.advisoryLockKey) }

        // Every check before the first change, the table of applied migrations included.
        let status = try self.status(on: connection)
        if let newest = status.applied.max(by: { $0.version < $1.version }),
            let early = status.pending.first(where: { $0.version < newest.version })
        {
            throw MigrationError.outOfOrder(pending: early.name, newestApplied: newest.name)
        }
        try before(connection)
        try connection.execute(Self.createTable)
        var applied: [Migration] = []
        for migration in status.pending {
            do {
                try connection.transaction { connection in
                    try connection.execute(migration.sql)
                    try connection.query(
                        "insert into schema_migrations (version, name, checksum) values ($1, $2, $3)",
                        migration.version, migration.name, migration.checksum)
                }
            } catch let error as PostgresError {
                // Our own SQL, shown to the operator who runs it: the server's text helps here.
                let reason = [error.description, error.serverMessage].compactMap { $0 }.joined(separator: ": ")
                throw MigrationError.failed(name: migration.name, reason: reason)
            }
            // Not logged: the caller says what was applied (`migrate`: `applied <name>` on
            // stdout, as each is), and a log line beside it named each migration twice.
            applied.append(migration)
            told(migration)
        }
        try after(connection)
        return applied
    }

    /// How many of this binary's migrations are not applied yet (all of them when the table
    /// is missing). Migrations newer than this binary's are fine (a rolling upgrade migrated
    /// ahead of it); an edited or removed file of its own throws.
    public func pendingCount(on connection: PostgresConnection) throws -> Int {
        try status(on: connection, allowNewer: true).pending.count
    }

    /// `pendingCount(on:)` through the door (the server's readiness).
    public func pendingCount(on tx: Transaction) async throws -> Int {
        try await status(on: tx, allowNewer: true).pending.count
    }

    static let tableExists = "select to_regclass('schema_migrations') is not null"
    static let selectApplied = "select version, name, checksum, applied_at from schema_migrations order by version"

    private static func appliedMigration(_ row: PostgresRow) throws -> AppliedMigration {
        AppliedMigration(
            version: try row.decode(Int64.self, column: 0), name: try row.decode(String.self, column: 1),
            checksum: try row.decode(String.self, column: 2),
            appliedAt: try row.decode(PostgresTimestamp.self, column: 3))
    }

    private func verify(_ applied: [AppliedMigration], allowNewer: Bool) throws {
        let files = Dictionary(uniqueKeysWithValues: migrations.map { ($0.version, $0) })
        let newestKnown = migrations.last?.version ?? 0
        for record in applied where !(allowNewer && record.version > newestKnown) {
            guard let file = files[record.version] else { throw MigrationError.appliedFileMissing(record.name) }
            guard file.name == record.name, file.checksum == record.checksum else {
                throw MigrationError.appliedFileChanged(record.name)
            }
        }
    }
}

extension Migrator {
    /// `error` for a log line of work that reads the schema (`serve`'s start-up loads, their
    /// retries): a missing table, column or function means `migrate` has not run on this
    /// database, or not this version's migrations, which PostgreSQL's code alone
    /// (`42P01 (undefined table)`) does not tell an operator.
    public static func explain(_ error: Error) -> String {
        guard let state = (error as? PostgresError)?.sqlState,
            [.undefinedTable, .undefinedFunction, SQLState(rawValue: "42703")].contains(state)
        else { return "\(error)" }
        return "\(error): this database lacks trunk-sync's tables or their newest migrations: run trunk-sync migrate"
    }
}
