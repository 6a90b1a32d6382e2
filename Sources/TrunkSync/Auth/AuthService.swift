import Foundation
import JSON
import Logging
import Postgres
import TrunkCrypto

/// Sends sign-in and confirmation codes (by mail, or to the log in development).
public protocol SignInCodeSender: Sendable {
    /// Delivers sign-in `code` to `email`; throws when it could not be handed over.
    func sendSignInCode(_ code: String, to email: String, expiresInMinutes: Int) async throws
    /// Delivers `code` confirming a signed-in user's action (`/auth/v1/reauthenticate`);
    /// by default as a sign-in code.
    func sendReauthenticationCode(_ code: String, to email: String, expiresInMinutes: Int) async throws
    /// Lets whatever the sender runs on (threads) end once its work is done; nothing is sent
    /// afterwards. By default nothing to do.
    func close()
}

extension SignInCodeSender {
    /// Nothing to close.
    public func close() {}

    /// Sends it as `sendSignInCode` does.
    public func sendReauthenticationCode(_ code: String, to email: String, expiresInMinutes: Int) async throws {
        try await sendSignInCode(code, to: email, expiresInMinutes: expiresInMinutes)
    }
}

/// The rules of sign-in (every one configurable; the defaults are the documented ones).
public struct AuthSettings: Sendable {
    /// Seconds a code stays valid. Default: setting `otp_expiry`.
    public var otpLifetime = Setting.otpExpiry.integerDefault
    /// Seconds before a new code may be sent to the same address. Default: setting `otp_resend_interval`.
    public var otpResendInterval = Setting.otpResendInterval.integerDefault
    /// Wrong guesses that kill a code. Default: setting `otp_max_attempts`.
    public var otpMaxAttempts = Setting.otpMaxAttempts.integerDefault
    /// Refused `/verify` requests per address, across codes, that lock verification for the
    /// address. Default: setting `otp_failure_limit`.
    public var otpFailureRule = Setting.otpFailureLimit.ruleDefault
    /// Seconds verification stays locked. Default: setting `otp_lockout`.
    public var otpLockout = Setting.otpLockout.integerDefault
    /// Per client (an IPv4 address or an IPv6 /64): `/otp`. Default: setting `rate_limit_otp`.
    public var otpRule = Setting.rateLimitOTP.ruleDefault
    /// Per client: `/verify`. Default: setting `rate_limit_verify`.
    public var verifyRule = Setting.rateLimitVerify.ruleDefault
    /// Per client: `/token`. Default: setting `rate_limit_token`.
    public var tokenRule = Setting.rateLimitToken.ruleDefault
    /// Per email address, whichever client asks: `/otp`. Default: setting `rate_limit_otp_email`.
    public var otpEmailRule = Setting.rateLimitOTPEmail.ruleDefault
    /// Per email address, whichever client asks: `/verify`. Default: setting `rate_limit_verify_email`.
    public var verifyEmailRule = Setting.rateLimitVerifyEmail.ruleDefault
    /// All sign-in mails of the deployment. Default: setting `rate_limit_mail`.
    public var mailRule = Setting.rateLimitMail.ruleDefault
    /// Seconds after rotation during which an old refresh token still yields a session (two
    /// tabs refreshing at once). Default: setting `refresh_reuse_interval`.
    public var refreshReuseInterval = Setting.refreshReuseInterval.integerDefault
    /// Sign-in mails sent at once (sender tasks, and SMTP sessions). Default: setting `mail_senders`.
    public var mailSenders = Setting.mailSenders.integerDefault
    /// Sign-in mails waiting for a sender; more are dropped (counted, logged). Default: setting `mail_queue_size`.
    public var mailQueueSize = Setting.mailQueueSize.integerDefault

    public init() {}
}

/// Email one-time-code sign-in, sessions and rotating refresh tokens, all in Postgres.
public struct AuthService: Sendable {
    let database: Database
    let tokens: TokenIssuer
    /// Delivers codes off the request path (see `SignInMailQueue`).
    let mail: SignInMailQueue
    /// Revoked sessions whose tokens may still be valid (see `SessionRevocations`).
    public let revocations: SessionRevocations
    let settings: AuthSettings
    let logger: Logger
    let metrics: Metrics
    /// HMAC key for stored codes, derived from the JWT secret so a database dump alone does
    /// not allow brute-forcing live codes offline.
    let codeKey: [UInt8]

