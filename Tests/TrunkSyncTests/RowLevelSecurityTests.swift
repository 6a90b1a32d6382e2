import Foundation
import Postgres
import TestSupport
import TrunkCrypto
import XCTest

@testable import TrunkSync

/// The second wall: with no `user_id` filter in the query at all, the server's role sees and
/// writes only the rows the transaction's settings name (`app.user_id`, `app.email`,
/// `app.refresh_token_hash`), on every table with a user's rows; with none set, nothing.
class RowLevelSecurityTests: XCTestCase {
    var database: PostgresConfiguration!
    var owner: PostgresConnection!
    let alice = UUID()
    let bob = UUID()
    let aliceToken = "alice-refresh-token"
    /// Every table holding a user's rows.
    static let userTables = ["users", "sessions", "refresh_tokens", "otp_codes", "events"]

    override func setUp() async throws {
        database = try TestDatabase.create(prefix: "rls")
        owner = try PostgresConnection.connect(database)
        let migrator = Migrator(
            migrations: try Migration.load(from: repositoryRoot() + "/migrations"), logger: TestDatabase.quietLogger)
        _ = try migrator.migrate(on: owner)
        // Seed as the owner (a superuser here, which bypasses RLS): two users with sessions,
        // refresh tokens, codes and events, and a code for an address without a user.
        for (id, name, count) in [(alice, "alice", 3), (bob, "bob", 2)] {
            try owner.query(
                "insert into users (id, email, last_seq) values ($1, $2, $3)", id, "\(name)@example.com", Int64(count))
            try owner.query(
                """
                insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
                select $1, n, 'note', '{}', gen_random_uuid(), now(), now() from generate_series(1, $2::int) as n
                """, id, Int64(count))
            let session = try owner.query("insert into sessions (user_id) values ($1) returning id", id)[0]
                .decode(UUID.self, column: 0)
            try owner.query(
                "insert into refresh_tokens (session_id, user_id, token_hash) values ($1, $2, $3)", session, id,
                PostgresBytes(SHA256.hash("\(name)-refresh-token")))
        }
        for address in ["alice@example.com", "bob@example.com", "carol@example.com"] {
            try owner.query(
                "insert into otp_codes (email, code_hash, expires_at) values ($1, '\\x00', now() + interval '10 minutes')",
                address)
        }
    }

    override func tearDown() async throws {
        owner = nil
        try TestDatabase.drop(database)
    }

    /// A connection as the server's role. Here: the owner's login switched to
    /// `trunk_sync_app` (`SET ROLE`), as servers that log in as the owner run.
    func serverConnection() throws -> PostgresConnection {
        let connection = try PostgresConnection.connect(database)
        try connection.query("select set_config('role', 'trunk_sync_app', false)")
        return connection
    }

    /// Runs `body` as the server's role in a transaction with `settings` set for it (as the
    /// server sets them), then rolls it back.
    func asServer<T>(_ settings: [String: String] = [:], _ body: (PostgresConnection) throws -> T) throws -> T {
        let connection = try serverConnection()
        try connection.execute("begin")
        defer { try? connection.execute("rollback") }
        for (name, value) in settings { try connection.query("select set_config($1, $2, true)", name, value) }
        return try body(connection)
    }

    func count(_ table: String, on connection: PostgresConnection) throws -> Int {
        try connection.query("select count(*) from \(table)")[0].decode(Int.self, column: 0)
    }

    func counts(_ settings: [String: String]) throws -> [String: Int] {
        try asServer(settings) { connection in
            try Dictionary(uniqueKeysWithValues: Self.userTables.map { ($0, try count($0, on: connection)) })
        }
    }

    func assertRefused(
        _ statement: String, _ binds: any PostgresEncodable..., settings: [String: String], line: UInt = #line
    )
        throws
    {
        do {
            _ = try asServer(settings) { try $0.query(statement, binds: binds.map(\.postgresBind)) }
            XCTFail("expected a row-level security violation: \(statement)", line: line)
        } catch let error as PostgresError {
            XCTAssertEqual(error.sqlState, .insufficientPrivilege, statement, line: line)
        }
    }

