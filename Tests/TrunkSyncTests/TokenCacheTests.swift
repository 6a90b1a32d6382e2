import Foundation
import TestSupport
import TrunkCrypto
import XCTest

@testable import TrunkSync

/// The verified-token cache skips the signature for a token seen before, and nothing else:
/// expiry still counts, and a key change forgets everything.
final class TokenCacheTests: XCTestCase {
    let secret = TestSecrets.random()
    let issuerURL = "http://cache.test/auth/v1"
    let now = Int64(Date().timeIntervalSince1970)

    func claims(exp: Int64) -> [UInt8] {
        Array(
            #"{"sub":"\#(UUID().uuidString.lowercased())","aud":"authenticated","exp":\#(exp),"session_id":"\#(UUID().uuidString.lowercased())","iss":"\#(issuerURL)","iat":\#(now)}"#
                .utf8)
    }

    func testASecondVerificationGivesTheSameClaimsAndExpiryStillCounts() throws {
        let tokens = TokenIssuer(secret: secret, issuer: issuerURL, lifetime: 60)
        let expiresAt = now + 60
        let token = JWT.sign(payload: claims(exp: expiresAt), with: JWT.HS256Key(secret: secret))
        let first = try tokens.verify(token, now: now)
        XCTAssertEqual(try tokens.verify(token, now: now + 1), first)
        // Past its expiry (and the leeway) the remembered token is refused like any other.
        XCTAssertThrowsError(try tokens.verify(token, now: expiresAt + TokenIssuer.leeway + 1))
        XCTAssertEqual(try tokens.verify(token, now: now), first)
    }

    func testRetiringAKeyRefusesItsTokensAtOnceThoughTheyWereVerifiedBefore() throws {
        let tokens = TokenIssuer(secret: secret, issuer: issuerURL, lifetime: 3600)
        let key = try JWT.ES256Key.generate(keyID: "k1")
        tokens.install([TokenIssuer.LoadedKey(key: key, signsFrom: Double(now - 10))])
        let token = try JWT.sign(payload: claims(exp: now + 600), with: key)
        XCTAssertNoThrow(try tokens.verify(token, now: now))
        XCTAssertNoThrow(try tokens.verify(token, now: now))
        tokens.install([])  // k1 retired
        XCTAssertThrowsError(try tokens.verify(token, now: now))
    }

    /// A token carries its user's metadata (up to 16 KiB): the cache remembers tokens of at
    /// most 4 KiB, so its 4096 entries hold at most 16 MiB; a longer one verifies each time.
    func testOnlyTokensOfOrdinarySizeAreRemembered() throws {
        let tokens = TokenIssuer(secret: secret, issuer: issuerURL, lifetime: 3600)
        var large = claims(exp: now + 600)
        large.removeLast()
        large += Array(#","user_metadata":{"bio":"\#(String(repeating: "b", count: 8000))"}}"#.utf8)
        let big = JWT.sign(payload: large, with: JWT.HS256Key(secret: secret))
        let first = try tokens.verify(big, now: now)
        XCTAssertEqual(try tokens.verify(big, now: now), first)
        XCTAssertEqual(tokens.verifiedCount, 0)
        XCTAssertNoThrow(
            try tokens.verify(JWT.sign(payload: claims(exp: now + 600), with: JWT.HS256Key(secret: secret)), now: now))
        XCTAssertEqual(tokens.verifiedCount, 1)
    }

    func testAForgedTokenIsNeverRemembered() throws {
        let tokens = TokenIssuer(secret: secret, issuer: issuerURL, lifetime: 3600)
        let payload = claims(exp: now + 600)
        let forged = JWT.sign(payload: payload, with: JWT.HS256Key(secret: TestSecrets.random()))
        for _ in 0..<2 { XCTAssertThrowsError(try tokens.verify(forged, now: now)) }
        XCTAssertNoThrow(try tokens.verify(JWT.sign(payload: payload, with: JWT.HS256Key(secret: secret)), now: now))
    }
}
