import Foundation
import HTTPServer
import Logging
import Postgres
import Synchronization

/// The live event streams of this instance (`GET /sync/v1/stream`): their limits, and the
/// one ticker that sends every stream's heartbeat and ends streams whose access token
/// expired.
///
/// A stream's producer writes its backlog itself, then parks in its user's `LiveHub`: an
/// open, idle stream is a suspended continuation (no thread, no database connection), its
/// connection's `HTTPBodyWriter`, and an entry here. When the user's events change (a
/// `NOTIFY` from any instance) the hub — one task per user with streams — reads what is new
/// once per cursor its streams wait at, and writes the page into each of their writers: ten
/// thousand tabs of one account cost one select and no task wake-up each, and the page's
/// bytes are shared by every writer until the loop copies them into its sockets. A parked
/// stream is handed back to its producer only to end.
public final class EventStreams: Sendable {
    /// Limits and timing (`TRUNK_SYNC_STREAM_*`).
    public struct Settings: Sendable {
        /// Seconds between `: keep-alive` comments. Default: setting `stream_heartbeat`.
        public var heartbeat = Setting.streamHeartbeat.integerDefault
        /// Most open streams per user; more are answered `429`. Default: setting `stream_max_per_user`.
        public var maxPerUser = Setting.streamMaxPerUser.integerDefault
        /// Most open streams on this instance; more are answered `429`. Default: setting `stream_max`.
        public var maxTotal = Setting.streamMax.integerDefault
        /// Bytes a stream may have written and not yet sent before a live event ends it
        /// (its client reads too slowly). Default: setting `stream_buffer`.
        public var bufferBytes = Setting.streamBuffer.integerDefault
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

    /// An open stream as the ticker and its hub see it.
    final class Entry: Sendable {
        let id: UInt64
        let session: UUID
        let expiresAt: Int64
        let writer: HTTPBodyWriter
        let hub: LiveHub
        /// Set by the ticker (expiry) or a revocation; the producer ends on it.
        let ended = Mutex<End?>(nil)
        /// The task writing the backlog, while it runs: ending the stream cancels it, so a
        /// backlog waiting for a slow reader (or for the database) ends at once too.
        private let backlog = Mutex<Task<EventStreams.Backlog, Never>?>(nil)

        init(id: UInt64, session: UUID, expiresAt: Int64, writer: HTTPBodyWriter, hub: LiveHub) {
            self.id = id
            self.session = session
            self.expiresAt = expiresAt
            self.writer = writer
            self.hub = hub
        }

        /// Ends the stream: at once, whether it is parked or still writing its backlog.
        func end(_ reason: End) {
            ended.withLock { if $0 == nil { $0 = reason } }
            backlog.withLock { $0 }?.cancel()
            hub.unpark(id, reason)
        }

        /// Follows `task`, the stream's backlog, until it returns (cancelled at once if the
        /// stream has ended already).
        func follow(_ task: Task<EventStreams.Backlog, Never>) async -> EventStreams.Backlog {
            backlog.withLock { $0 = task }
            if ended.withLock({ $0 }) != nil { task.cancel() }
            defer { backlog.withLock { $0 = nil } }
            return await withTaskCancellationHandler { await task.value } onCancel: { task.cancel() }
        }

        /// Whether the stream's session was signed out (or its account deleted).
        func isRevoked(_ revocations: SessionRevocations?) -> Bool { revocations?.isRevoked(session) ?? false }
    }

    private struct State {
        var perUser: [UUID: Int] = [:]
        var total = 0
        var open: [UInt64: Entry] = [:]
        /// Each user's hub, while the user has streams (counted by `perUser`).
        var hubs: [UUID: LiveHub] = [:]
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
    /// Returns the user's hub (started with the user's first stream).
    @discardableResult
    func reserve(for user: UUID) throws(APIError) -> LiveHub {
        let (hub, refusal) = state.withLock { state -> (LiveHub?, APIError?) in
            if state.closed { return (nil, Self.shuttingDown) }
            if state.total >= settings.maxTotal { return (nil, Self.tooManyOnServer) }
            let mine = state.perUser[user, default: 0]
            if mine >= settings.maxPerUser { return (nil, Self.tooManyForUser(settings.maxPerUser)) }
            state.perUser[user] = mine + 1
            state.total += 1
            if let hub = state.hubs[user] { return (hub, nil) }
            let hub = LiveHub(user: user, streams: self)
            state.hubs[user] = hub
            return (hub, nil)
        }
        if let refusal { throw refusal }
        guard let hub else { throw APIError.internalError }
        hub.start()
        return hub
    }

