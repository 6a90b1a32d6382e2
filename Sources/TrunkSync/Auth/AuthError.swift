/// The errors of the `/auth/v1` routes, with the codes the Supabase clients read. They are
/// `APIError`s rendered in the GoTrue shape (`APIFamily.auth`).
public enum AuthError {
    static func validation(_ message: String) -> APIError {
        APIError(status: 400, code: "validation_failed", message: message)
    }

    /// Wrong, expired, used or exhausted code and unknown address: one answer for all.
    static let otpExpired = APIError(status: 403, code: "otp_expired", message: "Token has expired or is invalid")
    static let badJWT = APIError(status: 401, code: "bad_jwt", message: "Invalid or expired access token")
    static let noAuthorization = APIError(
        status: 401, code: "no_authorization", message: "This endpoint requires a bearer access token")
    /// The token's session was revoked (sign-out, refresh token reuse) or its user deleted:
    /// `401` like any token that no longer counts, with the code the Supabase clients read
    /// to drop their session (GoTrue itself answers `403`).
    static let sessionNotFound = APIError(
        status: 401, code: "session_not_found", message: "Session from the access token no longer exists")
    static let refreshTokenNotFound = APIError(
        status: 400, code: "refresh_token_not_found", message: "Invalid Refresh Token: Refresh Token Not Found")
    static let refreshTokenAlreadyUsed = APIError(
        status: 400, code: "refresh_token_already_used", message: "Invalid Refresh Token: Already Used")
    static let userNotFound = APIError(status: 404, code: "user_not_found", message: "User not found")
    static let badJSON = APIError(status: 400, code: "bad_json", message: "The request body must be a JSON object")

    static func overRequestRateLimit(retryAfter: Int) -> APIError {
        APIError(
            status: 429, code: "over_request_rate_limit", message: "Request rate limit reached", retryAfter: retryAfter)
    }

    static func overEmailSendRateLimit(retryAfter: Int) -> APIError {
        APIError(
            status: 429, code: "over_email_send_rate_limit",
            message: "For security purposes, you can only request this after \(retryAfter) seconds.",
            retryAfter: retryAfter)
    }
}

extension AuthError {
    /// The confirmation code of `/auth/v1/reauthenticate` was wrong, expired, used up, never
    /// asked for, or the user is locked out for a while: one answer for all, as GoTrue's.
    static let reauthenticationNotValid = APIError(
        status: 400, code: "reauthentication_not_valid",
        message: "The confirmation code is invalid or has expired; ask for a new one with POST /auth/v1/reauthenticate")
}
