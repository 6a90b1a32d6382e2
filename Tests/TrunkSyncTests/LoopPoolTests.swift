import Foundation
import HTTPServer
import Logging
import Postgres
import Synchronization
import TestSupport
import XCTest

@testable import TrunkSync

/// Database connections driven by an HTTP server's event loop (`PostgresLoopPool`): queries
/// run on the loop's thread without blocking it; failures, cancellation, exhaustion and
/// shutdown behave as with the blocking pool.
final class LoopPoolTests: XCTestCase {
    var database: PostgresConfiguration!
    var server: HTTPServer<NothingResponder>!

    override func setUp() async throws {
        database = try TestDatabase.create(prefix: "looppool")
        server = try NothingResponder.lendingServer()
    }

    override func tearDown() async throws {
        server.shutdown()
        await server.waitUntilStopped()
        try TestDatabase.drop(database)
    }

    func pool(
        size: Int = 4, timeout: Duration = .seconds(5),
        clock: @escaping @Sendable () -> UInt64 = PostgresLoopPool.monotonicClock
    ) -> PostgresLoopPool {
        var settings = PostgresLoopPool.Configuration()
        settings.maxConnections = size
        settings.acquireTimeout = timeout
        return PostgresLoopPool(
            database, configuration: settings, loop: server.executor, logger: TestDatabase.quietLogger, clock: clock)
    }

    func testQueriesRunOnTheLoopsThreadAndConnectionsAreReused() async throws {
        let pool = pool(size: 2)
        let executor = server.executor
        for round in 0..<20 {
            let (value, onLoop, pid) = try await pool.withConnection { connection in
                let rows = try await connection.pipeline([
                    .prepared("select $1::bigint + 1, pg_backend_pid()", Int64(round))
                ])[0]
                return (
                    try rows[0].decode(Int64.self, column: 0), executor.isOnLoopThread,
                    try rows[0].decode(Int32.self, column: 1)
                )
            }
            XCTAssertEqual(value, Int64(round) + 1)
            XCTAssertTrue(onLoop)
            XCTAssertNotEqual(pid, 0)
        }
        XCTAssertEqual(pool.statistics.open, 1, "one request at a time needs one connection")
        await pool.close()
    }

    func testAFailedStatementIsThrownAndTheTransactionRolledBack() async throws {
        let pool = pool(size: 1)
        do {
            _ = try await pool.withConnection { connection in
                try await connection.pipelinedTransaction { connection in
                    try await connection.pipeline([.begin, PostgresStatement("select 1/0")])
                }
            }
            XCTFail("division by zero must throw")
        } catch let error as PostgresError {
            XCTAssertEqual(error.sqlState, SQLState(rawValue: "22012"))  // division_by_zero
        }
        // The same (only) connection, usable and outside any transaction.
        let status = try await pool.withConnection { connection in
            try await connection.pipeline([PostgresStatement("select 1")])[0].count
        }
        XCTAssertEqual(status, 1)
        await pool.close()
    }

