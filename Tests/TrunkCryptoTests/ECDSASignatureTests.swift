import COpenSSL
import TrunkCrypto
import XCTest

/// JOSE `r‖s` ↔ DER, checked against OpenSSL's own `ECDSA_SIG` encoder and decoder.
final class ECDSASignatureTests: XCTestCase {
    /// Components with leading zero bytes, high bits set, and the extremes.
    func interestingComponents() -> [[UInt8]] {
        var components: [[UInt8]] = [
            [UInt8](repeating: 0, count: 31) + [1],
            [UInt8](repeating: 0xff, count: 32),
            [0x80] + [UInt8](repeating: 0, count: 31),
            [0x7f] + [UInt8](repeating: 0xff, count: 31),
            [0, 0x80] + [UInt8](repeating: 0x11, count: 30),
            [0, 0, 0, 0x7f] + [UInt8](repeating: 0x22, count: 28),
        ]
        for _ in 0..<40 { components.append(SecureRandom.bytes(count: 32)) }
        return components
    }

    func testRawToDERMatchesOpenSSLAndBack() throws {
        let components = interestingComponents()
        for (index, r) in components.enumerated() {
            let s = components[(index * 7 + 3) % components.count]
            let raw = r + s
            let der = try XCTUnwrap(ECDSASignature.der(fromRaw: raw))
            XCTAssertEqual(der, try openSSLDER(r: r, s: s), "r \(r.hexString) s \(s.hexString)")
            XCTAssertEqual(ECDSASignature.raw(fromDER: der), raw)
            XCTAssertEqual(try openSSLRaw(der), raw)
        }
    }

    func testZeroComponentsEncodeAsOneZeroByte() throws {
        let der = try XCTUnwrap(ECDSASignature.der(fromRaw: [UInt8](repeating: 0, count: 64)))
        XCTAssertEqual(der, [0x30, 0x06, 0x02, 0x01, 0x00, 0x02, 0x01, 0x00])
        XCTAssertEqual(ECDSASignature.raw(fromDER: der), [UInt8](repeating: 0, count: 64))
    }

    func testRawOfTheWrongLengthIsRefused() {
        for count in [0, 1, 32, 63, 65, 96, 128] {
            XCTAssertNil(ECDSASignature.der(fromRaw: [UInt8](repeating: 1, count: count)), "\(count) bytes")
        }
    }

    func testNonCanonicalDERIsRefused() {
        let one: [UInt8] = [0x02, 0x01, 0x01]
        let cases: [(String, [UInt8])] = [
            ("empty", []),
            ("not a sequence", [0x31, 0x06] + one + one),
            ("length too long", [0x30, 0x07] + one + one),
            ("length too short", [0x30, 0x05] + one + one),
            ("long-form length", [0x30, 0x81, 0x06] + one + one),
            ("trailing byte", [0x30, 0x06] + one + one + [0x00]),
            ("trailing element", [0x30, 0x09] + one + one + one),
            ("one integer", [0x30, 0x03] + one),
            ("not an integer", [0x30, 0x06, 0x04, 0x01, 0x01] + one),
            ("empty integer", [0x30, 0x05, 0x02, 0x00] + one),
            ("negative", [0x30, 0x06, 0x02, 0x01, 0x80] + one),
            ("redundant zero", [0x30, 0x07, 0x02, 0x02, 0x00, 0x01] + one),
            ("33-byte magnitude", [0x30, 0x26, 0x02, 0x21] + [UInt8](repeating: 0x11, count: 33) + one),
        ]
        for (name, der) in cases {
            XCTAssertNil(ECDSASignature.raw(fromDER: der), name)
        }
        // A 33-byte integer whose first byte is the sign padding is canonical.
        let padded: [UInt8] = [0x30, 0x26, 0x02, 0x21, 0x00] + [UInt8](repeating: 0x81, count: 32) + one
        XCTAssertEqual(
            ECDSASignature.raw(fromDER: padded),
            [UInt8](repeating: 0x81, count: 32) + [UInt8](repeating: 0, count: 31) + [1])
    }

    private func openSSLDER(r: [UInt8], s: [UInt8]) throws -> [UInt8] {
        let signature = try XCTUnwrap(ECDSA_SIG_new())
        defer { ECDSA_SIG_free(signature) }
        let rNumber = try XCTUnwrap(BN_bin2bn(r, Int32(r.count), nil))
        let sNumber = try XCTUnwrap(BN_bin2bn(s, Int32(s.count), nil))
        XCTAssertEqual(ECDSA_SIG_set0(signature, rNumber, sNumber), 1)
        let length = i2d_ECDSA_SIG(signature, nil)
        XCTAssertGreaterThan(length, 0)
        var der = [UInt8](repeating: 0, count: Int(length))
        try der.withUnsafeMutableBufferPointer { buffer in
            var cursor = buffer.baseAddress
            XCTAssertEqual(i2d_ECDSA_SIG(signature, &cursor), length)
            _ = try XCTUnwrap(cursor)
        }
        return der
    }

    private func openSSLRaw(_ der: [UInt8]) throws -> [UInt8] {
        let signature: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        let parsed = try XCTUnwrap(signature)
        defer { ECDSA_SIG_free(parsed) }
        var r: OpaquePointer?
        var s: OpaquePointer?
        ECDSA_SIG_get0(parsed, &r, &s)
        var raw = [UInt8](repeating: 0, count: 64)
        raw.withUnsafeMutableBufferPointer { buffer in
            guard let base = buffer.baseAddress else { return }
            XCTAssertEqual(BN_bn2binpad(r, base, 32), 32)
            XCTAssertEqual(BN_bn2binpad(s, base + 32, 32), 32)
        }
        return raw
    }
}
