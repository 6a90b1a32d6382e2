import Foundation
import Postgres
import TrunkCrypto

/// The ES256 signing keys in `signing_keys`: what `trunk-sync keys` manages and every
/// server reloads.
///
/// Lifecycle of a key: `add` stores it; from then on it verifies tokens and is published
/// in jwks.json (on every instance within one `reloadInterval`). It starts signing new
/// tokens `activationDelay` after it was added, once every instance and every JWKS cache
/// knows it; the newest key past that delay signs. `retire` ends it: from the next reload
/// it neither verifies nor is published. The HS256 secret verifies throughout, and signs
/// whenever no key does.
///
/// Private keys are stored encrypted (`private_key_sealed`, see `KeyEncryptionKey`); the
/// server's role may read only that column, and only a server given
/// `TRUNK_SYNC_KEY_ENCRYPTION_KEY` can use them.
public struct SigningKeyStore: Sendable {
    public let database: Database
    /// What seals and opens the private keys; nil when `TRUNK_SYNC_KEY_ENCRYPTION_KEY` is not
    /// set (then no key can be added, and stored keys cannot be loaded).
    let encryption: KeyEncryptionKey?

    /// How often a server re-reads the keys: 60 seconds.
    public static let reloadInterval: Duration = .seconds(60)

    /// Seconds between `add` and the key's first signature: one reload interval (every
    /// instance then verifies it) plus the 600 s jwks.json may be cached for, so neither
    /// another instance nor a JWKS consumer ever sees a token signed with a key it does not
    /// know yet.
    public static let activationDelay: Double = 660

    /// A store on `database`: the server's (role `trunk_sync_app`, which may only read, and
    /// not the plaintext column) or the command line's (the owner, which may also write).
    public init(database: Database, encryption: KeyEncryptionKey? = nil) {
        self.database = database
        self.encryption = encryption
    }

    /// Why a stored private key cannot be used. Each message is one line for the operator.
    public enum KeyLoadError: Error, Equatable, CustomStringConvertible {
        /// It is stored encrypted and no key encryption key is configured.
        case noKeyEncryptionKey
        /// The configured key encryption key does not open it.
        case wrongKeyEncryptionKey
        /// It is still stored in plaintext (written by an older version after `migrate`).
        case storedUnencrypted

        public var description: String {
            switch self {
            case .noKeyEncryptionKey:
                return "it is stored encrypted and neither TRUNK_SYNC_KEY_ENCRYPTION_KEY nor "
                    + "TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE is set: give every server the key trunk-sync migrate and keys add use"
            case .wrongKeyEncryptionKey:
                return "TRUNK_SYNC_KEY_ENCRYPTION_KEY does not decrypt it: it was encrypted with another key"
            case .storedUnencrypted:
                return
                    "it is stored unencrypted: run trunk-sync migrate with TRUNK_SYNC_KEY_ENCRYPTION_KEY set to encrypt it"
            }
        }
    }

    /// What a key is doing now.
    public enum Status: Sendable, Equatable {
        /// It signs new tokens (and verifies).
        case signing
        /// It verifies tokens but does not sign: a newer key signs.
        case verifying
        /// It verifies tokens, is published, and signs once `seconds` have passed.
        case pending(seconds: Double)
        /// It neither verifies nor is published.
        case retired
    }

    /// One stored key as operators see it (no private part).
    public struct Summary: Sendable {
        /// `kid`: the RFC 7638 thumbprint of the public key.
        public var keyID: String
        /// Always `ES256` for now.
        public var algorithm: String
        public var createdAt: PostgresTimestamp
        public var retiredAt: PostgresTimestamp?
        /// Seconds since `created_at`, by the database's clock.
        public var age: Double
        public var status: Status
    }

    /// A non-retired key as the server loads it.
    struct ActiveRow: Sendable {
        var keyID: String
        /// The decrypted PEM, or why there is none.
        var privateKeyPEM: Result<String, KeyLoadError>
        /// Seconds since `created_at`, by the database's clock.
        var age: Double
    }

    /// Every key, newest first, with its status.
    public func list() async throws -> [Summary] {
        try await database.read(as: .server) { tx in
            Self.classify(try await tx.query(Self.summaryQuery).map(Self.summary))
        }
    }

    /// Every key, newest first (`summary(_:)` reads its rows).
    static let summaryQuery = """
        select kid, algorithm, created_at, retired_at, extract(epoch from now() - created_at)::float8
        from signing_keys order by created_at desc, kid desc
        """

    /// A row of `summaryQuery`, its status not yet set (`classify` does).
    static func summary(_ row: PostgresRow) throws -> Summary {
        Summary(
            keyID: try row.decode(String.self, column: 0), algorithm: try row.decode(String.self, column: 1),
            createdAt: try row.decode(PostgresTimestamp.self, column: 2),
            retiredAt: try row.decode(PostgresTimestamp?.self, column: 3), age: try row.decode(Double.self, column: 4),
            status: .retired)
    }

