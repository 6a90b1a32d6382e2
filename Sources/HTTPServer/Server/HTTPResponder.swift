/// The application behind an `HTTPServer`: it decides about each request in stages, while
/// the server only speaks HTTP (sockets, parsing, framing, deadlines, keep-alive).
///
/// Every method is called on the event loop's thread and must return quickly without
/// blocking: anything that waits goes into a `.later` reply, which runs as a task.
///
/// One request goes through:
/// 1. `admit(_:client:)` when its head is complete, before any body byte is read: route it,
///    pick its body limit, or answer at once (`404`, `405`, `413`, a CORS preflight).
/// 2. `respond(to:context:)` once the whole body arrived (at most the admitted limit).
/// 3. `complete(_:context:)` just before the response is written: add headers and observe
///    it (access log, metrics).
public protocol HTTPResponder: Sendable {
    /// What the application carries from `admit` to `complete` for one request.
    associatedtype Context: Sendable

    /// Decides from the head alone. `client` is the client's address as text: the peer's,
    /// or, when the peer is a trusted proxy, the one it forwarded (`TrustedProxies`).
    func admit(_ head: HTTPRequestHead, client: String) -> Admission<Context>

    /// Answers the complete request, at once or later.
    func respond(to request: consuming HTTPRequest, context: Context) -> Reply<Context>

    /// Called with each final response before it is serialized.
    func complete(_ response: inout HTTPResponse, context: Context)

    /// The response for bytes that are not an acceptable request (a `400`, `408`, `413`,
    /// `431` …); the connection closes after it. `peer` is the connection's peer address.
    func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse

    /// The `503` for a connection the server cannot take (connection limit, no descriptors).
    func refuseConnection() -> HTTPResponse

    /// The `503` sent instead of the answer to a `GET` the server cannot hold now: its body
    /// is larger than `ByteBudget.smallAnswer` and the output buffers already hold as much
    /// unread output as `limit` allows: `.total`, `HTTPServerConfiguration.maxBufferedOutput`
    /// over all connections; `.perClient`, `HTTPServerConfiguration.maxBufferedOutputPerClient`
    /// for the large answers of this request's owner (`shareKey(context:)`). Then passed to
    /// `complete(_:context:)` like any response. Keep it small. Default: `refuseConnection()`.
    func refuseAnswer(context: Context, over limit: BudgetLimit) -> HTTPResponse

    /// The `503` sent instead of reading a request's body that the server cannot hold now:
    /// it is larger than `ByteBudget.smallBody` and the bodies being read already hold as
    /// much as `limit` allows: `.total`, `HTTPServerConfiguration.maxBufferedInput` over
    /// all connections; `.perClient`, `HTTPServerConfiguration.maxBufferedInputPerClient`
    /// for the bodies of this request's owner (`shareKey(context:)`). Decided from the
    /// head for a `Content-Length`, mid-body for a chunked body. The connection closes after
    /// it. Then passed to `complete(_:context:)` like any response. Keep it small. Default:
    /// `refuseConnection()`.
    func refuseBody(context: Context, over limit: BudgetLimit) -> HTTPResponse

    /// Whose share of the input budget (`HTTPServerConfiguration.maxBufferedInputPerClient`)
    /// the body of an admitted request counts against, and of the output budget
    /// (`maxBufferedOutputPerClient`) its large answer: the account the application
    /// authenticated from the head (`ShareKey.account`), or nil for the request's client
    /// address. Asked only for a body larger than `ByteBudget.smallBody` (from the head for a
    /// `Content-Length`, when a chunked body first grows past it) and for a whole answer
    /// larger than `ByteBudget.smallAnswer` (with the context the answer came with), and only
    /// while that budget's per-client shares are on: an ordinary request never calls it.
    /// Default: nil.
    func shareKey(context: Context) -> ShareKey?

    /// The loop has handled a batch of events and is about to wait: write what is due of
    /// anything buffered (log lines). Returns the most milliseconds the loop may wait before
    /// it calls this again (what it keeps is due by then), or nil: no limit.
    func loopWillWait() -> Int32?

    /// The loop has stopped: write everything it buffered.
    func loopDidStop()
}

/// The decision about a request head.
public enum Admission<Context: Sendable>: Sendable {
    /// Read the body, at most `bodyLimit` bytes (a longer chunked body fails with `413`).
    case readBody(bodyLimit: Int, Context)
    /// Answer now without reading the body. If a body was announced, the connection closes
    /// after this answer (a body too large for the route).
    case answer(HTTPResponse, Context)
    /// Read the body (within the server's limit) without keeping it, then answer: for
    /// answers that do not depend on it (`404`, `405`), keeping the connection usable.
    case answerAfterBody(HTTPResponse, Context)
}

/// The answer to a complete request.
public enum Reply<Context: Sendable>: Sendable {
    /// The response is ready (computed on the loop).
    case now(HTTPResponse, Context)
    /// The response needs waiting (database, long-poll): runs as a task; the context it
    /// returns replaces the one given (for what the handler learned, such as the user).
    case later(@Sendable () async -> (HTTPResponse, Context))
}

extension HTTPResponder {
    public func refuseAnswer(context: Context, over limit: BudgetLimit) -> HTTPResponse { refuseConnection() }
    public func refuseBody(context: Context, over limit: BudgetLimit) -> HTTPResponse { refuseConnection() }
    public func shareKey(context: Context) -> ShareKey? { nil }
    public func loopWillWait() -> Int32? { nil }
    public func loopDidStop() {}
}
