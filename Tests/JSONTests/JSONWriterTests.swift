import Foundation
import XCTest

@testable import JSON

final class JSONWriterTests: XCTestCase {
    func quoted(_ text: String) -> String {
        var writer = JSONWriter()
        writer.appendQuoted(text)
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    func testEscapesOnlyWhatJSONRequiresAndCopiesTheRest() {
        XCTAssertEqual(quoted(""), #""""#)
        XCTAssertEqual(quoted("plain 0123 ü 🌱"), #""plain 0123 ü 🌱""#)
        XCTAssertEqual(quoted(#"a"b\c"#), #""a\"b\\c""#)
        XCTAssertEqual(quoted("\"\\"), #""\"\\""#, "escapes at both ends, nothing between")
        XCTAssertEqual(quoted("line\nreturn\r\ttab"), #""line\nreturn\r\ttab""#)
        XCTAssertEqual(quoted("\u{0}\u{1f}/\u{7f}"), #""\u0000\u001f/\#u{7f}""#)
    }

    func testEveryStringRoundTripsThroughAJSONParser() throws {
        var generator = SystemRandomNumberGenerator()
        let alphabet = Array("ab\"\\\n\r\t\u{0}\u{8}\u{1b}ü€🌱 /".unicodeScalars)
        for _ in 0..<500 {
            var text = String.UnicodeScalarView()
            for _ in 0..<Int.random(in: 0...24, using: &generator) {
                text.append(alphabet[Int.random(in: 0..<alphabet.count, using: &generator)])
            }
            let string = String(text)
            let encoded = quoted(string)
            let decoded = try JSONSerialization.jsonObject(with: Data(encoded.utf8), options: .fragmentsAllowed)
            XCTAssertEqual(decoded as? String, string, encoded)
        }
    }
}
