internal import COpenSSL

extension JWT {
    /// An RSA public key for RS256 tokens (RFC 7518 §3.3: RSASSA-PKCS1-v1_5 with SHA-256),
    /// verification only: trunk-sync never signs with RSA; it accepts the tokens another
    /// issuer (a hosted Supabase project on asymmetric keys) signed, from its published JWK.
    public struct RS256Key: Sendable {
        /// The key id (`kid`), if any.
        public let keyID: String?
        /// The modulus's size in bits.
        public let bits: Int
        let handle: EVPKey
        /// The JWK's `n` and `e` (leading zero bytes dropped), base64url: for `publicJWK`.
        let modulusText: String
        let exponentText: String

        /// Smallest modulus accepted: shorter RSA keys are breakable.
        public static let minimumBits = 2048
        /// Largest modulus accepted, bounding the work one verification costs.
        public static let maximumBits = 8192

        /// A key from a JWK's `n` (modulus) and `e` (public exponent), big-endian bytes.
        public init(modulus n: [UInt8], exponent e: [UInt8], keyID: String? = nil) throws(KeyError) {
            let modulus = Array(n.drop { $0 == 0 })
            let exponent = Array(e.drop { $0 == 0 })
            guard modulus.count * 8 >= Self.minimumBits, modulus.count * 8 <= Self.maximumBits, !exponent.isEmpty,
                exponent.count <= 8, exponent.last.map({ $0 & 1 == 1 }) ?? false
            else { throw .invalidPublicKey }
            // SubjectPublicKeyInfo { rsaEncryption, NULL } + BIT STRING { RSAPublicKey { n, e } }.
            let rsaPublicKey = DER.sequence(DER.integer(modulus) + DER.integer(exponent))
            let algorithm: [UInt8] = [
                0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
            ]
            let der = DER.sequence(algorithm + DER.element(0x03, [0x00] + rsaPublicKey))
            let loaded: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
                var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
                return d2i_PUBKEY(nil, &cursor, buffer.count)
            }
            guard let loaded else {
                ERR_clear_error()
                throw .invalidPublicKey
            }
            let key = EVPKey(loaded)
            guard EVP_PKEY_get_base_id(loaded) == EVP_PKEY_RSA else { throw .invalidPublicKey }
            handle = key
            bits = Int(EVP_PKEY_get_bits(loaded))
            self.keyID = keyID
            modulusText = Base64URL.encode(modulus)
            exponentText = Base64URL.encode(exponent)
        }

        /// The public key as a JWK (RFC 7517): `kty`, `n`, `e`, `kid` (when set), `alg` and
        /// `use`, compact JSON, for a JWKS that lists the keys a server verifies with.
        public var publicJWK: String {
            var jwk = #"{"kty":"RSA","n":""# + modulusText + #"","e":""# + exponentText + "\""
            if let keyID { jwk += #","kid":"# + JWT.jsonQuoted(keyID) }
            return jwk + #","alg":"RS256","use":"sig"}"#
        }

        /// Whether `signature` is this key's RS256 signature of `message`.
        public func isValidSignature(_ signature: some Collection<UInt8>, for message: some Collection<UInt8>) -> Bool {
            let signature = Array(signature)
            guard signature.count == (bits + 7) / 8, let context = EVP_MD_CTX_new() else { return false }
            defer { EVP_MD_CTX_free(context) }
            let valid = withContiguousBytes(message) { input in
                EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, handle.pointer) == 1
                    && EVP_DigestVerify(context, signature, signature.count, input.baseAddress, input.count) == 1
            }
            if !valid { ERR_clear_error() }
            return valid
        }
    }
}

/// The few DER encodings a public key needs (definite lengths, short or long form).
enum DER {
    static func element(_ tag: UInt8, _ content: [UInt8]) -> [UInt8] {
        [tag] + length(content.count) + content
    }

    static func sequence(_ content: [UInt8]) -> [UInt8] { element(0x30, content) }

    /// An unsigned big-endian integer (a `0x00` put in front when the high bit is set).
    static func integer(_ magnitude: [UInt8]) -> [UInt8] {
        var bytes = Array(magnitude.drop { $0 == 0 })
        if bytes.isEmpty { bytes = [0] }
        if let first = bytes.first, first & 0x80 != 0 { bytes.insert(0, at: 0) }
        return element(0x02, bytes)
    }

    static func length(_ count: Int) -> [UInt8] {
        if count < 0x80 { return [UInt8(count)] }
        var bytes: [UInt8] = []
        var rest = count
        while rest > 0 {
            bytes.insert(UInt8(rest & 0xff), at: 0)
            rest >>= 8
        }
        return [0x80 | UInt8(bytes.count)] + bytes
    }
}
