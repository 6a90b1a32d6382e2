import Foundation
import Logging

/// A fixed-size pool of PostgreSQL connections, each owned by one thread of its own.
///
/// Callers `await`; the blocking libpq calls run on the pool's threads, never on Swift's
/// cooperative pool. A request that finds every connection busy waits in a bounded FIFO
/// queue for at most `acquireTimeout`, then fails with `.poolExhausted`. Connections are
/// opened on first need; a connection found broken (server restart) is replaced before
/// the next job runs on it, so the process never needs a restart.
public final class PostgresPool: Sendable {
    /// Pool settings.
    public struct Configuration: Sendable {
        /// Most connections (and threads) the pool opens. Default 10.
        public var maxConnections: Int = 10
        /// How long a request may wait for a free connection. Default 5 s.
        public var acquireTimeout: Duration = .seconds(5)
        /// Most requests waiting at once; more fail at once with `.poolExhausted`. Default 1000.
        public var maxWaiting: Int = 1000
        /// Settings applied to each new connection with `set_config` (e.g. `role`,
        /// `statement_timeout`). Default none.
        public var sessionSettings: [(name: String, value: String)] = []
        /// Told the SQL text of every statement a pooled connection runs, on the pool's
        /// thread: lets tests see what work a request does (e.g. that two answers that must
        /// not be told apart ran the same statements). Default nil, which costs nothing.
        public var statementObserver: (@Sendable (String) -> Void)? = nil

        /// The defaults.
        public init() {}
    }

    /// A snapshot of the pool's state, for metrics.
    public struct Statistics: Sendable, Equatable {
        /// Connections currently open.
        public var open: Int
        /// Connections running a job.
        public var inUse: Int
        /// Requests waiting for a connection.
        public var waiting: Int
        /// The configured maximum.
        public var maxConnections: Int
    }

    /// Where connections go.
    public let connectionConfiguration: PostgresConfiguration
    /// The pool's settings.
    public let configuration: Configuration
    private let logger: Logger
    private let lock = ConditionLock(conditions: 3)
    private let state: PoolState

    private static let workerCondition = 0
    private static let reaperCondition = 1
    private static let closedCondition = 2

    /// Creates a pool; no connection is opened until the first request.
    public init(_ connection: PostgresConfiguration, configuration: Configuration = .init(), logger: Logger) {
        self.connectionConfiguration = connection
        self.configuration = configuration
        self.logger = logger
        self.state = PoolState()
        startThread(name: "pg-pool-reaper") { [self] in reaperLoop() }
    }

    /// The pool's current state.
    public var statistics: Statistics {
        lock.withLock {
            Statistics(
                open: state.openConnections, inUse: state.inUse, waiting: state.queue.count,
                maxConnections: configuration.maxConnections)
        }
    }

