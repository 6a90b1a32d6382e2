import Foundation
import HTTPServer
import JSON
import Logging
import Postgres
import Synchronization

/// Supabase Realtime's `postgres_changes` on this instance: its limits, the joined channels,
/// and one hub per user with channels, fed by the same `EventNotifier` wake-ups as the event
/// streams. An idle socket is a suspended task waiting for its next message and its entries
/// here: no thread, no database connection. When a user's events change (a `NOTIFY` from any
/// instance) the user's hub reads what is new once, and writes each row to every channel of
/// the user whose bindings match it: ten sockets of one account cost one select per commit.
/// All of Realtime's SQL is in this file.
public final class RealtimeFeed: Sendable {
    /// Limits (`TRUNK_SYNC_REALTIME_*`).
    public struct Settings: Sendable {
        /// Most open Realtime sockets on this instance; more are answered `429`. Default: setting `realtime_max`.
        public var maxSockets = Setting.realtimeMax.integerDefault
        /// Most joined channels per user on this instance; more are refused in the join's
        /// reply. Default: setting `realtime_max_channels_per_user`.
        public var maxChannelsPerUser = Setting.realtimeMaxChannelsPerUser.integerDefault
        /// Most joined channels per socket. Default 100.
        public var maxChannelsPerSocket = 100
        /// Most `postgres_changes` bindings of one user's joined channels together on this
        /// instance: every change of the user's is matched against each of them, so this
        /// bounds the work one commit causes (100 channels of 100 bindings would be 10,000
        /// matches per event, 10 million for one push). Default 1,000.
        public var maxBindingsPerUser = 1000
        /// Bytes of the filters (as the clients sent them) of one user's joined channels
        /// together on this instance: each channel keeps its filters parsed while joined, and
        /// without it one account could keep a join message (64 KiB) of filters on each of its
        /// 100 channels (6.4 MB of text before parsing). Default: setting
        /// `realtime_max_filter_bytes`.
        public var maxFilterBytesPerUser = Setting.realtimeMaxFilterBytes.integerDefault
        /// The channels joined with the app's key (no user yet) of every socket together
        /// hold at most as many bindings and filter bytes as this many users' channels may
        /// (`maxBindingsPerUser`, `maxFilterBytesPerUser` each). Each socket's are bounded as
        /// one user's, but the key is public: without this, the sockets a few addresses may
        /// open (`TRUNK_SYNC_REALTIME_MAX`, 5,000) would hold 5,000 users' worth of parsed
        /// filters (several times their text) without an account. Over it, such a join is refused (the client retries; once signed in it
        /// joins with the user's token). Default 100.
        public var maxKeyedChannelsInUsers = 100
        /// Bytes a socket may have queued and not yet sent before it is closed (`1013`: the
        /// client reads too slowly). Default: setting `realtime_buffer`.
        public var bufferBytes = Setting.realtimeBuffer.integerDefault
        /// Seconds without any frame from the client before its socket is closed (the
        /// clients send a heartbeat every 25 s). Default: setting `realtime_idle_timeout`.
        public var idleTimeout = Setting.realtimeIdleTimeout.integerDefault
        /// Rows per read. Default 100.
        public var pageSize = 100
        /// How long a new socket may stay open without a channel joined successfully before
        /// the server closes it (`1000`). A socket takes one of `maxSockets` from the upgrade
        /// on, so idle sockets that only send heartbeats, from the few addresses the
        /// per-address connection cap lets hold them all, would otherwise shut every other
        /// client out. A socket that joined once is never closed for it (supabase-js keeps
        /// its socket after its last channel left); those are capped per user instead
        /// (`leave`). The clients join right after opening.
        /// Checked by the feed's tick, once a second. Default 30 s.
        public var joinGrace: Duration = .seconds(30)
        /// Channel joins (`phx_join`) one socket may send per second on average; bursts up to
        /// `joinBurst`. One more is refused with `tooManyJoins` and closes the socket (`1008`),
        /// as Supabase Realtime disconnects it: a join checks a token and may read the
        /// database (a user's first channel on the instance reads where their log stands).
        /// Default: setting `realtime_max_joins_per_second`.
        public var maxJoinsPerSecond = Setting.realtimeMaxJoinsPerSecond.integerDefault
        /// Messages of any kind one socket may send per second on average; bursts up to
        /// `messageBurst`. One more is answered `tooManyMessages` and closes the socket
        /// (`1008`). Default: setting `realtime_max_messages_per_second`.
        public var maxMessagesPerSecond = Setting.realtimeMaxMessagesPerSecond.integerDefault
        /// Joins a socket may send at once: every channel it may have (a client that
        /// reconnects rejoins them all at once), or a second's worth if that is more.
        var joinBurst: Int { max(maxJoinsPerSecond, maxChannelsPerSocket) }
        /// Messages a socket may send at once: a join and an `access_token` (supabase-js
        /// sends one to every channel when its token changes) for every channel it may have,
        /// or a second's worth if that is more.
        var messageBurst: Int { max(maxMessagesPerSecond, 2 * maxChannelsPerSocket) }
        /// The clock the per-socket rate limits read. Tests give one they move by hand.
        var clock: @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }
        /// Tests: awaited before each read of a user's new events (to hold a read while
        /// something happens). Nil in the server.
        var beforeEventsRead: (@Sendable () async -> Void)? = nil
        /// Tests: awaited by a join once its channel is registered with its user's hub (live),
        /// before the join's reply is sent. Nil in the server.
        var afterJoinRegistered: (@Sendable () async -> Void)? = nil