    public init(
        database: Database, tokens: TokenIssuer, secret: String, sender: any SignInCodeSender, settings: AuthSettings,
        logger: Logger, metrics: Metrics = Metrics()
    ) {
        self.metrics = metrics
        self.database = database
        self.tokens = tokens
        self.settings = settings
        self.logger = logger
        revocations = SessionRevocations(database: database, logger: logger)
        mail = SignInMailQueue(
            sender: sender, senders: settings.mailSenders, capacity: settings.mailQueueSize, logger: logger,
            metrics: metrics)
        codeKey = HMAC.sha256(key: Array(secret.utf8), message: "trunk-sync sign-in code key v1")
    }

    private func codeHash(_ key: CodeKey, _ code: String) -> PostgresBytes {
        PostgresBytes(HMAC.sha256(key: codeKey, message: key.value + ":" + code))
    }

    /// How log lines name an address: the first 16 hex digits of an HMAC keyed from the JWT
    /// secret. Lines about one address can be told apart and matched, and an operator who
    /// knows the address can find them (`addressTag` in a test or a REPL), but a reader of
    /// the log alone cannot confirm a guessed address, and no address is ever written out.
    func addressTag(_ email: Email) -> String {
        HMAC.sha256(key: codeKey, message: "log:" + email.value).prefix(8).map { byte in
            let digits = Array("0123456789abcdef")
            return String([digits[Int(byte >> 4)], digits[Int(byte & 15)]])
        }.joined()
    }

    static func now() -> Int64 { Int64(Date().timeIntervalSince1970) }

    /// The id of the account with a normalised address (`$1`), as sign-in looks it up under
    /// the address's row scope. `email = $1` (addresses are stored lower-cased; index of
    /// migration 0013), not `lower(email) = $1`: under row-level security only a leakproof
    /// condition can use an index, and `lower()` is not one, so that read every users row.
    static let userByAddress = "select id from users where email = $1"

    /// Runs database work in one transaction scoped to `scope` (`Database.transaction(as:)`).
    /// Failures a client may retry (pool exhausted, connection lost) become `503` in the
    /// pipeline's error stage, as on every route.
    func transaction<T: Sendable>(as scope: Scope, _ body: (Transaction) async throws -> T) async throws -> T {
        try await database.transaction(as: scope, body)
    }

    /// The routes with a per-client limit. `reauthenticate` (mails a code, as `/otp`) and
    /// `account` (takes one, as `/verify`) have the rules of the route they resemble and
    /// buckets and counters of their own. The console's sign-in (`/admin/v1/auth/…`) has the
    /// same limits as the app's, counted in buckets of its own (and in the app routes'
    /// `trunk_sync_rate_limited_total` series).
    public enum LimitedRoute: String, Sendable {
        case otp, verify, token, reauthenticate, account
        case consoleOTP = "console_otp"
        case consoleVerify = "console_verify"

        /// The app route whose limits it has.
        var limits: LimitedRoute {
            switch self {
            case .consoleOTP, .reauthenticate: .otp
            case .consoleVerify, .account: .verify
            default: self
            }
        }

        /// Its `limit` label in `trunk_sync_rate_limited_total`.
        var metricName: String {
            switch self {
            case .consoleOTP, .consoleVerify: limits.rawValue
            default: rawValue
            }
        }
    }

    /// Counts a request against its route's per-client limit; throws `429` when over it. The
    /// routes call it first, before parsing anything. `ip` is the request's client address;
    /// an IPv6 client is counted by its /64 (`IPAddress.client`), or one host could walk its
    /// 2^64 addresses past any limit.
    public func limit(_ route: LimitedRoute, ip: String) async throws {
        let rule: RateLimiter.Rule
        switch route.limits {
        case .otp: rule = settings.otpRule
        case .verify: rule = settings.verifyRule
        default: rule = settings.tokenRule
        }
        let bucket = "ip:\(route.rawValue):\(RateLimiter.clientBucket(ip))"
        let retryAfter = try await transaction(as: .server) { try await RateLimiter.hit(bucket, rule: rule, on: $0) }
        if let retryAfter {
            metrics.rateLimited(route.metricName).increment()
            throw AuthError.overRequestRateLimit(retryAfter: retryAfter)
        }
    }

