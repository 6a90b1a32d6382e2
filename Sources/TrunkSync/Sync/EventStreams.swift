import Foundation
import HTTPServer
import Logging
import Postgres
import Synchronization

/// The live event streams of this instance (`GET /sync/v1/stream`): their limits, and the
/// one ticker that sends every stream's heartbeat and ends streams whose access token
/// expired.
///
/// A stream's producer writes its backlog itself, then parks the stream in its user's
/// `LiveHub` and returns: an open, idle stream has no task, no thread and no database
/// connection — it is its connection's `HTTPBodyWriter` (detached from the producer), its
/// `Entry` and the hub's note of its cursor. When the user's events change (a `NOTIFY` from
/// any instance) the hub — one task per user with streams — reads what is new once per
/// cursor its streams wait at, and writes the page into each of their writers: ten thousand
/// tabs of one account cost one select and no task wake-up each, and each loop sends one
/// framed copy of the page's bytes to every stream of its own that has nothing waiting.
/// Whoever ends a stream (the ticker, the hub, the connection's close handler, its producer)
/// does so through `Entry.finish(_:)`, once.
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

    /// An open stream: held by its hub (and, while it writes its backlog, its producer),
    /// and by its connection's close handler.
    final class Entry: Sendable {
        let id: UInt64
        let session: UUID
        let expiresAt: Int64
        let writer: HTTPBodyWriter
        let hub: LiveHub
        /// Why it ended, once it has.
        private let ended = Mutex<End?>(nil)
        /// The seq its client has been written up to, once its hub has it parked
        /// (`Int64.min` before: its producer writes its backlog). Set by `LiveHub.park`,
        /// then by the hub's fan-out alone, on the stream's loop: kept here, where that
        /// fan-out is at anyway, not in the hub's table (a lock and two look-ups per stream).
        private let parkedAt = Atomic<Int64>(Int64.min)

        init(id: UInt64, session: UUID, expiresAt: Int64, writer: HTTPBodyWriter, hub: LiveHub) {
            self.id = id
            self.session = session
            self.expiresAt = expiresAt
            self.writer = writer
            self.hub = hub
        }

        /// Why the stream ended; nil while it is open.
        var endReason: End? { ended.withLock { $0 } }

        /// Where the stream is parked; nil while its producer writes its backlog.
        var cursor: Int64? {
            let at = parkedAt.load(ordering: .acquiring)
            return at == Int64.min ? nil : at
        }

        /// Parked at `cursor` (by `LiveHub.park`), or written up to it since (by the hub).
        func park(at cursor: Int64) { parkedAt.store(cursor, ordering: .releasing) }

        /// Ends the stream, whether it is parked or still writing its backlog: gives its
        /// slot back, counts and logs `reason`, and ends the body cleanly (the client resumes
        /// with `Last-Event-ID`). Only the first call does anything.
        func finish(_ reason: End) {
            let first = ended.withLock { ended -> Bool in
                guard ended == nil else { return false }
                ended = reason
                return true
            }
            if first { hub.streams.finished(self, reason) }
        }

        /// Whether the stream's session was signed out (or its account deleted).
        func isRevoked(_ revocations: SessionRevocations?) -> Bool { revocations?.isRevoked(session) ?? false }
    }

    private struct State {
        var perUser: [UUID: Int] = [:]
        var total = 0
        /// Each user's hub, which holds the user's open streams, while the user has streams
        /// (counted by `perUser`).
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

    /// Users with streams open now (each has a hub running; for tests).
    var userCount: Int { state.withLock { $0.hubs.count } }

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

    /// Gives back a slot taken by `reserve` (and takes the stream's entry, if any, from its
    /// hub); the user's last stream stops the hub.
    func release(for user: UUID, entry: Entry?) {
        if let entry { entry.hub.leave(entry) }
        let idle = state.withLock { state -> LiveHub? in
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

    /// Registers an open stream with its hub, where the ticker (heartbeats, token expiry,
    /// revocation) and the hub's wake-ups (events, revocation) find it.
    func register(session: UUID, expiresAt: Int64, writer: HTTPBodyWriter, hub: LiveHub) -> Entry {
        opened.increment()
        let entry = state.withLock { state in
            state.nextID += 1
            let entry = Entry(id: state.nextID, session: session, expiresAt: expiresAt, writer: writer, hub: hub)
            if state.ticker == nil, !state.closed {
                state.ticker = Task { [weak self] in await self?.tick() }
            }
            return entry
        }
        hub.join(entry)
        return entry
    }

    /// What ending `entry` does (`Entry.finish`, once per stream).
    fileprivate func finished(_ entry: Entry, _ reason: End) {
        release(for: entry.hub.user, entry: entry)
        endedCounts[reason]?.increment()
        entry.writer.finish()
        logger.debug("event stream ended", metadata: ["reason": "\(reason.rawValue)", "user_id": "\(entry.hub.user)"])
    }

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
            let hubs = state.withLock { Array($0.hubs.values) }
            let now = AuthService.now()
            let beat = monotonicNanoseconds() &- lastHeartbeat >= period
            if beat { lastHeartbeat = monotonicNanoseconds() }
            for hub in hubs {
                for entry in hub.entries {
                    if now >= entry.expiresAt {
                        entry.finish(.expired)
                    } else if entry.isRevoked(revocations) {
                        // Usually ended by the revocation's wake-up already (`LiveHub`).
                        entry.finish(.revoked)
                    } else if beat {
                        _ = entry.writer.writeIfRoom(heartbeat)
                    }
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

    /// The producer of one stream: `retry:`, the backlog at the client's pace, then it parks
    /// the stream in its hub and returns; the hub writes each commit's events until the token
    /// expires, the session is revoked, the client falls behind or goes away, or the server
    /// shuts down. The stream ends (in the backlog as when parked) through `Entry.finish`,
    /// whoever ends it: the body ends cleanly and the slot is given back.
    func run(_ start: Start, writer: HTTPBodyWriter) async {
        let entry = register(session: start.session, expiresAt: start.expiresAt, writer: writer, hub: start.hub)
        // The connection's end reaches the stream through its writer, not by cancelling this
        // task (which is gone once the stream is parked); the body ends only by `finish`.
        writer.detach { reason in entry.finish(reason == .shutdown ? .shutdown : .clientGone) }
        _ = writer.writeIfRoom(Array("retry: \(settings.retryMilliseconds)\n\n".utf8))
        switch await backlog(start, entry: entry, writer: writer) {
        case .ended(let reason):
            entry.finish(reason)
        case .caughtUp(let cursor, let generation):
            // Live: the hub writes from now on (and ends the stream, or whoever does).
            start.hub.park(entry, at: cursor, readAt: generation)
        }
    }

    /// How a stream's backlog ended.
    enum Backlog: Sendable {
        /// Written up to `cursor`, as read at the notifier's `generation`.
        case caughtUp(cursor: Int64, generation: UInt64)
        case ended(End)
    }

    /// Writes the backlog at the client's pace, a page at a time, until it is written or the
    /// stream ends (a write fails at once when it does: `finish` ends the body).
    private func backlog(_ start: Start, entry: Entry, writer: HTTPBodyWriter) async -> Backlog {
        var result = start.firstPage
        var cursor = start.cursor
        while true {
            if result.page.count > 0 {
                do {
                    try await writer.write(result.page.eventsJSON, inPiecesOf: settings.bufferBytes)
                } catch {
                    return .ended(entry.endReason ?? (Task.isCancelled && !writer.isClosed ? .shutdown : .clientGone))
                }
                cursor = result.page.lastSeq ?? cursor
                recordStreamed(result.page.count)
            }
            if let reason = entry.endReason { return .ended(reason) }
            if !result.page.hasMore { break }
            do {
                result = try await pulls.page(for: start.user, after: cursor, limit: settings.pageSize, notBefore: 0)
            } catch {
                return .ended(entry.endReason ?? endAfterFailure(error))
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
    /// HTTP server's shutdown, which tells their writers' close handlers).
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

/// One user's live streams on this instance, parked at their cursors (or still writing their
/// backlog), written to by one task when the user's events change (a commit on any instance,
/// a revoked session, the listener reconnecting). A parked stream has no task: the hub holds
/// it, and ends it (`Entry.finish`) when it falls behind, its session is revoked, or its
/// read fails.
final class LiveHub: Sendable {
    private struct Member {
        let entry: EventStreams.Entry
        /// Its share (`State.shares`) and its place among that share's entries.
        let share: Int
        var index: Int
    }

    /// The streams of the user whose connections one loop holds (`HTTPBodyWriter.loop`):
    /// what a fan-out's share on that loop walks.
    private struct Share {
        let loop: LoopExecutor?
        var entries: [EventStreams.Entry] = []
    }

    private struct State {
        /// Every open stream of the user here.
        var members: [UInt64: Member] = [:]
        /// The same streams by loop, kept as they join and leave: a fan-out hands each loop
        /// its list as it stands (copied on write), with no pass over the streams to pick them.
        var shares: [Share] = []
        /// A cursor streams are parked at — where the last stream parked, or the end of the
        /// last complete page written — where a fan-out reads first; nil until a stream parks.
        var hint: Int64? = nil
        var task: Task<Void, Never>? = nil
        var stopped = false
    }

    let user: UUID
    let streams: EventStreams
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
    func join(_ entry: EventStreams.Entry) {
        let loop = entry.writer.loop
        state.withLock { state in
            // A handful of loops: found by a look along them, not by hashing.
            let share =
                state.shares.firstIndex { $0.loop === loop }
                ?? {
                    state.shares.append(Share(loop: loop))
                    return state.shares.count - 1
                }()
            state.members[entry.id] = Member(entry: entry, share: share, index: state.shares[share].entries.count)
            state.shares[share].entries.append(entry)
        }
    }

    /// The stream ended: it leaves the members and its loop's share (whose last stream takes
    /// its place).
    func leave(_ entry: EventStreams.Entry) {
        state.withLock { state in
            guard let member = state.members.removeValue(forKey: entry.id) else { return }
            let last = state.shares[member.share].entries.removeLast()
            if member.index < state.shares[member.share].entries.count {
                state.shares[member.share].entries[member.index] = last
                state.members[last.id]?.index = member.index
            }
        }
    }

    /// The streams in the loops' shares, by id, each share's in turn (for tests: every
    /// member is in one, once).
    var sharedIDs: [[UInt64]] { state.withLock { $0.shares.map { $0.entries.map(\.id) } } }

    /// The user's open streams here.
    var entries: [EventStreams.Entry] { state.withLock { $0.members.values.map(\.entry) } }

    /// Ends the user's streams whose session was revoked (a revocation wakes the hub),
    /// parked or still writing their backlog.
    private func endRevoked() {
        // Nothing revoked on this instance (the usual case): no stream to look at.
        guard let revocations = streams.revocations, revocations.count > 0 else { return }
        var revoked = RevokedSessions(revocations)
        for entry in entries where revoked.contains(entry.session) {
            entry.finish(.revoked)
        }
    }

    /// Stops reading for the parked streams (shutdown: they end when the HTTP server tells
    /// their writers).
    func stopFollowing() {
        state.withLock { $0.task }?.cancel()
    }

    /// The user's last stream ended: stops following.
    func stop() {
        let task = state.withLock { state in
            state.stopped = true
            defer { state.task = nil }
            return state.task
        }
        task?.cancel()
        subscription.cancel()
    }

    /// Parks a stream whose backlog up to `cursor` is written, read at the notifier's
    /// `generation` (nothing, if it ended meanwhile). A wake-up counted after that read may
    /// have been missed by it: then the hub looks at once.
    func park(_ entry: EventStreams.Entry, at cursor: Int64, readAt generation: UInt64) {
        let parked = state.withLock { state -> Bool in
            guard state.members[entry.id] != nil else { return false }
            entry.park(at: cursor)
            state.hint = cursor
            return true
        }
        if parked, streams.notifier.generation > generation { subscription.wake() }
    }

    /// Writes `page`, read after `cursor`, to those of `entries` (the streams of one loop, on
    /// that loop's thread) parked at `cursor`; returns how many took it and the lowest other
    /// cursor a stream is parked at that is not in `seen` (nil if none), which the hub reads
    /// for next.
    private func write(
        _ page: EventStore.Page, to entries: [EventStreams.Entry], at cursor: Int64, skipping seen: Set<Int64>
    ) -> (written: Int, other: Int64?) {
        var written = 0
        var other: Int64? = nil
        // This loop's own copy of the bytes: every writer of the loop shares it, and no
        // reference count is bumped by two threads at once (one copy per loop, not per stream).
        let bytes = page.eventsJSON.withUnsafeBufferPointer { Array($0) }
        var revoked = streams.revocations.map(RevokedSessions.init)
        // Written to every stream first, then sent to every socket that had nothing waiting,
        // back to back (`HTTPBodyFanOut`).
        HTTPBodyFanOut.write(bytes) { fanOut in
            for entry in entries {
                // Still writing its backlog, or parked elsewhere: not this page's.
                guard let at = entry.cursor else { continue }
                guard at == cursor else {
                    if !seen.contains(at) { other = Self.lower(other, at) }
                    continue
                }
                if revoked?.contains(entry.session) == true {
                    entry.finish(.revoked)
                    continue
                }
                guard page.count > 0 else { continue }
                // Live events go to every stream at once: one that has no room for them is
                // too far behind to buffer for; it ends and resumes from its last id.
                switch fanOut.writeIfRoom(entry.writer) {
                case .written:
                    written += 1
                    if let lastSeq = page.lastSeq { entry.park(at: lastSeq) }
                case .full: entry.finish(.slowReader)
                // The connection is gone (its close handler ends the stream too) or the stream
                // ended meanwhile (then this does nothing).
                case .closed: entry.finish(.clientGone)
                }
            }
        }
        return (written, other)
    }

    /// The lower of a cursor found so far (nil: none) and `cursor`.
    private static func lower(_ found: Int64?, _ cursor: Int64) -> Int64 { found.map { min($0, cursor) } ?? cursor }

    /// Writes what is new to every parked stream: one read per cursor they wait at (all at
    /// the same one, usually), the page's bytes shared by every writer.
    private func fanOut() async {
        let generation = streams.notifier.generation
        var seen = Set<Int64>()
        // Where streams were last seen parked; each loop's pass names any other cursor.
        var next = state.withLock { $0.hint }
        while let cursor = next, !seen.contains(cursor) {
            seen.insert(cursor)
            // Each loop's streams as they stand: each loop writes its own connections' streams
            // (and then sends them), so a commit to many streams on N loops is written and sent
            // by N threads in parallel.
            let shares = state.withLock { $0.shares }
            let result: SharedPulls.Result
            do {
                result = try await streams.pulls.page(
                    for: user, after: cursor, limit: streams.settings.pageSize, notBefore: generation)
            } catch {
                let reason = streams.endAfterFailure(error)
                var other: Int64? = nil
                for share in shares {
                    for entry in share.entries {
                        guard let at = entry.cursor else { continue }
                        if at == cursor {
                            entry.finish(reason)
                        } else if !seen.contains(at) {
                            other = Self.lower(other, at)
                        }
                    }
                }
                next = other
                continue
            }
            let page = result.page
            // Read after the wake-up and complete: streams now at its end are up to date.
            if !page.hasMore, let lastSeq = page.lastSeq { seen.insert(lastSeq) }
            let visited = seen
            let (written, other) = await withTaskGroup(of: (written: Int, other: Int64?).self) { group in
                for share in shares where !share.entries.isEmpty {
                    group.addTask(executorPreference: share.loop) {
                        self.write(page, to: share.entries, at: cursor, skipping: visited)
                    }
                }
                return await group.reduce(into: (written: 0, other: Int64?.none)) { sum, part in
                    sum.written += part.written
                    if let at = part.other { sum.other = Self.lower(sum.other, at) }
                }
            }
            streams.recordStreamed(written * page.count)
            next = other
            if page.hasMore, let lastSeq = page.lastSeq, written > 0 {
                // The streams just written wait at the page's end for the rest.
                next = Self.lower(next, lastSeq)
            } else if !page.hasMore, let lastSeq = page.lastSeq, written > 0 {
                state.withLock { $0.hint = lastSeq }
            }
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