    // MARK: - Reading

    func testTheServerRoleIsNeitherSuperuserNorOwner() throws {
        let (isSuperuser, bypasses, owners) = try asServer { connection in
            let row = try connection.query(
                """
                select rolsuper, rolbypassrls,
                       (select array_agg(distinct tableowner::text) from pg_tables where tablename = any($1))
                from pg_roles where rolname = current_user
                """, Self.userTables)[0]
            return (
                try row.decode(Bool.self, column: 0), try row.decode(Bool.self, column: 1),
                try row.decode([String].self, column: 2)
            )
        }
        XCTAssertFalse(isSuperuser)
        XCTAssertFalse(bypasses)
        XCTAssertFalse(owners.contains("trunk_sync_app"))
        for table in Self.userTables {
            let forced = try owner.query(
                "select relrowsecurity and relforcerowsecurity from pg_class where oid = $1::regclass", table)[0]
                .decode(Bool.self, column: 0)
            XCTAssertTrue(forced, "\(table) has forced row-level security")
        }
    }

    func testWithNothingSetNoRowOfAnyTableIsVisibleOrWritable() throws {
        XCTAssertEqual(try counts([:]), Dictionary(uniqueKeysWithValues: Self.userTables.map { ($0, 0) }))
        try asServer { connection in
            for statement in [
                "update users set full_name = 'x'", "update sessions set revoked_at = now()",
                "update refresh_tokens set revoked_at = now()", "delete from otp_codes", "delete from sessions",
            ] {
                XCTAssertEqual(try connection.query(statement).affectedRows, 0, statement)
            }
        }
        // Set to the empty string (as after a scoped transaction ended): still nothing.
        XCTAssertEqual(
            try counts(["app.user_id": "", "app.email": "", "app.refresh_token_hash": ""]),
            Dictionary(uniqueKeysWithValues: Self.userTables.map { ($0, 0) }))
    }

    func testWithAUserIdExactlyTheirRowsAreVisible() throws {
        XCTAssertEqual(
            try counts(["app.user_id": alice.uuidString]),
            ["users": 1, "sessions": 1, "refresh_tokens": 1, "otp_codes": 0, "events": 3])
        XCTAssertEqual(
            try counts(["app.user_id": bob.uuidString]),
            ["users": 1, "sessions": 1, "refresh_tokens": 1, "otp_codes": 0, "events": 2])
        XCTAssertEqual(
            try counts(["app.user_id": UUID().uuidString]),
            ["users": 0, "sessions": 0, "refresh_tokens": 0, "otp_codes": 0, "events": 0])
        let owners = try asServer(["app.user_id": alice.uuidString]) { connection in
            try [
                "select id from users", "select user_id from sessions", "select user_id from refresh_tokens",
                "select distinct user_id from events",
            ].flatMap { sql in
                try connection.query(sql).map { try $0.decode(UUID.self, column: 0) }
            }
        }
        XCTAssertEqual(Set(owners), [alice])
    }

    /// Sign-in knows only the address: its user row and its code, nobody else's, and none
    /// of the user's sessions, tokens or events.
    func testAnAddressScopesItsUserRowAndCodeOnly() throws {
        XCTAssertEqual(
            try counts(["app.email": "alice@example.com"]),
            ["users": 1, "sessions": 0, "refresh_tokens": 0, "otp_codes": 1, "events": 0])
        XCTAssertEqual(
            try counts(["app.email": "carol@example.com"]),
            ["users": 0, "sessions": 0, "refresh_tokens": 0, "otp_codes": 1, "events": 0])
        let emails = try asServer(["app.email": "alice@example.com"]) { connection in
            try connection.query("select email from users union all select email from otp_codes")
                .map { try $0.decode(String.self, column: 0) }
        }
        XCTAssertEqual(emails, ["alice@example.com", "alice@example.com"])
        try assertRefused(
            "insert into otp_codes (email, code_hash, expires_at) values ('bob@example.com', '\\x00', now())",
            settings: ["app.email": "alice@example.com"])
    }

