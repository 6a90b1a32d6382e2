import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

/// `events.user_id` names an existing user, checked once per statement (migration 0011)
/// with the foreign key's rules: unknown users refused, the user locked against deletion
/// until the insert's transaction ends, a user's events deleted with the user.
final class EventsUserCheckTests: XCTestCase {
    var database: PostgresConfiguration!
    var owner: PostgresConnection!
    let alice = UUID()
    let bob = UUID()

    override func setUp() async throws {
        (database, owner) = try migratedDatabase(prefix: "fk")
        for (id, name) in [(alice, "alice"), (bob, "bob")] {
            try owner.query("insert into users (id, email) values ($1, $2)", id, "\(name)@example.com")
        }
    }

    override func tearDown() async throws {
        owner = nil
        try? TestDatabase.drop(database)
    }

    func insertEvents(_ users: [UUID], on connection: PostgresConnection) throws {
        try connection.query(
            """
            insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
            select u, n, 'note', '{}', gen_random_uuid(), now(), now()
            from unnest($1::uuid[]) with ordinality as x(u, n)
            """, users)
    }

    func count(_ user: UUID) throws -> Int {
        try owner.query("select count(*) from events where user_id = $1", user)[0].decode(Int.self, column: 0)
    }

    func assertForeignKeyViolation(_ body: () throws -> Void, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertThrowsError(try body(), file: file, line: line) { error in
            XCTAssertEqual(
                (error as? PostgresError)?.sqlState, .foreignKeyViolation, "\(error)", file: file, line: line)
            XCTAssertEqual((error as? PostgresError)?.constraint, "events_user_id_fkey", file: file, line: line)
        }
    }

    func testEventsOfAnUnknownUserAreRefusedAndNothingOfTheStatementIsStored() throws {
        assertForeignKeyViolation { try insertEvents([UUID()], on: owner) }
        // One unknown user among known ones: the whole statement fails.
        assertForeignKeyViolation { try insertEvents([alice, UUID(), bob], on: owner) }
        XCTAssertEqual(try count(alice), 0)
        XCTAssertEqual(try count(bob), 0)
        try insertEvents([alice, alice, bob], on: owner)
        XCTAssertEqual(try count(alice), 2)
        // Moving events to an unknown user is refused as well.
        assertForeignKeyViolation { try owner.query("update events set user_id = $1 where user_id = $2", UUID(), bob) }
    }

    func testDeletingAUserDeletesTheirEventsOnly() throws {
        try insertEvents([alice, alice, bob], on: owner)
        try owner.query("delete from users where id = $1", alice)
        XCTAssertEqual(try count(alice), 0)
        XCTAssertEqual(try count(bob), 1)
    }

    func testAUserWithEventsKeepsTheirID() throws {
        try insertEvents([alice], on: owner)
        assertForeignKeyViolation { try owner.query("update users set id = $1 where id = $2", UUID(), alice) }
        try owner.query("update users set id = $1 where id = $2", UUID(), bob)  // no events: allowed
    }

    func testAnInsertInFlightHoldsItsUserAgainstDeletion() throws {
        let writer = try PostgresConnection.connect(database)
        try writer.execute("begin")
        try insertEvents([alice], on: writer)
        // The deletion waits for the insert's transaction (as with the foreign key's lock).
        try owner.execute("set lock_timeout = '200ms'")
        XCTAssertThrowsError(try owner.query("delete from users where id = $1", alice)) { error in
            XCTAssertEqual((error as? PostgresError)?.sqlState?.rawValue, "55P03", "\(error)")
        }
        try writer.execute("commit")
        try owner.query("delete from users where id = $1", alice)
        XCTAssertEqual(try count(alice), 0, "the committed events went with the user")
    }
}
