import Foundation
import HTTPServer
import Logging
import Postgres
import TrunkCrypto

/// Operator sign-in for the console, and the check of every `/admin/v1` request.
///
/// The code flow is the app's (`AuthService.requestCode` / `consumeCode`: the same expiry,
/// attempts, resend interval, lockout and per-client and per-address limits), with codes
/// stored under a key of their own, and mailed only to addresses in
/// `TRUNK_SYNC_ADMIN_EMAILS`: any other address runs the same statements and gets the same
/// answer, and no code that could ever match. A right code starts a console session, not an
/// app session: an opaque random token, stored as its SHA-256 in `console_sessions`, that
/// lives `sessionLifetime` and is accepted by `/admin/v1` only (app routes take only JWTs;
/// `/admin/v1` looks tokens up in `console_sessions`, where no JWT is).
///
/// How the browser holds the token: an `HttpOnly; SameSite=Strict` cookie scoped to
/// `/admin/v1`, not a value in JavaScript. Script on the page (even injected script, were
/// the strict CSP ever bypassed) cannot read it, so it cannot leave the browser; a reload
/// keeps the operator signed in, which a token held in memory would not. A cookie is sent
/// by the browser by itself, so requests carrying it must also carry the
/// `X-Trunk-Sync-Console: 1` header (cross-site requests cannot set a custom header without
/// a CORS preflight, which the admin listener never grants), on top of `SameSite=Strict`
/// (no cross-site request carries the cookie at all). Scripts and tools may send the token
/// as `Authorization: Bearer` instead, which browsers never attach by themselves.
public struct ConsoleAuth: Sendable {
    let auth: AuthService
    let database: Database
    /// `TRUNK_SYNC_ADMIN_EMAILS`, normalised.
    let operators: Set<String>
    let logger: Logger

    /// Seconds a console session lives (from sign-in; not extended by use).
    public static let sessionLifetime = 1800
    /// The cookie that carries the token over plain HTTP (loopback, an SSH tunnel).
    public static let cookieName = "trunk_sync_console"
    /// The cookie that carries the token when the console is reached over HTTPS (through a
    /// trusted proxy): `Secure`, and with the `__Host-` prefix, which browsers accept only
    /// from a secure origin, with `Path=/` and no `Domain`, so no other host (a sibling
    /// subdomain) can set or overwrite it.
    public static let secureCookieName = "__Host-trunk_sync_console"
    /// The header every cookie-authenticated request must carry (value `1`).
    public static let requestHeader = "X-Trunk-Sync-Console"
    /// Tokens are `tsc_` and 43 base64url characters; anything much longer is not one.
    static let maxTokenLength = 128

    init(auth: AuthService, database: Database, operators: [Email], logger: Logger) {
        self.auth = auth
        self.database = database
        self.operators = Set(operators.map(\.value))
        self.logger = logger
    }

    /// Whether anyone may sign in (`TRUNK_SYNC_ADMIN_EMAILS` is not empty).
    var isEnabled: Bool { !operators.isEmpty }

    /// A signed-in operator, as the console's handlers know them.
    public struct Operator: Sendable {
        /// The console session.
        public var sessionID: UUID
        /// Their address (one of `TRUNK_SYNC_ADMIN_EMAILS`).
        public var email: String
        /// When the session ends, Unix seconds.
        public var expiresAt: Int64
        /// SHA-256 of the token: scopes the console's cross-user reads (`Scope.console`).
        var tokenHash: PostgresBytes
    }

    /// Mails a code when `email` is an operator's; for any other address, the same work and
    /// answer and no mail. The caller counted the limits.
    func requestCode(email: Email) async throws {
        let isOperator = operators.contains(email.value)
        try await auth.requestCode(for: .console(email), email: email) { _ in isOperator }
    }

    /// Checks the code and starts a console session: its token and the operator.
    func verify(email: Email, code: String, ip: String, userAgent: String?) async throws -> (token: String, Operator) {
        let token = "tsc_" + Base64URL.encode(SecureRandom.bytes(count: 32))
        let hash = PostgresBytes(SHA256.hash(token))
        let isOperator = operators.contains(email.value)
        let lifetime = Int64(Self.sessionLifetime)
        let signedIn: Operator = try await auth.consumeCode(.console(email), email: email, code: code) { tx in
            // Unreachable for other addresses (their stored code matches nothing): a second wall.
            guard isOperator else { throw AuthError.otpExpired }
            try await tx.query("delete from console_sessions where expires_at < now()")
            let row = try await tx.query(
                """
                insert into console_sessions (email, token_hash, expires_at, ip, user_agent)
                values ($1, $2, now() + make_interval(secs => $3), $4, $5)
                returning id, floor(extract(epoch from expires_at))::int8
                """, email.value, hash, lifetime, ip, userAgent.map { String($0.prefix(512)) })[0]
            return (
                Operator(
                    sessionID: try row.decode(UUID.self, column: 0), email: email.value,
                    expiresAt: try row.decode(Int64.self, column: 1), tokenHash: hash), nil
            )
        }
        logger.notice(
            "console sign-in", metadata: ["admin": "\(signedIn.email)", "console_session": "\(signedIn.sessionID)"])
        return (token, signedIn)
    }