    /// Sign-in's look-up of an address (every `/otp`) finds the row through an index, the
    /// policies filtering only that row, instead of reading every user: `lower(email) = $1`
    /// cannot use one under row-level security (`lower()` is not leakproof).
    func testSignInLooksAnAddressUpThroughAnIndex() throws {
        try owner.query(
            "insert into users (email) select 'user' || n || '@example.com' from generate_series(1, 5000) n")
        try owner.query("analyze users")
        let (found, plan) = try asServer(["app.email": "user42@example.com"]) { connection in
            (
                try connection.query(AuthService.userByAddress, "user42@example.com").count,
                try connection.query("explain (analyze, costs off) " + AuthService.userByAddress, "user42@example.com")
                    .map { try $0.decode(String.self, column: 0) }.joined(separator: "\n")
            )
        }
        XCTAssertEqual(found, 1)
        XCTAssertTrue(plan.contains("Index Cond: (email = "), plan)
        XCTAssertFalse(plan.contains("Seq Scan"), plan)
        XCTAssertFalse(plan.contains("Rows Removed by Filter"), plan)
        // Another address's scope finds nothing, though the index has the row.
        let other = try asServer(["app.email": "user43@example.com"]) { connection in
            try connection.query(AuthService.userByAddress, "user42@example.com").count
        }
        XCTAssertEqual(other, 0)
    }

    /// A token refresh knows only the token: that one token row, not its session.
    func testARefreshTokenHashFindsOnlyThatToken() throws {
        let hash = Hex.encode(SHA256.hash(aliceToken))
        XCTAssertEqual(
            try counts(["app.refresh_token_hash": hash]),
            ["users": 0, "sessions": 0, "refresh_tokens": 1, "otp_codes": 0, "events": 0])
        XCTAssertEqual(
            try counts(["app.refresh_token_hash": Hex.encode(SHA256.hash("no such token"))])["refresh_tokens"], 0)
        // Finding it is all it allows: writing a token needs the user's id.
        let session = try owner.query("select id from sessions where user_id = $1", alice)[0].decode(
            UUID.self, column: 0)
        try assertRefused(
            "insert into refresh_tokens (session_id, user_id, token_hash) values ($1, $2, '\\x01')", session, alice,
            settings: ["app.refresh_token_hash": hash])
    }

    func testTheSettingDoesNotOutliveItsTransaction() throws {
        let connection = try serverConnection()
        try connection.transaction { connection in
            try connection.query("select set_config('app.user_id', $1, true)", alice.uuidString)
            XCTAssertEqual(try count("events", on: connection), 3)
        }
        XCTAssertEqual(try count("events", on: connection), 0)
        XCTAssertEqual(try count("users", on: connection), 0)
    }

    /// The pull's scope and select, pipelined without `begin`/`commit`: one implicit
    /// transaction, so the select sees that user's rows and nothing stays set afterwards.
    func testAPipelinedScopeLastsOnlyItsImplicitTransaction() throws {
        let connection = try serverConnection()
        let select = PostgresStatement.prepared("select seq from events where seq > $1 order by seq", Int64(1))
        let page = try connection.pipeline([
            .prepared("select set_config('app.user_id', $1, true)", alice.uuidString.lowercased()), select,
        ])[1]
        XCTAssertEqual(try page.map { try $0.decode(Int64.self, column: 0) }, [2, 3])
        XCTAssertEqual(try connection.pipeline([select])[0].count, 0, "the next pipeline sees nothing")
        XCTAssertEqual(
            try connection.query("select current_setting('app.user_id', true)")[0].decode(String?.self, column: 0)
                ?? "", "")
        XCTAssertEqual(try count("events", on: connection), 0)
    }

    // MARK: - Writing

