import Foundation
import Postgres

/// The console's account export and deletion: the shared implementation (`Accounts`) that
/// the app's own account routes and `trunk-sync users export|delete` use too.
struct ConsoleAccounts: Sendable {
    let accounts: Accounts

    /// The most payload bytes (as stored) the console exports in one answer, which it builds
    /// in memory; larger accounts are exported with `trunk-sync users export`.
    static let maxExportBytes: Int64 = 64 * 1024 * 1024

    /// The user's account line and events as JSON lines (the format of `GET
    /// /sync/v1/export`), oldest first. `payloadBytes`: the size of their payloads as stored
    /// (`ConsoleStore.payloadBytes`).
    func export(_ user: UserAdmin.Summary, payloadBytes: Int64) async throws -> (body: [UInt8], events: Int64) {
        guard payloadBytes <= Self.maxExportBytes else {
            throw APIError(
                status: 413, code: "export_too_large",
                message:
                    "The account's events hold \(payloadBytes) bytes of payload, more than the console exports at once (\(Self.maxExportBytes)).",
                hint: "Run trunk-sync users export \(user.email) on the server.")
        }
        let lines = Lines()
        do {
            let written = try await accounts.export(user.id) { lines.append($0) }
            return (lines.bytes, written.events)
        } catch Accounts.ExportError.inProgress {
            throw APIError.exportInProgress
        } catch Accounts.ExportError.notFound {
            throw ConsoleError.userNotFound
        }
    }

    /// Deletes the user and everything of theirs (`Accounts.delete`: every session revoked on
    /// every instance). False when there was no such user.
    func delete(_ user: UserAdmin.Summary) async throws -> Bool {
        try await accounts.delete(user.id) != nil
    }
}

/// Export lines collected in order (the export's writer is called page by page).
private final class Lines: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var collected: [UInt8] = []
    func append(_ bytes: [UInt8]) { lock.withLock { collected.append(contentsOf: bytes) } }
    var bytes: [UInt8] { lock.withLock { collected } }
}
