import Foundation
import Postgres

/// RFC 3339 timestamps: strict parsing at the edge and fast formatting for responses.
public enum RFC3339 {
    /// Formats `timestamp` as `2026-11-22T04:10:02.123456Z` (`fraction` 0, 3 or 6 digits)
    /// or with `+00:00` when `zulu` is false (PostgREST's style).
    public static func format(_ timestamp: PostgresTimestamp, fractionDigits: Int = 6, zulu: Bool = true) -> String {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: maxFormattedLength) { buffer in
            guard let base = buffer.baseAddress else { return "" }
            let count = write(timestamp, fractionDigits: fractionDigits, zulu: zulu, to: base)
            return String(decoding: UnsafeBufferPointer(start: base, count: count), as: UTF8.self)
        }
    }

    /// The longest text `format` and `write` produce.
    static let maxFormattedLength = 32

    /// Writes what `format` returns to `out` (room for `maxFormattedLength` bytes) and
    /// returns the number of bytes written: for encoders that build responses in place.
    static func write(
        _ timestamp: PostgresTimestamp, fractionDigits: Int, zulu: Bool, to out: UnsafeMutablePointer<UInt8>
    ) -> Int {
        var micros = timestamp.microsecondsSinceEpoch
        var seconds = micros / 1_000_000
        micros %= 1_000_000
        if micros < 0 {
            micros += 1_000_000
            seconds -= 1
        }
        let (year, month, day) = civilFromDays(Int(seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400))
        let secondOfDay = Int(((seconds % 86_400) + 86_400) % 86_400)
        var position = out
        func digits(_ value: Int, _ width: Int) {
            var rest = value
            for index in stride(from: width - 1, through: 0, by: -1) {
                position[index] = UInt8(48 + rest % 10)
                rest /= 10
            }
            position += width
        }
        func byte(_ value: UInt8) {
            position.pointee = value
            position += 1
        }
        digits(year, 4)
        byte(UInt8(ascii: "-"))
        digits(month, 2)
        byte(UInt8(ascii: "-"))
        digits(day, 2)
        byte(UInt8(ascii: "T"))
        digits(secondOfDay / 3600, 2)
        byte(UInt8(ascii: ":"))
        digits(secondOfDay / 60 % 60, 2)
        byte(UInt8(ascii: ":"))
        digits(secondOfDay % 60, 2)
        if fractionDigits == 3 {
            byte(UInt8(ascii: "."))
            digits(Int(micros / 1000), 3)
        } else if fractionDigits == 6 {
            byte(UInt8(ascii: "."))
            digits(Int(micros), 6)
        }
        if zulu {
            byte(UInt8(ascii: "Z"))
        } else {
            for character in "+00:00".utf8 { byte(character) }
        }
        return position - out
    }

    /// Formats like PostgREST (PostgreSQL's output): `2026-11-22T04:10:02.123+00:00`, the
    /// fraction without trailing zeros, none when whole.
    public static func formatPostgREST(_ timestamp: PostgresTimestamp) -> String {
        var text = format(timestamp, fractionDigits: 6, zulu: false)
        // "…:SS.ffffff+00:00": trim zeros at the end of the fraction, then a bare dot.
        guard let dot = text.lastIndex(of: ".") else { return text }
        let suffixStart = text.index(text.endIndex, offsetBy: -6)
        var fraction = text[text.index(after: dot)..<suffixStart]
        while fraction.last == "0" { fraction = fraction.dropLast() }
        text = String(text[..<dot]) + (fraction.isEmpty ? "" : "." + fraction) + "+00:00"
        return text
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` (`t`/`z` and a space for `T`
    /// accepted; up to 9 fraction digits, rounded down to microseconds). Nil for anything
    /// else — including Postgres's `now`, `epoch`, `infinity`.
    public static func parse(_ text: String) -> PostgresTimestamp? {
        var text = text
        return text.withUTF8 { parse($0) }
    }

    /// As `parse(_:)`, from UTF-8 bytes.
    public static func parse(_ bytes: UnsafeBufferPointer<UInt8>) -> PostgresTimestamp? {
        var index = 0
        func number(_ count: Int) -> Int? {
            guard index + count <= bytes.count else { return nil }
            var value = 0
            for byte in bytes[index..<index + count] {
                guard byte >= 48, byte <= 57 else { return nil }
                value = value * 10 + Int(byte - 48)
            }
            index += count
            return value
        }
        func expect(_ characters: [UInt8]) -> Bool {
            guard index < bytes.count, characters.contains(bytes[index]) else { return false }
            index += 1
            return true
        }
        guard let year = number(4), expect([45]), let month = number(2), expect([45]), let day = number(2),
            expect([84, 116, 32]), let hour = number(2), expect([58]), let minute = number(2), expect([58]),
            let second = number(2)
        else { return nil }
        guard (1...12).contains(month), day >= 1, day <= daysInMonth(year, month), hour <= 23, minute <= 59,
            second <= 59
        else { return nil }
        var micros = 0
        if index < bytes.count, bytes[index] == 46 {
            index += 1
            var digits = 0
            while index < bytes.count, bytes[index] >= 48, bytes[index] <= 57 {
                if digits < 6 { micros = micros * 10 + Int(bytes[index] - 48) }
                digits += 1
                index += 1
            }
            guard (1...9).contains(digits) else { return nil }
            // (A range `digits..<6` would trap for 7 to 9 digits.)
            if digits < 6 {
                for _ in digits..<6 { micros *= 10 }
            }
        }
        var offsetSeconds = 0
        if expect([90, 122]) {
            offsetSeconds = 0
        } else if index < bytes.count, bytes[index] == 43 || bytes[index] == 45 {
            let sign = bytes[index] == 45 ? -1 : 1
            index += 1
            guard let offsetHours = number(2), expect([58]), let offsetMinutes = number(2), offsetHours <= 23,
                offsetMinutes <= 59
            else { return nil }
            offsetSeconds = sign * (offsetHours * 3600 + offsetMinutes * 60)
        } else {
            return nil
        }
        guard index == bytes.count else { return nil }
        let days = daysFromCivil(year, month, day)
        let seconds = Int64(days) * 86_400 + Int64(hour * 3600 + minute * 60 + second) - Int64(offsetSeconds)
        let microseconds = seconds * 1_000_000 + Int64(micros)
        // Years 0001–9999 in UTC: what the offset moves outside cannot be written back.
        guard (minimumMicroseconds...maximumMicroseconds).contains(microseconds) else { return nil }
        return PostgresTimestamp(microsecondsSinceEpoch: microseconds)
    }

    static let minimumMicroseconds = Int64(daysFromCivil(1, 1, 1)) * 86_400 * 1_000_000
    static let maximumMicroseconds = Int64(daysFromCivil(10_000, 1, 1)) * 86_400 * 1_000_000 - 1

    private static func daysInMonth(_ year: Int, _ month: Int) -> Int {
        switch month {
        case 2: return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    // Howard Hinnant's civil-date algorithms (public domain).
    static func daysFromCivil(_ year: Int, _ month: Int, _ day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    static func civilFromDays(_ days: Int) -> (Int, Int, Int) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}
