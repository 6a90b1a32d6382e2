import Foundation

/// A strict, allocation-light JSON reader over bytes: the one JSON parser of trunk-sync.
/// It validates as it goes (RFC 8259 grammar, UTF-8, escapes, nesting) and can skip a value
/// while returning where it lies, so a payload is checked once and kept as its raw bytes.
///
/// Two kinds of trouble:
/// - a **failure** (`Failure`, thrown): the bytes are not JSON; scanning stops.
/// - a **violation** (recorded, see `takeViolation()`): the bytes are JSON, but a value is
///   one trunk-sync refuses — `\u0000` or an unpaired surrogate in a string (PostgreSQL's
///   `jsonb` cannot store the first; the second is not Unicode), a number that is not an
///   I-JSON number (RFC 7493: it must fit an IEEE double, and be at most
///   `JSONLimits.maxNumberLength` characters), a string over `maxStringBytes`. Scanning goes
///   on, so the caller can name the field the violation is in.
///
/// It also measures what a value becomes once stored as `jsonb` and printed again
/// (`storedSize`): PostgreSQL prints numbers in plain decimal (`1e308` is 309 digits) and
/// separators with a space. Limits on stored values are checked against that size, so no
/// input can make an answer much larger than the limits say.
public struct JSONScanner {
    /// The bytes are not JSON (or nest too deeply): where and why.
    public struct Failure: Error, Equatable, Sendable {
        public var offset: Int
        public var reason: String

        public init(offset: Int, reason: String) {
            self.offset = offset
            self.reason = reason
        }
    }

    private let bytes: UnsafeBufferPointer<UInt8>
    public let limits: JSONLimits
    public private(set) var index = 0
    /// The first violation since the last `takeViolation()`.
    private var violation: Failure? = nil
    /// Stored size minus written size, so far: grows by each number's expansion and each
    /// separator's space, shrinks by each whitespace byte dropped.
    private var storedAdjustment = 0

    public init(_ bytes: UnsafeBufferPointer<UInt8>, limits: JSONLimits = .default) {
        self.bytes = bytes
        self.limits = limits
    }

    public var isAtEnd: Bool { index >= bytes.count }

    /// A copy of the bytes in `range`.
    public func slice(_ range: Range<Int>) -> [UInt8] { Array(UnsafeBufferPointer(rebasing: bytes[range])) }

    /// Returns and clears the first violation recorded since the last call.
    public mutating func takeViolation() -> Failure? {
        defer { violation = nil }
        return violation
    }

    private mutating func violate(_ reason: String, at offset: Int) {
        if violation == nil { violation = Failure(offset: offset, reason: reason) }
    }

