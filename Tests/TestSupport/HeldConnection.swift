import Foundation
import Postgres
import Synchronization

/// A connection of a loop-driven pool held on purpose until `release()`: how tests make a
/// pool busy and watch its waiters.
public final class HeldConnection: Sendable {
    private let letGo = Mutex(false)
    private let holding = Mutex(false)
    private let task: Mutex<Task<Void, any Error>?> = Mutex(nil)

    private init() {}

    /// Leases a connection of `pool` and returns once it is held (throws when that takes
    /// more than 10 s).
    public static func hold(_ pool: PostgresLoopPool) async throws -> HeldConnection {
        let held = HeldConnection()
        let task = Task {
            try await pool.withConnection { _ in
                held.holding.withLock { $0 = true }
                _ = await waitUntil(60) { held.letGo.withLock { $0 } }
            }
        }
        held.task.withLock { $0 = task }
        guard await waitUntil(10, { held.holding.withLock { $0 } }) else {
            task.cancel()
            throw TestEnvironmentError("the connection was never leased")
        }
        return held
    }

    /// Gives the connection back and waits until the pool has it.
    public func release() async throws {
        letGo.withLock { $0 = true }
        try await task.withLock { $0 }?.value
    }
}
