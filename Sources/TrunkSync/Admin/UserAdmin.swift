import Foundation
import Postgres

/// Operator tasks on users (the `trunk-sync users` commands). Runs as the migrating user,
/// and scopes event reads with `app.user_id` so it works whether or not that user bypasses
/// row-level security.
public struct UserAdmin: Sendable {
    let pool: PostgresPool

    public init(pool: PostgresPool) { self.pool = pool }

    /// One user as operators see it.
    public struct Summary: Sendable {
        public var id: UUID
        public var email: String
        public var fullName: String?
        public var createdAt: PostgresTimestamp
        public var lastSignInAt: PostgresTimestamp?
        /// Events stored (each user's seq is gap-free, so this is `last_seq`).
        public var events: Int64
        public var activeSessions: Int64
    }

    static let summaryColumns = """
        u.id, u.email, u.full_name, u.created_at, u.last_sign_in_at, u.last_seq,
        (select count(*) from sessions s where s.user_id = u.id and s.revoked_at is null)
        """

    static func summary(_ row: PostgresRow) throws -> Summary {
        Summary(
            id: try row.decode(UUID.self, column: 0), email: try row.decode(String.self, column: 1),
            fullName: try row.decode(String?.self, column: 2), createdAt: try row.decode(PostgresTimestamp.self, column: 3),
            lastSignInAt: try row.decode(PostgresTimestamp?.self, column: 4), events: try row.decode(Int64.self, column: 5),
            activeSessions: try row.decode(Int64.self, column: 6))
    }

    /// Every user, oldest first.
    public func list() async throws -> [Summary] {
        try await pool.withConnection { connection in
            try connection.query("select \(Self.summaryColumns) from users u order by u.created_at, u.email").map(Self.summary)
        }
    }

    /// One user by email, or nil.
    public func find(_ email: Email) async throws -> Summary? {
        try await pool.withConnection { connection in
            try connection.query("select \(Self.summaryColumns) from users u where lower(u.email) = $1", email.value)
                .first.map(Self.summary)
        }
    }

    /// Streams the user's events in seq order as JSON lines (one object per line, the pull
    /// API's fields), page by page; `progress` gets (written, total) after each page.
    public func export(
        _ user: Summary, pageSize: Int = 1000, write: @escaping @Sendable ([UInt8]) -> Void,
        progress: @escaping @Sendable (Int64, Int64) -> Void
    ) async throws -> Int64 {
        let store = EventStore(pool: pool)
        var cursor: Int64 = 0
        var written: Int64 = 0
        while true {
            let page = try await store.pull(for: user.id, after: cursor, limit: pageSize)
            guard page.count > 0, let last = page.lastSeq else { break }
            write(Self.jsonLines(fromArray: page.eventsJSON))
            written += Int64(page.count)
            cursor = last
            progress(written, user.events)
            if !page.hasMore { break }
        }
        return written
    }

    /// Turns the pull page's `[{…},{…}]` into `{…}\n{…}\n` (objects are at nesting depth 1).
    static func jsonLines(fromArray array: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(array.count + 16)
        var depth = 0
        var inString = false
        var escaped = false
        for byte in array {
            if inString {
                out.append(byte)
                if escaped { escaped = false } else if byte == UInt8(ascii: "\\") { escaped = true } else if byte == UInt8(ascii: "\"") { inString = false }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""):
                inString = true
                out.append(byte)
            case UInt8(ascii: "["), UInt8(ascii: "{"):
                depth += 1
                if depth > 1 { out.append(byte) }
            case UInt8(ascii: "]"), UInt8(ascii: "}"):
                depth -= 1
                if depth >= 1 { out.append(byte) }
                if depth == 1, byte == UInt8(ascii: "}") { out.append(UInt8(ascii: "\n")) }
            case UInt8(ascii: ","):
                if depth > 1 { out.append(byte) }
            default:
                out.append(byte)
            }
        }
        return out
    }

    /// Deletes the user and everything of theirs: sessions, refresh tokens and events (by
    /// cascade) and any pending sign-in code. Returns false when there was no such user.
    /// Scoped to the user and their address, so it works as the server's role too (the
    /// console), whose row-level security shows it nothing else.
    public func delete(_ user: Summary) async throws -> Bool {
        try await pool.transaction { connection in
            try RowScope.apply(RowScope.user(user.id), RowScope.address(user.email.lowercased()), on: connection)
            try connection.query("delete from otp_codes where email = $1", user.email.lowercased())
            return try connection.query("delete from users where id = $1", user.id).affectedRows == 1
        }
    }
}
