internal import COpenSSL

extension JWT {
    /// Why an ES256 key could not be made, read, written or used. Descriptions name the
    /// failed step and never contain key material.
    public enum KeyError: Error, Equatable, CustomStringConvertible {
        /// The text is not an unencrypted PEM private key.
        case unreadablePrivateKey
        /// The key is not an elliptic-curve key on P-256.
        case notP256
        /// The public coordinates are not a point on P-256.
        case invalidPublicKey
        /// Signing needs the private key; this key has only the public part.
        case noPrivateKey
        /// OpenSSL failed (out of memory, …) in the named function.
        case cryptoFailure(String)

        public var description: String {
            switch self {
            case .unreadablePrivateKey: return "not an unencrypted PEM private key"
            case .notP256: return "not an elliptic-curve key on P-256"
            case .invalidPublicKey: return "the public key is not a point on P-256"
            case .noPrivateKey: return "the key has no private part"
            case .cryptoFailure(let function): return "OpenSSL failed in \(function)"
            }
        }
    }

    /// An ECDSA P-256 key for ES256 tokens (RFC 7518 §3.4): a private key signs and
    /// verifies; a public key (from a JWK's `x` and `y`) only verifies.
    ///
    /// Values are immutable and safe to use from any thread at once (OpenSSL 3 allows
    /// concurrent signing and verification with one fully built `EVP_PKEY`).
    public struct ES256Key: Sendable {
        /// The key id put in the header (`kid`) and the JWK, if any.
        public let keyID: String?
        /// The public point's x coordinate, 32 big-endian bytes.
        public let x: [UInt8]
        /// The public point's y coordinate, 32 big-endian bytes.
        public let y: [UInt8]
        /// Whether this key can sign (it holds the private scalar).
        public let hasPrivateKey: Bool
        let handle: EVPKey

        /// Generates a new random P-256 key pair.
        public static func generate(keyID: String? = nil) throws(KeyError) -> ES256Key {
            guard let context = EVP_PKEY_CTX_new_id(EVP_PKEY_EC, nil) else {
                throw failure("EVP_PKEY_CTX_new_id")
            }
            defer { EVP_PKEY_CTX_free(context) }
            guard EVP_PKEY_keygen_init(context) == 1,
                trunk_EVP_PKEY_CTX_set_ec_paramgen_curve_nid(context, NID_X9_62_prime256v1) == 1
            else { throw failure("EVP_PKEY_keygen_init") }
            var generated: OpaquePointer?
            guard EVP_PKEY_keygen(context, &generated) == 1, let generated else { throw failure("EVP_PKEY_keygen") }
            return try ES256Key(adopting: EVPKey(generated), keyID: keyID, hasPrivateKey: true)
        }

        /// Reads a private key from PEM: PKCS#8 (`BEGIN PRIVATE KEY`, what `privateKeyPEM()`
        /// writes) or SEC 1 (`BEGIN EC PRIVATE KEY`). Encrypted keys are refused (no prompt).
        public init(privateKeyPEM pem: String, keyID: String? = nil) throws(KeyError) {
            let bytes = Array(pem.utf8)
            guard !bytes.isEmpty, bytes.count < Int(Int32.max) else { throw .unreadablePrivateKey }
            let loaded: OpaquePointer? = bytes.withUnsafeBytes { buffer in
                guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
                defer { BIO_free(bio) }
                // A callback that refuses: without one, OpenSSL would prompt on the terminal
                // for the passphrase of an encrypted key.
                return PEM_read_bio_PrivateKey(bio, nil, { _, _, _, _ in -1 }, nil)
            }
            guard let loaded else {
                ERR_clear_error()
                throw .unreadablePrivateKey
            }
            try self.init(adopting: EVPKey(loaded), keyID: keyID, hasPrivateKey: true)
        }

        /// A verification-only key from a public point (a JWK's `x` and `y`, 32 bytes each).
        public init(publicX x: [UInt8], y: [UInt8], keyID: String? = nil) throws(KeyError) {
            guard x.count == 32, y.count == 32 else { throw .invalidPublicKey }
            // SubjectPublicKeyInfo { id-ecPublicKey, prime256v1 } + BIT STRING 04‖x‖y.
            let der = Self.subjectPublicKeyInfoPrefix + [0x04] + x + y
            let loaded: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
                var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
                return d2i_PUBKEY(nil, &cursor, buffer.count)
            }
            guard let loaded else {
                ERR_clear_error()
                throw .invalidPublicKey
            }
            try self.init(adopting: EVPKey(loaded), keyID: keyID, hasPrivateKey: false)
        }

        /// The DER before the 65-byte uncompressed point of a P-256 SubjectPublicKeyInfo.
        static let subjectPublicKeyInfoPrefix: [UInt8] = [
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48,
            0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
        ]

        private init(adopting handle: EVPKey, keyID: String?, hasPrivateKey: Bool) throws(KeyError) {
            let pointer = handle.pointer
            guard EVP_PKEY_get_base_id(pointer) == EVP_PKEY_EC else { throw .notP256 }
            var name = [CChar](repeating: 0, count: 64)
            var nameLength = 0
            guard EVP_PKEY_get_group_name(pointer, &name, name.count, &nameLength) == 1 else {
                ERR_clear_error()
                throw .notP256
            }
            let group = String(decoding: name.prefix(nameLength).map { UInt8(bitPattern: $0) }, as: UTF8.self)
            guard group == "prime256v1" || group == "P-256" else { throw .notP256 }
            self.handle = handle
            self.keyID = keyID
            self.hasPrivateKey = hasPrivateKey
            x = try Self.coordinate(pointer, "qx")  // OSSL_PKEY_PARAM_EC_PUB_X
            y = try Self.coordinate(pointer, "qy")  // OSSL_PKEY_PARAM_EC_PUB_Y
        }

