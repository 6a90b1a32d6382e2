import Foundation
import Postgres
import TrunkCrypto

/// The rules every mailed 6-digit code follows, whatever it is for: one live code per owner,
/// stored only as an HMAC, a resend interval, an expiry, single use, `otpMaxAttempts` wrong
/// guesses per code, and refused attempts counted across codes that lock the owner out for
/// `otpLockout`. Sign-in codes (`otp_codes`, owned by an address) and reauthentication codes
/// (`reauthentication_codes`, owned by a signed-in user) are two tables of the same shape;
/// this is the one place their SQL lives. Every function runs inside the caller's
/// transaction, which has already set the row scope row-level security needs.
struct OneTimeCodes: Sendable {
    /// The table, and the column naming each code's owner (both fixed here, never input).
    let table: String
    let owner: String
    /// Whether the table keeps, with each code, the metadata a new user signs up with.
    var keepsSignupData = false

    /// Sign-in codes, by normalised address (`app.email`), with the sign-up metadata.
    static let signIn = OneTimeCodes(table: "otp_codes", owner: "email", keepsSignupData: true)
    /// Codes confirming a signed-in user's sensitive action, by user id (`app.user_id`).
    static let reauthentication = OneTimeCodes(table: "reauthentication_codes", owner: "user_id")

    /// Seconds until another code may be sent to `owner`, or nil when one may be sent now.
    func resendWait(_ owner: any PostgresEncodable, interval: Int, on tx: Transaction) async throws -> Int? {
        let recent = try await tx.query(
            """
            select ceil(extract(epoch from created_at + make_interval(secs => $2) - now()))::int8 from \(table)
            where \(self.owner) = $1 and created_at > now() - make_interval(secs => $2)
            """, owner, Int64(interval))
        return try recent.first.map { max(1, try $0.decode(Int.self, column: 0)) }
    }

    /// Makes `hash` the owner's one live code for `lifetime` seconds, replacing any other
    /// (and, where the table keeps it, the sign-up metadata with `signupData`). The counted
    /// failures and a lock survive it: a new code buys no more guesses.
    func store(
        _ owner: any PostgresEncodable, hash: PostgresBytes, lifetime: Int, signupData: PostgresJSON? = nil,
        on tx: Transaction
    ) async throws {
        let (column, value, set) =
            keepsSignupData ? (", signup_data", ", $4", ", signup_data = excluded.signup_data") : ("", "", "")
        try await tx.query(
            """
            insert into \(table) (\(self.owner), code_hash, created_at, expires_at, attempts, consumed_at\(column))
            values ($1, $2, now(), now() + make_interval(secs => $3), 0, null\(value))
            on conflict (\(self.owner)) do update set code_hash = excluded.code_hash, created_at = excluded.created_at,
              expires_at = excluded.expires_at, attempts = 0, consumed_at = null\(set)
            """,
            binds: [owner.postgresBind, hash.postgresBind, Int64(lifetime).postgresBind]
                + (keepsSignupData ? [signupData.postgresBind] : []))
    }

    /// What a check should tell the logs.
    enum LockEvent: Sendable {
        case none
        /// This refusal locked the owner out until then, after `failures` refusals.
        case locked(until: PostgresTimestamp, failures: Int)
        /// A lock had ended before this attempt (counting started over).
        case ended
    }

    /// The outcome of `check`.
    enum Check: Sendable {
        /// The code was right and is now used up.
        case accepted(LockEvent)
        /// Wrong, expired, used, exhausted, absent or locked: one outcome for all. The
        /// refusal is counted (unless locked): the caller must commit for it to stay counted.
        case refused(LockEvent)
    }

    /// Checks `hash` against the owner's live code and consumes it when it matches, under
    /// the row's lock. While the owner is locked out every code — the right one too — is
    /// refused and nothing is counted (the lock does not grow).
    func check(_ owner: any PostgresEncodable, hash: PostgresBytes, settings: AuthSettings, on tx: Transaction)
        async throws -> Check
    {
        let rows = try await tx.query(lockedCode(owner, settings: settings))
        switch try decide(rows.first, owner: owner, hash: hash, settings: settings) {
        case .done(let outcome): return outcome
        case .update(let statement, let outcome): return try outcome(try await tx.query(statement))
        }
    }

    /// The owner's code row, locked, as `decide` reads it.
    private func lockedCode(_ owner: any PostgresEncodable, settings: AuthSettings) -> PostgresStatement {
        PostgresStatement(
            """
            select code_hash, expires_at > now(), attempts, consumed_at is null,
                   coalesce(locked_until > now(), false), locked_until is not null,
                   failures, failures_since is null or failures_since <= now() - make_interval(secs => $2)
            from \(table) where \(self.owner) = $1 for update
            """, owner, Int64(settings.otpFailureRule.window))
    }

    /// What `check` does after reading the code row: nothing more, or one update whose
    /// answer gives the outcome.
    private enum Step {
        case done(Check)
        case update(PostgresStatement, outcome: (PostgresResult) throws -> Check)
    }

    /// The rules of `check`, given the owner's code row (nil: no code).
    private func decide(_ row: PostgresRow?, owner: any PostgresEncodable, hash: PostgresBytes, settings: AuthSettings)
        throws -> Step
    {
        guard let row else { return .done(.refused(.none)) }
        if try row.decode(Bool.self, column: 4) { return .done(.refused(.none)) }
        let lockEnded = try row.decode(Bool.self, column: 5)
        let stored = try row.decode(PostgresBytes.self, column: 0)
        let live =
            try row.decode(Bool.self, column: 1) && row.decode(Bool.self, column: 3)
            && row.decode(Int.self, column: 2) < settings.otpMaxAttempts
        guard live, constantTimeEquals(stored.bytes, hash.bytes) else {
            // After a lock, or once the window has passed, counting starts over.
            let windowOver = try lockEnded || row.decode(Bool.self, column: 7)
            let failures = windowOver ? 1 : try row.decode(Int.self, column: 6) + 1
            let lock = failures >= settings.otpFailureRule.limit
            let count = PostgresStatement(
                """
                update \(table) set attempts = attempts + $2, failures = $3,
                  failures_since = case when $4 then now() else failures_since end,
                  locked_until = case when $5 then now() + make_interval(secs => $6) end
                where \(self.owner) = $1 returning locked_until
                """, owner, Int64(live ? 1 : 0), Int64(failures), windowOver, lock, Int64(settings.otpLockout))
            return .update(count) { result in
                let until = try result[0].decode(PostgresTimestamp?.self, column: 0)
                if lock, let until { return .refused(.locked(until: until, failures: failures)) }
                return .refused(lockEnded ? .ended : .none)
            }
        }
        let consume = PostgresStatement(
            """
            update \(table) set consumed_at = now(), failures = 0, failures_since = null, locked_until = null
            where \(self.owner) = $1
            """, owner)
        return .update(consume) { _ in .accepted(lockEnded ? .ended : .none) }
    }

    /// Whether `code` has the shape of a code (6 ASCII digits); anything else is refused
    /// before the database is asked.
    static func isWellFormed(_ code: String) -> Bool {
        code.utf8.count == 6 && code.utf8.allSatisfy { $0 >= 48 && $0 <= 57 }
    }
}
