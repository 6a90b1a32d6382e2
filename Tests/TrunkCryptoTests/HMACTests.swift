import TrunkCrypto
import XCTest

final class HMACTests: XCTestCase {
    // RFC 4231 §4 test cases (HMAC-SHA-256 results). Case 5 is omitted: it checks a
    // truncated output, which this API does not offer.
    func testRFC4231Case1() {
        let key = [UInt8](repeating: 0x0b, count: 20)
        XCTAssertEqual(
            HMAC.sha256(key: key, message: "Hi There").hexString,
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        )
    }

    func testRFC4231Case2KeyShorterThanOutput() {
        XCTAssertEqual(
            HMAC.sha256(key: Array("Jefe".utf8), message: "what do ya want for nothing?").hexString,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        )
    }

    func testRFC4231Case3CombinedLengthAboveBlockSize() {
        let key = [UInt8](repeating: 0xaa, count: 20)
        let message = [UInt8](repeating: 0xdd, count: 50)
        XCTAssertEqual(
            HMAC.sha256(key: key, message: message).hexString,
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"
        )
    }

    func testRFC4231Case4() {
        let key = (1...25).map { UInt8($0) }
        let message = [UInt8](repeating: 0xcd, count: 50)
        XCTAssertEqual(
            HMAC.sha256(key: key, message: message).hexString,
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"
        )
    }

    func testRFC4231Case6KeyLongerThanBlock() {
        let key = [UInt8](repeating: 0xaa, count: 131)
        XCTAssertEqual(
            HMAC.sha256(key: key, message: "Test Using Larger Than Block-Size Key - Hash Key First").hexString,
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        )
    }

    func testRFC4231Case7KeyAndMessageLongerThanBlock() {
        let key = [UInt8](repeating: 0xaa, count: 131)
        let message =
            "This is a test using a larger than block-size key and a larger than block-size data. "
            + "The key needs to be hashed before being used by the HMAC algorithm."
        XCTAssertEqual(
            HMAC.sha256(key: key, message: message).hexString,
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"
        )
    }

    func testKeyOfExactlyOneBlockIsUsedAsIs() {
        // A 64-byte key is padded with nothing and not hashed; a 65-byte one is hashed, so
        // it equals the HMAC under its 32-byte digest.
        let block = [UInt8](repeating: 0x42, count: 64)
        let longer = block + [0x42]
        XCTAssertNotEqual(HMAC.sha256(key: block, message: "m"), HMAC.sha256(key: SHA256.hash(block), message: "m"))
        XCTAssertEqual(HMAC.sha256(key: longer, message: "m"), HMAC.sha256(key: SHA256.hash(longer), message: "m"))
    }

    func testEmptyKeyAndMessage() {
        // Computed with Python's hmac module: hmac.new(b"", b"", hashlib.sha256).
        XCTAssertEqual(
            HMAC.sha256(key: [UInt8](), message: [UInt8]()).hexString,
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"
        )
    }

    func testHS256SigningInputShape() {
        // The signing input of an HS256 JWT is two base64url segments joined by a dot.
        let secret = Array("a-secret-of-at-least-thirty-two-bytes!".utf8)
        let signingInput = Base64URL.encode(#"{"alg":"HS256","typ":"JWT"}"#) + "." + Base64URL.encode(#"{"sub":"1"}"#)
        let signature = HMAC.sha256(key: secret, message: signingInput)
        XCTAssertEqual(signature.count, 32)
        XCTAssertTrue(constantTimeEquals(signature, HMAC.sha256(key: secret, message: Array(signingInput.utf8))))
        XCTAssertEqual(Base64URL.decode(Base64URL.encode(signature)), signature)
    }
}
