import Foundation
import Logging

/// A notification received through `LISTEN`.
public struct PostgresNotification: Sendable, Equatable {
    /// The channel it was sent on.
    public var channel: String
    /// The payload given to `NOTIFY`/`pg_notify`.
    public var payload: String

    /// A notification from its parts.
    public init(channel: String, payload: String) {
        self.channel = channel
        self.payload = payload
    }
}

/// What a `PostgresListener` delivers to its subscribers.
public enum PostgresListenerEvent: Sendable, Equatable {
    /// A notification arrived.
    case notification(PostgresNotification)
    /// The listener (re)connected and is listening again, or this subscriber fell more than
    /// its buffer behind and lost notifications. Either way notifications were missed, so
    /// subscribers should re-check whatever they wait for.
    case listening
}

/// Holds one dedicated connection that `LISTEN`s on a set of channels and delivers what
/// arrives to any number of subscribers as an `AsyncSequence`.
///
/// It runs on an event loop (`PostgresEventLoop`: the database's own loop, or one it makes
/// for itself) and holds no thread of its own: the connection is opened without blocking
/// (`PostgresConnecting`), `LISTEN` sent as one pipeline, and notifications read
/// (`PQconsumeInput`, `PQnotifies`) when the socket is readable. When the connection breaks
/// it reconnects (with backoff, up to 5 s between attempts, waited for by a timer task on the
/// loop), listens again and tells subscribers with `.listening`.
public final class PostgresListener: @unchecked Sendable {
    private let configuration: PostgresConfiguration
    private let channels: [String]
    private let logger: Logger
    private let loop: any PostgresEventLoop
    /// The loop made by the convenience initializer: ended once the listener has stopped.
    private let ownLoop: PostgresLoopThread?
    private let state = ListenerState()

    // Loop-confined.
    /// The connection being set up or listened on.
    private var current: PostgresLoopConnection?
    /// The paused task: reconnecting after a backoff, or listening until the connection breaks.
    private var wakeup: CheckedContinuation<Void, Never>?
    private var backoffTimer: Task<Void, Never>?

    /// Creates a listener that will run on `loop`; call `start()` to connect. Stop it
    /// (`close()`) before the loop ends.
    public convenience init(
        _ configuration: PostgresConfiguration, channels: [String], logger: Logger, loop: any PostgresEventLoop
    ) {
        self.init(configuration, channels: channels, logger: logger, loop: loop, ownLoop: nil)
    }

    /// Creates a listener on an event loop of its own (a `PostgresLoopThread` named
    /// `pg-listener`, ended when the listener stops); call `start()` to connect.
    public convenience init(_ configuration: PostgresConfiguration, channels: [String], logger: Logger) {
        guard let loop = try? PostgresLoopThread(name: "pg-listener") else {
            preconditionFailure("cannot start the notification listener's event loop")  // out of threads or descriptors
        }
        self.init(configuration, channels: channels, logger: logger, loop: loop, ownLoop: loop)
    }

    private init(
        _ configuration: PostgresConfiguration, channels: [String], logger: Logger, loop: any PostgresEventLoop,
        ownLoop: PostgresLoopThread?
    ) {
        var config = configuration
        // Notice a dead peer within about a minute even when nothing is sent.
        if config["keepalives_idle"] == nil { config.setParameter("keepalives_idle", "30") }
        if config["keepalives_interval"] == nil { config.setParameter("keepalives_interval", "10") }
        if config["keepalives_count"] == nil { config.setParameter("keepalives_count", "3") }
        self.configuration = config
        self.channels = channels
        self.logger = logger
        self.loop = loop
        self.ownLoop = ownLoop
    }

    /// Starts listening (once): a task on the loop connects, listens and reconnects.
    public func start() {
        let first = state.withLock { state -> Bool in
            defer { state.started = true }
            return !state.started
        }
        guard first else { return }
        let runner = Task(executorPreference: loop) { await self.run() }
        if state.withLock({ state -> Bool in
            state.runner = runner
            return state.stopped
        }) {
            runner.cancel()
        }
    }

    /// Whether the listener is connected and listening right now.
    public var isListening: Bool { state.withLock { $0.listening } }

    /// The connection it listens on now, numbered from 1 (each reconnect counts one more);
    /// nil while not listening. Knowledge built from notifications holds only as long as
    /// this stays the same.
    public var session: UInt64? { state.withLock { $0.listening ? $0.sessions : nil } }

