import Foundation
import Logging
import Synchronization

/// The pool: non-blocking connections owned by one event loop, every decision made by
/// `PoolStateMachine` (bounded, FIFO waiting, acquire timeout, replacement of broken
/// connections), driven from the loop's thread, so a request's queries are sent, awaited
/// and read on the thread that handles the request, and a waiting request holds no thread.
///
/// Connections are opened on the loop too, without blocking (`PQconnectStartParams` and
/// `PQconnectPoll`, `connect_timeout` enforced on the pool's clock): the pool starts no
/// thread.
public final class PostgresLoopPool: @unchecked Sendable {
    /// Pool settings.
    public struct Configuration: Sendable {
        /// Most connections the pool opens. Default 10.
        public var maxConnections: Int = 10
        /// How long a request may wait for a free connection. Default 5 s.
        public var acquireTimeout: Duration = .seconds(5)
        /// Most requests waiting at once; more fail at once with `.poolExhausted`. Default 1000.
        public var maxWaiting: Int = 1000
        /// Most shared reads (`sharedPipeline`) in flight on one connection before another
        /// connection is leased for them. Default 1: each has a connection of its own (see
        /// Sources/Postgres/README.md, "Shared reads", for why deeper is not the default yet).
        public var sharedPipelineDepth: Int = 1
        /// Settings applied to each new connection with `set_config` (e.g. `role`,
        /// `statement_timeout`). Default none.
        public var sessionSettings: [(name: String, value: String)] = []
        /// Run on each new connection once its session settings are applied, before any
        /// request gets it (on the pool's loop); a throw fails the opening as a refused
        /// connection does, and the connection is closed. Default none.
        public var onOpen: (@Sendable (PostgresLoopConnection) async throws -> Void)? = nil
        /// Told the SQL text of every statement a pooled connection runs, on the pool's
        /// loop: lets tests see what work a request does (e.g. that two answers that must
        /// not be told apart ran the same statements). Default nil, which costs nothing.
        public var statementObserver: (@Sendable (String) -> Void)? = nil
        /// Looks up the host name of the database before each opening, off the loop.
        /// Default: the system's resolver (tests give one they control).
        public var hostLookup: HostLookup = .system

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

        /// A snapshot (or a sum of several pools').
        public init(open: Int, inUse: Int, waiting: Int, maxConnections: Int) {
            (self.open, self.inUse, self.waiting, self.maxConnections) = (open, inUse, waiting, maxConnections)
        }
    }

    /// Where connections go.
    public let connectionConfiguration: PostgresConfiguration
    /// The pool's settings (`maxWaiting`, `acquireTimeout`, session settings, observer).
    public let configuration: Configuration
    /// The loop that drives every connection of this pool.
    public let loop: any PostgresEventLoop
    private let logger: Logger
    /// Monotonic time in nanoseconds, for the acquire deadlines.
    private let clock: @Sendable () -> UInt64

    /// The clock a pool reads unless given another: `CLOCK_MONOTONIC`, in nanoseconds.
    public static let monotonicClock: @Sendable () -> UInt64 = { monotonicNanoseconds() }

    // Loop-confined state.
    private var machine: PoolStateMachine
    private var connections: [PoolStateMachine.ConnectionID: PostgresLoopConnection] = [:]
    /// The connections running `onOpen`, which `close()` ends rather than wait for.
    private var opening: [PoolStateMachine.ConnectionID: PostgresLoopConnection] = [:]
    /// The tasks opening a connection, which `close()` cancels rather than wait for.
    private var openingTasks: [PoolStateMachine.ConnectionID: Task<Void, Never>] = [:]
    private var waiters: [PoolStateMachine.RequestID: CheckedContinuation<PoolStateMachine.ConnectionID, any Error>] =
        [:]
    /// The connections leased to shared reads, while any of theirs is in flight.
    private var sharing: [(id: PoolStateMachine.ConnectionID, connection: PostgresLoopConnection)] = []
    private var nextRequestID: PoolStateMachine.RequestID = 0
    private var lastOpenError: (any Error)?
    private var closeWaiters: [CheckedContinuation<Void, Never>] = []
    private var ticking = false
    /// Open and leased connections and waiting requests, for metrics from any thread.
    private let counts = Atomic<Int>(0)
    /// The current maximum, for metrics from any thread.
    private let limitCount: Atomic<Int>

    /// A pool on `loop`; nothing is opened until the first request. `clock` (monotonic
    /// nanoseconds) times the acquire deadlines; tests pass one they advance by hand.
    public init(
        _ connection: PostgresConfiguration, configuration: Configuration, loop: any PostgresEventLoop,
        logger: Logger, clock: @escaping @Sendable () -> UInt64 = PostgresLoopPool.monotonicClock
    ) {
        self.connectionConfiguration = connection
        self.configuration = configuration
        self.loop = loop
        self.logger = logger
        self.clock = clock
        limitCount = Atomic(configuration.maxConnections)
        machine = PoolStateMachine(
            configuration: .init(maxConnections: configuration.maxConnections, maxWaiting: configuration.maxWaiting))
    }

