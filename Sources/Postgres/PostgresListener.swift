import CLibPQ
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
/// It runs on a thread of its own, sleeping in `poll(2)` while nothing arrives. When the
/// connection breaks it reconnects (with backoff, up to 5 s between attempts), listens
/// again and tells subscribers with `.listening`.
public final class PostgresListener: Sendable {
    private let configuration: PostgresConfiguration
    private let channels: [String]
    private let logger: Logger
    private let state = ListenerState()
    private let wakePipe: (read: Int32, write: Int32)

    /// Creates a listener; call `start()` to connect.
    public init(_ configuration: PostgresConfiguration, channels: [String], logger: Logger) {
        var config = configuration
        // Notice a dead peer within about a minute even when nothing is sent.
        if config["keepalives_idle"] == nil { config.setParameter("keepalives_idle", "30") }
        if config["keepalives_interval"] == nil { config.setParameter("keepalives_interval", "10") }
        if config["keepalives_count"] == nil { config.setParameter("keepalives_count", "3") }
        self.configuration = config
        self.channels = channels
        self.logger = logger
        var fds: [Int32] = [-1, -1]
        if pipe(&fds) == 0 {
            _ = fcntl(fds[0], F_SETFL, O_NONBLOCK)
            _ = fcntl(fds[1], F_SETFL, O_NONBLOCK)
        }
        wakePipe = (fds[0], fds[1])
    }

    /// Starts the listening thread (once).
    public func start() {
        let first = state.withLock { state -> Bool in
            defer { state.started = true }
            return !state.started
        }
        guard first else { return }
        startThread(name: "pg-listener") { [self] in run() }
    }

    /// Whether the listener is connected and listening right now.
    public var isListening: Bool { state.withLock { $0.listening } }

    /// The connection it listens on now, numbered from 1 (each reconnect counts one more);
    /// nil while not listening. Knowledge built from notifications holds only as long as
    /// this stays the same.
    public var session: UInt64? { state.withLock { $0.listening ? $0.sessions : nil } }

    /// A stream of everything the listener delivers from now on. The buffer is bounded
    /// (newest 10,000 kept); ending the iteration unsubscribes.
    public func events() -> AsyncStream<PostgresListenerEvent> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: PostgresListenerEvent.self, bufferingPolicy: .bufferingNewest(10_000))
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            state.subscribers[state.nextID] = continuation
            return state.nextID
        }
        continuation.onTermination = { [weak state] _ in
            state?.withLock { _ = $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }

    /// Stops listening, closes the connection and finishes every subscriber's stream, without
    /// waiting for the thread (`close()` waits).
    public func stop() {
        state.withLock { $0.stopped = true }
        var byte: UInt8 = 1
        _ = write(wakePipe.write, &byte, 1)
    }

    /// Stops listening and returns once the listening thread has closed its connection and
    /// ended (at once when it never started; a connection attempt under way is waited for).
    public func close() async {
        let neverStarted = state.withLock { state -> Bool in
            state.stopped = true
            defer { state.started = true }  // a later `start()` does nothing
            return !state.started
        }
        if neverStarted {
            let subscribers = state.withLock { state in
                defer { state.subscribers.removeAll() }
                return Array(state.subscribers.values)
            }
            for subscriber in subscribers { subscriber.finish() }
            Glibc.close(wakePipe.read)
            Glibc.close(wakePipe.write)
            return
        }
        var byte: UInt8 = 1
        _ = write(wakePipe.write, &byte, 1)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ended = state.withLock { state -> Bool in
                if !state.ended { state.endWaiters.append(continuation) }
                return state.ended
            }
            if ended { continuation.resume() }
        }
    }

    private var isStopped: Bool { state.withLock { $0.stopped } }

    private func deliver(_ event: PostgresListenerEvent) {
        let subscribers = state.withLock { Array($0.subscribers.values) }
        for subscriber in subscribers {
            // A full buffer drops the oldest event: tell that subscriber it missed some (the
            // `.listening` then itself is the newest, so it is kept).
            if case .dropped = subscriber.yield(event), event != .listening { subscriber.yield(.listening) }
        }
    }

    private func run() {
        var backoffMilliseconds: Int32 = 100
        var connection: PostgresConnection? = nil
        while !isStopped {
            if connection == nil {
                do {
                    let opened = try PostgresConnection.connect(configuration)
                    for channel in channels {
                        try opened.execute("LISTEN \(try opened.quoteIdentifier(channel))")
                    }
                    connection = opened
                    backoffMilliseconds = 100
                    state.withLock {
                        $0.listening = true
                        $0.sessions += 1
                    }
                    logger.debug("listening for notifications", metadata: ["channels": "\(channels)"])
                    deliver(.listening)
                } catch {
                    logger.warning(
                        "notification listener cannot connect, retrying",
                        metadata: ["error": "\(error)", "retry_ms": "\(backoffMilliseconds)"])
                    waitForWake(timeoutMilliseconds: backoffMilliseconds)
                    backoffMilliseconds = min(backoffMilliseconds * 2, 5000)
                    continue
                }
            }
            guard let current = connection else { continue }
            var descriptors = [
                pollfd(fd: current.socket, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wakePipe.read, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(&descriptors, 2, -1)
            if ready < 0 {
                if errno == EINTR { continue }
                logger.error("notification listener poll failed", metadata: ["errno": "\(errno)"])
                waitForWake(timeoutMilliseconds: 1000)
                continue
            }
            if descriptors[1].revents != 0 { drainWakePipe() }
            if descriptors[0].revents != 0 {
                let consumed = PQconsumeInput(current.handle)
                while let notify = PQnotifies(current.handle) {
                    let notification = PostgresNotification(
                        channel: String(cString: notify.pointee.relname),
                        payload: String(cString: notify.pointee.extra))
                    PQfreemem(notify)
                    deliver(.notification(notification))
                }
                if consumed == 0 || !current.isOpen {
                    logger.warning("notification listener lost its connection, reconnecting")
                    state.withLock { $0.listening = false }
                    connection = nil
                }
            }
        }
        connection = nil
        let subscribers = state.withLock { state -> [AsyncStream<PostgresListenerEvent>.Continuation] in
            state.listening = false
            defer { state.subscribers.removeAll() }
            return Array(state.subscribers.values)
        }
        for subscriber in subscribers { subscriber.finish() }
        Glibc.close(wakePipe.read)
        Glibc.close(wakePipe.write)
        let waiters = state.withLock { state in
            state.ended = true
            defer { state.endWaiters.removeAll() }
            return state.endWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    private func waitForWake(timeoutMilliseconds: Int32) {
        var descriptor = pollfd(fd: wakePipe.read, events: Int16(POLLIN), revents: 0)
        if poll(&descriptor, 1, timeoutMilliseconds) > 0 { drainWakePipe() }
    }

    private func drainWakePipe() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(wakePipe.read, &buffer, buffer.count) > 0 {}
    }
}

final class ListenerState: @unchecked Sendable {
    struct Fields {
        var started = false
        var stopped = false
        /// The thread has closed its connection and is about to end.
        var ended = false
        var endWaiters: [CheckedContinuation<Void, Never>] = []
        var listening = false
        /// Connections that reached `LISTEN`.
        var sessions: UInt64 = 0
        var nextID: UInt64 = 0
        var subscribers: [UInt64: AsyncStream<PostgresListenerEvent>.Continuation] = [:]
    }
    private let lock = NSLock()
    private var fields = Fields()

    func withLock<T>(_ body: (inout Fields) -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body(&fields)
    }
}
