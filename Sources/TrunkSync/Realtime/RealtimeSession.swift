import Foundation
import HTTPServer
import JSON
import Logging
import Synchronization
import TrunkCrypto

/// One Realtime socket: reads the client's Phoenix messages and answers them, until the
/// connection ends. Its channels are written to by their users' hubs (`RealtimeFeed`).
struct RealtimeSession {
    let feed: RealtimeFeed
    let socket: WebSocket
    let version: PhoenixMessage.Version
    /// Closes the socket if no channel is joined within `joinGrace` of its opening.
    let grace: RealtimeJoinGrace
    /// The `apikey` the socket was opened with (the app's key), if any: sent as an
    /// `access_token`, it is a key, not a user's token.
    let apiKey: String?
    /// Joined channels by topic.
    private var channels: [String: RealtimeChannel] = [:]
    /// Channels joined with the app's key, by topic: no user yet, so nothing anywhere can
    /// route a row to them (they are not in the feed), until a user's token binds them
    /// (`bind`). They count against the socket's channels.
    private var keyed: [String: KeyedChannel] = [:]
    /// The client's messages of any kind, and its joins (`maxMessagesPerSecond`,
    /// `maxJoinsPerSecond`).
    private var messageRate: RealtimeRateLimit
    private var joinRate: RealtimeRateLimit

    /// `address`: the client's, for the log. `apiKey`: the `apikey` it connected with.
    init(
        feed: RealtimeFeed, socket: WebSocket, version: PhoenixMessage.Version, address: String, apiKey: String? = nil
    ) {
        self.feed = feed
        self.socket = socket
        self.version = version
        self.apiKey = apiKey
        grace = RealtimeJoinGrace(feed: feed, socket: socket, address: address)
        messageRate = RealtimeRateLimit(
            perSecond: feed.settings.maxMessagesPerSecond, burst: feed.settings.messageBurst)
        joinRate = RealtimeRateLimit(perSecond: feed.settings.maxJoinsPerSecond, burst: feed.settings.joinBurst)
    }

    /// Queues `bytes`; a client that is too far behind is closed (`1013`).
    static func send(_ bytes: [UInt8], on socket: WebSocket) {
        if socket.send(text: bytes) == .full {
            socket.close(.tryAgainLater, reason: "the client reads too slowly")
        }
    }

    /// Answers messages until the connection ends, then leaves every channel.
    mutating func run() async {
        // The feed's once-a-second tick ends the grace: no task or timer per socket (10,000
        // sleeping tasks cost ~2 KiB a socket).
        feed.awaitJoin(grace)
        defer {
            feed.stopAwaitingJoin(grace)
            feed.closeSocket(socket)
            for channel in channels.values { feed.leave(channel) }
            for topic in keyed.keys { dropKeyed(topic) }
        }
        while let message = await socket.receive() {
            // Checked and decoded in a function of its own: what it needs stays out of this
            // task's frame, which every socket keeps for as long as it is open.
            switch admit(message) {
            case .handle(let decoded): await handle(decoded)
            case .answered: continue
            case .closed: return
            }
        }
    }

    /// What becomes of a message the client sent (`admit`).
    private enum Admitted {
        case handle(PhoenixMessage)
        /// Answered already (a malformed message, Broadcast).
        case answered
        /// Over a rate limit: answered, and the socket closed.
        case closed
    }

