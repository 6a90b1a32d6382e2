import Foundation

/// A small JSON reader that hands out the exact bytes of values, so an event's payload
/// reaches the app byte for byte as the server sent it (Foundation's `JSONSerialization`
/// would turn `12345678901234567890` into a `Double` and reorder keys).
struct RawJSONReader {
    struct Malformed: Error, CustomStringConvertible {
        var offset: Int
        var reason: String
        var description: String { "malformed JSON at byte \(offset): \(reason)" }
    }

    let bytes: [UInt8]
    private(set) var position = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    private func fail(_ reason: String) -> Malformed { Malformed(offset: position, reason: reason) }

    mutating func skipWhitespace() {
        while position < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[position]) { position += 1 }
    }

    private mutating func expect(_ byte: UInt8) throws {
        skipWhitespace()
        guard position < bytes.count, bytes[position] == byte else {
            throw fail("expected \(Character(Unicode.Scalar(byte)))")
        }
        position += 1
    }

    private mutating func peek() -> UInt8? {
        skipWhitespace()
        return position < bytes.count ? bytes[position] : nil
    }

    /// Calls `body` with each key of an object, positioned at its value; `body` must read
    /// or skip the value.
    mutating func readObject(_ body: (String, inout RawJSONReader) throws -> Void) throws {
        try expect(UInt8(ascii: "{"))
        if peek() == UInt8(ascii: "}") {
            position += 1
            return
        }
        while true {
            let key = try readString()
            try expect(UInt8(ascii: ":"))
            try body(key, &self)
            if peek() == UInt8(ascii: ",") {
                position += 1
                continue
            }
            try expect(UInt8(ascii: "}"))
            return
        }
    }

    /// Calls `body` for each element of an array, positioned at it.
    mutating func readArray(_ body: (inout RawJSONReader) throws -> Void) throws {
        try expect(UInt8(ascii: "["))
        if peek() == UInt8(ascii: "]") {
            position += 1
            return
        }
        while true {
            try body(&self)
            if peek() == UInt8(ascii: ",") {
                position += 1
                continue
            }
            try expect(UInt8(ascii: "]"))
            return
        }
    }

    /// Skips one value and returns its bytes.
    mutating func readRaw() throws -> ArraySlice<UInt8> {
        skipWhitespace()
        let start = position
        try skipValue()
        return bytes[start..<position]
    }

    private mutating func skipValue() throws {
        guard let first = peek() else { throw fail("expected a value") }
        switch first {
        case UInt8(ascii: "{"): try readObject { _, reader in try reader.skipValue() }
        case UInt8(ascii: "["): try readArray { reader in try reader.skipValue() }
        case UInt8(ascii: "\""): _ = try readString()
        default:
            let start = position
            while position < bytes.count {
                let byte = bytes[position]
                let isScalarByte =
                    (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || byte == UInt8(ascii: "-")
                    || byte == UInt8(ascii: "+") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "e")
                    || byte == UInt8(ascii: "E") || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
                guard isScalarByte else { break }
                position += 1
            }
            let word = String(decoding: bytes[start..<position], as: UTF8.self)
            guard !word.isEmpty, ["true", "false", "null"].contains(word) || Double(word) != nil else {
                position = start
                throw fail("expected a value")
            }
        }
    }

    mutating func readString() throws -> String {
        try expect(UInt8(ascii: "\""))
        var scalars = String.UnicodeScalarView()
        var runStart = position
        func flush(_ reader: RawJSONReader, upTo end: Int) {
            scalars.append(contentsOf: String(decoding: reader.bytes[runStart..<end], as: UTF8.self).unicodeScalars)
        }
        while true {
            guard position < bytes.count else { throw fail("unterminated string") }
            let byte = bytes[position]
            if byte == UInt8(ascii: "\"") {
                flush(self, upTo: position)
                position += 1
                return String(scalars)
            }
            if byte < 0x20 { throw fail("control character in a string") }
            if byte != UInt8(ascii: "\\") {
                position += 1
                continue
            }
            flush(self, upTo: position)
            position += 1
            guard position < bytes.count else { throw fail("unterminated escape") }
            let escape = bytes[position]
            position += 1
            switch escape {
            case UInt8(ascii: "\""): scalars.append("\"")
            case UInt8(ascii: "\\"): scalars.append("\\")
            case UInt8(ascii: "/"): scalars.append("/")
            case UInt8(ascii: "b"): scalars.append("\u{08}")
            case UInt8(ascii: "f"): scalars.append("\u{0C}")
            case UInt8(ascii: "n"): scalars.append("\n")
            case UInt8(ascii: "r"): scalars.append("\r")
            case UInt8(ascii: "t"): scalars.append("\t")
            case UInt8(ascii: "u"):
                var unit = try readHex4()
                if (0xD800..<0xDC00).contains(unit), position + 1 < bytes.count, bytes[position] == UInt8(ascii: "\\"),
                    bytes[position + 1] == UInt8(ascii: "u")
                {
                    let save = position
                    position += 2
                    let low = try readHex4()
                    if (0xDC00..<0xE000).contains(low) {
                        unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                    } else {
                        position = save
                    }
                }
                scalars.append(Unicode.Scalar(unit) ?? "\u{FFFD}")
            default: throw fail("bad escape")
            }
            runStart = position
        }
    }

    private mutating func readHex4() throws -> UInt32 {
        guard position + 4 <= bytes.count else { throw fail("short \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[position]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw fail("bad \\u escape")
            }
            value = value << 4 | UInt32(digit)
            position += 1
        }
        return value
    }

    mutating func readInt64() throws -> Int64 {
        let raw = try readRaw()
        guard let value = Int64(String(decoding: raw, as: UTF8.self)) else { throw fail("expected an integer") }
        return value
    }

    mutating func readBool() throws -> Bool {
        switch String(decoding: try readRaw(), as: UTF8.self) {
        case "true": return true
        case "false": return false
        default: throw fail("expected true or false")
        }
    }

    /// Whether the rest is only whitespace.
    mutating func atEnd() -> Bool { peek() == nil }
}

