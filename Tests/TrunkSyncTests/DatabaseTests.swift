import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

/// The one door (`Database`): the scope travels with a transaction's first statements, only
/// there, and is gone after it; commit, rollback and a body that commits itself; the own
/// loop's thread ends with `close()`.
final class DatabaseTests: XCTestCase {
    private var configuration: PostgresConfiguration!

    override func setUp() async throws {
        configuration = try TestDatabase.create(prefix: "door")
        let owner = try PostgresConnection.connect(configuration)
        try owner.execute("create table door_rows (value text)")
    }

    override func tearDown() async throws {
        if let configuration { try? TestDatabase.drop(configuration) }
    }

    private func open(observer: (@Sendable (String) -> Void)? = nil) throws -> Database {
        var settings = Database.Settings()
        settings.maxConnections = 2
        settings.statementObserver = observer
        return try Database(configuration, settings: settings, logger: TestDatabase.quietLogger)
    }

    func testTheScopeIsSetWithTheFirstStatementsOnlyAndEndsWithTheTransaction() async throws {
        let statements = StatementLog()
        let database = try open(observer: { statements.append($0) })
        let user = UUID()
        let seen = try await database.transaction(as: .user(user)) { transaction in
            let first = try await transaction.query("select current_setting('app.user_id', true)")
            let second = try await transaction.query("select current_setting('app.user_id', true)")
            return [try first[0].decode(String.self, column: 0), try second[0].decode(String.self, column: 0)]
        }
        XCTAssertEqual(seen, [user.uuidString.lowercased(), user.uuidString.lowercased()])
        XCTAssertEqual(
            statements.count { $0.contains("set_config('app.user_id'") }, 1, "set once, with the first statement")
        XCTAssertEqual(statements.count { $0 == "begin" }, 1)
        XCTAssertEqual(statements.count { $0 == "commit" }, 1)
        // The next transaction on the (same, pooled) connection starts without it.
        let after = try await database.transaction(as: .server) { transaction in
            try await transaction.query("select coalesce(current_setting('app.user_id', true), '')")[0].decode(
                String.self, column: 0)
        }
        XCTAssertEqual(after, "")
        await database.close()
    }

    func testGenericPlansAreAskedForOnlyWhereTheCallerSaysSoAndOnlyForThatTransaction() async throws {
        let statements = StatementLog()
        let database = try open(observer: { statements.append($0) })
        let mode = "select current_setting('plan_cache_mode'), coalesce(current_setting('app.user_id', true), '')"
        func read(_ tx: Transaction) async throws -> [String] {
            let row = try await tx.query(mode)[0]
            return [try row.decode(String.self, column: 0), try row.decode(String.self, column: 1)]
        }
        let user = UUID()
        let id = user.uuidString.lowercased()
        let generic = try await database.read(as: .user(user), plans: .generic) { try await read($0) }
        XCTAssertEqual(generic, ["force_generic_plan", id])
        XCTAssertEqual(
            statements.count { $0.contains("set_config(") }, 1, "the user's scope and the mode in one statement")
        let chosen = try await database.read(as: .user(user)) { try await read($0) }
        XCTAssertEqual(chosen, ["auto", id])
        let inTransaction = try await database.transaction(as: .server, plans: .generic) { tx in
            [try await read(tx), try await read(tx)]
        }
        XCTAssertEqual(inTransaction, [["force_generic_plan", ""], ["force_generic_plan", ""]])
        // Gone with the transaction, on every connection of the pool.
        for _ in 0..<3 {
            let after = try await database.transaction(as: .server) { try await read($0) }
            XCTAssertEqual(after, ["auto", ""])
        }
        await database.close()
    }

    func testAThrowRollsBackAndABodyMayCommitWithItsLastStatements() async throws {
        let database = try open()
        struct Refused: Error {}
        do {
            try await database.transaction(as: .server) { transaction in
                try await transaction.query("insert into door_rows values ('rolled back')")
                throw Refused()
            }
            XCTFail("the body's error is rethrown")
        } catch is Refused {}
        try await database.transaction(as: .server) { transaction in
            try await transaction.pipeline([PostgresStatement("insert into door_rows values ('kept')"), .commit])
            XCTAssertFalse(transaction.isInTransaction)
        }
        try await database.transaction(as: .server) { transaction in
            try await transaction.query("insert into door_rows values ('undone')")
            try await transaction.rollback()
        }
        let rows = try await database.read(as: .server) { transaction in
            let result = try await transaction.query("select value from door_rows order by value")
            return try result.map { try $0.decode(String.self, column: 0) }
        }
        XCTAssertEqual(rows, ["kept"])
        await database.close()
    }

    func testAFailedScopeStatementIsNotCountedAmongTheBodysStatements() async throws {
        let database = try open()
        // A read's scope travels with every pipeline; a failure in the body's second
        // statement is reported at index 1 among the body's statements.
        do {
            _ = try await database.read(as: .user(UUID())) { transaction in
                try await transaction.pipeline([PostgresStatement("select 1"), PostgresStatement("select 1/0")])
            }
            XCTFail("division by zero")
        } catch let error as PostgresError {
            XCTAssertEqual(error.pipelineIndex, 1)
        }
        await database.close()
    }

    func testCloseEndsTheOwnLoopsThread() async throws {
        // By thread id: a loop of an earlier test may still be ending while this one runs.
        let before = Self.loopThreads()
        let database = try open()
        let one = try await database.read(as: .server) { try await $0.query("select 1").count }
        XCTAssertEqual(one, 1)
        let mine = Self.loopThreads().subtracting(before)
        XCTAssertEqual(mine.count, 1, "\(mine)")
        await database.close()
        let ended = await waitUntil(10) { Self.loopThreads().isDisjoint(with: mine) }
        XCTAssertTrue(ended, "the own loop's thread is gone after close()")
    }

    /// Ids of this process's threads named `pg-loop`.
    private static func loopThreads() -> Set<String> {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return Set(
            tasks.filter {
                (try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8))?.hasPrefix("pg-loop")
                    == true
            })
    }
}

/// Statements seen by a pool's observer, from its loop's thread.
private final class StatementLog: @unchecked Sendable {
    private let lock = NSLock()
    private var statements: [String] = []
    func append(_ sql: String) { lock.withLock { statements.append(sql) } }
    func count(where predicate: (String) -> Bool) -> Int { lock.withLock { statements.filter(predicate).count } }
}