        public init() {}
    }

    /// A socket that joined a channel: the user of its first join owns it.
    private struct JoinedSocket {
        var owner: UUID
        var channels: Int
        var socket: WebSocket
    }

    /// What one user's joined channels on this instance hold together.
    private struct Usage {
        var channels = 0
        /// Their `postgres_changes` bindings (`maxBindingsPerUser`).
        var bindings = 0
        /// The bytes of their filters (`maxFilterBytesPerUser`).
        var filterBytes = 0

        mutating func add(_ channel: RealtimeChannel, times: Int) {
            channels += times
            bindings += times * channel.bindings.count
            filterBytes += times * channel.filterBytes
        }
    }

    private struct State {
        var sockets = 0
        /// Per user with channels.
        var usage: [UUID: Usage] = [:]
        var hubs: [UUID: RealtimeHub] = [:]
        var channels: [UInt64: RealtimeChannel] = [:]
        var nextID: UInt64 = 0
        var ticker: Task<Void, Never>? = nil
        /// Sockets that have not joined a channel yet, whose grace the tick ends.
        var awaitingJoin: [ObjectIdentifier: RealtimeJoinGrace] = [:]
        /// Sockets that joined a channel once: their owner and live channels.
        var joinedSockets: [ObjectIdentifier: JoinedSocket] = [:]
        /// Per user, their sockets that joined once and have no channel now, oldest first
        /// (at most `maxChannelsPerUser`).
        var idleSockets: [UUID: [ObjectIdentifier]] = [:]
        /// What the channels joined with the app's key hold, over every socket
        /// (`holdKeyed`): no user's usage counts them.
        var keyed = Usage()
        var closed = false
    }

    let settings: Settings
    let database: Database
    let notifier: EventNotifier
    let revocations: SessionRevocations?
    let tokens: TokenIssuer
    let logger: Logger
    private let state = Mutex(State())
    /// `postgres_changes` messages sent (held ones included: `RealtimeChannel.open`).
    let sent: Counter
    /// Sockets the server closed for holding a slot without a channel: never joined within
    /// `joinGrace`, or one of an account's sockets without a channel too many.
    let closedWithoutJoin: Counter
    let closedIdleOverCap: Counter
    /// Sockets closed for sending more joins or messages than their rate limits let them.
    let closedRateLimited: Counter

    public init(
        settings: Settings, database: Database, notifier: EventNotifier, revocations: SessionRevocations?,
        tokens: TokenIssuer, metrics: Metrics, logger: Logger
    ) {
        self.settings = settings
        self.database = database
        self.notifier = notifier
        self.revocations = revocations
        self.tokens = tokens
        self.logger = logger
        sent = metrics.counter("trunk_sync_realtime_changes_sent_total", help: "postgres_changes messages sent.")
        let closedHelp = "Realtime sockets the server closed, by reason (a slot held without a channel, a rate limit)."
        closedWithoutJoin = metrics.counter(
            "trunk_sync_realtime_sockets_closed_total", help: closedHelp, labels: "reason=\"no_join\"")
        closedIdleOverCap = metrics.counter(
            "trunk_sync_realtime_sockets_closed_total", help: closedHelp, labels: "reason=\"idle_over_cap\"")
        closedRateLimited = metrics.counter(
            "trunk_sync_realtime_sockets_closed_total", help: closedHelp, labels: "reason=\"rate_limit\"")
        metrics.gauge("trunk_sync_realtime_sockets_open", help: "Realtime sockets open now.") { [weak self] in
            Double(self?.socketCount ?? 0)
        }
    }

    /// Sockets open now.
    public var socketCount: Int { state.withLock { $0.sockets } }

    static let shuttingDown = "the server is shutting down"

    /// Channels joined now.
    var channelCount: Int { state.withLock { $0.channels.count } }

    // MARK: - Sockets

    /// Takes a socket slot, or throws `429` (`503` while shutting down).
    func openSocket() throws(APIError) {
        let refusal = state.withLock { state -> APIError? in
            if state.closed { return EventStreams.shuttingDown }
            if state.sockets >= settings.maxSockets {
                return APIError(
                    status: 429, code: "too_many_sockets",
                    message: "The server has as many Realtime sockets as it takes; retry later.", retryAfter: 5)
            }
            state.sockets += 1
            return nil
        }
        if let refusal { throw refusal }
    }

    /// The socket ended: its slot is given back. Called before its channels are left, so
    /// leaving them does not count it among its owner's idle sockets.
    func closeSocket(_ socket: WebSocket) {
        state.withLock { state in
            state.sockets -= 1
            let key = ObjectIdentifier(socket)
            guard let joined = state.joinedSockets.removeValue(forKey: key), joined.channels == 0 else { return }
            Self.forgetIdle(key, of: joined.owner, in: &state)
        }
    }

    private static func forgetIdle(_ key: ObjectIdentifier, of owner: UUID, in state: inout State) {
        state.idleSockets[owner]?.removeAll { $0 == key }
        if state.idleSockets[owner]?.isEmpty == true { state.idleSockets.removeValue(forKey: owner) }
    }

    /// Sockets that joined once and have no channel now, over all users.
    var idleSocketCount: Int { state.withLock { $0.idleSockets.values.reduce(0) { $0 + $1.count } } }

    /// Ends `grace` once its deadline has passed (the tick, once a second), unless the
    /// socket joined or ended first (`stopAwaitingJoin`).
    func awaitJoin(_ grace: RealtimeJoinGrace) {
        state.withLock { state in
            guard !state.closed else { return }
            state.awaitingJoin[ObjectIdentifier(grace)] = grace
            startTicking(&state)
        }
    }

    func stopAwaitingJoin(_ grace: RealtimeJoinGrace) {
        _ = state.withLock { $0.awaitingJoin.removeValue(forKey: ObjectIdentifier(grace)) }
    }

    private func startTicking(_ state: inout State) {
        if state.ticker == nil { state.ticker = Task { [weak self] in await self?.tick() } }
    }

    // MARK: - Channels

    /// Joins `channel`: takes the user's slot, and registers it with the user's hub once the
    /// hub knows where the user's log stands, so any commit after this returns reaches it.
    func join(_ channel: RealtimeChannel) async throws(RealtimeError) {
        let (hub, refusal) = state.withLock { state -> (RealtimeHub?, RealtimeError?) in
            if state.closed { return (nil, RealtimeError(Self.shuttingDown)) }
            var usage = state.usage[channel.user, default: Usage()]
            if usage.channels >= settings.maxChannelsPerUser {
                return (nil, RealtimeError("this account has \(settings.maxChannelsPerUser) channels joined already"))
            }
            usage.add(channel, times: 1)
            if usage.bindings > settings.maxBindingsPerUser {
                return (
                    nil,
                    RealtimeError(
                        "this account's channels would have \(usage.bindings) postgres_changes bindings; at most \(settings.maxBindingsPerUser)"
                    )
                )
            }
            if usage.filterBytes > settings.maxFilterBytesPerUser {
                return (
                    nil,
                    RealtimeError(
                        "this account's channels would have \(usage.filterBytes) bytes of postgres_changes filters; at most \(settings.maxFilterBytesPerUser)"
                    )
                )
            }
            state.usage[channel.user] = usage
            state.channels[channel.id] = channel
            let key = ObjectIdentifier(channel.socket)
            if var joined = state.joinedSockets[key] {
                if joined.channels == 0 { Self.forgetIdle(key, of: joined.owner, in: &state) }
                joined.channels += 1
                state.joinedSockets[key] = joined
            } else {
                state.joinedSockets[key] = JoinedSocket(owner: channel.user, channels: 1, socket: channel.socket)
            }
            startTicking(&state)
            if let hub = state.hubs[channel.user] { return (hub, nil) }
            let hub = RealtimeHub(user: channel.user, feed: self)
            state.hubs[channel.user] = hub
            return (hub, nil)
        }
        if let refusal { throw refusal }
        guard let hub else { throw RealtimeError("internal error") }
        do {
            try await hub.add(channel)
        } catch {
            leave(channel)
            throw RealtimeError("the database is unavailable; retry")
        }
    }

    /// Ends `channel` (left, replaced, its socket gone, or ended by the server): gives its
    /// slot back; the user's last channel stops the hub. Idempotent.
    ///
    /// A socket left without a channel stays open (the clients keep theirs), but each user
    /// keeps at most `maxChannelsPerUser` such sockets: one more closes the oldest (`1000`),
    /// or one account joining and leaving on socket after socket could hold every slot.
    func leave(_ channel: RealtimeChannel) {
        guard channel.markEnded() else { return }
        let (idle, evicted) = state.withLock { state -> (RealtimeHub?, WebSocket?) in
            guard state.channels.removeValue(forKey: channel.id) != nil else { return (nil, nil) }
            let evicted = socketLeft(channel, &state)
            var usage = state.usage[channel.user, default: Usage()]
            usage.add(channel, times: -1)
            let hub = state.hubs[channel.user]
            hub?.remove(channel.id)
            if usage.channels > 0 {
                state.usage[channel.user] = usage
                return (nil, evicted)
            }
            state.usage.removeValue(forKey: channel.user)
            return (state.hubs.removeValue(forKey: channel.user), evicted)
        }
        idle?.stop()
        if let evicted, !evicted.isClosed {
            closedIdleOverCap.increment()
            logger.info(
                "realtime socket closed: its account has more sockets without a channel than it may",
                metadata: ["user": "\(channel.user)", "most": "\(settings.maxChannelsPerUser)"])
            evicted.close(
                .normal, reason: "this account has more than \(settings.maxChannelsPerUser) sockets without a channel")
        }
    }

    /// `channel`'s socket has one channel less; when none is left it joins its owner's idle
    /// sockets, and the oldest of them beyond the cap is returned to be closed.
    private func socketLeft(_ channel: RealtimeChannel, _ state: inout State) -> WebSocket? {
        let key = ObjectIdentifier(channel.socket)
        guard var joined = state.joinedSockets[key] else { return nil }  // the socket ended
        joined.channels -= 1
        state.joinedSockets[key] = joined
        guard joined.channels == 0 else { return nil }
        state.idleSockets[joined.owner, default: []].append(key)
        guard let idle = state.idleSockets[joined.owner], idle.count > settings.maxChannelsPerUser else { return nil }
        let oldest = idle[0]
        state.idleSockets[joined.owner]?.removeFirst()
        return state.joinedSockets.removeValue(forKey: oldest)?.socket
    }

    /// Ends `channel` from the server's side: a `system` error naming `reason`, then
    /// `phx_close` (the client does not rejoin a closed channel).
    func end(_ channel: RealtimeChannel, reason: String) {
        guard !channel.isEnded else { return }
        channel.sendSystem(ok: false, extension: "system", message: reason)
        channel.send(event: "phx_close", payload: Array("{}".utf8))
        leave(channel)
    }

    /// Takes `bindings` and their `filterBytes` for a channel joined with the app's key from
    /// what all such channels may hold together (`maxKeyedChannelsInUsers`); the refusal if
    /// that is spent. Given back by `releaseKeyed` when the channel is left, bound or closed.
    func holdKeyed(bindings: Int, filterBytes: Int) -> RealtimeError? {
        state.withLock { state in
            if state.closed { return RealtimeError(Self.shuttingDown) }
            let share = settings.maxKeyedChannelsInUsers
            if state.keyed.bindings + bindings > share * settings.maxBindingsPerUser
                || state.keyed.filterBytes + filterBytes > share * settings.maxFilterBytesPerUser
            {
                return RealtimeError(
                    "this server holds as many channels without a signed-in user as it may; join with the user's access_token"
                )
            }
            state.keyed.channels += 1
            state.keyed.bindings += bindings
            state.keyed.filterBytes += filterBytes
            return nil
        }
    }

    func releaseKeyed(bindings: Int, filterBytes: Int) {
        state.withLock { state in
            state.keyed.channels -= 1
            state.keyed.bindings -= bindings
            state.keyed.filterBytes -= filterBytes
        }
    }

    /// Channels joined with the app's key now, over every socket.
    var keyedChannelCount: Int { state.withLock { $0.keyed.channels } }

    func nextChannelID() -> UInt64 {
        state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
    }

    func recordSent(_ count: Int) { sent.increment(by: count) }

    /// Once a second: ends the join grace of sockets past it (`RealtimeJoinGrace`), and the
    /// channels whose access token expired, and those whose session was revoked. A revocation usually ends its channels at once (it wakes the user's hub),
    /// but not one it raced: a channel registered with its hub just after the wake-up (its
    /// token was checked before the revocation), or a revocation learnt without one (the
    /// reload after the listener reconnected). As the event streams' tick does.
    private func tick() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(1))
            let instant = ContinuousClock.now
            let (channels, graceOver) = state.withLock { state in
                let over = state.awaitingJoin.values.filter { instant >= $0.deadline }
                for grace in over { state.awaitingJoin[ObjectIdentifier(grace)] = nil }
                return (Array(state.channels.values), over)
            }
            for grace in graceOver { grace.end() }
            let now = AuthService.now()
            for channel in channels { endIfUnauthorized(channel, now: now) }
        }
    }

    /// Why a channel whose token's `exp` has passed is ended (and a join or `access_token`
    /// with such a token refused).
    static let tokenExpired = "Token has expired; send a fresh access_token and rejoin"

    /// Ends `channel` if its token has expired or its session was revoked (the tick, and each
    /// fan-out before it sends anything). Returns whether it is ended.
    @discardableResult
    func endIfUnauthorized(_ channel: RealtimeChannel, now: Int64) -> Bool {
        let auth = channel.auth
        if now >= auth.expiresAt {
            end(channel, reason: Self.tokenExpired)
        } else if let revocations, revocations.isRevoked(auth.session) {
            end(channel, reason: "The session was signed out")
        }
        return channel.isEnded
    }

    /// Takes no new sockets or channels; stops the ticker and the hubs (open sockets are
    /// closed with `1001` by the HTTP server's shutdown).
    func close() {
        let (ticker, hubs) = state.withLock { state in
            state.closed = true
            defer { state.ticker = nil }
            return (state.ticker, Array(state.hubs.values))
        }
        ticker?.cancel()
        for hub in hubs { hub.stopFollowing() }
    }

    // MARK: - SQL

    /// Each a single select with the user's scope in one round trip (`Database.readPipeline`:
    /// with `db_shared_reads` above 1, behind other such reads on a shared connection), on the database's own
    /// loop: a socket is not a request the HTTP server drains before its loops stop
    /// (`Database.offHTTPLoops`). Each reads by key or by `(user_id, seq)` range, one plan
    /// whatever the values: planned once (`Plans.generic`).
    private func read<T: Sendable>(
        _ user: UUID, _ select: PostgresStatement, _ rows: @Sendable (PostgresResult) throws -> T
    ) async throws -> T {
        try await database.offHTTPLoops {
            guard let result = try await database.readPipeline(as: .user(user), plans: .generic, [select]).first else {
                throw PostgresError.unexpected("a statement returned no result")
            }
            return try rows(result)
        }
    }

    /// Where the user's log stands now (`users.last_seq`) and when the profile last changed;
    /// nil when the user is gone.
    func start(of user: UUID) async throws -> (lastSeq: Int64, profileUpdatedAt: Int64)? {
        try await read(user, .prepared("select last_seq, updated_at from users where id = $1", user)) { rows in
            guard rows.count == 1 else { return nil }
            return (
                try rows[0].decode(Int64.self, column: 0),
                try rows[0].decode(PostgresTimestamp.self, column: 1).microsecondsSinceEpoch
            )
        }
    }

    /// The user's profile with the columns `/rest/v1/profiles` returns, in its order.
    func profile(of user: UUID) async throws -> PostgresResult {
        let columns = RealtimeTable.profiles.columns.map(\.sql).joined(separator: ", ")
        return try await read(user, .prepared("select \(columns) from users where id = $1", user)) { $0 }
    }

    /// The user's events after `after`, at most `limit` (+1 to know there is more), with the
    /// columns `/rest/v1/events` returns, in its order.
    func events(of user: UUID, after: Int64, limit: Int) async throws -> PostgresResult {
        if let hold = settings.beforeEventsRead { await hold() }
        let columns = RealtimeTable.events.columns.map(\.sql).joined(separator: ", ")
        return try await read(
            user,
            .prepared(
                "select \(columns) from events where user_id = $1 and seq > $2 order by seq limit $3", user, after,
                Int64(limit + 1))
        ) { $0 }
    }
}

