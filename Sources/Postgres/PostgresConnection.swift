import CLibPQ
import Foundation

/// What the notice receiver learned; touched only by the connection's thread.
private final class NoticeState {
    var terminated = false
}

/// One libpq connection. Its own calls block, so they are for threads that may wait (the
/// command line's own threads, tests), one thread at a time; the loop-driven
/// pool and the listener drive it without blocking (`PostgresLoopConnection`).
public final class PostgresConnection {
    let handle: OpaquePointer
    /// What this connection was opened with.
    public let configuration: PostgresConfiguration
    private let notices = NoticeState()
    /// Told the SQL text of every statement this connection runs, before it runs (set by
    /// the pool from `PostgresLoopPool.Configuration.statementObserver`; nil: nothing is done).
    public var statementObserver: (@Sendable (String) -> Void)? = nil

    private init(handle: OpaquePointer, configuration: PostgresConfiguration) {
        self.handle = handle
        self.configuration = configuration
        // libpq prints notices to stderr by default; instead, remember only whether the server
        // announced it is ending this session (a FATAL sent to an idle connection).
        PQsetNoticeReceiver(
            handle,
            { argument, result in
                guard let argument, let result,
                    let severity = PQresultErrorField(result, Int32(UInt8(ascii: "V")))
                else { return }
                if String(cString: severity) == "FATAL" || String(cString: severity) == "PANIC" {
                    Unmanaged<NoticeState>.fromOpaque(argument).takeUnretainedValue().terminated = true
                }
            }, Unmanaged.passUnretained(notices).toOpaque())
    }

    deinit { PQfinish(handle) }

    /// Opens a connection (blocking, bounded by `connect_timeout`), for the command line's
    /// and the tests' own use; the pools open theirs without blocking (`start`).
    /// - Throws: `.connectionFailed` naming `host:port/database` and the server's reason,
    ///   never the password.
    public static func connect(_ configuration: PostgresConfiguration) throws -> PostgresConnection {
        let handle = try withParameters(of: configuration) { keywords, values in PQconnectdbParams(keywords, values, 0)
        }
        guard PQstatus(handle) == CONNECTION_OK else {
            let error = openingError(handle, configuration)
            PQfinish(handle)
            throw error
        }
        return PostgresConnection(handle: handle, configuration: configuration)
    }

    /// `connect`, which `cancellation` ends from another thread (a signal during `serve`'s
    /// start-up): the opening is driven by `PQconnectPoll` while `poll(2)` waits on the
    /// connection's socket and the cancellation's pipe together. `connect_timeout` bounds
    /// the whole attempt (at least 2 s, none when 0), as for the loop's openings. A host name
    /// is looked up inside libpq, as by `connect`: that wait is not cut short.
    /// - Throws: what `connect` throws, or `CancellationError` once `cancellation` was
    ///   cancelled (the half-open connection closed).
    public static func connect(_ configuration: PostgresConfiguration, cancellation: ConnectCancellation) throws
        -> PostgresConnection
    {
        let handle = try withParameters(of: configuration) { keywords, values in
            PQconnectStartParams(keywords, values, 0)
        }
        // Finished (PQfinish) when released, whichever way this ends.
        let connection = PostgresConnection(handle: handle, configuration: configuration)
        guard PQstatus(handle) != CONNECTION_BAD else { throw openingError(handle, configuration) }
        let deadline = PostgresConnecting.timeout(configuration).map { monotonicNanoseconds() + $0 }
        // Before the first PQconnectPoll, libpq asks to wait as if it had said "writing".
        var status = PGRES_POLLING_WRITING
        while true {
            switch status {
            case PGRES_POLLING_OK:
                return connection
            case PGRES_POLLING_READING, PGRES_POLLING_WRITING:
                let socket = PQsocket(handle)
                guard socket >= 0 else { throw openingError(handle, configuration) }
                var wait: Int32 = -1
                if let deadline {
                    let now = monotonicNanoseconds()
                    guard now < deadline else { throw openingError(reason: "timeout expired", configuration) }
                    wait = Int32(min((deadline - now) / 1_000_000 + 1, 100_000))
                }
                var fds = [
                    pollfd(
                        fd: socket, events: Int16(status == PGRES_POLLING_WRITING ? POLLOUT : POLLIN), revents: 0),
                    pollfd(fd: cancellation.descriptor, events: Int16(POLLIN), revents: 0),
                ]
                let ready = poll(&fds, 2, wait)
                if ready < 0 && errno != EINTR {
                    throw openingError(reason: "poll failed: errno \(errno)", configuration)
                }
                if fds[1].revents != 0 { throw CancellationError() }
                if ready > 0 && fds[0].revents != 0 { status = PQconnectPoll(handle) }
            default:
                throw openingError(handle, configuration)
            }
        }
    }