enum JSONText {
    /// `text` as a JSON string literal (quotes included).
    static func quoted(_ text: String) -> [UInt8] {
        var out: [UInt8] = [UInt8(ascii: "\"")]
        out.reserveCapacity(text.utf8.count + 2)
        let hex = Array("0123456789abcdef".utf8)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out += [UInt8(ascii: "\\"), UInt8(ascii: "\"")]
            case UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
            case 0x0A: out += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case 0x0D: out += [UInt8(ascii: "\\"), UInt8(ascii: "r")]
            case 0x09: out += [UInt8(ascii: "\\"), UInt8(ascii: "t")]
            case 0..<0x20:
                out += Array("\\u00".utf8) + [hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
        return out
    }
}

/// RFC 3339 timestamps as the server writes and reads them, without a `DateFormatter`
/// (which is neither `Sendable` nor cheap).
enum RFC3339 {
    /// `2026-11-22T04:10:02.123Z`: UTC, milliseconds.
    static func format(_ date: Date) -> String {
        let totalMilliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded(.down))
        var days = totalMilliseconds / 86_400_000
        var milliseconds = totalMilliseconds % 86_400_000
        if milliseconds < 0 {
            milliseconds += 86_400_000
            days -= 1
        }
        let (year, month, day) = civil(fromDays: days)
        let seconds = milliseconds / 1000
        func pad(_ value: Int64, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(year, 4))-\(pad(month, 2))-\(pad(day, 2))T\(pad(seconds / 3600, 2)):\(pad(seconds / 60 % 60, 2))"
            + ":\(pad(seconds % 60, 2)).\(pad(milliseconds % 1000, 3))Z"
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`; nil when it is not that.
    static func parse(_ text: String) -> Date? {
        let bytes = Array(text.utf8)
        var position = 0
        func number(_ digits: Int) -> Int64? {
            guard position + digits <= bytes.count else { return nil }
            var value: Int64 = 0
            for byte in bytes[position..<(position + digits)] {
                guard byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") else { return nil }
                value = value * 10 + Int64(byte - UInt8(ascii: "0"))
            }
            position += digits
            return value
        }
        func literal(_ characters: String) -> Bool {
            guard position < bytes.count, characters.utf8.contains(bytes[position]) else { return false }
            position += 1
            return true
        }
        guard let year = number(4), literal("-"), let month = number(2), literal("-"), let day = number(2),
            literal("Tt "), let hour = number(2), literal(":"), let minute = number(2), literal(":"),
            let second = number(2), (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60,
            second < 61
        else { return nil }
        var fraction = 0.0
        if literal(".") {
            var scale = 0.1
            let start = position
            while position < bytes.count, bytes[position] >= UInt8(ascii: "0"), bytes[position] <= UInt8(ascii: "9") {
                fraction += Double(bytes[position] - UInt8(ascii: "0")) * scale
                scale /= 10
                position += 1
            }
            guard position > start else { return nil }
        }
        var offset: Int64 = 0
        if literal("Zz") {
        } else if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") {
            let sign: Int64 = bytes[position] == UInt8(ascii: "-") ? -1 : 1
            position += 1
            guard let hours = number(2), literal(":"), let minutes = number(2) else { return nil }
            offset = sign * (hours * 3600 + minutes * 60)
        } else {
            return nil
        }
        guard position == bytes.count else { return nil }
        let days = self.days(fromCivil: year, month, day)
        let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset
        return Date(timeIntervalSince1970: Double(seconds) + fraction)
    }

    // Howard Hinnant's algorithms (http://howardhinnant.github.io/date_algorithms.html).
    static func days(fromCivil year: Int64, _ month: Int64, _ day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    static func civil(fromDays days: Int64) -> (Int64, Int64, Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthPrime = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthPrime + 2) / 5 + 1
        let month = monthPrime < 10 ? monthPrime + 3 : monthPrime - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}
