/// One complete SMTP reply (RFC 5321 §4.2): a three-digit code and one or more lines of text.
struct SMTPReply: Sendable, Equatable {
    /// The reply code, 200–599.
    let code: Int
    /// The text of each line, after the code and its separator.
    let lines: [String]

    /// The first digit: 2 success, 3 intermediate, 4 transient failure, 5 permanent failure.
    var category: Int { code / 100 }

    /// The RFC 3463 enhanced status code at the start of the first line (e.g. `5.7.8`), if any.
    var enhancedCode: String? {
        guard let first = lines.first, let word = first.split(separator: " ").first else { return nil }
        let parts = word.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let klass = parts.first, klass.count == 1, "245".contains(klass),
            parts.allSatisfy({ !$0.isEmpty && $0.count <= 3 && $0.allSatisfy { $0.isASCII && $0.isNumber } })
        else { return nil }
        return String(word)
    }

    /// `535` or `535 5.7.8`: what a safe error message shows.
    var codeDescription: String {
        enhancedCode.map { "\(code) \($0)" } ?? "\(code)"
    }

    /// The server's text, lines joined, for `debugDescription`.
    var text: String { lines.joined(separator: " / ") }
}

/// Cuts a byte stream into SMTP replies. Bounded: a line longer than `maximumLineLength`
/// or a reply of more than `maximumLines` lines is a protocol violation, so a hostile
/// server cannot make the client buffer without end.
struct SMTPReplyParser: Sendable {
    /// The longest reply line accepted (RFC 5321 allows 512 octets; servers send more).
    static let maximumLineLength = 4096
    /// The most lines one reply may have.
    static let maximumLines = 200

    private var buffer: [UInt8] = []
    private var lines: [String] = []
    private var code: Int?

    /// Whether bytes that are not yet a complete reply are waiting.
    var hasBufferedBytes: Bool { !buffer.isEmpty || !lines.isEmpty }

    /// Adds received bytes.
    mutating func append(_ bytes: some Sequence<UInt8>) {
        buffer.append(contentsOf: bytes)
    }

    /// The next complete reply, nil if more bytes are needed.
    /// - Throws: `Malformed` for a malformed or over-long reply.
    mutating func next() throws -> SMTPReply? {
        while let newline = buffer.firstIndex(of: 0x0A) {
            var end = newline
            if end > 0 && buffer[end - 1] == 0x0D { end -= 1 }
            let line = Array(buffer[..<end])
            buffer.removeSubrange(...newline)
            guard line.count <= Self.maximumLineLength else { throw violation("a reply line is too long") }
            guard line.count >= 3, line[0] >= UInt8(ascii: "2"), line[0] <= UInt8(ascii: "5"),
                line[1...2].allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
            else { throw violation("a reply does not start with a three-digit code") }
            let lineCode = Int(line[0] - 48) * 100 + Int(line[1] - 48) * 10 + Int(line[2] - 48)
            if let code, code != lineCode { throw violation("the lines of a reply have different codes") }
            code = lineCode
            let separator = line.count > 3 ? line[3] : UInt8(ascii: " ")
            guard separator == UInt8(ascii: " ") || separator == UInt8(ascii: "-") else {
                throw violation("a reply line has no space or hyphen after its code")
            }
            lines.append(String(decoding: line.dropFirst(4), as: UTF8.self))
            guard lines.count <= Self.maximumLines else { throw violation("a reply has too many lines") }
            if separator == UInt8(ascii: " ") {
                let reply = SMTPReply(code: lineCode, lines: lines)
                lines = []
                code = nil
                return reply
            }
        }
        guard buffer.count <= Self.maximumLineLength + 2 else { throw violation("a reply line is too long") }
        return nil
    }

    /// Why the bytes are not a valid reply.
    struct Malformed: Error, Equatable {
        let reason: String
    }

    private func violation(_ reason: String) -> Malformed {
        Malformed(reason: reason)
    }
}
