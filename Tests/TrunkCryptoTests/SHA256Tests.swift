import TrunkCrypto
import XCTest

final class SHA256Tests: XCTestCase {
    // FIPS 180-2, appendix B, and the well-known digest of the empty string.
    func testPublishedVectors() {
        XCTAssertEqual(
            SHA256.hash("abc").hexString,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        )
        XCTAssertEqual(
            SHA256.hash("").hexString,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        )
        XCTAssertEqual(
            SHA256.hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").hexString,
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        )
        XCTAssertEqual(
            SHA256.hash([UInt8](repeating: UInt8(ascii: "a"), count: 1_000_000)).hexString,
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        )
    }

    func testEveryInputShapeHashesTheSameBytes() {
        let expected = SHA256.hash("abc")
        XCTAssertEqual(expected.count, SHA256.byteCount)
        XCTAssertEqual(SHA256.hash([0x61, 0x62, 0x63]), expected)
        XCTAssertEqual(SHA256.hash("xabcx".utf8.dropFirst().dropLast()), expected)
        XCTAssertEqual(SHA256.hash([0x00, 0x61, 0x62, 0x63][1...]), expected)
        // A collection without contiguous storage takes the copying path.
        XCTAssertEqual(SHA256.hash((0x61...0x63).map { UInt8($0) }.lazy.map { $0 }), expected)
    }

    func testIncrementalHashingMatchesOneShot() {
        let message = (0..<1000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        for split in [0, 1, 55, 56, 63, 64, 65, 500, 1000] {
            var hasher = SHA256()
            hasher.update(message[..<split])
            hasher.update(message[split...])
            XCTAssertEqual(hasher.finalize(), SHA256.hash(message), "split at \(split)")
        }
    }

    func testFinalizeLeavesTheStateUsable() {
        var hasher = SHA256()
        hasher.update("ab")
        let prefix = hasher
        XCTAssertEqual(hasher.finalize(), SHA256.hash("ab"))
        XCTAssertEqual(hasher.finalize(), SHA256.hash("ab"))
        hasher.update("c")
        XCTAssertEqual(hasher.finalize(), SHA256.hash("abc"))
        // Copies are independent values.
        XCTAssertEqual(prefix.finalize(), SHA256.hash("ab"))
    }
}
