/// An error from the `Postgres` module.
///
/// `description` is safe to log or show: it never contains query parameters, row values or
/// passwords. `debugDescription` adds the server's message, detail and hint, which may
/// contain data, for debugging only.
public struct PostgresError: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// What went wrong, broadly.
    public enum Kind: Sendable, Equatable {
        /// The server could not be reached or refused the connection.
        case connectionFailed
        /// An established connection broke (server restart, network).
        case connectionClosed
        /// The server answered a query with an error; see `sqlState`.
        case server
        /// No connection became free within the pool's acquire timeout.
        case poolExhausted
        /// The pool is shutting down.
        case poolClosed
        /// A value could not be decoded into the requested Swift type.
        case decoding
        /// The connection URL or a setting is invalid.
        case invalidConfiguration
    }

    /// What went wrong, broadly.
    public let kind: Kind
    /// The SQLSTATE code for `.server` errors.
    public let sqlState: SQLState?
    /// A safe, one-line summary (no data values).
    let message: String
    /// Server-side detail (may contain data): primary message, detail, hint, constraint.
    public let serverMessage: String?
    /// The server's `DETAIL` field, if any.
    public let detail: String?
    /// The server's `HINT` field, if any.
    public let hint: String?
    /// The constraint the error is about (e.g. for unique violations), if any.
    public let constraint: String?
    /// For a statement of a pipeline that failed while its connection stayed usable: its
    /// position among the pipeline's statements (every one before it succeeded, none after
    /// it ran). Nil for anything else, a connection lost mid-pipeline among them: then which
    /// statements ran is unknown.
    public internal(set) var pipelineIndex: Int? = nil

    /// A connection its pool's own opening check (`PostgresLoopPool.Configuration.onOpen`)
    /// will not use, e.g. one to a server in recovery: requests fail as when the server
    /// refused the connection (`.connectionFailed`, which the server answers `503`).
    public static func refused(_ message: String) -> PostgresError {
        PostgresError(kind: .connectionFailed, message: message)
    }

    /// An answer the protocol does not allow (e.g. a statement without a result).
    public static func unexpected(_ message: String) -> PostgresError {
        PostgresError(kind: .decoding, message: message)
    }

    init(
        kind: Kind, message: String, sqlState: SQLState? = nil, serverMessage: String? = nil,
        detail: String? = nil, hint: String? = nil, constraint: String? = nil
    ) {
        self.kind = kind
        self.message = message
        self.sqlState = sqlState
        self.serverMessage = serverMessage
        self.detail = detail
        self.hint = hint
        self.constraint = constraint
    }

    /// True for `23505`: a unique constraint rejected the row.
    public var isUniqueViolation: Bool { sqlState == .uniqueViolation }

    /// A one-line message that is safe to log.
    public var description: String { message }

    /// Everything known, including what the server said. Not for logs a user can read.
    public var debugDescription: String {
        var parts = [message]
        if let serverMessage { parts.append("message: \(serverMessage)") }
        if let detail { parts.append("detail: \(detail)") }
        if let hint { parts.append("hint: \(hint)") }
        if let constraint { parts.append("constraint: \(constraint)") }
        return parts.joined(separator: "; ")
    }
}

/// A five-character PostgreSQL SQLSTATE code.
public struct SQLState: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The code, e.g. `23505`.
    public let rawValue: String
    /// Wraps a code.
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `23505`
    public static let uniqueViolation = SQLState(rawValue: "23505")
    /// `23503`
    public static let foreignKeyViolation = SQLState(rawValue: "23503")
    /// `23502`
    public static let notNullViolation = SQLState(rawValue: "23502")
    /// `23514`
    public static let checkViolation = SQLState(rawValue: "23514")
    /// `42501`: permission denied, also a row-level-security violation.
    public static let insufficientPrivilege = SQLState(rawValue: "42501")
    /// `42P01`
    public static let undefinedTable = SQLState(rawValue: "42P01")
    /// `42883`
    public static let undefinedFunction = SQLState(rawValue: "42883")
    /// `3D000`
    public static let invalidCatalogName = SQLState(rawValue: "3D000")
    /// `42P04`
    public static let duplicateDatabase = SQLState(rawValue: "42P04")
    /// `40001`
    public static let serializationFailure = SQLState(rawValue: "40001")
    /// `40P01`
    public static let deadlockDetected = SQLState(rawValue: "40P01")
    /// `57014`: statement timeout or cancel request.
    public static let queryCanceled = SQLState(rawValue: "57014")
    /// `57P01`: the server is shutting down.
    public static let adminShutdown = SQLState(rawValue: "57P01")
    /// `22P02`
    public static let invalidTextRepresentation = SQLState(rawValue: "22P02")

    static let names: [String: String] = [
        "23505": "unique violation", "23503": "foreign key violation",
        "23502": "not-null violation", "23514": "check violation",
        "42501": "insufficient privilege", "42P01": "undefined table", "42883": "undefined function",
        "42703": "undefined column", "42601": "syntax error", "3D000": "database does not exist",
        "42P04": "database already exists", "40001": "serialization failure",
        "40P01": "deadlock detected", "57014": "query canceled", "57P01": "server shutting down",
        "22P02": "invalid text representation", "22007": "invalid datetime format",
        "22008": "datetime field overflow", "25P02": "transaction aborted",
        "53300": "too many connections", "28P01": "password authentication failed",
    ]

    /// The code followed by its meaning when known, e.g. `23505 (unique violation)`.
    public var description: String {
        if let name = Self.names[rawValue] { return "\(rawValue) (\(name))" }
        return rawValue
    }
}
