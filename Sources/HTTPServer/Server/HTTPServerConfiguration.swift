/// Settings of the HTTP server. Every default is the one stated in its comment.
public struct HTTPServerConfiguration: Sendable {
    /// Address to listen on; `::` listens on IPv6 and IPv4. Default `127.0.0.1`.
    public var host = "127.0.0.1"
    /// Port; 0 picks a free one (see `HTTPServer.port`). Default 8080.
    public var port = 8080
    /// Request line, header and body limits. Default `HTTPParserLimits.default`
    /// (8 KiB, 32 KiB / 100 fields, 10 MiB).
    public var limits = HTTPParserLimits.default
    /// Time to receive a whole request head once its first byte arrived → `408`; also how
    /// long a new connection may stay silent before it is closed. Default 10 s.
    public var headerTimeout: Duration = .seconds(10)
    /// Time to receive a whole request body once its head was admitted → `408`. A deadline
    /// for the whole body, not for each pause: a client trickling a byte now and then must
    /// not keep its connection slot for longer than this. Default 30 s.
    public var bodyTimeout: Duration = .seconds(30)
    /// How long a keep-alive connection stays open waiting for its next request. Default 60 s.
    public var keepAliveTimeout: Duration = .seconds(60)
    /// Longest time a response may wait for the client to read it → close. Default 30 s.
    public var writeTimeout: Duration = .seconds(30)
    /// After a final response sent before its request body was read (a `413`), how long
    /// the server keeps reading and dropping that body so the client sees the answer
    /// instead of a reset. Default 2 s.
    public var lingerTimeout: Duration = .seconds(2)
    /// Most open connections; more are answered `503` and closed. Default 10,000.
    public var maxConnections = 10_000
    /// Most open connections from one client (an IPv4 address, or an IPv6 /64); more are
    /// answered `503` and closed, like connections over `maxConnections`. 0: no such cap.
    /// Decided when a connection is accepted, from its peer address alone: a proxy's
    /// `X-Forwarded-For` is not known yet, so connections from `trustedProxies` are exempt
    /// (the proxy carries many clients; cap per client there). Default 256.
    public var maxConnectionsPerClient = 256
    /// Bytes the server may hold in its output buffers for clients that have not read them
    /// yet, over all connections and loops (the output `ByteBudget`): answers, streamed bodies and
    /// WebSocket messages. An answer to a `GET` whose body is larger than 64 KiB and would
    /// take the total past it is not queued: the client gets `HTTPResponder.refuseAnswer` (a
    /// `503`) instead; such an answer larger than this is always refused. Smaller answers, and
    /// answers to requests that may have changed something (`POST`, `PATCH` …), always go and
    /// count while unsent. Streamed bodies and WebSockets count what their writers hold; while
    /// the total is at or past this, one with bytes still waiting for its client gets nothing more
    /// (`HTTPBodyWriter.writeIfRoom` says `.full`, `write` waits for its buffer to empty).
    /// Default 256 MiB.
    public var maxBufferedOutput = 256 * 1024 * 1024
    /// Bytes of the large whole answers (bodies over 64 KiB) counted in `maxBufferedOutput`
    /// that one owner may hold, over all its connections and the loops they are on: an
    /// account when the responder names one (`HTTPResponder.shareKey(context:)`), else the
    /// request's client address, counted as for `maxBufferedInputPerClient`. An answer to a
    /// `GET` that would take its owner past it is refused like one over `maxBufferedOutput`
    /// (`HTTPResponder.refuseAnswer(context:over:)` with `.perClient`), so one account or
    /// address asking for large answers on many connections and never reading them cannot
    /// hold the whole budget and refuse everyone else's; an answer to a request that may have
    /// changed something counts in its owner's share but is never refused. An answer holds
    /// its share whole from when it is queued until it is sent or its connection closes.
    /// Streamed bodies and WebSocket messages have no share. 0, or at least
    /// `maxBufferedOutput`: no such share (and no look-up). Default 64 MiB (a quarter of the
    /// default `maxBufferedOutput`).
    public var maxBufferedOutputPerClient = 64 * 1024 * 1024
    /// Bytes of request bodies the server may hold while it reads them, over all connections
    /// and loops (the input `ByteBudget`). A body whose `Content-Length` is over 64 KiB and would take
    /// the total past it is not read: the client gets `HTTPResponder.refuseBody` (a `503`)
    /// from the head, and the connection closes after it; a chunked body is counted as it
    /// grows past 64 KiB and cut off with the same answer once it does not fit. Smaller bodies
    /// always pass. A body counts from its head until its request is answered (a handler's
    /// task gives it back when it returns) or the connection closes while it is being read.
    /// Default 256 MiB.
    public var maxBufferedInput = 256 * 1024 * 1024
    /// Bytes of those bodies one owner may hold, over all its connections and the loops
    /// they are on: an account when the responder names one from the head
    /// (`HTTPResponder.shareKey(context:)`, for requests that carry a token), else the
    /// request's client address, counted as for `maxConnectionsPerClient` (an IPv4 address,
    /// an IPv6 /64) but behind a trusted proxy the client it forwarded, not the proxy. A body
    /// over 64 KiB that would take its owner past it is refused like one over
    /// `maxBufferedInput` (`HTTPResponder.refuseBody(context:over:)` with `.perClient`), so
    /// one account or address with many connections cannot hold the whole budget and refuse
    /// everyone else's large bodies. 0, or at least `maxBufferedInput`: no such share (and no
    /// look-up). Default 64 MiB (a quarter of the default `maxBufferedInput`).
    public var maxBufferedInputPerClient = 64 * 1024 * 1024
    /// Event loops: each has its own thread, epoll instance, listening socket (all bound to
    /// the same port with `SO_REUSEPORT`: the kernel spreads new connections over them),
    /// connections and `LoopExecutor`. `maxConnections` and `maxConnectionsPerClient` hold
    /// across all of them. Values below 1 count as 1. Default 1.
    public var loops = 1
    /// How the kernel schedules the loops' threads (see `LoopScheduling`). Default `.normal`.
    public var loopScheduling = LoopScheduling.normal
    /// Reverse proxies whose `X-Forwarded-For` names the client (see `TrustedProxies`).
    /// Default none: the peer is the client.
    public var trustedProxies = TrustedProxies()
    /// How long graceful shutdown waits for in-flight requests. Default 10 s.
    public var shutdownTimeout: Duration = .seconds(10)
    /// The `Server` header. Default `trunk-sync`.
    public var serverName = "trunk-sync"

    /// The defaults.
    public init() {}
}

/// How the kernel schedules an HTTP server's event-loop threads (`sched_setscheduler(2)`).
public enum LoopScheduling: String, Sendable, CaseIterable {
    /// `SCHED_OTHER`: a loop woken by a request may preempt whatever runs on its core.
    case normal
    /// `SCHED_BATCH`: a woken loop does not preempt a running thread; it runs when that
    /// thread's time slice ends or it waits, and then handles everything that arrived
    /// meanwhile in one pass. Where the loops share their cores with other busy threads
    /// (PostgreSQL beside the server, more loops than idle cores), a loop then sleeps and
    /// wakes about half as often per request and the preempted thread keeps its cache; a
    /// request waits at most one time slice of the thread it would have preempted. On an
    /// idle core it changes nothing. Needs no privilege; where the kernel refuses it, the
    /// loop logs a warning and runs as `.normal`.
    case batch
}

extension Duration {
    var nanosecondsClamped: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }
}
