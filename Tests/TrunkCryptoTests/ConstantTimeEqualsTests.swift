import TrunkCrypto
import XCTest

final class ConstantTimeEqualsTests: XCTestCase {
    func testEqualBytes() {
        XCTAssertTrue(constantTimeEquals([UInt8](), [UInt8]()))
        XCTAssertTrue(constantTimeEquals([1, 2, 3], [1, 2, 3]))
        let digest = SHA256.hash("token")
        XCTAssertTrue(constantTimeEquals(digest, SHA256.hash("token")))
        // Different collection types holding the same bytes.
        XCTAssertTrue(constantTimeEquals("abc".utf8, [0x61, 0x62, 0x63][...]))
        XCTAssertTrue(constantTimeEquals([9, 1, 2, 3, 9][1..<4], (1...3).map { UInt8($0) }.lazy.map { $0 }))
    }

    func testDifferentBytesOfTheSameLength() {
        XCTAssertFalse(constantTimeEquals([1, 2, 3], [1, 2, 4]))
        XCTAssertFalse(constantTimeEquals([0, 2, 3], [1, 2, 3]))
        XCTAssertFalse(constantTimeEquals(SHA256.hash("a"), SHA256.hash("b")))
    }

    func testDifferentLengthsAreNeverEqual() {
        XCTAssertFalse(constantTimeEquals([UInt8](), [0]))
        XCTAssertFalse(constantTimeEquals([0], [UInt8]()))
        XCTAssertFalse(constantTimeEquals([1, 2, 3], [1, 2]))
        XCTAssertFalse(constantTimeEquals([1, 2], [1, 2, 3]))
    }
}