/// One joined channel: its socket, topic, bindings and the session whose token joined it.
final class RealtimeChannel: Sendable {
    /// The user token the channel follows: it ends at `expiresAt` and when `session` is
    /// revoked, whatever else the client sends.
    struct Auth: Sendable {
        var session: UUID
        var expiresAt: Int64
        /// False while the client's last `access_token` was the app's key rather than a
        /// user's token (it signed out, or lost its session): nothing is delivered then,
        /// as Supabase delivers a user's rows to no channel of the `anon` role. A token of
        /// the channel's user turns it back on.
        var delivering = true
    }

    /// What is sent before the join's reply is out: held (`open`), so a change never
    /// reaches the client before the `ok` that gives it the ids to match it by.
    private struct Gate {
        var open = false
        var held: [[UInt8]] = []
        var heldBytes = 0
    }

    let id: UInt64
    let user: UUID
    let socket: WebSocket
    let version: PhoenixMessage.Version
    let topic: String
    let joinRef: String?
    let bindings: [RealtimeBinding]
    /// The bytes of its bindings' filters as the client sent them (`maxFilterBytesPerUser`).
    let filterBytes: Int
    /// The most bytes held before the join's reply; more close the socket as a slow reader
    /// would be (`1013`).
    let holdLimit: Int
    /// The token it follows and whether it ended, under one lock: the fan-out reads both
    /// for every channel of every change (`isDelivering`).
    private let state: Mutex<(auth: Auth, ended: Bool)>
    private let gate: Mutex<Gate>
    /// `gate.open`, read without its lock by every send once the join's reply is out.
    private let isOpen: Atomic<Bool>

