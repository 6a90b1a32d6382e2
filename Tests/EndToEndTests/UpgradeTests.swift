import Foundation
import Postgres
import TestSupport
import XCTest

/// Upgrading a deployment of the previous release (schema up to 0002, a plaintext signing
/// key, users with sessions and events) with the real binary: `migrate` refuses to leave
/// keys no server can use, then encrypts them; the server signs with them, and data written
/// before the upgrade is still served under row-level security.
final class UpgradeTests: EndToEndTestCase {
    var database: PostgresConfiguration!
    let keyID = "upgrade-kid-1"
    let refreshToken = "pre-upgrade-refresh-token-" + TestSecrets.randomHex()
    var privateKeyPEM = ""

    override func setUpWithError() throws {
        database = try TestDatabase.create(prefix: "upgrade")
        try migrateAsThePreviousRelease()
        try seedAsThePreviousRelease()
    }

    override func tearDown() {
        super.tearDown()  // stops the servers first
        if let database { try? TestDatabase.drop(database) }
    }

    /// Runs `trunk-sync arguments` with the servers' environment for this database, plus
    /// `overrides` (nil removes a variable).
    func trunkSync(_ arguments: [String], _ overrides: [String: String?] = [:]) throws -> Command.Result {
        var environment = ServerProcess.serveEnvironment(
            databaseURL: try TestDatabase.url(of: database), overrides: [:])
        for (name, value) in overrides { environment[name] = value }
        return try Command.run(Command.trunkSyncBinary(), arguments, environment: environment)
    }

