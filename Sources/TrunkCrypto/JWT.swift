import JSON

/// Compact JWS (JWT) signing and verification for HS256 and ES256.
///
/// This layer checks only the envelope: structure, the `alg` (never `none`), the `kid`,
/// the key's type against the `alg`, and the signature (HMACs compared in constant time).
/// Claims (`exp`, `aud`, …) are the caller's to check, on the payload bytes this returns.
public enum JWT {
    /// The signature algorithms accepted (`alg`).
    public enum Algorithm: String, Sendable {
        /// HMAC-SHA-256 with a shared secret.
        case hs256 = "HS256"
        /// ECDSA on P-256 with SHA-256.
        case es256 = "ES256"
        /// RSASSA-PKCS1-v1_5 with SHA-256 (verification only: imported public keys).
        case rs256 = "RS256"
    }

    /// A key that signs and verifies HS256 tokens.
    public struct HS256Key: Sendable {
        /// The key id put in the header (`kid`), if any.
        public let keyID: String?
        let secret: [UInt8]

        /// A key from a shared secret (its UTF-8 bytes are the HMAC key, as Supabase does).
        public init(secret: String, keyID: String? = nil) {
            self.secret = Array(secret.utf8)
            self.keyID = keyID
        }
    }

    /// A verification key of either kind. A token is checked only against keys whose
    /// algorithm is its `alg`, so an HMAC can never pass for an ECDSA signature or the reverse.
    public enum Key: Sendable {
        /// A shared secret (`alg: HS256`).
        case hs256(HS256Key)
        /// A P-256 key (`alg: ES256`).
        case es256(ES256Key)
        /// An RSA public key (`alg: RS256`), verification only.
        case rs256(RS256Key)

        /// The key's `kid`, if any.
        public var keyID: String? {
            switch self {
            case .hs256(let key): return key.keyID
            case .es256(let key): return key.keyID
            case .rs256(let key): return key.keyID
            }
        }

        /// The public key as a JWK, for a JWKS; nil for a shared secret (never published).
        public var publicJWK: String? {
            switch self {
            case .hs256: return nil
            case .es256(let key): return key.publicJWK
            case .rs256(let key): return key.publicJWK
            }
        }

        /// The one algorithm this key is used with.
        public var algorithm: Algorithm {
            switch self {
            case .hs256: return .hs256
            case .es256: return .es256
            case .rs256: return .rs256
            }
        }
    }

    /// Why a token was rejected. Descriptions are safe to log (they never contain the token).
    public enum VerificationError: Error, Equatable, CustomStringConvertible {
        /// Not three base64url segments, or a header without a string `alg`.
        case malformed
        /// `alg` is not `HS256`, `ES256` or `RS256` (`none` included).
        case unsupportedAlgorithm(String)
        /// No key has the token's `kid` (or, without `kid`, no key lacks one).
        case unknownKey
        /// The keys with the token's `kid` are of another algorithm than its `alg`.
        case algorithmMismatch
        /// No key of the token's `kid` and `alg` made its signature.
        case badSignature

        public var description: String {
            switch self {
            case .malformed: return "token is not a well-formed JWT"
            case .unsupportedAlgorithm(let alg): return "token algorithm \(alg) is not accepted"
            case .unknownKey: return "token signed with an unknown key"
            case .algorithmMismatch: return "token algorithm does not match its key's"
            case .badSignature: return "token signature is invalid"
            }
        }
    }