    /// `open`: whether messages go out at once (a channel the session joins is opened by it
    /// after the join's reply: `open(after:)`).
    init(
        id: UInt64, user: UUID, session: UUID, expiresAt: Int64, socket: WebSocket, version: PhoenixMessage.Version,
        topic: String, joinRef: String?, bindings: [RealtimeBinding], open: Bool = true,
        holdLimit: Int = Setting.realtimeBuffer.integerDefault
    ) {
        self.id = id
        self.user = user
        self.socket = socket
        self.version = version
        self.topic = topic
        self.joinRef = joinRef
        self.bindings = bindings
        self.holdLimit = holdLimit
        filterBytes = Self.filterBytes(of: bindings)
        state = Mutex((Auth(session: session, expiresAt: expiresAt), false))
        gate = Mutex(Gate(open: open))
        isOpen = Atomic(open)
    }

    /// The bytes of `bindings`' filters as the client sent them.
    static func filterBytes(of bindings: [RealtimeBinding]) -> Int {
        bindings.reduce(0) { $0 + ($1.filterText?.utf8.count ?? 0) }
    }

    /// The session and expiry of the token the channel follows now (one read of both).
    var auth: Auth { state.withLock { $0.auth } }
    var isEnded: Bool { state.withLock { $0.ended } }
    /// Whether changes go to it: not ended, and not withheld by a key.
    var isDelivering: Bool { state.withLock { !$0.ended && $0.auth.delivering } }