    /// The previous release's schema: the repository's migrations up to 0002.
    func migrateAsThePreviousRelease() throws {
        let directory = NSTemporaryDirectory() + "previous-release-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for name in ["0001_initial_schema.sql", "0002_signing_keys.sql"] {
            try FileManager.default.copyItem(
                atPath: repositoryRoot() + "/migrations/" + name, toPath: directory + "/" + name)
        }
        let result = try trunkSync(
            ["migrate"], ["TRUNK_SYNC_MIGRATIONS_DIR": directory, "TRUNK_SYNC_KEY_ENCRYPTION_KEY": nil])
        XCTAssertEqual(result.status, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("applied 0002_signing_keys.sql"), result.stdout)
    }

    /// What the previous release wrote: a user with three events, a session and its refresh
    /// token, a pending sign-in code, and a plaintext ES256 key old enough to sign.
    func seedAsThePreviousRelease() throws {
        let owner = try PostgresConnection.connect(database)
        let user = try owner.query(
            "insert into users (email, last_seq, email_confirmed_at) values ('old@example.com', 3, now()) returning id")[
                0
            ]
            .decode(UUID.self, column: 0)
        try owner.query(
            """
            insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
            select $1, n, 'note', jsonb_build_object('n', n), gen_random_uuid(), now(), now() + n * interval '1 millisecond'
            from generate_series(1, 3) n
            """, user)
        let session = try owner.query("insert into sessions (user_id) values ($1) returning id", user)[0]
            .decode(UUID.self, column: 0)
        try owner.query(
            "insert into refresh_tokens (session_id, user_id, token_hash) values ($1, $2, sha256(convert_to($3, 'UTF8')))",
            session, user, refreshToken)
        try owner.query(
            "insert into otp_codes (email, code_hash, expires_at) values ('new@example.com', '\\x00', now() + interval '5 minutes')"
        )
        let generated = try Command.run(
            "/usr/bin/openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"])
        XCTAssertEqual(generated.status, 0, generated.stderr)
        privateKeyPEM = generated.stdout
        try owner.query(
            """
            insert into signing_keys (kid, algorithm, private_key, public_jwk, created_at)
            values ($1, 'ES256', $2, '{}', now() - interval '1 hour')
            """, keyID, privateKeyPEM)
    }

    func appliedMigrations() throws -> Int {
        try PostgresConnection.connect(database).query("select count(*) from schema_migrations")[0].decode(
            Int.self, column: 0)
    }

    /// The header of a JWT, decoded.
    func header(_ token: String) throws -> [String: Any] {
        var segment = String(try XCTUnwrap(token.split(separator: ".").first))
            .replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while segment.count % 4 != 0 { segment += "=" }
        let data = try XCTUnwrap(Data(base64Encoded: segment))
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    func testMigrateRefusesPlaintextKeysWithoutAKeyAndChangesNothing() throws {
        let refused = try trunkSync(["migrate"], ["TRUNK_SYNC_KEY_ENCRYPTION_KEY": nil])
        XCTAssertEqual(refused.status, 1, refused.stdout)
        XCTAssertEqual(refused.stderr.split(separator: "\n").count, 1, refused.stderr)
        XCTAssertTrue(refused.stderr.contains("1 private key(s) stored unencrypted"), refused.stderr)
        XCTAssertTrue(
            refused.stderr.contains("set TRUNK_SYNC_KEY_ENCRYPTION_KEY or TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE"),
            refused.stderr)
        XCTAssertTrue(refused.stderr.contains("nothing was changed"), refused.stderr)
        XCTAssertEqual(try appliedMigrations(), 2)
        let stored = try PostgresConnection.connect(database).query("select private_key from signing_keys")[0]
            .decode(String.self, column: 0)
        XCTAssertEqual(stored, privateKeyPEM)
    }

    func testUpgradeEncryptsTheKeysAndEverythingKeepsWorking() throws {
        let migrated = try trunkSync(["migrate"])
        XCTAssertEqual(migrated.status, 0, migrated.stderr)
        for line in [
            "applied 0005_row_level_security.sql", "applied 0006_encrypted_signing_keys.sql",
            "applied 0007_pull_function.sql", "applied 0010_drop_pull_function.sql",
            "encrypted 1 signing key(s) with TRUNK_SYNC_KEY_ENCRYPTION_KEY",
        ] {
            XCTAssertTrue(migrated.stdout.contains(line), migrated.stdout)
        }

        // At rest, as the owner reads it (and as a dump holds it): no private key in clear.
        let row = try PostgresConnection.connect(database).query(
            "select private_key, private_key_sealed from signing_keys where kid = $1", keyID)[0]
        XCTAssertNil(try row.decode(String?.self, column: 0))
        let sealed = try XCTUnwrap(try row.decode(PostgresBytes?.self, column: 1)).bytes
        let body = privateKeyPEM.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        let sealedText = String(decoding: sealed, as: UTF8.self)
        XCTAssertFalse(sealedText.contains("PRIVATE KEY"))
        XCTAssertFalse(sealedText.contains(body.prefix(16)))
        XCTAssertEqual(sealed.count, 1 + 12 + privateKeyPEM.utf8.count + 16)

        let server = try launchServer(on: database)
        try server.waitUntilListening(timeout: 15)
        let ready = eventually(within: 10) { (try? server.exchange(request("GET", "/readyz")).0.status) == 200 }
        XCTAssertTrue(ready, server.logs)

        // The server decrypted the key: `token` (the server's role) signs with it.
        let issued = try trunkSync(["token", "--email", "old@example.com"])
        XCTAssertEqual(issued.status, 0, issued.stderr)
        let session = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(issued.stdout.utf8)) as? [String: Any])
        let token = try XCTUnwrap(session["access_token"] as? String)
        XCTAssertEqual(try header(token)["kid"] as? String, keyID)
        XCTAssertEqual(try header(token)["alg"] as? String, "ES256")

        // Rows written before the upgrade, read and written under row-level security.
        let (pulled, _) = try server.exchange(
            request("GET", "/sync/v1/events?after=0", headers: [("Authorization", "Bearer \(token)")]))
        XCTAssertEqual(pulled.status, 200, pulled.bodyText)
        XCTAssertEqual((pulled.jsonObject?["events"] as? [Any])?.count, 3, pulled.bodyText)
        let (user, _) = try server.exchange(
            request("GET", "/auth/v1/user", headers: [("Authorization", "Bearer \(token)")]))
        XCTAssertEqual(user.status, 200, user.bodyText)
        XCTAssertEqual(user.jsonObject?["email"] as? String, "old@example.com")
        let (refreshed, _) = try server.exchange(
            request(
                "POST", "/auth/v1/token?grant_type=refresh_token", headers: [("Content-Type", "application/json")],
                body: #"{"refresh_token":"\#(refreshToken)"}"#))
        XCTAssertEqual(refreshed.status, 200, refreshed.bodyText)
        XCTAssertEqual((refreshed.jsonObject?["user"] as? [String: Any])?["email"] as? String, "old@example.com")
        XCTAssertFalse(server.logs.contains(body.prefix(16)), "no private key in the log")
        XCTAssertFalse(server.logs.contains(ServerProcess.keyEncryptionKey), "no key encryption key in the log")

        // Migrating again changes nothing.
        let again = try trunkSync(["migrate"])
        XCTAssertEqual(again.status, 0, again.stderr)
        XCTAssertTrue(again.stdout.contains("database is up to date"), again.stdout)
        XCTAssertFalse(again.stdout.contains("encrypted"), again.stdout)
    }

    /// Once keys are encrypted, a server or `migrate` without the right key says so and stops.
    func testServeAndMigrateRefuseAMissingOrWrongKey() throws {
        XCTAssertEqual(try trunkSync(["migrate"]).status, 0)
        let other = TestSecrets.random()
        let wrongMigrate = try trunkSync(["migrate"], ["TRUNK_SYNC_KEY_ENCRYPTION_KEY": other])
        XCTAssertEqual(wrongMigrate.status, 1)
        XCTAssertEqual(
            wrongMigrate.stderr,
            "trunk-sync: TRUNK_SYNC_KEY_ENCRYPTION_KEY does not decrypt signing key \(keyID): it is not the key the stored keys were encrypted with; nothing was changed\n"
        )
        for (key, reason) in [
            (
                nil,
                "it is stored encrypted and neither TRUNK_SYNC_KEY_ENCRYPTION_KEY nor TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE is set"
            ),
            (other, "TRUNK_SYNC_KEY_ENCRYPTION_KEY does not decrypt it"),
        ] {
            let server = try launchServer(on: database, ["TRUNK_SYNC_KEY_ENCRYPTION_KEY": key])
            XCTAssertEqual(server.waitForExit(timeout: 20), 1, server.logs)
            let last = server.stderr.text.split(separator: "\n").last.map(String.init) ?? ""
            XCTAssertTrue(last.hasPrefix("trunk-sync: signing key \(keyID) cannot be used: \(reason)"), server.logs)
            XCTAssertFalse(server.logs.contains(other))
        }
    }
}
