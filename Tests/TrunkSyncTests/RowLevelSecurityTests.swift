import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

/// The second wall: with no `user_id` filter in the query at all, the server's role sees and
/// writes only the rows of the user named by `app.user_id`.
final class RowLevelSecurityTests: XCTestCase {
    var database: PostgresConfiguration!
    var pool: PostgresPool!
    let alice = UUID()
    let bob = UUID()

    override func setUp() async throws {
        database = try TestDatabase.create(prefix: "rls")
        let owner = try PostgresConnection.connect(database)
        let migrator = Migrator(
            migrations: try Migration.load(from: repositoryRoot() + "/migrations"), logger: TestDatabase.quietLogger)
        _ = try migrator.migrate(on: owner)
        // Seed as the owner (a superuser here, which bypasses RLS).
        for (id, email, count) in [(alice, "alice@example.com", 3), (bob, "bob@example.com", 2)] {
            try owner.query("insert into users (id, email, last_seq) values ($1, $2, $3)", id, email, Int64(count))
            try owner.query(
                """
                insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
                select $1, n, 'note', '{}', gen_random_uuid(), now(), now() from generate_series(1, $2::int) as n
                """, id, Int64(count))
        }
        var settings = PostgresPool.Configuration()
        settings.sessionSettings = [("role", "trunk_sync_app")]
        pool = PostgresPool(database, configuration: settings, logger: TestDatabase.quietLogger)
    }

    override func tearDown() async throws {
        await pool.close()
        try TestDatabase.drop(database)
    }

    func countEvents(as user: UUID?) async throws -> Int {
        try await pool.transaction { connection in
            if let user { try connection.query("select set_config('app.user_id', $1, true)", user.uuidString) }
            return try connection.query("select count(*) from events")[0].decode(Int.self, column: 0)
        }
    }

    func testTheServerRoleIsNeitherSuperuserNorOwner() async throws {
        let (isSuperuser, owner) = try await pool.withConnection { connection in
            let row = try connection.query(
                "select rolsuper, (select tableowner from pg_tables where tablename = 'events') from pg_roles where rolname = current_user"
            )[0]
            return (try row.decode(Bool.self, column: 0), try row.decode(String.self, column: 1))
        }
        XCTAssertFalse(isSuperuser)
        XCTAssertNotEqual(owner, "trunk_sync_app")
    }

    func testWithoutAUserNoRowIsVisible() async throws {
        let visible = try await countEvents(as: nil)
        XCTAssertEqual(visible, 0)
    }

    func testWithAUserExactlyTheirRowsAreVisible() async throws {
        let forAlice = try await countEvents(as: alice)
        let forBob = try await countEvents(as: bob)
        let forStranger = try await countEvents(as: UUID())
        XCTAssertEqual(forAlice, 3)
        XCTAssertEqual(forBob, 2)
        XCTAssertEqual(forStranger, 0)
        let owners = try await pool.transaction { [alice] connection in
            try connection.query("select set_config('app.user_id', $1, true)", alice.uuidString)
            return try connection.query("select distinct user_id from events").map { try $0.decode(UUID.self, column: 0) }
        }
        XCTAssertEqual(owners, [alice])
    }

    func testTheSettingDoesNotOutliveItsTransaction() async throws {
        _ = try await countEvents(as: alice)
        let afterwards = try await countEvents(as: nil)
        XCTAssertEqual(afterwards, 0)
    }

    func testWritingAnotherUsersRowIsRejected() async throws {
        do {
            try await pool.transaction { [alice, bob] connection in
                try connection.query("select set_config('app.user_id', $1, true)", alice.uuidString)
                try connection.query(
                    "insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at) values ($1, 99, 'x', '{}', gen_random_uuid(), now(), now())",
                    bob)
            }
            XCTFail("expected a row-level security violation")
        } catch let error as PostgresError {
            XCTAssertEqual(error.sqlState, .insufficientPrivilege)
        }
    }

    func testTheLogIsAppendOnlyForTheServer() async throws {
        for statement in ["update events set type = 'changed'", "delete from events"] {
            do {
                try await pool.transaction { [alice] connection in
                    try connection.query("select set_config('app.user_id', $1, true)", alice.uuidString)
                    try connection.query(statement)
                }
                XCTFail("expected \(statement) to be refused")
            } catch let error as PostgresError {
                XCTAssertEqual(error.sqlState, .insufficientPrivilege, statement)
            }
        }
    }
}
