import Foundation
import Postgres
import TrunkCrypto
import XCTest

@testable import TrunkSync

/// The import's pure parts: the COPY text encoding and the signed refresh token's key and form.
final class SupabaseImportPartsTests: XCTestCase {
    func testCopyTextEscapesWhatCopyWouldMisreadAndWritesNullAsBackslashN() {
        var copy = CopyText()
        copy.field("a\tb\\c\nd\re")
        copy.field(nil as String?)
        copy.field(Int64(42))
        copy.field(bytea: [0xde, 0xad])
        copy.endRow()
        XCTAssertEqual(String(decoding: copy.bytes, as: UTF8.self), "a\\tb\\\\c\\nd\\re\t\\N\t42\t\\\\xdead\n")
    }

    func testSignedTokenMatchesTheFormatByteForByte() throws {
        let session = try XCTUnwrap(UUID(uuidString: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"))
        let key = [UInt8](repeating: 7, count: 32)
        let token = SupabaseRefreshToken.encode(session: session, counter: 300, key: key)
        let bytes = try XCTUnwrap(Base64URL.decode(token))
        XCTAssertFalse(token.contains("="), "no padding")
        XCTAssertEqual(bytes.count, 1 + 16 + 2 + 16 + 4)
        XCTAssertEqual(bytes[0], 0)
        XCTAssertEqual(
            Array(bytes[1..<17]),
            [0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0])
        XCTAssertEqual(Array(bytes[17..<19]), [0xac, 0x02], "300 as an unsigned varint")
        XCTAssertEqual(Array(bytes[19..<35]), Array(HMAC.sha256(key: key, message: Array(bytes[0..<19])).prefix(16)))
        XCTAssertEqual(Array(bytes[35...]), Array(SHA256.hash(Array(bytes[0..<35])).prefix(4)))
    }

    func testStoredKeysPlainOrEncrypted() {
        let key = (0..<32).map { UInt8($0) }
        XCTAssertEqual(try SupabaseRefreshToken.key(stored: Base64URL.encode(key)).get(), key)
        XCTAssertEqual(try SupabaseRefreshToken.key(stored: Data(key).base64EncodedString()).get(), key)
        guard
            case .failure(.encrypted) = SupabaseRefreshToken.key(
                stored: #"{"key_id":"k","alg":"aes-gcm-hkdf","nonce":"x","data":"y"}"#)
        else { return XCTFail("an encrypted key must be recognised") }
        guard case .failure(.unreadable) = SupabaseRefreshToken.key(stored: "!!") else { return XCTFail("garbage") }
    }
}