    /// Counts a request for `email` against its route's per-address limit, whichever client
    /// sent it; throws `429` when over it. Called as soon as the address is parsed, before
    /// anything looks at whether it has an account: known and unknown addresses are counted
    /// and answered alike, so the limit tells nobody which addresses exist.
    public func limit(_ route: LimitedRoute, email: Email) async throws {
        let rule: RateLimiter.Rule
        let name: String
        switch route.limits {
        case .otp: (rule, name) = (settings.otpEmailRule, "otp_email")
        case .verify: (rule, name) = (settings.verifyEmailRule, "verify_email")
        default: return  // refresh tokens name no address
        }
        let bucket = "email:\(route.rawValue):\(RateLimiter.emailBucket(email.value))"
        let retryAfter = try await transaction(as: .server) { try await RateLimiter.hit(bucket, rule: rule, on: $0) }
        if let retryAfter {
            metrics.rateLimited(name).increment()
            // GoTrue's codes: too many codes asked for one address, or too many attempts.
            throw route.limits == .otp
                ? AuthError.overEmailSendRateLimit(retryAfter: retryAfter)
                : AuthError.overRequestRateLimit(retryAfter: retryAfter)
        }
    }

    // MARK: - Codes

    /// Records a new code for `email` and hands its mail to the mail queue, unless a code
    /// was sent within the resend interval (`429`) or the deployment's mail cap is reached
    /// (`429`).
    ///
    /// Nothing about the answer, its timing or the work done before it may tell whether the
    /// address has an account: every request runs the same statements in the same order —
    /// the resend check, the look-up of the account, the mail cap (counted for every
    /// accepted request, mail or not), the upsert of the code — and stores either the code's
    /// hash or, when no mail goes out (`create_user: false` and no account), the hash of
    /// nothing anyone knows. The mail itself is sent by the queue's sender tasks after the
    /// answer, so neither a slow mail server nor a failure shows; the only branch left on
    /// the request path is `submit`, an append under an uncontended lock.
    /// `signupData` (the request's `data`) becomes the metadata of the user the code signs
    /// up, as Supabase Auth's; a user who already has an account keeps theirs.
    public func requestCode(
        email: Email, createUser: Bool, signupData: [String: JSONValue]? = nil, ip: String
    ) async throws {
        let data = signupData.map { PostgresJSON(bytes: JSONValue.object($0).jsonBytes) }
        try await requestCode(for: .app(email), email: email, signupData: data) { exists in exists || createUser }
    }

    /// Whose code a stored code is: an app sign-in's, keyed by the address, or a console
    /// sign-in's, keyed apart (`console:` and the address; an address has no `:`), so that
    /// neither replaces, uses or locks the other's code, and a console code never signs
    /// anyone in to the app.
    struct CodeKey: Sendable {
        /// The `otp_codes.email` of the code, and the `app.email` that scopes it.
        let value: String
        static func app(_ email: Email) -> CodeKey { CodeKey(value: email.value) }
        static func console(_ email: Email) -> CodeKey { CodeKey(value: "console:" + email.value) }
    }

    /// `requestCode` for the code stored under `key`: `deliverable` says, given whether an
    /// app account has the key's address (always false for a console key, whose scope shows
    /// no users row), whether a mail goes out. The statements are the same either way.
    func requestCode(
        for key: CodeKey, email: Email, signupData: PostgresJSON? = nil, deliverable: (Bool) -> Bool
    ) async throws {
        let code = SecureRandom.digits(6)
        let settings = self.settings
        let hash = codeHash(key, code)
        let unknowable = PostgresBytes(SecureRandom.bytes(count: 32))
        enum Outcome: Sendable { case accepted(deliverable: Bool), wait(Int), mailCap(Int) }
        let outcome: Outcome = try await transaction(as: .codeKey(key.value)) { tx in
            let codes = OneTimeCodes.signIn
            if let wait = try await codes.resendWait(key.value, interval: settings.otpResendInterval, on: tx) {
                return .wait(wait)
            }
            let exists = try await tx.query(Self.userByAddress, key.value).count > 0
            if let retry = try await RateLimiter.hit("mail:global", rule: settings.mailRule, on: tx) {
                return .mailCap(retry)
            }
            let deliverable = deliverable(exists)
            try await codes.store(
                key.value, hash: deliverable ? hash : unknowable, lifetime: settings.otpLifetime,
                signupData: signupData, on: tx)
            return .accepted(deliverable: deliverable)
        }
        switch outcome {
        case .wait(let seconds): throw AuthError.overEmailSendRateLimit(retryAfter: seconds)
        case .mailCap(let seconds):
            metrics.rateLimited("mail").increment()
            throw AuthError.overEmailSendRateLimit(retryAfter: seconds)
        case .accepted(let deliverable):
            guard deliverable else { return }
            mail.submit(
                SignInMailQueue.Job(
                    code: code, email: email.value, expiresInMinutes: max(1, settings.otpLifetime / 60),
                    addressTag: addressTag(email), requestID: RequestContext.requestID))
        }
    }