    /// Gives back a slot taken by `reserve` (and forgets the stream's entry, if any); the
    /// user's last stream stops the hub.
    func release(for user: UUID, entry: Entry?) {
        if let entry { entry.hub.leave(entry) }
        let idle = state.withLock { state -> LiveHub? in
            if let entry { state.open.removeValue(forKey: entry.id) }
            state.total -= 1
            let mine = state.perUser[user, default: 1] - 1
            if mine > 0 {
                state.perUser[user] = mine
                return nil
            }
            state.perUser.removeValue(forKey: user)
            return state.hubs.removeValue(forKey: user)
        }
        idle?.stop()
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

    /// Registers an open stream for the ticker (heartbeats, token expiry, revocation) and
    /// its hub (revocation).
    func register(session: UUID, expiresAt: Int64, writer: HTTPBodyWriter, hub: LiveHub) -> Entry {
        opened.increment()
        let entry = state.withLock { state in
            state.nextID += 1
            let entry = Entry(id: state.nextID, session: session, expiresAt: expiresAt, writer: writer, hub: hub)
            state.open[entry.id] = entry
            if state.ticker == nil, !state.closed {
                state.ticker = Task { [weak self] in await self?.tick() }
            }
            return entry
        }
        hub.join(entry)
        return entry
    }

    func recordEnd(_ reason: End) { endedCounts[reason]?.increment() }

    func recordStreamed(_ count: Int) { streamed.increment(by: count) }

    /// Once a second: ends the streams whose token expired; every `heartbeat` seconds, a
    /// comment on every stream (not on one whose buffer is full: bytes are on their way to
    /// that client already, and a backlog read at the client's pace is no reason to end).
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
                } else if entry.isRevoked(revocations) {
                    // Usually ended by the revocation's wake-up already (`LiveHub`).
                    entry.end(.revoked)
                } else if beat {
                    _ = entry.writer.writeIfRoom(heartbeat)
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
        var hub: LiveHub
        var firstPage: SharedPulls.Result
        var cursor: Int64
    }

    /// The producer of one stream: `retry:`, the backlog at the client's pace, then parked in
    /// its hub, which writes each commit's events, until the token expires, the session is
    /// revoked, the client falls behind or goes away, or the server shuts down — in the
    /// backlog as when live: the backlog is a task of its own that ending the stream cancels.
    /// Always ends the body cleanly (the client resumes with `Last-Event-ID`) and gives its
    /// slot back.
    func run(_ start: Start, writer: HTTPBodyWriter) async {
        let entry = register(session: start.session, expiresAt: start.expiresAt, writer: writer, hub: start.hub)
        var end = End.clientGone
        defer {
            release(for: start.user, entry: entry)
            recordEnd(end)
            writer.finish()
            logger.debug("event stream ended", metadata: ["reason": "\(end.rawValue)", "user_id": "\(start.user)"])
        }
        _ = writer.writeIfRoom(Array("retry: \(settings.retryMilliseconds)\n\n".utf8))
        switch await entry.follow(Task { await backlog(start, entry: entry, writer: writer) }) {
        case .ended(let reason):
            end = reason
        case .caughtUp(let cursor, let generation):
            // Live: the hub writes from now on; the stream is handed back only to end.
            end = await start.hub.park(entry, at: cursor, readAt: generation)
        }
    }

    /// How a stream's backlog ended.
    enum Backlog: Sendable {
        /// Written up to `cursor`, as read at the notifier's `generation`.
        case caughtUp(cursor: Int64, generation: UInt64)
        case ended(End)
    }

