import COpenSSL
import TrunkCrypto
import XCTest

/// Checks the RFC 2104 construction against OpenSSL's own `HMAC()` around every key and
/// message length where padding or key hashing changes.
final class HMACCrossCheckTests: XCTestCase {
    func testMatchesOpenSSLForKeyAndMessageLengthsAroundTheBlockSize() {
        let lengths = [0, 1, 31, 32, 33, 55, 56, 63, 64, 65, 127, 128, 129, 200]
        for keyLength in lengths {
            for messageLength in lengths {
                let key = SecureRandom.bytes(count: keyLength)
                let message = SecureRandom.bytes(count: messageLength)
                let expected = openSSLHMACSHA256(key: key, message: message)
                XCTAssertEqual(
                    TrunkCrypto.HMAC.sha256(key: key, message: message),
                    expected,
                    "key \(keyLength) bytes, message \(messageLength) bytes"
                )
            }
        }
    }

    private func openSSLHMACSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        var digestLength: UInt32 = 0
        // OpenSSL wants non-null pointers even for empty inputs.
        let keyBytes = key.isEmpty ? [0] : key
        let messageBytes = message.isEmpty ? [0] : message
        let result = COpenSSL.HMAC(
            EVP_sha256(),
            keyBytes,
            Int32(key.count),
            messageBytes,
            message.count,
            &digest,
            &digestLength
        )
        XCTAssertNotNil(result)
        XCTAssertEqual(digestLength, 32)
        return digest
    }
}
