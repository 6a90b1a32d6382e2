import TrunkCrypto
import XCTest

@testable import Mail

final class MIMEMessageTests: XCTestCase {
    func testDateHeader() {
        // Expected values from Python's email.utils.formatdate.
        XCTAssertEqual(MIMEMessage.dateHeaderValue(unixTime: 0), "Thu, 01 Jan 1970 00:00:00 +0000")
        XCTAssertEqual(MIMEMessage.dateHeaderValue(unixTime: 951_782_400), "Tue, 29 Feb 2000 00:00:00 +0000")
        XCTAssertEqual(MIMEMessage.dateHeaderValue(unixTime: 1_700_000_000), "Tue, 14 Nov 2023 22:13:20 +0000")
        XCTAssertEqual(MIMEMessage.dateHeaderValue(unixTime: 4_102_444_799), "Thu, 31 Dec 2099 23:59:59 +0000")
        XCTAssertEqual(MIMEMessage.dateHeaderValue(unixTime: -1), "Wed, 31 Dec 1969 23:59:59 +0000")
    }

    func testEncodedWordsHoldWholeCharactersWithinTheLengthLimit() {
        XCTAssertEqual(MIMEMessage.encodedWords("Grüße"), ["=?UTF-8?B?R3LDvMOfZQ==?="])
        XCTAssertEqual(MIMEMessage.encodedWords(""), ["=?UTF-8?B??="])
        let long = String(repeating: "Grüße aus Köln 👩‍👩‍👧‍👦 ✓ ", count: 12)
        let words = MIMEMessage.encodedWords(long)
        XCTAssertGreaterThan(words.count, 5)
        var decoded: [UInt8] = []
        for word in words {
            XCTAssertLessThanOrEqual(word.utf8.count, 75, word)
            XCTAssertTrue(word.hasPrefix("=?UTF-8?B?") && word.hasSuffix("?="), word)
            let bytes = Base64.decode(String(word.dropFirst(10).dropLast(2)))
            XCTAssertNotNil(bytes)
            // Each word is valid UTF-8 on its own (no character split across words).
            XCTAssertNotNil(bytes.flatMap { String(strictUTF8: $0) }, word)
            decoded += bytes ?? []
        }
        XCTAssertEqual(String(decoding: decoded, as: UTF8.self), long)
    }

    func testSubjectHeader() {
        XCTAssertEqual(MIMEMessage.subjectHeader("Your sign-in code: 123456"), "Subject: Your sign-in code: 123456\r\n")
        XCTAssertEqual(MIMEMessage.subjectHeader("Grüße"), "Subject: =?UTF-8?B?R3LDvMOfZQ==?=\r\n")
        // Text that looks like an encoded-word is encoded, so readers do not decode it.
        XCTAssertTrue(MIMEMessage.subjectHeader("=?UTF-8?B?eA==?=").hasPrefix("Subject: =?UTF-8?B?"))
        XCTAssertTrue(MIMEMessage.subjectHeader("tab\there").hasPrefix("Subject: =?UTF-8?B?"))

        let long = (1...40).map { "word\($0)" }.joined(separator: " ")
        let field = MIMEMessage.subjectHeader(long)
        XCTAssertTrue(field.hasSuffix("\r\n"))
        // ("\r\n" is one Character: drop it as bytes.)
        let folded = String(decoding: field.utf8.dropLast(2), as: UTF8.self)
        let lines = folded.components(separatedBy: "\r\n")
        XCTAssertGreaterThan(lines.count, 2)
        for line in lines { XCTAssertLessThanOrEqual(line.utf8.count, 78, line) }
        XCTAssertTrue(lines.dropFirst().allSatisfy { $0.hasPrefix(" ") })
        XCTAssertEqual(folded.replacingOccurrences(of: "\r\n", with: ""), "Subject: " + long)

        let unbreakable = String(repeating: "x", count: 1200)
        XCTAssertTrue(MIMEMessage.subjectHeader(unbreakable).hasPrefix("Subject: =?UTF-8?B?"))
    }

    func testAddressHeaders() throws {
        XCTAssertEqual(MIMEMessage.addressHeaderValue(try MailAddress("a@example.com")), "a@example.com")
        XCTAssertEqual(
            MIMEMessage.addressHeaderValue(try MailAddress("Trunk Sync <no-reply@trunk.test>")),
            "Trunk Sync <no-reply@trunk.test>")
        XCTAssertEqual(
            MIMEMessage.addressHeaderValue(try MailAddress("\"Doe, J. \\\"Jo\\\"\" <j@example.com>")),
            "\"Doe, J. \\\"Jo\\\"\" <j@example.com>")
        XCTAssertEqual(
            MIMEMessage.addressHeaderValue(try MailAddress("Zoë <zoe@example.com>")),
            "=?UTF-8?B?Wm/Dqw==?= <zoe@example.com>")
    }

