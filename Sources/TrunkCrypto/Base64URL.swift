/// Base64url (RFC 4648 §5: `-` and `_` instead of `+` and `/`) without `=` padding, the
/// encoding of JWT segments (RFC 7515) and of opaque tokens in URLs.
public enum Base64URL {
    /// Encodes `bytes`, without padding.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        Base64Codec.url.encode(bytes)
    }

    /// Encodes the UTF-8 encoding of `string`, without padding (e.g. a JWT's JSON header).
    public static func encode(_ string: String) -> String {
        Base64Codec.url.encode(string.utf8)
    }

    /// Decodes `string`, or returns nil unless it is canonical unpadded base64url: only
    /// the symbols `A`–`Z`, `a`–`z`, `0`–`9`, `-` and `_` (no `=`, `+`, `/` or whitespace),
    /// a length that is not 1 more than a multiple of 4, and the unused low bits of the
    /// last symbol zero, so each byte string has exactly one accepted encoding.
    public static func decode(_ string: String) -> [UInt8]? {
        Base64Codec.url.decode(string.utf8)
    }

    /// Decodes base64url text given as its ASCII bytes (e.g. a slice of a request's
    /// header), with the same rules as `decode(_:)` for strings.
    public static func decode(_ encoded: some Collection<UInt8>) -> [UInt8]? {
        Base64Codec.url.decode(encoded)
    }
}
