import Foundation
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// The pull's statement is planned once per connection (`Plans.generic`), not for each
/// execution's values, and that one plan is the `(user_id, seq)` index: what PostgreSQL did
/// with `limit $3` before was to plan the pull on every execution, at three times the cost
/// of the read itself.
final class GenericPlanTests: XCTestCase {
    var configuration: PostgresConfiguration!
    var owner: PostgresConnection!

    override func setUp() async throws {
        (configuration, owner) = try migratedDatabase(prefix: "plans")
    }

    override func tearDown() async throws {
        owner = nil
        try? TestDatabase.drop(configuration)
    }

    /// A user with `events` events, and 19 others with as many, analysed: statistics like a
    /// deployment's, so the planner has a choice of indexes.
    func usersWithEvents(_ events: Int) throws -> UUID {
        let users = (0..<20).map { _ in UUID() }
        for (index, user) in users.enumerated() {
            try owner.query("insert into users (id, email) values ($1, $2)", user, "plans\(index)@example.com")
            try owner.query(
                """
                insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
                select $1, n, 'note', '{}', gen_random_uuid(), now(), now() + n * interval '1 ms'
                from generate_series(1, $2::int) n
                """, user, events)
            try owner.query("update users set last_seq = $2 where id = $1", user, Int64(events))
        }
        try owner.execute("analyze events")
        return users[0]
    }

    /// A database with one connection, so every statement runs on it, and its event store.
    func oneConnection() throws -> (Database, EventStore) {
        var settings = Database.Settings()
        settings.maxConnections = 1
        let database = try Database(configuration, settings: settings, logger: TestDatabase.quietLogger)
        return (database, EventStore(database: database))
    }

    /// `statement`'s plans so far on the connection the body runs on, as `[generic, custom]`.
    func plans(of statement: String, _ tx: Transaction) async throws -> [Int64] {
        let rows = try await tx.query(
            "select generic_plans, custom_plans from pg_prepared_statements where statement = $1", statement)
        guard rows.count == 1 else { return [] }
        return [try rows[0].decode(Int64.self, column: 0), try rows[0].decode(Int64.self, column: 1)]
    }

    func testThePullIsPlannedOnceAndReadsTheUsersSeqIndex() async throws {
        let user = try usersWithEvents(500)
        let (database, store) = try oneConnection()
        for after in [0, 10, 250, 499, 500, 17, 3, 400] {
            let page = try await store.pull(for: user, after: Int64(after), limit: 100, framing: .jsonArray)
            XCTAssertEqual(page.count, min(100, 500 - after))
            XCTAssertEqual(page.lastSeq, page.count > 0 ? Int64(after + page.count) : nil)
        }
        let (counts, plan) = try await database.read(as: .user(user), plans: .generic) { tx in
            let counts = try await plans(of: EventStore.pullSQL, tx)
            let name = try await tx.query(
                "select name from pg_prepared_statements where statement = $1", EventStore.pullSQL)[0]
                .decode(String.self, column: 0)
            let plan = try await tx.query(
                "explain (costs off) execute \(name)('\(user.uuidString.lowercased())', 0, 101)")
            return (
                counts, try (0..<plan.count).map { try plan[$0].decode(String.self, column: 0) }.joined(separator: "\n")
            )
        }
        XCTAssertEqual(counts, [8, 0], "eight pulls, one generic plan each time, none planned for its values")
        XCTAssertTrue(plan.contains("Index Scan using events_user_id_seq_key"), plan)
        XCTAssertFalse(plan.contains("Sort"), plan)
        await database.close()
    }
}
