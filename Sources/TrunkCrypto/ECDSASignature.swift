/// Converts P-256 ECDSA signatures between the two encodings in use: JOSE's fixed-size
/// `r‖s` (RFC 7518 §3.4: 32 big-endian bytes each, 64 in all), which ES256 tokens carry, and
/// DER `ECDSA-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }`, which OpenSSL produces and
/// expects.
///
/// Pure byte manipulation, no OpenSSL: the parser accepts only canonical DER (minimal,
/// non-negative integers, exact lengths), so each signature has one encoding.
public enum ECDSASignature {
    /// Bytes of one P-256 component (`r` or `s`).
    public static let componentByteCount = 32

    /// Returns the DER encoding of a raw `r‖s` signature, or nil unless `raw` is exactly
    /// 64 bytes.
    public static func der(fromRaw raw: some Collection<UInt8>) -> [UInt8]? {
        let bytes = Array(raw)
        guard bytes.count == 2 * componentByteCount else { return nil }
        let body =
            derInteger(bytes[..<componentByteCount]) + derInteger(bytes[componentByteCount...])
        // At most 2 × (2 + 33) = 70 bytes: the short length form always suffices.
        return [0x30, UInt8(body.count)] + body
    }

    /// Returns the raw `r‖s` (64 bytes) of a DER signature, or nil unless `der` is a
    /// canonical DER SEQUENCE of two non-negative INTEGERs that each fit in 32 bytes, with
    /// nothing after it.
    public static func raw(fromDER der: some Collection<UInt8>) -> [UInt8]? {
        let bytes = Array(der)
        guard bytes.count >= 2, bytes[0] == 0x30, bytes[1] < 0x80, Int(bytes[1]) == bytes.count - 2 else { return nil }
        var index = 2
        guard let r = readInteger(bytes, &index), let s = readInteger(bytes, &index), index == bytes.count else {
            return nil
        }
        return r + s
    }

    /// `INTEGER` for an unsigned big-endian value: leading zeros dropped, one `0x00` put
    /// back when the high bit is set (DER integers are signed).
    private static func derInteger(_ value: ArraySlice<UInt8>) -> [UInt8] {
        var magnitude = Array(value.drop { $0 == 0 })
        if magnitude.isEmpty { magnitude = [0] }
        if let first = magnitude.first, first & 0x80 != 0 { magnitude.insert(0, at: 0) }
        return [0x02, UInt8(magnitude.count)] + magnitude
    }

    /// Reads one canonical `INTEGER` at `index` and returns it left-padded to 32 bytes.
    private static func readInteger(_ bytes: [UInt8], _ index: inout Int) -> [UInt8]? {
        guard index + 2 <= bytes.count, bytes[index] == 0x02 else { return nil }
        let length = Int(bytes[index + 1])
        let start = index + 2
        guard length >= 1, length < 0x80, start + length <= bytes.count else { return nil }
        let value = bytes[start..<start + length]
        index = start + length
        guard let first = value.first, first & 0x80 == 0 else { return nil }  // negative
        if length > 1, first == 0, value[start + 1] & 0x80 == 0 { return nil }  // not minimal
        let magnitude = first == 0 && length > 1 ? value.dropFirst() : value
        guard magnitude.count <= componentByteCount else { return nil }
        return [UInt8](repeating: 0, count: componentByteCount - magnitude.count) + magnitude
    }
}
