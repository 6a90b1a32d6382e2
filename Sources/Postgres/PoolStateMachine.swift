/// Every decision of the connection pool as a pure state machine: events in (a request for
/// a connection, a connection opened or failed or given back, time passing, a cancellation,
/// shutdown), actions out (lease this connection to that request, open a connection, fail
/// requests, close a connection). No I/O, no clock, no locks: the pool that drives it owns
/// those, and the machine is tested on its own (`PoolStateMachineTests`).
///
/// Rules:
/// - at most `maxConnections` connections, opened only when a request waits and none is idle;
/// - requests wait in FIFO order, at most `maxWaiting` of them; more fail at once
///   (`poolExhausted`); a request still waiting at its deadline fails (`poolExhausted`);
/// - a connection that fails to open fails the oldest waiting request with its error (that
///   request caused the attempt) and, while others wait, the next attempt starts;
/// - a connection given back broken is closed and, while requests wait, replaced;
/// - after shutdown every waiting request fails (`poolClosed`), idle connections close at
///   once and leased ones when given back, and new requests fail.
struct PoolStateMachine {
    typealias RequestID = UInt64
    typealias ConnectionID = Int

    struct Configuration: Equatable {
        var maxConnections: Int
        var maxWaiting: Int
    }

    enum FailureReason: Equatable {
        /// Every connection busy, the queue full or the deadline passed.
        case exhausted
        /// The pool is shutting down or shut down.
        case closed
        case cancelled
        /// A connection attempt failed; the error is the driver's to give.
        case connectionFailed
    }

    /// What the driver must do, in order.
    enum Action: Equatable {
        /// Hand `connection` to `request`.
        case lease(ConnectionID, to: RequestID)
        /// Start opening a connection under this id; report `connectionOpened` or
        /// `connectionFailed`.
        case open(ConnectionID)
        case fail(RequestID, FailureReason)
        case close(ConnectionID)
        /// Every connection is closed after shutdown.
        case shutdownComplete
    }

    enum ConnectionState: Equatable {
        case opening
        case idle
        case leased(RequestID)
    }

    private struct Waiter {
        var id: RequestID
        var deadline: UInt64
    }

    private(set) var configuration: Configuration
    private(set) var connections: [ConnectionID: ConnectionState] = [:]
    private var nextConnectionID: ConnectionID = 0
    /// Idle connections, most recently used last (reused first: warm caches, and the
    /// others can be closed by an idle timeout later).
    private var idle: [ConnectionID] = []
    private var waiting = Deque<Waiter>()
    private(set) var isShutDown = false

    init(configuration: Configuration) {
        self.configuration = configuration
    }

    // MARK: - Reading

    // Counted in place (read after every action, for metrics): `filter` built an array each
    // time, ~1.4 % of the server's CPU per database pull.
    var openCount: Int { connections.values.reduce(0) { $1 == .opening ? $0 : $0 + 1 } }
    var leasedCount: Int { connections.values.reduce(0) { if case .leased = $1 { $0 + 1 } else { $0 } } }
    var waitingCount: Int { waiting.count }
    /// The earliest deadline of a waiting request: when the driver must report the time.
    var nextDeadline: UInt64? { waiting.first?.deadline }

    // MARK: - Events

    /// A request for a connection, to be served before `deadline`.
    mutating func request(_ id: RequestID, deadline: UInt64) -> [Action] {
        if isShutDown { return [.fail(id, .closed)] }
        if let connection = idle.popLast() {
            connections[connection] = .leased(id)
            return [.lease(connection, to: id)]
        }
        guard waiting.count < configuration.maxWaiting else { return [.fail(id, .exhausted)] }
        waiting.append(Waiter(id: id, deadline: deadline))
        return openIfNeeded()
    }

    /// The connection `id` is open and ready.
    mutating func connectionOpened(_ id: ConnectionID) -> [Action] {
        guard connections[id] == .opening else { return [] }
        if isShutDown {
            connections[id] = nil
            return [.close(id)] + completeShutdownIfDone()
        }
        return use(id)
    }

