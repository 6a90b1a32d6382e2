import Foundation
import HTTPServer
import Logging
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// The loops' shares of the database pool: a task takes its own loop's share (and its
/// queries run on that loop), a task on no loop the first; the pool size is split.
final class PoolSharesTests: XCTestCase {
    func testATaskTakesTheShareOfItsLoopAndQueriesRunThere() async throws {
        let database = try TestDatabase.create(prefix: "poolshares")
        defer { try? TestDatabase.drop(database) }
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        configuration.loops = 3
        let server = HTTPServer(
            configuration: configuration, responder: NothingResponder(), logger: TestDatabase.quietLogger)
        try server.start()
        var settings = PostgresLoopPool.Configuration()
        settings.maxConnections = 1
        let executors = server.executors
        let pools = executors.map {
            PostgresLoopPool(database, configuration: settings, loop: $0, logger: TestDatabase.quietLogger)
        }
        let shares = PoolShares(Array(zip(executors, pools)))
        XCTAssertTrue(shares.current === pools[0], "a task on no loop takes the first share")
        for (index, executor) in executors.enumerated() {
            let (picked, loop) = try await Task(executorPreference: executor) {
                let pool = shares.current
                let loop = try await pool.withConnection { connection in
                    _ = try await connection.pipeline([.prepared("select 1")])
                    return LoopExecutor.current?.index
                }
                return (ObjectIdentifier(pool), loop)
            }.value
            XCTAssertEqual(picked, ObjectIdentifier(pools[index]), "loop \(index)")
            XCTAssertEqual(loop, index, "the query ran on loop \(index)")
        }
        XCTAssertEqual(shares.statistics.open, 3)
        XCTAssertEqual(shares.statistics.maxConnections, 3)
        await shares.close()
        XCTAssertEqual(shares.statistics.open, 0)
        server.shutdown()
        await server.waitUntilStopped()
    }

    func testATaskWhoseLoopsShareIsBusyTakesAnIdleShareOfAnotherLoop() async throws {
        let database = try TestDatabase.create(prefix: "poolshares")
        defer { try? TestDatabase.drop(database) }
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        configuration.loops = 2
        let server = HTTPServer(
            configuration: configuration, responder: NothingResponder(), logger: TestDatabase.quietLogger)
        try server.start()
        var settings = PostgresLoopPool.Configuration()
        settings.maxConnections = 1
        let executors = server.executors
        let pools = executors.map {
            PostgresLoopPool(database, configuration: settings, loop: $0, logger: TestDatabase.quietLogger)
        }
        let shares = PoolShares(Array(zip(executors, pools)))
        // Loop 0's only connection is held until `release`.
        let (held, release) = AsyncStream.makeStream(of: Void.self)
        let (leased, leasedSignal) = AsyncStream.makeStream(of: Void.self)
        let holder = Task(executorPreference: executors[0]) {
            try await pools[0].withConnection { _ in
                leasedSignal.yield()
                for await _ in held { break }
            }
        }
        for await _ in leased { break }
        let (picked, loop) = try await Task(executorPreference: executors[0]) {
            let pool = shares.current
            let loop = try await pool.withConnection { connection in
                _ = try await connection.pipeline([.prepared("select 1")])
                return LoopExecutor.current?.index
            }
            return (ObjectIdentifier(pool), loop)
        }.value
        XCTAssertEqual(picked, ObjectIdentifier(pools[1]), "loop 0's share is busy: loop 1's, which is idle")
        XCTAssertEqual(loop, 1, "its query ran on loop 1")
        release.yield()
        try await holder.value
        let back = await Task(executorPreference: executors[0]) { ObjectIdentifier(shares.current) }.value
        XCTAssertEqual(back, ObjectIdentifier(pools[0]), "idle again: its own loop's share")
        await shares.close()
        server.shutdown()
        await server.waitUntilStopped()
    }

    func testThePoolSizeIsSplitAtLeastOneEach() {
        XCTAssertEqual(PoolShares.split(10, over: 4), [3, 3, 2, 2])
        XCTAssertEqual(PoolShares.split(10, over: 1), [10])
        XCTAssertEqual(PoolShares.split(2, over: 4), [1, 1, 1, 1])
        XCTAssertEqual(PoolShares.split(10, over: 0), [10])
    }
}
