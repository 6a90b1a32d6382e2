import Foundation
import HTTPServer
import Postgres
import Synchronization
import TestSupport
import TrunkSync
import XCTest

/// Shared reads (`PostgresLoopPool.sharedPipeline`, `Database.readPipeline`): one-pipeline
/// reads sent behind each other on one connection instead of each waiting for its own. Each
/// is its own implicit transaction: its scope, its failure and its results stay its own.
///
/// To hold reads in flight without timing anything, the first read of a test waits for an
/// advisory lock the test holds on another connection; the reads sent behind it wait behind
/// it on the server until the test lets the lock go.
final class SharedReadTests: XCTestCase {
    var database: PostgresConfiguration!
    var server: HTTPServer<NothingResponder>!
    var locker: PostgresConnection!
    let lock = 4242

    override func setUp() async throws {
        database = try TestDatabase.create(prefix: "shared")
        locker = try PostgresConnection.connect(database)
        server = try NothingResponder.lendingServer()
    }

    override func tearDown() async throws {
        server.shutdown()
        await server.waitUntilStopped()
        locker = nil
        try TestDatabase.drop(database)
    }

    /// The statements sent so far (told at sending: before the first read is answered, only
    /// reads sent behind it can have been sent).
    let sent = SentStatements()

    final class SentStatements: Sendable {
        let statements = Mutex<[String]>([])
        func append(_ sql: String) { statements.withLock { $0.append(sql) } }
        func count(containing text: String) -> Int { statements.withLock { $0.filter { $0.contains(text) }.count } }
    }

    func pool(size: Int, depth: Int) -> PostgresLoopPool {
        var settings = PostgresLoopPool.Configuration()
        settings.maxConnections = size
        settings.sharedPipelineDepth = depth
        let sent = self.sent
        settings.statementObserver = { sql in sent.append(sql) }
        return PostgresLoopPool(
            database, configuration: settings, loop: server.executor, logger: TestDatabase.quietLogger)
    }

    /// Waits until `count` statements containing `text` were sent.
    func waitUntilSent(_ count: Int, containing text: String) async {
        let sent = self.sent
        let done = await waitUntil(20) { sent.count(containing: text) >= count }
        XCTAssertTrue(done, "\(count) statements with \(text) were never sent")
    }

    /// The statement of a read that waits for the test's lock, then answers its backend.
    var blocked: PostgresStatement {
        PostgresStatement("select pg_advisory_xact_lock_shared(\(lock)), pg_backend_pid()")
    }

    /// Takes the lock, and returns once a read waits for it on the server.
    func holdLock() throws { try locker.execute("select pg_advisory_lock(\(lock))") }