    /// A token of the channel's user: the channel follows its session and expiry, and
    /// delivers again if a key had stopped it.
    func refresh(session: UUID, expiresAt: Int64) {
        state.withLock { $0.auth = Auth(session: session, expiresAt: expiresAt) }
    }

    /// The app's key instead of a user's token: the channel stays joined, still following
    /// (and ending with) its last user token, and delivers nothing until `refresh`.
    func withhold() {
        state.withLock { $0.auth.delivering = false }
    }

    /// Marks the channel ended; false if it was already.
    func markEnded() -> Bool {
        state.withLock { state in
            defer { state.ended = true }
            return !state.ended
        }
    }

    /// Sends a message on this channel's topic, or holds it until the join's reply is out.
    /// A client too far behind is disconnected.
    func send(event: String, ref: String? = nil, payload: [UInt8]) {
        let bytes = PhoenixMessage.encode(
            joinRef: joinRef, ref: ref, topic: topic, event: event, payload: payload, version: version)
        if isOpen.load(ordering: .acquiring) {
            RealtimeSession.send(bytes, on: socket)
            return
        }
        let held = gate.withLock { gate -> Bool? in
            if gate.open { return false }
            guard gate.heldBytes + bytes.count <= holdLimit else { return nil }
            gate.held.append(bytes)
            gate.heldBytes += bytes.count
            return true
        }
        switch held {
        case false?: RealtimeSession.send(bytes, on: socket)
        case true?: break
        case nil: socket.close(.tryAgainLater, reason: "the client reads too slowly")
        }
    }

