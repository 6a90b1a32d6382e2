import Foundation
import JSON
import Postgres
import Synchronization
import TrunkCrypto

/// A user as stored, with what the user JSON of the Supabase clients needs.
public struct UserRecord: Sendable, Equatable {
    public var id: UUID
    public var email: String
    public var createdAt: PostgresTimestamp
    public var updatedAt: PostgresTimestamp
    public var emailConfirmedAt: PostgresTimestamp?
    public var lastSignInAt: PostgresTimestamp?
    public var fullName: String?
    /// `user_metadata` as raw JSON text.
    public var metadata: [UInt8]

    /// The most bytes `user_metadata` may take as PostgreSQL prints it. Every access token
    /// carries it, and a token must fit in a request's header section
    /// (`HTTPParserLimits.maxHeaderSectionSize`, 32 KiB) as base64 beside the other headers:
    /// metadata larger than this would sign the user out of every route at the next refresh.
    static let maxMetadataBytes = 16 * 1024

    /// The deepest `user_metadata` may nest: a token's claims are read at most
    /// `JSONLimits.maxDepth` (64) levels deep, the claims object one of them, as a request
    /// body's are (so `PUT /auth/v1/user`'s `{"data": …}` cannot store deeper).
    static let maxMetadataDepth = 63

    /// The SQL expression of the stored metadata's printed size, for `checkMetadataSize`.
    static let metadataSize = "octet_length(user_metadata::text)"

    /// Refuses a change that left the metadata (`metadataSize`, in the change's transaction,
    /// which the throw rolls back) larger than `maxMetadataBytes`: `400 validation_failed`.
    static func checkMetadataSize(_ bytes: Int) throws {
        guard bytes > maxMetadataBytes else { return }
        throw APIError(
            status: 400, code: "validation_failed",
            message:
                "user_metadata would take \(bytes) bytes; at most \(maxMetadataBytes) (every access token carries it)")
    }

    /// The columns `init(row:)` reads, in order.
    static let columns =
        "id, email, created_at, updated_at, email_confirmed_at, last_sign_in_at, full_name, user_metadata"

    init(row: PostgresRow) throws {
        id = try row.decode(UUID.self, column: 0)
        email = try row.decode(String.self, column: 1)
        createdAt = try row.decode(PostgresTimestamp.self, column: 2)
        updatedAt = try row.decode(PostgresTimestamp.self, column: 3)
        emailConfirmedAt = try row.decode(PostgresTimestamp?.self, column: 4)
        lastSignInAt = try row.decode(PostgresTimestamp?.self, column: 5)
        fullName = try row.decode(String?.self, column: 6)
        metadata = try row.decode(PostgresJSON.self, column: 7).bytes
    }

