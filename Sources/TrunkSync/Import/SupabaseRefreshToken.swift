import Foundation
import TrunkCrypto

/// The signed refresh tokens newer Supabase Auth issues (its `internal/crypto/refresh_tokens.go`
/// format): base64url without padding of
/// `0x00 ‖ session id (16 bytes) ‖ counter (unsigned varint) ‖ HMAC-SHA-256(key, all before)[0..<16] ‖ SHA-256(all before)[0..<4]`.
/// The session row holds the key and the last counter issued, so the token a client holds
/// now can be computed at import time and stored as trunk-sync stores every refresh
/// token: its SHA-256. The client's next refresh then works once and rotates as usual.
enum SupabaseRefreshToken {
    /// The token for `session` at `counter` under `key`.
    static func encode(session: UUID, counter: UInt64, key: [UInt8]) -> String {
        var bytes: [UInt8] = [0]
        withUnsafeBytes(of: session.uuid) { bytes.append(contentsOf: $0) }
        var rest = counter
        while rest >= 0x80 {
            bytes.append(UInt8(rest & 0x7f) | 0x80)
            rest >>= 7
        }
        bytes.append(UInt8(rest))
        bytes += HMAC.sha256(key: key, message: bytes).prefix(16)
        bytes += SHA256.hash(bytes).prefix(4)
        return Base64URL.encode(bytes)
    }

    /// Why a session's key cannot be used.
    enum KeyProblem: Error {
        /// Stored encrypted with Supabase Auth's encryption keys (a JSON envelope).
        case encrypted
        /// Neither base64url nor base64, or empty.
        case unreadable
    }

    /// The HMAC key from `auth.sessions.refresh_token_hmac_key`: base64url (or base64) of
    /// the key bytes; an encrypted one is a JSON object, which cannot be opened here.
    static func key(stored: String) -> Result<[UInt8], KeyProblem> {
        let text = stored.trimmingCharacters(in: .whitespaces)
        if text.hasPrefix("{") { return .failure(.encrypted) }
        if let bytes = Base64URL.decode(text), bytes.count >= 16 { return .success(bytes) }
        if let data = Data(base64Encoded: text), data.count >= 16 { return .success(Array(data)) }
        return .failure(.unreadable)
    }
}
