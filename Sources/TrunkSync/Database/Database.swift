import Foundation
import HTTPServer
import Logging
import Postgres
import Synchronization
import TrunkCrypto

/// Whose rows a transaction may see: the transaction settings row-level security reads
/// (migrations 0001, 0003, 0008). The door (`Database.transaction(as:)`) sends them at the
/// head of the transaction, with its first statements; nothing else sets them, so no call
/// site can forget the scope or set it twice. Each is set with `set_config(…, true)`: it
/// ends with the transaction, and a statement that runs without one sees nobody's rows.
public enum Scope: Sendable {
    /// `app.user_id`: the user's users row, sessions, refresh tokens and events.
    case user(UUID)
    /// `app.email`: the address's users row and sign-in code (sign-in looks a user up by
    /// address before it knows the id).
    case email(Email)
    /// `app.email` set to a code's key (`AuthService.CodeKey`): an address, or a console
    /// sign-in's `console:` key, which matches no users row.
    case codeKey(String)
    /// `app.refresh_token_hash`, then `app.user_id` of that token's owner (empty when no
    /// token has that hash): the token refresh knows nothing else.
    case refreshToken(hash: PostgresBytes)
    /// `app.console_token_hash`: while it names a live console session (migration 0008), the
    /// server's role may read every user's users, sessions and events rows.
    case console(tokenHash: PostgresBytes)
    /// No user's rows: tables without them (signing keys, revocations, rate limits,
    /// migrations), or the owner's login of the command line, which row-level security
    /// does not restrict.
    case server

    /// The statements that set the scope, the planning mode when `plans` is not
    /// PostgreSQL's default, and the transaction's `statement_timeout` when one is given
    /// (with `.user`'s scope in the same statement: no statement more). Without a timeout —
    /// the pull, the push, the stream — fixed text, nothing built per call.
    func statements(plans: Plans, statementTimeout: Duration? = nil) -> [PostgresStatement] {
        if let statementTimeout { return statements(plans: plans, limitedTo: statementTimeout) }
        guard plans == .generic else { return statements }
        if case .user(let id) = self {
            return [
                .prepared(
                    "select set_config('app.user_id', $1, true), set_config('plan_cache_mode', 'force_generic_plan', true)",
                    UUIDText.lowercase(id))
            ]
        }
        return statements + [.prepared("select set_config('plan_cache_mode', 'force_generic_plan', true)")]
    }

    /// `statements(plans:)` with `statement_timeout` set beside the scope (the REST routes').
    private func statements(plans: Plans, limitedTo timeout: Duration) -> [PostgresStatement] {
        let generic = plans == .generic ? ", set_config('plan_cache_mode', 'force_generic_plan', true)" : ""
        let limit = Self.milliseconds(timeout)
        if case .user(let id) = self {
            return [
                .prepared(
                    "select set_config('app.user_id', $1, true), set_config('statement_timeout', $2, true)" + generic,
                    UUIDText.lowercase(id), limit)
            ]
        }
        return statements + [.prepared("select set_config('statement_timeout', $1, true)" + generic, limit)]
    }

    /// `statement_timeout`'s value for `duration`: whole milliseconds, at least 1 (0 would
    /// turn the limit off).
    static func milliseconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        let total = seconds * 1000 + attoseconds / 1_000_000_000_000_000
        return "\(max(1, total))ms"
    }

    /// The statements that set the scope.
    var statements: [PostgresStatement] {
        switch self {
        case .user(let id):
            return [.prepared("select set_config('app.user_id', $1, true)", UUIDText.lowercase(id))]
        case .email(let email):
            return Self.codeKey(email.value).statements
        case .codeKey(let key):
            return [.prepared("select set_config('app.email', $1, true)", key)]
        case .refreshToken(let hash):
            return [
                .prepared("select set_config('app.refresh_token_hash', $1, true)", Hex.encode(hash.bytes)),
                .prepared(
                    """
                    select set_config('app.user_id',
                      coalesce((select user_id::text from refresh_tokens where token_hash = $1), ''), true)
                    """, hash),
            ]
        case .console(let hash):
            return [.prepared("select set_config('app.console_token_hash', $1, true)", Hex.encode(hash.bytes))]
        case .server:
            return []
        }
    }
}