    func testASCIIBodyIs7bitWithCRLF() {
        let (encoding, bytes) = MIMEMessage.encodeBody("line one\nline two\r\nthree\rfour")
        XCTAssertEqual(encoding, "7bit")
        XCTAssertEqual(String(decoding: bytes, as: UTF8.self), "line one\r\nline two\r\nthree\r\nfour\r\n")
    }

    func testNonASCIIOrLongLinesAreQuotedPrintable() {
        XCTAssertEqual(MIMEMessage.encodeBody("Grüße").encoding, "quoted-printable")
        XCTAssertEqual(MIMEMessage.encodeBody(String(repeating: "a", count: 999)).encoding, "quoted-printable")
        XCTAssertEqual(MIMEMessage.encodeBody(String(repeating: "a", count: 998)).encoding, "7bit")
        XCTAssertEqual(MIMEMessage.encodeBody("nul \u{0} byte").encoding, "quoted-printable")
        XCTAssertEqual(
            String(decoding: MIMEMessage.encodeBody("a = b \nü").bytes, as: UTF8.self), "a =3D b=20\r\n=C3=BC\r\n")
    }

    func testQuotedPrintableRoundTripsWithinLineLimits() {
        let samples = [
            "Grüße\nSchöne Grüße aus Köln — ✓ 👩‍👩‍👧‍👦",
            String(repeating: "a", count: 999),
            "trailing space \nand tab\t\nequals = sign\nnul \u{0} byte",
            String(repeating: "é ", count: 200),
            String(repeating: "=", count: 100) + "x",
            String(repeating: "a", count: 74) + " ",
            String(repeating: "a", count: 75) + "é",
            ".leading dot\n.\n",
        ]
        for sample in samples {
            var bytes: [UInt8] = []
            for line in MIMEMessage.normalizedLines(sample) {
                MIMEMessage.appendQuotedPrintable(line, to: &bytes)
                bytes += [0x0D, 0x0A]
            }
            let text = String(decoding: bytes, as: UTF8.self)
            for line in text.components(separatedBy: "\r\n") {
                XCTAssertLessThanOrEqual(line.utf8.count, 76, line)
                XCTAssertFalse(line.hasSuffix(" ") || line.hasSuffix("\t"), "trailing white space: \(line)")
                XCTAssertTrue(line.utf8.allSatisfy { $0 < 0x80 })
            }
            let expected = MIMEMessage.normalizedLines(sample).map { String(decoding: $0, as: UTF8.self) + "\r\n" }
                .joined()
            XCTAssertEqual(Self.decodeQuotedPrintable(bytes), expected)
        }
    }

    func testLineNormalisation() {
        let lines = MIMEMessage.normalizedLines("a\r\nb\rc\nd\n\ne").map { String(decoding: $0, as: UTF8.self) }
        XCTAssertEqual(lines, ["a", "b", "c", "d", "", "e"])
        XCTAssertEqual(MIMEMessage.normalizedLines("x\r\n").count, 1)
        XCTAssertEqual(MIMEMessage.normalizedLines("").count, 0)
    }

    func testRenderedMessage() throws {
        let message = MailMessage(
            from: "Trunk <no-reply@trunk.test>", to: "zoe@example.com", subject: "Grüße", textBody: "Hallo Zoë\n.\n")
        let rendered = try MIMEMessage(message, unixTime: 1_700_000_000, uniqueID: "abc123")
        XCTAssertEqual(rendered.sender.address, "no-reply@trunk.test")
        XCTAssertEqual(rendered.recipient.address, "zoe@example.com")
        XCTAssertEqual(
            String(decoding: rendered.data, as: UTF8.self),
            """
            Date: Tue, 14 Nov 2023 22:13:20 +0000\r
            From: Trunk <no-reply@trunk.test>\r
            To: zoe@example.com\r
            Subject: =?UTF-8?B?R3LDvMOfZQ==?=\r
            Message-ID: <abc123@trunk.test>\r
            MIME-Version: 1.0\r
            Content-Type: text/plain; charset=utf-8\r
            Content-Transfer-Encoding: quoted-printable\r
            \r
            Hallo Zo=C3=AB\r
            .\r

            """)
    }