    /// Counts `message` against the socket's rate limits and decodes it.
    private mutating func admit(_ message: WebSocketMessage) -> Admitted {
        let now = feed.settings.clock()
        let withinRate = messageRate.take(at: now)
        switch message {
        case .text(let bytes):
            let decoded: PhoenixMessage
            do {
                decoded = try PhoenixMessage.decode(bytes, version: version)
            } catch {
                // Nothing to answer to: the topic and ref are unknown.
                let unknown = PhoenixMessage(joinRef: nil, ref: nil, topic: "phoenix", event: "", payload: .null)
                guard withinRate else { return closeForRate(unknown, Self.tooManyMessages) }
                reply(to: unknown, error: "malformed message: \(error.reason)")
                return .answered
            }
            guard withinRate else { return closeForRate(decoded, Self.tooManyMessages) }
            if decoded.event == "phx_join", decoded.topic != "phoenix", !joinRate.take(at: now) {
                return closeForRate(decoded, Self.tooManyJoins)
            }
            return .handle(decoded)
        case .binary(let bytes):
            // supabase-js sends Broadcast as binary frames (vsn 2.0.0): refused, with an answer.
            let header = PhoenixMessage.binaryPushHeader(bytes)
            let message = PhoenixMessage(
                joinRef: header?.joinRef, ref: header?.ref, topic: header?.topic ?? "phoenix", event: "broadcast",
                payload: .null)
            guard withinRate else { return closeForRate(message, Self.tooManyMessages) }
            reply(to: message, error: Self.broadcastRefused)
            return .answered
        }
    }

    /// Supabase Realtime's reasons for a client over its rate limits.
    static let tooManyJoins = "ClientJoinRateLimitReached: Too many joins per second"
    static let tooManyMessages = "Too many messages per second"

    /// `message` passed a rate limit: it is answered with `reason` and the socket closed
    /// (`1008`), as Supabase Realtime disconnects a client over its join rate. The clients
    /// reconnect with backoff and rejoin. The session then ends (its channels are left).
    private func closeForRate(_ message: PhoenixMessage, _ reason: String) -> Admitted {
        reply(to: message, error: reason)
        guard !socket.isClosed else { return .closed }
        feed.closedRateLimited.increment()
        feed.logger.info("realtime socket closed: \(reason)", metadata: ["ip": "\(grace.address)"])
        socket.close(.policyViolation, reason: reason)
        return .closed
    }

    static let broadcastRefused = "Broadcast is not supported by this server (trunk-sync serves postgres_changes only)"
    static let presenceRefused = "Presence is not supported by this server (trunk-sync serves postgres_changes only)"

    private mutating func handle(_ message: PhoenixMessage) async {
        if message.topic == "phoenix" {
            if message.event == "heartbeat" {
                reply(to: message, ok: Array("{}".utf8))
            } else {
                reply(to: message, error: "unknown event \(message.event) on topic phoenix")
            }
            return
        }
        switch message.event {
        case "phx_join":
            grace.joinStarted()
            await join(message)
            let joined = channels[message.topic] != nil || keyed[message.topic] != nil
            grace.joinEnded(succeeded: joined)
            if joined { feed.stopAwaitingJoin(grace) }
        case "phx_leave":
            if let channel = channels.removeValue(forKey: message.topic) {
                feed.leave(channel)
            }
            dropKeyed(message.topic)
            reply(to: message, ok: Array("{}".utf8))
            send(topic: message.topic, joinRef: message.joinRef, event: "phx_close", payload: Array("{}".utf8))
        case "access_token":
            if let waiting = keyed[message.topic] {
                await bind(waiting, message)
            } else {
                refreshToken(message)
            }
        case "broadcast":
            reply(to: message, error: Self.broadcastRefused)
        case "presence":
            reply(to: message, error: Self.presenceRefused)
        default:
            guard channels[message.topic] != nil || keyed[message.topic] != nil else {
                reply(to: message, error: "unmatched topic")
                return
            }
            reply(to: message, error: "unknown event \(message.event)")
        }
    }

    /// The longest topic a channel may have. Every message on the channel repeats it: a
    /// topic near the message limit (64 KiB) on each of a user's 100 channels made each
    /// pushed event of a few bytes cost 6 MB of messages to write.
    static let maxTopicBytes = 256
    static let topicPrefix = "realtime:"

