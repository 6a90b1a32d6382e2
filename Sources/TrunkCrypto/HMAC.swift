/// HMAC (RFC 2104) message authentication codes.
///
/// An HS256 JWT signature is `HMAC.sha256(key: secret, message: signingInput)` where
/// `signingInput` is `Base64URL.encode(header) + "." + Base64URL.encode(payload)`.
/// Compare codes with `constantTimeEquals(_:_:)`, never with `==`.
public enum HMAC {
    /// Returns HMAC-SHA256 of `message` under `key` (32 bytes). Keys of any length are
    /// accepted; keys longer than 64 bytes are hashed first, as RFC 2104 specifies.
    public static func sha256(key: some Collection<UInt8>, message: some Collection<UInt8>) -> [UInt8] {
        // Built on `SHA256` rather than OpenSSL's HMAC()/EVP_MAC, which allocate, look the
        // algorithm up on every call and can report failure; this cannot fail.
        let blockByteCount = SHA256.blockByteCount
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: blockByteCount) { block in
            block.initialize(repeating: 0)
            let keyCount = key.count
            if keyCount > blockByteCount {
                let digest = SHA256.hash(key)
                _ = block.update(fromContentsOf: digest)
            } else if keyCount > 0 {
                withContiguousBytes(key) { keyBytes in
                    _ = block.update(fromContentsOf: keyBytes)
                }
            }

            for index in block.indices { block[index] ^= 0x36 }
            var inner = SHA256()
            inner.update(UnsafeBufferPointer(block))
            inner.update(message)

            // Turns the inner pad (key ⊕ 0x36) into the outer pad (key ⊕ 0x5c) in place.
            for index in block.indices { block[index] ^= 0x36 ^ 0x5c }
            var outer = SHA256()
            outer.update(UnsafeBufferPointer(block))
            outer.update(inner.finalize())
            return outer.finalize()
        }
    }

    /// Returns HMAC-SHA256 of the UTF-8 encoding of `message` under `key` (32 bytes).
    public static func sha256(key: some Collection<UInt8>, message: String) -> [UInt8] {
        sha256(key: key, message: message.utf8)
    }
}
