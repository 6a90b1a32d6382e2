import Foundation
import TrunkCrypto
import XCTest

/// ES256 keys and tokens, checked against themselves and against PyJWT with
/// python3-cryptography (an independent implementation).
final class ES256Tests: XCTestCase {
    let payload = Array(#"{"sub":"u1","aud":"authenticated","exp":4102444800}"#.utf8)

    func testSignVerifyRoundTripWithPrivateAndPublicOnlyKeys() throws {
        let key = try JWT.ES256Key.generate(keyID: "k1")
        XCTAssertTrue(key.hasPrivateKey)
        XCTAssertEqual(key.x.count, 32)
        XCTAssertEqual(key.y.count, 32)
        let token = try JWT.sign(payload: payload, with: key)
        let header = try XCTUnwrap(Base64URL.decode(String(token.split(separator: ".")[0])))
        XCTAssertEqual(String(decoding: header, as: UTF8.self), #"{"alg":"ES256","typ":"JWT","kid":"k1"}"#)
        XCTAssertEqual(Base64URL.decode(String(token.split(separator: ".")[2]))?.count, 64)
        XCTAssertEqual(try JWT.verify(token, keys: [.es256(key)]), payload)

        let publicOnly = try JWT.ES256Key(publicX: key.x, y: key.y, keyID: "k1")
        XCTAssertFalse(publicOnly.hasPrivateKey)
        XCTAssertEqual(try JWT.verify(token, keys: [.es256(publicOnly)]), payload)
        XCTAssertThrowsError(try JWT.sign(payload: payload, with: publicOnly)) { error in
            XCTAssertEqual(error as? JWT.KeyError, .noPrivateKey)
        }
        // ECDSA signatures are randomised: two signatures of one input differ, both verify.
        XCTAssertNotEqual(try JWT.sign(payload: payload, with: key), token)
    }

    func testTamperedWrongKeyAndUnknownKidAreRejected() throws {
        let key = try JWT.ES256Key.generate(keyID: "k1")
        let token = try JWT.sign(payload: payload, with: key)
        let parts = token.split(separator: ".").map(String.init)
        let otherPayload = Base64URL.encode(#"{"sub":"u2","aud":"authenticated","exp":4102444800}"#)
        var signature = try XCTUnwrap(Base64URL.decode(parts[2]))
        signature[10] ^= 0x01
        let cases: [(String, String, JWT.VerificationError)] = [
            ("tampered payload", parts[0] + "." + otherPayload + "." + parts[2], .badSignature),
            ("tampered signature", parts[0] + "." + parts[1] + "." + Base64URL.encode(signature), .badSignature),
            (
                "short signature", parts[0] + "." + parts[1] + "." + Base64URL.encode(signature.prefix(63)),
                .badSignature
            ),
            (
                "DER signature",
                parts[0] + "." + parts[1] + "." + Base64URL.encode(ECDSASignature.der(fromRaw: signature) ?? []),
                .badSignature
            ),
            ("no signature", parts[0] + "." + parts[1] + ".", .badSignature),
        ]
        for (name, bad, expected) in cases {
            XCTAssertThrowsError(try JWT.verify(bad, keys: [.es256(key)]), name) { error in
                XCTAssertEqual(error as? JWT.VerificationError, expected, name)
            }
        }
        let impostor = try JWT.ES256Key.generate(keyID: "k1")
        XCTAssertThrowsError(try JWT.verify(token, keys: [.es256(impostor)])) { error in
            XCTAssertEqual(error as? JWT.VerificationError, .badSignature)
        }
        // Several keys under one kid: any of them may have signed.
        XCTAssertEqual(try JWT.verify(token, keys: [.es256(impostor), .es256(key)]), payload)
        XCTAssertThrowsError(try JWT.verify(token, keys: [.es256(key.withKeyID("k2"))])) { error in
            XCTAssertEqual(error as? JWT.VerificationError, .unknownKey)
        }
        XCTAssertThrowsError(try JWT.verify(token, keys: [.es256(key.withKeyID(nil))])) { error in
            XCTAssertEqual(error as? JWT.VerificationError, .unknownKey)
        }
    }

    func testAlgorithmConfusionIsRejected() throws {
        let key = try JWT.ES256Key.generate(keyID: "ec")
        let secret = JWT.HS256Key(secret: String(repeating: "s", count: 40))
        let keys: [JWT.Key] = [.hs256(secret), .es256(key)]
        func token(header: String, signature: (String) -> [UInt8]) -> String {
            let input = Base64URL.encode(header) + "." + Base64URL.encode(payload)
            return input + "." + Base64URL.encode(signature(input))
        }
        func hmac(_ secret: [UInt8]) -> (String) -> [UInt8] { { HMAC.sha256(key: secret, message: $0) } }
        let secretBytes = Array(String(repeating: "s", count: 40).utf8)
        // The classic attack: HMAC keyed with the public key, announced as HS256 under its kid.
        let publicKeyAsSecret = token(header: #"{"alg":"HS256","kid":"ec"}"#, signature: hmac(key.x + key.y))
        let hs256UnderECKid = token(header: #"{"alg":"HS256","kid":"ec"}"#, signature: hmac(secretBytes))
        let es256WithHMAC = token(header: #"{"alg":"ES256","kid":"ec"}"#, signature: hmac(secretBytes))
        let es256WithoutKid = token(header: #"{"alg":"ES256"}"#, signature: hmac(secretBytes))
        let cases: [(String, String, JWT.VerificationError)] = [
            ("public key as HMAC secret", publicKeyAsSecret, .algorithmMismatch),
            ("HS256 under an ES256 kid", hs256UnderECKid, .algorithmMismatch),
            ("ES256 header, HMAC signature", es256WithHMAC, .badSignature),
            ("ES256 header without kid", es256WithoutKid, .algorithmMismatch),
            ("none", token(header: #"{"alg":"none","kid":"ec"}"#) { _ in [] }, .unsupportedAlgorithm("none")),
            (
                "lower case", token(header: #"{"alg":"es256","kid":"ec"}"#, signature: hmac(secretBytes)),
                .unsupportedAlgorithm("es256")
            ),
            (
                "ES384", token(header: #"{"alg":"ES384","kid":"ec"}"#, signature: hmac(secretBytes)),
                .unsupportedAlgorithm("ES384")
            ),
        ]
        for (name, bad, expected) in cases {
            XCTAssertThrowsError(try JWT.verify(bad, keys: keys), name) { error in
                XCTAssertEqual(error as? JWT.VerificationError, expected, name)
            }
        }
        // Both kinds verify side by side.
        XCTAssertEqual(try JWT.verify(JWT.sign(payload: payload, with: secret), keys: keys), payload)
        XCTAssertEqual(try JWT.verify(JWT.sign(payload: payload, with: key), keys: keys), payload)
    }

    func testPEMRoundTripIsPKCS8AndKeepsTheKey() throws {
        let key = try JWT.ES256Key.generate()
        let pem = try key.privateKeyPEM()
        XCTAssertTrue(pem.hasPrefix("-----BEGIN PRIVATE KEY-----\n"), pem)
        XCTAssertTrue(pem.hasSuffix("-----END PRIVATE KEY-----\n"), pem)
        let loaded = try JWT.ES256Key(privateKeyPEM: pem, keyID: "again")
        XCTAssertEqual(loaded.x, key.x)
        XCTAssertEqual(loaded.y, key.y)
        XCTAssertEqual(loaded.keyID, "again")
        let token = try JWT.sign(payload: payload, with: loaded)
        XCTAssertEqual(try JWT.verify(token, keys: [.es256(key.withKeyID("again"))]), payload)
        XCTAssertThrowsError(try JWT.ES256Key(publicX: key.x, y: key.y).privateKeyPEM()) { error in
            XCTAssertEqual(error as? JWT.KeyError, .noPrivateKey)
        }
    }

    func testUnreadableAndForeignKeysAreRefused() throws {
        for garbage in ["", "hello", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"] {
            XCTAssertThrowsError(try JWT.ES256Key(privateKeyPEM: garbage)) { error in
                XCTAssertEqual(error as? JWT.KeyError, .unreadablePrivateKey)
            }
        }
        let script = """
            from cryptography.hazmat.primitives.asymmetric import ec, rsa
            from cryptography.hazmat.primitives import serialization as s
            def pem(key, encryption=s.NoEncryption()):
                return key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, encryption).decode()
            print(pem(rsa.generate_private_key(65537, 2048)) + "#" + pem(ec.generate_private_key(ec.SECP384R1()))
                  + "#" + pem(ec.generate_private_key(ec.SECP256R1()), s.BestAvailableEncryption(b"pw"))
                  + "#" + ec.generate_private_key(ec.SECP256R1()).private_bytes(
                      s.Encoding.PEM, s.PrivateFormat.TraditionalOpenSSL, s.NoEncryption()).decode())
            """
        let pems = try python(script).split(separator: "#").map(String.init)
        XCTAssertEqual(pems.count, 4)
        XCTAssertThrowsError(try JWT.ES256Key(privateKeyPEM: pems[0])) { XCTAssertEqual($0 as? JWT.KeyError, .notP256) }
        XCTAssertThrowsError(try JWT.ES256Key(privateKeyPEM: pems[1])) { XCTAssertEqual($0 as? JWT.KeyError, .notP256) }
        XCTAssertThrowsError(try JWT.ES256Key(privateKeyPEM: pems[2])) {
            XCTAssertEqual($0 as? JWT.KeyError, .unreadablePrivateKey, "encrypted keys are refused, never prompted for")
        }
        XCTAssertTrue(pems[3].hasPrefix("-----BEGIN EC PRIVATE KEY-----"))
        XCTAssertNoThrow(try JWT.ES256Key(privateKeyPEM: pems[3]), "SEC 1 keys are read too")

        let key = try JWT.ES256Key.generate()
        var offCurve = key.y
        offCurve[31] ^= 0x01
        XCTAssertThrowsError(try JWT.ES256Key(publicX: key.x, y: offCurve)) {
            XCTAssertEqual($0 as? JWT.KeyError, .invalidPublicKey)
        }
        XCTAssertThrowsError(try JWT.ES256Key(publicX: Array(key.x.prefix(31)), y: key.y)) {
            XCTAssertEqual($0 as? JWT.KeyError, .invalidPublicKey)
        }
    }

    func testJWKAndThumbprint() throws {
        let key = try JWT.ES256Key.generate(keyID: #"a"b"#)
        let jwk = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(key.publicJWK.utf8)) as? [String: String])
        XCTAssertEqual(
            jwk,
            [
                "kty": "EC", "crv": "P-256", "x": Base64URL.encode(key.x), "y": Base64URL.encode(key.y), "kid": #"a"b"#,
                "alg": "ES256", "use": "sig",
            ])
        XCTAssertFalse(key.publicJWK.contains(#""d""#), "never the private scalar")
        XCTAssertNil(
            try (JSONSerialization.jsonObject(with: Data(key.withKeyID(nil).publicJWK.utf8)) as? [String: String])?[
                "kid"])
        // RFC 7638, computed independently.
        let expected = try python(
            """
            import sys, json, hashlib, base64
            members = json.dumps({"crv": "P-256", "kty": "EC", "x": sys.argv[1], "y": sys.argv[2]}, separators=(",", ":"), sort_keys=True)
            print(base64.urlsafe_b64encode(hashlib.sha256(members.encode()).digest()).decode().rstrip("="), end="")
            """, Base64URL.encode(key.x), Base64URL.encode(key.y))
        XCTAssertEqual(key.thumbprint, expected)
        XCTAssertEqual(key.thumbprint.count, 43)
    }

    func testVerifiesATokenSignedByPyJWT() throws {
        let script = """
            import jwt, json
            from cryptography.hazmat.primitives.asymmetric import ec
            from cryptography.hazmat.primitives import serialization as s
            key = ec.generate_private_key(ec.SECP256R1())
            token = jwt.encode({"sub": "py", "aud": "authenticated"}, key, algorithm="ES256", headers={"kid": "py1"})
            numbers = key.public_key().public_numbers()
            pem = key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()).decode()
            print(json.dumps({"token": token, "x": numbers.x.to_bytes(32, "big").hex(), "y": numbers.y.to_bytes(32, "big").hex(), "pem": pem}))
            """
        let output = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(try python(script).utf8)) as? [String: String])
        let token = try XCTUnwrap(output["token"])
        let x = try XCTUnwrap(output["x"].flatMap(hexBytes))
        let y = try XCTUnwrap(output["y"].flatMap(hexBytes))
        let fromJWK = try JWT.ES256Key(publicX: x, y: y, keyID: "py1")
        let claims = try JWT.verify(token, keys: [.es256(fromJWK)])
        let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(claims)) as? [String: String])
        XCTAssertEqual(object["sub"], "py")
        let fromPEM = try JWT.ES256Key(privateKeyPEM: try XCTUnwrap(output["pem"]), keyID: "py1")
        XCTAssertEqual(fromPEM.x, x)
        XCTAssertEqual(try JWT.verify(token, keys: [.es256(fromPEM)]), claims)
    }

    func testPyJWTVerifiesOurTokensWithOurJWKAndOurPEM() throws {
        let key = try JWT.ES256Key.generate(keyID: "ours")
        let token = try JWT.sign(payload: payload, with: key)
        let script = """
            import jwt, json, sys
            from jwt.algorithms import ECAlgorithm
            from cryptography.hazmat.primitives import serialization as s
            token, jwk, pem = sys.argv[1:4]
            assert jwt.get_unverified_header(token)["kid"] == "ours"
            by_jwk = jwt.decode(token, ECAlgorithm.from_jwk(jwk), algorithms=["ES256"], audience="authenticated")
            private = s.load_pem_private_key(pem.encode(), password=None)
            by_pem = jwt.decode(token, private.public_key(), algorithms=["ES256"], audience="authenticated")
            assert by_jwk == by_pem
            try:
                jwt.decode(token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB"), ECAlgorithm.from_jwk(jwk), algorithms=["ES256"], audience="authenticated")
                print("tampered token accepted")
            except jwt.InvalidSignatureError:
                print(by_jwk["sub"])
            """
        XCTAssertEqual(try python(script, token, key.publicJWK, try key.privateKeyPEM()), "u1\n")
    }

    // MARK: - Helpers

    private func hexBytes(_ hex: String) -> [UInt8]? {
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2, limitedBy: hex.endIndex) ?? hex.endIndex
            guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        return bytes
    }

    /// Runs a Python script (Debian's python3 with python3-jwt and python3-cryptography)
    /// and returns its stdout; fails unless it exits 0.
    private func python(_ script: String, _ arguments: String...) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", script] + arguments
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        let errorData = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw PythonFailed(stderr: String(decoding: errorData, as: UTF8.self))
        }
        return String(decoding: data, as: UTF8.self)
    }

    private struct PythonFailed: Error, CustomStringConvertible {
        var stderr: String
        var description: String { "python3 failed: \(stderr)" }
    }
}