    func testAConnectionLostMidQueryFailsThatQueryAndIsReplaced() async throws {
        let pool = pool(size: 1)
        let database = self.database!
        do {
            _ = try await pool.withConnection { connection in
                let pid = try await connection.pipeline([PostgresStatement("select pg_backend_pid()")])[0][0]
                    .decode(Int32.self, column: 0)
                // Terminated while it sleeps (seen running in pg_stat_activity, not guessed by
                // a pause): the server restarting under a running pipeline.
                Thread.detachNewThread {
                    guard let admin = try? PostgresConnection.connect(database) else { return }
                    let deadline = Date(timeIntervalSinceNow: 10)
                    while Date() < deadline {
                        let sleeping = try? admin.query(
                            "select 1 from pg_stat_activity where pid = $1 and query like '%pg_sleep(10)%'", pid)
                        if sleeping?.isEmpty == false { break }
                        Thread.sleep(forTimeInterval: 0.01)
                    }
                    _ = try? admin.query("select pg_terminate_backend($1)", pid)
                }
                return try await connection.pipeline([PostgresStatement("select pg_sleep(10)")]).count
            }
            XCTFail("the query must fail")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .connectionClosed, "\(error)")
        }
        let answer = try await pool.withConnection { connection in
            try await connection.pipeline([PostgresStatement("select 42")])[0][0].decode(Int.self, column: 0)
        }
        XCTAssertEqual(answer, 42)
        await pool.close()
    }

    func testALargeResultDoesNotHoldUpOtherQueriesOnTheLoop() async throws {
        let pool = pool(size: 2)
        let order = Mutex<[String]>([])
        let sent = Mutex(false)
        async let large: Int = pool.withConnection { connection in
            async let rows = connection.pipeline([
                PostgresStatement("select repeat('x', 200) from pg_sleep(0.3), generate_series(1, 100000)")
            ])
            sent.withLock { $0 = true }
            let count = try await rows[0].count
            order.withLock { $0.append("large") }
            return count
        }
        // The small query starts once the large one is under way (a readiness check, not a pause).
        let started = await waitUntil(10) { sent.withLock { $0 } }
        XCTAssertTrue(started, "the large query never started")
        let small = try await pool.withConnection { connection in
            try await connection.pipeline([PostgresStatement("select 1")])[0].count
        }
        order.withLock { $0.append("small") }
        let count = try await large
        XCTAssertEqual(count, 100_000)
        XCTAssertEqual(small, 1)
        XCTAssertEqual(order.withLock { $0 }, ["small", "large"])
        await pool.close()
    }

    func testWaitingIsBoundedInTimeAndACancelledWaiterLeavesTheQueue() async throws {
        let pool = pool(size: 1, timeout: .milliseconds(300))
        let holding = Mutex(false)
        async let holder: Void = pool.withConnection { connection in
            holding.withLock { $0 = true }
            try await connection.pipeline([PostgresStatement("select pg_sleep(3)")])
            holding.withLock { $0 = false }
        }
        while !holding.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
        // Exhausted: the waiter fails at the acquire timeout with poolExhausted, while the
        // holder still holds the connection (an ordering, which a loaded machine cannot upset
        // as it could a figure in milliseconds: 0.3 s timeout against a 3 s hold).
        do {
            _ = try await pool.withConnection { _ in 1 }
            XCTFail("must time out")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .poolExhausted)
            XCTAssertTrue(holding.withLock { $0 }, "failed only after the holder let go, not at the timeout")
        }
        // Cancelled while waiting: CancellationError, and the queue is empty again.
        let waiter = Task { try await pool.withConnection { _ in 1 } }
        let queued = await waitUntil(10) { pool.statistics.waiting == 1 }
        XCTAssertTrue(queued, "the waiter never queued")
        waiter.cancel()
        do {
            _ = try await waiter.value
            XCTFail("a cancelled waiter must not get a connection")
        } catch {
            XCTAssertTrue(error is CancellationError, "\(error)")
        }
        XCTAssertEqual(pool.statistics.waiting, 0)
        try await holder
        await pool.close()
    }

    func testTheAcquireDeadlineFollowsTheInjectedClock() async throws {
        // An hour's acquire timeout on a clock the test moves: the waiter fails as soon as
        // the clock passes its deadline, not when an hour of real time has gone by.
        let now = Atomic<UInt64>(1_000_000_000)
        let pool = pool(size: 1, timeout: .seconds(3600), clock: { now.load(ordering: .relaxed) })
        let holder = try await HeldConnection.hold(pool)
        let waiter = Task { try await pool.withConnection { _ in 1 } }
        let queued = await waitUntil(10) { pool.statistics.waiting == 1 }
        XCTAssertTrue(queued, "the waiter never queued")

        now.add(3600 * 1_000_000_000 + 1, ordering: .relaxed)
        let gone = await waitUntil(10) { pool.statistics.waiting == 0 }
        XCTAssertTrue(gone, "the waiter outlived its deadline on the pool's clock")
        if !gone { waiter.cancel() }
        do {
            _ = try await waiter.value
            XCTFail("must time out")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .poolExhausted)
        }
        try await holder.release()
        let answer = try await pool.withConnection { connection in
            try await connection.pipeline([PostgresStatement("select 42")])[0][0].decode(Int.self, column: 0)
        }
        XCTAssertEqual(answer, 42)
        await pool.close()
    }

    func testShutdownFailsWaitersAndLetsTheRunningQueryFinish() async throws {
        let pool = pool(size: 1)
        let holding = Mutex(false)
        async let holder: Int = pool.withConnection { connection in
            holding.withLock { $0 = true }
            return try await connection.pipeline([PostgresStatement("select 7 from pg_sleep(0.5)")])[0][0]
                .decode(Int.self, column: 0)
        }
        while !holding.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
        let waiter = Task { try await pool.withConnection { _ in 1 } }
        let queued = await waitUntil(10) { pool.statistics.waiting == 1 }
        XCTAssertTrue(queued, "the waiter never queued")
        await pool.close()
        do {
            _ = try await waiter.value
            XCTFail("a waiter must fail at shutdown")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .poolClosed)
        }
        let finished = try await holder
        XCTAssertEqual(finished, 7)
    }

    func testClosingAfterTheLoopStoppedEndsAQueryStillWaiting() async throws {
        let pool = pool(size: 1)
        let sent = Mutex(false)
        let query = Task {
            try await pool.withConnection { connection in
                async let result = connection.pipeline([PostgresStatement("select pg_sleep(10)")])
                sent.withLock { $0 = true }
                return try await result.count
            }
        }
        while !sent.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
        // The loop stops with the pipeline in flight: nobody reads its socket any more.
        server.shutdown()
        await server.waitUntilStopped()
        let began = ContinuousClock.now
        await pool.close()
        // Half the 10 s query: a bound a loaded machine keeps, which waiting for the query breaks.
        XCTAssertLessThan(ContinuousClock.now - began, .seconds(5), "close must not wait for the orphaned query")
        do {
            _ = try await query.value
            XCTFail("the orphaned query must fail")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .poolClosed)
        }
    }
}

/// A responder for a server that only lends its loop.
struct NothingResponder: HTTPResponder {
    func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> { .answer(.json(.ok, "{}"), 0) }
    func respond(to request: HTTPRequest, context: Int) -> Reply<Int> { .now(.json(.ok, "{}"), 0) }
    func complete(_ response: inout HTTPResponse, context: Int) {}
    func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse { .json(400, "{}") }
    func refuseConnection() -> HTTPResponse { .json(503, "{}") }

    /// A started server on a free port whose one loop drives the tests' pools.
    static func lendingServer() throws -> HTTPServer<NothingResponder> {
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        let server = HTTPServer(
            configuration: configuration, responder: NothingResponder(), logger: TestDatabase.quietLogger)
        try server.start()
        return server
    }
}