    /// Starts opening a connection without blocking (`PQconnectStartParams`): the result is
    /// still connecting; `PostgresConnecting` drives it to the end on an event loop.
    /// `resolved` is `configuration` with its host names' addresses (`HostLookup`): libpq
    /// would look a name up with `getaddrinfo`, which blocks. Messages name `configuration`.
    /// - Throws: `.connectionFailed` as `connect` when libpq refuses at once (out of memory,
    ///   an invalid parameter).
    static func start(_ configuration: PostgresConfiguration, resolved: PostgresConfiguration) throws
        -> PostgresConnection
    {
        let handle = try withParameters(of: resolved) { keywords, values in PQconnectStartParams(keywords, values, 0) }
        guard PQstatus(handle) != CONNECTION_BAD else {
            let error = openingError(handle, configuration)
            PQfinish(handle)
            throw error
        }
        return PostgresConnection(handle: handle, configuration: configuration)
    }

    /// Calls `open` with the configuration's keywords and values as libpq's NULL-terminated
    /// arrays.
    private static func withParameters(
        of configuration: PostgresConfiguration,
        _ open: ([UnsafePointer<CChar>?], [UnsafePointer<CChar>?]) -> OpaquePointer?
    ) throws -> OpaquePointer {
        let keywords = configuration.parameters.map { strdup($0.keyword) }
        let values = configuration.parameters.map { strdup($0.value) }
        defer {
            keywords.forEach { free($0) }
            values.forEach { free($0) }
        }
        var keywordPointers: [UnsafePointer<CChar>?] = keywords.map { UnsafePointer($0) }
        var valuePointers: [UnsafePointer<CChar>?] = values.map { UnsafePointer($0) }
        keywordPointers.append(nil)
        valuePointers.append(nil)
        guard let handle = open(keywordPointers, valuePointers) else {
            throw PostgresError(
                kind: .connectionFailed,
                message: "could not connect to PostgreSQL at \(configuration.endpoint): out of memory")
        }
        return handle
    }

    /// The error of a connection that could not be opened: `.connectionFailed` naming
    /// `host:port/database` (after the configuration's setting, if it has one) and libpq's
    /// reason, the password masked.
    static func openingError(_ handle: OpaquePointer, _ configuration: PostgresConfiguration) -> PostgresError {
        openingError(reason: String(cString: PQerrorMessage(handle)), configuration)
    }

    /// The same, for a reason of the module's own (`timeout expired`).
    static func openingError(reason raw: String, _ configuration: PostgresConfiguration) -> PostgresError {
        let reason = configuration.withoutPassword(connectionFailureReason(raw))
        let setting = configuration.setting.map { "\($0): " } ?? ""
        return PostgresError(
            kind: .connectionFailed,
            message: "\(setting)could not connect to PostgreSQL at \(configuration.endpoint): \(reason)")
    }

    /// Turns libpq's multi-line connection error into one line without the repeated
    /// `connection to server at … failed:` prefix and severity labels.
    static func connectionFailureReason(_ raw: String) -> String {
        var line = PostgresConfiguration.oneLine(raw)
        if let range = line.range(of: " failed: "), line.hasPrefix("connection to server") {
            line = String(line[range.upperBound...])
        }
        for label in ["FATAL:  ", "ERROR:  "] { line = line.replacingOccurrences(of: label, with: "") }
        return line.isEmpty ? "unknown error" : line
    }

    /// Whether the server announced it is ending this session (a FATAL notice read while
    /// idle, e.g. `pg_terminate_backend`), which libpq reports before the end of file.
    var announcedTermination: Bool { notices.terminated }

    /// Whether the connection is still open and not in a failed state.
    public var isOpen: Bool { PQstatus(handle) == CONNECTION_OK && !lostTrack }