    /// Sets each key's status from its age and retirement, for keys ordered newest first:
    /// the newest non-retired key past `activationDelay` signs, newer ones are pending,
    /// older ones verify.
    static func classify(_ keys: [Summary]) -> [Summary] {
        var signerFound = false
        return keys.map { key in
            var key = key
            if key.retiredAt != nil {
                key.status = .retired
            } else if key.age < activationDelay {
                key.status = .pending(seconds: activationDelay - key.age)
            } else if !signerFound {
                key.status = .signing
                signerFound = true
            } else {
                key.status = .verifying
            }
            return key
        }
    }

    /// The non-retired keys, newest first, for the server.
    func activeKeys() async throws -> [ActiveRow] {
        let encryption = self.encryption
        return try await database.read(as: .server) { tx in
            try await tx.query(
                """
                select kid, private_key_sealed, extract(epoch from now() - created_at)::float8
                from signing_keys where retired_at is null order by created_at desc, kid desc
                """
            ).map { row in
                let keyID = try row.decode(String.self, column: 0)
                let sealed = try row.decode(PostgresBytes?.self, column: 1)
                let pem: Result<String, KeyLoadError>
                if let sealed {
                    if let encryption {
                        pem = Result { () throws(KeyLoadError) in try encryption.open(sealed.bytes, keyID: keyID) }
                    } else {
                        pem = .failure(.noKeyEncryptionKey)
                    }
                } else {
                    pem = .failure(.storedUnencrypted)
                }
                return ActiveRow(keyID: keyID, privateKeyPEM: pem, age: try row.decode(Double.self, column: 2))
            }
        }
    }

    /// `keys add` without `TRUNK_SYNC_KEY_ENCRYPTION_KEY`.
    public struct KeyEncryptionKeyRequired: Error, CustomStringConvertible {
        public var description: String {
            "TRUNK_SYNC_KEY_ENCRYPTION_KEY (or TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE, a file holding it) is required to add a "
                + "signing key (its private half is stored encrypted with it); \(SecretRules.howToMake), and give the same "
                + "one to migrate and every server"
        }
    }

    /// Generates a P-256 key, stores it and returns it (its `kid` is its RFC 7638
    /// thumbprint, which never starts with `-`).
    public func add() async throws -> JWT.ES256Key {
        guard let encryption else { throw KeyEncryptionKeyRequired() }
        var generated = try JWT.ES256Key.generate()
        // A kid starting with "-" would read as an option in `trunk-sync keys retire KID`;
        // one key in 64 is replaced by another.
        while generated.thumbprint.hasPrefix("-") { generated = try JWT.ES256Key.generate() }
        let key = generated.withKeyID(generated.thumbprint)
        let keyID = generated.thumbprint
        let sealed = PostgresBytes(try encryption.seal(privateKeyPEM: try key.privateKeyPEM(), keyID: keyID))
        try await database.transaction(as: .server) { tx in
            let insert = PostgresStatement(
                "insert into signing_keys (kid, algorithm, private_key_sealed, public_jwk) values ($1, 'ES256', $2, $3)",
                keyID, sealed, PostgresJSON(key.publicJWK))
            try await tx.pipeline([insert, .commit])
        }
        return key
    }

    // MARK: - Upgrading stored keys (run by `migrate`, as the owner)

    /// Why `migrate` will not start: it would leave keys no server can use. Nothing has been
    /// changed when it is thrown.
    public enum UpgradeError: Error, Equatable, CustomStringConvertible {
        /// Plaintext private keys exist and no key encryption key is set to encrypt them.
        case plaintextKeysNeedAKey(count: Int)
        /// The configured key encryption key does not open a stored key.
        case wrongKeyEncryptionKey(keyID: String)

        public var description: String {
            switch self {
            case .plaintextKeysNeedAKey(let count):
                return
                    "signing_keys holds \(count) private key(s) stored unencrypted: set TRUNK_SYNC_KEY_ENCRYPTION_KEY "
                    + "or TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE (\(SecretRules.howToMake); servers need the same one) and "
                    + "run trunk-sync migrate again, "
                    + "which encrypts them; nothing was changed"
            case .wrongKeyEncryptionKey(let keyID):
                return
                    "TRUNK_SYNC_KEY_ENCRYPTION_KEY does not decrypt signing key \(keyID): it is not the key the stored "
                    + "keys were encrypted with; nothing was changed"
            }
        }
    }

    /// Before `migrate` applies anything: refuses when stored keys would be left unusable
    /// (plaintext keys and no key to encrypt them with, or sealed keys `encryption` cannot
    /// open). Works on every schema version (no table yet, plaintext only, sealed).
    public static func checkBeforeMigrating(on connection: PostgresConnection, encryption: KeyEncryptionKey?) throws {
        let columns = Set(
            try connection.query(
                "select attname::text from pg_attribute where attrelid = to_regclass('signing_keys') and attnum > 0 and not attisdropped"
            ).map { try $0.decode(String.self, column: 0) })
        guard columns.contains("private_key") else { return }
        let plaintext = try connection.query("select count(*) from signing_keys where private_key is not null")[0]
            .decode(Int.self, column: 0)
        if plaintext > 0, encryption == nil { throw UpgradeError.plaintextKeysNeedAKey(count: plaintext) }
        guard columns.contains("private_key_sealed"), let encryption else { return }
        for row in try connection.query(
            "select kid, private_key_sealed from signing_keys where private_key_sealed is not null order by kid")
        {
            let keyID = try row.decode(String.self, column: 0)
            do {
                _ = try encryption.open(try row.decode(PostgresBytes.self, column: 1).bytes, keyID: keyID)
            } catch {
                throw UpgradeError.wrongKeyEncryptionKey(keyID: keyID)
            }
        }
    }

