import XCTest

@testable import TrunkCrypto

final class AESGCMTests: XCTestCase {
    func bytes(_ hex: String) -> [UInt8] {
        stride(from: 0, to: hex.count, by: 2).map { offset in
            let start = hex.index(hex.startIndex, offsetBy: offset)
            return UInt8(hex[start..<hex.index(start, offsetBy: 2)], radix: 16) ?? 0
        }
    }

    /// The GCM specification's test cases 13 and 16 (AES-256, 96-bit IV).
    func testKnownAnswers() throws {
        XCTAssertEqual(
            Hex.encode(
                try AESGCM.seal(
                    [], key: [UInt8](repeating: 0, count: 32), nonce: [UInt8](repeating: 0, count: 12),
                    associatedData: [])),
            "000000000000000000000000" + "530f8afbc74536b9a963b4f1c4cb738b")
        let key = bytes("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
        let nonce = bytes("cafebabefacedbaddecaf888")
        let plaintext = bytes(
            "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"
        )
        let associated = bytes("feedfacedeadbeeffeedfacedeadbeefabaddad2")
        let sealed = try AESGCM.seal(plaintext, key: key, nonce: nonce, associatedData: associated)
        XCTAssertEqual(
            Hex.encode(sealed),
            "cafebabefacedbaddecaf888"
                + "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
                + "76fc6ece0f4e1768cddf8853bb2d551b")
        XCTAssertEqual(try AESGCM.open(sealed, key: key, associatedData: associated), plaintext)
    }

    func testRoundTripWithFreshNonces() throws {
        let key = SecureRandom.bytes(count: 32)
        let message = Array("-----BEGIN PRIVATE KEY-----".utf8)
        let first = try AESGCM.seal(message, key: key, associatedData: Array("kid".utf8))
        let second = try AESGCM.seal(message, key: key, associatedData: Array("kid".utf8))
        XCTAssertNotEqual(first, second, "a new nonce each time")
        XCTAssertEqual(first.count, 12 + message.count + 16)
        XCTAssertEqual(try AESGCM.open(first, key: key, associatedData: Array("kid".utf8)), message)
    }

    func testWrongKeyAssociatedDataOrAnyChangedByteFails() throws {
        let key = SecureRandom.bytes(count: 32)
        let sealed = try AESGCM.seal(Array("secret".utf8), key: key, associatedData: Array("a".utf8))
        XCTAssertThrowsError(
            try AESGCM.open(sealed, key: SecureRandom.bytes(count: 32), associatedData: Array("a".utf8))
        ) {
            XCTAssertEqual($0 as? AESGCM.Failure, .authenticationFailed)
        }
        XCTAssertThrowsError(try AESGCM.open(sealed, key: key, associatedData: Array("b".utf8)))
        for index in sealed.indices {
            var changed = sealed
            changed[index] ^= 0x01
            XCTAssertThrowsError(try AESGCM.open(changed, key: key, associatedData: Array("a".utf8)), "byte \(index)")
        }
        XCTAssertThrowsError(try AESGCM.open(Array(sealed.prefix(27)), key: key, associatedData: Array("a".utf8)))
        XCTAssertThrowsError(try AESGCM.seal([1], key: [1, 2, 3])) {
            XCTAssertEqual($0 as? AESGCM.Failure, .badKeyLength)
        }
    }
}