    /// Set when a pipeline ended in a state this class cannot recover from (the connection
    /// broke half-way): the connection then counts as closed, so the pool replaces it.
    var lostTrack = false

    /// Whether a transaction is open (or failed) on this connection.
    public var isInTransaction: Bool {
        let status = PQtransactionStatus(handle)
        return status == PQTRANS_INTRANS || status == PQTRANS_INERROR || status == PQTRANS_ACTIVE
    }

    /// The connection's socket, for `poll`.
    var socket: Int32 { PQsocket(handle) }

    /// The backend's process id, e.g. to terminate it in tests.
    public var backendPID: Int32 { PQbackendPID(handle) }

    /// Runs one parametrised statement (`$1`, `$2`, … ) and returns its rows in binary format.
    @discardableResult
    public func query(_ sql: String, _ binds: any PostgresEncodable...) throws -> PostgresResult {
        try query(sql, binds: binds.map { $0.postgresBind })
    }

    /// Runs one parametrised statement with already encoded parameters.
    @discardableResult
    public func query(_ sql: String, binds: [PostgresBind]) throws -> PostgresResult {
        statementObserver?(sql)
        let result = Self.withParameters(binds) { count, types, values, lengths, formats in
            PQexecParams(handle, sql, count, types, values, lengths, formats, 1)
        }
        return try check(result)
    }

    /// Runs `statements` in one round trip (libpq's pipeline mode) and returns their results
    /// in order. The server still runs them one after the other, each with its own snapshot,
    /// exactly as if they were sent one by one; the first that fails is thrown and the
    /// server skips the rest. Statements not inside an explicit transaction (`begin` …
    /// `commit`, which may be part of `statements`) run in one implicit transaction.
    ///
    /// A failed statement inside an explicit transaction leaves it failed (as `query`
    /// does): roll it back, e.g. with `pipelinedTransaction`.
    @discardableResult
    public func pipeline(_ statements: [PostgresStatement]) throws -> [PostgresResult] {
        guard !statements.isEmpty else { return [] }
        if let statementObserver { statements.forEach { statementObserver($0.sql) } }
        guard PQenterPipelineMode(handle) == 1 else { throw connectionError() }
        do {
            return try runPipeline(statements)
        } catch {
            // A statement's failure ends the pipeline cleanly; anything else leaves results
            // unread in an unknown state.
            if PQpipelineStatus(handle) != PQ_PIPELINE_OFF { lostTrack = true }
            throw error
        }
    }

    /// What the server answers in a pipeline, in order: a `Parse` of a statement being
    /// prepared, or a statement's result.
    enum PipelineReply {
        case prepared(PreparedKey, name: String)
        case statement
    }

    private func runPipeline(_ statements: [PostgresStatement]) throws -> [PostgresResult] {
        let replies = try sendPipeline(statements)
        var collector = PipelineCollector(replies: replies)
        for _ in replies {
            // Each reply is one result, then NULL.
            guard let result = PQgetResult(handle) else { throw connectionError() }
            try collector.accept(result, on: self)
            while let extra = PQgetResult(handle) { PQclear(extra) }
        }
        guard let sync = PQgetResult(handle) else { throw connectionError() }
        let synced = PQresultStatus(sync) == PGRES_PIPELINE_SYNC
        PQclear(sync)
        guard synced, PQexitPipelineMode(handle) == 1 else { throw connectionError() }
        return try collector.finish()
    }