/// How PostgreSQL plans a transaction's prepared statements (`PostgresStatement.prepared`,
/// parsed once per connection).
public enum Plans: Sendable, Equatable {
    /// PostgreSQL's choice (`plan_cache_mode = auto`): a plan for each execution's values
    /// until a generic one looks as cheap. For a statement whose generic estimate stays high
    /// — a `limit $n`, which the planner cannot estimate without its value — that means
    /// planning it on every execution, which costs more than running a key lookup.
    case chosenByPostgres
    /// One generic plan per prepared statement and connection, built once and reused
    /// (`plan_cache_mode = force_generic_plan`, for this transaction only). Only for
    /// statements whose best plan is the same whatever their values: a lookup by key or an
    /// index range (the pull), never one planned for its values (the push's look-up of
    /// repeats, a REST query's filters).
    case generic
}

/// The one door to the database: every query of the server and of the command line runs in
/// a `transaction(as:)`, a `read(as:)` or a `readPipeline(as:)`, on a connection of a loop-driven pool
/// (`PostgresLoopPool`) — the pool of the event loop the task runs on (an HTTP loop, once
/// `drive(on:)` gave each its share), or else the database's own loop (`PostgresLoopThread`:
/// start-up, background jobs, the command line, tests). Nothing waits on a thread: a query
/// suspends its task until the loop reads the answer.
public final class Database: Sendable {
    /// Pool settings (each share and the own loop's pool).
    public typealias Settings = PostgresLoopPool.Configuration

    /// Where connections go.
    public let connection: PostgresConfiguration
    /// The settings every pool of this database uses.
    public let settings: Settings
    private let logger: Logger
    /// The database's own loop and its pool.
    private let loop: PostgresLoopThread
    private let own: PostgresLoopPool
    /// The HTTP loops' pools, once `drive(on:)` was called.
    private let shares = Mutex<PoolShares?>(nil)
    /// Set by the first `close()`; later calls return at once.
    private let closed = Atomic<Bool>(false)

    /// A database on its own loop; nothing is opened until the first transaction.
    public init(_ connection: PostgresConfiguration, settings: Settings, logger: Logger) throws {
        self.connection = connection
        self.settings = settings
        self.logger = logger
        loop = try PostgresLoopThread(name: "pg-loop")
        own = PostgresLoopPool(connection, configuration: settings, loop: loop, logger: logger)
    }

    /// From now on, a task on one of `loops` uses that loop's own pool: `connections`
    /// split between them (at least one each; the waiting requests' bound too). The own
    /// loop's pool, which then serves only what runs off the HTTP loops (background jobs,
    /// streams' and exports' reads), keeps `backgroundConnections(for:)` of its own. Called
    /// once, before requests arrive.
    public func drive(on loops: [LoopExecutor], connections: Int) {
        let sizes = PoolShares.split(connections, over: loops.count)
        let waiting = PoolShares.split(settings.maxWaiting, over: loops.count)
        let pools = PoolShares(
            loops.indices.map { index in
                var share = settings
                share.maxConnections = sizes[index]
                share.maxWaiting = waiting[index]
                return (
                    loops[index], PostgresLoopPool(connection, configuration: share, loop: loops[index], logger: logger)
                )
            })
        shares.withLock { $0 = pools }
        own.limit(to: Self.backgroundConnections(for: connections))
    }

    /// The own loop's connections while the HTTP loops have theirs: a quarter of the pool's
    /// size (`connections`, before the loops' shares round it up to one each), at least 2.
    public static func backgroundConnections(for connections: Int) -> Int { max(2, connections / 4) }

    /// The database's own loop: for connections that belong to no HTTP loop (`LISTEN`).
    public var eventLoop: any PostgresEventLoop { loop }

    /// The pool of the HTTP loop the caller runs on, else the own loop's: also for a task on
    /// a loop without a share (the admin listener's), whose queries would otherwise run on
    /// the first HTTP loop, which stops at shutdown once the public loops have drained,
    /// whatever the admin listener still has in flight; the own loop closes last.
    var pool: PostgresLoopPool {
        guard let loop = LoopExecutor.current, let shares = shares.withLock({ $0 }), shares.includes(loop) else {
            return own
        }
        return shares.current
    }

    /// Connections open, leased and waiting, over every pool.
    public var statistics: PostgresLoopPool.Statistics {
        let pools = [own] + (shares.withLock { $0 }?.all ?? [])
        var total = PostgresLoopPool.Statistics(open: 0, inUse: 0, waiting: 0, maxConnections: 0)
        for figures in pools.map(\.statistics) {
            total.open += figures.open
            total.inUse += figures.inUse
            total.waiting += figures.waiting
            total.maxConnections += figures.maxConnections
        }
        return total
    }