    /// Forgets the channels the server ended (an expired token, a signed-out session, a
    /// refused `access_token`): they no longer count against the socket's channels, and
    /// messages to their topics are answered as to a topic not joined.
    private mutating func forgetEndedChannels() {
        guard channels.values.contains(where: \.isEnded) else { return }
        channels = channels.filter { !$0.value.isEnded }
    }

    private mutating func join(_ message: PhoenixMessage) async {
        // As Supabase Realtime, whose only channel route is `realtime:*`.
        guard message.topic.hasPrefix(Self.topicPrefix) else {
            reply(to: message, error: "unmatched topic: a channel's topic is \(Self.topicPrefix)<name>")
            return
        }
        guard message.topic.utf8.count > Self.topicPrefix.utf8.count else {
            reply(to: message, error: "a channel's topic needs a name after \(Self.topicPrefix)")
            return
        }
        guard message.topic.utf8.count <= Self.maxTopicBytes else {
            reply(to: message, error: "a topic is at most \(Self.maxTopicBytes) bytes")
            return
        }
        if let old = channels.removeValue(forKey: message.topic) { feed.leave(old) }
        dropKeyed(message.topic)
        forgetEndedChannels()
        guard channels.count + keyed.count < feed.settings.maxChannelsPerSocket else {
            reply(to: message, error: "this socket has \(feed.settings.maxChannelsPerSocket) channels joined already")
            return
        }
        guard let payload = message.payload.objectValue else {
            reply(to: message, error: "the payload of phx_join must be an object")
            return
        }
        let config: [String: JSONValue]
        switch payload["config"] {
        case nil, .null?: config = [:]
        case .object(let members)?: config = members
        default:
            reply(to: message, error: "config must be an object")
            return
        }
        if config["presence"]?.objectValue?["enabled"]?.boolValue == true {
            reply(to: message, error: Self.presenceRefused)
            return
        }
        // A user's token, or the app's key (nil): as Supabase, no access_token (or null) is
        // the socket's `apikey`. realtime-js leaves it out while it has no token yet.
        let claims: AccessClaims?
        switch payload["access_token"] {
        case nil, .null?:
            claims = nil
        case .string(let token)?:
            do {
                claims = try userClaims(token)
            } catch {
                reply(to: message, error: error.reason)
                return
            }
        default:
            reply(to: message, error: "access_token must be a string")
            return
        }
        var bindings: [RealtimeBinding] = []
        var entries: [JSONValue] = []
        switch config["postgres_changes"] {
        case nil, .null?: break
        case .array(let list)?: entries = list
        default:
            reply(to: message, error: "config.postgres_changes must be an array")
            return
        }
        guard entries.count <= 100 else {
            reply(to: message, error: "a channel takes at most 100 postgres_changes bindings")
            return
        }
        do {
            for (index, entry) in entries.enumerated() {
                bindings.append(try RealtimeBinding.parse(entry, id: index + 1))
            }
        } catch {
            reply(to: message, error: error.reason)
            return
        }
        guard let claims else {
            joinWithKey(message, bindings: bindings)
            return
        }
        let channel = RealtimeChannel(
            id: feed.nextChannelID(), user: claims.userID, session: claims.sessionID, expiresAt: claims.expiresAt,
            socket: socket, version: version, topic: message.topic, joinRef: message.joinRef ?? message.ref,
            bindings: bindings, open: false, holdLimit: feed.settings.bufferBytes)
        do {
            try await feed.join(channel)
        } catch {
            reply(to: message, error: error.reason)
            return
        }
        if let registered = feed.settings.afterJoinRegistered { await registered() }
        guard !socket.isClosed else {
            feed.leave(channel)
            return
        }
        guard !channel.isEnded else {
            // Its token expired or its session was revoked while the join waited: the client
            // was told (`system`, `phx_close`).
            reply(to: message, error: "the channel was ended while it joined")
            return
        }
        channels[message.topic] = channel
        // The channel is live (its hub may have sent it changes already): they are held until
        // the reply is out, which gives the client the ids it matches them by.
        reply(to: message, ok: Self.joinResponse(bindings))
        let subscribed = channel.systemPayload(ok: true, message: Self.subscribed)
        channel.open(after: bindings.isEmpty ? nil : (event: "system", payload: subscribed))
    }

