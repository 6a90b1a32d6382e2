import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

/// `trunk-sync users …` and `token` as operators run them: the real binary, a real database.
final class AdminCommandTests: XCTestCase {
    var database: PostgresConfiguration!
    var environment: [String: String]!

    override func setUpWithError() throws {
        database = try TestDatabase.create(prefix: "admin")
        environment = Command.environment([
            "TRUNK_SYNC_DATABASE_URL": try TestDatabase.url(of: database),
            "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
            "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
        ])
        XCTAssertEqual(try run(["migrate"]).status, 0)
    }

    override func tearDownWithError() throws { try TestDatabase.drop(database) }

    func run(_ arguments: [String]) throws -> Command.Result {
        try Command.run(Command.trunkSyncBinary(), arguments, environment: environment)
    }

    /// Signs a user in with `token` and pushes `count` events for them directly.
    func seed(_ email: String, events count: Int) throws -> [String: Any] {
        let result = try run(["token", "--email", email])
        XCTAssertEqual(result.status, 0, result.stderr)
        let session = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let userID = try XCTUnwrap((session["user"] as? [String: Any])?["id"] as? String)
        let owner = try PostgresConnection.connect(database)
        try owner.query(
            """
            insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
            select $1::uuid, n, 'note', jsonb_build_object('n', n, 'text', 'ü "q"'), gen_random_uuid(), now(),
                   now() + n * interval '1 millisecond'
            from generate_series(1, $2::int) n
            """, userID, Int64(count))
        try owner.query("update users set last_seq = $2 where id = $1::uuid", userID, Int64(count))
        try owner.query("insert into otp_codes (email, code_hash, expires_at) values ($1, '\\x00', now())", email)
        return session
    }

    func testTokenPrintsASessionThatTheServerAccepts() throws {
        let session = try seed("tok@example.com", events: 0)
        XCTAssertEqual(session["token_type"] as? String, "bearer")
        XCTAssertNotNil(session["refresh_token"] as? String)
        let bad = try run(["token", "--email", "not an email"])
        XCTAssertNotEqual(bad.status, 0)
    }

    func testListShowExportAndDelete() throws {
        _ = try seed("ada@example.com", events: 2500)
        _ = try seed("bob@example.com", events: 1)
        let list = try run(["users", "list"])
        XCTAssertEqual(list.status, 0, list.stderr)
        let lines = list.stdout.split(separator: "\n")
        XCTAssertTrue(lines[0].hasPrefix("EMAIL"))
        XCTAssertTrue(lines.contains { $0.hasPrefix("ada@example.com") && $0.hasSuffix("2500") }, list.stdout)
        XCTAssertTrue(list.stdout.contains("2 user(s)"))

        let show = try run(["users", "show", "ADA@example.com"])
        XCTAssertEqual(show.status, 0, show.stderr)
        XCTAssertTrue(show.stdout.contains("events:          2500"), show.stdout)
        // No name: "—", as the console shows it (it printed nothing after the label).
        XCTAssertTrue(show.stdout.contains("\nfull name:       —\n"), show.stdout)
        try PostgresConnection.connect(database).query(
            "update users set full_name = 'Bob Builder' where email = 'bob@example.com'")
        let named = try run(["users", "show", "bob@example.com"])
        XCTAssertTrue(named.stdout.contains("\nfull name:       Bob Builder\n"), named.stdout)

        let export = try run(["users", "export", "ada@example.com"])
        XCTAssertEqual(export.status, 0, export.stderr)
        var exported = export.stdout.split(separator: "\n")
        XCTAssertEqual(exported.count, 2502, "the account, then each event, then the end line")
        XCTAssertEqual(exported.removeLast(), #"{"kind":"end","events":2500,"last_seq":2500}"#)
        let account = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(exported.removeFirst().utf8)) as? [String: Any])
        XCTAssertEqual(account["kind"] as? String, "account")
        XCTAssertEqual(account["email"] as? String, "ada@example.com")
        let seqs = try exported.map { line -> Int in
            let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            XCTAssertEqual(object["kind"] as? String, "event")
            XCTAssertEqual((object["payload"] as? [String: Any])?["text"] as? String, "ü \"q\"")
            return try XCTUnwrap(object["seq"] as? Int)
        }
        XCTAssertEqual(seqs, Array(1...2500))
        XCTAssertTrue(export.stderr.contains("exported 2500 event(s)"))

        let refused = try run(["users", "delete", "ada@example.com"])  // stdin is empty: not confirmed
        XCTAssertEqual(refused.status, 1)
        XCTAssertTrue(refused.stderr.contains("nothing deleted"), refused.stderr)

        let deleted = try run(["users", "delete", "ada@example.com", "--yes"])
        XCTAssertEqual(deleted.status, 0, deleted.stderr)
        let owner = try PostgresConnection.connect(database)
        let remaining = try owner.query(
            """
            select (select count(*) from users where email = 'ada@example.com')
                 + (select count(*) from events e where not exists (select 1 from users u where u.id = e.user_id))
                 + (select count(*) from sessions s where not exists (select 1 from users u where u.id = s.user_id))
                 + (select count(*) from refresh_tokens t where not exists (select 1 from users u where u.id = t.user_id))
                 + (select count(*) from otp_codes where email = 'ada@example.com')
                 + (select count(*) from reauthentication_codes c where not exists (select 1 from users u where u.id = c.user_id))
            """)[0].decode(Int.self, column: 0)
        XCTAssertEqual(remaining, 0, "no row of the deleted user anywhere")
        let bobEvents = try owner.query("select count(*) from events")[0].decode(Int.self, column: 0)
        XCTAssertEqual(bobEvents, 1, "other users keep their data")

        let missing = try run(["users", "show", "ada@example.com"])
        XCTAssertEqual(missing.status, 1)
        XCTAssertEqual(missing.stderr, "trunk-sync: no user with email ada@example.com\n")
    }
}