    public mutating func skipWhitespace() {
        let start = index
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default:
                storedAdjustment -= index - start
                return
            }
        }
        storedAdjustment -= index - start
    }

    public func fail(_ reason: String) -> Failure { Failure(offset: index, reason: reason) }

    public mutating func peek() -> UInt8? {
        skipWhitespace()
        return index < bytes.count ? bytes[index] : nil
    }

    public mutating func expect(_ byte: UInt8) throws(Failure) {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == byte else {
            throw fail("expected '\(Character(Unicode.Scalar(byte)))'")
        }
        index += 1
    }

    /// Consumes `byte` if it is next.
    public mutating func consume(_ byte: UInt8) -> Bool {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == byte else { return false }
        index += 1
        return true
    }

    /// Checks that only whitespace is left.
    public mutating func expectEnd() throws(Failure) {
        skipWhitespace()
        guard isAtEnd else { throw fail("unexpected data after the JSON value") }
    }

    /// Iterates the members of an object, calling `member` with each key; `member` must
    /// consume the value.
    public mutating func object(_ member: (inout JSONScanner, String) throws(Failure) -> Void) throws(Failure) {
        try objectUTF8 { (scanner: inout JSONScanner, key: UnsafeBufferPointer<UInt8>) throws(Failure) in
            try member(&scanner, String(decoding: key, as: UTF8.self))
        }
    }

    /// As `object(_:)`, with each key as its UTF-8 (escapes decoded), valid only during
    /// the call: no `String` per key. Compare keys byte for byte (`JSONScanner.equals`).
    public mutating func objectUTF8(_ member: (inout JSONScanner, UnsafeBufferPointer<UInt8>) throws(Failure) -> Void)
        throws(Failure)
    {
        try expect(UInt8(ascii: "{"))
        if consume(UInt8(ascii: "}")) { return }
        repeat {
            skipWhitespace()
            let key = try stringBody()
            try expect(UInt8(ascii: ":"))
            storedAdjustment += 1  // jsonb prints `": "`
            if key.escaped {
                let decoded = Self.unescapeBytes(UnsafeBufferPointer(rebasing: bytes[key.body]))
                try decoded.withUnsafeBufferPointerTyped { (buffer) throws(Failure) in try member(&self, buffer) }
            } else {
                try member(&self, UnsafeBufferPointer(rebasing: bytes[key.body]))
            }
        } while consumeSeparator()
        try expect(UInt8(ascii: "}"))
    }

    /// Whether `utf8` is the bytes of `name` (for keys and values read as UTF-8).
    @inline(__always)
    public static func equals(_ utf8: UnsafeBufferPointer<UInt8>, _ name: StaticString) -> Bool {
        guard utf8.count == name.utf8CodeUnitCount else { return false }
        guard let base = utf8.baseAddress else { return true }  // both empty
        return memcmp(base, name.utf8Start, utf8.count) == 0
    }

    /// Iterates the elements of an array; `element` must consume each value.
    public mutating func array(_ element: (inout JSONScanner, Int) throws(Failure) -> Void) throws(Failure) {
        try expect(UInt8(ascii: "["))
        if consume(UInt8(ascii: "]")) { return }
        var position = 0
        repeat {
            try element(&self, position)
            position += 1
        } while consumeSeparator()
        try expect(UInt8(ascii: "]"))
    }

    private mutating func consumeSeparator() -> Bool {
        guard consume(UInt8(ascii: ",")) else { return false }
        storedAdjustment += 1  // jsonb prints `", "`
        return true
    }

    /// Reads a string value (decoding escapes).
    public mutating func string() throws(Failure) -> String {
        skipWhitespace()
        let string = try stringBody()
        let body = UnsafeBufferPointer(rebasing: bytes[string.body])
        return string.escaped ? Self.unescape(body) : String(decoding: body, as: UTF8.self)
    }

    /// Reads a string value and returns what `read` makes of its UTF-8 (escapes decoded),
    /// which is valid only during the call: no `String` for a value that is parsed further.
    public mutating func stringUTF8<T>(_ read: (UnsafeBufferPointer<UInt8>) -> T) throws(Failure) -> T {
        skipWhitespace()
        let string = try stringBody()
        let body = UnsafeBufferPointer(rebasing: bytes[string.body])
        guard string.escaped else { return read(body) }
        return Self.unescapeBytes(body).withUnsafeBufferPointer(read)
    }

    /// Skips the string at `index` (after whitespace); returns the range of its body
    /// (between the quotes) and whether it has an escape.
    private mutating func stringBody() throws(Failure) -> (body: Range<Int>, escaped: Bool) {
        guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string") }
        let start = index + 1
        let escaped = try skipString()
        return (start..<index - 1, escaped)
    }

    /// Skips any value, validating it; returns its byte range and its size once stored as
    /// `jsonb` and printed (`storedSize`).
    public mutating func skipValueMeasured() throws(Failure) -> (range: Range<Int>, storedSize: Int) {
        skipWhitespace()
        let before = storedAdjustment
        let range = try skipValue()
        return (range, range.count + storedAdjustment - before)
    }

    /// Skips any value, validating it; returns its byte range.
    @discardableResult
    public mutating func skipValue(depth: Int = 0) throws(Failure) -> Range<Int> {
        skipWhitespace()
        guard index < bytes.count else { throw fail("unexpected end of input") }
        let start = index
        switch bytes[index] {
        case UInt8(ascii: "{"):
            guard depth < limits.maxDepth else { throw fail("nested more than \(limits.maxDepth) levels deep") }
            try objectUTF8 { (scanner: inout JSONScanner, _: UnsafeBufferPointer<UInt8>) throws(Failure) in
                _ = try scanner.skipValue(depth: depth + 1)
            }
        case UInt8(ascii: "["):
            guard depth < limits.maxDepth else { throw fail("nested more than \(limits.maxDepth) levels deep") }
            try array { (scanner: inout JSONScanner, _: Int) throws(Failure) in
                _ = try scanner.skipValue(depth: depth + 1)
            }
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

    /// Lexes a number (RFC 8259), then holds it to I-JSON: at most `maxNumberLength`
    /// characters, and a finite, non-vanishing IEEE double. Adds what PostgreSQL's plain
    /// decimal output makes of it to the stored size.
    private mutating func number() throws(Failure) {
        func digit(_ position: Int) -> Bool {
            position < bytes.count && bytes[position] >= UInt8(ascii: "0") && bytes[position] <= UInt8(ascii: "9")
        }
        let start = index
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard digit(index) else { throw fail("invalid number") }
        let integerStart = index
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while digit(index) { index += 1 }
        }
        let integerDigits = index - integerStart
        var fractionDigits = 0
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digit(index) else { throw fail("invalid number") }
            let fractionStart = index
            while digit(index) { index += 1 }
            fractionDigits = index - fractionStart
        }
        let mantissaEnd = index
        var exponent = 0
        var hasExponent = false
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            hasExponent = true
            index += 1
            var negative = false
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                negative = bytes[index] == UInt8(ascii: "-")
                index += 1
            }
            guard digit(index) else { throw fail("invalid number") }
            while digit(index) {
                exponent = min(exponent * 10 + Int(bytes[index] - UInt8(ascii: "0")), 1_000_000)
                index += 1
            }
            if negative { exponent = -exponent }
        }
        let length = index - start
        guard length <= limits.maxNumberLength else {
            violate("a number of more than \(limits.maxNumberLength) characters is not an I-JSON number", at: start)
            return
        }
        // Without an exponent, a number of at most `Self.plainNumberLength` characters is
        // finite (below 10^300) and, unless all its digits are zeros, not zero (at least
        // 10^-300): strtod would find nothing to refuse. PostgreSQL prints it as written
        // (plain decimal already): no stored-size adjustment.
        if !hasExponent, length <= Self.plainNumberLength { return }
        // The text is a JSON number, which strtod reads the same way.
        let value = withUnsafeTemporaryAllocation(of: CChar.self, capacity: length + 1) { buffer -> Double in
            for offset in 0..<length { buffer[offset] = CChar(bitPattern: bytes[start + offset]) }
            buffer[length] = 0
            return strtod(buffer.baseAddress!, nil)
        }
        if !value.isFinite {
            violate("number out of range: it does not fit an IEEE double (I-JSON)", at: start)
            return
        }
        if value == 0 {
            let nonZero = (integerStart..<mantissaEnd).contains {
                bytes[$0] >= UInt8(ascii: "1") && bytes[$0] <= UInt8(ascii: "9")
            }
            if nonZero {
                violate("number out of range: it is too small for an IEEE double (I-JSON)", at: start)
                return
            }
        }
        // PostgreSQL prints numeric in plain decimal, keeping the written scale: the digits
        // before the point are the integer digits shifted by the exponent, the scale the
        // fraction digits less the exponent. It keeps at most `maxNumericScale` digits after
        // the point and refuses a number with more (only a zero gets there within a double's
        // range and the length limit: `0e-20000`), which would fail the whole insert.
        let scale = max(0, fractionDigits - exponent)
        guard scale <= Self.maxNumericScale else {
            violate(
                "number out of range: PostgreSQL keeps at most \(Self.maxNumericScale) digits after the decimal point",
                at: start)
            return
        }
        let printed: Int
        if value == 0 {
            // A zero is printed `0`, without its sign, then its scale: the exponent adds no digit.
            printed = 1 + (scale > 0 ? 1 + scale : 0)
        } else {
            let point = integerDigits + exponent
            printed = (start < integerStart ? 1 : 0) + max(1, point) + (scale > 0 ? 1 + scale : 0)
        }
        storedAdjustment += max(0, printed - length)
    }

    /// The longest number without an exponent that cannot fall outside a double (see
    /// `number()`).
    static let plainNumberLength = 300

    /// The most digits after the decimal point PostgreSQL's `numeric` (and so `jsonb`) keeps
    /// (`NUMERIC_DSCALE_MAX`); more is an error that fails the statement.
    static let maxNumericScale = 16383

    /// Skips a string starting at `index` (the opening quote), validating escapes and UTF-8;
    /// returns whether it has an escape.
    @discardableResult
    private mutating func skipString() throws(Failure) -> Bool {
        let start = index
        defer {
            if index - start - 2 > limits.maxStringBytes {
                violate("a string of more than \(limits.maxStringBytes) bytes", at: start)
            }
        }
        index += 1
        var escaped = false
        while index < bytes.count {
            skipPlainASCII()
            guard index < bytes.count else { break }
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                index += 1
                return escaped
            }
            if byte == UInt8(ascii: "\\") {
                escaped = true
                index += 1
                guard index < bytes.count else { break }
                switch bytes[index] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                    UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 1
                case UInt8(ascii: "u"):
                    let escapeStart = index - 1
                    let value = try hex4(at: index + 1)
                    index += 5
                    if value == 0 { violate("\\u0000 is not allowed in a string", at: escapeStart) }
                    if (0xD800...0xDBFF).contains(value) {
                        if index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                            bytes[index + 1] == UInt8(ascii: "u")
                        {
                            let low = try hex4(at: index + 2)
                            if (0xDC00...0xDFFF).contains(low) {
                                index += 6
                            } else {
                                violate(
                                    "unpaired surrogate \\u\(String(value, radix: 16)) is not Unicode", at: escapeStart)
                            }
                        } else {
                            violate("unpaired surrogate \\u\(String(value, radix: 16)) is not Unicode", at: escapeStart)
                        }
                    } else if (0xDC00...0xDFFF).contains(value) {
                        violate("unpaired surrogate \\u\(String(value, radix: 16)) is not Unicode", at: escapeStart)
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

    /// Moves past 8-byte words of plain ASCII in a string: no quote, no backslash, no
    /// control character, nothing above 0x7F (whatever follows, the byte loop reads).
    @inline(__always)
    private mutating func skipPlainASCII() {
        guard let base = bytes.baseAddress else { return }
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        while index + 8 <= bytes.count {
            let word = UInt64(littleEndian: UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self))
            // A byte below 0x20, equal to '"' or '\\' or with its high bit set: the classic
            // "has a zero byte" test, exact for "any".
            let quotes = word ^ (ones &* 0x22)
            let backslashes = word ^ (ones &* 0x5C)
            let control = (word &- (ones &* 0x20)) & ~word
            let quote = (quotes &- ones) & ~quotes
            let backslash = (backslashes &- ones) & ~backslashes
            if ((control | quote | backslash | word) & highs) != 0 { return }
            index += 8
        }
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

    /// Decodes the escapes of an already validated string body (a surrogate left unpaired
    /// becomes U+FFFD; the scanner reported it as a violation).
    static func unescape(_ body: UnsafeBufferPointer<UInt8>) -> String {
        String(decoding: unescapeBytes(body), as: UTF8.self)
    }

    /// `unescape`'s UTF-8.
    static func unescapeBytes(_ body: UnsafeBufferPointer<UInt8>) -> [UInt8] {
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
                if (0xD800...0xDBFF).contains(scalar), index + 5 < body.count, body[index] == UInt8(ascii: "\\"),
                    body[index + 1] == UInt8(ascii: "u"), (0xDC00...0xDFFF).contains(hex(index + 2))
                {
                    let low = hex(index + 2)
                    index += 6
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                }
                let value = Unicode.Scalar(scalar) ?? "\u{FFFD}"
                out.append(contentsOf: String(Character(value)).utf8)
            default: out.append(escaped)
            }
        }
        return out
    }
}

extension Array where Element == UInt8 {
    /// `withUnsafeBufferPointer` for a closure with typed throws.
    fileprivate func withUnsafeBufferPointerTyped(
        _ body: (UnsafeBufferPointer<UInt8>) throws(JSONScanner.Failure) -> Void
    ) throws(JSONScanner.Failure) {
        var failure: JSONScanner.Failure?
        withUnsafeBufferPointer { buffer in
            do throws(JSONScanner.Failure) { try body(buffer) } catch { failure = error }
        }
        if let failure { throw failure }
    }
}
