import TrunkCrypto

/// The key that encrypts the ES256 private keys stored in `signing_keys`
/// (`TRUNK_SYNC_KEY_ENCRYPTION_KEY`): AES-256-GCM under a key derived from the configured
/// secret with HKDF-SHA-256 (RFC 5869), so any secret `SecretRules` accepts will do, and the
/// database never holds what decrypts its keys.
public struct KeyEncryptionKey: Sendable {
    private let key: [UInt8]

    /// Format byte of sealed keys; a later scheme would take 2.
    static let version: UInt8 = 1

    /// Derives the AES key from `secret` (its UTF-8 bytes).
    public init(secret: String) {
        // HKDF-Extract with a fixed salt, then one block of HKDF-Expand naming the purpose.
        let pseudorandom = HMAC.sha256(
            key: Array("trunk-sync key encryption salt v1".utf8), message: Array(secret.utf8))
        key = HMAC.sha256(key: pseudorandom, message: Array("signing_keys.private_key_sealed v1".utf8) + [1])
    }

    /// The associated data of a key: its row, so a sealed key cannot be moved to another kid.
    static func associatedData(keyID: String) -> [UInt8] { Array("trunk-sync signing key \(keyID)".utf8) }

    /// Encrypts a private key PEM for the row `keyID`: version ‖ nonce ‖ ciphertext ‖ tag.
    public func seal(privateKeyPEM: String, keyID: String) throws -> [UInt8] {
        [Self.version]
            + (try AESGCM.seal(Array(privateKeyPEM.utf8), key: key, associatedData: Self.associatedData(keyID: keyID)))
    }

    /// Decrypts what `seal` made for `keyID`.
    /// - Throws: `SigningKeyStore.KeyLoadError.wrongKeyEncryptionKey` when this is not the key
    ///   it was sealed with (or the bytes were changed).
    public func open(_ sealed: [UInt8], keyID: String) throws(SigningKeyStore.KeyLoadError) -> String {
        guard sealed.first == Self.version else { throw .wrongKeyEncryptionKey }
        do {
            let plaintext = try AESGCM.open(
                Array(sealed.dropFirst()), key: key, associatedData: Self.associatedData(keyID: keyID))
            return String(decoding: plaintext, as: UTF8.self)
        } catch {
            throw .wrongKeyEncryptionKey
        }
    }
}
