import JSON
import Foundation
import Logging
import Postgres
import TrunkCrypto

/// Sends sign-in codes (by mail, or to the log in development).
public protocol SignInCodeSender: Sendable {
    /// Delivers `code` to `email`; throws when it could not be handed over.
    func sendSignInCode(_ code: String, to email: String, expiresInMinutes: Int) async throws
}

/// The rules of sign-in (every one configurable; the defaults are the documented ones).
public struct AuthSettings: Sendable {
    /// Seconds a code stays valid. Default 600.
    public var otpLifetime = 600
    /// Seconds before a new code may be sent to the same address. Default 60.
    public var otpResendInterval = 60
    /// Wrong guesses that kill a code. Default 5.
    public var otpMaxAttempts = 5
    /// Per IP: `/otp`. Default 30 per 300 s.
    public var otpRule = RateLimiter.Rule(limit: 30, window: 300)
    /// Per IP: `/verify`. Default 30 per 300 s.
    public var verifyRule = RateLimiter.Rule(limit: 30, window: 300)
    /// Per IP: `/token`. Default 150 per 300 s.
    public var tokenRule = RateLimiter.Rule(limit: 150, window: 300)
    /// All sign-in mails of the deployment. Default 1000 per hour.
    public var mailRule = RateLimiter.Rule(limit: 1000, window: 3600)
    /// Seconds after rotation during which an old refresh token still yields a session (two
    /// tabs refreshing at once). Default 10.
    public var refreshReuseInterval = 10

    public init() {}
}

/// Email one-time-code sign-in, sessions and rotating refresh tokens, all in Postgres.
public struct AuthService: Sendable {
    let pool: PostgresPool
    let tokens: TokenIssuer
    let sender: any SignInCodeSender
    let settings: AuthSettings
    let logger: Logger
    let metrics: Metrics
    /// HMAC key for stored codes, derived from the JWT secret so a database dump alone does
    /// not allow brute-forcing live codes offline.
    private let codeKey: [UInt8]

    public init(
        pool: PostgresPool, tokens: TokenIssuer, secret: String, sender: any SignInCodeSender, settings: AuthSettings,
        logger: Logger, metrics: Metrics = Metrics()
    ) {
        self.metrics = metrics
        self.pool = pool
        self.tokens = tokens
        self.sender = sender
        self.settings = settings
        self.logger = logger
        codeKey = HMAC.sha256(key: Array(secret.utf8), message: "trunk-sync sign-in code key v1")
    }

    private func codeHash(_ email: Email, _ code: String) -> PostgresBytes {
        PostgresBytes(HMAC.sha256(key: codeKey, message: email.value + ":" + code))
    }

    static func now() -> Int64 { Int64(Date().timeIntervalSince1970) }

