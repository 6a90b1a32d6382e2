import Foundation
import Logging
import Postgres
import Synchronization

/// Wakes long-polls and event streams when their user's events change, on any server
/// instance: every push sends `NOTIFY trunk_sync_events, '<user id>'`, and one
/// `PostgresListener` per process turns those into wake-ups. A waiting request holds a
/// continuation only — no thread, no database connection.
///
/// A long-poll takes a one-shot `WaitTicket`; a stream an `EventSubscription`, which stays
/// registered and remembers a wake-up that came while its stream was busy writing.
public final class EventNotifier: Sendable {
    private let listener: PostgresListener?
    private let state = NotifierState()
    /// What the event store knows of users' newest events: told of every commit announced.
    private let lastSeqs: LastSeqCache?

    /// A notifier fed by `listener` (nil: only `shutdown` wakes waiters; for tools and tests).
    /// The caller starts the listener once every subscriber has subscribed. `lastSeqs`
    /// (the event store's) hears of every commit and reconnect before anyone is woken.
    init(listener: PostgresListener?, lastSeqs: LastSeqCache?) {
        self.listener = listener
        self.lastSeqs = lastSeqs
        guard let listener else { return }
        let events = listener.events(channels: [EventStore.channel])
        let (state, lastSeqs) = (self.state, self.lastSeqs)
        Task.detached {
            for await event in events {
                switch event {
                case .notification(let notification):
                    guard notification.channel == EventStore.channel else { continue }
                    // Forgotten before the wake-up, so a woken long-poll's re-pull asks the database.
                    if let user = UUIDText.parse(notification.payload) {
                        lastSeqs?.invalidate(user)
                        state.fire(user: user)
                    }
                case .listening:
                    // Notifications may have been missed while disconnected: everyone re-checks.
                    lastSeqs?.listening(session: listener.session)
                    state.fireAll()
                }
            }
        }
    }

    /// A notifier fed by `listener` that tells `store` of every commit.
    public convenience init(listener: PostgresListener?, store: EventStore) {
        self.init(listener: listener, lastSeqs: store.lastSeqs)
    }

    /// A notifier fed by `listener` alone (nil: only `shutdown` wakes waiters; for tools and tests).
    public convenience init(listener: PostgresListener?) {
        self.init(listener: listener, lastSeqs: nil)
    }

    /// Registers interest in `user` before looking at the database, so a commit between the
    /// look and the wait is not missed. `counted`: whether it is a pull waiting for events
    /// (`waiting`); an export watching for its session's end is not.
    public func ticket(for user: UUID, counted: Bool = true) -> WaitTicket {
        state.register(user: user) { WaitTicket(user: user, id: $0, counted: counted, owner: $1) }
    }

    /// Registers a stream's lasting interest in `user` (before it reads its backlog, so a
    /// commit meanwhile is not missed). Release it with `cancel()`.
    public func subscribe(to user: UUID) -> EventSubscription {
        state.register(user: user) { EventSubscription(user: user, id: $0, owner: $1) }
    }

    /// Wakes `user`'s waiting requests now (they look again, e.g. whether their session was
    /// revoked).
    public func wake(_ user: UUID) { state.fire(user: user) }

    /// Whether the listener is connected and listening now.
    public var isListening: Bool { listener?.isListening ?? false }

    /// Number of long-polls waiting now.
    public var waiting: Int { state.count }

    /// Counts wake-ups (of any user): a query started when this was `n` sees every commit
    /// whose wake-up had a generation up to `n`.
    public var generation: UInt64 { state.generation }

    /// Whether `shutdown()` was called (waiters are woken at once from then on).
    public var isShutDown: Bool { state.isClosed }

    /// Wakes every waiter now and every future waiter at once (graceful shutdown).
    public func shutdown() {
        state.shutdown()
        listener?.stop()
    }

    /// `shutdown()`, then waits until the listener has closed its connection (on its loop).
    public func close() async {
        shutdown()
        await listener?.close()
    }
}

/// What the notifier can wake.
protocol Wakeable: AnyObject, Sendable {
    var user: UUID { get }
    var id: UInt64 { get }
    /// Counted in `EventNotifier.waiting` (a pull waiting for events; not a stream's
    /// subscription, nor an export watching for its session's end).
    var counted: Bool { get }
    /// Wakes it; `generation` counts the wake-ups of the notifier.
    func fire(generation: UInt64)
}

/// One waiting request's claim on a wake-up.
public final class WaitTicket: Wakeable, @unchecked Sendable {
    let user: UUID
    let id: UInt64
    /// Counted in `EventNotifier.waiting`.
    let counted: Bool
    private let lock = NSLock()
    private var fired = false
    private var continuation: CheckedContinuation<Void, Never>?
    private weak var owner: NotifierState?

