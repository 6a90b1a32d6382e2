import Foundation

/// UUIDs as text, on every hot path (pushed `client_id`s, token claims, row scopes, answers):
/// Foundation's `UUID(uuidString:)` runs `sscanf` and `uuidString` runs `snprintf` plus a
/// `lowercased()` copy — a hundred of each per push showed as ~8 % of the server's CPU.
enum UUIDText {
    /// The canonical 8-4-4-4-12 hexadecimal form, either case; nil for anything else
    /// (braces, missing dashes, other lengths).
    static func parse(_ text: String) -> UUID? {
        var text = text
        return text.withUTF8 { parse($0) }
    }

    /// As `parse(_:)`, from UTF-8 bytes.
    static func parse(_ bytes: UnsafeBufferPointer<UInt8>) -> UUID? {
        guard bytes.count == 36 else { return nil }
        var value: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        let complete = withUnsafeMutableBytes(of: &value) { out -> Bool in
            var position = 0
            for index in 0..<16 {
                if index == 4 || index == 6 || index == 8 || index == 10 {
                    guard bytes[position] == UInt8(ascii: "-") else { return false }
                    position += 1
                }
                guard let high = nibble(bytes[position]), let low = nibble(bytes[position + 1]) else { return false }
                out[index] = high << 4 | low
                position += 2
            }
            return true
        }
        return complete ? UUID(uuid: value) : nil
    }

    @inline(__always)
    private static func nibble(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte &- UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte &- UInt8(ascii: "a") &+ 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte &- UInt8(ascii: "A") &+ 10
        default: return nil
        }
    }

    private static let hexDigits: StaticString = "0123456789abcdef"

    /// Writes the 36 bytes of `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (lowercase) for the 16
    /// bytes of a UUID at `out`, and advances it.
    @inline(__always)
    static func write(_ bytes: UnsafeRawBufferPointer, to out: inout UnsafeMutablePointer<UInt8>) {
        let hex = hexDigits.utf8Start
        for index in 0..<16 {
            if index == 4 || index == 6 || index == 8 || index == 10 {
                out.pointee = UInt8(ascii: "-")
                out += 1
            }
            let byte = bytes[index]
            out[0] = hex[Int(byte >> 4)]
            out[1] = hex[Int(byte & 0x0F)]
            out += 2
        }
    }

    /// `read` with the lowercase canonical form's 36 bytes (valid during the call): no
    /// `String` for text that is copied onward.
    static func withLowercase<T>(_ id: UUID, _ read: (UnsafeBufferPointer<UInt8>) -> T) -> T {
        withUnsafeBytes(of: id.uuid) { bytes in
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 36) { buffer in
                guard let base = buffer.baseAddress else { return read(UnsafeBufferPointer(start: nil, count: 0)) }
                var out = base
                write(bytes, to: &out)
                return read(UnsafeBufferPointer(start: base, count: 36))
            }
        }
    }

    /// The lowercase canonical form, as PostgreSQL prints a `uuid`.
    static func lowercase(_ id: UUID) -> String {
        withUnsafeBytes(of: id.uuid) { bytes in
            String(unsafeUninitializedCapacity: 36) { buffer in
                guard var out = buffer.baseAddress else { return 0 }
                write(bytes, to: &out)
                return 36
            }
        }
    }
}