    /// The pool's current state (read from any thread; approximate while it changes).
    public var statistics: Statistics {
        let packed = counts.load(ordering: .relaxed)
        return Statistics(
            open: packed & 0xFFFF, inUse: (packed >> 16) & 0xFFFF, waiting: packed >> 32,
            maxConnections: limitCount.load(ordering: .relaxed))
    }

    /// Runs `body` with a leased connection on the loop's thread and returns its result.
    /// Whatever transaction `body` leaves open is rolled back before the connection is
    /// reused; a connection that broke is replaced.
    /// - Throws: `.poolExhausted` after `acquireTimeout`, `.poolClosed`, connection errors,
    ///   or whatever `body` throws.
    public func withConnection<T: Sendable>(
        _ body: (PostgresLoopConnection) async throws -> T
    ) async throws -> T {
        try await withTaskExecutorPreference(loop) {
            let (id, connection) = try await acquire()
            do {
                let value = try await body(connection)
                await release(id, connection)
                return value
            } catch {
                await release(id, connection)
                throw error
            }
        }
    }

    /// Runs `prefix` then `statements` as one pipeline ended by a sync — one implicit
    /// transaction, so the statements must open none — and returns the results of
    /// `statements` (a failure's `pipelineIndex` counts among them; nil when `prefix` failed).
    ///
    /// Unlike `withConnection`, it need not wait for a connection of its own: it is sent
    /// behind the shared reads already in flight on a connection leased for them (the one
    /// with the fewest, while it has fewer than `sharedPipelineDepth`); only when each such
    /// connection is that full is another leased (opened, or waited for, as any request). The
    /// server runs such a connection's pipelines one after another without waiting on the
    /// network between them, and one wake-up of the loop reads the answers of several: a
    /// read that is one round trip costs the database and the loop less under load. A
    /// connection goes back to the pool once none of its shared reads is in flight. A
    /// failure ends only its own pipeline (each has its own sync); a lost connection fails
    /// every pipeline in flight on it.
    public func sharedPipeline(_ statements: [PostgresStatement], prefix: [PostgresStatement] = []) async throws
        -> [PostgresResult]
    {
        try await withTaskExecutorPreference(loop) {
            let (id, connection) = try await shareConnection()
            do {
                let results = try await PostgresLoopConnection.run(statements, prefix: prefix) {
                    try await connection.sharedPipeline($0)
                }
                await stopSharing(id, connection)
                return results
            } catch {
                await stopSharing(id, connection)
                throw error
            }
        }
    }

    /// From now on at most `maxConnections` connections (at least one): idle ones above it
    /// close (on the loop, soon after this returns), leased ones when given back.
    public func limit(to maxConnections: Int) {
        limitCount.store(max(1, maxConnections), ordering: .relaxed)
        Task(executorPreference: loop) { self.perform(self.machine.limit(to: maxConnections)) }
    }