    /// Opening the connection `id` failed.
    mutating func connectionFailed(_ id: ConnectionID) -> [Action] {
        guard connections[id] == .opening else { return [] }
        connections[id] = nil
        if isShutDown { return completeShutdownIfDone() }
        var actions: [Action] = []
        if let first = waiting.popFirst() { actions.append(.fail(first.id, .connectionFailed)) }
        return actions + openIfNeeded()
    }

    /// The request holding `id` gave it back; `reusable` is false when it is broken or left
    /// in a state the next request must not inherit.
    mutating func connectionReleased(_ id: ConnectionID, reusable: Bool) -> [Action] {
        guard case .leased = connections[id] else { return [] }
        if isShutDown || !reusable || connections.count > configuration.maxConnections {
            connections[id] = nil
            return [.close(id)] + (isShutDown ? completeShutdownIfDone() : openIfNeeded())
        }
        return use(id)
    }

    /// From now on at most `maxConnections` connections: idle ones above it close at once
    /// (least recently used first), leased ones when given back.
    mutating func limit(to maxConnections: Int) -> [Action] {
        configuration.maxConnections = max(1, maxConnections)
        var actions: [Action] = []
        while connections.count > configuration.maxConnections, !idle.isEmpty {
            let id = idle.removeFirst()
            connections[id] = nil
            actions.append(.close(id))
        }
        return actions
    }

    /// The time is now `now`: waiting requests past their deadline fail.
    mutating func timePassed(_ now: UInt64) -> [Action] {
        var actions: [Action] = []
        // Deadlines are given in arrival order with one timeout, so the queue is sorted.
        while let first = waiting.first, first.deadline <= now {
            _ = waiting.popFirst()
            actions.append(.fail(first.id, .exhausted))
        }
        return actions
    }

    /// The requester of `id` gave up. A leased connection is given back with
    /// `connectionReleased` instead.
    mutating func cancel(_ id: RequestID) -> [Action] {
        guard let index = waiting.firstIndex(where: { $0.id == id }) else { return [] }
        waiting.remove(at: index)
        return [.fail(id, .cancelled)]
    }

    /// Stops the pool.
    mutating func shutdown() -> [Action] {
        guard !isShutDown else { return [] }
        isShutDown = true
        var actions: [Action] = []
        while let waiter = waiting.popFirst() { actions.append(.fail(waiter.id, .closed)) }
        for connection in idle.sorted() {
            connections[connection] = nil
            actions.append(.close(connection))
        }
        idle = []
        return actions + completeShutdownIfDone()
    }

    // MARK: - Helpers

    /// Gives an open connection to the oldest waiting request, or makes it idle.
    private mutating func use(_ id: ConnectionID) -> [Action] {
        if let first = waiting.popFirst() {
            connections[id] = .leased(first.id)
            return [.lease(id, to: first.id)]
        }
        connections[id] = .idle
        idle.append(id)
        return []
    }

    /// Opens connections while more requests wait than are being opened for, within the
    /// maximum.
    private mutating func openIfNeeded() -> [Action] {
        var actions: [Action] = []
        var opening = connections.values.filter { $0 == .opening }.count
        while waiting.count > opening, connections.count < configuration.maxConnections {
            let id = nextConnectionID
            nextConnectionID += 1
            connections[id] = .opening
            opening += 1
            actions.append(.open(id))
        }
        return actions
    }

    private func completeShutdownIfDone() -> [Action] {
        isShutDown && connections.isEmpty ? [.shutdownComplete] : []
    }
}

/// A FIFO with O(1) amortised removal from the front.
struct Deque<Element> {
    private var storage: [Element] = []
    private var head = 0

    var count: Int { storage.count - head }
    var isEmpty: Bool { count == 0 }
    var first: Element? { isEmpty ? nil : storage[head] }

    mutating func append(_ element: Element) { storage.append(element) }

    mutating func popFirst() -> Element? {
        guard !isEmpty else { return nil }
        let element = storage[head]
        head += 1
        if head >= 64, head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return element
    }

    func firstIndex(where predicate: (Element) -> Bool) -> Int? {
        storage[head...].firstIndex(where: predicate)
    }

    mutating func remove(at index: Int) { storage.remove(at: index) }
}