    /// The join's reply is out: sends `first` (the `system` message that says the
    /// subscription is live), then what was held, then lets messages go out at once. Under
    /// the gate's lock, so nothing sent meanwhile overtakes them.
    func open(after first: (event: String, payload: [UInt8])?) {
        gate.withLock { gate in
            guard !gate.open else { return }
            if let first {
                RealtimeSession.send(
                    PhoenixMessage.encode(
                        joinRef: joinRef, ref: nil, topic: topic, event: first.event, payload: first.payload,
                        version: version),
                    on: socket)
            }
            for bytes in gate.held { RealtimeSession.send(bytes, on: socket) }
            gate = Gate(open: true)
            isOpen.store(true, ordering: .releasing)
        }
    }

    /// A `system` message: of the `postgres_changes` extension (the subscription is live), or
    /// of `system` (the server ends the channel, as Supabase Realtime says so).
    func sendSystem(ok: Bool, extension name: String = "postgres_changes", message: String) {
        send(event: "system", payload: systemPayload(ok: ok, extension: name, message: message))
    }

    func systemPayload(ok: Bool, extension name: String = "postgres_changes", message: String) -> [UInt8] {
        Self.systemPayload(topic: topic, ok: ok, extension: name, message: message)
    }

    static func systemPayload(topic: String, ok: Bool, extension name: String = "postgres_changes", message: String)
        -> [UInt8]
    {
        var writer = JSONWriter(capacity: 128)
        writer.beginObject()
        writer.string("extension", name)
        writer.string("status", ok ? "ok" : "error")
        writer.string("message", message)
        writer.string("channel", topic.hasPrefix("realtime:") ? String(topic.dropFirst(9)) : topic)
        writer.endObject()
        return writer.bytes
    }
}

