/// Standard base64 (RFC 4648 §4: alphabet with `+` and `/`, `=` padding), as used by
/// PEM, SMTP AUTH and HTTP Basic credentials.
public enum Base64 {
    /// Encodes `bytes`, padded with `=` to a multiple of 4 characters.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        Base64Codec.standard.encode(bytes)
    }

    /// Encodes the UTF-8 encoding of `string`, padded with `=`.
    public static func encode(_ string: String) -> String {
        Base64Codec.standard.encode(string.utf8)
    }

    /// Decodes `string`, or returns nil unless it is canonical padded base64: only the
    /// symbols `A`–`Z`, `a`–`z`, `0`–`9`, `+` and `/`, a length that is a multiple of 4
    /// with at most two `=` at the very end, no whitespace or line breaks, and the unused
    /// low bits of the last symbol zero.
    public static func decode(_ string: String) -> [UInt8]? {
        Base64Codec.standard.decode(string.utf8)
    }

    /// Decodes base64 text given as its ASCII bytes, with the same rules as `decode(_:)`
    /// for strings.
    public static func decode(_ encoded: some Collection<UInt8>) -> [UInt8]? {
        Base64Codec.standard.decode(encoded)
    }
}
