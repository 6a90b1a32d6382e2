import TrunkCrypto
import XCTest

final class HexTests: XCTestCase {
    func testEncodesLowercaseTwoDigitsPerByte() {
        XCTAssertEqual(Hex.encode([UInt8]()), "")
        XCTAssertEqual(Hex.encode([0x00, 0x0f, 0xa0, 0xff]), "000fa0ff")
        XCTAssertEqual([0xde, 0xad, 0xbe, 0xef].hexString, "deadbeef")
    }

    func testDecodesEitherCase() {
        XCTAssertEqual(Hex.decode(""), [])
        XCTAssertEqual(Hex.decode("000fA0fF"), [0x00, 0x0f, 0xa0, 0xff])
        let bytes = SecureRandom.bytes(count: 100)
        XCTAssertEqual(Hex.decode(Hex.encode(bytes)), bytes)
    }

    func testRejectsOddLengthsAndNonDigits() {
        for invalid in ["0", "abc", "0g", "0x00", " 00", "00 ", "é0"] {
            XCTAssertNil(Hex.decode(invalid), invalid)
        }
    }
}
