import Foundation
import Logging
import Postgres
import TrunkCrypto

/// Reauthentication: a signed-in user proves again that they read their mail before an
/// action that cannot be undone (deleting the account). As in Supabase Auth, `POST
/// /auth/v1/reauthenticate` mails a fresh code to the user's address; the action takes it.
/// The codes follow every rule of sign-in codes (`OneTimeCodes`) and the same limits: per
/// client and per address as `/otp`, the resend interval, the deployment's mail cap.
extension AuthService {
    private func reauthenticationHash(_ user: UUID, _ code: String) -> PostgresBytes {
        PostgresBytes(HMAC.sha256(key: codeKey, message: "reauthenticate:" + user.uuidString.lowercased() + ":" + code))
    }

    /// Mails a fresh confirmation code to the caller's address (the previous one dies), unless
    /// one was sent within the resend interval or a limit is reached (`429`). The caller
    /// counts the per-client limit first (`limit(.reauthenticate, ip:)`).
    public func requestReauthentication(_ claims: AccessClaims) async throws {
        let user = claims.userID
        let address: String = try await transaction(as: .user(user)) { tx in
            try await Self.checkSession(claims, on: tx)
            guard let row = try await tx.query("select email from users where id = $1", user).first else {
                throw AuthError.sessionNotFound
            }
            return try row.decode(String.self, column: 0)
        }
        guard let email = Email(address) else { throw AuthError.sessionNotFound }
        try await limit(.reauthenticate, email: email)
        let code = SecureRandom.digits(6)
        let hash = reauthenticationHash(user, code)
        let settings = self.settings
        enum Outcome: Sendable { case stored, wait(Int), mailCap(Int) }
        let outcome: Outcome = try await transaction(as: .user(user)) { tx in
            let codes = OneTimeCodes.reauthentication
            if let wait = try await codes.resendWait(user, interval: settings.otpResendInterval, on: tx) {
                return .wait(wait)
            }
            if let retry = try await RateLimiter.hit("mail:global", rule: settings.mailRule, on: tx) {
                return .mailCap(retry)
            }
            try await codes.store(user, hash: hash, lifetime: settings.otpLifetime, on: tx)
            return .stored
        }
        switch outcome {
        case .wait(let seconds): throw AuthError.overEmailSendRateLimit(retryAfter: seconds)
        case .mailCap(let seconds):
            metrics.rateLimited("mail").increment()
            throw AuthError.overEmailSendRateLimit(retryAfter: seconds)
        case .stored:
            mail.submit(
                SignInMailQueue.Job(
                    purpose: .reauthentication, code: code, email: email.value,
                    expiresInMinutes: max(1, settings.otpLifetime / 60), addressTag: addressTag(email),
                    requestID: RequestContext.requestID))
        }
    }

    /// A check of `code` against the user's confirmation code, to run inside the
    /// transaction of the action it confirms (which has scoped it to the user): true when
    /// the code was right (it is then used up), false when it was wrong, expired, used,
    /// exhausted, never asked for, or the user is locked out. A refusal is counted, so the
    /// transaction must commit after a `false` too — and change nothing else.
    func reauthenticationCheck(user: UUID, code: String) -> @Sendable (Transaction) async throws -> Bool {
        let (wellFormed, hash, report) = reauthenticationRule(user: user, code: code)
        let settings = self.settings
        return { tx in
            guard wellFormed else { return false }
            return report(try await OneTimeCodes.reauthentication.check(user, hash: hash, settings: settings, on: tx))
        }
    }

    /// Whether `code` has a code's shape, the hash to check, and what an outcome means (and
    /// logs: a lock).
    private func reauthenticationRule(user: UUID, code: String)
        -> (wellFormed: Bool, hash: PostgresBytes, report: @Sendable (OneTimeCodes.Check) -> Bool)
    {
        let wellFormed = OneTimeCodes.isWellFormed(code)
        let hash = reauthenticationHash(user, wellFormed ? code : "")
        let logger = self.logger
        return (
            wellFormed, hash,
            { check in
                switch check {
                case .accepted: return true
                case .refused(let event):
                    if case .locked(let until, let failures) = event {
                        logger.warning(
                            "reauthentication locked: too many wrong codes",
                            metadata: [
                                "user_id": "\(user.uuidString.lowercased())", "failures": "\(failures)",
                                "until": "\(RFC3339.format(until))",
                            ])
                    }
                    return false
                }
            }
        )
    }
}