    /// Signs `payload` (UTF-8 JSON of the claims) and returns `header.payload.signature`.
    public static func sign(payload: [UInt8], with key: HS256Key) -> String {
        var header = #"{"alg":"HS256","typ":"JWT""#
        if let keyID = key.keyID { header += #","kid":"# + jsonQuoted(keyID) }
        header += "}"
        let signingInput = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(payload)
        let signature = HMAC.sha256(key: key.secret, message: Array(signingInput.utf8))
        return signingInput + "." + Base64URL.encode(signature)
    }

    /// Signs `payload` with an ES256 key and returns `header.payload.signature`; the header
    /// carries the key's `kid`.
    public static func sign(payload: [UInt8], with key: ES256Key) throws(KeyError) -> String {
        var header = #"{"alg":"ES256","typ":"JWT""#
        if let keyID = key.keyID { header += #","kid":"# + jsonQuoted(keyID) }
        header += "}"
        let signingInput = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(payload)
        let signature = try key.signature(for: signingInput.utf8)
        return signingInput + "." + Base64URL.encode(signature)
    }

    /// Verifies a token against HS256 keys and returns its payload bytes.
    public static func verify(_ token: String, keys: [HS256Key]) throws(VerificationError) -> [UInt8] {
        try verify(token, keys: keys.map(Key.hs256))
    }

    /// Verifies a token against the accepted keys and returns its payload bytes.
    ///
    /// The header's `alg` must be `HS256`, `ES256` or `RS256` (never `none`). A token with a
    /// `kid` must name one of `keys`; one without is tried against the keys that have no id.
    /// Of those, only keys of the token's algorithm are used. One exception: an HS256 token
    /// whose `kid` names no key is tried against the HS256 keys without an id, because
    /// hosted Supabase projects put a `kid` on tokens signed with their one shared secret
    /// (an HMAC key has no public identity; the `kid` is only a hint).
    public static func verify(_ token: String, keys: [Key]) throws(VerificationError) -> [UInt8] {
        let parts = token.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3, let headerBytes = Base64URL.decode(parts[0]), let payload = Base64URL.decode(parts[1]),
            let signature = Base64URL.decode(parts[2])
        else { throw .malformed }
        let header = try parseHeader(headerBytes)
        guard let algorithm = Algorithm(rawValue: header.alg) else { throw .unsupportedAlgorithm(header.alg) }
        var named = keys.filter { $0.keyID == header.kid }
        if named.isEmpty, header.kid != nil, algorithm == .hs256 {
            named = keys.filter { $0.keyID == nil && $0.algorithm == .hs256 }
        }
        guard !named.isEmpty else { throw .unknownKey }
        let signingInput = token.utf8.prefix(parts[0].count + 1 + parts[1].count)
        var matchedAlgorithm = false
        for key in named where key.algorithm == algorithm {
            matchedAlgorithm = true
            switch key {
            case .hs256(let key):
                if constantTimeEquals(HMAC.sha256(key: key.secret, message: signingInput), signature) { return payload }
            case .es256(let key):
                if key.isValidSignature(signature, for: signingInput) { return payload }
            case .rs256(let key):
                if key.isValidSignature(signature, for: signingInput) { return payload }
            }
        }
        throw matchedAlgorithm ? .badSignature : .algorithmMismatch
    }

    struct Header {
        var alg: String
        var kid: String?
    }

    /// Reads `alg` and `kid` from a header with the one JSON parser. A repeated member makes
    /// the header ambiguous: refused.
    static func parseHeader(_ bytes: [UInt8]) throws(VerificationError) -> Header {
        let members = bytes.withUnsafeBufferPointer { buffer -> [String: String]? in
            var scanner = JSONScanner(buffer, limits: JSONLimits(maxDepth: 8, maxStringBytes: 1024, maxBytes: 8 * 1024))
            var strings: [String: String] = [:]
            var keys = Set<String>()
            var valid = true
            do throws(JSONScanner.Failure) {
                guard scanner.peek() == UInt8(ascii: "{") else { return nil }
                try scanner.object { (scanner: inout JSONScanner, key: String) throws(JSONScanner.Failure) in
                    if !keys.insert(key).inserted { valid = false }
                    if scanner.peek() == UInt8(ascii: "\"") {
                        strings[key] = try scanner.string()
                    } else {
                        try scanner.skipValue(depth: 1)
                    }
                }
                try scanner.expectEnd()
            } catch {
                return nil
            }
            return valid && scanner.takeViolation() == nil ? strings : nil
        }
        guard let members, let alg = members["alg"] else { throw .malformed }
        return Header(alg: alg, kid: members["kid"])
    }

    static func jsonQuoted(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case _ where scalar.value < 0x20: out += "?"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
