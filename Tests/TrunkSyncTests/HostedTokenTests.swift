import Foundation
import TestSupport
import TrunkCrypto
import XCTest

@testable import TrunkSync

/// Access tokens a hosted Supabase project issued, shaped exactly as hosted Supabase Auth
/// writes them, keep working after the move: the project's HS256 secret (their header has a
/// `kid`), or its public JWKS imported as verify-only keys, with its issuer accepted.
final class HostedTokenTests: XCTestCase {
    let secret = TestSecrets.random()
    let ownIssuer = "https://sync.example.test/auth/v1"
    let hostedIssuer = "https://abcdefghijklmnop.supabase.co/auth/v1"
    let now = Int64(Date().timeIntervalSince1970)
    let user = UUID()
    let session = UUID()

    /// The claims hosted Supabase Auth puts in an access token.
    func hostedClaims(iss: String) -> [UInt8] {
        let sub = user.uuidString.lowercased()
        return Array(
            """
            {"iss":"\(iss)","sub":"\(sub)","aud":"authenticated","exp":\(now + 3600),"iat":\(now),\
            "email":"ada@example.com","phone":"","app_metadata":{"provider":"email","providers":["email"]},\
            "user_metadata":{"email":"ada@example.com","email_verified":true,"full_name":"Ada","phone_verified":false,\
            "sub":"\(sub)"},"role":"authenticated","aal":"aal1","amr":[{"method":"otp","timestamp":\(now - 60)}],\
            "session_id":"\(session.uuidString.lowercased())","is_anonymous":false}
            """.utf8)
    }

    func testAHostedHS256TokenWithKidIsAcceptedOnlyWithItsIssuerAccepted() throws {
        let token = JWT.sign(
            payload: hostedClaims(iss: hostedIssuer), with: JWT.HS256Key(secret: secret, keyID: "k9Zq2w"))
        let strict = TokenIssuer(secret: secret, issuer: ownIssuer, lifetime: 3600)
        XCTAssertThrowsError(try strict.verify(token, now: now))
        let moved = TokenIssuer(secret: secret, issuer: ownIssuer, lifetime: 3600, acceptedIssuers: [hostedIssuer])
        let claims = try moved.verify(token, now: now)
        XCTAssertEqual(claims.userID, user)
        XCTAssertEqual(claims.sessionID, session)
        // Another project's issuer stays refused, and so does another secret.
        let other = JWT.sign(
            payload: hostedClaims(iss: "https://zzzzzzzzzzzzzzzz.supabase.co/auth/v1"),
            with: JWT.HS256Key(secret: secret, keyID: "k9Zq2w"))
        XCTAssertThrowsError(try moved.verify(other, now: now))
        let forged = JWT.sign(
            payload: hostedClaims(iss: hostedIssuer), with: JWT.HS256Key(secret: TestSecrets.random(), keyID: "k9Zq2w"))
        XCTAssertThrowsError(try moved.verify(forged, now: now))
    }

    func testAnImportedES256JWKVerifiesTheHostedProjectsTokens() throws {
        let hostedKey = try JWT.ES256Key.generate(keyID: "0f2c7c5e-hosted")
        let jwks = Data(#"{"keys":[\#(hostedKey.publicJWK)]}"#.utf8)
        let entries = try ImportedKeys.parse(jwks)
        XCTAssertEqual(entries.map(\.keyID), ["0f2c7c5e-hosted"])
        XCTAssertEqual(entries.map(\.algorithm), ["ES256"])
        let tokens = TokenIssuer(secret: secret, issuer: ownIssuer, lifetime: 3600, acceptedIssuers: [hostedIssuer])
        let token = try JWT.sign(payload: hostedClaims(iss: hostedIssuer), with: hostedKey)
        XCTAssertThrowsError(try tokens.verify(token, now: now))
        tokens.install([], imported: entries.map(\.key))
        XCTAssertEqual(try tokens.verify(token, now: now).userID, user)
        // Verify-only: the imported key never signs this server's tokens.
        XCTAssertNil(tokens.signingKey(at: now))
        // jwks.json lists it (a JWKS consumer must verify every token accepted here), and
        // what it lists is the same key.
        let published = try ImportedKeys.parse(Data(tokens.jwks))
        XCTAssertEqual(published.map(\.keyID), ["0f2c7c5e-hosted"])
        let checker = TokenIssuer(secret: secret, issuer: ownIssuer, lifetime: 3600, acceptedIssuers: [hostedIssuer])
        checker.install([], imported: published.map(\.key))
        XCTAssertEqual(try checker.verify(token, now: now).userID, user)
    }

    func testJWKSListsAnImportedRS256KeyAndNeverTheSharedSecret() throws {
        // A 2048-bit modulus (any odd one with the top bit set parses as a public key).
        var modulus = [UInt8](repeating: 0, count: 256)
        for index in modulus.indices { modulus[index] = UInt8(truncatingIfNeeded: index &* 37 &+ 11) }
        modulus[0] = 0xc5
        modulus[255] |= 1
        let rsa = try JWT.RS256Key(modulus: [0] + modulus, exponent: [0x01, 0x00, 0x01], keyID: "hosted-rsa")
        let tokens = TokenIssuer(secret: secret, issuer: ownIssuer, lifetime: 3600, acceptedIssuers: [hostedIssuer])
        XCTAssertEqual(String(decoding: tokens.jwks, as: UTF8.self), #"{"keys":[]}"#, "HS256 is never published")
        tokens.install([], imported: [.rs256(rsa)])
        let keys = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(tokens.jwks)) as? [String: [[String: String]]])["keys"]
        XCTAssertEqual(keys?.count, 1)
        let jwk = try XCTUnwrap(keys?.first)
        XCTAssertEqual(Set(jwk.keys), ["kty", "n", "e", "kid", "alg", "use"], "public members only")
        XCTAssertEqual(jwk["kty"], "RSA")
        XCTAssertEqual(jwk["alg"], "RS256")
        XCTAssertEqual(jwk["kid"], "hosted-rsa")
        XCTAssertEqual(jwk["e"], "AQAB")
        XCTAssertEqual(jwk["n"].flatMap { Base64URL.decode($0.utf8) }, modulus, "leading zero dropped")
        XCTAssertEqual(try ImportedKeys.parse(Data(tokens.jwks)).map(\.algorithm), ["RS256"])
    }

    func testAJWKSWithAPrivateMemberOrWithoutKidIsRefused() throws {
        let key = try JWT.ES256Key.generate(keyID: "k")
        let withPrivate = key.publicJWK.dropLast() + #","d":"AAAA"}"#
        XCTAssertThrowsError(try ImportedKeys.parse(Data(#"{"keys":[\#(withPrivate)]}"#.utf8))) {
            XCTAssertTrue("\($0)".contains("private member \"d\""), "\($0)")
        }
        let withoutKid = try JWT.ES256Key.generate().publicJWK
        XCTAssertThrowsError(try ImportedKeys.parse(Data(#"{"keys":[\#(withoutKid)]}"#.utf8))) {
            XCTAssertTrue("\($0)".contains("has no kid"), "\($0)")
        }
        XCTAssertThrowsError(try ImportedKeys.parse(Data(#"{"keys":[{"kty":"oct","kid":"h","k":"c2VjcmV0"}]}"#.utf8)))
        XCTAssertThrowsError(try ImportedKeys.parse(Data("[1]".utf8)))
    }
}
