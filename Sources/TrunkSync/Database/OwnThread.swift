import Postgres

/// Runs blocking work (a `PostgresConnection`'s libpq calls: `migrate`'s multi-statement
/// files, the import, a one-off check) on a thread of its own, never on Swift's cooperative
/// pool, and returns its result. The thread is registered, so the command line joins it
/// before the process exits (`csystem_threads_join_all`). Throws when no thread can be
/// started (out of threads or memory).
public func onOwnThread<T: Sendable>(
    name: String, stackSize: Int = 1 << 22, _ body: @escaping @Sendable () throws -> T
) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let started = startThreadIfPossible(name: name, stackSize: stackSize) {
            continuation.resume(with: Result { try body() })
        }
        if !started { continuation.resume(throwing: OwnThreadError(name: name)) }
    }
}

/// `onOwnThread` could not start its thread.
public struct OwnThreadError: Error, CustomStringConvertible {
    public var name: String
    public var description: String { "cannot start a thread for \(name) (out of threads or memory)" }
}

/// Opens a blocking connection to `configuration` on a thread of its own, runs `body` with
/// it there, and closes it: for the owner's work that needs the simple-query protocol or
/// libpq's blocking helpers (`migrate`), never on an event loop or the cooperative pool.
/// Cancelling the calling task ends an opening still under way (`CancellationError`, the
/// thread ends at once; a database that accepts and never answers would otherwise hold it
/// for `connect_timeout`); `body`, once it runs, runs to its end.
public func withBlockingConnection<T: Sendable>(
    _ configuration: PostgresConfiguration, thread name: String,
    _ body: @escaping @Sendable (PostgresConnection) throws -> T
) async throws -> T {
    let cancellation = try ConnectCancellation()
    return try await withTaskCancellationHandler {
        try await onOwnThread(name: name) {
            let connection = try PostgresConnection.connect(configuration, cancellation: cancellation)
            return try body(connection)  // closed when released, on this thread
        }
    } onCancel: {
        cancellation.cancel()
    }
}
