/// A strict, allocation-light JSON reader over bytes. It validates as it goes (RFC 8259,
/// UTF-8, surrogate pairs) and can skip a value while returning where it lies, so a
/// payload is checked once and kept as its raw bytes.
///
/// Beyond RFC 8259 it rejects what PostgreSQL's `jsonb` would refuse later, so a batch
/// that passes here cannot fail at insert: `\u0000`, and numbers outside `numeric`'s range.
struct JSONScanner {
    struct Failure: Error, Equatable {
        var offset: Int
        var reason: String
    }

    private let bytes: UnsafeBufferPointer<UInt8>
    private(set) var index = 0
    static let maxDepth = 64

    init(_ bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    var isAtEnd: Bool { index >= bytes.count }

    /// A copy of the bytes in `range`.
    func slice(_ range: Range<Int>) -> [UInt8] { Array(bytes[range]) }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    func fail(_ reason: String) -> Failure { Failure(offset: index, reason: reason) }

    mutating func peek() -> UInt8? {
        skipWhitespace()
        return index < bytes.count ? bytes[index] : nil
    }

    mutating func expect(_ byte: UInt8) throws(Failure) {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == byte else {
            throw fail("expected '\(Character(Unicode.Scalar(byte)))'")
        }
        index += 1
    }

    /// Consumes `byte` if it is next.
    mutating func consume(_ byte: UInt8) -> Bool {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == byte else { return false }
        index += 1
        return true
    }

    /// Iterates the members of an object, calling `member` with each key; `member` must
    /// consume the value.
    mutating func object(_ member: (inout JSONScanner, String) throws(Failure) -> Void) throws(Failure) {
        try expect(UInt8(ascii: "{"))
        if consume(UInt8(ascii: "}")) { return }
        repeat {
            skipWhitespace()
            let key = try string()
            try expect(UInt8(ascii: ":"))
            try member(&self, key)
        } while consume(UInt8(ascii: ","))
        try expect(UInt8(ascii: "}"))
    }

    /// Iterates the elements of an array; `element` must consume each value.
    mutating func array(_ element: (inout JSONScanner, Int) throws(Failure) -> Void) throws(Failure) {
        try expect(UInt8(ascii: "["))
        if consume(UInt8(ascii: "]")) { return }
        var position = 0
        repeat {
            try element(&self, position)
            position += 1
        } while consume(UInt8(ascii: ","))
        try expect(UInt8(ascii: "]"))
    }

    /// Reads a string value (decoding escapes).
    mutating func string() throws(Failure) -> String {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string") }
        let start = index + 1
        try skipString()
        let end = index - 1
        // Fast path: no escapes.
        var hasEscape = false
        for position in start..<end where bytes[position] == UInt8(ascii: "\\") {
            hasEscape = true
            break
        }
        if !hasEscape {
            return String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<end]), as: UTF8.self)
        }
        return Self.unescape(UnsafeBufferPointer(rebasing: bytes[start..<end]))
    }

    /// Skips any value, validating it; returns its byte range.
    mutating func skipValue(depth: Int = 0) throws(Failure) -> Range<Int> {
        skipWhitespace()
        guard index < bytes.count else { throw fail("unexpected end of input") }
        let start = index
        switch bytes[index] {
        case UInt8(ascii: "{"):
            guard depth < Self.maxDepth else { throw fail("nested too deeply") }
            try object { (scanner: inout JSONScanner, _: String) throws(Failure) in _ = try scanner.skipValue(depth: depth + 1) }
        case UInt8(ascii: "["):
            guard depth < Self.maxDepth else { throw fail("nested too deeply") }
            try array { (scanner: inout JSONScanner, _: Int) throws(Failure) in _ = try scanner.skipValue(depth: depth + 1) }
        case UInt8(ascii: "\""): try skipString()
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): try number()
        default: throw fail("unexpected character")
        }
        return start..<index
    }

    private mutating func literal(_ word: StaticString) throws(Failure) {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw fail("invalid literal") }
        for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] {
            throw fail("invalid literal")
        }
        index += count
    }

    private mutating func number() throws(Failure) {
        func digit(_ position: Int) -> Bool {
            position < bytes.count && bytes[position] >= UInt8(ascii: "0") && bytes[position] <= UInt8(ascii: "9")
        }
        let start = index
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard digit(index) else { throw fail("invalid number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while digit(index) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digit(index) else { throw fail("invalid number") }
            while digit(index) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            var negative = false
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                negative = bytes[index] == UInt8(ascii: "-")
                index += 1
            }
            guard digit(index) else { throw fail("invalid number") }
            var exponent = 0
            while digit(index) {
                exponent = min(exponent * 10 + Int(bytes[index] - UInt8(ascii: "0")), 1_000_000)
                index += 1
            }
            // PostgreSQL's numeric holds about 131072 digits before and 16383 after the point.
            if exponent > (negative ? 16_000 : 100_000) { throw fail("number out of range") }
        }
        if index - start > 1000 { throw fail("number too long") }
    }

    /// Skips a string starting at `index` (the opening quote), validating escapes and UTF-8.
    private mutating func skipString() throws(Failure) {
        index += 1
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                index += 1
                return
            }
            if byte == UInt8(ascii: "\\") {
                index += 1
                guard index < bytes.count else { break }
                switch bytes[index] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                    UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 1
                case UInt8(ascii: "u"):
                    let value = try hex4(at: index + 1)
                    index += 5
                    if value == 0 { throw fail("\\u0000 is not allowed") }
                    if (0xD800...0xDBFF).contains(value) {
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u")
                        else { throw fail("unpaired surrogate") }
                        let low = try hex4(at: index + 2)
                        guard (0xDC00...0xDFFF).contains(low) else { throw fail("unpaired surrogate") }
                        index += 6
                    } else if (0xDC00...0xDFFF).contains(value) {
                        throw fail("unpaired surrogate")
                    }
                default: throw fail("invalid escape")
                }
                continue
            }
            if byte < 0x20 { throw fail("control character in string") }
            if byte < 0x80 {
                index += 1
                continue
            }
            try skipUTF8Sequence()
        }
        throw fail("unterminated string")
    }

    private func hex4(at position: Int) throws(Failure) -> UInt32 {
        guard position + 4 <= bytes.count else { throw fail("invalid \\u escape") }
        var value: UInt32 = 0
        for offset in 0..<4 {
            let byte = bytes[position + offset]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw fail("invalid \\u escape")
            }
            value = value << 4 | UInt32(digit)
        }
        return value
    }

    /// Validates one multi-byte UTF-8 sequence at `index` (no overlongs, no surrogates,
    /// nothing above U+10FFFF) and moves past it.
    private mutating func skipUTF8Sequence() throws(Failure) {
        let first = bytes[index]
        let length: Int
        var lowerBound: UInt8 = 0x80
        var upperBound: UInt8 = 0xBF
        switch first {
        case 0xC2...0xDF: length = 2
        case 0xE0: length = 3; lowerBound = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED: length = 3; upperBound = 0x9F
        case 0xF0: length = 4; lowerBound = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4: length = 4; upperBound = 0x8F
        default: throw fail("invalid UTF-8")
        }
        guard index + length <= bytes.count else { throw fail("invalid UTF-8") }
        let second = bytes[index + 1]
        guard second >= lowerBound, second <= upperBound else { throw fail("invalid UTF-8") }
        for offset in 2..<length where bytes[index + offset] & 0xC0 != 0x80 {
            throw fail("invalid UTF-8")
        }
        index += length
    }

    /// Decodes the escapes of an already validated string body.
    static func unescape(_ body: UnsafeBufferPointer<UInt8>) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(body.count)
        var index = 0
        func hex(_ position: Int) -> UInt32 {
            var value: UInt32 = 0
            for offset in 0..<4 {
                let byte = body[position + offset]
                let digit: UInt32 =
                    byte <= UInt8(ascii: "9")
                    ? UInt32(byte - UInt8(ascii: "0")) : UInt32((byte | 0x20) - UInt8(ascii: "a") + 10)
                value = value << 4 | digit
            }
            return value
        }
        while index < body.count {
            let byte = body[index]
            guard byte == UInt8(ascii: "\\") else {
                out.append(byte)
                index += 1
                continue
            }
            let escaped = body[index + 1]
            index += 2
            switch escaped {
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = hex(index)
                index += 4
                if (0xD800...0xDBFF).contains(scalar) {
                    let low = hex(index + 2)
                    index += 6
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                }
                if let value = Unicode.Scalar(scalar) { out.append(contentsOf: Array(String(Character(value)).utf8)) }
            default: out.append(escaped)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