    /// After `migrate` applied everything: encrypts every private key still stored in
    /// plaintext, in one transaction, and returns how many.
    public static func encryptPlaintextKeys(on connection: PostgresConnection, encryption: KeyEncryptionKey?) throws
        -> Int
    {
        guard let encryption else { return 0 }
        return try connection.transaction { connection in
            let rows = try connection.query(
                "select kid, private_key from signing_keys where private_key is not null order by kid for update")
            for row in rows {
                let keyID = try row.decode(String.self, column: 0)
                let sealed = try encryption.seal(privateKeyPEM: try row.decode(String.self, column: 1), keyID: keyID)
                try connection.query(
                    "update signing_keys set private_key_sealed = $2, private_key = null where kid = $1", keyID,
                    PostgresBytes(sealed))
            }
            return rows.count
        }
    }

    /// What `retire` did.
    public enum RetireOutcome: Sendable, Equatable {
        /// The key is retired now.
        case retired
        /// It had been retired before, at that time; nothing changed.
        case alreadyRetired(PostgresTimestamp)
    }

    /// Why `retire` refused. Each message is one line for the operator.
    public enum RetireError: Error, Equatable, CustomStringConvertible {
        /// No key has that `kid`.
        case unknownKey(String)
        /// The key signs new tokens now.
        case stillSigning(String)
        /// The key is pending: it signs new tokens in that many seconds (instances may be
        /// about to), and has signed nothing yet.
        case pending(String, seconds: Int)
        /// Tokens it signed may still be valid for that many seconds.
        case tokensStillValid(String, seconds: Int)

        public var description: String {
            switch self {
            case .unknownKey(let kid):
                return "no signing key with kid \(kid) (see trunk-sync keys list)"
            case .stillSigning(let kid):
                return "key \(kid) signs new tokens (add a newer key first and wait until it signs): "
                    + "retiring it now rejects every token it signed; pass --force to do so anyway"
            case .pending(let kid, let seconds):
                return
                    "key \(kid) is pending: it starts signing new tokens in \(seconds) seconds (instances may be about "
                    + "to sign with it); to retire a key added by mistake, pass --force (a token it signed by then gets "
                    + "401 until the client refreshes)"
            case .tokensStillValid(let kid, let seconds):
                return "tokens signed with key \(kid) may be valid for \(seconds) more seconds: "
                    + "retiring it now rejects them (401 until the clients refresh); wait, or pass --force"
            }
        }
    }

    /// Retires the key `kid`: from the next reload (within `reloadInterval`) no server
    /// verifies tokens signed with it and jwks.json no longer lists it.
    ///
    /// Unless `force`, refuses while tokens it signed may still be valid: while it signs or
    /// is pending, and until `tokenLifetime` (plus the verification leeway) has passed since
    /// a newer key took over signing.
    public func retire(_ kid: String, tokenLifetime: Int, force: Bool) async throws -> RetireOutcome {
        enum Step: Sendable { case done(RetireOutcome), refused(RetireError) }
        let step: Step = try await database.transaction(as: .server) { tx in
            let keys = Self.classify(try await tx.query(Self.summaryQuery + " for update").map(Self.summary))
            guard let index = keys.firstIndex(where: { $0.keyID == kid }) else { return .refused(.unknownKey(kid)) }
            let key = keys[index]
            if let retiredAt = key.retiredAt { return .done(.alreadyRetired(retiredAt)) }
            if !force {
                switch key.status {
                case .signing: return .refused(.stillSigning(kid))
                case .pending(let seconds): return .refused(.pending(kid, seconds: Int(seconds.rounded(.up))))
                case .verifying, .retired:
                    // It stopped signing when the oldest newer key still in use took over.
                    let takeover =
                        keys[..<index].filter { $0.status == .signing || $0.status == .verifying }
                        .map { $0.age - Self.activationDelay }.max() ?? 0
                    let remaining = Double(tokenLifetime) + Double(TokenIssuer.leeway) - takeover
                    if remaining > 0 { return .refused(.tokensStillValid(kid, seconds: Int(remaining.rounded(.up)))) }
                }
            }
            try await tx.pipeline([
                PostgresStatement("update signing_keys set retired_at = now() where kid = $1", kid), .commit,
            ])
            return .done(.retired)
        }
        switch step {
        case .done(let outcome): return outcome
        case .refused(let error): throw error
        }
    }
}