    /// Checks a code and signs the user in (creating the user on first sign-in, with the
    /// metadata the code was asked for with; the code's copy of it is cleared either way).
    ///
    /// Consuming the code, upserting the user and creating the session share one
    /// transaction, so a failure anywhere in between leaves the code usable for a retry.
    /// The per-IP limit is counted before, in its own transaction, so that failed attempts
    /// count too.
    ///
    /// Every refused request for an address counts against it across codes (a new code
    /// resets the code's own `attempts`, not this): `otpFailureRule.limit` of them within
    /// `otpFailureRule.window` lock verification for the address for `otpLockout` seconds.
    /// While locked, every code — the right one too — gets the same `otp_expired` as a
    /// wrong one, and nothing more is counted (the lock does not grow). An address without
    /// an account is counted and locked alike, so the lock reveals nothing either. The lock
    /// is logged with its end, and its end is logged again by the first request after it;
    /// log lines name the address by `addressTag` and the user id, never in clear, and never
    /// carry a code.
    public func verify(email: Email, code: String, ip: String, userAgent: String?) async throws -> IssuedSession {
        let refreshToken = Self.newRefreshToken()
        let now = Self.now()
        let accessExpiresAt = now + Int64(tokens.lifetime)
        let (signedIn, sessionID) = try await consumeCode(.app(email), email: email, code: code) { tx in
            let signedInRow = try await tx.query(
                """
                with signup as (
                  update otp_codes c set signup_data = null from otp_codes asked
                  where c.email = $1 and asked.email = $1 returning asked.signup_data data
                )
                insert into users (email, email_confirmed_at, last_sign_in_at, user_metadata, full_name)
                values ($1, now(), now(), coalesce((select data from signup), '{}'),
                        (select data->>'full_name' from signup))
                on conflict ((lower(email))) do update set last_sign_in_at = now(), updated_at = now(),
                  email_confirmed_at = coalesce(users.email_confirmed_at, now())
                returning \(UserRecord.columns)
                """, email.value)[0]
            let signedIn = try UserRecord(row: signedInRow)
            // The session and its token are rows of the user, now that the id is known: the
            // transaction's scope grows by the user's.
            try await tx.pipeline(Scope.user(signedIn.id).statements)
            let sessionID = try await Self.insertSession(
                userID: signedIn.id, refreshToken: refreshToken, ip: ip, userAgent: userAgent,
                accessExpiresAt: accessExpiresAt, on: tx)
            return ((signedIn, sessionID), signedIn.id)
        }
        return issue(user: signedIn, sessionID: sessionID, refreshToken: refreshToken, now: now)
    }

    /// Checks `code` against the code stored under `key` and, when it is right, consumes it
    /// and runs `signIn` in the same transaction (its result, and the user id the log names);
    /// otherwise counts the failure and throws `otp_expired`. The rules of `verify` — attempts
    /// per code, failures per key across codes, the lockout and its log lines — hold for
    /// every key alike.
    func consumeCode<T: Sendable>(
        _ key: CodeKey, email: Email, code: String,
        signIn: (Transaction) async throws -> (T, user: UUID?)
    ) async throws -> T {
        guard OneTimeCodes.isWellFormed(code) else { throw AuthError.otpExpired }
        let hash = codeHash(key, code)
        let settings = self.settings
        typealias LockEvent = OneTimeCodes.LockEvent
        let outcome: CodeOutcome<T> = try await transaction(as: .codeKey(key.value)) { tx in
            let lockEnded: Bool
            switch try await OneTimeCodes.signIn.check(key.value, hash: hash, settings: settings, on: tx) {
            case .refused(.none):
                return .rejected(.none, user: nil)
            case .refused(let event):
                // Only the log lines of a lock name the user.
                let user = try await tx.query(Self.userByAddress, key.value).first
                return .rejected(event, user: try user?.decode(UUID.self, column: 0))
            case .accepted(let event):
                if case .ended = event { lockEnded = true } else { lockEnded = false }
            }
            let (result, signedInUser) = try await signIn(tx)
            return .signedIn(result, user: signedInUser, lockEnded ? .ended : .none)
        }
        let event: LockEvent
        let user: UUID?
        switch outcome {
        case .rejected(let rejectedEvent, let rejectedUser): (event, user) = (rejectedEvent, rejectedUser)
        case .signedIn(_, let signedInUser, let signedInEvent): (event, user) = (signedInEvent, signedInUser)
        }
        let who: Logger.Metadata = [
            "address": "\(addressTag(email))", "user_id": "\(user?.uuidString.lowercased() ?? "none")",
        ]
        switch event {
        case .none: break
        case .locked(let until, let failures):
            logger.warning(
                "sign-in locked: too many wrong codes",
                metadata: who.merging(["failures": "\(failures)", "until": "\(RFC3339.format(until))"]) { $1 })
        case .ended:
            logger.notice("sign-in lock ended", metadata: who)
        }
        guard case .signedIn(let result, _, _) = outcome else { throw AuthError.otpExpired }
        return result
    }