    func testAnotherUsersRowsCannotBeWritten() throws {
        let asAlice = ["app.user_id": alice.uuidString]
        try asServer(asAlice) { connection in
            XCTAssertEqual(try connection.query("update users set full_name = 'x' where id = $1", bob).affectedRows, 0)
            XCTAssertEqual(
                try connection.query("update sessions set revoked_at = now() where user_id = $1", bob).affectedRows, 0)
            XCTAssertEqual(
                try connection.query("update refresh_tokens set revoked_at = now() where user_id = $1", bob)
                    .affectedRows, 0)
        }
        try assertRefused("insert into sessions (user_id) values ($1)", bob, settings: asAlice)
        try assertRefused(
            "insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at) values ($1, 99, 'x', '{}', gen_random_uuid(), now(), now())",
            bob, settings: asAlice)
        try assertRefused("update users set id = $1 where id = $2", bob, alice, settings: asAlice)
        try assertRefused(
            "insert into users (email) values ('mallory@example.com')", settings: asAlice)
    }

    /// A console session's token hash (migration 0008) lets the server's role read every
    /// user's users, sessions and events rows while the session is live, and nothing more:
    /// no codes, no refresh tokens, no writes; expired, revoked or unknown, nothing at all.
    func testALiveConsoleSessionReadsAcrossUsersAndNothingElse() throws {
        func hash(_ token: String) -> String { Hex.encode(SHA256.hash(token)) }
        for (token, expires, revoked) in [
            ("live", "now() + interval '10 minutes'", "null"), ("expired", "now() - interval '1 second'", "null"),
            ("revoked", "now() + interval '10 minutes'", "now()"),
        ] {
            try owner.query(
                "insert into console_sessions (email, token_hash, expires_at, revoked_at) values ('ops@example.com', $1, \(expires), \(revoked))",
                PostgresBytes(SHA256.hash(token)))
        }
        XCTAssertEqual(
            try counts(["app.console_token_hash": hash("live")]),
            ["users": 2, "sessions": 2, "refresh_tokens": 0, "otp_codes": 0, "events": 5])
        for token in ["expired", "revoked", "unknown"] {
            XCTAssertEqual(
                try counts(["app.console_token_hash": hash(token)]),
                Dictionary(uniqueKeysWithValues: Self.userTables.map { ($0, 0) }), token)
        }
        try asServer(["app.console_token_hash": hash("live")]) { connection in
            for statement in [
                "update users set full_name = 'x'", "update sessions set revoked_at = now()", "delete from users",
            ] {
                XCTAssertEqual(try connection.query(statement).affectedRows, 0, statement)
            }
        }
    }

    /// The server's role deletes a user (the console's deletion) only scoped to that user,
    /// and the user's sessions and events go with it.
    func testTheServerRoleDeletesOnlyTheScopedUser() throws {
        try asServer(["app.user_id": alice.uuidString.lowercased()]) { connection in
            XCTAssertEqual(try connection.query("delete from users where id = $1", bob).affectedRows, 0)
            XCTAssertEqual(try connection.query("delete from users").affectedRows, 1)
            XCTAssertEqual(try count("events", on: connection), 0)
            XCTAssertEqual(try count("sessions", on: connection), 0)
        }
    }

    func testTheLogIsAppendOnlyForTheServer() throws {
        for statement in ["update events set type = 'changed'", "delete from events"] {
            try assertRefused(statement, settings: ["app.user_id": alice.uuidString])
        }
    }

    /// The server's role cannot read the private halves of signing keys in clear, only the
    /// sealed column.
    func testTheServerRoleCannotReadPlaintextPrivateKeys() throws {
        try assertRefused("select private_key from signing_keys", settings: [:])
        try assertRefused("select * from signing_keys", settings: [:])
        XCTAssertNoThrow(try asServer { try $0.query("select kid, private_key_sealed, public_jwk from signing_keys") })
    }
}

/// The same, logged in as the server's own login role (`TRUNK_SYNC_DATABASE_URL` naming
/// another role than the owner), as `migrate` creates it: no `SET ROLE` to undo.
final class ServerLoginRowLevelSecurityTests: RowLevelSecurityTests {
    var role = ""
    var password = ""