    /// Queues `statements` and a sync in pipeline mode (entered by the caller); returns what
    /// the server will answer, in order. In non-blocking mode nothing waits: what does not
    /// fit the socket stays in libpq's buffer for `PQflush`.
    ///
    /// Several pipelines may be in flight on one connection (`PostgresLoopConnection`'s
    /// shared pipelines): a statement another pipeline is still preparing (its `Parse` not yet
    /// answered, and it may fail) runs unprepared here, and names are never reused.
    func sendPipeline(_ statements: [PostgresStatement]) throws -> [PipelineReply] {
        var replies: [PipelineReply] = []
        replies.reserveCapacity(statements.count + 2)
        var preparing: [PreparedKey: String] = [:]
        for statement in statements {
            let sent = Self.withParameters(statement.binds) { count, types, values, lengths, formats in
                guard statement.isPrepared else {
                    return PQsendQueryParams(handle, statement.sql, count, types, values, lengths, formats, 1)
                }
                let key = PreparedKey(sql: statement.sql, types: types)
                var name = preparedStatements[key] ?? preparing[key]
                if name == nil, !preparesInFlight.contains(key),
                    preparedStatements.count + preparesInFlight.count < Self.maxPreparedStatements
                {
                    preparedNames += 1
                    let fresh = "trunk_sync_\(preparedNames)"
                    guard PQsendPrepare(handle, fresh, statement.sql, count, types) == 1 else { return 0 }
                    preparing[key] = fresh
                    preparesInFlight.insert(key)
                    replies.append(.prepared(key, name: fresh))
                    name = fresh
                }
                guard let name else {
                    return PQsendQueryParams(handle, statement.sql, count, types, values, lengths, formats, 1)
                }
                return PQsendQueryPrepared(handle, name, count, values, lengths, formats, 1)
            }
            // Nothing is queued on the server yet (no sync): a failed send leaves a broken
            // connection, which the pool replaces.
            guard sent == 1 else { throw connectionError() }
            replies.append(.statement)
        }
        guard PQpipelineSync(handle) == 1 else { throw connectionError() }
        return replies
    }

    /// Gathers a pipeline's results, one per reply, in order: statements' rows, the first
    /// error (the server skips the rest: `PGRES_PIPELINE_ABORTED`), statements prepared.
    struct PipelineCollector {
        let replies: [PipelineReply]
        private(set) var next = 0
        var results: [PostgresResult] = []
        var failure: (any Error)? = nil

        init(replies: [PipelineReply]) {
            self.replies = replies
            results.reserveCapacity(replies.count)
        }

        var isComplete: Bool { next == replies.count }

        /// Takes the result of the next reply (and frees it when it is not kept).
        mutating func accept(_ result: OpaquePointer, on connection: PostgresConnection) throws {
            let reply = next < replies.count ? replies[next] : .statement
            next += 1
            // Answered (prepared, failed or skipped): no longer in flight.
            if case .prepared(let key, _) = reply { connection.preparesInFlight.remove(key) }
            if PQresultStatus(result) == PGRES_PIPELINE_ABORTED {
                PQclear(result)
                return
            }
            do {
                let checked = try connection.check(result)
                switch reply {
                case .prepared(let key, let name): connection.preparedStatements[key] = name
                case .statement: results.append(checked)
                }
            } catch var error as PostgresError {
                if !connection.isOpen { throw error }
                if failure == nil, case .statement = reply { error.pipelineIndex = results.count }
                failure = failure ?? error
            } catch {
                if !connection.isOpen { throw error }
                failure = failure ?? error
            }
        }

        /// The statements' results, or the first error.
        func finish() throws -> [PostgresResult] {
            if let failure { throw failure }
            return results
        }
    }

    /// A statement prepared on this connection: its text and parameter types.
    struct PreparedKey: Hashable {
        var sql: String
        var types: [UInt32]
    }

    /// The statements prepared on this connection (they live as long as the session).
    var preparedStatements: [PreparedKey: String] = [:]
    /// Statements whose `Parse` was sent and not yet answered.
    var preparesInFlight: Set<PreparedKey> = []
    /// Names given so far (`trunk_sync_<n>`): a name is never given twice.
    private var preparedNames = 0

    /// Most statements one connection prepares; later ones run unprepared. The hot paths
    /// have a handful of fixed statements: this only bounds a mistake.
    static let maxPreparedStatements = 64