    func waitForABlockedRead() async throws {
        for _ in 0..<2000 {
            if try locker.query("select 1 from pg_locks where locktype = 'advisory' and not granted").count == 1 {
                return
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        XCTFail("the first read never waited for the lock")
    }

    func releaseLock() throws { try locker.execute("select pg_advisory_unlock(\(lock))") }

    func pid(_ results: [PostgresResult], column: Int = 1) throws -> Int32 {
        try results[0][0].decode(Int32.self, column: column)
    }

    func testReadsGoBehindEachOtherOnOneConnectionUpToTheDepth() async throws {
        let pool = pool(size: 2, depth: 3)
        try holdLock()
        let first = Task { [blocked] in try await pool.sharedPipeline([blocked]) }
        try await waitForABlockedRead()
        let behind = (1...2).map { value in
            Task { try await pool.sharedPipeline([.prepared("select $1::bigint, pg_backend_pid()", Int64(value))]) }
        }
        await waitUntilSent(2, containing: "select $1::bigint")
        XCTAssertEqual(pool.statistics.open, 1, "sent behind the first, not on a connection of their own")
        // The connection is full (3): the next read takes another, and is answered while
        // the three still wait.
        let other = try await pool.sharedPipeline([.prepared("select 9::bigint, pg_backend_pid()")])
        XCTAssertEqual(pool.statistics.open, 2)
        try releaseLock()
        let firstPID = try pid(try await first.value)
        for (index, task) in behind.enumerated() {
            let results = try await task.value
            XCTAssertEqual(try results[0][0].decode(Int64.self, column: 0), Int64(index + 1), "its own results")
            XCTAssertEqual(try pid(results), firstPID, "on the first read's connection")
        }
        XCTAssertNotEqual(try pid(other), firstPID)
        let released = await waitUntil(20) { pool.statistics.inUse == 0 }
        XCTAssertTrue(released, "shared connections go back to the pool once their reads are answered")
        await pool.close()
    }

    func testAFailureEndsOnlyItsOwnPipeline() async throws {
        let pool = pool(size: 1, depth: 4)
        try holdLock()
        let first = Task { [blocked] in try await pool.sharedPipeline([blocked]) }
        try await waitForABlockedRead()
        let failing = Task {
            try await pool.sharedPipeline(
                [PostgresStatement("select 1/0"), PostgresStatement("select 2")],
                prefix: [PostgresStatement("select set_config('app.user_id', 'someone', true)")])
        }
        let failingPrefix = Task {
            try await pool.sharedPipeline(
                [PostgresStatement("select 3")], prefix: [PostgresStatement("select 1/0")])
        }
        let last = Task {
            try await pool.sharedPipeline(
                [PostgresStatement("select coalesce(current_setting('app.user_id', true), '')")])
        }
        // All three sent behind the first on the only connection.
        await waitUntilSent(1, containing: "select 2")
        await waitUntilSent(1, containing: "select 3")
        await waitUntilSent(1, containing: "current_setting")
        try releaseLock()
        _ = try await first.value
        do {
            _ = try await failing.value
            XCTFail("division by zero must throw")
        } catch let error as PostgresError {
            XCTAssertEqual(error.sqlState, SQLState(rawValue: "22012"))
            XCTAssertEqual(error.pipelineIndex, 0, "counted among the statements, after the prefix")
        }
        do {
            _ = try await failingPrefix.value
            XCTFail("division by zero must throw")
        } catch let error as PostgresError {
            XCTAssertEqual(error.sqlState, SQLState(rawValue: "22012"))
            XCTAssertNil(error.pipelineIndex, "the prefix failed: nothing of the statements ran")
        }
        let setting = try await last.value[0][0].decode(String.self, column: 0)
        XCTAssertEqual(setting, "", "a failed pipeline's setting ends with its own implicit transaction")
        // The connection is usable and outside any transaction.
        let answer = try await pool.withConnection { connection in
            (
                try await connection.pipeline([PostgresStatement("select 42")])[0][0].decode(Int.self, column: 0),
                connection.isInTransaction
            )
        }
        XCTAssertEqual(answer.0, 42)
        XCTAssertFalse(answer.1)
        await pool.close()
    }

    func testAStatementFirstSentByReadsInFlightTogetherIsPreparedOnce() async throws {
        let pool = pool(size: 1, depth: 4)
        try holdLock()
        let first = Task { [blocked] in try await pool.sharedPipeline([blocked]) }
        try await waitForABlockedRead()
        // Three reads of one statement never prepared on this connection, all in flight at
        // once: one prepares it, the others run it unprepared (a second `Parse` of the same
        // name would fail their pipelines).
        let doubled = "select $1::bigint * 2"
        let reads = (1...3).map { value in
            Task { try await pool.sharedPipeline([.prepared(doubled, Int64(value))]) }
        }
        await waitUntilSent(3, containing: doubled)
        try releaseLock()
        _ = try await first.value
        for (index, read) in reads.enumerated() {
            let value = try await read.value[0][0].decode(Int64.self, column: 0)
            XCTAssertEqual(value, Int64((index + 1) * 2))
        }
        let again = try await pool.sharedPipeline([.prepared(doubled, Int64(21))])
        XCTAssertEqual(try again[0][0].decode(Int64.self, column: 0), 42)
        let prepared = try await pool.withConnection { connection in
            try await connection.pipeline([
                PostgresStatement("select count(*) from pg_prepared_statements where statement = $1", doubled)
            ])[0][0].decode(Int64.self, column: 0)
        }
        XCTAssertEqual(prepared, 1)
        await pool.close()
    }

    func testALostConnectionFailsEveryReadInFlightOnItAndIsReplaced() async throws {
        let pool = pool(size: 1, depth: 4)
        try holdLock()
        let first = Task { [blocked] in try await pool.sharedPipeline([blocked]) }
        try await waitForABlockedRead()
        let behind = (1...2).map { _ in Task { try await pool.sharedPipeline([PostgresStatement("select 11")]) } }
        let backend = try locker.query("select pid from pg_locks where locktype = 'advisory' and not granted")[0]
            .decode(Int32.self, column: 0)
        await waitUntilSent(2, containing: "select 11")
        try locker.execute("select pg_terminate_backend(\(backend))")
        for task in [first] + behind {
            do {
                _ = try await task.value
                XCTFail("a read in flight on a lost connection must fail")
            } catch let error as PostgresError {
                XCTAssertEqual(error.kind, .connectionClosed, "\(error)")
            }
        }
        try releaseLock()
        let answer = try await pool.sharedPipeline([PostgresStatement("select 42")])
        XCTAssertEqual(try answer[0][0].decode(Int.self, column: 0), 42)
        await pool.close()
    }

    func testEachReadKeepsItsOwnScopeOnASharedConnection() async throws {
        var settings = Database.Settings()
        settings.maxConnections = 1
        settings.sharedPipelineDepth = 8
        let sent = self.sent
        settings.statementObserver = { sql in sent.append(sql) }
        let door = try Database(database, settings: settings, logger: TestDatabase.quietLogger)
        try holdLock()
        let setting = PostgresStatement("select coalesce(current_setting('app.user_id', true), '')")
        let first = Task { [blocked] in try await door.readPipeline(as: .server, [blocked]) }
        try await waitForABlockedRead()
        let users = (0..<5).map { _ in UUID() }
        let reads = users.map { user in Task { try await door.readPipeline(as: .user(user), [setting]) } }
        let unscoped = Task { try await door.readPipeline(as: .server, [setting]) }
        await waitUntilSent(6, containing: "current_setting('app.user_id'")
        try releaseLock()
        _ = try await first.value
        for (user, read) in zip(users, reads) {
            let seen = try await read.value[0][0].decode(String.self, column: 0)
            XCTAssertEqual(seen, user.uuidString.lowercased())
        }
        let none = try await unscoped.value[0][0].decode(String.self, column: 0)
        XCTAssertEqual(none, "")
        await door.close()
    }
}
