internal import COpenSSL

/// AES-256-GCM (NIST SP 800-38D) through OpenSSL's EVP interface: authenticated encryption
/// of small secrets at rest, such as the ES256 private keys in the database.
///
/// `seal` draws a fresh 96-bit nonce for every message and returns `nonce ‖ ciphertext ‖
/// tag` (12 + n + 16 bytes); `open` checks the 128-bit tag before returning anything, so a
/// wrong key, a changed byte or different associated data all fail the same way.
public enum AESGCM {
    /// Key length: 32 bytes (AES-256).
    public static let keyCount = 32
    /// Nonce length: 12 bytes, GCM's native size.
    public static let nonceCount = 12
    /// Tag length: 16 bytes, the full tag.
    public static let tagCount = 16

    /// Why sealing or opening failed. Neither case says anything about the key or the data.
    public enum Failure: Error, Equatable, CustomStringConvertible {
        /// The key is not 32 bytes.
        case badKeyLength
        /// The sealed box is shorter than a nonce and a tag, or its tag does not verify: the
        /// wrong key, other associated data, or changed bytes.
        case authenticationFailed
        /// OpenSSL reported an error (out of memory, say).
        case cryptoLibrary(String)

        public var description: String {
            switch self {
            case .badKeyLength: return "the AES-256-GCM key must be 32 bytes"
            case .authenticationFailed: return "decryption failed: wrong key or altered data"
            case .cryptoLibrary(let call): return "OpenSSL \(call) failed"
            }
        }
    }

    /// Encrypts `plaintext` under `key`, binding `associatedData` (authenticated, not
    /// encrypted, not stored), with a random nonce. Returns `nonce ‖ ciphertext ‖ tag`.
    public static func seal(_ plaintext: [UInt8], key: [UInt8], associatedData: [UInt8] = []) throws(Failure) -> [UInt8]
    {
        try seal(plaintext, key: key, nonce: SecureRandom.bytes(count: nonceCount), associatedData: associatedData)
    }

    /// `seal` with a given nonce (for known-answer tests; never reuse a nonce with a key).
    static func seal(_ plaintext: [UInt8], key: [UInt8], nonce: [UInt8], associatedData: [UInt8]) throws(Failure)
        -> [UInt8]
    {
        guard key.count == keyCount else { throw .badKeyLength }
        guard let context = EVP_CIPHER_CTX_new() else { throw .cryptoLibrary("EVP_CIPHER_CTX_new") }
        defer { EVP_CIPHER_CTX_free(context) }
        guard EVP_EncryptInit_ex(context, EVP_aes_256_gcm(), nil, nil, nil) == 1,
            EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_IVLEN, Int32(nonceCount), nil) == 1,
            EVP_EncryptInit_ex(context, nil, nil, key, nonce) == 1
        else { throw .cryptoLibrary("EVP_EncryptInit_ex") }
        var length: Int32 = 0
        if !associatedData.isEmpty {
            guard EVP_EncryptUpdate(context, nil, &length, associatedData, Int32(associatedData.count)) == 1 else {
                throw .cryptoLibrary("EVP_EncryptUpdate")
            }
        }
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count + 16)
        var written: Int32 = 0
        if !plaintext.isEmpty {
            guard EVP_EncryptUpdate(context, &ciphertext, &written, plaintext, Int32(plaintext.count)) == 1 else {
                throw .cryptoLibrary("EVP_EncryptUpdate")
            }
        }
        var final: Int32 = 0
        let finished = ciphertext.withUnsafeMutableBufferPointer { buffer in
            EVP_EncryptFinal_ex(context, buffer.baseAddress.map { $0 + Int(written) }, &final)
        }
        guard finished == 1 else { throw .cryptoLibrary("EVP_EncryptFinal_ex") }
        var tag = [UInt8](repeating: 0, count: tagCount)
        guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, Int32(tagCount), &tag) == 1 else {
            throw .cryptoLibrary("EVP_CIPHER_CTX_ctrl")
        }
        return nonce + ciphertext[0..<Int(written + final)] + tag
    }

    /// Checks and decrypts a box made by `seal` with the same key and associated data.
    public static func open(_ sealed: [UInt8], key: [UInt8], associatedData: [UInt8] = []) throws(Failure) -> [UInt8] {
        guard key.count == keyCount else { throw .badKeyLength }
        guard sealed.count >= nonceCount + tagCount else { throw .authenticationFailed }
        let nonce = Array(sealed[0..<nonceCount])
        let ciphertext = Array(sealed[nonceCount..<(sealed.count - tagCount)])
        var tag = Array(sealed[(sealed.count - tagCount)...])
        guard let context = EVP_CIPHER_CTX_new() else { throw .cryptoLibrary("EVP_CIPHER_CTX_new") }
        defer { EVP_CIPHER_CTX_free(context) }
        guard EVP_DecryptInit_ex(context, EVP_aes_256_gcm(), nil, nil, nil) == 1,
            EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_IVLEN, Int32(nonceCount), nil) == 1,
            EVP_DecryptInit_ex(context, nil, nil, key, nonce) == 1
        else { throw .cryptoLibrary("EVP_DecryptInit_ex") }
        var length: Int32 = 0
        if !associatedData.isEmpty {
            guard EVP_DecryptUpdate(context, nil, &length, associatedData, Int32(associatedData.count)) == 1 else {
                throw .cryptoLibrary("EVP_DecryptUpdate")
            }
        }
        var plaintext = [UInt8](repeating: 0, count: ciphertext.count + 16)
        var written: Int32 = 0
        if !ciphertext.isEmpty {
            guard EVP_DecryptUpdate(context, &plaintext, &written, ciphertext, Int32(ciphertext.count)) == 1 else {
                throw .cryptoLibrary("EVP_DecryptUpdate")
            }
        }
        guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, Int32(tagCount), &tag) == 1 else {
            throw .cryptoLibrary("EVP_CIPHER_CTX_ctrl")
        }
        var final: Int32 = 0
        let verified = plaintext.withUnsafeMutableBufferPointer { buffer in
            EVP_DecryptFinal_ex(context, buffer.baseAddress.map { $0 + Int(written) }, &final)
        }
        // Nothing decrypted leaves this function unless the tag verified.
        guard verified == 1 else {
            for index in plaintext.indices { plaintext[index] = 0 }
            throw .authenticationFailed
        }
        return Array(plaintext[0..<Int(written + final)])
    }
}
