import Foundation
import HTTPServer
import Postgres
import TestSupport
import TrunkCrypto
import TrunkSync
import XCTest

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// ES256 signing keys: `trunk-sync keys` (the real binary) against the database a server in
/// this process uses, key reloads, jwks.json, and what verification refuses.
final class SigningKeyTests: XCTestCase {
    var app: AppHarness!
    var environment: [String: String]!

    override func setUp() async throws {
        app = try await AppHarness()
        environment = Command.environment([
            "TRUNK_SYNC_DATABASE_URL": try TestDatabase.url(of: app.database),
            "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
            "TRUNK_SYNC_JWT_SECRET": app.secret, "TRUNK_SYNC_KEY_ENCRYPTION_KEY": app.keyEncryptionKey,
        ])
    }

    override func tearDown() async throws { await app.stop() }

    func keys(_ arguments: [String]) throws -> Command.Result {
        try Command.run(Command.trunkSyncBinary(), ["keys"] + arguments, environment: environment)
    }

    /// `keys add`, returning the printed kid.
    func addKey() throws -> String {
        let result = try keys(["add"])
        XCTAssertEqual(result.status, 0, result.stderr)
        let kid = result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertEqual(kid.count, 43, result.stdout)
        return kid
    }

    /// Moves a key's `created_at` back (as if added `seconds` ago) and reloads the server's keys.
    func age(_ kid: String, seconds: Int) async throws {
        try app.owner().query(
            "update signing_keys set created_at = now() - make_interval(secs => $2) where kid = $1", kid,
            Double(seconds))
        try await app.application.reloadSigningKeys()
    }

