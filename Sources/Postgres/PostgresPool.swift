import Foundation
import Logging

/// A fixed-size pool of PostgreSQL connections, each owned by one thread of its own. Every
/// decision (who gets which connection, when to open, replace, time out or close) is made
/// by `PoolStateMachine`; this class carries its actions out with threads and a lock.
///
/// Callers `await`; the blocking libpq calls run on the pool's threads, never on Swift's
/// cooperative pool. A request that finds every connection busy waits in a bounded FIFO
/// queue for at most `acquireTimeout`, then fails with `.poolExhausted`. Connections are
/// opened on first need; a connection found broken (server restart) is replaced before
/// the next job runs on it, so the process never needs a restart.
public final class PostgresPool: Sendable {
    /// Pool settings (the loop pool's).
    public typealias Configuration = PostgresLoopPool.Configuration
    /// A snapshot of the pool's state (the loop pool's).
    public typealias Statistics = PostgresLoopPool.Statistics

    /// Where connections go.
    public let connectionConfiguration: PostgresConfiguration
    /// The pool's settings.
    public let configuration: Configuration
    private let logger: Logger
    /// Guards `state`; condition 0 wakes the timer thread, 1 the slots, 2 `close()`.
    private let lock = ConditionLock(conditions: 3)
    private let state: PoolDriverState

    private static let timerCondition = 0
    private static let slotCondition = 1

    /// Creates a pool; no connection is opened until the first request.
    public init(_ connection: PostgresConfiguration, configuration: Configuration = .init(), logger: Logger) {
        self.connectionConfiguration = connection
        self.configuration = configuration
        self.logger = logger
        self.state = PoolDriverState(
            machine: PoolStateMachine(
                configuration: .init(maxConnections: configuration.maxConnections, maxWaiting: configuration.maxWaiting)))
        startThread(name: "pg-pool-timer") { [self] in timerLoop() }
    }