    /// Stops the pool: waiting requests fail with `.poolClosed`, leased connections close
    /// when given back, idle ones at once, and openings under way are abandoned.
    public func close() async {
        await withTaskExecutorPreference(loop) {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                closeWaiters.append(continuation)
                perform(machine.shutdown())
                // A stopped loop reads no socket: a pipeline still waiting would wait for
                // ever, and its connection never come back. Fail it (its task then gives the
                // connection back, which completes the shutdown).
                if !loop.isRunning {
                    for connection in connections.values { connection.close() }
                }
                // An `onOpen` may wait for as long as a lock is held elsewhere (the server's
                // timeline check waits for users' rows): end it, as a shut-down pool would
                // close its connection anyway, rather than keep the process from stopping.
                for connection in opening.values { connection.close() }
                // So may an opening itself, against a database that accepts and never
                // answers, for as long as `connect_timeout` (a signal during `serve`'s
                // start-up must not wait for it): cancelled, it fails, and the shutdown
                // completes.
                for task in openingTasks.values { task.cancel() }
            }
        }
    }

    // MARK: - On the loop's thread

    private func acquire() async throws -> (PoolStateMachine.ConnectionID, PostgresLoopConnection) {
        // A connection found broken when leased (the server closed it while idle) is given
        // back and another taken, as often as there are connections.
        for _ in 0...configuration.maxConnections {
            nextRequestID &+= 1
            let request = nextRequestID
            let deadline = clock() + UInt64(max(0, configuration.acquireTimeout.nanoseconds))
            let id = try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    waiters[request] = continuation
                    perform(machine.request(request, deadline: deadline))
                    startTicking()
                }
            } onCancel: {
                Task(executorPreference: loop) { self.perform(self.machine.cancel(request)) }
            }
            guard let connection = connections[id] else { continue }
            if connection.isUsable { return (id, connection) }
            logger.warning("replacing a broken database connection")
            perform(machine.connectionReleased(id, reusable: false))
        }
        throw PostgresError(kind: .connectionClosed, message: "no usable database connection")
    }

    /// A connection for a shared read: the shared one with the fewest in flight below the
    /// depth, else a newly leased one.
    private func shareConnection() async throws -> (PoolStateMachine.ConnectionID, PostgresLoopConnection) {
        var best: (id: PoolStateMachine.ConnectionID, connection: PostgresLoopConnection)?
        for entry in sharing
        where entry.connection.canShare
            && entry.connection.inFlight < max(1, configuration.sharedPipelineDepth)
            && entry.connection.inFlight < best?.connection.inFlight ?? Int.max
        {
            best = entry
        }
        if let best { return best }
        let (id, connection) = try await acquire()
        sharing.append((id, connection))
        return (id, connection)
    }

    /// Gives a shared connection back to the pool once none of its reads is in flight.
    private func stopSharing(_ id: PoolStateMachine.ConnectionID, _ connection: PostgresLoopConnection) async {
        guard connection.inFlight == 0, let index = sharing.firstIndex(where: { $0.id == id }) else { return }
        sharing.remove(at: index)
        await release(id, connection)
    }

    private func release(_ id: PoolStateMachine.ConnectionID, _ connection: PostgresLoopConnection) async {
        if connection.isUsable, connection.isInTransaction {
            _ = try? await connection.pipeline([.rollback])
        }
        perform(machine.connectionReleased(id, reusable: connection.isUsable && !connection.isInTransaction))
    }

    /// Reports the time to the state machine while requests wait (their deadlines), reading
    /// `clock` at least every 100 ms.
    private func startTicking() {
        guard !ticking, machine.nextDeadline != nil else { return }
        ticking = true
        Task(executorPreference: loop) {
            while let deadline = self.machine.nextDeadline {
                let now = self.clock()
                if deadline > now {
                    try? await Task.sleep(nanoseconds: min(deadline - now, 100_000_000))
                    continue
                }
                let actions = self.machine.timePassed(now)
                if !actions.isEmpty {
                    self.logger.warning("database pool exhausted", metadata: ["timed_out": "\(actions.count)"])
                }
                self.perform(actions)
            }
            self.ticking = false
        }
    }

    private func perform(_ actions: [PoolStateMachine.Action]) {
        for action in actions {
            switch action {
            case .lease(let connection, let request):
                waiters.removeValue(forKey: request)?.resume(returning: connection)
            case .open(let id):
                open(id)
            case .fail(let request, let reason):
                waiters.removeValue(forKey: request)?.resume(
                    throwing: reason.error(acquireTimeout: configuration.acquireTimeout, openError: lastOpenError))
            case .close(let id):
                connections.removeValue(forKey: id)?.close()
            case .shutdownComplete:
                let waiting = closeWaiters
                closeWaiters = []
                for waiter in waiting { waiter.resume() }
            }
        }
        let waiting = machine.waitingCount
        counts.store(
            machine.openCount | (machine.leasedCount << 16) | (waiting << 32), ordering: .relaxed)
    }

    /// Opens a connection on the loop without blocking (`PostgresConnecting`): the session
    /// settings are its first pipeline, then `onOpen`; the machine learns of it once both are
    /// done.
    private func open(_ id: PoolStateMachine.ConnectionID) {
        // Runs after this returns (a job on the loop's executor), so the entry is there first.
        openingTasks[id] = Task(executorPreference: loop) {
            defer { self.openingTasks[id] = nil }
            do {
                let connection = try await PostgresConnecting.open(
                    self.connectionConfiguration, settings: self.configuration.sessionSettings, on: self.loop,
                    clock: self.clock, lookup: self.configuration.hostLookup)
                // Shut down meanwhile: no `onOpen` (nothing would end one that waits).
                if let onOpen = self.configuration.onOpen, !self.machine.isShutDown {
                    self.opening[id] = connection
                    defer { self.opening[id] = nil }
                    do { try await onOpen(connection) } catch {
                        connection.close()
                        throw error
                    }
                }
                connection.connection.statementObserver = self.configuration.statementObserver
                self.connections[id] = connection
                self.perform(self.machine.connectionOpened(id))
            } catch {
                self.lastOpenError = error
                self.perform(self.machine.connectionFailed(id))
            }
        }
    }
}
extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}

extension PoolStateMachine.FailureReason {
    /// What a request that failed for this reason throws.
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
