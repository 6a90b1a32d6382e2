import Foundation
import Postgres
import Synchronization
import TestSupport
import XCTest

/// `PostgresLoopPool` on the module's own loop (`PostgresLoopThread`), as the command line,
/// migrations and background jobs use it: connections opened without blocking (what a
/// silent, a refusing or a TLS server does to an attempt), FIFO waiting within bounds,
/// replacement of dead connections, session settings, shutdown with a leased connection.
/// (What an HTTP loop's pool does is in `LoopPoolTests` of the TrunkSync tests.)
final class LoopThreadPoolTests: XCTestCase {
    private var loop: PostgresLoopThread!

    override func setUp() async throws {
        loop = try PostgresLoopThread(name: "pg-loop-test")
    }

    override func tearDown() async throws {
        await loop?.close()
    }

    private func makePool(
        _ connection: PostgresConfiguration? = nil, size: Int = 2, timeout: Duration = .seconds(5),
        maxWaiting: Int = 100,
        sessionSettings: [(name: String, value: String)] = [],
        clock: @escaping @Sendable () -> UInt64 = PostgresLoopPool.monotonicClock
    ) throws -> PostgresLoopPool {
        var settings = PostgresLoopPool.Configuration()
        settings.maxConnections = size
        settings.acquireTimeout = timeout
        settings.maxWaiting = maxWaiting
        settings.sessionSettings = sessionSettings
        return PostgresLoopPool(
            try connection ?? TestDatabase.adminConfiguration(), configuration: settings, loop: loop,
            logger: TestDatabase.quietLogger, clock: clock)
    }

    /// The error of one request to `pool`, which must fail.
    private static func failure(of pool: PostgresLoopPool) async -> PostgresError? {
        do {
            _ = try await pool.withConnection { connection in
                try await connection.pipeline([PostgresStatement("select 1")]).count
            }
            XCTFail("the request must fail")
            return nil
        } catch {
            XCTAssertTrue(error is PostgresError, "\(error)")
            return error as? PostgresError
        }
    }

    private static func backendPID(_ pool: PostgresLoopPool) async throws -> Int32 {
        try await pool.withConnection { connection in
            try await connection.pipeline([PostgresStatement("select pg_backend_pid()")])[0][0].decode(
                Int32.self, column: 0)
        }
    }

    // MARK: - Opening without blocking

    func testQueriesRunOnTheLoopAndConcurrentRequestsShareTheConnections() async throws {
        let pool = try makePool(size: 3)
        let loop = self.loop!
        let backends = try await withThrowingTaskGroup(of: Int32.self) { group in
            for _ in 0..<30 {
                group.addTask {
                    try await pool.withConnection { connection in
                        XCTAssertTrue(loop.isOnLoopThread)
                        return try await connection.pipeline([
                            PostgresStatement("select pg_backend_pid() from pg_sleep(0.005)")
                        ])[0][0]
                        .decode(Int32.self, column: 0)
                    }
                }
            }
            return try await group.reduce(into: Set<Int32>()) { $0.insert($1) }
        }
        XCTAssertLessThanOrEqual(backends.count, 3)
        XCTAssertLessThanOrEqual(pool.statistics.open, 3)
        XCTAssertEqual(pool.statistics.inUse, 0)
        await pool.close()
    }

    func testAnAttemptThatOutlivesConnectTimeoutFailsAsTheBlockingConnectDoes() async throws {
        // A server that accepts TCP (the kernel's backlog) and never answers.
        let silent = try SilentServer()
        var target = try TestDatabase.adminConfiguration()
        target.setParameter("host", "127.0.0.1")
        target.setParameter("port", String(silent.port))
        target.setParameter("connect_timeout", "2")
        // The pool's clock, moved by the test: the attempt fails once it passes 2 s, not after
        // 2 s of real time; the hour of acquire timeout does not run out first.
        let now = Atomic<UInt64>(1_000_000_000)
        let pool = try makePool(target, size: 1, timeout: .seconds(3600), clock: { now.load(ordering: .relaxed) })
        let attempt = Task { await LoopThreadPoolTests.failure(of: pool) }
        let answered = Mutex(false)
        let watcher = Task {
            _ = await attempt.value
            answered.withLock { $0 = true }
        }
        let failed = await waitUntil(30) {
            now.add(500_000_000, ordering: .relaxed)
            return answered.withLock { $0 }
        }
        XCTAssertTrue(failed, "the attempt outlived connect_timeout on the pool's clock")
        if !failed { attempt.cancel() }
        await watcher.value
        let error = await attempt.value
        XCTAssertEqual(error?.kind, .connectionFailed)
        XCTAssertEqual(
            error?.description,
            "could not connect to PostgreSQL at 127.0.0.1:\(silent.port)/\(target["dbname"] ?? ""): timeout expired")
        XCTAssertEqual(pool.statistics.open, 0)
        await pool.close()
    }

