import CLibPQ
import Foundation

/// Drives the opening of a connection started by `PostgresConnection.start` on an event
/// loop, without blocking: `PQconnectPoll` is called whenever the socket is ready for what it
/// last asked (reading or writing), the socket re-watched after every call (libpq may move
/// to another socket: the next address of a host, a retry without TLS), until it answers
/// that the connection is made or failed. TLS (`sslmode`) is negotiated by the same calls.
///
/// `connect_timeout` bounds the whole attempt, read on the pool's clock at least every
/// 100 ms; an attempt that outlives it fails as libpq's own blocking connect does (`timeout
/// expired`). So does one whose loop stops, and one whose task is cancelled (with
/// `CancellationError`). Confined to the loop's thread.
final class PostgresConnecting: @unchecked Sendable {
    private let connection: PostgresConnection
    private let loop: any PostgresEventLoop
    private let clock: @Sendable () -> UInt64
    private let deadline: UInt64?
    /// The socket watched now; -1 when none.
    private var fd: Int32 = -1
    /// Set once `watch` returned: a report before that means the loop refused the socket.
    private var armed = false
    private var refused = false
    private var continuation: CheckedContinuation<Void, any Error>?
    private var timer: Task<Void, Never>?

    /// Opens a connection to `configuration` and returns it in non-blocking pipeline mode,
    /// watched by `loop`, with `settings` applied (`set_config`, in the connection's first
    /// pipeline). From a task that prefers `loop` as its executor. A host name is looked up
    /// by `lookup` first, off the loop.
    /// - Throws: `.connectionFailed` as `PostgresConnection.connect` (never the password),
    ///   the error of a setting the server refused, or `CancellationError`.
    static func open(
        _ configuration: PostgresConfiguration, settings: [(name: String, value: String)] = [],
        on loop: any PostgresEventLoop, clock: @escaping @Sendable () -> UInt64, lookup: HostLookup = .system
    ) async throws -> PostgresLoopConnection {
        let resolved = try await lookup.resolving(configuration)
        let connection = try PostgresConnection.start(configuration, resolved: resolved)
        try await PostgresConnecting(connection, loop: loop, clock: clock).run()
        let opened = try PostgresLoopConnection(connection, loop: loop)
        guard !settings.isEmpty else { return opened }
        do {
            try await opened.pipeline(
                settings.map { PostgresStatement("select set_config($1, $2, false)", $0.name, $0.value) })
        } catch {
            opened.close()
            throw error
        }
        return opened
    }

    private init(_ connection: PostgresConnection, loop: any PostgresEventLoop, clock: @escaping @Sendable () -> UInt64)
    {
        self.connection = connection
        self.loop = loop
        self.clock = clock
        deadline = Self.timeout(connection.configuration).map { clock() + $0 }
    }

    /// `connect_timeout` in nanoseconds, as libpq reads it: none when unset, zero or
    /// negative; at least 2 seconds.
    static func timeout(_ configuration: PostgresConfiguration) -> UInt64? {
        guard let text = configuration["connect_timeout"], let seconds = Int(Substring(text).trimmingWhitespace()),
            seconds > 0
        else { return nil }
        return UInt64(max(seconds, 2)) * 1_000_000_000
    }

    private func run() async throws {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                self.continuation = continuation
                if Task.isCancelled { return finish(CancellationError()) }
                startTimer()
                // Before the first PQconnectPoll, libpq asks to wait as if it had said "writing".
                advance(PGRES_POLLING_WRITING)
            }
        } onCancel: {
            Task(executorPreference: loop) { self.finish(CancellationError()) }
        }
    }

    private func advance(_ status: PostgresPollingStatusType) {
        guard continuation != nil else { return }
        switch status {
        case PGRES_POLLING_OK:
            finish(nil)
        case PGRES_POLLING_READING, PGRES_POLLING_WRITING:
            watch(writable: status == PGRES_POLLING_WRITING)
        default:
            finish(PostgresConnection.openingError(connection.handle, connection.configuration))
        }
    }

    /// Watches the connection's socket (which may be another than before) for `writable`
    /// or readable.
    private func watch(writable: Bool) {
        if fd >= 0 { loop.unwatch(fd) }
        fd = -1
        let socket = PQsocket(connection.handle)
        guard socket >= 0 else {
            return finish(PostgresConnection.openingError(connection.handle, connection.configuration))
        }
        guard loop.isRunning else { return finish(stopped) }
        fd = socket
        armed = false
        refused = false
        loop.watch(socket, writable: writable) { [weak self] _ in
            guard let self else { return }
            guard self.armed else {
                self.refused = true
                return
            }
            self.advance(PQconnectPoll(self.connection.handle))
        }
        armed = true
        if refused { finish(stopped) }
    }

    private var stopped: PostgresError {
        PostgresConnection.openingError(reason: "the database event loop is not running", connection.configuration)
    }

    /// Fails the attempt once the deadline passes on `clock` (or the loop stops).
    private func startTimer() {
        let clock = self.clock
        let deadline = self.deadline
        timer = Task(executorPreference: loop) { [weak self] in
            while let self, self.continuation != nil {
                guard self.loop.isRunning else { return self.finish(self.stopped) }
                let now = clock()
                if let deadline, now >= deadline {
                    return self.finish(
                        PostgresConnection.openingError(reason: "timeout expired", self.connection.configuration))
                }
                let wait = min(deadline.map { $0 - now } ?? .max, 100_000_000)
                do { try await Task.sleep(nanoseconds: wait) } catch { return }
            }
        }
    }

    private func finish(_ error: (any Error)?) {
        guard let continuation else { return }
        self.continuation = nil
        timer?.cancel()
        timer = nil
        if fd >= 0 { loop.unwatch(fd) }
        fd = -1
        if let error { continuation.resume(throwing: error) } else { continuation.resume() }
    }
}
