import HTTPServer

/// An error of the `/auth/v1` routes in the shape the Supabase clients read: `code` and
/// `error_code` (the same string), `message` and `msg`, with `X-Supabase-Api-Version`.
public struct AuthError: Error, HTTPResponseError, Equatable, CustomStringConvertible {
    /// HTTP status.
    public let status: Int
    /// Stable machine code, e.g. `otp_expired`.
    public let code: String
    /// Human text (never a code, token or secret).
    public let message: String
    /// Seconds to wait (`Retry-After`), for 429 and 503.
    public var retryAfter: Int? = nil

    /// The one-line description.
    public var description: String { "\(status) \(code): \(message)" }

    /// The response the clients expect.
    public var response: HTTPResponse {
        var writer = JSONWriter(capacity: 160)
        writer.beginObject()
        writer.string("code", code)
        writer.string("error_code", code)
        writer.string("message", message)
        writer.string("msg", message)
        writer.endObject()
        var headers: HTTPHeaders = ["X-Supabase-Api-Version": AuthRoutes.apiVersion]
        if let retryAfter { headers.append(name: "Retry-After", value: String(retryAfter)) }
        return .json(HTTPStatus(status), writer.bytes, headers: headers)
    }

    static func validation(_ message: String) -> AuthError {
        AuthError(status: 400, code: "validation_failed", message: message)
    }

    /// Wrong, expired, used or exhausted code and unknown address: one answer for all.
    static let otpExpired = AuthError(status: 403, code: "otp_expired", message: "Token has expired or is invalid")
    static let badJWT = AuthError(status: 401, code: "bad_jwt", message: "Invalid or expired access token")
    static let noAuthorization = AuthError(
        status: 401, code: "no_authorization", message: "This endpoint requires a bearer access token")
    static let sessionNotFound = AuthError(
        status: 403, code: "session_not_found", message: "Session from the access token no longer exists")
    static let refreshTokenNotFound = AuthError(
        status: 400, code: "refresh_token_not_found", message: "Invalid Refresh Token: Refresh Token Not Found")
    static let refreshTokenAlreadyUsed = AuthError(
        status: 400, code: "refresh_token_already_used", message: "Invalid Refresh Token: Already Used")
    static let userNotFound = AuthError(status: 404, code: "user_not_found", message: "User not found")

    static func overRequestRateLimit(retryAfter: Int) -> AuthError {
        AuthError(
            status: 429, code: "over_request_rate_limit", message: "Request rate limit reached", retryAfter: retryAfter)
    }

    static func overEmailSendRateLimit(retryAfter: Int) -> AuthError {
        AuthError(
            status: 429, code: "over_email_send_rate_limit",
            message: "For security purposes, you can only request this after \(retryAfter) seconds.",
            retryAfter: retryAfter)
    }

    static let emailSendFailed = AuthError(
        status: 503, code: "email_send_failed", message: "The sign-in email could not be sent; try again later",
        retryAfter: 30)
    static let databaseUnavailable = AuthError(
        status: 503, code: "service_unavailable", message: "The service is busy; try again shortly", retryAfter: 1)
}
