import Foundation
import Postgres

/// Operator look-ups of users (`trunk-sync users list|show`). Runs as the migrating user,
/// whose `trunk_sync_admin` role row-level security lets see every row. Exporting and
/// deleting a user is `Accounts`' job, shared with the self-service routes.
public struct UserAdmin: Sendable {
    let database: Database

    public init(database: Database) { self.database = database }

    /// One user as operators see it.
    public struct Summary: Sendable {
        public var id: UUID
        public var email: String
        public var fullName: String?
        public var createdAt: PostgresTimestamp
        public var lastSignInAt: PostgresTimestamp?
        /// Events stored (each user's seq is gap-free but for what a restore skipped: so this is
        /// `last_seq - seq_skipped`, migration 0017).
        public var events: Int64
        public var activeSessions: Int64
    }

    static let summaryColumns = """
        u.id, u.email, u.full_name, u.created_at, u.last_sign_in_at, u.last_seq - u.seq_skipped,
        (select count(*) from sessions s where s.user_id = u.id and s.revoked_at is null)
        """

    static func summary(_ row: PostgresRow) throws -> Summary {
        Summary(
            id: try row.decode(UUID.self, column: 0), email: try row.decode(String.self, column: 1),
            fullName: try row.decode(String?.self, column: 2),
            createdAt: try row.decode(PostgresTimestamp.self, column: 3),
            lastSignInAt: try row.decode(PostgresTimestamp?.self, column: 4),
            events: try row.decode(Int64.self, column: 5),
            activeSessions: try row.decode(Int64.self, column: 6))
    }

    /// Every user, oldest first.
    public func list() async throws -> [Summary] {
        try await database.read(as: .server) { tx in
            try await tx.query("select \(Self.summaryColumns) from users u order by u.created_at, u.email").map(
                Self.summary)
        }
    }

    /// One user by email, or nil.
    public func find(_ email: Email) async throws -> Summary? {
        try await database.read(as: .server) { tx in
            try await tx.query("select \(Self.summaryColumns) from users u where lower(u.email) = $1", email.value)
                .first.map(Self.summary)
        }
    }
}
