import Foundation
import HTTPServer
import Logging
import TrunkCrypto

/// The authentication stage: the one reader of `Authorization: Bearer` (and, for the REST
/// API when one is configured, of `apikey`). Each family renders a failure in its own shape.
struct Authenticator: Sendable {
    let tokens: TokenIssuer
    /// When set, `/rest/v1` requests must carry it in `apikey`.
    let apiKey: String?
    /// Sessions whose tokens no longer count though they have not expired.
    let revocations: SessionRevocations

    init(
        tokens: TokenIssuer, apiKey: String?,
        revocations: SessionRevocations = SessionRevocations(database: nil, logger: Logger(label: "trunk-sync"))
    ) {
        self.tokens = tokens
        self.apiKey = apiKey
        self.revocations = revocations
    }

    /// The verified claims of the request's bearer token, or the family's `401`. With
    /// `queryToken`, a request without `Authorization` may carry the token as the
    /// `access_token` query parameter (the event stream's `EventSource` clients).
    func authenticate(_ request: HTTPRequest, family: APIFamily, queryToken: Bool = false) throws(APIError)
        -> AccessClaims
    {
        try authenticate(headers: request.headers, query: request.query, family: family, queryToken: queryToken)
    }

    /// The verified claims of a request's bearer token from its head alone (`RequestPipeline`
    /// calls it when the head arrives, before any body byte is read), or the family's `401`.
    func authenticate(headers: HTTPHeaders, query: String?, family: APIFamily, queryToken: Bool = false)
        throws(APIError) -> AccessClaims
    {
        if family == .rest, let apiKey {
            guard let given = headers["apikey"], constantTimeEquals(given.utf8, apiKey.utf8) else {
                throw RESTError.apiKey
            }
        }
        let header = headers["authorization"]
        let fromQuery =
            queryToken && header == nil
            ? query.flatMap { QueryString.parse($0).first { $0.name == "access_token" }?.value } : nil
        guard let token = Self.bearerToken(header) ?? fromQuery.flatMap({ $0.isEmpty ? nil : $0 }) else {
            throw Self.missing(family)
        }
        let claims: AccessClaims
        do {
            claims = try tokens.verify(token, now: Int64(Date().timeIntervalSince1970))
        } catch {
            throw Self.invalid(family)
        }
        // Every route, every family: a signed-out session's token is refused everywhere.
        if revocations.isRevoked(claims.sessionID) { throw Self.revoked(family) }
        return claims
    }

    /// Claims verified from the head, checked again when the whole request has arrived (up
    /// to the body timeout later): the session may have been revoked, or the token may have
    /// expired, meanwhile. No signature is verified again: a set look-up and a comparison.
    func stillValid(_ claims: AccessClaims, family: APIFamily) throws(APIError) {
        if revocations.isRevoked(claims.sessionID) { throw Self.revoked(family) }
        if claims.expiresAt + TokenIssuer.leeway < Int64(Date().timeIntervalSince1970) { throw Self.invalid(family) }
    }

    /// The token of `Bearer <token>` (scheme case-insensitive, surrounding blanks ignored).
    /// Byte by byte: on every authenticated request (Foundation's `trimmingCharacters` went
    /// through UTF-16 and cost more than verifying the token).
    static func bearerToken(_ header: String?) -> String? {
        guard let header else { return nil }
        let utf8 = header.utf8
        guard utf8.count > 7 else { return nil }
        var index = utf8.startIndex
        for expected in "bearer".utf8 {
            // ASCII letters only: `| 0x20` lowercases them and no other byte maps onto one.
            guard utf8[index] | 0x20 == expected else { return nil }
            index = utf8.index(after: index)
        }
        guard utf8[index] == UInt8(ascii: " ") else { return nil }
        func isBlank(_ byte: UInt8) -> Bool { byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }
        var start = utf8.index(after: index)
        var end = utf8.endIndex
        while start < end, isBlank(utf8[start]) { start = utf8.index(after: start) }
        while end > start, isBlank(utf8[utf8.index(before: end)]) { end = utf8.index(before: end) }
        guard start < end else { return nil }
        return String(Substring(utf8[start..<end]))
    }

    static func missing(_ family: APIFamily) -> APIError {
        switch family {
        case .auth: AuthError.noAuthorization
        case .rest: RESTError.jwt
        case .native: APIError.unauthorized
        }
    }

    static func revoked(_ family: APIFamily) -> APIError {
        switch family {
        case .auth: AuthError.sessionNotFound
        case .rest: RESTError.jwt
        case .native: APIError.unauthorized
        }
    }

    static func invalid(_ family: APIFamily) -> APIError {
        switch family {
        case .auth: AuthError.badJWT
        case .rest: RESTError.jwt
        case .native: APIError.unauthorized
        }
    }
}
