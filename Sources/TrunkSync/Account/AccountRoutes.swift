import Foundation
import HTTPServer
import JSON

/// Account self-service for app users: `POST /auth/v1/reauthenticate` (a confirmation code by
/// mail, as in Supabase Auth; `GET` too, which is what the Supabase clients send) and
/// `DELETE /sync/v1/account` (with that code). Both answer in the GoTrue shape.
public struct AccountRoutes: Sendable {
    let accounts: Accounts
    let auth: AuthService

    public init(accounts: Accounts, auth: AuthService) {
        self.accounts = accounts
        self.auth = auth
    }

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
}