        private init(copying other: ES256Key, keyID: String?) {
            handle = other.handle
            self.keyID = keyID
            hasPrivateKey = other.hasPrivateKey
            x = other.x
            y = other.y
        }

        private static func coordinate(_ pointer: OpaquePointer, _ name: String) throws(KeyError) -> [UInt8] {
            var number: OpaquePointer?
            guard EVP_PKEY_get_bn_param(pointer, name, &number) == 1, let number else {
                ERR_clear_error()
                throw failure("EVP_PKEY_get_bn_param")
            }
            defer { BN_free(number) }
            var bytes = [UInt8](repeating: 0, count: 32)
            guard BN_bn2binpad(number, &bytes, 32) == 32 else { throw failure("BN_bn2binpad") }
            return bytes
        }

        /// The same key under another `kid`.
        public func withKeyID(_ keyID: String?) -> ES256Key { ES256Key(copying: self, keyID: keyID) }

        /// The private key as unencrypted PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`).
        public func privateKeyPEM() throws(KeyError) -> String {
            guard hasPrivateKey else { throw .noPrivateKey }
            guard let bio = BIO_new(BIO_s_mem()) else { throw Self.failure("BIO_new") }
            defer { BIO_free(bio) }
            guard PEM_write_bio_PKCS8PrivateKey(bio, handle.pointer, nil, nil, 0, nil, nil) == 1 else {
                throw Self.failure("PEM_write_bio_PKCS8PrivateKey")
            }
            let count = Int(BIO_ctrl_pending(bio))
            var pem = [UInt8](repeating: 0, count: count)
            guard count > 0, count < Int(Int32.max), BIO_read(bio, &pem, Int32(count)) == Int32(count) else {
                throw Self.failure("BIO_read")
            }
            return String(decoding: pem, as: UTF8.self)
        }

        /// The RFC 7638 thumbprint: base64url SHA-256 of `{"crv","kty","x","y"}` in that
        /// order (43 characters). Stable for the key, so it makes a good `kid`.
        public var thumbprint: String {
            let members =
                #"{"crv":"P-256","kty":"EC","x":""# + Base64URL.encode(x) + #"","y":""# + Base64URL.encode(y) + #""}"#
            return Base64URL.encode(SHA256.hash(members))
        }

        /// The public key as a JWK (RFC 7517): `kty`, `crv`, `x`, `y`, `kid` (when set),
        /// `alg` and `use`, compact JSON. Never contains the private scalar.
        public var publicJWK: String {
            var jwk =
                #"{"kty":"EC","crv":"P-256","x":""# + Base64URL.encode(x) + #"","y":""# + Base64URL.encode(y) + "\""
            if let keyID { jwk += #","kid":"# + JWT.jsonQuoted(keyID) }
            return jwk + #","alg":"ES256","use":"sig"}"#
        }

        /// Signs `message` (SHA-256, then ECDSA) and returns the JOSE signature `r‖s` (64 bytes).
        public func signature(for message: some Collection<UInt8>) throws(KeyError) -> [UInt8] {
            guard hasPrivateKey else { throw .noPrivateKey }
            guard let context = EVP_MD_CTX_new() else { throw Self.failure("EVP_MD_CTX_new") }
            defer { EVP_MD_CTX_free(context) }
            guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, handle.pointer) == 1 else {
                throw Self.failure("EVP_DigestSignInit")
            }
            var der = [UInt8](repeating: 0, count: 80)  // a P-256 DER signature is at most 72 bytes
            var length = der.count
            let signed = withContiguousBytes(message) { input in
                EVP_DigestSign(context, &der, &length, input.baseAddress, input.count)
            }
            guard signed == 1, length <= der.count else { throw Self.failure("EVP_DigestSign") }
            guard let raw = ECDSASignature.raw(fromDER: der[..<length]) else { throw Self.failure("EVP_DigestSign") }
            return raw
        }

        /// Whether `signature` (JOSE `r‖s`, 64 bytes) is this key's signature of `message`.
        public func isValidSignature(_ signature: some Collection<UInt8>, for message: some Collection<UInt8>) -> Bool {
            guard let der = ECDSASignature.der(fromRaw: signature), let context = EVP_MD_CTX_new() else { return false }
            defer { EVP_MD_CTX_free(context) }
            let valid = withContiguousBytes(message) { input in
                EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, handle.pointer) == 1
                    && EVP_DigestVerify(context, der, der.count, input.baseAddress, input.count) == 1
            }
            // A rejected signature can leave entries on this thread's OpenSSL error queue,
            // where a later TLS call on the same thread would mistake them for its own.
            if !valid { ERR_clear_error() }
            return valid
        }

        private static func failure(_ function: String) -> KeyError {
            ERR_clear_error()
            return .cryptoFailure(function)
        }
    }
}

/// Owns one `EVP_PKEY`. Never mutated after creation; OpenSSL reference-counts and locks
/// what it caches inside, so sharing it across threads is safe.
final class EVPKey: @unchecked Sendable {
    let pointer: OpaquePointer

    init(_ pointer: OpaquePointer) { self.pointer = pointer }

    deinit { EVP_PKEY_free(pointer) }
}