    func header(_ token: String) throws -> [String: String] {
        let segment = try XCTUnwrap(token.split(separator: ".").first)
        let bytes = try XCTUnwrap(Base64URL.decode(String(segment)))
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: String])
    }

    func status(_ token: String) async throws -> Int {
        try await app.request("GET", "/auth/v1/user", bearer: token).status
    }

    func jwksKeyIDs() async throws -> [String] {
        let response = try await app.request("GET", "/auth/v1/.well-known/jwks.json")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.headers["cache-control"], "public, max-age=600")
        let keys = try XCTUnwrap(response.json["keys"] as? [[String: String]], response.text)
        for key in keys {
            XCTAssertEqual(Set(key.keys), ["kty", "crv", "x", "y", "kid", "alg", "use"], "public members only")
            XCTAssertEqual(key["kty"], "EC")
            XCTAssertEqual(key["crv"], "P-256")
            XCTAssertEqual(key["alg"], "ES256")
            XCTAssertEqual(key["use"], "sig")
        }
        return keys.compactMap { $0["kid"] }
    }

    /// PyJWT verifies `token` with the key jwks.json publishes under the token's kid.
    func assertPyJWTVerifies(_ token: String, file: StaticString = #filePath, line: UInt = #line) async throws {
        let jwks = try await app.request("GET", "/auth/v1/.well-known/jwks.json").text
        let script = """
            import jwt, sys
            token, jwks = sys.argv[1:3]
            key = jwt.PyJWKSet.from_json(jwks)[jwt.get_unverified_header(token)["kid"]]
            claims = jwt.decode(token, key.key, algorithms=["ES256"], audience="authenticated")
            print(claims["email"])
            """
        let result = try Command.run("/usr/bin/python3", ["-c", script, token, jwks])
        XCTAssertEqual(result.status, 0, result.stderr, file: file, line: line)
    }

    // MARK: - Rotation

    func testRotationWithTheKeysCommandSignsNoOneOut() async throws {
        let hs256 = try await app.token("old@example.com")
        XCTAssertEqual(try header(hs256)["alg"], "HS256")
        XCTAssertNil(try header(hs256)["kid"])
        let initialJWKS = try await jwksKeyIDs()
        XCTAssertEqual(initialJWKS, [])
        let empty = try keys(["list"])
        XCTAssertEqual(empty.status, 0, empty.stderr)
        XCTAssertTrue(
            empty.stdout.contains("0 key(s); HS256 (TRUNK_SYNC_JWT_SECRET) verifies and signs new tokens"), empty.stdout
        )

        // A new key is published and verifies at once, but signs only after the activation delay.
        let first = try addKey()
        try await app.application.reloadSigningKeys()
        let publishedFirst = try await jwksKeyIDs()
        XCTAssertEqual(publishedFirst, [first])
        let whilePending = try await app.token("a@example.com")
        XCTAssertEqual(try header(whilePending)["alg"], "HS256")
        let pending = try keys(["list"])
        XCTAssertTrue(pending.stdout.contains("\(first)  ES256"), pending.stdout)
        XCTAssertTrue(pending.stdout.contains("pending (verifying; signs in 1"), pending.stdout)

        try await age(first, seconds: 3 * 3600)
        let es256 = try await app.token("a@example.com")
        XCTAssertEqual(try header(es256), ["alg": "ES256", "typ": "JWT", "kid": first])
        try await assertPyJWTVerifies(es256)
        let es256Status = try await status(es256)
        XCTAssertEqual(es256Status, 200)
        let hs256Status = try await status(hs256)
        XCTAssertEqual(hs256Status, 200, "tokens of the secret keep working")
        // `trunk-sync token` signs as the servers do.
        let printed = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", "cli@example.com"], environment: environment)
        XCTAssertEqual(printed.status, 0, printed.stderr)
        let session = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(printed.stdout.utf8)) as? [String: Any])
        XCTAssertEqual(try header(try XCTUnwrap(session["access_token"] as? String))["kid"], first)

        // A second key: the first keeps verifying while the second takes over.
        let second = try addKey()
        try await app.application.reloadSigningKeys()
        let publishedBoth = try await jwksKeyIDs()
        XCTAssertEqual(publishedBoth, [second, first])
        let whileSecondPending = try await app.token("b@example.com")
        XCTAssertEqual(try header(whileSecondPending)["kid"], first, "the new key is still pending")
        try await age(second, seconds: 12 * 60)
        let fromSecond = try await app.token("b@example.com")
        XCTAssertEqual(try header(fromSecond)["kid"], second)
        try await assertPyJWTVerifies(fromSecond)
        for token in [hs256, es256, fromSecond] {
            let code = try await status(token)
            XCTAssertEqual(code, 200)
        }
        let list = try keys(["list"])
        XCTAssertTrue(list.stdout.contains("\(second)  ES256"), list.stdout)
        let lines = list.stdout.split(separator: "\n")
        XCTAssertTrue(lines[0].hasPrefix("KID"))
        XCTAssertTrue(lines.contains { $0.hasPrefix(second) && $0.hasSuffix("signing") }, list.stdout)
        XCTAssertTrue(lines.contains { $0.hasPrefix(first) && $0.hasSuffix("verifying") }, list.stdout)
        XCTAssertTrue(list.stdout.contains("2 key(s); HS256 (TRUNK_SYNC_JWT_SECRET) verifies\n"), list.stdout)

        // Retiring the first while its tokens may be valid is refused; later it is not.
        let early = try keys(["retire", first])
        XCTAssertEqual(early.status, 1)
        XCTAssertTrue(early.stderr.contains("may be valid for"), early.stderr)
        XCTAssertTrue(early.stderr.contains("--force"), early.stderr)
        try await age(second, seconds: 2 * 3600)
        let retired = try keys(["retire", first])
        XCTAssertEqual(retired.status, 0, retired.stderr)
        XCTAssertTrue(retired.stdout.contains("retired \(first)"), retired.stdout)
        try await app.application.reloadSigningKeys()
        let retiredStatus = try await app.request("GET", "/auth/v1/user", bearer: es256)
        XCTAssertEqual(retiredStatus.status, 401, "tokens of a retired key are rejected")
        XCTAssertEqual(retiredStatus.json["code"] as? String, "bad_jwt")
        for token in [hs256, fromSecond] {
            let code = try await status(token)
            XCTAssertEqual(code, 200)
        }
        let publishedAfterRetire = try await jwksKeyIDs()
        XCTAssertEqual(publishedAfterRetire, [second])
        let again = try keys(["retire", first])
        XCTAssertEqual(again.status, 0, again.stderr)
        XCTAssertTrue(again.stdout.contains("already retired"), again.stdout)
        XCTAssertTrue(
            try keys(["list"]).stdout.split(separator: "\n").contains {
                $0.hasPrefix(first) && $0.contains("retired 20")
            })

        // The signing key: refused without --force; with it, the secret signs again.
        let signing = try keys(["retire", second])
        XCTAssertEqual(signing.status, 1)
        XCTAssertTrue(signing.stderr.contains("signs new tokens"), signing.stderr)
        let forced = try keys(["retire", second, "--force"])
        XCTAssertEqual(forced.status, 0, forced.stderr)
        try await app.application.reloadSigningKeys()
        let forcedStatus = try await status(fromSecond)
        XCTAssertEqual(forcedStatus, 401)
        let afterForcedRetire = try await app.token("c@example.com")
        XCTAssertEqual(try header(afterForcedRetire)["alg"], "HS256")
        let publishedNone = try await jwksKeyIDs()
        XCTAssertEqual(publishedNone, [])
        let hs256Final = try await status(hs256)
        XCTAssertEqual(hs256Final, 200)
    }

    /// What a database dump holds after `keys add`: the private key only sealed, which the
    /// server (given the key encryption key) opens.
    func testKeysAddStoresThePrivateKeyEncrypted() async throws {
        let kid = try addKey()
        let row = try app.owner().query("select private_key, private_key_sealed from signing_keys where kid = $1", kid)[
            0]
        XCTAssertNil(try row.decode(String?.self, column: 0), "no plaintext column value")
        let sealed = try XCTUnwrap(try row.decode(PostgresBytes?.self, column: 1)).bytes
        XCTAssertEqual(sealed.first, 1, "format version")
        XCTAssertFalse(String(decoding: sealed, as: UTF8.self).contains("PRIVATE KEY"))
        // The server opens it with the key, and only with the right one.
        let loaded = try await app.application.reloadSigningKeys()
        XCTAssertEqual(loaded.keys.map(\.key.keyID), [kid])
        XCTAssertTrue(loaded.undecryptable.isEmpty)
        let pem = try KeyEncryptionKey(secret: app.keyEncryptionKey).open(sealed, keyID: kid)
        XCTAssertTrue(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"), "PKCS#8 PEM inside")
        XCTAssertThrowsError(try KeyEncryptionKey(secret: TestSecrets.random()).open(sealed, keyID: kid))
        XCTAssertThrowsError(
            try KeyEncryptionKey(secret: app.keyEncryptionKey).open(sealed, keyID: "another-kid"),
            "bound to its kid")
    }

    func testKeysAddWithoutAKeyEncryptionKeyIsRefused() throws {
        environment.removeValue(forKey: "TRUNK_SYNC_KEY_ENCRYPTION_KEY")
        let refused = try keys(["add"])
        XCTAssertEqual(refused.status, 1)
        XCTAssertTrue(
            refused.stderr.hasPrefix(
                "trunk-sync: TRUNK_SYNC_KEY_ENCRYPTION_KEY (or TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE, a file holding it) is required to add a signing key"
            ),
            refused.stderr)
        XCTAssertEqual(refused.stderr.split(separator: "\n").count, 1, refused.stderr)
        XCTAssertEqual(try app.owner().query("select count(*) from signing_keys")[0].decode(Int.self, column: 0), 0)
    }

    /// A key added by mistake is pending: retiring it says so (not "add a newer key first",
    /// which is for the key that signs) and how to do it anyway.
    func testRetiringAPendingKeySaysItIsPending() throws {
        let kid = try addKey()
        let refused = try keys(["retire", kid])
        XCTAssertEqual(refused.status, 1, refused.stdout)
        XCTAssertTrue(refused.stderr.hasPrefix("trunk-sync: key \(kid) is pending: it starts signing"), refused.stderr)
        XCTAssertTrue(refused.stderr.contains("pass --force"), refused.stderr)
        XCTAssertEqual(refused.stderr.split(separator: "\n").count, 1, refused.stderr)
        let forced = try keys(["retire", kid, "--force"])
        XCTAssertEqual(forced.status, 0, forced.stderr)
        XCTAssertTrue(forced.stdout.contains("retired \(kid)"), forced.stdout)
    }

    func testRetiringAnUnknownKidIsAClearError() throws {
        let result = try keys(["retire", "no-such-kid"])
        XCTAssertEqual(result.status, 1)
        XCTAssertEqual(result.stderr, "trunk-sync: no signing key with kid no-such-kid (see trunk-sync keys list)\n")
    }

    func testEveryInstanceVerifiesTheOthersTokensAfterItsReload() async throws {
        let other = try await AppHarness(sharing: app)
        let kid = try addKey()
        try app.owner().query("update signing_keys set created_at = now() - interval '1 hour'")
        try await app.application.reloadSigningKeys()
        let token = try await app.token("two@example.com")
        XCTAssertEqual(try header(token)["kid"], kid)
        let before = try await other.request("GET", "/auth/v1/user", bearer: token).status
        XCTAssertEqual(before, 401, "the other instance has not loaded the key yet (why keys wait before signing)")
        try await other.application.reloadSigningKeys()
        let after = try await other.request("GET", "/auth/v1/user", bearer: token).status
        XCTAssertEqual(after, 200)
        await other.stop()
    }

    func testBackgroundRefreshPicksUpNewKeysWithoutRestart() async throws {
        await app.application.startSigningKeyRefresh(every: .milliseconds(50))
        let kid = try addKey()
        let harness: AppHarness = app
        try await withTimeout(10, "the refresh") {
            while try await harness.request("GET", "/auth/v1/.well-known/jwks.json").text.contains(kid) == false {
                try await Task.sleep(for: .milliseconds(20))
            }
        }
    }

    func testReadinessWaitsForTheFirstKeyLoadAndRevocationLoad() async throws {
        // Without a listener, whose connection would load the revocations by itself.
        let configuration = try Configuration.load(
            environment: environment.merging(["TRUNK_SYNC_PORT": "0", "TRUNK_SYNC_ADMIN_PORT": "0"]) { $1 })
        let application = try Application(
            configuration: configuration, logger: TestDatabase.quietLogger, sender: app.sender, listen: false)
        let server = HTTPServer(
            configuration: application.serverConfiguration,
            responder: application.pipeline(logger: TestDatabase.quietLogger),
            logger: TestDatabase.quietLogger)
        let admin = HTTPServer(
            configuration: application.adminServerConfiguration,
            responder: application.adminPipeline(logger: TestDatabase.quietLogger), logger: TestDatabase.quietLogger)
        let port = try server.start()
        let adminPort = try admin.start()
        func readiness(_ port: Int) async throws -> (Int, String) {
            let url = try XCTUnwrap(URL(string: "http://127.0.0.1:\(port)/readyz"))
            let (data, response) = try await URLSession.shared.data(from: url)
            return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data, as: UTF8.self))
        }
        let (before, body) = try await readiness(port)
        XCTAssertEqual(before, 503)
        XCTAssertFalse(body.contains("signing"), "the public answer names no reason: \(body)")
        let (adminBefore, adminBody) = try await readiness(adminPort)
        XCTAssertEqual(adminBefore, 503)
        XCTAssertTrue(adminBody.contains("signing_keys_not_loaded"), adminBody)
        try await application.reloadSigningKeys()
        let (keysLoaded, _) = try await readiness(port)
        XCTAssertEqual(keysLoaded, 503)
        let (adminKeysLoaded, adminKeysLoadedBody) = try await readiness(adminPort)
        XCTAssertEqual(adminKeysLoaded, 503)
        XCTAssertTrue(adminKeysLoadedBody.contains("revocations_not_loaded"), adminKeysLoadedBody)
        await application.loadRevokedSessions()
        let (after, _) = try await readiness(port)
        XCTAssertEqual(after, 200)
        let (adminAfter, _) = try await readiness(adminPort)
        XCTAssertEqual(adminAfter, 200)
        server.shutdown()
        admin.shutdown()
        await server.waitUntilStopped()
        await admin.waitUntilStopped()
        await application.close()
    }

    // MARK: - Verification

    func testUnknownKidAlgorithmConfusionExpiryAndAudienceAre401() async throws {
        let key = try JWT.ES256Key.generate(keyID: "live")
        app.application.tokens.install([TokenIssuer.LoadedKey(key: key, signsFrom: 0)])
        let issued = try await app.token("conf@example.com")
        XCTAssertEqual(try header(issued)["kid"], "live")
        let payload = try XCTUnwrap(Base64URL.decode(String(issued.split(separator: ".")[1])))
        let claims = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any])

        func token(_ header: String, _ claims: [String: Any], signature: (String) throws -> [UInt8]) throws -> String {
            let input =
                Base64URL.encode(header) + "."
                + Base64URL.encode(Array(try JSONSerialization.data(withJSONObject: claims)))
            return input + "." + Base64URL.encode(try signature(input))
        }
        func ecdsa(_ key: JWT.ES256Key) -> (String) throws -> [UInt8] { { try key.signature(for: Array($0.utf8)) } }
        func hmac(_ secret: [UInt8]) -> (String) throws -> [UInt8] { { HMAC.sha256(key: secret, message: $0) } }
        let secret = Array(app.secret.utf8)
        let stranger = try JWT.ES256Key.generate()
        let now = Int(Date().timeIntervalSince1970)
        var expired = claims
        expired["exp"] = now - 120
        var withinLeeway = claims
        withinLeeway["exp"] = now - 10
        var wrongAudience = claims
        wrongAudience["aud"] = "anon"

        let rejected: [(String, String)] = [
            ("unknown kid", try token(#"{"alg":"ES256","kid":"gone"}"#, claims, signature: ecdsa(key))),
            (
                "other key under the kid",
                try token(#"{"alg":"ES256","kid":"live"}"#, claims, signature: ecdsa(stranger))
            ),
            ("ES256 without kid", try token(#"{"alg":"ES256"}"#, claims, signature: ecdsa(key))),
            ("HS256 with an ES256 kid", try token(#"{"alg":"HS256","kid":"live"}"#, claims, signature: hmac(secret))),
            (
                "HS256 keyed with the public key",
                try token(#"{"alg":"HS256","kid":"live"}"#, claims, signature: hmac(key.x + key.y))
            ),
            (
                "HS256 keyed with the JWK",
                try token(#"{"alg":"HS256","kid":"live"}"#, claims, signature: hmac(Array(key.publicJWK.utf8)))
            ),
            ("ES256 header with an HMAC", try token(#"{"alg":"ES256","kid":"live"}"#, claims, signature: hmac(secret))),
            ("ES256 header without kid, HMAC", try token(#"{"alg":"ES256"}"#, claims, signature: hmac(secret))),
            ("none", try token(#"{"alg":"none","kid":"live"}"#, claims) { _ in [] }),
            ("expired", try token(#"{"alg":"ES256","kid":"live"}"#, expired, signature: ecdsa(key))),
            ("wrong audience", try token(#"{"alg":"ES256","kid":"live"}"#, wrongAudience, signature: ecdsa(key))),
        ]
        for (name, bad) in rejected {
            let response = try await app.request("GET", "/auth/v1/user", bearer: bad)
            XCTAssertEqual(response.status, 401, name)
            XCTAssertEqual(response.json["code"] as? String, "bad_jwt", name)
            let sync = try await app.request("GET", "/sync/v1/events", bearer: bad)
            XCTAssertEqual(sync.status, 401, name)
        }
        let accepted: [(String, String)] = [
            ("issued", issued),
            ("re-signed", try token(#"{"alg":"ES256","kid":"live","typ":"JWT"}"#, claims, signature: ecdsa(key))),
            (
                "expired within the leeway",
                try token(#"{"alg":"ES256","kid":"live"}"#, withinLeeway, signature: ecdsa(key))
            ),
            ("HS256 of the secret", try token(#"{"alg":"HS256","typ":"JWT"}"#, claims, signature: hmac(secret))),
        ]
        for (name, good) in accepted {
            let response = try await app.request("GET", "/auth/v1/user", bearer: good)
            XCTAssertEqual(response.status, 200, "\(name): \(response.text)")
        }
    }
}
