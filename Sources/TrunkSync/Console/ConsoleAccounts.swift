import Foundation
import Postgres

/// The console's account export and deletion: the shared implementation (`Accounts`) that
/// the app's own account routes and `trunk-sync users export|delete` use too.
struct ConsoleAccounts: Sendable {
    let accounts: Accounts

    /// Starts the user's export (the format of `GET /sync/v1/export`, and streamed as it
    /// is: `AccountRoutes.streamed`): the account's lease is taken (`409` while another
    /// export of it runs, on any instance).
    func beginExport(_ user: UserAdmin.Summary) async throws -> Accounts.Export {
        do {
            return try await accounts.beginExport(user.id)
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