    func testCloseAbandonsAnOpeningUnderWay() async throws {
        // A server that accepts TCP and never answers, no connect_timeout and a clock that
        // stands still: only close() can end the attempt (`serve` stopping during its start-up).
        let silent = try SilentServer()
        var target = try TestDatabase.adminConfiguration()
        target.setParameter("port", String(silent.port))
        target.setParameter("connect_timeout", "0")
        let pool = try makePool(target, size: 1, timeout: .seconds(3600), clock: { 1_000_000_000 })
        let attempt = Task { await LoopThreadPoolTests.failure(of: pool) }
        // Waiting means its connection is being opened (the pool has none).
        let waiting = await waitUntil(10) { pool.statistics.waiting == 1 }
        XCTAssertTrue(waiting, "the request never waited")
        let closed = Mutex(false)
        let closing = Task {
            await pool.close()
            closed.withLock { $0 = true }
        }
        let ended = await waitUntil(30) { closed.withLock { $0 } }
        XCTAssertTrue(ended, "close() waited for the opening")
        if !ended { await loop.close() }  // a stopped loop ends the attempt, so the test ends
        let error = await attempt.value
        XCTAssertEqual(error?.kind, .poolClosed)
        await closing.value
    }

    func testARefusedPortAndAWrongPasswordFailWithTheBlockingConnectsMessages() async throws {
        let port = try unusedPort()
        var refused = try TestDatabase.adminConfiguration()
        refused.setParameter("port", String(port))
        let blockingRefusal = try XCTUnwrap(Self.connectError(refused))
        let refusal = await LoopThreadPoolTests.failure(of: try makePool(refused, size: 1))
        XCTAssertEqual(refusal?.kind, .connectionFailed)
        XCTAssertEqual(refusal?.description, blockingRefusal.description)
        XCTAssertTrue(blockingRefusal.description.contains("refused"), blockingRefusal.description)

        var wrong = try TestDatabase.adminConfiguration()
        let password = "wrong-\(UUID().uuidString)"
        wrong.setParameter("password", password)
        let blockingDenial = try XCTUnwrap(Self.connectError(wrong))
        let denial = await LoopThreadPoolTests.failure(of: try makePool(wrong, size: 1))
        XCTAssertEqual(denial?.kind, .connectionFailed)
        XCTAssertEqual(denial?.description, blockingDenial.description)
        XCTAssertTrue(
            denial?.description.contains("password authentication failed") == true, "\(String(describing: denial))")
        XCTAssertFalse(denial.map { "\($0.description) \($0.debugDescription)" }?.contains(password) ?? true)
    }

    func testAnAttemptMovesOnToTheNextHostOnAnotherSocket() async throws {
        // Two hosts, the first refusing: libpq closes that socket and opens another, which
        // the loop must watch instead.
        var target = try TestDatabase.adminConfiguration()
        let port = try XCTUnwrap(target["port"])
        target.setParameter("host", "127.0.0.1,127.0.0.1")
        target.setParameter("port", "\(try unusedPort()),\(port)")
        let pool = try makePool(target, size: 1)
        let pid = try await LoopThreadPoolTests.backendPID(pool)
        XCTAssertNotEqual(pid, 0)
        await pool.close()
    }

    func testSslmodeRequireOpensATLSConnection() async throws {
        let tls = try TestCluster.enableTLS()
        defer { tls.disable() }
        var target = try TestDatabase.adminConfiguration()
        target.setParameter("sslmode", "require")
        let pool = try makePool(target, size: 1)
        let encrypted = try await pool.withConnection { connection in
            try await connection.pipeline([
                PostgresStatement("select ssl from pg_stat_ssl where pid = pg_backend_pid()")
            ])[0][0]
            .decode(Bool.self, column: 0)
        }
        XCTAssertTrue(encrypted)
        await pool.close()
    }

    func testSessionSettingsAreAppliedBeforeTheConnectionIsUsedAndARefusedOneFailsTheRequest() async throws {
        let pool = try makePool(sessionSettings: [("statement_timeout", "1234ms")])
        let value = try await pool.withConnection { connection in
            try await connection.pipeline([PostgresStatement("show statement_timeout")])[0][0].decode(
                String.self, column: 0)
        }
        XCTAssertEqual(value, "1234ms")
        await pool.close()

        let refusing = try makePool(sessionSettings: [("role", "no_such_role_\(UUID().uuidString.prefix(8))")])
        let error = await LoopThreadPoolTests.failure(of: refusing)
        XCTAssertEqual(error?.kind, .server)
        XCTAssertEqual(refusing.statistics.open, 0, "a connection whose settings failed is not kept")
        await refusing.close()
    }