    /// The pool's current state.
    public var statistics: Statistics {
        lock.withLock {
            Statistics(
                open: state.machine.openCount, inUse: state.machine.leasedCount, waiting: state.machine.waitingCount,
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
        let id = lock.withLock { state.nextRequestID &+= 1; return state.nextRequestID }
        let deadline = monotonicNanoseconds() + UInt64(max(0, configuration.acquireTimeout.nanoseconds))
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, Error>) in
                let job = PoolJob(
                    execute: { connection in continuation.resume(with: Result { try body(connection) }) },
                    fail: { error in continuation.resume(throwing: error) })
                let actions: [PoolStateMachine.Action] = lock.withLock {
                    state.jobs[id] = job
                    let wasEmpty = state.machine.nextDeadline == nil
                    let actions = state.machine.request(id, deadline: deadline)
                    if wasEmpty, state.machine.nextDeadline != nil { lock.signal(Self.timerCondition) }
                    return actions
                }
                perform(actions)
            }
        } onCancel: {
            perform(lock.withLock { state.machine.cancel(id) })
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
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let actions: [PoolStateMachine.Action] = lock.withLock {
                state.closeWaiters.append(continuation)
                lock.signal(Self.timerCondition)
                return state.machine.shutdown()
            }
            perform(actions)
        }
    }

    // MARK: - Carrying out the state machine's actions

    /// Does what the state machine decided, outside the lock.
    private func perform(_ actions: [PoolStateMachine.Action]) {
        for action in actions {
            switch action {
            case .lease(let connection, let request):
                lock.withLock {
                    guard let job = state.jobs.removeValue(forKey: request), let slot = state.slots[connection] else { return }
                    slot.job = job
                    lock.broadcast(Self.slotCondition)
                }
            case .open(let connection):
                let slot = PoolSlot(id: connection)
                lock.withLock { state.slots[connection] = slot }
                startThread(name: "pg-pool-\(connection % 1000)") { [self] in slotLoop(slot) }
            case .fail(let request, let reason):
                let (job, openError) = lock.withLock { (state.jobs.removeValue(forKey: request), state.lastOpenError) }
                job?.fail(reason.error(acquireTimeout: configuration.acquireTimeout, openError: openError))
            case .close(let connection):
                lock.withLock {
                    state.slots[connection]?.closing = true
                    lock.broadcast(Self.slotCondition)
                }
            case .shutdownComplete:
                let waiters: [CheckedContinuation<Void, Never>] = lock.withLock {
                    state.shutDown = true
                    defer { state.closeWaiters = [] }
                    return state.closeWaiters
                }
                // The slot threads may still be closing their sockets; wait for them too.
                startThread(name: "pg-pool-close") { [self] in
                    lock.withLock {
                        while state.threads > 0 { lock.wait(2) }
                    }
                    for waiter in waiters { waiter.resume() }
                }
            }
        }
    }

    /// One connection's thread: opens it, then runs the jobs leased to it until told to close.
    /// The connection is closed (its `PQfinish`) in `serve`, before the count of threads drops:
    /// `close()` returns only when no thread still uses libpq, so a process that exits right
    /// after does not tear down the libraries under a closing connection.
    private func slotLoop(_ slot: PoolSlot) {
        lock.withLock { state.threads += 1 }
        serve(slot)
        lock.withLock {
            state.threads -= 1
            lock.broadcast(2)
        }
    }

    /// Opens the slot's connection and runs its jobs; the connection is gone when it returns.
    private func serve(_ slot: PoolSlot) {
        var connection: PostgresConnection
        do {
            connection = try openConnection()
        } catch {
            let actions: [PoolStateMachine.Action] = lock.withLock {
                state.lastOpenError = error
                state.slots[slot.id] = nil
                return state.machine.connectionFailed(slot.id)
            }
            perform(actions)
            return
        }
        perform(lock.withLock { state.machine.connectionOpened(slot.id) })
        while true {
            let next: PoolJob? = lock.withLock {
                while slot.job == nil, !slot.closing { lock.wait(Self.slotCondition) }
                defer { slot.job = nil }
                return slot.job
            }
            guard let job = next else { break }  // closing
            if !connection.isUsableAfterIdle() {
                // A server restart or a network failure while idle: reconnect before the job.
                logger.warning("replacing a broken database connection")
                do {
                    connection = try openConnection()
                } catch {
                    job.fail(error)
                    perform(lock.withLock { state.machine.connectionReleased(slot.id, reusable: false) })
                    continue
                }
            }
            job.execute(connection)
            if connection.isOpen, connection.isInTransaction {
                try? connection.execute("ROLLBACK")
            }
            let reusable = connection.isOpen && !connection.isInTransaction
            perform(lock.withLock { state.machine.connectionReleased(slot.id, reusable: reusable) })
        }
        lock.withLock { state.slots[slot.id] = nil }
    }

    private func openConnection() throws -> PostgresConnection {
        let connection = try PostgresConnection.connect(connectionConfiguration)
        for setting in configuration.sessionSettings {
            try connection.query("select set_config($1, $2, false)", setting.name, setting.value)
        }
        connection.statementObserver = configuration.statementObserver
        return connection
    }

    /// Reports the time to the state machine when the oldest waiting request's deadline
    /// comes.
    private func timerLoop() {
        while true {
            let (actions, stop): ([PoolStateMachine.Action], Bool) = lock.withLock {
                while !state.machine.isShutDown {
                    guard let deadline = state.machine.nextDeadline else {
                        lock.wait(Self.timerCondition)
                        continue
                    }
                    let now = monotonicNanoseconds()
                    if deadline > now {
                        lock.wait(Self.timerCondition, untilUptimeNanoseconds: deadline)
                        continue
                    }
                    return (state.machine.timePassed(now), false)
                }
                return ([], true)
            }
            if !actions.isEmpty {
                logger.warning("database pool exhausted", metadata: ["timed_out": "\(actions.count)"])
            }
            perform(actions)
            if stop { return }
        }
    }
}

/// One request for a connection; the state machine decides who resumes it, exactly once.
final class PoolJob: @unchecked Sendable {
    let execute: (PostgresConnection) -> Void
    let fail: (any Error) -> Void

    init(execute: @escaping (PostgresConnection) -> Void, fail: @escaping (any Error) -> Void) {
        self.execute = execute
        self.fail = fail
    }
}

/// A connection's thread mailbox; touched only with the pool's lock held.
final class PoolSlot: @unchecked Sendable {
    let id: PoolStateMachine.ConnectionID
    var job: PoolJob?
    var closing = false

    init(id: PoolStateMachine.ConnectionID) { self.id = id }
}

/// The driver's state around the machine; only touched with the pool's lock held.
final class PoolDriverState: @unchecked Sendable {
    var machine: PoolStateMachine
    var jobs: [PoolStateMachine.RequestID: PoolJob] = [:]
    var slots: [PoolStateMachine.ConnectionID: PoolSlot] = [:]
    var nextRequestID: UInt64 = 0
    var threads = 0
    var lastOpenError: (any Error)?
    var closeWaiters: [CheckedContinuation<Void, Never>] = []
    var shutDown = false

    init(machine: PoolStateMachine) { self.machine = machine }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}

extension PoolStateMachine.FailureReason {
    /// What a request that failed for this reason throws (both pools).
    func error(acquireTimeout: Duration, openError: (any Error)?) -> any Error {
        switch self {
        case .exhausted:
            return PostgresError(
                kind: .poolExhausted, message: "database pool exhausted: no connection free within \(acquireTimeout)")
        case .closed:
            return PostgresError(kind: .poolClosed, message: "the database pool is closed")
        case .cancelled:
            return CancellationError()
        case .connectionFailed:
            return openError ?? PostgresError(kind: .connectionFailed, message: "cannot connect to the database")
        }
    }
}
