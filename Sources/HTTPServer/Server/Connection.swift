/// One client connection: its socket, parser, output and lifecycle. Touched only by the
/// event loop thread.
final class Connection<Context: Sendable> {
    let fd: Int32
    let id: UInt64
    /// The peer's address as text.
    let remoteAddress: String
    /// What the connection counts against in the per-client cap (nil: not counted).
    let clientKey: IPAddress?
    /// The peer is a trusted proxy: each request's client comes from `X-Forwarded-For`.
    let peerIsTrustedProxy: Bool
    /// The peer's address (nil: not an IP peer).
    let peerAddress: IPAddress?
    /// The client of the current request: the peer, or whom a trusted proxy forwarded.
    var clientAddress: String
    /// `clientAddress` as an address: whose share of the input budget a large body of a
    /// request without an account counts against.
    var clientIP: IPAddress?
    var parser: HTTPRequestParser
    var lifecycle: ConnectionStateMachine

    /// Bytes to send and how many of them went out already.
    var output: [UInt8] = []
    var outputOffset = 0
    /// Bytes of `output` counted in the server's output `ByteBudget`: its unsent bytes while they
    /// are a whole answer's (not an open stream's or WebSocket's), as of the last write.
    var heldOutput = 0
    /// Whose share of the output budget (`Shares`) the large whole answer being sent holds
    /// (nil: none), and how many bytes: the whole answer's, held until it is sent or the
    /// connection closes (not settled per write, unlike `heldOutput`).
    var outputShare: ShareKey? = nil
    var outputShareBytes = 0
    /// Bytes of the request body being read counted in the server's input `ByteBudget` (0: none,
    /// a small body), until it is answered or dropped (a handler's task then holds them), or
    /// the connection closes.
    var heldInput = 0
    /// Whose share of the input budget (`Shares`) `heldInput` also counts in (nil: none).
    var inputShare: ShareKey? = nil
    /// The body being read is chunked: its buffer is counted in the input `ByteBudget` as it grows.
    var countsChunkedInput = false
    /// Edge-triggered epoll: remember readiness until a call says EAGAIN.
    var readable = false
    var writable = true
    /// The peer closed its sending side: no more requests will come.
    var peerClosedInput = false
    /// The socket reported an error or a hang-up (reset) with bytes still to read: no
    /// answer can be sent any more.
    var hungUp = false
    /// Its `drive` ran out of turns with work left: it is in the loop's deferred list.
    var driveDeferred = false
    var handlerTask: Task<Void, Never>? = nil

    /// The request being answered: the application's context and what framing needs.
    var context: Context? = nil
    /// The answer decided from the head, sent once the (discarded) body has arrived.
    var prepared: HTTPResponse? = nil
    var requestKeepAlive = false
    var requestIsHead = false
    /// A `GET`: its answer may be refused for the output budget (retrying it changes nothing).
    var requestIsGet = false
    var requestIsHTTP10 = false
    /// The streamed body being sent, while the lifecycle is `streaming`.
    var stream: ActiveStream? = nil
    /// The WebSocket, while the lifecycle is `webSocket`.
    var webSocket: ActiveWebSocket? = nil

    init(
        fd: Int32, id: UInt64, remoteAddress: String, peerAddress: IPAddress?, clientKey: IPAddress?,
        peerIsTrustedProxy: Bool, limits: HTTPParserLimits, lifecycle: ConnectionStateMachine
    ) {
        self.fd = fd
        self.id = id
        self.remoteAddress = remoteAddress
        self.peerAddress = peerAddress
        self.clientIP = peerAddress
        self.clientKey = clientKey
        self.peerIsTrustedProxy = peerIsTrustedProxy
        self.clientAddress = remoteAddress
        self.parser = HTTPRequestParser(limits: limits, bodyMode: .collect)
        self.lifecycle = lifecycle
    }

    var hasPendingOutput: Bool { outputOffset < output.count }
}

/// A streamed response body in progress on a connection.
struct ActiveStream {
    /// Also holds the producer's task while it runs (a detached body outlives it).
    let writer: HTTPBodyWriter
    /// Chunked (HTTP/1.1) or delimited by closing the connection (HTTP/1.0).
    let chunked: Bool
    let shutdown: HTTPBodyStream.Shutdown
}

/// An upgraded connection's WebSocket: the client's frames, the session's side, its task.
final class ActiveWebSocket {
    var parser: WebSocketFrameParser
    let socket: WebSocket
    let session: Task<Void, Never>
    /// The server's close frame is queued: nothing else is sent after it.
    var closeSent = false

    init(parser: WebSocketFrameParser, socket: WebSocket, session: Task<Void, Never>) {
        self.parser = parser
        self.socket = socket
        self.session = session
    }
}