    /// How a code check ended.
    private enum CodeOutcome<T: Sendable>: Sendable {
        case rejected(OneTimeCodes.LockEvent, user: UUID?)
        case signedIn(T, user: UUID?, OneTimeCodes.LockEvent)
    }

    // MARK: - Sessions

    /// Creates a session with its first refresh token and signs an access token.
    func startSession(for user: UserRecord, ip: String, userAgent: String?) async throws -> IssuedSession {
        let refreshToken = Self.newRefreshToken()
        let now = Self.now()
        let accessExpiresAt = now + Int64(tokens.lifetime)
        let sessionID = try await transaction(as: .user(user.id)) { tx in
            try await Self.insertSession(
                userID: user.id, refreshToken: refreshToken, ip: ip, userAgent: userAgent,
                accessExpiresAt: accessExpiresAt, on: tx)
        }
        return issue(user: user, sessionID: sessionID, refreshToken: refreshToken, now: now)
    }

    /// Stores a session and its first refresh token inside the caller's transaction, and returns the session's id. `accessExpiresAt` is the expiry of the
    /// access token about to be issued for it: a revocation of the session matters until
    /// the newest such expiry (`SessionRevocations`).
    static func insertSession(
        userID: UUID, refreshToken: String, ip: String, userAgent: String?, accessExpiresAt: Int64,
        on tx: Transaction
    ) async throws -> UUID {
        let session = try await tx.query(
            """
            insert into sessions (user_id, ip, user_agent, access_expires_at) values ($1, $2, $3, to_timestamp($4))
            returning id
            """, userID, ip, userAgent.map { String($0.prefix(512)) }, accessExpiresAt)[0].decode(UUID.self, column: 0)
        try await tx.query(
            "insert into refresh_tokens (session_id, user_id, token_hash) values ($1, $2, $3)", session, userID,
            hashToken(refreshToken))
        return session
    }

    /// Signs the access token at `now`, the time its expiry was recorded with the session.
    private func issue(user: UserRecord, sessionID: UUID, refreshToken: String, now: Int64) -> IssuedSession {
        let access = tokens.accessToken(for: user, sessionID: sessionID, now: now)
        return IssuedSession(
            accessToken: access.token, expiresIn: tokens.lifetime, expiresAt: access.expiresAt,
            refreshToken: refreshToken,
            user: user)
    }

    static func newRefreshToken() -> String { Base64URL.encode(SecureRandom.bytes(count: 32)) }

    static func hashToken(_ token: String) -> PostgresBytes { PostgresBytes(SHA256.hash(token)) }