    /// Writes the backlog at the client's pace, a page at a time. Cancelled: the stream ended
    /// (`entry.ended` says why) or the server is shutting down.
    private func backlog(_ start: Start, entry: Entry, writer: HTTPBodyWriter) async -> Backlog {
        var result = start.firstPage
        var cursor = start.cursor
        while true {
            if result.page.count > 0 {
                do {
                    try await writer.write(result.page.eventsJSON, inPiecesOf: settings.bufferBytes)
                } catch {
                    return .ended(entry.ended.withLock({ $0 }) ?? (Task.isCancelled && !writer.isClosed ? .shutdown : .clientGone))
                }
                cursor = result.page.lastSeq ?? cursor
                recordStreamed(result.page.count)
            }
            if let reason = entry.ended.withLock({ $0 }) { return .ended(reason) }
            if !result.page.hasMore { break }
            do {
                result = try await pulls.page(for: start.user, after: cursor, limit: settings.pageSize, notBefore: 0)
            } catch {
                return .ended(entry.ended.withLock({ $0 }) ?? endAfterFailure(error))
            }
        }
        return .caughtUp(cursor: cursor, generation: result.generation)
    }

    /// Why a stream ends after a failed read.
    func endAfterFailure(_ error: any Error) -> End {
        if Task.isCancelled { return .shutdown }
        logger.warning("event stream ended by a database error", metadata: ["error": "\(error)"])
        return .databaseError
    }

    /// No new streams from now on; stops the ticker and the hubs (open streams end with the
    /// HTTP server's shutdown, which cancels them).
    func close() {
        let (ticker, hubs) = state.withLock { state in
            state.closed = true
            defer { state.ticker = nil }
            return (state.ticker, Array(state.hubs.values))
        }
        ticker?.cancel()
        for hub in hubs { hub.stopFollowing() }
    }
}

/// Reads of one user's events after one cursor, shared while in flight: a reader that
/// answers a wake-up joins a read only if it started after that wake-up (so it sees the
/// commit); otherwise it starts one, which later readers join.
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

    /// A page and the notifier's generation when its read started: it holds every commit
    /// whose wake-up had that generation or an earlier one.
    struct Result: Sendable {
        var page: EventStore.Page
        var generation: UInt64
    }

    /// `user`'s events after `after` as Server-Sent Events, read no earlier than the
    /// notifier's wake-up `generation`.
    func page(for user: UUID, after: Int64, limit: Int, notBefore generation: UInt64) async throws -> Result {
        let key = Key(user: user, after: after, limit: limit)
        let (task, started) = inFlight.withLock { pulls -> (Task<EventStore.Page, any Error>, UInt64) in
            if let pull = pulls[key], pull.generation >= generation { return (pull.task, pull.generation) }
            // The generation is read under the lock and before the query starts: a wake-up
            // counted after this may have been missed by it, and its streams start another.
            let started = notifier.generation
            let task = Task { [store, weak self] in
                defer { self?.finished(key, started) }
                return try await store.pull(for: user, after: after, limit: limit, framing: .serverSentEvents)
            }
            pulls[key] = Pull(generation: started, task: task)
            return (task, started)
        }
        return Result(page: try await task.value, generation: started)
    }

    private func finished(_ key: Key, _ generation: UInt64) {
        inFlight.withLock { pulls in
            if pulls[key]?.generation == generation { pulls.removeValue(forKey: key) }
        }
    }

    /// Pulls in flight now (for tests).
    var inFlightCount: Int { inFlight.withLock { $0.count } }
}

/// One user's live streams on this instance: parked at their cursors, written to by one
/// task when the user's events change (a commit on any instance, a revoked session, the
/// listener reconnecting), and handed back to their producers only to end.
final class LiveHub: Sendable {
    private struct Parked {
        var entry: EventStreams.Entry
        var cursor: Int64
        var continuation: CheckedContinuation<EventStreams.End, Never>
    }

    private struct State {
        var parked: [UInt64: Parked] = [:]
        /// Every open stream of the user here, parked or still writing its backlog.
        var members: [UInt64: EventStreams.Entry] = [:]
        var task: Task<Void, Never>? = nil
        var stopped = false
    }

    let user: UUID
    private let streams: EventStreams
    private let subscription: EventSubscription
    private let state = Mutex(State())

    init(user: UUID, streams: EventStreams) {
        self.user = user
        self.streams = streams
        subscription = streams.notifier.subscribe(to: user)
    }

