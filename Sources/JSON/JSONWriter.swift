/// Builds JSON text directly into bytes: no intermediate objects, no re-encoding of values
/// that already are JSON (`raw(_:)`, e.g. a `jsonb` column).
public struct JSONWriter: Sendable {
    /// The JSON so far.
    public private(set) var bytes: [UInt8] = []
    private var needsComma: [Bool] = [false]

    /// An empty writer; `capacity` reserves room.
    public init(capacity: Int = 256) { bytes.reserveCapacity(capacity) }

    private mutating func separate() {
        if needsComma[needsComma.count - 1] { bytes.append(UInt8(ascii: ",")) }
        needsComma[needsComma.count - 1] = true
    }

    /// Opens an object (as a value, or as a member when `key` is given).
    public mutating func beginObject(_ key: String? = nil) {
        if let key { self.key(key) } else { separate() }
        bytes.append(UInt8(ascii: "{"))
        needsComma.append(false)
    }

    /// Closes the innermost object.
    public mutating func endObject() {
        needsComma.removeLast()
        bytes.append(UInt8(ascii: "}"))
    }

    /// Opens an array (as a value, or as a member when `key` is given).
    public mutating func beginArray(_ key: String? = nil) {
        if let key { self.key(key) } else { separate() }
        bytes.append(UInt8(ascii: "["))
        needsComma.append(false)
    }

    /// Closes the innermost array.
    public mutating func endArray() {
        needsComma.removeLast()
        bytes.append(UInt8(ascii: "]"))
    }

    private mutating func key(_ key: String) {
        separate()
        appendQuoted(key)
        bytes.append(UInt8(ascii: ":"))
    }

    /// A string member (or array element when `key` is nil); `nil` values write `null`.
    public mutating func string(_ key: String?, _ value: String?) {
        if let key { self.key(key) } else { separate() }
        if let value { appendQuoted(value) } else { bytes.append(contentsOf: Self.null) }
    }

    /// An integer member or element.
    public mutating func int(_ key: String?, _ value: Int64) {
        if let key { self.key(key) } else { separate() }
        bytes.append(contentsOf: String(value).utf8)
    }

    /// A number member or element, in its shortest form that reads back as the same double
    /// (integers below 2^53 without a fraction).
    public mutating func number(_ key: String?, _ value: Double) {
        if let key { self.key(key) } else { separate() }
        if value.isFinite, value == value.rounded(), abs(value) < 9_007_199_254_740_992,
            !(value == 0 && value.sign == .minus)
        {
            bytes.append(contentsOf: String(Int64(value)).utf8)
        } else if value.isFinite {
            bytes.append(contentsOf: value.description.utf8)
        } else {
            bytes.append(contentsOf: Self.null)  // JSON has no infinity; the parser never makes one
        }
    }

    /// A boolean member or element.
    public mutating func bool(_ key: String?, _ value: Bool) {
        if let key { self.key(key) } else { separate() }
        bytes.append(contentsOf: value ? Self.trueBytes : Self.falseBytes)
    }

    /// A member or element whose value is already JSON text (written as it is).
    public mutating func raw(_ key: String?, _ json: [UInt8]) {
        if let key { self.key(key) } else { separate() }
        bytes.append(contentsOf: json)
    }

    /// A `null` member or element.
    public mutating func null(_ key: String?) {
        if let key { self.key(key) } else { separate() }
        bytes.append(contentsOf: Self.null)
    }

    private static let null = Array("null".utf8)
    private static let trueBytes = Array("true".utf8)
    private static let falseBytes = Array("false".utf8)
    private static let hex = Array("0123456789abcdef".utf8)

    /// Appends `text` as a JSON string literal, escaping only what JSON requires. The runs
    /// between escapes are copied whole (most strings have no escape at all).
    public mutating func appendQuoted(_ text: String) {
        bytes.append(UInt8(ascii: "\""))
        var text = text
        text.withUTF8 { utf8 in
            var start = 0
            for index in utf8.indices {
                let byte = utf8[index]
                guard byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") else { continue }
                bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start..<index]))
                appendEscape(byte)
                start = index + 1
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start...]))
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// `byte` (a quote, a backslash or a control character) as a JSON escape.
    private mutating func appendEscape(_ byte: UInt8) {
        bytes.append(UInt8(ascii: "\\"))
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"): bytes.append(byte)
        case 0x0A: bytes.append(UInt8(ascii: "n"))
        case 0x0D: bytes.append(UInt8(ascii: "r"))
        case 0x09: bytes.append(UInt8(ascii: "t"))
        default:
            bytes.append(contentsOf: [UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
            bytes.append(Self.hex[Int(byte >> 4)])
            bytes.append(Self.hex[Int(byte & 0x0F)])
        }
    }
}
