import Foundation
import TrunkCrypto
import XCTest

final class Base64URLTests: XCTestCase {
    // RFC 4648 §10, without the padding base64url leaves out.
    func testRFC4648Vectors() {
        let vectors = [
            "": "", "f": "Zg", "fo": "Zm8", "foo": "Zm9v", "foob": "Zm9vYg", "fooba": "Zm9vYmE", "foobar": "Zm9vYmFy",
        ]
        for (plain, encoded) in vectors {
            XCTAssertEqual(Base64URL.encode(plain), encoded)
            XCTAssertEqual(Base64URL.decode(encoded), Array(plain.utf8))
        }
    }

    func testUsesTheURLSafeSymbols() {
        // Standard base64 of these bytes is "+/8=" and "-_-_".
        XCTAssertEqual(Base64URL.encode([0xfb, 0xff]), "-_8")
        XCTAssertEqual(Base64URL.decode("-_8"), [0xfb, 0xff])
        XCTAssertEqual(Base64URL.encode([0xfb, 0xef, 0xbe]), "----")
        XCTAssertEqual(Base64URL.encode([0xff, 0xff, 0xff]), "____")
    }

    func testRoundTripsRandomBytesOfEveryLengthUpTo64() {
        for count in 0...64 {
            let bytes = SecureRandom.bytes(count: count)
            let encoded = Base64URL.encode(bytes)
            XCTAssertEqual(encoded.utf8.count, (count * 4 + 2) / 3, "length \(count)")
            XCTAssertEqual(encoded, foundationBase64URL(bytes), "length \(count)")
            XCTAssertEqual(Base64URL.decode(encoded), bytes, "length \(count)")
            XCTAssertEqual(Base64URL.decode(Array(encoded.utf8)), bytes, "length \(count)")
        }
    }

    func testRejectsCharactersOutsideTheAlphabet() {
        for invalid in ["AB+C", "AB/C", "AB=C", "AB C", "ABC\n", "ABC.", "ABCé", "AB\u{0}C", "Zg==", "Zm8=", "===="] {
            XCTAssertNil(Base64URL.decode(invalid), invalid)
        }
    }

    func testRejectsImpossibleLengths() {
        for invalid in ["A", "AAAAA", "AAAAAAAAA"] {
            XCTAssertNil(Base64URL.decode(invalid), invalid)
        }
    }

    func testRejectsNonCanonicalTrailingBits() {
        // "Zg" is the only encoding of "f"; "Zh" … "Zv" carry bits that no byte has.
        XCTAssertEqual(Base64URL.decode("Zg"), Array("f".utf8))
        XCTAssertNil(Base64URL.decode("Zh"))
        XCTAssertNil(Base64URL.decode("Zv"))
        XCTAssertEqual(Base64URL.decode("Zm8"), Array("fo".utf8))
        XCTAssertNil(Base64URL.decode("Zm9"))
        XCTAssertNil(Base64URL.decode("AB"))
    }

    func testStandardBase64() {
        let vectors = [
            "": "", "f": "Zg==", "fo": "Zm8=", "foo": "Zm9v", "foob": "Zm9vYg==", "fooba": "Zm9vYmE=",
            "foobar": "Zm9vYmFy",
        ]
        for (plain, encoded) in vectors {
            XCTAssertEqual(Base64.encode(plain), encoded)
            XCTAssertEqual(Base64.decode(encoded), Array(plain.utf8))
        }
        for count in 0...64 {
            let bytes = SecureRandom.bytes(count: count)
            XCTAssertEqual(Base64.encode(bytes), Data(bytes).base64EncodedString(), "length \(count)")
            XCTAssertEqual(Base64.decode(Base64.encode(bytes)), bytes, "length \(count)")
        }
        XCTAssertEqual(Base64.encode([0xfb, 0xff]), "+/8=")
        for invalid in ["Zg", "Zg=", "Zg===", "Z===", "====", "Zg=A", "Zh==", "Zm9=", "-_8=", "Zm 9v", "Zm9v\r\n"] {
            XCTAssertNil(Base64.decode(invalid), invalid)
        }
    }

    private func foundationBase64URL(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