    /// Runs `body`, which opens a transaction itself and commits it, typically with
    /// `begin` at the head of its first `pipeline` and `commit` at the tail of its last, so
    /// the transaction costs no round trip of its own. Whatever transaction `body` leaves
    /// open, by throwing or by returning early, is rolled back.
    public func pipelinedTransaction<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        do {
            let value = try body(self)
            if isOpen, isInTransaction { try execute("ROLLBACK") }
            return value
        } catch {
            if isOpen, isInTransaction { try? execute("ROLLBACK") }
            throw error
        }
    }

    /// Lays `binds` out as libpq's parallel arrays of types, values, lengths and formats.
    static func withParameters<R>(
        _ binds: [PostgresBind],
        _ body: (
            Int32, [UInt32], [UnsafePointer<CChar>?], [Int32], [Int32]
        ) -> R
    ) -> R {
        let count = binds.count
        var types = [UInt32](repeating: 0, count: count)
        var lengths = [Int32](repeating: 0, count: count)
        var formats = [Int32](repeating: 0, count: count)
        var offsets = [Int](repeating: -1, count: count)
        var storage: [UInt8] = []
        storage.reserveCapacity(binds.reduce(0) { $0 + ($1.bytes?.count ?? 0) + 1 })
        for (index, bind) in binds.enumerated() {
            types[index] = bind.type
            formats[index] = bind.format
            if let bytes = bind.bytes {
                offsets[index] = storage.count
                lengths[index] = Int32(bytes.count)
                storage.append(contentsOf: bytes)
                if bind.format == 0 { storage.append(0) }  // text parameters are C strings
            }
        }
        storage.append(0)  // never empty, so every value (even an empty one) has an address
        return storage.withUnsafeBufferPointer { buffer in
            let base = buffer.baseAddress.map { UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self) }
            let values: [UnsafePointer<CChar>?] = offsets.map { offset in
                guard offset >= 0, let base else { return nil }
                return base + offset
            }
            return body(Int32(count), types, values, lengths, formats)
        }
    }

    /// Runs one or more statements without parameters (simple query protocol), e.g. a
    /// migration file. Results are discarded.
    public func execute(_ sql: String) throws {
        statementObserver?(sql)
        _ = try check(PQexec(handle, sql))
    }

    /// Runs `body` inside `BEGIN … COMMIT`; any error thrown rolls the transaction back and
    /// is rethrown.
    public func transaction<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        try execute("BEGIN")
        do {
            let value = try body(self)
            try execute("COMMIT")
            return value
        } catch {
            if isOpen, isInTransaction { try? execute("ROLLBACK") }
            throw error
        }
    }

    /// Quotes an identifier (role, channel) with libpq's own escaping.
    public func quoteIdentifier(_ identifier: String) throws -> String {
        let bytes = Array(identifier.utf8)
        guard let quoted = PQescapeIdentifier(handle, identifier, bytes.count) else {
            throw PostgresError(kind: .invalidConfiguration, message: "invalid identifier")
        }
        defer { PQfreemem(quoted) }
        return String(cString: quoted)
    }

    /// Quotes a string literal with libpq's own escaping, for the statements that take no
    /// parameters (`ALTER ROLE … PASSWORD`).
    public func quoteLiteral(_ text: String) throws -> String {
        let bytes = Array(text.utf8)
        guard let quoted = PQescapeLiteral(handle, text, bytes.count) else {
            throw PostgresError(kind: .invalidConfiguration, message: "invalid literal")
        }
        defer { PQfreemem(quoted) }
        return String(cString: quoted)
    }

    /// The password as the server stores it (a SCRAM-SHA-256 verifier, or whatever the
    /// server's `password_encryption` says), computed here: the password itself never
    /// travels to the server or into its logs, as with psql's `\password`.
    public func encryptedPassword(_ password: String, role: String) throws -> String {
        guard let encrypted = PQencryptPasswordConn(handle, password, role, nil) else {
            throw PostgresError(
                kind: isOpen ? .server : .connectionClosed, message: "cannot encrypt the password for role \(role)")
        }
        defer { PQfreemem(encrypted) }
        return String(cString: encrypted)
    }

    /// Checks an idle connection without a round trip: reads whatever the server sent while
    /// it was idle (a shutdown notice, EOF) and reports whether it is still usable.
    func isUsableAfterIdle() -> Bool {
        guard isOpen, !isInTransaction else { return false }
        // An idle connection receives nothing but notices and notifications; a terminated
        // backend sends a FATAL notice and then EOF, which libpq turns into CONNECTION_BAD.
        var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        for _ in 0..<8 {
            guard poll(&descriptor, 1, 0) > 0 else { break }
            if PQconsumeInput(handle) == 0 { return false }
            _ = PQisBusy(handle)  // parses what arrived
            while let notice = PQnotifies(handle) { PQfreemem(notice) }
            if !isOpen || notices.terminated { return false }
        }
        return isOpen && !notices.terminated
    }

    /// Converts a libpq result into rows or a thrown `PostgresError`.
    func check(_ result: OpaquePointer?) throws -> PostgresResult {
        guard let result else {
            throw connectionError()
        }
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY, PGRES_SINGLE_TUPLE:
            return PostgresResult(handle: result)
        default:
            defer { PQclear(result) }
            func field(_ code: UInt8) -> String? {
                PQresultErrorField(result, Int32(code)).map { String(cString: $0) }
            }
            guard let code = field(UInt8(ascii: "C")) else {
                throw connectionError()
            }
            let state = SQLState(rawValue: code)
            var message = "PostgreSQL error \(state)"
            let constraint = field(UInt8(ascii: "n"))
            if let constraint { message += " on constraint \(constraint)" }
            if !isOpen {
                throw PostgresError(
                    kind: .connectionClosed, message: "database connection lost: \(message)", sqlState: state)
            }
            throw PostgresError(
                kind: .server, message: message, sqlState: state,
                serverMessage: field(UInt8(ascii: "M")), detail: field(UInt8(ascii: "D")),
                hint: field(UInt8(ascii: "H")), constraint: constraint
            )
        }
    }

    func connectionError() -> PostgresError {
        let reason = configuration.withoutPassword(
            PostgresConfiguration.oneLine(String(cString: PQerrorMessage(handle))))
        return PostgresError(
            kind: isOpen ? .server : .connectionClosed,
            message: "database connection to \(configuration.endpoint) lost",
            serverMessage: reason
        )
    }
}