    func testMessagesThatCannotBeSentAreRejected() {
        let good = MailMessage(from: "a@example.com", to: "b@example.com", subject: "s", textBody: "b")
        var newline = good
        newline.subject = "one\r\nBcc: victim@example.com"
        var badRecipient = good
        badRecipient.to = "b@example.com>\r\nRCPT TO:<c@example.com"
        var badSender = good
        badSender.from = "no at sign"
        for message in [newline, badRecipient, badSender] {
            XCTAssertThrowsError(try MIMEMessage(message, unixTime: 0)) { error in
                XCTAssertEqual((error as? MailError)?.kind, .invalidMessage)
            }
        }
        XCTAssertNoThrow(try MIMEMessage(good, unixTime: 0))
    }

    func testAddressParsing() throws {
        let valid: [(String, String, String?)] = [
            ("a@example.com", "a@example.com", nil),
            ("  a@example.com ", "a@example.com", nil),
            ("no-reply@localhost", "no-reply@localhost", nil),
            ("first.last+tag@sub.example.co.uk", "first.last+tag@sub.example.co.uk", nil),
            ("x@[192.0.2.1]", "x@[192.0.2.1]", nil),
            ("x@[IPv6:2001:db8::1]", "x@[IPv6:2001:db8::1]", nil),
            ("Trunk <no-reply@trunk.test>", "no-reply@trunk.test", "Trunk"),
            ("\"Doe, John\" <j@example.com>", "j@example.com", "Doe, John"),
            ("Zoë Ñandú <z@example.com>", "z@example.com", "Zoë Ñandú"),
            ("<bare@example.com>", "bare@example.com", nil),
        ]
        for (text, address, name) in valid {
            let parsed = try MailAddress(text)
            XCTAssertEqual(parsed.address, address, text)
            XCTAssertEqual(parsed.displayName, name, text)
        }
        let invalid = [
            "", "plain", "@example.com", "a@", "a@@example.com", ".a@example.com", "a.@example.com", "a..b@example.com",
            "a b@example.com", "zoë@example.com", "a@exämple.com", "a@-example.com", "a@example..com", "a@example.com.",
            "a@ex_ample.com", "\"quoted\"@example.com", "a\r\n@example.com", "a@[1.2.3.4",
            "Name\r\nBcc: x <a@example.com>", String(repeating: "a", count: 65) + "@example.com",
            "a@" + String(repeating: "b", count: 64) + ".com",
        ]
        for text in invalid {
            XCTAssertThrowsError(try MailAddress(text, role: "recipient"), text.debugDescription) { error in
                XCTAssertEqual((error as? MailError)?.kind, .invalidMessage)
                XCTAssertTrue("\(error)".hasPrefix("the recipient address"), "\(error)")
            }
        }
    }

    func testSignInCodeMessage() {
        let message = MailMessage.signInCode(
            code: "123456", to: "a@example.com", from: "no-reply@trunk.test", expiresInMinutes: 10)
        XCTAssertEqual(message.subject, "Your sign-in code: 123456")
        XCTAssertEqual(message.to, "a@example.com")
        XCTAssertEqual(message.from, "no-reply@trunk.test")
        XCTAssertTrue(message.textBody.contains("\n    123456\n"))
        XCTAssertTrue(message.textBody.contains("expires in 10 minutes"))
        XCTAssertEqual(message.logSummary, "sign-in code for a@example.com: 123456")
        XCTAssertTrue(
            MailMessage.signInCode(code: "1", to: "a@b.c", from: "d@e.f", expiresInMinutes: 1).textBody.contains(
                "in 1 minute "))
        // ASCII only, so it goes out as 7bit.
        XCTAssertEqual(MIMEMessage.encodeBody(message.textBody).encoding, "7bit")
    }

    /// A strict quoted-printable decoder for the tests.
    static func decodeQuotedPrintable(_ bytes: [UInt8]) -> String? {
        var output: [UInt8] = []
        var index = 0
        func hex(_ byte: UInt8) -> UInt8? {
            switch byte {
            case 0x30...0x39: return byte - 0x30
            case 0x41...0x46: return byte - 0x41 + 10
            default: return nil
            }
        }
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "=") {
                if index + 2 < bytes.count, bytes[index + 1] == 0x0D, bytes[index + 2] == 0x0A {
                    index += 3
                    continue
                }
                guard index + 2 < bytes.count, let high = hex(bytes[index + 1]), let low = hex(bytes[index + 2]) else {
                    return nil
                }
                output.append(high << 4 | low)
                index += 3
            } else {
                output.append(byte)
                index += 1
            }
        }
        return String(decoding: output, as: UTF8.self)
    }
}

extension String {
    /// Decodes `bytes` as UTF-8, or nil if they are not valid UTF-8.
    init?(strictUTF8 bytes: [UInt8]) {
        let decoded = String(decoding: bytes, as: UTF8.self)
        guard decoded.utf8.elementsEqual(bytes) else { return nil }
        self = decoded
    }
}