    static let subscribed = "Subscribed to PostgreSQL"

    /// A join's `ok` response: the bindings in the client's order, each with its id.
    static func joinResponse(_ bindings: [RealtimeBinding]) -> [UInt8] {
        var writer = JSONWriter(capacity: 128 * max(bindings.count, 1))
        writer.beginObject()
        writer.beginArray("postgres_changes")
        for binding in bindings { binding.write(to: &writer) }
        writer.endArray()
        writer.endObject()
        return writer.bytes
    }

    /// A channel joined with the app's key (signed out, or no session yet): answered as any
    /// join, as Supabase answers it (reading as the `anon` role, which sees none of a user's
    /// rows), but kept here only, with no user: nothing can route a row to it until a token
    /// of a user binds it (`bind`). Its bindings are held, parsed, so the socket's channels
    /// without a user together are bounded as one user's are (`maxBindingsPerUser`,
    /// `maxFilterBytesPerUser`): nobody's limits count them otherwise.
    private mutating func joinWithKey(_ message: PhoenixMessage, bindings: [RealtimeBinding]) {
        let settings = feed.settings
        let filterBytes = RealtimeChannel.filterBytes(of: bindings)
        let count = keyed.values.reduce(bindings.count) { $0 + $1.bindings.count }
        guard count <= settings.maxBindingsPerUser else {
            reply(
                to: message,
                error:
                    "this socket's channels without a signed-in user would have \(count) postgres_changes bindings; at most \(settings.maxBindingsPerUser)"
            )
            return
        }
        let bytes = keyed.values.reduce(filterBytes) { $0 + $1.filterBytes }
        guard bytes <= settings.maxFilterBytesPerUser else {
            reply(
                to: message,
                error:
                    "this socket's channels without a signed-in user would have \(bytes) bytes of postgres_changes filters; at most \(settings.maxFilterBytesPerUser)"
            )
            return
        }
        if let refusal = feed.holdKeyed(bindings: bindings.count, filterBytes: filterBytes) {
            reply(to: message, error: refusal.reason)
            return
        }
        let joinRef = message.joinRef ?? message.ref
        keyed[message.topic] = KeyedChannel(joinRef: joinRef, bindings: bindings, filterBytes: filterBytes)
        reply(to: message, ok: Self.joinResponse(bindings))
        if !bindings.isEmpty {
            send(
                topic: message.topic, joinRef: joinRef, event: "system",
                payload: RealtimeChannel.systemPayload(topic: message.topic, ok: true, message: Self.subscribed))
        }
    }

    /// `access_token` on a channel joined with the app's key:
    /// - `null`, or the app's key again: nothing changes (answered `ok`);
    /// - a valid token of a user: the channel becomes that user's, registered as a join with
    ///   that token would be (the user's limits, a session that ends it, an expiry); from
    ///   then on it is as a channel joined with it. Rows committed before are not sent (as
    ///   Supabase: nothing is replayed);
    /// - anything else (invalid, expired, revoked), or a registration refused (the user's
    ///   limits): the channel ends (`system` error, `phx_close`), as a refused `access_token`
    ///   ends a user's channel.
    /// Each such channel binds once at most, and was a join: what binding costs (a token
    /// check, maybe a read of where the user's log stands) is bounded by the join rate.
    private mutating func bind(_ waiting: KeyedChannel, _ message: PhoenixMessage) async {
        let topic = message.topic
        let claims: AccessClaims
        do throws(RealtimeError) {
            switch message.payload.objectValue?["access_token"] {
            case nil, .null?:
                reply(to: message, ok: Array("{}".utf8))
                return
            case .string(let token)?:
                guard let user = try userClaims(token) else {
                    reply(to: message, ok: Array("{}".utf8))
                    return
                }
                claims = user
            default:
                throw RealtimeError("access_token must be a string")
            }
        } catch {
            endKeyed(topic, waiting, reason: "Access token refused: \(error.reason)")
            return
        }
        dropKeyed(topic)
        // Open: the client has its bindings' ids from the join's reply already.
        let channel = RealtimeChannel(
            id: feed.nextChannelID(), user: claims.userID, session: claims.sessionID, expiresAt: claims.expiresAt,
            socket: socket, version: version, topic: topic, joinRef: waiting.joinRef, bindings: waiting.bindings,
            holdLimit: feed.settings.bufferBytes)
        do {
            try await feed.join(channel)
        } catch {
            endKeyed(topic, waiting, reason: "Access token refused: \(error.reason)")
            return
        }
        guard !socket.isClosed else {
            feed.leave(channel)
            return
        }
        // Ended while it registered (its token expired, its session was revoked): the client
        // was told (`system`, `phx_close`).
        guard !channel.isEnded else { return }
        channels[topic] = channel
        reply(to: message, ok: Array("{}".utf8))
    }