/// One user's joined channels on this instance, written to by one task when the user's
/// events change (a commit on any instance, a revoked session, the listener reconnecting).
final class RealtimeHub: Sendable {
    private struct State {
        var channels: [UInt64: RealtimeChannel] = [:]
        /// The newest event the channels were given (or the log's end when the hub started).
        var cursor: Int64? = nil
        /// The profile's `updated_at` last sent (or when the hub started), microseconds.
        var profileSeen: Int64 = 0
        var task: Task<Void, Never>? = nil
        var stopped = false
    }

    let user: UUID
    private let feed: RealtimeFeed
    private let subscription: EventSubscription
    private let state = Mutex(State())
    /// Where the log stood when the hub started (read after subscribing, so no later commit
    /// is missed); every join waits for it.
    private let start: Task<(lastSeq: Int64, profileUpdatedAt: Int64)?, any Error>

    init(user: UUID, feed: RealtimeFeed) {
        self.user = user
        self.feed = feed
        let subscription = feed.notifier.subscribe(to: user)
        self.subscription = subscription
        start = Task { try await feed.start(of: user) }
    }

    /// Registers `channel` once the hub knows where the log stands (the first call starts
    /// the hub's task).
    func add(_ channel: RealtimeChannel) async throws {
        guard let (cursor, profileUpdatedAt) = try await start.value else {
            throw RealtimeError("the account no longer exists")
        }
        state.withLock { state in
            // Ended while it waited (its token expired, its session was revoked): `leave`
            // removed it already, and would not again.
            guard !state.stopped, !channel.isEnded else { return }
            if state.cursor == nil {
                state.cursor = cursor
                state.profileSeen = profileUpdatedAt
            }
            state.channels[channel.id] = channel
            if state.task == nil {
                state.task = Task { [self] in
                    while !Task.isCancelled {
                        await subscription.next()
                        if Task.isCancelled || feed.notifier.isShutDown { break }
                        await fanOut()
                    }
                }
            }
        }
    }

    func remove(_ id: UInt64) { state.withLock { _ = $0.channels.removeValue(forKey: id) } }

    /// Stops following (shutdown: the sockets end with the HTTP server's).
    func stopFollowing() { state.withLock { $0.task }?.cancel() }

    /// The user's last channel left.
    func stop() {
        let task = state.withLock { state in
            state.stopped = true
            defer { state.task = nil }
            return state.task
        }
        task?.cancel()
        start.cancel()
        subscription.cancel()
    }

    /// Ends the channels whose session was revoked or whose token expired (the tick does too,
    /// but only once a second: no row goes out after `exp`), then reads what is new and sends
    /// each row to the channels whose bindings match it.
    ///
    /// The channels written to are taken after each read, not before: a channel that joined
    /// while a read was under way (its `ok` sent) gets that read's rows, among them any row
    /// committed after its join; taken before, it was left out of them while the cursor moved
    /// past them for good.
    private func fanOut() async {
        let channels = liveChannels()
        guard !channels.isEmpty, let start = state.withLock({ $0.cursor }) else { return }
        if channels.contains(where: { $0.bindings.contains { $0.wants(.profiles) } }) {
            await sendProfileChange()
        }
        var cursor = start
        let table = RealtimeTable.events
        let limit = feed.settings.pageSize
        while true {
            let rows: PostgresResult
            do {
                rows = try await feed.events(of: user, after: cursor, limit: limit)
            } catch {
                if !Task.isCancelled {
                    feed.logger.warning("realtime read failed", metadata: ["error": "\(error)"])
                }
                return
            }
            var sent = 0
            let channels = liveChannels()
            for index in 0..<min(rows.count, limit) {
                let row = rows[index]
                guard let change = try? Self.change(row, table: table) else { continue }
                cursor = max(cursor, change.seq)
                sent += Self.send(change, table: table, to: channels)
            }
            feed.recordSent(sent)
            state.withLock { $0.cursor = cursor }
            if rows.count <= limit { return }
        }
    }

