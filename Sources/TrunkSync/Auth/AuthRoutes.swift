import Foundation
import HTTPServer
import JSON
import Logging
import Mail

/// The Supabase Auth compatible routes under `/auth/v1`.
public struct AuthRoutes: Sendable {
    /// The API version the clients expect in `X-Supabase-Api-Version`.
    public static let apiVersion = "2024-01-01"

    let service: AuthService

    public init(service: AuthService) { self.service = service }

    /// Adds the routes. Sign-in bodies are a few small fields: larger ones are refused from
    /// the head, before anything is read or parsed.
    public func register(in routes: inout Routes) {
        let small = Endpoint.BodyLimit.small
        routes.add(.post, "/auth/v1/otp", family: .auth, bodyLimit: small, .open { request in try await otp(request) })
        routes.add(
            .post, "/auth/v1/verify", family: .auth, bodyLimit: small, .open { request in try await verify(request) })
        routes.add(
            .post, "/auth/v1/token", family: .auth, bodyLimit: small, .open { request in try await token(request) })
        routes.add(
            .post, "/auth/v1/logout", family: .auth, bodyLimit: small,
            .authenticated { request, claims in try await logout(request, claims) })
        routes.add(.get, "/auth/v1/user", family: .auth, .authenticated { _, claims in try await user(claims) })
        routes.add(
            .put, "/auth/v1/user", family: .auth, bodyLimit: AuthRoutes.userBodyLimit,
            .authenticated { request, claims in try await updateUser(request, claims) })
        let tokens = service.tokens
        routes.add(
            .get, "/auth/v1/.well-known/jwks.json", family: .auth,
            .inline { _ in
                // Public keys only; SigningKeyStore.activationDelay allows for the max-age.
                ok(tokens.jwks, extra: ["Cache-Control": "public, max-age=600"])
            })
        routes.add(
            .get, "/auth/v1/settings", family: .auth,
            .inline { _ in
                ok(Array(#"{"external":{"email":true},"disable_signup":false,"mailer_autoconfirm":false}"#.utf8))
            })
    }

    /// `PUT /auth/v1/user` carries user metadata: room for a profile, not for a payload.
    static let userBodyLimit = 64 * 1024

    static func ok(_ body: [UInt8], status: HTTPStatus = .ok, extra: HTTPHeaders = [:]) -> HTTPResponse {
        var headers = extra
        headers.append(name: "X-Supabase-Api-Version", value: apiVersion)
        return .json(status, body, headers: headers)
    }

    private func ok(_ body: [UInt8], status: HTTPStatus = .ok, extra: HTTPHeaders = [:]) -> HTTPResponse {
        Self.ok(body, status: status, extra: extra)
    }

    /// Decodes a JSON body into `T` through the one JSON entry point: not JSON is `400
    /// bad_json`; a refused value (`\u0000`, a number outside I-JSON) or a wrong type is `400
    /// validation_failed` naming the field.
    static func decode<T: Decodable>(_ type: T.Type, from request: HTTPRequest) throws -> T {
        do {
            return try JSONBody.decode(T.self, from: request.body)
        } catch {
            switch error.kind {
            case .malformed, .tooLarge:
                throw APIError(
                    status: 400, code: "bad_json", message: "The request body must be a JSON object: \(error.reason)")
            case .wrongType where error.path.isEmpty:
                throw APIError(
                    status: 400, code: "bad_json", message: "The request body must be a JSON object: \(error.reason)")
            case .invalidValue, .wrongType:
                throw AuthError.validation(error.path.isEmpty ? error.reason : "\(error.path) \(error.reason)")
            }
        }
    }

    static func email(_ raw: String?) throws -> Email {
        guard let raw, !raw.isEmpty else { throw AuthError.validation("An email address is required") }
        guard let email = Email(raw) else {
            throw AuthError.validation("Unable to validate email address: invalid format")
        }
        return email
    }

    private struct OTPBody: Decodable {
        var email: String?
        var createUser: Bool?
        /// The new user's metadata (`signInWithOtp`'s `options.data`).
        var data: [String: JSONValue]?

        enum CodingKeys: String, CodingKey {
            case email
            case createUser = "create_user"
            case data
        }
    }

    private func otp(_ request: HTTPRequest) async throws -> HTTPResponse {
        try await service.limit(.otp, ip: request.remoteAddress)  // before any parsing
        let body = try Self.decode(OTPBody.self, from: request)
        let email = try Self.email(body.email)
        try await service.limit(.otp, email: email)  // before anything asks whether it has an account
        try Self.checkFullName(body.data)
        try await service.requestCode(
            email: email, createUser: body.createUser ?? true, signupData: body.data, ip: request.remoteAddress)
        return ok(Array("{}".utf8))
    }

    private struct VerifyBody: Decodable {
        var email: String?
        var token: String?
        var type: String?
    }

    private func verify(_ request: HTTPRequest) async throws -> HTTPResponse {
        try await service.limit(.verify, ip: request.remoteAddress)  // before any parsing
        let body = try Self.decode(VerifyBody.self, from: request)
        let email = try Self.email(body.email)
        try await service.limit(.verify, email: email)  // whichever client guesses
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
        var refreshToken: String?

        enum CodingKeys: String, CodingKey {
            case refreshToken = "refresh_token"
        }
    }

    private func token(_ request: HTTPRequest) async throws -> HTTPResponse {
        try await service.limit(.token, ip: request.remoteAddress)  // before any parsing
        guard let grant = request.queryValue("grant_type") else {
            throw AuthError.validation("grant_type is required")
        }
        guard grant == "refresh_token" else {
            throw APIError(
                status: 400, code: "unsupported_grant_type", message: "Only grant_type=refresh_token is supported")
        }
        let body = try Self.decode(RefreshBody.self, from: request)
        guard let token = body.refreshToken, !token.isEmpty else {
            throw AuthError.validation("refresh_token is required")
        }
        return ok(try await service.refresh(token: token, ip: request.remoteAddress).json)
    }

    private func logout(_ request: HTTPRequest, _ claims: AccessClaims) async throws -> HTTPResponse {
        let scopeName = request.queryValue("scope") ?? "global"
        guard let scope = AuthService.LogoutScope(rawValue: scopeName) else {
            throw AuthError.validation("scope must be local, global or others")
        }
        try await service.logout(claims, scope: scope)
        return HTTPResponse(status: .noContent, headers: ["X-Supabase-Api-Version": Self.apiVersion])
    }

    private func user(_ claims: AccessClaims) async throws -> HTTPResponse {
        ok(try await service.user(claims).json)
    }

    private struct UpdateBody: Decodable {
        var data: [String: JSONValue]?
        var email: String?
        var password: String?
        var phone: String?
    }

    private func updateUser(_ request: HTTPRequest, _ claims: AccessClaims) async throws -> HTTPResponse {
        let body = try Self.decode(UpdateBody.self, from: request)
        if body.email != nil || body.password != nil || body.phone != nil {
            throw APIError(
                status: 422, code: "feature_not_supported",
                message: "Only user metadata (data) can be updated; email, phone and password are not supported")
        }
        try Self.checkFullName(body.data)
        return ok(try await service.updateUser(claims, data: body.data ?? [:]).json)
    }

    /// `data.full_name` is also the profile's name: a string or null.
    static func checkFullName(_ data: [String: JSONValue]?) throws {
        if let name = data?["full_name"], name != .null, name.stringValue == nil {
            throw AuthError.validation("data.full_name must be a string")
        }
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

    /// Closes the mailer (its SMTP threads end).
    public func close() { mailer.close() }

    public func sendSignInCode(_ code: String, to email: String, expiresInMinutes: Int) async throws {
        try await mailer.send(
            MailMessage.signInCode(code: code, to: email, from: from, expiresInMinutes: expiresInMinutes))
    }

    /// Mails the confirmation code (`MailMessage.confirmationCode`).
    public func sendReauthenticationCode(_ code: String, to email: String, expiresInMinutes: Int) async throws {
        try await mailer.send(
            MailMessage.confirmationCode(code: code, to: email, from: from, expiresInMinutes: expiresInMinutes))
    }
}
