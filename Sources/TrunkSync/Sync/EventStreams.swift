import Foundation
import HTTPServer
import Logging
import Postgres
import Synchronization

/// The live event streams of this instance (`GET /sync/v1/stream`): their limits, and the
/// one ticker that sends every stream's heartbeat and ends streams whose access token
/// expired.
///
/// An open stream is a producer task suspended on its `EventSubscription` (no thread, no
/// database connection), its connection's `HTTPBodyWriter`, and an entry here. When its
/// user's events change (a `NOTIFY` from any instance) it wakes, reads what is new in pages
/// with the pull query, and writes one Server-Sent Events message per event.
///
/// Streams of one user that wait at the same cursor share one query per commit
/// (`SharedPulls`): ten thousand tabs of one account cost the database one select, and the
/// page's bytes are shared by every writer until the loop copies them into its sockets.
public final class EventStreams: Sendable {
    /// Limits and timing (`TRUNK_SYNC_STREAM_*`).
    public struct Settings: Sendable {
        /// Seconds between `: keep-alive` comments. Default 15.
        public var heartbeat = 15
        /// Most open streams per user; more are answered `429`. Default 10.
        public var maxPerUser = 10
        /// Most open streams on this instance; more are answered `429`. Default 5,000.
        public var maxTotal = 5_000
        /// Bytes a stream may have written and not yet sent before a live event ends it
        /// (its client reads too slowly). Default 256 KiB.
        public var bufferBytes = 256 * 1024
        /// Events per page read from the database. Default 100.
        public var pageSize = 100
        /// The `retry:` sent at the start: milliseconds a browser waits before reconnecting.
        public var retryMilliseconds = 1000

        /// The defaults.
        public init() {}
    }

    /// Why a stream ended, for its log line and its metric.
    enum End: String, Sendable {
        case expired = "token_expired"
        case revoked = "session_revoked"
        case slowReader = "slow_reader"
        case shutdown
        case clientGone = "client_gone"
        case databaseError = "database_error"
    }

    /// An open stream as the ticker sees it.
    final class Entry: Sendable {
        let id: UInt64
        let user: UUID
        let expiresAt: Int64
        let writer: HTTPBodyWriter
        let subscription: EventSubscription
        /// Set by the ticker (expiry, a heartbeat that did not fit); the producer ends on it.
        let ended = Mutex<End?>(nil)

        init(id: UInt64, user: UUID, expiresAt: Int64, writer: HTTPBodyWriter, subscription: EventSubscription) {
            self.id = id
            self.user = user
            self.expiresAt = expiresAt
            self.writer = writer
            self.subscription = subscription
        }

        /// Ends the stream at the producer's next look.
        func end(_ reason: End) {
            ended.withLock { if $0 == nil { $0 = reason } }
            subscription.wake()
        }
    }

    private struct State {
        var perUser: [UUID: Int] = [:]
        var total = 0
        var open: [UInt64: Entry] = [:]
        var nextID: UInt64 = 0
        var ticker: Task<Void, Never>? = nil
        var closed = false
    }

    let settings: Settings
    let store: EventStore
    let notifier: EventNotifier
    let revocations: SessionRevocations?
    let metrics: Metrics
    let logger: Logger
    let pulls: SharedPulls
    private let state = Mutex(State())
    private let opened: Counter
    private let streamed: Counter
    private let endedCounts: [End: Counter]

    /// Streams over `store`, woken by `notifier`; `revocations` ends a signed-out session's
    /// streams.
    public init(
        settings: Settings, store: EventStore, notifier: EventNotifier, revocations: SessionRevocations?,
        metrics: Metrics, logger: Logger
    ) {
        self.settings = settings
        self.store = store
        self.notifier = notifier
        self.revocations = revocations
        self.metrics = metrics
        self.logger = logger
        pulls = SharedPulls(store: store, notifier: notifier)
        opened = metrics.counter("trunk_sync_streams_opened_total", help: "Event streams opened.")
        streamed = metrics.counter("trunk_sync_events_streamed_total", help: "Events sent on event streams.")
        var counts: [End: Counter] = [:]
        for reason in [End.expired, .revoked, .slowReader, .shutdown, .clientGone, .databaseError] {
            counts[reason] = metrics.counter(
                "trunk_sync_streams_ended_total", help: "Event streams ended, by reason.",
                labels: "reason=\"\(reason.rawValue)\"")
        }
        endedCounts = counts
        metrics.gauge("trunk_sync_streams_open", help: "Event streams open now.") { [weak self] in
            Double(self?.openCount ?? 0)
        }
    }

