/// The `DATA` encoding (RFC 5321 §4.5.2): CRLF line endings, a `.` doubled at the start of a
/// line (dot-stuffing), and the `CRLF . CRLF` terminator.
enum SMTPDataEncoding {
    static func encode(_ message: [UInt8]) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(message.count + message.count / 64 + 5)
        var atLineStart = true
        var index = 0
        while index < message.count {
            let byte = message[index]
            if byte == 0x0D || byte == 0x0A {
                // CRLF, a lone CR or a lone LF: one line break, written as CRLF.
                if byte == 0x0D && index + 1 < message.count && message[index + 1] == 0x0A { index += 1 }
                output.append(contentsOf: [0x0D, 0x0A])
                atLineStart = true
            } else {
                if atLineStart && byte == UInt8(ascii: ".") { output.append(byte) }
                output.append(byte)
                atLineStart = false
            }
            index += 1
        }
        if !atLineStart { output.append(contentsOf: [0x0D, 0x0A]) }
        output.append(contentsOf: [UInt8(ascii: "."), 0x0D, 0x0A])
        return output
    }
}