    // MARK: - The pool's behaviour on its own loop

    func testWaitersAreServedInArrivalOrderAndTheQueueIsBounded() async throws {
        let pool = try makePool(size: 1, timeout: .seconds(60), maxWaiting: 3)
        let holder = try await HeldConnection.hold(pool)
        let served = ServedOrder()
        var waiters: [Task<Void, any Error>] = []
        for index in 1...3 {
            let waiter = Task { try await pool.withConnection { _ in served.append(index) } }
            waiters.append(waiter)
            let queued = await waitUntil(10) { pool.statistics.waiting == index }
            XCTAssertTrue(queued, "waiter \(index) never queued")
        }
        // A fourth is refused at once: the queue holds three.
        let refused = await LoopThreadPoolTests.failure(of: pool)
        XCTAssertEqual(refused?.kind, .poolExhausted)
        try await holder.release()
        for waiter in waiters { try await waiter.value }
        XCTAssertEqual(served.order, [1, 2, 3])
        await pool.close()
    }

    func testAConnectionTerminatedWhileIdleIsReplacedWithoutFailingTheNextRequest() async throws {
        let pool = try makePool(size: 1)
        let first = try await LoopThreadPoolTests.backendPID(pool)
        let admin = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try admin.query("select pg_terminate_backend($1)", first)
        try await waitUntilGone(pid: first, admin: admin)
        let second = try await LoopThreadPoolTests.backendPID(pool)
        XCTAssertNotEqual(first, second)
        XCTAssertEqual(pool.statistics.open, 1)
        await pool.close()
    }

    func testServesAgainAfterTheServerRestarts() async throws {
        let pool = try makePool(size: 2)
        let before = try await LoopThreadPoolTests.backendPID(pool)
        try TestDatabase.restartServer()
        // The backends said FATAL before they ended, long before the server is back: the loop
        // read it (it reads sockets before it runs the next job), so no request fails.
        let after = try await LoopThreadPoolTests.backendPID(pool)
        XCTAssertNotEqual(after, before)
        await pool.close()
    }

    func testATransactionLeftOpenIsRolledBackBeforeTheConnectionIsReused() async throws {
        let pool = try makePool(size: 1)
        _ = try await pool.withConnection { connection in
            try await connection.pipeline([.begin, PostgresStatement("create temporary table leak (x int)")]).count
        }
        let (inTransaction, exists) = try await pool.withConnection { connection in
            let exists = try await connection.pipeline([
                PostgresStatement("select to_regclass('pg_temp.leak') is not null")
            ])[0][0]
            .decode(Bool.self, column: 0)
            return (connection.isInTransaction, exists)
        }
        XCTAssertFalse(inTransaction)
        XCTAssertFalse(exists)
        await pool.close()
    }

    func testClosingWhileLeasedLetsTheHolderFinishThenRefusesWork() async throws {
        let pool = try makePool(size: 1)
        let holding = Mutex(false)
        let closing = Mutex(false)
        let holder = Task {
            try await pool.withConnection { connection in
                holding.withLock { $0 = true }
                _ = await waitUntil(60) { closing.withLock { $0 } }
                return try await connection.pipeline([PostgresStatement("select 5")])[0][0].decode(Int.self, column: 0)
            }
        }
        let held = await waitUntil(10) { holding.withLock { $0 } }
        XCTAssertTrue(held, "the holder never got the connection")
        let closed = Task {
            await pool.close()
        }
        closing.withLock { $0 = true }
        let answer = try await holder.value
        XCTAssertEqual(answer, 5, "a leased connection works until it is given back")
        await closed.value
        XCTAssertEqual(pool.statistics.open, 0)
        let refused = await LoopThreadPoolTests.failure(of: pool)
        XCTAssertEqual(refused?.kind, .poolClosed)
    }