    /// Writes the user object the Supabase clients decode (all of COMPAT.md's fields).
    func write(to writer: inout JSONWriter, key: String? = nil) {
        func time(_ timestamp: PostgresTimestamp?) -> String? { timestamp.map { RFC3339.format($0) } }
        writer.beginObject(key)
        writer.string("id", UUIDText.lowercase(id))
        writer.string("aud", "authenticated")
        writer.string("role", "authenticated")
        writer.string("email", email)
        writer.string("phone", "")
        writer.string("email_confirmed_at", time(emailConfirmedAt))
        writer.string("confirmed_at", time(emailConfirmedAt))
        writer.string("last_sign_in_at", time(lastSignInAt))
        writer.raw("app_metadata", Array(#"{"provider":"email","providers":["email"]}"#.utf8))
        writer.raw("user_metadata", metadata)
        writer.raw("identities", Array("[]".utf8))
        writer.string("created_at", time(createdAt))
        writer.string("updated_at", time(updatedAt))
        writer.bool("is_anonymous", false)
        writer.endObject()
    }

    /// The user object as JSON bytes.
    public var json: [UInt8] {
        var writer = JSONWriter(capacity: 512)
        write(to: &writer)
        return writer.bytes
    }
}

/// A signed-in session as `/verify` and `/token` return it.
public struct IssuedSession: Sendable {
    public var accessToken: String
    public var expiresIn: Int
    public var expiresAt: Int64
    public var refreshToken: String
    public var user: UserRecord

    /// `{access_token, token_type, expires_in, expires_at, refresh_token, user}`.
    public var json: [UInt8] {
        var writer = JSONWriter(capacity: 1024)
        writer.beginObject()
        writer.string("access_token", accessToken)
        writer.string("token_type", "bearer")
        writer.int("expires_in", Int64(expiresIn))
        writer.int("expires_at", expiresAt)
        writer.string("refresh_token", refreshToken)
        user.write(to: &writer, key: "user")
        writer.endObject()
        return writer.bytes
    }
}

/// What a verified access token says.
public struct AccessClaims: Sendable, Equatable {
    /// The user (`sub`).
    public var userID: UUID
    /// The session (`session_id`). Every token this server issues names one, and a token
    /// without one is refused: a token that names no session could not be revoked.
    public var sessionID: UUID
    /// Expiry, Unix seconds.
    public var expiresAt: Int64

    public init(userID: UUID, sessionID: UUID, expiresAt: Int64) {
        self.userID = userID
        self.sessionID = sessionID
        self.expiresAt = expiresAt
    }
}

/// Issues and verifies access tokens (JWTs with Supabase's claims) with the current key set.
///
/// The HS256 key from `TRUNK_SYNC_JWT_SECRET` always verifies, and signs while no ES256
/// key does. ES256 keys come from `signing_keys` (`reload(from:)`, which the server calls
/// every minute): each verifies, and the newest past its activation time signs. The key
/// set is swapped atomically, so requests never see half of a reload.
public final class TokenIssuer: Sendable {
    /// The HS256 key of the configured secret.
    public let secretKey: JWT.HS256Key
    /// `iss` of issued tokens, and accepted: `TRUNK_SYNC_PUBLIC_URL` + `/auth/v1`, so every
    /// instance of a deployment (which share the public URL) accepts the others' tokens and
    /// no other deployment's, even one that shares the secret.
    public let issuer: String
    /// Further issuers whose tokens are accepted (`TRUNK_SYNC_ACCEPTED_ISSUERS`): the hosted
    /// project a deployment moved from, so the access tokens it issued work until they expire.
    public let acceptedIssuers: Set<String>
    /// Access token lifetime in seconds.
    public let lifetime: Int
    /// Clock skew tolerated on `exp`, `iat` and `nbf`, seconds: instances' clocks differ a
    /// little, and a token issued by one is used on another at once.
    public static let leeway: Int64 = 30

    /// An ES256 key in the current set.
    public struct LoadedKey: Sendable {
        /// The key, with its `kid`.
        public var key: JWT.ES256Key
        /// When it starts signing, Unix seconds (local clock).
        public var signsFrom: Double

        /// A key that signs from `signsFrom` (Unix seconds).
        public init(key: JWT.ES256Key, signsFrom: Double) {
            self.key = key
            self.signsFrom = signsFrom
        }
    }

    private struct KeySet: Sendable {
        /// Newest first.
        var keys: [LoadedKey] = []
        /// Verify-only public keys imported from another issuer's JWKS (`keys import-jwks`).
        var importedKeys: [JWT.Key] = []
        var verificationKeys: [JWT.Key]
        var jwks: [UInt8] = Array(#"{"keys":[]}"#.utf8)
        /// Reloads started and the newest one installed, so a slow reload never replaces
        /// the result of a later one.
        var reloadsStarted = 0
        var installedReload = 0
        var loaded = false
        /// Tokens that passed every check with these keys, and their claims: the same bytes
        /// verify the same way while the keys stay, so a client's next request with its
        /// token skips the signature. Only the expiry depends on the clock from then on (a
        /// token whose `iat`/`nbf` were acceptable stays so). Emptied whenever the keys
        /// change (a retired key's tokens stop counting at once) and when full.
        var verified: [String: AccessClaims] = [:]
        static let verifiedCapacity = 4096
        /// Longer tokens are verified each time, not remembered: a user's token grows with
        /// their metadata (to ~23 KiB), and 4096 of those would hold ~94 MB. A token with
        /// ordinary metadata is well under it (~1 KiB): the cache holds at most 16 MiB.
        static let verifiedTokenMaxBytes = 4096
        /// Counts key changes, so a verification that raced a reload is not remembered.
        var generation = 0

        mutating func apply(_ keys: [LoadedKey], imported: [JWT.Key], secretKey: JWT.HS256Key) {
            verified = [:]
            generation += 1
            self.keys = keys
            importedKeys = imported
            verificationKeys = [.hs256(secretKey)] + keys.map { .es256($0.key) } + imported
            // The imported verify-only keys too: a JWKS consumer (supabase-js `getClaims()`, an
            // app's own backend) must verify every token this server accepts, and tokens the
            // hosted project issued stay in use until they expire after the move.
            let published = keys.map(\.key.publicJWK) + imported.compactMap(\.publicJWK)
            jwks = Array(("{\"keys\":[" + published.joined(separator: ",") + "]}").utf8)
            loaded = true
        }
    }

    private let keySet: Mutex<KeySet>

    /// An issuer that signs with `secret` (HS256) until ES256 keys are installed.
    public init(secret: String, issuer: String, lifetime: Int, acceptedIssuers: [String] = []) {
        secretKey = JWT.HS256Key(secret: secret)
        self.issuer = issuer
        self.acceptedIssuers = Set(acceptedIssuers)
        self.lifetime = lifetime
        keySet = Mutex(KeySet(verificationKeys: [.hs256(secretKey)]))
    }

    /// The ES256 keys in use, newest first.
    public var keys: [LoadedKey] { keySet.withLock { $0.keys } }

    /// Tokens remembered as verified now.
    var verifiedCount: Int { keySet.withLock { $0.verified.count } }

    /// Whether keys have been loaded from the database at least once.
    public var hasLoadedKeys: Bool { keySet.withLock { $0.loaded } }

    /// `{"keys":[…]}`: the public JWKs of every ES256 key in use (pending ones included, so
    /// verifiers know a key before it signs), then the imported verify-only keys (ES256,
    /// RS256) whose tokens this server still accepts.
    public var jwks: [UInt8] { keySet.withLock { $0.jwks } }

    /// The ES256 key that signs at `now` (Unix seconds), or nil when HS256 signs.
    public func signingKey(at now: Int64) -> JWT.ES256Key? {
        keySet.withLock { set in set.keys.first { $0.signsFrom <= Double(now) }?.key }
    }

    /// Replaces the ES256 keys (newest first) and the imported verify-only keys at once.
    public func install(_ keys: [LoadedKey], imported: [JWT.Key] = []) {
        keySet.withLock { set in
            set.reloadsStarted += 1
            set.installedReload = set.reloadsStarted
            set.apply(keys, imported: imported, secretKey: secretKey)
        }
    }

    /// The imported verify-only keys in use.
    public var importedKeys: [JWT.Key] { keySet.withLock { $0.importedKeys } }

    /// What a reload found.
    public struct ReloadResult: Sendable {
        /// The keys now in use, newest first.
        public var keys: [LoadedKey]
        /// Keys whose stored private key could not be read (left out), with the reason.
        public var unreadable: [(keyID: String, reason: String)]
        /// Of those, the keys the key encryption key did not open (none set, the wrong one,
        /// still in plaintext): a configuration problem `serve` refuses to start with.
        public var undecryptable: [(keyID: String, reason: SigningKeyStore.KeyLoadError)] = []
    }

    /// Reads the non-retired keys from `store` and installs them (the database work runs
    /// on the pool's threads). Keys that cannot be read are left out and reported.
    @discardableResult
    public func reload(from store: SigningKeyStore) async throws -> ReloadResult {
        let ticket = keySet.withLock { set in
            set.reloadsStarted += 1
            return set.reloadsStarted
        }
        let rows = try await store.activeKeys()
        let imported = try await store.importedKeys()
        let now = Date().timeIntervalSince1970
        var keys: [LoadedKey] = []
        var unreadable: [(keyID: String, reason: String)] = []
        var undecryptable: [(keyID: String, reason: SigningKeyStore.KeyLoadError)] = []
        for row in rows {
            do {
                let pem = try row.privateKeyPEM.get()
                let key = try JWT.ES256Key(privateKeyPEM: pem, keyID: row.keyID)
                keys.append(LoadedKey(key: key, signsFrom: now - row.age + SigningKeyStore.activationDelay))
            } catch {
                unreadable.append((row.keyID, "\(error)"))
                if let reason = error as? SigningKeyStore.KeyLoadError { undecryptable.append((row.keyID, reason)) }
            }
        }
        keySet.withLock { set in
            guard ticket > set.installedReload else { return }
            set.installedReload = ticket
            set.apply(keys, imported: imported.keys, secretKey: secretKey)
        }
        unreadable += imported.unreadable
        return ReloadResult(keys: keys, unreadable: unreadable, undecryptable: undecryptable)
    }

    /// A signed access token for `user` in `sessionID`, and its expiry.
    func accessToken(for user: UserRecord, sessionID: UUID, now: Int64) -> (token: String, expiresAt: Int64) {
        let expiresAt = now + Int64(lifetime)
        var writer = JSONWriter(capacity: 512)
        writer.beginObject()
        writer.string("iss", issuer)
        writer.string("sub", UUIDText.lowercase(user.id))
        writer.string("aud", "authenticated")
        writer.int("exp", expiresAt)
        writer.int("iat", now)
        writer.string("email", user.email)
        writer.string("phone", "")
        writer.raw("app_metadata", Array(#"{"provider":"email","providers":["email"]}"#.utf8))
        writer.raw("user_metadata", user.metadata)
        writer.string("role", "authenticated")
        writer.string("aal", "aal1")
        writer.beginArray("amr")
        writer.beginObject()
        writer.string("method", "otp")
        writer.int("timestamp", now)
        writer.endObject()
        writer.endArray()
        writer.string("session_id", UUIDText.lowercase(sessionID))
        writer.bool("is_anonymous", false)
        writer.endObject()
        if let key = signingKey(at: now), let token = try? JWT.sign(payload: writer.bytes, with: key) {
            return (token, expiresAt)
        }
        // HS256 also when ES256 signing fails (OpenSSL out of memory): the secret verifies
        // on every instance, so the caller's session is never lost to a signing fault.
        return (JWT.sign(payload: writer.bytes, with: secretKey), expiresAt)
    }

    /// The claims `verify` reads, from the payload's bytes with the one JSON parser (no
    /// Foundation decoding on the hot path). A repeated claim makes the token ambiguous:
    /// refused; so does a claim of the wrong type (`iss` a number, `iat` a string).
    ///
    /// The payload's signature was checked before it is read: every claim in it was written
    /// by a key this server trusts. Claims it does not read (`user_metadata` above all, which
    /// the user writes and PostgreSQL prints: `1e300` as 301 digits) are only skipped, at
    /// the nesting the request bodies allow, and never refused for their values: a token this
    /// server issued always verifies here.
    struct Claims: Equatable {
        var sub: String
        var exp: Double
        var iss: String?
        var iat: Double?
        var nbf: Double?
        var audiences: [String] = []
        var sessionID: String?

        static func parse(_ payload: [UInt8]) -> Claims? {
            payload.withUnsafeBufferPointer { buffer -> Claims? in
                var scanner = JSONScanner(buffer, limits: JSONLimits(maxStringBytes: 4096))
                var sub: String?
                var iss: String?
                var exp: Double?
                var iat: Double?
                var nbf: Double?
                var audiences: [String]?
                var sessionID: String?? = nil
                var valid = true
                /// A string claim, once.
                func string(_ claim: inout String?, _ scanner: inout JSONScanner) throws(JSONScanner.Failure) {
                    if claim != nil || scanner.peek() != UInt8(ascii: "\"") {
                        valid = false
                        try scanner.skipValue()
                    } else {
                        claim = try scanner.string()
                    }
                }
                /// A NumericDate claim (seconds, JSON number), once.
                func number(_ claim: inout Double?, _ scanner: inout JSONScanner) throws(JSONScanner.Failure) {
                    let range = try scanner.skipValue()
                    if claim != nil { valid = false }
                    claim = Double(String(decoding: scanner.slice(range), as: UTF8.self))
                    if claim == nil { valid = false }
                }
                do throws(JSONScanner.Failure) {
                    guard scanner.peek() == UInt8(ascii: "{") else { return nil }
                    try scanner.object { (scanner: inout JSONScanner, key: String) throws(JSONScanner.Failure) in
                        switch key {
                        case "sub": try string(&sub, &scanner)
                        case "iss": try string(&iss, &scanner)
                        case "exp": try number(&exp, &scanner)
                        case "iat": try number(&iat, &scanner)
                        case "nbf": try number(&nbf, &scanner)
                        case "aud":
                            if audiences != nil { valid = false }
                            if scanner.peek() == UInt8(ascii: "[") {
                                var list: [String] = []
                                try scanner.array { (scanner: inout JSONScanner, _: Int) throws(JSONScanner.Failure) in
                                    if scanner.peek() == UInt8(ascii: "\"") {
                                        list.append(try scanner.string())
                                    } else {
                                        try scanner.skipValue()
                                        valid = false
                                    }
                                }
                                audiences = list
                            } else if scanner.peek() == UInt8(ascii: "\"") {
                                audiences = [try scanner.string()]
                            } else {
                                let range = try scanner.skipValue()
                                if scanner.slice(range) != Array("null".utf8) { valid = false }
                                audiences = []
                            }
                        case "session_id":
                            if sessionID != nil { valid = false }
                            if scanner.peek() == UInt8(ascii: "\"") {
                                sessionID = .some(try scanner.string())
                            } else {
                                let range = try scanner.skipValue()
                                if scanner.slice(range) != Array("null".utf8) { valid = false }
                                sessionID = .some(nil)
                            }
                        default:
                            // A value refused in a claim read so far still refuses the token.
                            if scanner.takeViolation() != nil { valid = false }
                            try scanner.skipValue()
                            _ = scanner.takeViolation()
                        }
                    }
                    try scanner.expectEnd()
                } catch {
                    return nil
                }
                guard valid, scanner.takeViolation() == nil, let sub, let exp else { return nil }
                return Claims(
                    sub: sub, exp: exp, iss: iss, iat: iat, nbf: nbf, audiences: audiences ?? [],
                    sessionID: sessionID ?? nil)
            }
        }
    }

    /// Verifies the signature (HS256 with the secret, or ES256 with a key in use named by the
    /// token's `kid`, or an imported key) and the claims, as strictly on every route (this is
    /// the only place tokens are checked): `iss` is this server's issuer or an accepted one; `aud` includes `authenticated`;
    /// `exp` has not passed; `iat` is present and `nbf`, if present, is not in the future
    /// (each with `leeway` for clock skew); `sub` and `session_id` are UUIDs. Returns the
    /// claims. Whether the session was revoked is the authentication stage's question.
    public func verify(_ token: String, now: Int64) throws(APIError) -> AccessClaims {
        let (cached, keys, generation) = keySet.withLock { set in
            (set.verified[token], set.verificationKeys, set.generation)
        }
        if let cached {
            guard cached.expiresAt + Self.leeway >= now else { throw AuthError.badJWT }
            return cached
        }
        let payload: [UInt8]
        do {
            payload = try JWT.verify(token, keys: keys)
        } catch {
            throw AuthError.badJWT
        }
        guard let claims = Claims.parse(payload), let iss = claims.iss, iss == issuer || acceptedIssuers.contains(iss),
            let user = UUIDText.parse(claims.sub),
            let session = claims.sessionID.flatMap(UUIDText.parse), claims.audiences.contains("authenticated"),
            let expiry = Self.seconds(claims.exp), expiry + Self.leeway >= now,
            let issuedAt = claims.iat.flatMap(Self.seconds), issuedAt <= now + Self.leeway,
            claims.nbf.map({ Self.seconds($0).map { $0 <= now + Self.leeway } ?? false }) ?? true
        else { throw AuthError.badJWT }
        let verified = AccessClaims(userID: user, sessionID: session, expiresAt: expiry)
        guard token.utf8.count <= KeySet.verifiedTokenMaxBytes else { return verified }
        keySet.withLock { set in
            // Only for the keys it was checked with: a reload in between leaves it out.
            guard set.generation == generation else { return }
            if set.verified.count >= KeySet.verifiedCapacity { set.verified.removeAll(keepingCapacity: true) }
            set.verified[token] = verified
        }
        return verified
    }

    /// A NumericDate as whole seconds, or nil when it is not a plausible time.
    private static func seconds(_ value: Double) -> Int64? {
        guard value.isFinite, abs(value) < 1e15 else { return nil }
        return Int64(value)
    }
}