/// One statement of a `PostgresConnection.pipeline`: SQL with `$1`, `$2`, … and its
/// parameters.
public struct PostgresStatement: Sendable {
    /// The statement's text.
    public var sql: String
    /// Its parameters, encoded.
    public var binds: [PostgresBind]

    /// A statement with parameters.
    public init(_ sql: String, _ binds: any PostgresEncodable...) {
        self.sql = sql
        self.binds = binds.map { $0.postgresBind }
    }

    /// A statement with already encoded parameters.
    public init(_ sql: String, binds: [PostgresBind]) {
        self.sql = sql
        self.binds = binds
    }

    /// Whether the statement is prepared once per connection and then reused: the server
    /// parses it once and, after a few runs, may keep one generic plan instead of planning
    /// each run with the actual parameters. For fixed SQL on hot paths whose best plan does
    /// not depend on the values (a primary key, a `(user_id, seq)` range); not for queries
    /// whose plan should follow the data, such as `= any($1)` over a large array.
    public var isPrepared = false

    /// A statement prepared once per connection (see `isPrepared`).
    public static func prepared(_ sql: String, _ binds: any PostgresEncodable...) -> PostgresStatement {
        var statement = PostgresStatement(sql, binds: binds.map { $0.postgresBind })
        statement.isPrepared = true
        return statement
    }

    /// `begin`.
    public static let begin = PostgresStatement.prepared("begin")
    /// `commit`.
    public static let commit = PostgresStatement.prepared("commit")
    /// `rollback`, prepared once per connection.
    public static let rollback = PostgresStatement.prepared("rollback")
}

/// Ends a blocking `PostgresConnection.connect(_:cancellation:)` from any thread: `cancel()`
/// makes its pipe readable, which the opening's `poll(2)` watches. Once cancelled, it stays
/// so. The pipe closes when the last reference goes.
public final class ConnectCancellation: Sendable {
    /// The pipe's read end, watched by the opening.
    let descriptor: Int32
    private let writeEnd: Int32

    /// - Throws: `.connectionFailed` when no pipe can be made (out of descriptors).
    public init() throws {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else {
            throw PostgresError(
                kind: .connectionFailed, message: "cannot make a pipe to cancel a connection attempt: errno \(errno)")
        }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        _ = fcntl(ends[1], F_SETFL, O_NONBLOCK)
        descriptor = ends[0]
        writeEnd = ends[1]
    }

    deinit {
        close(descriptor)
        close(writeEnd)
    }

    /// Ends the opening under way, if any, and every later one given this cancellation.
    public func cancel() {
        var byte: UInt8 = 1
        _ = write(writeEnd, &byte, 1)  // full (cancelled already) or not: readable either way
    }
}
