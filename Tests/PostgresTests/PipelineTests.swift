import Foundation
import Postgres
import TestSupport
import XCTest

final class PipelineTests: XCTestCase {
    var connection: PostgresConnection!

    override func setUpWithError() throws {
        connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try connection.execute("create temporary table items (id int primary key, secret text)")
    }

    func count() throws -> Int { try connection.query("select count(*) from items")[0].decode(Int.self, column: 0) }

    func testResultsComeBackInOrderAndLaterStatementsSeeEarlierOnes() throws {
        let results = try connection.pipeline([
            PostgresStatement("insert into items values ($1, $2)", 1, "one"),
            PostgresStatement("select secret from items where id = $1", 1),
            PostgresStatement("select $1::int8 + 1", Int64(41)),
        ])
        XCTAssertEqual(results.count, 3)
        XCTAssertEqual(results[0].affectedRows, 1)
        XCTAssertEqual(try results[1][0].decode(String.self, column: 0), "one")
        XCTAssertEqual(try results[2][0].decode(Int64.self, column: 0), 42)
        XCTAssertFalse(connection.isInTransaction)
        XCTAssertEqual(try count(), 1)
    }

    func testAFailureIsThrownSkipsTheRestAndRollsBackTheImplicitTransaction() throws {
        XCTAssertThrowsError(
            try connection.pipeline([
                PostgresStatement("insert into items values (1, 'one')"),
                PostgresStatement("insert into items values (1, 'again')"),
                PostgresStatement("insert into items values (2, 'two')"),
            ])
        ) { error in
            XCTAssertTrue((error as? PostgresError)?.isUniqueViolation ?? false, "\(error)")
            XCTAssertEqual((error as? PostgresError)?.pipelineIndex, 1, "which statement failed")
        }
        XCTAssertTrue(connection.isOpen)
        XCTAssertFalse(connection.isInTransaction)
        XCTAssertEqual(try count(), 0)
        // Usable afterwards, in and out of pipeline mode.
        try connection.pipeline([PostgresStatement("insert into items values (3, 'three')")])
        XCTAssertEqual(try count(), 1)
    }

    func testLocalSettingsLastForTheExplicitTransaction() throws {
        let results = try connection.pipeline([
            .begin,
            PostgresStatement("select set_config('app.user_id', $1, true)", "someone"),
            PostgresStatement("select current_setting('app.user_id', true)"),
            .commit,
        ])
        XCTAssertEqual(try results[2][0].decode(String.self, column: 0), "someone")
        XCTAssertEqual(
            try connection.query("select current_setting('app.user_id', true)")[0].decode(String?.self, column: 0)
                ?? "", "")
    }

    struct Boom: Error {}

    func testPipelinedTransactionRollsBackWhatItLeavesOpen() throws {
        // A failed statement leaves the explicit transaction failed: rolled back.
        XCTAssertThrowsError(
            try connection.pipelinedTransaction { connection in
                try connection.pipeline([
                    .begin, PostgresStatement("insert into items values (1, 'one')"),
                    PostgresStatement("insert into items values (1, 'again')"), .commit,
                ])
            })
        XCTAssertFalse(connection.isInTransaction)
        // A thrown error between two pipelines.
        XCTAssertThrowsError(
            try connection.pipelinedTransaction { connection in
                try connection.pipeline([.begin, PostgresStatement("insert into items values (2, 'two')")])
                throw Boom()
            }
        ) { XCTAssertTrue($0 is Boom) }
        XCTAssertFalse(connection.isInTransaction)
        // An early return without commit.
        let value = try connection.pipelinedTransaction { connection in
            try connection.pipeline([.begin, PostgresStatement("insert into items values (3, 'three')")])
            return 7
        }
        XCTAssertEqual(value, 7)
        XCTAssertFalse(connection.isInTransaction)
        XCTAssertEqual(try count(), 0)
        // Committed when the body commits.
        try connection.pipelinedTransaction { connection in
            try connection.pipeline([.begin, PostgresStatement("insert into items values (4, 'four')")])
            try connection.pipeline([PostgresStatement("insert into items values (5, 'five')"), .commit])
        }
        XCTAssertEqual(try count(), 2)
    }

    func testALargeStatementAfterALargeResultDoesNotDeadlock() throws {
        // Several MB each way: libpq reads while it writes, so neither side blocks for good.
        let big = String(repeating: "x", count: 4 << 20)
        let results = try connection.pipeline([
            PostgresStatement("select repeat('y', 8 << 20)"),
            PostgresStatement("select length($1::text)", big),
        ])
        XCTAssertEqual(try results[0][0].decode(String.self, column: 0).count, 8 << 20)
        XCTAssertEqual(try results[1][0].decode(Int.self, column: 0), 4 << 20)
    }

    func testATerminatedBackendIsReportedAndTheConnectionCountsAsClosed() throws {
        let pid = connection.backendPID
        let configuration = try TestDatabase.adminConfiguration()
        // Terminated once pg_stat_activity shows it running the sleep (not after a guessed
        // pause, which a loaded machine can outlast).
        let terminator = Thread {
            guard let admin = try? PostgresConnection.connect(configuration) else { return }
            let deadline = Date(timeIntervalSinceNow: 10)
            while Date() < deadline {
                let sleeping = try? admin.query(
                    "select 1 from pg_stat_activity where pid = \(pid) and query like '%pg_sleep(10)%'")
                if sleeping?.isEmpty == false { break }
                Thread.sleep(forTimeInterval: 0.01)
            }
            _ = try? admin.query("select pg_terminate_backend(\(pid))")
        }
        terminator.start()
        XCTAssertThrowsError(
            try connection.pipeline([
                PostgresStatement("select pg_sleep(10)"),
                PostgresStatement("select 1"),
            ])
        ) { error in
            XCTAssertEqual((error as? PostgresError)?.kind, .connectionClosed, "\(error)")
            XCTAssertNil((error as? PostgresError)?.pipelineIndex, "what ran is unknown")
        }
        XCTAssertFalse(connection.isOpen)
    }

    func testPreparedStatementsAreReusedAcrossPipelinesAndRollbacks() throws {
        let insert = "insert into items values ($1, $2)"
        // Twice in the pipeline that prepares it.
        try connection.pipeline([.prepared(insert, 1, "one"), .prepared(insert, 2, "two")])
        // A rolled-back transaction does not undo the preparation.
        XCTAssertThrowsError(
            try connection.pipelinedTransaction { connection in
                try connection.pipeline([.begin, .prepared(insert, 3, "three"), .prepared(insert, 1, "again"), .commit])
            })
        for id in 4...10 {
            try connection.pipeline([.begin, .prepared(insert, id, "n"), .commit])
        }
        XCTAssertEqual(try count(), 9)
        let names = try connection.query("select count(*) from pg_prepared_statements")[0].decode(Int.self, column: 0)
        XCTAssertEqual(names, 3)  // the insert, begin, commit
    }

    func testAStatementThatFailsToPrepareIsThrownAndNotRemembered() throws {
        XCTAssertThrowsError(try connection.pipeline([.prepared("select from no_such_table where x = $1", 1)])) {
            XCTAssertEqual(($0 as? PostgresError)?.sqlState, .undefinedTable)
        }
        try connection.execute("create temporary table no_such_table (x int)")
        let results = try connection.pipeline([.prepared("select from no_such_table where x = $1", 1)])
        XCTAssertEqual(results[0].count, 0)
    }
}
