import Foundation
import HTTPServer
import JSON
import Postgres

/// Account self-service for app users: `POST /auth/v1/reauthenticate` (a confirmation code by
/// mail, as in Supabase Auth; `GET` too, which is what the Supabase clients send), `DELETE
/// /sync/v1/account` (with that code; both answer errors in the GoTrue shape) and `GET
/// /sync/v1/export` (the user's data as a streamed NDJSON download).
public struct AccountRoutes: Sendable {
    let accounts: Accounts
    let auth: AuthService
    /// Wakes a running export when its user's sessions are revoked (a deletion, a sign-out).
    let notifier: EventNotifier

    /// The routes over `accounts`, with `auth`'s codes and revocations and `notifier`'s
    /// wake-ups.
    public init(accounts: Accounts, auth: AuthService, notifier: EventNotifier) {
        self.accounts = accounts
        self.auth = auth
        self.notifier = notifier
    }

    /// Bytes of an export written but not yet taken by the client's socket before the export
    /// waits for it (a page may add to it once).
    static let exportBufferLimit = 64 * 1024

    /// Adds the routes.
    public func register(in routes: inout Routes) {
        let small = Endpoint.BodyLimit.small
        for method in [HTTPMethod.post, .get] {
            routes.add(
                method, "/auth/v1/reauthenticate", family: .auth,
                bodyLimit: method == .post ? small : Endpoint.BodyLimit.none,
                .authenticated { request, claims in try await reauthenticate(request, claims) })
        }
        routes.add(
            .delete, "/sync/v1/account", family: .auth, bodyLimit: small,
            .authenticated { request, claims in try await deleteAccount(request, claims) })
        routes.add(
            .get, "/sync/v1/export", family: .native,
            .authenticated { request, claims in try await export(request, claims) })
    }

    private func reauthenticate(_ request: HTTPRequest, _ claims: AccessClaims) async throws -> HTTPResponse {
        try await auth.limit(.reauthenticate, ip: request.remoteAddress)
        try await auth.requestReauthentication(claims)
        return AuthRoutes.ok(Array("{}".utf8))
    }

    private struct DeleteBody: Decodable {
        var code: String?
    }

    private func deleteAccount(_ request: HTTPRequest, _ claims: AccessClaims) async throws -> HTTPResponse {
        try await auth.limit(.account, ip: request.remoteAddress)  // before any parsing, as /verify
        let body = try AuthRoutes.decode(DeleteBody.self, from: request)
        guard let code = body.code?.trimmingCharactersInWhitespace(), !code.isEmpty else {
            throw AuthError.validation("code is required: the confirmation code from POST /auth/v1/reauthenticate")
        }
        let check = auth.reauthenticationCheck(user: claims.userID, code: code)
        switch try await accounts.delete(claims.userID, confirmedBy: check) {
        case .deleted:
            return HTTPResponse(status: .noContent, headers: ["X-Supabase-Api-Version": AuthRoutes.apiVersion])
        case .notConfirmed: throw AuthError.reauthenticationNotValid
        case .notFound: throw AuthError.sessionNotFound
        }
    }

    /// Starts the export before answering, so that a refusal (another export running) is a
    /// plain JSON error; then streams it. The lease is released when the producer returns,
    /// which it always does once (see `HTTPBodyStream`), whether the client read everything,
    /// went away, or the session was revoked meanwhile — then the body is cut short
    /// (no last chunk), so the client knows its copy is incomplete.
    private func export(_ request: HTTPRequest, _ claims: AccessClaims) async throws -> HTTPResponse {
        if let (name, _) = request.queryItems.first {
            throw APIError.badRequest("invalid_parameter", "Unknown parameter \(name); the export takes none.")
        }
        let export: Accounts.Export
        do {
            export = try await accounts.beginExport(claims.userID)
        } catch Accounts.ExportError.inProgress {
            throw APIError.exportInProgress
        } catch Accounts.ExportError.notFound {
            throw APIError.unauthorized
        }
        let headers: HTTPHeaders = [
            "Content-Type": "application/x-ndjson",
            "Content-Disposition": "attachment; filename=\"trunk-sync-export-\(Self.today()).ndjson\"",
            "Cache-Control": "no-store",
        ]
        let revocations = auth.revocations
        let notifier = self.notifier
        let session = claims.sessionID
        return Self.streamed(
            export, of: accounts, headers: headers, proceed: { !revocations.isRevoked(session) },
            until: { await Self.untilRevoked(session, of: export.user, revocations, notifier) })
    }

    /// `export` as a streamed response (`GET /sync/v1/export`, the console's export): page
    /// by page at the client's pace, at most `exportBufferLimit` plus one page held. Ends
    /// early when `proceed` says no before a page, or as soon as `until` returns (a revoked
    /// session), even while waiting for a client that stopped reading; then the body is cut
    /// short. The lease is released however it ends.
    static func streamed(
        _ export: Accounts.Export, of accounts: Accounts, headers: HTTPHeaders,
        proceed: (@Sendable () -> Bool)? = nil, until: (@Sendable () async -> Void)? = nil
    ) -> HTTPResponse {
        let logger = accounts.logger
        return .streamed(.ok, headers: headers, bufferLimit: exportBufferLimit) { writer in
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    do {
                        try await accounts.run(
                            export, proceed: proceed,
                            write: { bytes in try await writer.write(bytes, inPiecesOf: exportBufferLimit) })
                        writer.finish()
                    } catch is HTTPBodyWriter.Closed {
                        // The client went away, or `until` returned (the task was cancelled).
                    } catch {
                        logger.warning(
                            "export ended early",
                            metadata: ["user_id": "\(export.user.uuidString.lowercased())", "reason": "\(error)"])
                    }
                }
                if let until { group.addTask { await until() } }
                await group.next()
                group.cancelAll()
            }
        }
    }

    /// Returns once `session` is revoked, or when cancelled. A revocation wakes the user's
    /// tickets (`SessionRevocations` → `EventNotifier.wake`); so do pushes, after which it
    /// waits again. After shutdown (every ticket fires at once) it waits no more: the export
    /// finishes within the drain or is stopped with the server.
    static func untilRevoked(
        _ session: UUID, of user: UUID, _ revocations: SessionRevocations, _ notifier: EventNotifier
    ) async {
        while !Task.isCancelled, !notifier.isShutDown {
            let ticket = notifier.ticket(for: user, counted: false)
            defer { ticket.cancel() }
            if revocations.isRevoked(session) { return }
            await ticket.wait(timeout: .seconds(3600))
            if revocations.isRevoked(session) { return }
        }
        // Shut down: only cancellation ends this now (the export ending first).
        if !Task.isCancelled { try? await Task.sleep(for: .seconds(86_400 * 365)) }
    }

    /// Today's date (UTC) as `YYYY-MM-DD`, for the file name.
    static func today() -> String {
        String(RFC3339.format(PostgresTimestamp(Date()), fractionDigits: 0).prefix(10))
    }
}