    init(user: UUID, id: UInt64, counted: Bool, owner: NotifierState) {
        self.user = user
        self.id = id
        self.counted = counted
        self.owner = owner
    }

    func fire(generation: UInt64 = 0) {
        lock.lock()
        fired = true
        let waiting = continuation
        continuation = nil
        lock.unlock()
        waiting?.resume()
    }

    /// Suspends until woken (a push for the user, a reconnect, shutdown), `timeout` passes
    /// or the task is cancelled; then releases the ticket.
    public func wait(timeout: Duration) async {
        defer { owner?.remove(self) }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.waitForFire() }
            group.addTask { try? await Task.sleep(for: timeout) }
            await group.next()
            group.cancelAll()
        }
    }

    private func waitForFire() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                lock.lock()
                if fired || Task.isCancelled {
                    lock.unlock()
                    continuation.resume()
                } else {
                    self.continuation = continuation
                    lock.unlock()
                }
            }
        } onCancel: {
            fire()
        }
    }

    /// Releases the ticket without waiting.
    public func cancel() { owner?.remove(self) }
}

/// A stream's lasting claim on wake-ups for its user: `next()` returns once something may
/// have changed since the last call (an event committed, the session revoked, the listener
/// reconnected, `wake()`), however many wake-ups came meanwhile.
public final class EventSubscription: Wakeable, Sendable {
    let user: UUID
    let id: UInt64
    let counted = false
    private struct State {
        var pending = false
        /// The newest wake-up's generation.
        var generation: UInt64 = 0
        var continuation: CheckedContinuation<Void, Never>? = nil
    }
    private let state = Mutex(State())
    private weak let owner: NotifierState?

    init(user: UUID, id: UInt64, owner: NotifierState) {
        self.user = user
        self.id = id
        self.owner = owner
    }

    func fire(generation: UInt64) {
        state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.generation = max(state.generation, generation)
            guard let waiting = state.continuation else {
                state.pending = true
                return nil
            }
            state.continuation = nil
            return waiting
        }?.resume()
    }

    /// Wakes this subscription's stream alone (it re-checks what it waits for: its token's
    /// expiry, a heartbeat due).
    public func wake() { fire(generation: 0) }

    /// Suspends until woken since the last call, or the task is cancelled. Returns the
    /// newest wake-up's generation (`EventNotifier.generation`): a query started at or after
    /// it sees the commit that caused it.
    @discardableResult
    public func next() async -> UInt64 {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { state -> Bool in
                    if state.pending || Task.isCancelled {
                        state.pending = false
                        return true
                    }
                    state.continuation = continuation
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            fire(generation: 0)
        }
        return state.withLock { $0.generation }
    }

    /// Stops the wake-ups.
    public func cancel() { owner?.remove(self) }

    /// Whether a task waits in `next()` (tests wait for it instead of sleeping).
    var isWaiting: Bool { state.withLock { $0.continuation != nil } }
}

final class NotifierState: @unchecked Sendable {
    private let lock = NSLock()
    private var tickets: [UUID: [UInt64: any Wakeable]] = [:]
    private var nextID: UInt64 = 0
    /// Long-poll tickets registered (subscriptions are counted by their streams).
    private var total = 0
    private var closed = false
    private var wakeUps: UInt64 = 0

    var count: Int { lock.withLock { total } }
    var isClosed: Bool { lock.withLock { closed } }
    var generation: UInt64 { lock.withLock { wakeUps } }

    func register<Ticket: Wakeable>(user: UUID, _ make: (UInt64, NotifierState) -> Ticket) -> Ticket {
        lock.lock()
        nextID += 1
        let ticket = make(nextID, self)
        tickets[user, default: [:]][nextID] = ticket
        if ticket.counted { total += 1 }
        let isClosed = closed
        let generation = wakeUps
        lock.unlock()
        if isClosed { ticket.fire(generation: generation) }
        return ticket
    }

    func remove(_ ticket: any Wakeable) {
        lock.withLock {
            if tickets[ticket.user]?.removeValue(forKey: ticket.id) != nil, ticket.counted { total -= 1 }
            if tickets[ticket.user]?.isEmpty == true { tickets.removeValue(forKey: ticket.user) }
        }
    }

    func fire(user: UUID) {
        let (waiting, generation) = lock.withLock {
            wakeUps += 1
            return (tickets[user].map { Array($0.values) } ?? [], wakeUps)
        }
        waiting.forEach { $0.fire(generation: generation) }
    }

    func fireAll() {
        let (waiting, generation) = lock.withLock {
            wakeUps += 1
            return (tickets.values.flatMap { $0.values }, wakeUps)
        }
        waiting.forEach { $0.fire(generation: generation) }
    }

    func shutdown() {
        lock.withLock { closed = true }
        fireAll()
    }
}