    /// Ends a channel joined with the app's key, as the server ends a user's: a `system`
    /// error naming `reason`, then `phx_close`.
    private mutating func endKeyed(_ topic: String, _ waiting: KeyedChannel, reason: String) {
        dropKeyed(topic)
        send(
            topic: topic, joinRef: waiting.joinRef, event: "system",
            payload: RealtimeChannel.systemPayload(topic: topic, ok: false, extension: "system", message: reason))
        send(topic: topic, joinRef: waiting.joinRef, event: "phx_close", payload: Array("{}".utf8))
    }

    /// Forgets the channel joined with the app's key on `topic`, if any, and gives what it
    /// held back to the feed (`holdKeyed`).
    private mutating func dropKeyed(_ topic: String) {
        guard let dropped = keyed.removeValue(forKey: topic) else { return }
        feed.releaseKeyed(bindings: dropped.bindings.count, filterBytes: dropped.filterBytes)
    }

    /// `access_token` on a joined channel, as Supabase Realtime takes it:
    /// - a valid token of the channel's user: the channel follows it (its session, its expiry)
    ///   and delivers;
    /// - none (`null`: what realtime-js and supabase-swift send when their `accessToken`
    ///   callback has no token): nothing changes, as Supabase ignores it;
    /// - the app's key (`isKey`: what supabase-js, supabase-swift and supabase-py send once
    ///   signed out, or when the session could not be had): the channel stays joined but
    ///   delivers nothing until a token of its user comes (Supabase keeps it, reading as the
    ///   `anon` role, which sees no user's rows). It still follows its last user token: it
    ///   ends at that token's `exp` and when its session is revoked;
    /// - anything else (invalid, expired, revoked, another user's) ends it.
    /// Answered `ok` unless it ends the channel (Supabase answers nothing; the clients wait
    /// for no answer).
    private mutating func refreshToken(_ message: PhoenixMessage) {
        forgetEndedChannels()
        guard let channel = channels[message.topic] else {
            reply(to: message, error: "unmatched topic")
            return
        }
        do throws(RealtimeError) {
            switch message.payload.objectValue?["access_token"] {
            case nil, .null?:
                break
            case .string(let token)?:
                guard let claims = try userClaims(token) else {
                    channel.withhold()
                    break
                }
                guard claims.userID == channel.user else { throw RealtimeError("the token belongs to another user") }
                channel.refresh(session: claims.sessionID, expiresAt: claims.expiresAt)
            default:
                throw RealtimeError("access_token must be a string")
            }
            reply(to: message, ok: Array("{}".utf8))
        } catch {
            channels.removeValue(forKey: message.topic)
            feed.end(channel, reason: "Access token refused: \(error.reason)")
        }
    }