    /// Logs a refused console code (wrong, used or expired, an address that is not an
    /// operator's, or a locked address), so failed attempts show before the lockout does. An
    /// operator's address is written out (`admin=`, as on their other lines); any other
    /// address only by its tag, as the app's sign-in lines name addresses.
    func logFailedSignIn(email: Email, ip: String) {
        var metadata: Logger.Metadata = ["ip": "\(ip)"]
        if operators.contains(email.value) {
            metadata["admin"] = "\(email.value)"
        } else {
            metadata["address"] = "\(auth.addressTag(email))"
        }
        logger.warning("console sign-in failed", metadata: metadata)
    }

    /// The operator behind a request's token (cookie with the console header, or bearer), or
    /// `401 console_unauthorized` (`403 console_header_required` for a cookie without the
    /// header). A session whose address was removed from `TRUNK_SYNC_ADMIN_EMAILS` no
    /// longer counts.
    func authenticate(_ request: HTTPRequest) async throws -> Operator {
        let token: String
        if let bearer = Authenticator.bearerToken(request.headers["authorization"]) {
            token = bearer
        } else if let cookie = Self.cookie(request.headers["cookie"], secure: request.forwardedHTTPS) {
            guard request.headers[Self.requestHeader.lowercased()] == "1" else { throw ConsoleError.headerRequired }
            token = cookie
        } else {
            throw ConsoleError.unauthorized
        }
        guard token.hasPrefix("tsc_"), token.utf8.count <= Self.maxTokenLength else { throw ConsoleError.unauthorized }
        let hash = PostgresBytes(SHA256.hash(token))
        let found = try await database.read(as: .server) { tx in
            try await tx.query(
                """
                select id, email, floor(extract(epoch from expires_at))::int8 from console_sessions
                where token_hash = $1 and revoked_at is null and expires_at > now()
                """, hash
            ).first.map { row in
                Operator(
                    sessionID: try row.decode(UUID.self, column: 0), email: try row.decode(String.self, column: 1),
                    expiresAt: try row.decode(Int64.self, column: 2), tokenHash: hash)
            }
        }
        guard let found, operators.contains(found.email) else { throw ConsoleError.unauthorized }
        return found
    }

    /// Ends the operator's console session.
    func signOut(_ signedIn: Operator) async throws {
        try await database.transaction(as: .server) { tx in
            let revoke = PostgresStatement(
                "update console_sessions set revoked_at = now() where id = $1", signedIn.sessionID)
            try await tx.pipeline([revoke, .commit])
        }
        logger.notice(
            "console sign-out", metadata: ["admin": "\(signedIn.email)", "console_session": "\(signedIn.sessionID)"])
    }

    /// The `Set-Cookie` value that hands the browser `token` (or, nil, removes it); `secure`
    /// when the request came over HTTPS (`HTTPRequest.forwardedHTTPS`).
    static func setCookie(_ token: String?, secure: Bool) -> String {
        let value = token ?? ""
        let maxAge = token == nil ? 0 : sessionLifetime
        if secure {
            return "\(secureCookieName)=\(value); Path=/; Max-Age=\(maxAge); Secure; HttpOnly; SameSite=Strict"
        }
        return "\(cookieName)=\(value); Path=/admin/v1; Max-Age=\(maxAge); HttpOnly; SameSite=Strict"
    }

    /// The console cookie's value in a `Cookie` header, if any: over HTTPS only the
    /// `__Host-` cookie counts, over plain HTTP only the other.
    static func cookie(_ header: String?, secure: Bool) -> String? {
        guard let header else { return nil }
        let name = secure ? secureCookieName : cookieName
        for part in header.split(separator: ";") {
            let pair = part.trimmingCharacters(in: .whitespaces)
            guard let equals = pair.firstIndex(of: "=") else { continue }
            if pair[..<equals] == name {
                let value = String(pair[pair.index(after: equals)...])
                return value.isEmpty ? nil : value
            }
        }
        return nil
    }
}

/// The console API's own errors (native shape).
enum ConsoleError {
    static let unauthorized = APIError(
        status: 401, code: "console_unauthorized", message: "Sign in to the console first (or the session ended).")
    static let headerRequired = APIError(
        status: 403, code: "console_header_required",
        message: "Requests with the console's cookie must carry the header X-Trunk-Sync-Console: 1.")
    static let disabled = APIError(
        status: 403, code: "console_disabled",
        message: "Console sign-in is disabled: set TRUNK_SYNC_ADMIN_EMAILS to the operators' addresses and restart.")
    static let userNotFound = APIError(status: 404, code: "user_not_found", message: "No user with this id.")
    static let sessionNotFound = APIError(
        status: 404, code: "session_not_found", message: "The user has no live session with this id.")

    static func validation(_ message: String) -> APIError {
        APIError(status: 400, code: "validation_failed", message: message)
    }
}