    /// Exchanges a refresh token for a new session (rotation). A token rotated within the
    /// reuse interval yields another token of the same session. Reused later, it revokes the
    /// whole session (a stolen token replayed), unless no token it was exchanged for has been
    /// used: then the client lost the answer (or could not store it), and, as Supabase Auth
    /// gives such a client the session's active token, it gets the session again; the unused
    /// successors are superseded (rotated and revoked), and one presented later is a token
    /// replayed: it revokes the session.
    public func refresh(token: String, ip: String) async throws -> IssuedSession {
        guard !token.isEmpty, token.utf8.count <= 128 else { throw AuthError.refreshTokenNotFound }
        let newToken = Self.newRefreshToken()
        let reuseInterval = settings.refreshReuseInterval
        let now = Self.now()
        let accessExpiresAt = now + Int64(tokens.lifetime)
        typealias Revoked = [(session: UUID, user: UUID, tokensExpireAt: Int64)]
        enum Outcome: Sendable { case notFound, reused(Revoked), issued(UserRecord, UUID) }
        // Only the token is known: it names its user, whose rows the rest reads. The session's
        // row is locked before the token's (`of s, t`: in that order), so every refresh of a
        // session queues on one row: a late retry superseding a successor never waits for a
        // token whose own refresh waits for the session (a deadlock, with `of t, s`).
        let outcome: Outcome = try await transaction(as: .refreshToken(hash: Self.hashToken(token))) { tx in
            let rows = try await tx.query(
                """
                select t.id, t.session_id, t.user_id, s.revoked_at is not null, t.revoked_at is not null,
                       t.rotated_at is not null, coalesce(extract(epoch from now() - t.rotated_at), 0)::float8
                from refresh_tokens t join sessions s on s.id = t.session_id
                where t.token_hash = $1 for update of s, t
                """, Self.hashToken(token))
            guard let row = rows.first else { return .notFound }
            let tokenID = try row.decode(Int64.self, column: 0)
            let sessionID = try row.decode(UUID.self, column: 1)
            let userID = try row.decode(UUID.self, column: 2)
            let tokenRevoked = try row.decode(Bool.self, column: 4)
            let rotated = try row.decode(Bool.self, column: 5)
            if try row.decode(Bool.self, column: 3) || (tokenRevoked && !rotated) { return .notFound }
            let age = try row.decode(Double.self, column: 6)
            let late = rotated && age > Double(reuseInterval)
            // Whether a token it was exchanged for has been used (by the session's index:
            // the tokens of one session, not every token's parent).
            let successorUsed =
                late
                ? try await tx.query(
                    """
                    select exists (select from refresh_tokens
                                   where session_id = $1 and parent_id = $2 and rotated_at is not null
                                     and revoked_at is null)
                    """, sessionID, tokenID)[0].decode(Bool.self, column: 0) : false
            if tokenRevoked || (late && successorUsed) {
                // Superseded, or exchanged for a token that has been used since: replayed.
                try await tx.query("update sessions set revoked_at = now() where id = $1", sessionID)
                try await tx.query(
                    "update refresh_tokens set revoked_at = now() where session_id = $1 and revoked_at is null",
                    sessionID)
                return .reused(try await Self.revocations(of: [sessionID], on: tx))
            }
            if late {
                // Its successors were never used: the answer that carried them was lost. They
                // are superseded, and the token counts as rotated now (tabs retrying together
                // within the interval get tokens of the session, as after any rotation).
                try await tx.query(
                    """
                    update refresh_tokens set rotated_at = now(), revoked_at = now()
                    where session_id = $1 and parent_id = $2 and rotated_at is null and revoked_at is null
                    """, sessionID, tokenID)
            }
            if !rotated || late {
                try await tx.query("update refresh_tokens set rotated_at = now() where id = $1", tokenID)
            }
            try await tx.query(
                "insert into refresh_tokens (session_id, user_id, token_hash, parent_id) values ($1, $2, $3, $4)",
                sessionID, userID, Self.hashToken(newToken), tokenID)
            try await tx.query(
                """
                update sessions set refreshed_at = now(), updated_at = now(),
                  access_expires_at = greatest(access_expires_at, to_timestamp($2))
                where id = $1
                """, sessionID, accessExpiresAt)
            let user = try await tx.query("select \(UserRecord.columns) from users where id = $1", userID)[0]
            return .issued(try UserRecord(row: user), sessionID)
        }
        switch outcome {
        case .notFound: throw AuthError.refreshTokenNotFound
        case .reused(let revoked):
            // Known here before the answer; other instances hear of it from the trigger.
            revocations.record(revoked)
            logger.warning(
                "refresh token reused after rotation; session revoked",
                metadata: ["session_id": "\(revoked.first?.session.uuidString.lowercased() ?? "")"])
            throw AuthError.refreshTokenAlreadyUsed
        case .issued(let user, let sessionID):
            return issue(user: user, sessionID: sessionID, refreshToken: newToken, now: now)
        }
    }

