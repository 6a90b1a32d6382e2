import CSystem
import Foundation
import Postgres
import TestSupport
import XCTest

final class PoolTests: XCTestCase {
    func makePool(max: Int = 2, timeout: Duration = .seconds(5), maxWaiting: Int = 100) throws -> PostgresPool {
        var settings = PostgresPool.Configuration()
        settings.maxConnections = max
        settings.acquireTimeout = timeout
        settings.maxWaiting = maxWaiting
        return PostgresPool(try TestDatabase.adminConfiguration(), configuration: settings, logger: TestDatabase.quietLogger)
    }

    func testRunsQueriesOffTheCooperativePool() async throws {
        let pool = try makePool()
        let onPoolThread = try await pool.withConnection { connection -> String in
            _ = try connection.query("select 1")
            var name = [CChar](repeating: 0, count: 32)
            _ = csystem_get_thread_name(&name, name.count)
            return String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        XCTAssertTrue(onPoolThread.hasPrefix("pg-pool-"), onPoolThread)
        await pool.close()
    }

    func testManyConcurrentRequestsShareTheFixedNumberOfConnections() async throws {
        let pool = try makePool(max: 3)
        let backends = try await withThrowingTaskGroup(of: Int32.self) { group in
            for _ in 0..<50 {
                group.addTask {
                    try await pool.withConnection { connection in
                        _ = try connection.query("select pg_sleep(0.005)")
                        return connection.backendPID
                    }
                }
            }
            return try await group.reduce(into: Set<Int32>()) { $0.insert($1) }
        }
        XCTAssertLessThanOrEqual(backends.count, 3)
        XCTAssertLessThanOrEqual(pool.statistics.open, 3)
        // Workers release their connection just after handing back the result.
        for _ in 0..<1000 where pool.statistics.inUse > 0 { try await Task.sleep(for: .milliseconds(1)) }
        XCTAssertEqual(pool.statistics.inUse, 0)
        await pool.close()
    }

    func testExhaustionTimesOutWithTheTypedErrorAndRecovers() async throws {
        let pool = try makePool(max: 1, timeout: .milliseconds(200))
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        // Occupy the only connection until told to let go.
        let holder = Task {
            try await pool.withConnection { _ in
                holding.signal()
                release.wait()
            }
        }
        await Task.detached { holding.wait() }.value
        let started = ContinuousClock.now
        do {
            _ = try await pool.withConnection { _ in 1 }
            XCTFail("expected pool exhaustion")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .poolExhausted)
            XCTAssertGreaterThanOrEqual(ContinuousClock.now - started, .milliseconds(190))
        }
        XCTAssertEqual(pool.statistics.waiting, 0)
        release.signal()
        try await holder.value
        let value = try await pool.withConnection { try $0.query("select 7")[0].decode(Int.self, column: 0) }
        XCTAssertEqual(value, 7)
        await pool.close()
    }

    func testTheWaitingQueueIsBounded() async throws {
        let pool = try makePool(max: 1, timeout: .seconds(30), maxWaiting: 2)
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let holder = Task { try await pool.withConnection { _ in holding.signal(); release.wait() } }
        await Task.detached { holding.wait() }.value
        let waiters = (0..<2).map { _ in Task { try await pool.withConnection { _ in true } } }
        while pool.statistics.waiting < 2 { await Task.yield() }
        do {
            _ = try await pool.withConnection { _ in false }
            XCTFail("expected the third waiter to be refused")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .poolExhausted)
        }
        release.signal()
        try await holder.value
        for waiter in waiters { let served = try await waiter.value; XCTAssertTrue(served) }
        await pool.close()
    }

    func testCancelledWaiterLeavesTheQueue() async throws {
        let pool = try makePool(max: 1, timeout: .seconds(30))
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let holder = Task { try await pool.withConnection { _ in holding.signal(); release.wait() } }
        await Task.detached { holding.wait() }.value
        let waiter = Task { try await pool.withConnection { _ in 1 } }
        while pool.statistics.waiting < 1 { await Task.yield() }
        waiter.cancel()
        do {
            _ = try await waiter.value
            XCTFail("expected cancellation")
        } catch {
            XCTAssertTrue(error is CancellationError, "\(error)")
        }
        XCTAssertEqual(pool.statistics.waiting, 0)
        release.signal()
        try await holder.value
        await pool.close()
    }

    func testABrokenConnectionIsReplaced() async throws {
        let pool = try makePool(max: 1)
        let first = try await pool.withConnection { $0.backendPID }
        // Kill the backend from another connection, as a server restart or a DBA would.
        let admin = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try admin.query("select pg_terminate_backend($1)", Int32(first))
        try await waitUntilGone(pid: first, admin: admin)
        let second = try await pool.withConnection { $0.backendPID }
        XCTAssertNotEqual(first, second)
        await pool.close()
    }

    func testServesAgainAfterTheServerRestarts() async throws {
        let pool = try makePool(max: 2)
        let before = try await pool.withConnection { try $0.query("select 1")[0].decode(Int.self, column: 0) }
        XCTAssertEqual(before, 1)
        try TestDatabase.restartServer()
        let after = try await pool.withConnection { try $0.query("select 2")[0].decode(Int.self, column: 0) }
        XCTAssertEqual(after, 2)
        await pool.close()
    }

    func testAJobThatLeavesATransactionOpenDoesNotPoisonTheConnection() async throws {
        let pool = try makePool(max: 1)
        try await pool.withConnection { try $0.execute("begin; create temporary table leak (x int)") }
        let inTransaction = try await pool.withConnection { connection -> Bool in
            let exists = try connection.query("select to_regclass('pg_temp.leak') is not null")[0].decode(Bool.self, column: 0)
            return connection.isInTransaction || exists
        }
        XCTAssertFalse(inTransaction)
        await pool.close()
    }

    func testSessionSettingsApplyToEveryConnection() async throws {
        var settings = PostgresPool.Configuration()
        settings.sessionSettings = [("statement_timeout", "1234ms")]
        let pool = PostgresPool(try TestDatabase.adminConfiguration(), configuration: settings, logger: TestDatabase.quietLogger)
        let value = try await pool.withConnection { try $0.query("show statement_timeout")[0].decode(String.self, column: 0) }
        XCTAssertEqual(value, "1234ms")
        await pool.close()
    }

    func testClosedPoolRefusesWork() async throws {
        let pool = try makePool()
        await pool.close()
        do {
            _ = try await pool.withConnection { _ in 1 }
            XCTFail("expected poolClosed")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .poolClosed)
        }
    }
}

func waitUntilGone(pid: Int32, admin: PostgresConnection) async throws {
    for _ in 0..<500 {
        let alive = try admin.query("select count(*) from pg_stat_activity where pid = $1", Int32(pid))[0]
            .decode(Int.self, column: 0)
        if alive == 0 { return }
        try await Task.sleep(for: .milliseconds(10))
    }
    throw TestEnvironmentError("backend \(pid) did not exit")
}