    /// Streams open now.
    public var openCount: Int { state.withLock { $0.total } }

    // MARK: - Slots

    /// Takes a slot for a stream of `user`, or throws `429` (per user, then per server).
    func reserve(for user: UUID) throws(APIError) {
        let refusal = state.withLock { state -> APIError? in
            if state.closed { return Self.shuttingDown }
            if state.total >= settings.maxTotal { return Self.tooManyOnServer }
            let mine = state.perUser[user, default: 0]
            if mine >= settings.maxPerUser { return Self.tooManyForUser(settings.maxPerUser) }
            state.perUser[user] = mine + 1
            state.total += 1
            return nil
        }
        if let refusal { throw refusal }
    }

    /// Gives back a slot taken by `reserve` (and forgets the stream's entry, if any).
    func release(for user: UUID, entry: Entry?) {
        state.withLock { state in
            if let entry { state.open.removeValue(forKey: entry.id) }
            state.total -= 1
            let mine = state.perUser[user, default: 1] - 1
            if mine <= 0 { state.perUser.removeValue(forKey: user) } else { state.perUser[user] = mine }
        }
    }

    static func tooManyForUser(_ limit: Int) -> APIError {
        APIError(
            status: 429, code: "too_many_streams",
            message: "This account has \(limit) event streams open already; close one and retry.", retryAfter: 5)
    }

    static let tooManyOnServer = APIError(
        status: 429, code: "too_many_streams",
        message: "The server has as many event streams as it takes; retry later.",
        retryAfter: 5)

    static let shuttingDown = APIError(
        status: 503, code: "shutting_down", message: "The server is shutting down; retry.", retryAfter: 1)

    // MARK: - Registry and ticker

    /// Registers an open stream for the ticker (heartbeats, token expiry).
    func register(user: UUID, expiresAt: Int64, writer: HTTPBodyWriter, subscription: EventSubscription) -> Entry {
        opened.increment()
        return state.withLock { state in
            state.nextID += 1
            let entry = Entry(
                id: state.nextID, user: user, expiresAt: expiresAt, writer: writer, subscription: subscription)
            state.open[entry.id] = entry
            if state.ticker == nil, !state.closed {
                state.ticker = Task { [weak self] in await self?.tick() }
            }
            return entry
        }
    }

    func recordEnd(_ reason: End) { endedCounts[reason]?.increment() }