    override func setUp() async throws {
        try await super.setUp()
        role = TestDatabase.roleName("rls_server")
        password = TestSecrets.randomHex()
        let login = try XCTUnwrap(
            try DatabaseRoles.ServerLogin(url: try TestDatabase.url(of: database, user: role, password: password)))
        try DatabaseRoles.checkServerLogin(login, on: owner)
        XCTAssertEqual(try DatabaseRoles.ensureServerLogin(login, on: owner), .created(role))
    }

    override func tearDown() async throws {
        try await super.tearDown()
        TestDatabase.dropRole(role)
    }

    override func serverConnection() throws -> PostgresConnection {
        try PostgresConnection.connect(
            try PostgresConfiguration(try TestDatabase.url(of: database, user: role, password: password)))
    }

    /// Undoing the switch gains nothing: the login itself holds no more than trunk_sync_app.
    func testResettingTheRoleGainsNothing() throws {
        let connection = try serverConnection()
        try connection.execute("reset role")
        XCTAssertEqual(try count("users", on: connection), 0)
        XCTAssertEqual(try DatabaseRoles.check(on: connection), DatabaseRoles.Findings())
    }
}

/// The owner's own tools on a database whose owner is not a superuser (as on managed
/// PostgreSQL): forced row-level security applies to it too, and `migrate` makes it a member
/// of `trunk_sync_admin`, which sees every row; switched to the server's role, it sees none.
final class NonSuperuserOwnerTests: XCTestCase {
    func testTheOwnersToolsSeeEveryRowAndTheServerRoleNone() throws {
        let admin = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        let role = "owner_\(UUID().uuidString.prefix(8).lowercased())"
        let password = TestSecrets.randomHex()
        try admin.execute("create role \(role) login createrole password '\(password)'")
        let database = try TestDatabase.create(prefix: "owned")
        defer {
            try? TestDatabase.drop(database)
            _ = try? admin.execute("drop role if exists \(role)")
        }
        try admin.execute("alter database \(database["dbname"] ?? "") owner to \(role)")
        try PostgresConnection.connect(database).execute("alter schema public owner to \(role)")
        var asOwner = database
        asOwner.setParameter("user", role)
        asOwner.setParameter("password", password)
        let owner = try PostgresConnection.connect(asOwner)
        let migrator = Migrator(
            migrations: try Migration.load(from: repositoryRoot() + "/migrations"), logger: TestDatabase.quietLogger)
        _ = try migrator.migrate(on: owner)
        XCTAssertFalse(
            try owner.query("select rolsuper from pg_roles where rolname = current_user")[0].decode(
                Bool.self, column: 0))
        try owner.query("insert into users (email) values ('a@example.com'), ('b@example.com')")
        XCTAssertEqual(try owner.query("select count(*) from users")[0].decode(Int.self, column: 0), 2)
        XCTAssertNoThrow(try DatabaseRoles.requireOwner(on: owner))
        // It can make the server's login, which then sees nothing without a scope.
        let server = TestDatabase.roleName("owned_server")
        defer { TestDatabase.dropRole(server) }
        let serverPassword = TestSecrets.randomHex()
        let login = try XCTUnwrap(
            try DatabaseRoles.ServerLogin(
                url: try TestDatabase.url(of: database, user: server, password: serverPassword)))
        try DatabaseRoles.checkServerLogin(login, on: owner)
        XCTAssertEqual(try DatabaseRoles.ensureServerLogin(login, on: owner), .created(server))
        let asServer = try PostgresConnection.connect(
            try PostgresConfiguration(try TestDatabase.url(of: database, user: server, password: serverPassword)))
        XCTAssertEqual(try asServer.query("select count(*) from users")[0].decode(Int.self, column: 0), 0)
        XCTAssertThrowsError(try DatabaseRoles.requireOwner(on: asServer))
        // The owner logged in as the server (the old setup) is warned about.
        XCTAssertNotNil(try DatabaseRoles.check(on: owner).warning)
        try owner.query("select set_config('role', 'trunk_sync_app', false)")
        XCTAssertEqual(try owner.query("select count(*) from users")[0].decode(Int.self, column: 0), 0)
    }
}