    /// Closing while a connection is still being opened: its `onOpen` may wait for as long as
    /// a lock is held elsewhere (the server's WAL timeline check waits for users' rows), and
    /// the pool's close ends it instead of waiting with it; the request fails.
    func testClosingEndsAnOnOpenThatWaits() async throws {
        let key = Int64.random(in: 1...Int64.max)
        let holder = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try holder.query("select pg_advisory_lock($1)", key)
        var settings = PostgresLoopPool.Configuration()
        settings.maxConnections = 1
        settings.onOpen = { connection in
            try await connection.pipeline([PostgresStatement("select pg_advisory_xact_lock($1)", key)])
        }
        let pool = PostgresLoopPool(
            try TestDatabase.adminConfiguration(), configuration: settings, loop: loop,
            logger: TestDatabase.quietLogger)
        let request = Task { try await pool.withConnection { _ in } }
        nonisolated(unsafe) let watcher = holder
        let waiting = await waitUntil(20) {
            let waiters = try? watcher.query(
                """
                select count(*) from pg_stat_activity
                where wait_event = 'advisory' and query like 'select pg_advisory_xact_lock%'
                """)[0].decode(Int64.self, column: 0)
            return waiters == 1
        }
        XCTAssertTrue(waiting, "the opening never waited for the lock")
        let closed = Mutex(false)
        let closing = Task {
            await pool.close()
            closed.withLock { $0 = true }
        }
        let ended = await waitUntil(20) { closed.withLock { $0 } }
        XCTAssertTrue(ended, "close() waited for the opening's onOpen")
        try holder.query("select pg_advisory_unlock($1)", key)
        await closing.value
        do {
            try await request.value
            XCTFail("the request must fail")
        } catch {
            XCTAssertTrue(error is PostgresError, "\(error)")
        }
    }

    // MARK: - Threads

    func testThePoolAndTheListenerStartNoThreadButTheLoop() async throws {
        // The previous test's loop ends its thread right after its close() returned: wait
        // until only this test's loop is left (a readiness check, not a sleep).
        let alone = await waitUntil(10) { PostgresThreads.current().filter { $0.name == "pg-loop-test" }.count == 1 }
        let before = PostgresThreads.current()
        XCTAssertTrue(alone, "the loop's thread: \(before)")
        let pool = try makePool(size: 2)
        let listener = PostgresListener(
            try TestDatabase.adminConfiguration(), channels: ["threads"], logger: TestDatabase.quietLogger, loop: loop)
        var events = listener.events().makeAsyncIterator()
        listener.start()
        let listening = await events.next()
        XCTAssertEqual(listening, .listening)
        async let one = LoopThreadPoolTests.backendPID(pool)
        async let two = LoopThreadPoolTests.backendPID(pool)
        _ = try await (one, two)
        _ = try await pool.withConnection { connection in
            try await connection.pipeline([PostgresStatement("select pg_notify('threads', 'x')")]).count
        }
        let notified = await events.next()
        XCTAssertEqual(notified, .notification(PostgresNotification(channel: "threads", payload: "x")))
        XCTAssertEqual(PostgresThreads.current().subtracting(before), [], "no thread but the loop's")
        await listener.close()
        await pool.close()
        await loop.close()
        let gone = await waitUntil(10) { !PostgresThreads.current().contains { $0.name == "pg-loop-test" } }
        XCTAssertTrue(gone, "the loop's thread ended: \(PostgresThreads.current())")

        // A listener made without a loop runs on one of its own, and ends it when closed.
        let own = PostgresListener(
            try TestDatabase.adminConfiguration(), channels: ["threads"], logger: TestDatabase.quietLogger)
        var ownEvents = own.events().makeAsyncIterator()
        own.start()
        let ownListening = await ownEvents.next()
        XCTAssertEqual(ownListening, .listening)
        XCTAssertEqual(PostgresThreads.current().subtracting(before).map(\.name), ["pg-listener"])
        await own.close()
        let ownGone = await waitUntil(10) { PostgresThreads.current().subtracting(before).isEmpty }
        XCTAssertTrue(ownGone, "the listener's own loop ended: \(PostgresThreads.current().subtracting(before))")
    }

    static func connectError(_ configuration: PostgresConfiguration) -> PostgresError? {
        do {
            _ = try PostgresConnection.connect(configuration)
            return nil
        } catch {
            return error as? PostgresError
        }
    }
}

/// The order in which waiters were served.
private final class ServedOrder: Sendable {
    private let served = Mutex<[Int]>([])
    func append(_ index: Int) { served.withLock { $0.append(index) } }
    var order: [Int] { served.withLock { $0 } }
}

/// The threads of this process whose name starts with `pg-` (the `Postgres` module's).
struct PostgresThreads: Hashable, CustomStringConvertible {
    var id: String
    var name: String

    var description: String { "\(name) (\(id))" }

    static func current() -> Set<PostgresThreads> {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return Set(
            tasks.compactMap { id in
                guard let comm = try? String(contentsOfFile: "/proc/self/task/\(id)/comm", encoding: .utf8) else {
                    return nil
                }
                let name = comm.trimmingCharacters(in: .whitespacesAndNewlines)
                return name.hasPrefix("pg-") ? PostgresThreads(id: id, name: name) : nil
            })
    }
}