    /// Once a second: ends the streams whose token expired; every `heartbeat` seconds, a
    /// comment on every stream (one that has no room for it is too far behind: it ends).
    private func tick() async {
        var lastHeartbeat = monotonicNanoseconds()
        let period = UInt64(settings.heartbeat) * 1_000_000_000
        let heartbeat = Array(": keep-alive\n\n".utf8)
        while !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(min(1000, settings.heartbeat * 1000)))
            let entries = state.withLock { Array($0.open.values) }
            let now = AuthService.now()
            let beat = monotonicNanoseconds() &- lastHeartbeat >= period
            if beat { lastHeartbeat = monotonicNanoseconds() }
            for entry in entries {
                if now >= entry.expiresAt {
                    entry.end(.expired)
                } else if beat, entry.writer.writeIfRoom(heartbeat) == .full {
                    entry.end(.slowReader)
                }
            }
        }
    }

    // MARK: - One stream

    /// What a stream starts from: decided (and its first page read) by the handler, before
    /// the response head, so that a refusal or a database failure is still an HTTP answer.
    struct Start: Sendable {
        var user: UUID
        var session: UUID
        var expiresAt: Int64
        var subscription: EventSubscription
        var firstPage: EventStore.Page
        var cursor: Int64
    }

    /// The producer of one stream: `retry:`, the backlog, then each commit's events, until
    /// the token expires, the session is revoked, the client falls behind or goes away, or
    /// the server shuts down. Always ends the body cleanly (the client resumes with
    /// `Last-Event-ID`) and gives its slot back.
    func run(_ start: Start, writer: HTTPBodyWriter) async {
        let entry = register(
            user: start.user, expiresAt: start.expiresAt, writer: writer, subscription: start.subscription)
        var end = End.clientGone
        defer {
            start.subscription.cancel()
            release(for: start.user, entry: entry)
            recordEnd(end)
            writer.finish()
            logger.debug("event stream ended", metadata: ["reason": "\(end.rawValue)", "user_id": "\(start.user)"])
        }
        _ = writer.writeIfRoom(Array("retry: \(settings.retryMilliseconds)\n\n".utf8))
        var page = start.firstPage
        var cursor = start.cursor
        var live = false
        var generation: UInt64 = 0
        while true {
            if page.count > 0 {
                if live {
                    // Live events go to every stream at once: one that has no room for them
                    // is too far behind to buffer for; it ends and resumes from its last id.
                    switch writer.writeIfRoom(page.eventsJSON) {
                    case .written: break
                    case .full:
                        end = .slowReader
                        return
                    case .closed:
                        end = Task.isCancelled ? .shutdown : .clientGone
                        return
                    }
                } else {
                    // The backlog goes at the client's pace, a page at a time.
                    do {
                        try await writer.write(page.eventsJSON)
                    } catch {
                        end = Task.isCancelled ? .shutdown : .clientGone
                        return
                    }
                }
                cursor = page.lastSeq ?? cursor
                streamed.increment(by: page.count)
            }
            if !page.hasMore {
                live = true
                generation = await start.subscription.next()
            }
            if Task.isCancelled {
                end = .shutdown
                return
            }
            if let reason = entry.ended.withLock({ $0 }) {
                end = reason
                return
            }
            if revocations?.isRevoked(start.session) == true {
                end = .revoked
                return
            }
            if writer.isClosed { return }
            do {
                page = try await pulls.page(
                    for: start.user, after: cursor, limit: settings.pageSize, notBefore: live ? generation : 0)
            } catch {
                if Task.isCancelled {
                    end = .shutdown
                } else {
                    end = .databaseError
                    logger.warning("event stream ended by a database error", metadata: ["error": "\(error)"])
                }
                return
            }
        }
    }

    /// No new streams from now on; stops the ticker (open streams end with the HTTP
    /// server's shutdown, which cancels them).
    func close() {
        let ticker = state.withLock { state in
            state.closed = true
            defer { state.ticker = nil }
            return state.ticker
        }
        ticker?.cancel()
    }
}

/// Pulls shared by the streams of one user waiting at the same cursor: a stream woken by a
/// commit joins a pull of its user's events after its cursor only if that pull started
/// after the wake-up (so it sees the commit); otherwise it starts one, which later wakers
/// join.
final class SharedPulls: Sendable {
    private struct Key: Hashable {
        var user: UUID
        var after: Int64
        var limit: Int
    }

    private struct Pull {
        var generation: UInt64
        var task: Task<EventStore.Page, any Error>
    }

    private let store: EventStore
    private let notifier: EventNotifier
    private let inFlight = Mutex<[Key: Pull]>([:])

    init(store: EventStore, notifier: EventNotifier) {
        self.store = store
        self.notifier = notifier
    }

    /// `user`'s events after `after` as Server-Sent Events, read no earlier than the
    /// notifier's wake-up `generation`.
    func page(for user: UUID, after: Int64, limit: Int, notBefore generation: UInt64) async throws
        -> EventStore.Page
    {
        let key = Key(user: user, after: after, limit: limit)
        let task = inFlight.withLock { pulls -> Task<EventStore.Page, any Error> in
            if let pull = pulls[key], pull.generation >= generation { return pull.task }
            // The generation is read under the lock and before the query starts: a wake-up
            // counted after this may have been missed by it, and its streams start another.
            let started = notifier.generation
            let task = Task { [store, weak self] in
                defer { self?.finished(key, started) }
                return try await store.pull(for: user, after: after, limit: limit, framing: .serverSentEvents)
            }
            pulls[key] = Pull(generation: started, task: task)
            return task
        }
        return try await task.value
    }

    private func finished(_ key: Key, _ generation: UInt64) {
        inFlight.withLock { pulls in
            if pulls[key]?.generation == generation { pulls.removeValue(forKey: key) }
        }
    }

    /// Pulls in flight now (for tests).
    var inFlightCount: Int { inFlight.withLock { $0.count } }
}
