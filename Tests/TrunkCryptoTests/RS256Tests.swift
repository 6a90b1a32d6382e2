import Foundation
import TrunkCrypto
import XCTest

/// RS256 verification with public keys built from a JWK's `n` and `e`, against tokens the
/// `openssl` command line signed (an independent implementation), and the HS256 `kid`
/// that hosted Supabase projects put on tokens signed with their one secret.
final class RS256Tests: XCTestCase {
    let payload = Array(#"{"sub":"u1","aud":"authenticated","exp":4102444800}"#.utf8)

    /// A fresh RSA key of `bits`: its PEM file, modulus and a token signed by openssl.
    func opensslKey(bits: Int) throws -> (pem: URL, modulus: [UInt8]) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rs256-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let pem = directory.appendingPathComponent("key.pem")
        _ = try openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:\(bits)", "-out", pem.path])
        let text = String(decoding: try openssl(["rsa", "-in", pem.path, "-noout", "-modulus"]), as: UTF8.self)
        let hex = try XCTUnwrap(text.split(separator: "=").last).trimmingCharacters(in: .whitespacesAndNewlines)
        return (pem, try XCTUnwrap(Hex.decode(hex.lowercased())))
    }

    func opensslSign(_ input: String, key: URL) throws -> [UInt8] {
        let file = key.deletingLastPathComponent().appendingPathComponent("input")
        try Data(input.utf8).write(to: file)
        return try openssl(["dgst", "-sha256", "-sign", key.path, file.path])
    }

    func openssl(_ arguments: [String]) throws -> [UInt8] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        XCTAssertEqual(process.terminationStatus, 0, "openssl \(arguments.joined(separator: " "))")
        return Array(data)
    }

    func testATokenOpenSSLSignedVerifiesAndATamperedOneDoesNot() throws {
        let (pem, modulus) = try opensslKey(bits: 2048)
        let key = try JWT.RS256Key(modulus: modulus, exponent: [0x01, 0x00, 0x01], keyID: "rsa1")
        XCTAssertEqual(key.bits, 2048)
        let input =
            Base64URL.encode(Array(#"{"alg":"RS256","kid":"rsa1","typ":"JWT"}"#.utf8)) + "." + Base64URL.encode(payload)
        let token = input + "." + Base64URL.encode(try opensslSign(input, key: pem))
        XCTAssertEqual(try JWT.verify(token, keys: [.rs256(key)]), payload)

        let otherPayload = Base64URL.encode(Array(#"{"sub":"u2","aud":"authenticated","exp":4102444800}"#.utf8))
        let parts = token.split(separator: ".")
        XCTAssertThrowsError(try JWT.verify("\(parts[0]).\(otherPayload).\(parts[2])", keys: [.rs256(key)])) {
            XCTAssertEqual($0 as? JWT.VerificationError, .badSignature)
        }
        // The same signature under an HS256 header: the RSA key is never used as a secret.
        let asHS256 = Base64URL.encode(Array(#"{"alg":"HS256","kid":"rsa1"}"#.utf8)) + ".\(parts[1]).\(parts[2])"
        XCTAssertThrowsError(try JWT.verify(asHS256, keys: [.rs256(key)])) {
            XCTAssertEqual($0 as? JWT.VerificationError, .algorithmMismatch)
        }
    }

    func testShortModulusAndEvenExponentAreRefused() throws {
        XCTAssertThrowsError(try JWT.RS256Key(modulus: [UInt8](repeating: 0xc3, count: 128), exponent: [1, 0, 1])) {
            XCTAssertEqual($0 as? JWT.KeyError, .invalidPublicKey)
        }
        XCTAssertThrowsError(try JWT.RS256Key(modulus: [UInt8](repeating: 0xc3, count: 256), exponent: [2])) {
            XCTAssertEqual($0 as? JWT.KeyError, .invalidPublicKey)
        }
    }

    func testAnHS256TokenWithAKidVerifiesWithTheSecretThatHasNone() throws {
        let secret = JWT.HS256Key(secret: String(repeating: "s", count: 40))
        let hosted = JWT.sign(
            payload: payload, with: JWT.HS256Key(secret: String(repeating: "s", count: 40), keyID: "Ab1x"))
        XCTAssertEqual(try JWT.verify(hosted, keys: [.hs256(secret)]), payload)
        // Not with another secret, and an ES256 token naming an unknown kid stays unknown.
        XCTAssertThrowsError(
            try JWT.verify(hosted, keys: [.hs256(JWT.HS256Key(secret: String(repeating: "t", count: 40)))])
        ) {
            XCTAssertEqual($0 as? JWT.VerificationError, .badSignature)
        }
        let ecKey = try JWT.ES256Key.generate(keyID: "elsewhere")
        XCTAssertThrowsError(try JWT.verify(try JWT.sign(payload: payload, with: ecKey), keys: [.hs256(secret)])) {
            XCTAssertEqual($0 as? JWT.VerificationError, .unknownKey)
        }
    }
}
