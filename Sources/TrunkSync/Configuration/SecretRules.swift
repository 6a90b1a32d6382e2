/// What a secret must be before `serve` trusts it.
///
/// `TRUNK_SYNC_JWT_SECRET` signs access tokens and `TRUNK_SYNC_KEY_ENCRYPTION_KEY` guards
/// the ES256 private keys: whoever guesses either can act as any user. The documentation
/// ships example values, and people type memorable ones; both are refused, with one line
/// that names the setting and how to make a good value, and never quotes the value.
///
/// The rules refuse what is guessable without refusing what a random generator produces:
/// no `openssl rand -base64 N` (N ≥ 24) or `openssl rand -hex N` (N ≥ 16) output fails them
/// except with negligible probability (the hex rule is the loosest; see `minimumDistinct`).
public enum SecretRules {
    /// Fewest bytes a token-protecting secret may have.
    public static let minimumBytes = 32

    /// How to make a good secret, as the documentation says.
    public static let howToMake = "make one with: openssl rand -base64 48"

    /// The example values shipped in this repository (`.env.example`, the README, the
    /// config documentation). The words below catch them too; the list documents them and
    /// guards against a word being dropped.
    public static let shippedExamples: Set<String> = [
        "change-me-to-at-least-32-random-bytes-xxxxxxxx",
        "change-me-to-another-48-random-bytes-base64xx",
        "change-me-to-a-long-random-password",
        "change-me-to-another-long-random-password",
    ]

    /// The `.env.example` variables docker-compose.yml builds the database URLs from, by the
    /// example password each ships: a refusal names the variable the operator edits, not
    /// the URL compose made of it.
    public static let composePasswordVariables: [String: String] = [
        "change-me-to-a-long-random-password": "POSTGRES_PASSWORD",
        "change-me-to-another-long-random-password": "SERVER_DB_PASSWORD",
    ]

    /// The JWT secrets Supabase's self-hosting guide and `.env.example` ship: operators
    /// moving from a self-hosted Supabase are the likeliest to paste them.
    public static let supabaseExamples: Set<String> = [
        "super-secret-jwt-token-with-at-least-32-characters-long",
        "your-super-secret-jwt-token-with-at-least-32-characters-long",
    ]

    /// Words no real secret contains: what placeholders are made of. Lower case; matched
    /// without regard to case.
    static let placeholderWords = [
        "change-me", "changeme", "change_me", "replace-me", "replaceme", "replace_me", "placeholder", "example",
        "your-secret", "your_secret", "yoursecret", "super-secret-jwt-token", "at-least-32-characters",
    ]

    /// Passwords of database and mail URLs refused as placeholders (the documentation's
    /// `postgres://user:pass@…` and `smtp://user:password@…` among them). Passwords are not
    /// held to the entropy rules: existing deployments keep theirs.
    static let placeholderPasswords: Set<String> = ["pass", "password"]

    /// Why `secret` is not good enough to protect tokens (a phrase to follow the setting's
    /// name, never quoting the value), or nil when it is.
    public static func weakness(of secret: String) -> String? {
        let bytes = Array(secret.utf8)
        if isSupabaseExample(secret) { return "is an example value from Supabase's documentation" }
        if isPlaceholder(secret) { return "is an example value from the trunk-sync documentation" }
        if bytes.count < minimumBytes { return "must be at least \(minimumBytes) bytes" }
        if Set(bytes).count < minimumDistinct(bytes) {
            return "is too predictable: it has too few different characters"
        }
        if isPeriodic(bytes) { return "is too predictable: it repeats a short pattern" }
        if hasRun(bytes) { return "is too predictable: it has a run of repeated or consecutive characters" }
        return nil
    }

    /// Whether a database or mail password is one of the documentation's placeholders.
    public static func isPlaceholderPassword(_ password: String) -> Bool {
        placeholderPasswords.contains(password.lowercased()) || isPlaceholder(password)
    }

    static func isSupabaseExample(_ value: String) -> Bool {
        let lowered = value.lowercased()
        return supabaseExamples.contains { lowered.contains($0) } || lowered.contains("super-secret-jwt-token")
    }

    static func isPlaceholder(_ value: String) -> Bool {
        let lowered = value.lowercased()
        return shippedExamples.contains(value) || placeholderWords.contains { lowered.contains($0) }
    }

    /// Different characters a secret must use. Sixteen, which 32 characters drawn from
    /// base64's 64 reach all but never (25 on average); a secret of hex digits alone has only
    /// 16 to choose from, and 32 of them miss at least one a third of the time, so it needs
    /// nine (fewer happens once in ~300,000 `openssl rand -hex 16`). Text like
    /// `aaaabbbbcccc…` or `deadbeef…` has far fewer.
    static func minimumDistinct(_ bytes: [UInt8]) -> Int {
        let hex = bytes.allSatisfy { (48...57).contains($0) || (97...102).contains($0) || (65...70).contains($0) }
        return hex ? 9 : 16
    }

    /// Whether the whole secret is one unit repeated (`s3cr3t-s3cr3t-…`, `0123…f0123…f`).
    static func isPeriodic(_ bytes: [UInt8]) -> Bool {
        guard bytes.count >= 2 else { return true }
        for period in 1...(bytes.count / 2) where bytes[period...].elementsEqual(bytes[..<(bytes.count - period)]) {
            return true
        }
        return false
    }

    /// Longest run of characters each equal to, one above or one below the one before it
    /// (same step throughout) that a secret may contain: `1234567` passes, `abcdefgh` and
    /// `xxxxxxxx` do not. A random base64 string of 64 characters holds such a run of eight
    /// with a probability below one in a billion.
    static let longestRun = 7

    static func hasRun(_ bytes: [UInt8]) -> Bool {
        var run = 1
        var previousStep: Int? = nil
        for index in bytes.indices.dropFirst() {
            let step = Int(bytes[index]) - Int(bytes[index - 1])
            if abs(step) <= 1 {
                run = step == previousStep ? run + 1 : 2
            } else {
                run = 1
            }
            previousStep = step
            if run > longestRun { return true }
        }
        return false
    }
}