    /// Starts the task that follows the user's wake-ups (once).
    func start() {
        state.withLock { state in
            guard state.task == nil, !state.stopped else { return }
            state.task = Task { [self] in
                while !Task.isCancelled {
                    await subscription.next()
                    // Shutdown wakes every subscription: the streams end, nothing is read.
                    if Task.isCancelled || streams.notifier.isShutDown { break }
                    endRevoked()
                    await fanOut()
                }
            }
        }
    }

    /// A stream of the user opened here.
    func join(_ entry: EventStreams.Entry) { state.withLock { $0.members[entry.id] = entry } }

    /// The stream ended.
    func leave(_ entry: EventStreams.Entry) { state.withLock { _ = $0.members.removeValue(forKey: entry.id) } }

    /// Ends the user's streams whose session was revoked (a revocation wakes the hub),
    /// parked or still writing their backlog.
    private func endRevoked() {
        // Nothing revoked on this instance (the usual case): no stream to look at.
        guard let revocations = streams.revocations, revocations.count > 0 else { return }
        var revoked = RevokedSessions(revocations)
        for entry in state.withLock({ Array($0.members.values) }) where revoked.contains(entry.session) {
            entry.end(.revoked)
        }
    }

    /// Stops reading for the parked streams (shutdown: they end when the HTTP server
    /// cancels them).
    func stopFollowing() {
        state.withLock { $0.task }?.cancel()
    }

    /// The user's last stream ended: stops following (streams parked meanwhile end).
    func stop() {
        let (task, parked) = state.withLock { state in
            state.stopped = true
            defer {
                state.task = nil
                state.parked = [:]
            }
            return (state.task, Array(state.parked.values))
        }
        task?.cancel()
        subscription.cancel()
        for stream in parked { stream.continuation.resume(returning: .shutdown) }
    }