    /// The hub's channels now, less those it ends for an expired token or a revoked session.
    private func liveChannels() -> [RealtimeChannel] {
        var channels = state.withLock { Array($0.channels.values) }
        let now = AuthService.now()
        channels.removeAll { feed.endIfUnauthorized($0, now: now) }
        return channels
    }

    /// Sends the profile's change if it changed since the last one sent, to the channels
    /// there are once it is read.
    private func sendProfileChange() async {
        let table = RealtimeTable.profiles
        guard let rows = try? await feed.profile(of: user), rows.count == 1,
            let change = try? Self.change(rows[0], table: table),
            case .time(let updatedAt)? = change.values["updated_at"]
        else { return }
        let isNew = state.withLock { state -> Bool in
            guard updatedAt > state.profileSeen else { return false }
            state.profileSeen = updatedAt
            return true
        }
        guard isNew else { return }
        feed.recordSent(Self.send(change, table: table, to: liveChannels()))
    }

    /// Sends `change` to each channel with bindings it matches (their ids in one message).
    /// Returns how many messages went out.
    private static func send(_ change: Change, table: RealtimeTable, to channels: [RealtimeChannel]) -> Int {
        var sent = 0
        for channel in channels where channel.isDelivering {
            let ids = channel.bindings.filter { $0.matches(table, values: change.values) }
            guard !ids.isEmpty else { continue }
            var writer = JSONWriter(capacity: change.data.count + 32)
            writer.beginObject()
            writer.beginArray("ids")
            for binding in ids { writer.int(nil, Int64(binding.id)) }
            writer.endArray()
            writer.raw("data", change.data)
            writer.endObject()
            channel.send(event: "postgres_changes", payload: writer.bytes)
            sent += 1
        }
        return sent
    }

    struct Change {
        var seq: Int64
        /// The message's `data`, shared by every channel it goes to.
        var data: [UInt8]
        /// The row's filterable values, by column.
        var values: [String: RealtimeValue]
    }

    /// A row as a change: the record shaped as `/rest/v1/<table>` returns it (an update's
    /// `old_record` holds the primary key only, as Supabase's without `replica identity full`).
    static func change(_ row: PostgresRow, table: RealtimeTable) throws -> Change {
        var record = JSONWriter(capacity: 256)
        try RESTRoutes.write(row, columns: table.columns, to: &record)
        var values: [String: RealtimeValue] = [:]
        var seq: Int64 = 0
        var time = ""
        var id = ""
        for (index, column) in table.columns.enumerated() {
            if row.isNull(column: index) {
                values[column.name] = .null
                continue
            }
            switch column.kind {
            case .uuid:
                let text = UUIDText.lowercase(try row.decode(UUID.self, column: index))
                values[column.name] = .text(text)
                if column.name == "id" { id = text }
            case .int:
                let number = try row.decode(Int64.self, column: index)
                values[column.name] = .int(number)
                if column.name == "seq" { seq = number }
            case .text: values[column.name] = .text(try row.decode(String.self, column: index))
            case .timestamp:
                let stamp = try row.decode(PostgresTimestamp.self, column: index)
                values[column.name] = .time(stamp.microsecondsSinceEpoch)
                if column.name == table.timeColumn { time = RFC3339.formatPostgREST(stamp) }
            case .json: break
            }
        }
        var data = JSONWriter(capacity: record.bytes.count + 400)
        data.beginObject()
        data.string("schema", "public")
        data.string("table", table.name)
        data.string("commit_timestamp", time)
        data.string("type", table.change)
        data.beginArray("columns")
        for (column, type) in zip(table.columns, table.columnTypes) {
            data.beginObject()
            data.string("name", column.name)
            data.string("type", type)
            data.endObject()
        }
        data.endArray()
        data.raw("record", record.bytes)
        if table.change == "UPDATE" {
            data.beginObject("old_record")
            data.string("id", id)
            data.endObject()
        }
        data.null("errors")
        data.endObject()
        return Change(seq: seq, data: data.bytes, values: values)
    }
}