    /// Runs `body` with a connection on one of the pool's threads and returns its result.
    ///
    /// `body` runs synchronously and should do all of one unit of work (e.g. a whole
    /// transaction) so it costs one thread hop.
    /// - Throws: `.poolExhausted` after `acquireTimeout`, `.poolClosed`, connection errors,
    ///   or whatever `body` throws.
    public func withConnection<T: Sendable>(
        _ body: @escaping @Sendable (PostgresConnection) throws -> T
    ) async throws -> T {
        let id = lock.withLock { state.nextJobID &+= 1; return state.nextJobID }
        let deadline = monotonicNanoseconds() + UInt64(configuration.acquireTimeout.nanoseconds)
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, Error>) in
                let job = PoolJob(
                    id: id, deadline: deadline,
                    execute: { connection in continuation.resume(with: Result { try body(connection) }) },
                    fail: { error in continuation.resume(throwing: error) }
                )
                enqueue(job)
            }
        } onCancel: {
            cancel(jobID: id)
        }
    }

    /// Runs `body` inside a transaction on a pooled connection (see `withConnection`).
    public func transaction<T: Sendable>(
        _ body: @escaping @Sendable (PostgresConnection) throws -> T
    ) async throws -> T {
        try await withConnection { connection in try connection.transaction(body) }
    }

    /// Stops the pool: waiting requests fail with `.poolClosed`, running jobs finish, then
    /// every connection is closed and every thread ends.
    public func close() async {
        let waiting: [PoolJob] = lock.withLock {
            state.closed = true
            let jobs = state.queue.drain()
            lock.broadcast(Self.workerCondition)
            lock.signal(Self.reaperCondition)
            return jobs
        }
        for job in waiting {
            job.fail(PostgresError(kind: .poolClosed, message: "the database pool is closed"))
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            startThread(name: "pg-pool-close") { [self] in
                lock.withLock {
                    while state.threads > 0 { lock.wait(Self.closedCondition) }
                }
                continuation.resume()
            }
        }
    }

    private func enqueue(_ job: PoolJob) {
        enum Decision { case queued(startThread: Bool), full, closed }
        let decision: Decision = lock.withLock {
            if state.closed { return .closed }
            if state.queue.count >= configuration.maxWaiting + state.idleWorkers { return .full }
            state.queue.append(job)
            if state.queue.count == 1 { lock.signal(Self.reaperCondition) }
            if state.idleWorkers > 0 {
                lock.signal(Self.workerCondition)
            }
            if state.queue.count > state.idleWorkers, state.threads < configuration.maxConnections {
                state.threads += 1
                return .queued(startThread: true)
            }
            return .queued(startThread: false)
        }
        switch decision {
        case .closed:
            job.fail(PostgresError(kind: .poolClosed, message: "the database pool is closed"))
        case .full:
            job.fail(PostgresError(kind: .poolExhausted, message: "database pool exhausted: too many requests waiting"))
        case .queued(let start):
            if start {
                let number = lock.withLock { state.threads }
                startThread(name: "pg-pool-\(number)") { [self] in workerLoop() }
            }
        }
    }

    private func cancel(jobID: UInt64) {
        let job = lock.withLock { state.queue.remove(id: jobID) }
        job?.fail(CancellationError())
    }

    private func workerLoop() {
        var connection: PostgresConnection? = nil
        while true {
            let next: PoolJob? = lock.withLock {
                while state.queue.isEmpty, !state.closed {
                    state.idleWorkers += 1
                    lock.wait(Self.workerCondition)
                    state.idleWorkers -= 1
                }
                guard let job = state.queue.popFirst() else { return nil }
                state.inUse += 1
                return job
            }
            guard let job = next else { break }
            if let open = connection, !open.isUsableAfterIdle() {
                logger.warning("replacing a broken database connection")
                connection = nil
                lock.withLock { state.openConnections -= 1 }
            }
            if connection == nil {
                do {
                    connection = try openConnection()
                    lock.withLock { state.openConnections += 1 }
                } catch {
                    lock.withLock { state.inUse -= 1 }
                    job.fail(error)
                    continue
                }
            }
            guard let current = connection else { continue }
            job.execute(current)
            if current.isOpen, current.isInTransaction {
                try? current.execute("ROLLBACK")
            }
            let keep = current.isOpen && !current.isInTransaction
            if !keep { connection = nil }
            lock.withLock {
                state.inUse -= 1
                if !keep { state.openConnections -= 1 }
            }
        }
        let hadConnection = connection != nil
        connection = nil
        lock.withLock {
            if hadConnection { state.openConnections -= 1 }
            state.threads -= 1
            lock.broadcast(Self.closedCondition)
        }
    }

    private func openConnection() throws -> PostgresConnection {
        let connection = try PostgresConnection.connect(connectionConfiguration)
        for setting in configuration.sessionSettings {
            try connection.query("select set_config($1, $2, false)", setting.name, setting.value)
        }
        connection.statementObserver = configuration.statementObserver
        return connection
    }

    private func reaperLoop() {
        while true {
            let (expired, closed): ([PoolJob], Bool) = lock.withLock {
                while !state.closed {
                    guard let head = state.queue.first else {
                        lock.wait(Self.reaperCondition)
                        continue
                    }
                    let now = monotonicNanoseconds()
                    if head.deadline > now {
                        lock.wait(Self.reaperCondition, untilUptimeNanoseconds: head.deadline)
                        continue
                    }
                    var expired: [PoolJob] = []
                    while let first = state.queue.first, first.deadline <= now {
                        _ = state.queue.popFirst()
                        expired.append(first)
                    }
                    return (expired, false)
                }
                return ([], true)
            }
            if !expired.isEmpty {
                logger.warning("database pool exhausted", metadata: ["timed_out": "\(expired.count)"])
            }
            for job in expired {
                job.fail(
                    PostgresError(
                        kind: .poolExhausted,
                        message: "database pool exhausted: no connection free within \(configuration.acquireTimeout)"))
            }
            if closed { return }
        }
    }
}

/// One request for a connection; exactly one party (a worker, the reaper, a cancellation,
/// `close`) takes it out of the queue and so resumes it exactly once.
final class PoolJob: @unchecked Sendable {
    let id: UInt64
    let deadline: UInt64
    let execute: (PostgresConnection) -> Void
    let fail: (Error) -> Void

    init(id: UInt64, deadline: UInt64, execute: @escaping (PostgresConnection) -> Void, fail: @escaping (Error) -> Void) {
        self.id = id
        self.deadline = deadline
        self.execute = execute
        self.fail = fail
    }
}

/// The pool's mutable state; only touched with the pool's lock held.
final class PoolState: @unchecked Sendable {
    var queue = JobQueue()
    var nextJobID: UInt64 = 0
    var threads = 0
    var idleWorkers = 0
    var inUse = 0
    var openConnections = 0
    var closed = false
}

/// A FIFO of jobs with O(1) amortised pop from the front.
struct JobQueue {
    private var storage: [PoolJob] = []
    private var head = 0

    var count: Int { storage.count - head }
    var isEmpty: Bool { count == 0 }
    var first: PoolJob? { isEmpty ? nil : storage[head] }

    mutating func append(_ job: PoolJob) { storage.append(job) }

    mutating func popFirst() -> PoolJob? {
        guard !isEmpty else { return nil }
        let job = storage[head]
        head += 1
        if head >= 64, head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return job
    }

    mutating func remove(id: UInt64) -> PoolJob? {
        guard let index = storage[head...].firstIndex(where: { $0.id == id }) else { return nil }
        return storage.remove(at: index)
    }

    mutating func drain() -> [PoolJob] {
        let jobs = Array(storage[head...])
        storage = []
        head = 0
        return jobs
    }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
