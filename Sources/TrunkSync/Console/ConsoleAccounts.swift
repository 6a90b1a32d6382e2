import Foundation
import Postgres

/// The console's one seam to account export and deletion: today the operator tools'
/// implementation (`UserAdmin`, which `trunk-sync users export|delete` run), run here as the
/// server's role. When one shared account implementation serves the CLI, the app's own
/// account routes and the console, only this type changes.
struct ConsoleAccounts: Sendable {
    let pool: PostgresPool
    let revocations: SessionRevocations

    /// The most payload bytes (as stored) the console exports in one answer, which it builds
    /// in memory; larger accounts are exported with `trunk-sync users export`.
    static let maxExportBytes: Int64 = 64 * 1024 * 1024

    /// The user's events as JSON lines (`trunk-sync users export`'s format), oldest first.
    /// `payloadBytes`: the size of their payloads as stored (`ConsoleStore.payloadBytes`).
    func export(_ user: UserAdmin.Summary, payloadBytes: Int64) async throws -> (body: [UInt8], events: Int64) {
        guard payloadBytes <= Self.maxExportBytes else {
            throw APIError(
                status: 413, code: "export_too_large",
                message:
                    "The account's events hold \(payloadBytes) bytes of payload, more than the console exports at once (\(Self.maxExportBytes)).",
                hint: "Run trunk-sync users export \(user.email) on the server.")
        }
        let lines = Lines()
        let written = try await UserAdmin(pool: pool).export(user, write: { lines.append($0) }, progress: { _, _ in })
        return (lines.bytes, written)
    }

    /// Deletes the user with their sessions, refresh tokens, events and pending code, and
    /// revokes the sessions on every instance: here before answering, elsewhere through the
    /// sessions' trigger and its notification (`SessionRevocations`).
    func delete(_ user: UserAdmin.Summary, liveSessions: [UUID]) async throws -> Bool {
        let deleted = try await UserAdmin(pool: pool).delete(user)
        let revoked = try await pool.withConnection { connection in
            try AuthService.revocations(of: liveSessions, on: connection)
        }
        revocations.record(revoked)
        return deleted
    }
}

/// Export lines collected in order (the export's writer is called page by page).
private final class Lines: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var collected: [UInt8] = []
    func append(_ bytes: [UInt8]) { lock.withLock { collected.append(contentsOf: bytes) } }
    var bytes: [UInt8] { lock.withLock { collected } }
}