    /// Runs database work in one transaction. Failures a client may retry (pool exhausted,
    /// connection lost) become `503` in the pipeline's error stage, as on every route.
    func database<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) throws -> T) async throws -> T {
        try await pool.transaction(body)
    }

    /// The routes with a per-IP limit.
    public enum LimitedRoute: String, Sendable { case otp, verify, token }

    /// Counts a request against its route's per-IP limit; throws `429` when over it. The
    /// routes call it first, before parsing anything.
    public func limit(_ route: LimitedRoute, ip: String) async throws {
        let rule: RateLimiter.Rule
        switch route {
        case .otp: rule = settings.otpRule
        case .verify: rule = settings.verifyRule
        case .token: rule = settings.tokenRule
        }
        let retryAfter = try await database { try RateLimiter.hit("ip:\(route.rawValue):\(ip)", rule: rule, on: $0) }
        if let retryAfter {
            metrics.rateLimited(route.rawValue).increment()
            throw AuthError.overRequestRateLimit(retryAfter: retryAfter)
        }
    }

    // MARK: - Codes

    /// Sends a new code to `email` unless one was sent within the resend interval.
    /// With `createUser` false and no such user, records a code nobody receives, so the
    /// answer (and timing of later calls) is the same as for an existing user.
    public func requestCode(email: Email, createUser: Bool, ip: String) async throws {
        let code = SecureRandom.digits(6)
        let settings = self.settings
        let hash = codeHash(email, code)
        enum Outcome: Sendable { case send, silent, wait(Int), mailCap(Int) }
        let outcome: Outcome = try await database { connection in
            try RowScope.apply(RowScope.email(email), on: connection)
            let recent = try connection.query(
                "select ceil(extract(epoch from created_at + make_interval(secs => $2) - now()))::int8 from otp_codes where email = $1 and created_at > now() - make_interval(secs => $2)",
                email.value, Int64(settings.otpResendInterval))
            if let row = recent.first { return .wait(max(1, try row.decode(Int.self, column: 0))) }
            let exists = try connection.query("select 1 from users where lower(email) = $1", email.value).count > 0
            let deliverable = exists || createUser
            if deliverable, let retry = try RateLimiter.hit("mail:global", rule: settings.mailRule, on: connection) {
                return .mailCap(retry)
            }
            // An undeliverable request stores a hash of a code no one knows.
            let stored = deliverable ? hash : PostgresBytes(SecureRandom.bytes(count: 32))
            try connection.query(
                """
                insert into otp_codes (email, code_hash, created_at, expires_at, attempts, consumed_at)
                values ($1, $2, now(), now() + make_interval(secs => $3), 0, null)
                on conflict (email) do update set code_hash = excluded.code_hash, created_at = excluded.created_at,
                  expires_at = excluded.expires_at, attempts = 0, consumed_at = null
                """, email.value, stored, Int64(settings.otpLifetime))
            return deliverable ? .send : .silent
        }
        switch outcome {
        case .silent: return
        case .wait(let seconds): throw AuthError.overEmailSendRateLimit(retryAfter: seconds)
        case .mailCap(let seconds):
            metrics.rateLimited("mail").increment()
            throw AuthError.overEmailSendRateLimit(retryAfter: seconds)
        case .send:
            do {
                try await sender.sendSignInCode(code, to: email.value, expiresInMinutes: max(1, settings.otpLifetime / 60))
                metrics.signInCodesSent.increment()
            } catch {
                metrics.mailFailures.increment()
                logger.error("sign-in mail failed", metadata: ["error": "\(error)"])
                // Let the user ask again at once instead of waiting for the resend interval.
                _ = try? await database { connection in
                    try RowScope.apply(RowScope.email(email), on: connection)
                    try connection.query("delete from otp_codes where email = $1", email.value)
                }
                throw AuthError.emailSendFailed
            }
        }
    }

    /// Checks a code and signs the user in (creating the user on first sign-in).
    ///
    /// Consuming the code, upserting the user and creating the session share one
    /// transaction, so a failure anywhere in between leaves the code usable for a retry.
    /// The per-IP limit is counted before, in its own transaction, so that failed attempts
    /// count too.
    public func verify(email: Email, code: String, ip: String, userAgent: String?) async throws -> IssuedSession {
        guard code.utf8.count == 6, code.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { throw AuthError.otpExpired }
        let hash = codeHash(email, code)
        let maxAttempts = settings.otpMaxAttempts
        let refreshToken = Self.newRefreshToken()
        enum Outcome: Sendable { case rejected, signedIn(UserRecord, sessionID: UUID) }
        let outcome: Outcome = try await database { connection in
            try RowScope.apply(RowScope.email(email), on: connection)
            let rows = try connection.query(
                "select code_hash, expires_at > now(), attempts, consumed_at is null from otp_codes where email = $1 for update",
                email.value)
            guard let row = rows.first else { return .rejected }
            let stored = try row.decode(PostgresBytes.self, column: 0)
            let unexpired = try row.decode(Bool.self, column: 1)
            let unused = try row.decode(Bool.self, column: 3)
            let attempts = try row.decode(Int.self, column: 2)
            guard unexpired, unused, attempts < maxAttempts else { return .rejected }
            guard constantTimeEquals(stored.bytes, hash.bytes) else {
                // Returned rather than thrown, so that the counted attempt commits.
                try connection.query("update otp_codes set attempts = attempts + 1 where email = $1", email.value)
                return .rejected
            }
            try connection.query("update otp_codes set consumed_at = now() where email = $1", email.value)
            let user = try connection.query(
                """
                insert into users (email, email_confirmed_at, last_sign_in_at) values ($1, now(), now())
                on conflict ((lower(email))) do update set last_sign_in_at = now(), updated_at = now(),
                  email_confirmed_at = coalesce(users.email_confirmed_at, now())
                returning \(UserRecord.columns)
                """, email.value)[0]
            let signedIn = try UserRecord(row: user)
            // The session and its token are rows of the user, now that the id is known.
            try RowScope.apply(RowScope.user(signedIn.id), on: connection)
            let sessionID = try Self.insertSession(
                userID: signedIn.id, refreshToken: refreshToken, ip: ip, userAgent: userAgent, on: connection)
            return .signedIn(signedIn, sessionID: sessionID)
        }
        guard case .signedIn(let user, let sessionID) = outcome else { throw AuthError.otpExpired }
        return issue(user: user, sessionID: sessionID, refreshToken: refreshToken)
    }

    // MARK: - Sessions

    /// Creates a session with its first refresh token and signs an access token.
    func startSession(for user: UserRecord, ip: String, userAgent: String?) async throws -> IssuedSession {
        let refreshToken = Self.newRefreshToken()
        let sessionID = try await database { connection in
            try RowScope.apply(RowScope.user(user.id), on: connection)
            return try Self.insertSession(
                userID: user.id, refreshToken: refreshToken, ip: ip, userAgent: userAgent, on: connection)
        }
        return issue(user: user, sessionID: sessionID, refreshToken: refreshToken)
    }

    /// Stores a session and its first refresh token on `connection`, inside the caller's
    /// transaction, and returns the session's id.
    static func insertSession(
        userID: UUID, refreshToken: String, ip: String, userAgent: String?, on connection: PostgresConnection
    ) throws -> UUID {
        let session = try connection.query(
            "insert into sessions (user_id, ip, user_agent) values ($1, $2, $3) returning id", userID, ip,
            userAgent.map { String($0.prefix(512)) })[0].decode(UUID.self, column: 0)
        try connection.query(
            "insert into refresh_tokens (session_id, user_id, token_hash) values ($1, $2, $3)", session, userID,
            hashToken(refreshToken))
        return session
    }

    private func issue(user: UserRecord, sessionID: UUID, refreshToken: String) -> IssuedSession {
        let now = Self.now()
        let access = tokens.accessToken(for: user, sessionID: sessionID, now: now)
        return IssuedSession(
            accessToken: access.token, expiresIn: tokens.lifetime, expiresAt: access.expiresAt, refreshToken: refreshToken,
            user: user)
    }

    static func newRefreshToken() -> String { Base64URL.encode(SecureRandom.bytes(count: 32)) }

    static func hashToken(_ token: String) -> PostgresBytes { PostgresBytes(SHA256.hash(token)) }

    /// Exchanges a refresh token for a new session (rotation). A token rotated within the
    /// reuse interval yields another token of the same session; reused later, the whole
    /// session is revoked.
    public func refresh(token: String, ip: String) async throws -> IssuedSession {
        guard !token.isEmpty, token.utf8.count <= 128 else { throw AuthError.refreshTokenNotFound }
        let newToken = Self.newRefreshToken()
        let reuseInterval = settings.refreshReuseInterval
        enum Outcome: Sendable { case notFound, reused, issued(UserRecord, UUID) }
        let outcome: Outcome = try await database { connection in
            // Only the token is known: it names its user, whose rows the rest reads.
            try RowScope.apply(RowScope.refreshToken(hash: Self.hashToken(token)), on: connection)
            let rows = try connection.query(
                """
                select t.id, t.session_id, t.user_id, t.revoked_at is not null or s.revoked_at is not null,
                       t.rotated_at is not null, coalesce(extract(epoch from now() - t.rotated_at), 0)::float8
                from refresh_tokens t join sessions s on s.id = t.session_id
                where t.token_hash = $1 for update of t, s
                """, Self.hashToken(token))
            guard let row = rows.first else { return .notFound }
            let tokenID = try row.decode(Int64.self, column: 0)
            let sessionID = try row.decode(UUID.self, column: 1)
            let userID = try row.decode(UUID.self, column: 2)
            if try row.decode(Bool.self, column: 3) { return .notFound }
            if try row.decode(Bool.self, column: 4) {
                let age = try row.decode(Double.self, column: 5)
                if age > Double(reuseInterval) {
                    try connection.query("update sessions set revoked_at = now() where id = $1", sessionID)
                    try connection.query(
                        "update refresh_tokens set revoked_at = now() where session_id = $1 and revoked_at is null", sessionID)
                    return .reused
                }
            } else {
                try connection.query("update refresh_tokens set rotated_at = now() where id = $1", tokenID)
            }
            try connection.query(
                "insert into refresh_tokens (session_id, user_id, token_hash, parent_id) values ($1, $2, $3, $4)",
                sessionID, userID, Self.hashToken(newToken), tokenID)
            try connection.query("update sessions set refreshed_at = now(), updated_at = now() where id = $1", sessionID)
            let user = try connection.query("select \(UserRecord.columns) from users where id = $1", userID)[0]
            return .issued(try UserRecord(row: user), sessionID)
        }
        switch outcome {
        case .notFound: throw AuthError.refreshTokenNotFound
        case .reused:
            logger.warning("refresh token reused after rotation; session revoked")
            throw AuthError.refreshTokenAlreadyUsed
        case .issued(let user, let sessionID):
            return issue(user: user, sessionID: sessionID, refreshToken: newToken)
        }
    }

    /// Which sessions `logout` ends.
    public enum LogoutScope: String, Sendable { case local, global, others }

    /// Revokes the caller's session, all the user's sessions, or all others.
    public func logout(_ claims: AccessClaims, scope: LogoutScope) async throws {
        let current = claims.sessionID
        try await database { connection in
            try RowScope.apply(RowScope.user(claims.userID), on: connection)
            let sessionFilter: String
            switch scope {
            case .local: sessionFilter = "id = $2"
            case .global: sessionFilter = "$2::uuid is null or true"
            case .others: sessionFilter = "id is distinct from $2"
            }
            let revoked = try connection.query(
                "update sessions set revoked_at = now() where user_id = $1 and revoked_at is null and (\(sessionFilter)) returning id",
                claims.userID, current
            ).map { try $0.decode(UUID.self, column: 0) }
            try connection.query(
                "update refresh_tokens set revoked_at = now() where session_id = any($1) and revoked_at is null", revoked)
        }
    }

    /// The caller's user, if the session behind the token is still live.
    public func user(_ claims: AccessClaims) async throws -> UserRecord {
        try await database { connection in
            try RowScope.apply(RowScope.user(claims.userID), on: connection)
            try Self.checkSession(claims, on: connection)
            guard let row = try connection.query("select \(UserRecord.columns) from users where id = $1", claims.userID).first
            else { throw AuthError.userNotFound }
            return try UserRecord(row: row)
        }
    }

    /// Merges `data` into the user's metadata; `data.full_name` also sets `full_name`.
    public func updateUser(_ claims: AccessClaims, data: [String: JSONValue]) async throws -> UserRecord {
        let patch = PostgresJSON(bytes: JSONValue.object(data).jsonBytes)
        let fullName = data["full_name"]
        let setsName = fullName != nil
        let name: String? = fullName?.stringValue
        return try await database { connection in
            try RowScope.apply(RowScope.user(claims.userID), on: connection)
            try Self.checkSession(claims, on: connection)
            guard
                let row = try connection.query(
                    """
                    update users set user_metadata = user_metadata || $2, updated_at = now(),
                      full_name = case when $3 then $4 else full_name end
                    where id = $1 returning \(UserRecord.columns)
                    """, claims.userID, patch, setsName, name
                ).first
            else { throw AuthError.userNotFound }
            return try UserRecord(row: row)
        }
    }

    static func checkSession(_ claims: AccessClaims, on connection: PostgresConnection) throws {
        guard let session = claims.sessionID else { return }
        let live = try connection.query(
            "select 1 from sessions where id = $1 and user_id = $2 and revoked_at is null", session, claims.userID)
        if live.isEmpty { throw AuthError.sessionNotFound }
    }

    /// Creates the user if needed and a session for it, without a code (`trunk-sync token`).
    public func issueSession(email: Email) async throws -> IssuedSession {
        let user = try await database { connection in
            try RowScope.apply(RowScope.email(email), on: connection)
            let row = try connection.query(
                """
                insert into users (email, email_confirmed_at, last_sign_in_at) values ($1, now(), now())
                on conflict ((lower(email))) do update set last_sign_in_at = now(), updated_at = now()
                returning \(UserRecord.columns)
                """, email.value)[0]
            return try UserRecord(row: row)
        }
        return try await startSession(for: user, ip: "cli", userAgent: "trunk-sync token")
    }
}