    /// Which sessions `logout` ends.
    public enum LogoutScope: String, Sendable { case local, global, others }

    /// Revokes the caller's session, all the user's sessions, or all others. Their access
    /// tokens stop working at once here (recorded before the answer) and on every other
    /// instance as soon as the trigger's notification arrives (milliseconds).
    public func logout(_ claims: AccessClaims, scope: LogoutScope) async throws {
        let current = claims.sessionID
        let revoked = try await transaction(as: .user(claims.userID)) { tx in
            let sessionFilter: String
            switch scope {
            case .local: sessionFilter = "id = $2"
            case .global: sessionFilter = "$2::uuid is not null"
            case .others: sessionFilter = "id is distinct from $2"
            }
            let revoked = try await tx.query(
                "update sessions set revoked_at = now() where user_id = $1 and revoked_at is null and (\(sessionFilter)) returning id",
                claims.userID, current
            ).map { try $0.decode(UUID.self, column: 0) }
            try await tx.query(
                "update refresh_tokens set revoked_at = now() where session_id = any($1) and revoked_at is null",
                revoked)
            return try await Self.revocations(of: revoked, on: tx)
        }
        revocations.record(revoked)
    }

    /// What the revocation trigger recorded for `sessions` in this transaction.
    static func revocations(of sessions: [UUID], on tx: Transaction) async throws
        -> [(session: UUID, user: UUID, tokensExpireAt: Int64)]
    {
        guard !sessions.isEmpty else { return [] }
        return try await tx.query(
            """
            select session_id, user_id, floor(extract(epoch from expires_at))::int8 from session_revocations
            where session_id = any($1)
            """, sessions
        ).map { row in
            (
                try row.decode(UUID.self, column: 0), try row.decode(UUID.self, column: 1),
                try row.decode(Int64.self, column: 2)
            )
        }
    }

    /// The caller's user, if the session behind the token is still live.
    public func user(_ claims: AccessClaims) async throws -> UserRecord {
        try await transaction(as: .user(claims.userID)) { tx in
            try await Self.checkSession(claims, on: tx)
            guard
                let row = try await tx.query("select \(UserRecord.columns) from users where id = $1", claims.userID)
                    .first
            else { throw AuthError.userNotFound }
            return try UserRecord(row: row)
        }
    }

    /// Merges `data` into the user's metadata, top-level keys replacing, and a key set to
    /// `null` removed (as Supabase Auth does: `updateUser({data: {key: null}})` is how the
    /// apps delete one); `data.full_name` also sets `full_name`. A merge that leaves the
    /// metadata over `UserRecord.maxMetadataBytes` is refused and changes nothing.
    public func updateUser(_ claims: AccessClaims, data: [String: JSONValue]) async throws -> UserRecord {
        let patch = PostgresJSON(bytes: JSONValue.object(data).jsonBytes)
        let fullName = data["full_name"]
        let setsName = fullName != nil
        let name: String? = fullName?.stringValue
        return try await transaction(as: .user(claims.userID)) { tx in
            try await Self.checkSession(claims, on: tx)
            guard
                let row = try await tx.query(
                    """
                    update users set updated_at = now(),
                      user_metadata = (user_metadata || $2)
                        - array(select key from jsonb_each($2) where value = 'null'::jsonb),
                      full_name = case when $3 then $4 else full_name end
                    where id = $1 returning \(UserRecord.columns)
                    """, claims.userID, patch, setsName, name
                ).first
            else { throw AuthError.userNotFound }
            let record = try UserRecord(row: row)
            try UserRecord.checkMetadataSize(record.metadata.count)
            // The profile (its name, its `updated_at`) changed with it: Realtime's `profiles`
            // subscribers on every instance hear of it at the commit, as of a profile update.
            try await tx.query("select pg_notify($1, $2)", EventStore.channel, UUIDText.lowercase(claims.userID))
            return record
        }
    }

    static func checkSession(_ claims: AccessClaims, on tx: Transaction) async throws {
        let live = try await tx.query(
            "select 1 from sessions where id = $1 and user_id = $2 and revoked_at is null", claims.sessionID,
            claims.userID)
        if live.isEmpty { throw AuthError.sessionNotFound }
    }

    /// Creates the user if needed and a session for it, without a code (`trunk-sync token`).
    public func issueSession(email: Email) async throws -> IssuedSession {
        let user = try await transaction(as: .email(email)) { tx in
            let row = try await tx.query(
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