    /// The claims of a user's valid token; nil for the app's key (`isKey`, checked only when
    /// `token` is no valid token); throws for anything else.
    private func userClaims(_ token: String) throws(RealtimeError) -> AccessClaims? {
        do {
            return try verify(token)
        } catch {
            if isKey(token) { return nil }
            throw error
        }
    }

    /// Whether `token` is the app's key rather than a user's token: the `apikey` the socket
    /// was opened with, a Supabase API key (`sb_publishable_…`, `sb_secret_…`), or a JWT of
    /// the `anon` role naming no user (a Supabase project's anon key). Never one of this
    /// server's access tokens, which name a user and the `authenticated` role. Read, not
    /// verified: a key grants nothing.
    func isKey(_ token: String) -> Bool {
        guard !token.isEmpty else { return false }  // as Supabase: "" is a token, and invalid
        if token.hasPrefix("sb_") { return true }
        if let apiKey, constantTimeEquals(token.utf8, apiKey.utf8) { return true }
        return Self.isAnonJWT(token)
    }

    /// Whether `token` is a JWT whose claims say `role: anon` and name no `sub`.
    static func isAnonJWT(_ token: String) -> Bool {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let bytes = Base64URL.decode(String(parts[1])),
            case .object(let claims)? = try? JSONValue.parse(bytes, limits: PhoenixMessage.jsonLimits)
        else { return false }
        return claims["role"]?.stringValue == "anon" && claims["sub"] == nil
    }

    private func verify(_ token: String) throws(RealtimeError) -> AccessClaims {
        let now = AuthService.now()
        let claims: AccessClaims
        do {
            claims = try feed.tokens.verify(token, now: now)
        } catch {
            throw RealtimeError("Invalid or expired access_token")
        }
        // The verifier lets a token pass up to `TokenIssuer.leeway` after its `exp` (clock
        // skew between instances), but a channel ends at `exp`: a join with such a token
        // would be answered ok and ended within the second.
        guard now < claims.expiresAt else { throw RealtimeError(RealtimeFeed.tokenExpired) }
        if let revocations = feed.revocations, revocations.isRevoked(claims.sessionID) {
            throw RealtimeError("The session was signed out")
        }
        return claims
    }

    private func reply(to message: PhoenixMessage, ok response: [UInt8]) {
        send(
            topic: message.topic, joinRef: message.joinRef, ref: message.ref, event: "phx_reply",
            payload: PhoenixMessage.reply(ok: true, response: response))
    }

    private func reply(to message: PhoenixMessage, error reason: String) {
        send(
            topic: message.topic, joinRef: message.joinRef, ref: message.ref, event: "phx_reply",
            payload: PhoenixMessage.reply(ok: false, response: PhoenixMessage.reason(reason)))
    }

    private func send(topic: String, joinRef: String?, ref: String? = nil, event: String, payload: [UInt8]) {
        Self.send(
            PhoenixMessage.encode(
                joinRef: joinRef, ref: ref, topic: topic, event: event, payload: payload, version: version),
            on: socket)
    }
}

/// A channel joined with the app's key: what its join gave, kept for the user's token that
/// binds it (`RealtimeSession.bind`).
private struct KeyedChannel {
    let joinRef: String?
    let bindings: [RealtimeBinding]
    /// Their filters' bytes, as the clients sent them.
    let filterBytes: Int
}

/// Whether a socket joined a channel within its grace (`RealtimeFeed.Settings.joinGrace`):
/// when the grace ends, a socket that never joined one successfully is closed (`1000`), or,
/// if a join is under way then, as soon as that join fails. A refused join (a bad token, a
/// refused topic) does not count; heartbeats do not either. A socket that joined once is never
/// closed by it, even after leaving every channel: the clients keep their socket open then, and
/// a closed one reconnects.
final class RealtimeJoinGrace: Sendable {
    private struct State {
        var joined = false
        var joining = false
        var over = false
    }