    /// Runs `body` in one transaction scoped to `scope`: `begin` and the scope go with the
    /// body's first statements (no round trip of their own), `commit` after it returns
    /// (unless the body committed with its last statements). A throw, or a transaction the
    /// body ended otherwise, rolls back what is open.
    ///
    /// `plans`: how PostgreSQL plans the body's prepared statements (`Plans`).
    /// `statementTimeout`: the longest any of the body's statements may run (PostgreSQL's
    /// `statement_timeout` for this transaction only; beyond it the statement fails with
    /// `57014` and the transaction rolls back). Default: PostgreSQL's setting.
    public func transaction<T: Sendable>(
        as scope: Scope, plans: Plans = .chosenByPostgres, statementTimeout: Duration? = nil,
        _ body: (Transaction) async throws -> T
    ) async throws -> T {
        try await pool.withConnection { connection in
            let transaction = Transaction(
                connection, prefix: [.begin] + scope.statements(plans: plans, statementTimeout: statementTimeout))
            let value = try await body(transaction)
            if connection.isInTransaction { try await connection.pipeline([.commit]) }
            return value
        }
    }

    /// Runs `body` with each of its pipelines one implicit transaction scoped to `scope`
    /// (the scope travels with the pipeline's statements): a read that needs no `begin`.
    public func read<T: Sendable>(
        as scope: Scope, plans: Plans = .chosenByPostgres, _ body: (Transaction) async throws -> T
    ) async throws -> T {
        try await pool.withConnection { connection in
            try await body(Transaction(connection, prefix: scope.statements(plans: plans)))
        }
    }

    /// Runs `statements` as one pipeline in an implicit transaction scoped to `scope` (the
    /// scope travels with them) and returns their results: a read that is one round trip and
    /// opens no transaction. It may share a connection with other such reads of the pool,
    /// sent behind theirs instead of waiting for a connection of its own
    /// (`PostgresLoopPool.sharedPipeline`); each pipeline has its own sync, so the scope and
    /// any failure end with it.
    public func readPipeline(
        as scope: Scope, plans: Plans = .chosenByPostgres, _ statements: [PostgresStatement]
    ) async throws -> [PostgresResult] {
        try await pool.sharedPipeline(statements, prefix: scope.statements(plans: plans))
    }

    /// Closes every pool (waiting requests fail, running ones finish), then the own loop,
    /// whose thread has ended when this returns. Only the first call does anything (a
    /// command may register the close twice).
    public func close() async {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        await shares.withLock({ $0 })?.close()
        await own.close()
        await loop.close()
    }
}

/// A leased connection inside `Database.transaction(as:)` or `read(as:)`: confined to the
/// task that runs the body, and only valid inside it. Every pipeline sent while no
/// transaction is open starts with the scope (and `begin`, in a transaction).
public struct Transaction {
    let connection: PostgresLoopConnection
    private let prefix: [PostgresStatement]

    init(_ connection: PostgresLoopConnection, prefix: [PostgresStatement]) {
        self.connection = connection
        self.prefix = prefix
    }

    /// Runs `statements` in one round trip and returns their results in order; the first
    /// that fails is thrown (its `pipelineIndex` counts among `statements`) and the server
    /// skips the rest. `.commit` among them ends the transaction there.
    @discardableResult
    public func pipeline(_ statements: [PostgresStatement]) async throws -> [PostgresResult] {
        try await connection.pipeline(statements, prefix: connection.isInTransaction ? [] : prefix)
    }

    /// Runs one statement with parameters and returns its rows.
    @discardableResult
    public func query(_ sql: String, _ binds: any PostgresEncodable...) async throws -> PostgresResult {
        try await query(PostgresStatement(sql, binds: binds.map { $0.postgresBind }))
    }

    /// Runs one statement with already encoded parameters.
    @discardableResult
    public func query(_ sql: String, binds: [PostgresBind]) async throws -> PostgresResult {
        try await query(PostgresStatement(sql, binds: binds))
    }

    /// Runs one statement.
    @discardableResult
    public func query(_ statement: PostgresStatement) async throws -> PostgresResult {
        guard let result = try await pipeline([statement]).first else {
            throw PostgresError.unexpected("a statement returned no result")
        }
        return result
    }

    /// Rolls back the open transaction (if any): the next pipeline starts a new one, with
    /// the scope.
    public func rollback() async throws {
        if connection.isInTransaction { try await connection.pipeline([.rollback]) }
    }

    /// Whether a transaction is open (or failed) on the connection.
    public var isInTransaction: Bool { connection.isInTransaction }

    /// The server process serving this transaction (tests).
    public var backendPID: Int32 { connection.backendPID }
}
