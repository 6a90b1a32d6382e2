import Foundation
import HTTPServer
import Logging
import Mail

/// The Supabase Auth compatible routes under `/auth/v1`.
public struct AuthRoutes: Sendable {
    /// The API version the clients expect in `X-Supabase-Api-Version`.
    public static let apiVersion = "2024-01-01"

    let service: AuthService

    public init(service: AuthService) { self.service = service }

    /// Adds the routes to `router`.
    public func register(in router: inout Router) {
        router.add(.post, "/auth/v1/otp") { request in try await otp(request) }
        router.add(.post, "/auth/v1/verify") { request in try await verify(request) }
        router.add(.post, "/auth/v1/token") { request in try await token(request) }
        router.add(.post, "/auth/v1/logout") { request in try await logout(request) }
        router.add(.get, "/auth/v1/user") { request in try await user(request) }
        router.add(.put, "/auth/v1/user") { request in try await updateUser(request) }
        let tokens = service.tokens
        router.addInline(.get, "/auth/v1/.well-known/jwks.json") { _ in
            // Public keys only; SigningKeyStore.activationDelay allows for the max-age.
            ok(tokens.jwks, extra: ["Cache-Control": "public, max-age=600"])
        }
        router.addInline(.get, "/auth/v1/settings") { _ in
            ok(Array(#"{"external":{"email":true},"disable_signup":false,"mailer_autoconfirm":false}"#.utf8))
        }
    }

    static func ok(_ body: [UInt8], status: HTTPStatus = .ok, extra: HTTPHeaders = [:]) -> HTTPResponse {
        var headers = extra
        headers.append(name: "X-Supabase-Api-Version", value: apiVersion)
        return .json(status, body, headers: headers)
    }

    private func ok(_ body: [UInt8], status: HTTPStatus = .ok, extra: HTTPHeaders = [:]) -> HTTPResponse {
        Self.ok(body, status: status, extra: extra)
    }

    /// Decodes a JSON body into `T`; unreadable JSON is `400 bad_json`, wrong types `400
    /// validation_failed`.
    static func decode<T: Decodable>(_ type: T.Type, from request: HTTPRequest) throws -> T {
        guard JSONValue.parse(request.body)?.objectValue != nil else {
            throw AuthError(status: 400, code: "bad_json", message: "The request body must be a JSON object")
        }
        do {
            return try JSONDecoder().decode(T.self, from: Data(request.body))
        } catch {
            throw AuthError.validation("The request body has a field of the wrong type")
        }
    }

    static func email(_ raw: String?) throws -> Email {
        guard let raw, !raw.isEmpty else { throw AuthError.validation("An email address is required") }
        guard let email = Email(raw) else { throw AuthError.validation("Unable to validate email address: invalid format") }
        return email
    }

    /// The bearer token's claims; `401` when missing or invalid.
    func claims(_ request: HTTPRequest) throws -> AccessClaims {
        guard let header = request.headers["authorization"] else { throw AuthError.noAuthorization }
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { throw AuthError.noAuthorization }
        return try service.tokens.verify(String(parts[1]).trimmingCharactersInWhitespace(), now: AuthService.now())
    }

    private struct OTPBody: Decodable {
        var email: String?
        var create_user: Bool?
    }

    private func otp(_ request: HTTPRequest) async throws -> HTTPResponse {
        let body = try Self.decode(OTPBody.self, from: request)
        let email = try Self.email(body.email)
        try await service.requestCode(email: email, createUser: body.create_user ?? true, ip: request.remoteAddress)
        return ok(Array("{}".utf8))
    }

    private struct VerifyBody: Decodable {
        var email: String?
        var token: String?
        var type: String?
    }

    private func verify(_ request: HTTPRequest) async throws -> HTTPResponse {
        let body = try Self.decode(VerifyBody.self, from: request)
        let email = try Self.email(body.email)
        guard let type = body.type, ["email", "magiclink", "signup"].contains(type) else {
            throw AuthError.validation("Verify requires type \"email\"")
        }
        guard let token = body.token, !token.isEmpty else { throw AuthError.validation("Verify requires a token") }
        let session = try await service.verify(
            email: email, code: token.trimmingCharactersInWhitespace(), ip: request.remoteAddress,
            userAgent: request.headers["user-agent"])
        return ok(session.json)
    }

    private struct RefreshBody: Decodable {
        var refresh_token: String?
    }

    private func token(_ request: HTTPRequest) async throws -> HTTPResponse {
        guard let grant = request.queryValue("grant_type") else {
            throw AuthError.validation("grant_type is required")
        }
        guard grant == "refresh_token" else {
            throw AuthError(status: 400, code: "unsupported_grant_type", message: "Only grant_type=refresh_token is supported")
        }
        let body = try Self.decode(RefreshBody.self, from: request)
        guard let token = body.refresh_token, !token.isEmpty else {
            throw AuthError.validation("refresh_token is required")
        }
        return ok(try await service.refresh(token: token, ip: request.remoteAddress).json)
    }

    private func logout(_ request: HTTPRequest) async throws -> HTTPResponse {
        let claims = try claims(request)
        let scopeName = request.queryValue("scope") ?? "global"
        guard let scope = AuthService.LogoutScope(rawValue: scopeName) else {
            throw AuthError.validation("scope must be local, global or others")
        }
        try await service.logout(claims, scope: scope)
        return HTTPResponse(status: .noContent, headers: ["X-Supabase-Api-Version": Self.apiVersion])
    }

    private func user(_ request: HTTPRequest) async throws -> HTTPResponse {
        ok(try await service.user(try claims(request)).json)
    }

    private struct UpdateBody: Decodable {
        var data: [String: JSONValue]?
        var email: String?
        var password: String?
        var phone: String?
    }

    private func updateUser(_ request: HTTPRequest) async throws -> HTTPResponse {
        let claims = try claims(request)
        let body = try Self.decode(UpdateBody.self, from: request)
        if body.email != nil || body.password != nil || body.phone != nil {
            throw AuthError(
                status: 422, code: "feature_not_supported",
                message: "Only user metadata (data) can be updated; email, phone and password are not supported")
        }
        if let name = body.data?["full_name"], name != .null, name.stringValue == nil {
            throw AuthError.validation("data.full_name must be a string")
        }
        return ok(try await service.updateUser(claims, data: body.data ?? [:]).json)
    }
}

/// Sends sign-in codes as mails through a `Mailer` (SMTP, or the log in development).
public struct MailCodeSender: SignInCodeSender {
    let mailer: any Mailer
    let from: String

    public init(mailer: any Mailer, from: String) {
        self.mailer = mailer
        self.from = from
    }

    public func sendSignInCode(_ code: String, to email: String, expiresInMinutes: Int) async throws {
        try await mailer.send(MailMessage.signInCode(code: code, to: email, from: from, expiresInMinutes: expiresInMinutes))
    }
}