    let feed: RealtimeFeed
    let socket: WebSocket
    let address: String
    /// When the grace ends (`ContinuousClock`), read by the feed's tick.
    let deadline: ContinuousClock.Instant
    private let state = Mutex(State())

    init(feed: RealtimeFeed, socket: WebSocket, address: String) {
        self.feed = feed
        self.socket = socket
        self.address = address
        deadline = ContinuousClock.now + feed.settings.joinGrace
    }

    /// Whether the grace has ended.
    var isOver: Bool { state.withLock { $0.over } }

    func joinStarted() { state.withLock { $0.joining = true } }

    func joinEnded(succeeded: Bool) {
        let close = state.withLock { state -> Bool in
            state.joining = false
            if succeeded { state.joined = true }
            return state.over && !state.joined
        }
        if close { closeSocket() }
    }

    /// The grace is over (the feed's tick, or a test in its place).
    func end() {
        let close = state.withLock { state -> Bool in
            guard !state.over else { return false }
            state.over = true
            return !state.joined && !state.joining
        }
        if close { closeSocket() }
    }

    private func closeSocket() {
        guard !socket.isClosed else { return }
        feed.closedWithoutJoin.increment()
        let grace = Self.text(feed.settings.joinGrace)
        feed.logger.info(
            "realtime socket closed: no channel joined within \(grace)", metadata: ["ip": "\(address)"])
        socket.close(.normal, reason: "no channel joined within \(grace)")
    }

    /// `30 s`, or `250 ms` for a grace that is not whole seconds.
    static func text(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        if attoseconds == 0 { return "\(seconds) s" }
        return "\(seconds * 1000 + attoseconds / 1_000_000_000_000_000) ms"
    }
}

/// `GET /realtime/v1/websocket`: Supabase Realtime over WebSocket (`postgres_changes` only).
struct RealtimeRoutes: Sendable {
    let feed: RealtimeFeed
    /// When set, the `apikey` query parameter must carry it (as `/rest/v1`'s header).
    let apiKey: String?

    static let path = "/realtime/v1/websocket"

    func register(in routes: inout Routes) {
        routes.add(.get, Self.path, family: .rest, .open { request in try connect(request) })
    }

    func connect(_ request: HTTPRequest) throws -> HTTPResponse {
        var version = PhoenixMessage.Version.v1
        var key: String? = nil
        for (name, value) in try SyncRoutes.uniqueQueryItems(request) {
            switch name {
            case "vsn":
                guard let known = PhoenixMessage.Version(rawValue: value) else {
                    throw APIError.badRequest("invalid_parameter", "vsn must be 1.0.0 or 2.0.0.")
                }
                version = known
            case "apikey":
                key = value
            default:
                break  // clients add their own parameters (log_level, …)
            }
        }
        if let apiKey {
            guard let given = key ?? request.headers["apikey"], constantTimeEquals(given.utf8, apiKey.utf8) else {
                throw RESTError.apiKey
            }
        }
        let accept: String
        switch WebSocketHandshake.accept(request) {
        case .success(let value): accept = value
        case .failure(.unsupportedVersion):
            var response = APIError(
                status: 426, code: "websocket_version", message: "Only WebSocket version 13 is supported."
            ).response(for: .rest)
            response.headers.append(name: "Sec-WebSocket-Version", value: "13")
            return response
        case .failure(.notAHandshake(let reason)):
            throw APIError.badRequest("websocket_required", reason)
        }
        try feed.openSocket()
        var settings = WebSocketSettings()
        settings.outputBufferLimit = feed.settings.bufferBytes
        settings.idleTimeout = .seconds(feed.settings.idleTimeout)
        let feed = self.feed
        let chosen = version
        let address = request.remoteAddress
        let socketKey = key ?? request.headers["apikey"]
        return .webSocket(accept: accept, settings: settings) { socket in
            var session = RealtimeSession(
                feed: feed, socket: socket, version: chosen, address: address, apiKey: socketKey)
            await session.run()
        }
    }
}