    /// A stream of what the listener delivers from now on: every `.listening`, and the
    /// notifications on `channels` (nil: on every channel it listens to). A notification on
    /// another channel is not put in this stream at all, so its reader is not woken for it.
    /// The buffer is bounded (newest 10,000 kept); ending the iteration unsubscribes.
    public func events(channels: Set<String>? = nil) -> AsyncStream<PostgresListenerEvent> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: PostgresListenerEvent.self, bufferingPolicy: .bufferingNewest(10_000))
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            state.subscribers[state.nextID] = ListenerState.Subscriber(continuation: continuation, channels: channels)
            return state.nextID
        }
        continuation.onTermination = { [weak state] _ in
            state?.withLock { _ = $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }

    /// Stops listening, closes the connection and finishes every subscriber's stream, without
    /// waiting for the loop to have done so (`close()` waits).
    public func stop() {
        let runner = state.withLock { state in
            state.stopped = true
            return state.runner
        }
        runner?.cancel()
    }

    /// Stops listening and returns once the connection is closed on the loop (a connection
    /// attempt under way is abandoned) and every subscriber's stream finished; at once when
    /// it never started. A loop of its own has ended too.
    public func close() async {
        let (neverStarted, runner) = state.withLock { state -> (Bool, Task<Void, Never>?) in
            state.stopped = true
            defer { state.started = true }  // a later `start()` does nothing
            return (!state.started, state.runner)
        }
        if neverStarted {
            finishSubscribers()
        } else {
            runner?.cancel()
            await runner?.value
        }
        await ownLoop?.close()
    }

    private func finishSubscribers() {
        let subscribers = state.withLock { state -> [ListenerState.Subscriber] in
            state.listening = false
            defer { state.subscribers.removeAll() }
            return Array(state.subscribers.values)
        }
        for subscriber in subscribers { subscriber.continuation.finish() }
    }

    private func deliver(_ event: PostgresListenerEvent) {
        let subscribers = state.withLock { Array($0.subscribers.values) }
        for subscriber in subscribers {
            if case .notification(let notification) = event, let channels = subscriber.channels,
                !channels.contains(notification.channel)
            {
                continue
            }
            // A full buffer drops the oldest event: tell that subscriber it missed some (the
            // `.listening` then itself is the newest, so it is kept).
            if case .dropped = subscriber.continuation.yield(event), event != .listening {
                subscriber.continuation.yield(.listening)
            }
        }
    }

    // MARK: - On the loop

    /// Connects, listens until the connection breaks, and again, until cancelled (`stop`).
    private func run() async {
        await withTaskCancellationHandler {
            await listenWhileRunning()
        } onCancel: {
            Task(executorPreference: loop) { self.interrupt() }
        }
        current?.close()
        current = nil
        finishSubscribers()
        if let ownLoop { Task.detached { await ownLoop.close() } }
    }

    private func listenWhileRunning() async {
        var backoffMilliseconds: UInt64 = 100
        while !Task.isCancelled {
            let connection: PostgresLoopConnection
            do {
                connection = try await PostgresConnecting.open(
                    configuration, on: loop, clock: PostgresLoopPool.monotonicClock)
                current = connection
                // Set before `LISTEN`: what arrives with its answer is delivered, not dropped.
                connection.notificationHandler = { [weak self] in self?.deliver(.notification($0)) }
                let statements = try channels.map {
                    PostgresStatement("LISTEN \(try connection.connection.quoteIdentifier($0))")
                }
                try await connection.pipeline(statements)
            } catch {
                current?.close()
                current = nil
                if Task.isCancelled { break }
                logger.warning(
                    "notification listener cannot connect, retrying",
                    metadata: ["error": "\(error)", "retry_ms": "\(backoffMilliseconds)"])
                await pause(nanoseconds: backoffMilliseconds * 1_000_000)
                backoffMilliseconds = min(backoffMilliseconds * 2, 5000)
                continue
            }
            backoffMilliseconds = 100
            connection.lossHandler = { [weak self] in self?.wake() }
            state.withLock {
                $0.listening = true
                $0.sessions += 1
            }
            logger.debug("listening for notifications", metadata: ["channels": "\(channels)"])
            deliver(.listening)
            await pause(nanoseconds: nil)  // until the connection breaks or the listener stops
            state.withLock { $0.listening = false }
            connection.close()
            current = nil
            if !Task.isCancelled { logger.warning("notification listener lost its connection, reconnecting") }
        }
    }

    /// Suspends the listening task until `wake()`, the listener stops, or `nanoseconds` (if
    /// given) have passed.
    private func pause(nanoseconds: UInt64?) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            if Task.isCancelled || current?.isBroken == true { return continuation.resume() }
            wakeup = continuation
            if let nanoseconds {
                backoffTimer = Task(executorPreference: loop) { [weak self] in
                    try? await Task.sleep(nanoseconds: nanoseconds)
                    guard !Task.isCancelled else { return }
                    self?.wake()
                }
            }
        }
        backoffTimer?.cancel()
        backoffTimer = nil
    }

    private func wake() {
        let paused = wakeup
        wakeup = nil
        paused?.resume()
    }

    /// The listener stops: a `LISTEN` under way fails, a pause ends.
    private func interrupt() {
        current?.close()
        wake()
    }
}

final class ListenerState: @unchecked Sendable {
    struct Fields {
        var started = false
        var stopped = false
        /// The task on the loop that connects and listens.
        var runner: Task<Void, Never>?
        var listening = false
        /// Connections that reached `LISTEN`.
        var sessions: UInt64 = 0
        var nextID: UInt64 = 0
        var subscribers: [UInt64: Subscriber] = [:]
    }
    /// One `events(channels:)` stream and the channels whose notifications it takes (nil: all).
    struct Subscriber {
        var continuation: AsyncStream<PostgresListenerEvent>.Continuation
        var channels: Set<String>?
    }
    private let lock = NSLock()
    private var fields = Fields()

    func withLock<T>(_ body: (inout Fields) -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body(&fields)
    }
}