    /// Parks a stream whose backlog up to `cursor` is written, read at the notifier's
    /// `generation`; returns why it ends. A wake-up counted after that read may have been
    /// missed by it: then the hub looks at once.
    func park(_ entry: EventStreams.Entry, at cursor: Int64, readAt generation: UInt64) async -> EventStreams.End {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<EventStreams.End, Never>) in
                let ended: EventStreams.End? = state.withLock { state in
                    if state.stopped { return .shutdown }
                    if Task.isCancelled { return entry.writer.isClosed ? .clientGone : .shutdown }
                    if let reason = entry.ended.withLock({ $0 }) { return reason }
                    state.parked[entry.id] = Parked(entry: entry, cursor: cursor, continuation: continuation)
                    return nil
                }
                if let ended {
                    continuation.resume(returning: ended)
                } else if streams.notifier.generation > generation {
                    subscription.wake()
                }
            }
        } onCancel: {
            // The connection closed (the writer says so) or the server is shutting down.
            unpark(entry.id, entry.writer.isClosed ? .clientGone : .shutdown)
        }
    }

    /// Hands a parked stream back to its producer to end (no effect if it is not parked).
    func unpark(_ id: UInt64, _ reason: EventStreams.End) {
        state.withLock { $0.parked.removeValue(forKey: id) }?.continuation.resume(returning: reason)
    }

    /// Writes `page` to `entries` (parked streams of one loop, on that loop's thread);
    /// returns how many took it.
    private func write(_ page: EventStore.Page, to entries: [EventStreams.Entry]) -> Int {
        var moved: [UInt64] = []
        moved.reserveCapacity(entries.count)
        // This loop's own copy of the bytes: every writer of the loop shares it, and no
        // reference count is bumped by two threads at once (one copy per loop, not per stream).
        let bytes = page.eventsJSON.withUnsafeBufferPointer { Array($0) }
        var revoked = streams.revocations.map(RevokedSessions.init)
        for entry in entries {
            if revoked?.contains(entry.session) == true {
                unpark(entry.id, .revoked)
                continue
            }
            guard page.count > 0 else { continue }
            // Live events go to every stream at once: one that has no room for them is
            // too far behind to buffer for; it ends and resumes from its last id.
            switch entry.writer.writeIfRoom(bytes) {
            case .written: moved.append(entry.id)
            case .full: unpark(entry.id, .slowReader)
            case .closed: unpark(entry.id, entry.writer.isClosed ? .clientGone : .shutdown)
            }
        }
        if let lastSeq = page.lastSeq, !moved.isEmpty {
            state.withLock { state in
                // In place (see `cursor(of:)`).
                for id in moved {
                    if let index = state.parked.index(forKey: id) { state.parked.values[index].cursor = lastSeq }
                }
            }
        }
        return moved.count
    }

    /// A parked stream's cursor, read in place. `Parked` holds a `CheckedContinuation`, whose
    /// layout this module does not know: reading a `Parked` out of the table copies it whole
    /// through its value witnesses (its entry and continuation retained and released), once
    /// per stream per commit. Through the table's modify access (unique under the hub's lock)
    /// nothing is copied.
    private static func cursor(of parked: inout Parked) -> Int64 { parked.cursor }

    /// A parked stream's entry, read in place (see `cursor(of:)`).
    private static func entry(of parked: inout Parked) -> EventStreams.Entry { parked.entry }

    /// Writes what is new to every parked stream: one read per cursor they wait at (all at
    /// the same one, usually), the page's bytes shared by every writer.
    private func fanOut() async {
        let generation = streams.notifier.generation
        var seen = Set<Int64>()
        while true {
            // The streams at one cursor not read for yet (all of them, usually), read in place.
            let group = state.withLock { state -> (cursor: Int64, ids: [UInt64])? in
                var cursor: Int64? = nil
                var ids: [UInt64] = []
                // Index by index (not `indices`, which would hold the table and make the
                // in-place read copy it).
                var index = state.parked.startIndex
                while index != state.parked.endIndex {
                    defer { state.parked.formIndex(after: &index) }
                    let at = Self.cursor(of: &state.parked.values[index])
                    if cursor == nil {
                        if seen.contains(at) { continue }
                        cursor = at
                        ids.reserveCapacity(state.parked.count)
                    }
                    if at == cursor { ids.append(state.parked.keys[index]) }
                }
                return cursor.map { ($0, ids) }
            }
            guard let (cursor, ids) = group else { return }
            seen.insert(cursor)
            let result: SharedPulls.Result
            do {
                result = try await streams.pulls.page(
                    for: user, after: cursor, limit: streams.settings.pageSize, notBefore: generation)
            } catch {
                let reason = streams.endAfterFailure(error)
                for id in ids { unpark(id, reason) }
                continue
            }
            let page = result.page
            // Each loop writes its own connections' streams (and then sends them): a commit
            // to many streams on N loops is copied and sent by N threads in parallel. A
            // handful of loops: found by a look along them, not by hashing per stream.
            let byLoop = state.withLock { state in
                var byLoop: [(loop: LoopExecutor?, entries: [EventStreams.Entry])] = []
                for id in ids {
                    guard let index = state.parked.index(forKey: id) else { continue }
                    let entry = Self.entry(of: &state.parked.values[index])
                    let loop = entry.writer.loop
                    if let at = byLoop.firstIndex(where: { $0.loop === loop }) {
                        byLoop[at].entries.append(entry)
                    } else {
                        byLoop.append((loop, [entry]))
                    }
                }
                return byLoop
            }
            let written = await withTaskGroup(of: Int.self) { group in
                for (loop, members) in byLoop {
                    group.addTask(executorPreference: loop) { self.write(page, to: members) }
                }
                return await group.reduce(0, +)
            }
            streams.recordStreamed(written * page.count)
            // Read after the wake-up and complete: streams now at its end are up to date.
            if !page.hasMore, let lastSeq = page.lastSeq { seen.insert(lastSeq) }
        }
    }
}

/// Whether sessions are revoked, for one pass over a user's streams: each distinct session is
/// looked up once (the revocation table's lock is shared by every loop), and the streams of
/// one session — most of a user's, in a row — cost a comparison.
struct RevokedSessions {
    private let revocations: SessionRevocations
    private var known: [UUID: Bool] = [:]
    private var last: (session: UUID, revoked: Bool)? = nil

    init(_ revocations: SessionRevocations) { self.revocations = revocations }

    mutating func contains(_ session: UUID) -> Bool {
        if let last, last.session == session { return last.revoked }
        let revoked = known[session] ?? revocations.isRevoked(session)
        known[session] = revoked
        last = (session, revoked)
        return revoked
    }
}
