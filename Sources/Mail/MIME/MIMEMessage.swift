import TrunkCrypto

/// A `MailMessage` checked and written as an Internet message (RFC 5322 + MIME): the
/// bytes `DATA` sends (before dot-stuffing), with the envelope addresses beside them.
struct MIMEMessage: Sendable {
    /// The envelope sender (`MAIL FROM`).
    let sender: MailAddress
    /// The envelope recipient (`RCPT TO`).
    let recipient: MailAddress
    /// Headers and body, every line ending in CRLF.
    let data: [UInt8]

    /// Lines longer than this (in octets, without CRLF) are not allowed by RFC 5322 §2.1.1.
    static let maximumLineLength = 998

    /// Checks `message` and writes it.
    /// - Parameters:
    ///   - unixTime: the `Date` header's time, in seconds since 1970.
    ///   - uniqueID: the left part of the `Message-ID` (random by default).
    /// - Throws: `.invalidMessage` for an address that is not plain `local@domain`, or a
    ///   subject with a line break.
    init(_ message: MailMessage, unixTime: Int, uniqueID: String = Hex.encode(SecureRandom.bytes(count: 16))) throws {
        sender = try MailAddress(message.from, role: "sender")
        recipient = try MailAddress(message.to, role: "recipient")
        guard !message.subject.unicodeScalars.contains(where: { $0 == "\r" || $0 == "\n" }) else {
            throw MailError(.invalidMessage, "the subject contains a line break")
        }
        let (encoding, body) = Self.encodeBody(message.textBody)
        var header = ""
        header += "Date: \(Self.dateHeaderValue(unixTime: unixTime))\r\n"
        header += "From: \(Self.addressHeaderValue(sender))\r\n"
        header += "To: \(Self.addressHeaderValue(recipient))\r\n"
        header += Self.subjectHeader(message.subject)
        header += "Message-ID: <\(uniqueID)@\(sender.domain)>\r\n"
        header += "MIME-Version: 1.0\r\n"
        header += "Content-Type: text/plain; charset=utf-8\r\n"
        header += "Content-Transfer-Encoding: \(encoding)\r\n"
        header += "\r\n"
        data = Array(header.utf8) + body
    }

    // MARK: - Headers

    /// RFC 5322 §3.3 date-time in UTC, e.g. `Tue, 01 Dec 2026 04:10:02 +0000`.
    static func dateHeaderValue(unixTime: Int) -> String {
        let secondsPerDay = 86_400
        let days = unixTime >= 0 ? unixTime / secondsPerDay : (unixTime - secondsPerDay + 1) / secondsPerDay
        let secondOfDay = unixTime - days * secondsPerDay
        // Civil date from days since 1970-01-01 (H. Hinnant's algorithm, proleptic Gregorian).
        let shifted = days + 719_468
        let era = (shifted >= 0 ? shifted : shifted - 146_096) / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        let weekday = ((days % 7) + 11) % 7  // 1970-01-01 was a Thursday (index 4).
        let weekdays = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func twoDigits(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(weekdays[weekday]), \(twoDigits(day)) \(months[month - 1]) \(year) "
            + "\(twoDigits(secondOfDay / 3600)):\(twoDigits(secondOfDay / 60 % 60)):\(twoDigits(secondOfDay % 60)) +0000"
    }

    /// `addr`, `Name <addr>`, `"Quoted, Name" <addr>` or `=?UTF-8?B?…?= <addr>`.
    static func addressHeaderValue(_ address: MailAddress) -> String {
        guard let name = address.displayName else { return address.address }
        let scalars = name.unicodeScalars
        if scalars.allSatisfy({ MailAddress.isAtext($0) || $0 == " " }) && !name.contains("=?") {
            return "\(name) <\(address.address)>"
        }
        if scalars.allSatisfy({ $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F }) && !name.contains("=?") {
            var escaped = ""
            for character in name {
                if character == "\\" || character == "\"" { escaped.append("\\") }
                escaped.append(character)
            }
            return "\"\(escaped)\" <\(address.address)>"
        }
        return encodedWords(name).joined(separator: "\r\n ") + " <\(address.address)>"
    }

    /// The `Subject` field with its CRLF: as is when it is printable ASCII and fits on a
    /// line, folded at spaces when it is longer, and as RFC 2047 encoded-words otherwise
    /// (non-ASCII or control characters, text that looks like an encoded-word, or a word
    /// too long to fold).
    static func subjectHeader(_ subject: String) -> String {
        let name = "Subject: "
        let printableASCII = subject.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value < 0x7F }
        if printableASCII && !subject.contains("=?") {
            let folded = fold(name + subject)
            if folded.split(separator: "\r\n").allSatisfy({ $0.utf8.count <= maximumLineLength }) {
                return folded + "\r\n"
            }
        }
        return name + encodedWords(subject).joined(separator: "\r\n ") + "\r\n"
    }

