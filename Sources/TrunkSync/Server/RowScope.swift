import Foundation
import Postgres
import TrunkCrypto

/// The transaction settings row-level security reads (migrations 0001 and 0003): every
/// server transaction that touches a user's rows first names whose rows they are. Each is
/// set with `set_config(…, true)`, so it ends with the transaction; a query that runs
/// without one sees nothing of anyone's.
enum RowScope {
    /// `app.user_id`: the user's users row, sessions, refresh tokens and events.
    static func user(_ id: UUID) -> PostgresStatement {
        .prepared("select set_config('app.user_id', $1, true)", UUIDText.lowercase(id))
    }

    /// `app.email`: the address's users row and sign-in code, for sign-in, which looks a
    /// user up by address before it knows the id.
    static func email(_ email: Email) -> PostgresStatement {
        .prepared("select set_config('app.email', $1, true)", email.value)
    }

    /// `app.refresh_token_hash`, then `app.user_id` of that token's owner (empty when no
    /// token has that hash): the token refresh knows nothing else.
    static func refreshToken(hash: PostgresBytes) -> [PostgresStatement] {
        [
            .prepared("select set_config('app.refresh_token_hash', $1, true)", Hex.encode(hash.bytes)),
            .prepared(
                """
                select set_config('app.user_id',
                  coalesce((select user_id::text from refresh_tokens where token_hash = $1), ''), true)
                """, hash),
        ]
    }

    /// Runs `statements` on `connection`, inside the caller's transaction.
    static func apply(_ statements: PostgresStatement..., on connection: PostgresConnection) throws {
        try apply(statements, on: connection)
    }

    /// Runs `statements` on `connection`, inside the caller's transaction.
    static func apply(_ statements: [PostgresStatement], on connection: PostgresConnection) throws {
        for statement in statements { try connection.query(statement.sql, binds: statement.binds) }
    }
}
