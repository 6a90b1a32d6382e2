import Foundation
import Logging
import Postgres

/// Wakes long-polls when their user's events change, on any server instance: every push
/// sends `NOTIFY trunk_sync_events, '<user id>'`, and one `PostgresListener` per process
/// turns those into wake-ups. A waiting request holds a continuation only — no thread, no
/// database connection.
public final class EventNotifier: Sendable {
    private let listener: PostgresListener?
    private let state = NotifierState()

    /// A notifier fed by `listener` (nil: only `shutdown` wakes waiters; for tools and tests).
    /// The caller starts the listener once every subscriber has subscribed.
    public init(listener: PostgresListener?) {
        self.listener = listener
        guard let listener else { return }
        let events = listener.events()
        let state = self.state
        Task.detached {
            for await event in events {
                switch event {
                case .notification(let notification):
                    guard notification.channel == EventStore.channel else { continue }
                    if let user = UUIDText.parse(notification.payload) { state.fire(user: user) }
                case .listening:
                    // Notifications may have been missed while disconnected: everyone re-checks.
                    state.fireAll()
                }
            }
        }
    }

    /// Registers interest in `user` before looking at the database, so a commit between the
    /// look and the wait is not missed. `counted`: whether it is a pull waiting for events
    /// (`waiting`); an export watching for its session's end is not.
    public func ticket(for user: UUID, counted: Bool = true) -> WaitTicket {
        state.register(user: user, counted: counted)
    }

    /// Wakes `user`'s waiting requests now (they look again, e.g. whether their session was
    /// revoked).
    public func wake(_ user: UUID) { state.fire(user: user) }

    /// Whether the listener is connected and listening now.
    public var isListening: Bool { listener?.isListening ?? false }

    /// Number of pulls waiting now.
    public var waiting: Int { state.count }

    /// Whether `shutdown` was called (every ticket now fires at once).
    public var isShutDown: Bool { state.isClosed }

    /// Wakes every waiter now and every future waiter at once (graceful shutdown).
    public func shutdown() {
        state.shutdown()
        listener?.stop()
    }
}

/// One waiting request's claim on a wake-up.
public final class WaitTicket: @unchecked Sendable {
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

    func fire() {
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

final class NotifierState: @unchecked Sendable {
    private let lock = NSLock()
    private var tickets: [UUID: [UInt64: WaitTicket]] = [:]
    private var nextID: UInt64 = 0
    private var total = 0
    private var closed = false

    var count: Int { lock.withLock { total } }
    var isClosed: Bool { lock.withLock { closed } }

    func register(user: UUID, counted: Bool) -> WaitTicket {
        lock.lock()
        nextID += 1
        let ticket = WaitTicket(user: user, id: nextID, counted: counted, owner: self)
        tickets[user, default: [:]][nextID] = ticket
        if counted { total += 1 }
        let isClosed = closed
        lock.unlock()
        if isClosed { ticket.fire() }
        return ticket
    }

    func remove(_ ticket: WaitTicket) {
        lock.withLock {
            if tickets[ticket.user]?.removeValue(forKey: ticket.id) != nil, ticket.counted { total -= 1 }
            if tickets[ticket.user]?.isEmpty == true { tickets.removeValue(forKey: ticket.user) }
        }
    }

    func fire(user: UUID) {
        let waiting = lock.withLock { tickets[user].map { Array($0.values) } ?? [] }
        waiting.forEach { $0.fire() }
    }

    func fireAll() {
        let waiting = lock.withLock { tickets.values.flatMap { $0.values } }
        waiting.forEach { $0.fire() }
    }

    func shutdown() {
        lock.withLock { closed = true }
        fireAll()
    }
}