    /// Breaks a header line before spaces so lines stay within 78 characters where the
    /// words allow (RFC 5322 §2.2.3); unfolding restores the original.
    static func fold(_ line: String) -> String {
        let limit = 78
        guard line.utf8.count > limit else { return line }
        var result = ""
        var current = ""
        for (index, word) in line.split(separator: " ", omittingEmptySubsequences: false).enumerated() {
            if index == 0 {
                current = String(word)
            } else if current.utf8.count + 1 + word.utf8.count <= limit || current.allSatisfy({ $0 == " " }) {
                current += " " + word
            } else {
                result += current + "\r\n"
                current = " " + word
            }
        }
        return result + current
    }

    /// `text` as RFC 2047 `B` encoded-words of UTF-8, each at most 75 characters and
    /// holding whole characters (a character is never split between two words).
    static func encodedWords(_ text: String) -> [String] {
        let maximumBytes = 45  // 60 base64 characters + `=?UTF-8?B?` + `?=` = 72 ≤ 75
        var words: [String] = []
        var chunk: [UInt8] = []
        func append(_ bytes: some Collection<UInt8>) {
            if chunk.count + bytes.count > maximumBytes && !chunk.isEmpty {
                words.append("=?UTF-8?B?\(Base64.encode(chunk))?=")
                chunk.removeAll(keepingCapacity: true)
            }
            chunk.append(contentsOf: bytes)
        }
        for character in text {
            let bytes = Array(character.utf8)
            if bytes.count <= maximumBytes {
                append(bytes)
            } else {
                // A grapheme this long (a long emoji sequence) is split between its scalars,
                // which RFC 2047 allows.
                for scalar in character.unicodeScalars { append(Array(String(scalar).utf8)) }
            }
        }
        if !chunk.isEmpty || words.isEmpty { words.append("=?UTF-8?B?\(Base64.encode(chunk))?=") }
        return words
    }

    // MARK: - Body

    /// The body with CRLF line endings (ending in one) and its transfer encoding: `7bit`
    /// when it is ASCII without NULs or over-long lines, `quoted-printable` otherwise
    /// (readable for mostly-ASCII text, safe through any relay).
    static func encodeBody(_ text: String) -> (encoding: String, bytes: [UInt8]) {
        let lines = normalizedLines(text)
        let plain = lines.allSatisfy { line in
            line.count <= maximumLineLength && line.allSatisfy { $0 != 0 && $0 < 0x80 }
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(lines.reduce(0) { $0 + $1.count + 2 } * (plain ? 1 : 2))
        for line in lines {
            if plain {
                bytes.append(contentsOf: line)
            } else {
                appendQuotedPrintable(line, to: &bytes)
            }
            bytes.append(contentsOf: [0x0D, 0x0A])
        }
        return (plain ? "7bit" : "quoted-printable", bytes)
    }

    /// The lines of `text`, split at CRLF, LF or a lone CR; a final line break does not
    /// start an empty line.
    static func normalizedLines(_ text: String) -> [[UInt8]] {
        var lines: [[UInt8]] = []
        var current: [UInt8] = []
        var previousWasCR = false
        for byte in text.utf8 {
            if byte == 0x0A && previousWasCR {
                previousWasCR = false
                continue
            }
            previousWasCR = byte == 0x0D
            if byte == 0x0D || byte == 0x0A {
                lines.append(current)
                current.removeAll(keepingCapacity: true)
            } else {
                current.append(byte)
            }
        }
        if !current.isEmpty { lines.append(current) }
        return lines
    }

    /// Appends one line as quoted-printable (RFC 2045 §6.7): printable ASCII but `=` as is,
    /// everything else as `=XX`, a space or tab at the end of the line encoded, and soft
    /// line breaks (`=` CRLF) keeping encoded lines within 76 characters.
    static func appendQuotedPrintable(_ line: [UInt8], to output: inout [UInt8]) {
        let hexDigits = Array("0123456789ABCDEF".utf8)
        var lineLength = 0
        for (index, byte) in line.enumerated() {
            let isLast = index == line.count - 1
            let literal =
                (byte >= 33 && byte <= 126 && byte != UInt8(ascii: "=")) || ((byte == 0x20 || byte == 0x09) && !isLast)
            let tokenLength = literal ? 1 : 3
            // Keep room for the `=` of a soft break, unless this token ends the line.
            let room = isLast ? 76 : 75
            if lineLength + tokenLength > room {
                output.append(contentsOf: [UInt8(ascii: "="), 0x0D, 0x0A])
                lineLength = 0
            }
            if literal {
                output.append(byte)
            } else {
                output.append(contentsOf: [UInt8(ascii: "="), hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0x0F)]])
            }
            lineLength += tokenLength
        }
    }
}
