import CSystem
import Foundation
import Postgres
import TestSupport
import XCTest

/// The thread-per-connection `PostgresPool`, while callers still use it: what is particular to
/// it (its threads, synchronous closures). The behaviour it shares with the loop-driven pool
/// (FIFO, bounds, replacement, restart, session settings) is tested on that pool
/// (`LoopThreadPoolTests`); these go with the type.
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
