/// The life of one connection as a pure state machine: the event loop reports what happened
/// (bytes arrived, a head was parsed, a response is ready, the output drained, a deadline
/// passed) and carries out the action it gets back. No I/O and no clock of its own, so every
/// transition is unit-tested without sockets (`ConnectionStateMachineTests`).
///
///     idle ──bytes──▶ readingHead ──head──▶ readingBody ──request──▶ handling ──response──▶ writing
///       ▲                  │  └──────early answer (route, limit)─────────────────────────────▶ │
///       └──────────────────┴─────────────────────── drained, keep-alive ◀──────────────────────┘
///     writing ──drained, close──▶ closed        writing ──drained, body left unread──▶ lingering ──EOF/deadline──▶ closed
///
/// A `lingering` connection has sent its final response and half-closed its side; it reads
/// and drops what the client is still sending so that closing does not reset the connection
/// before the client has read the answer (a `413` sent while the body is on its way). It
/// closes after the linger time passes with nothing arriving, and at the latest the body
/// timeout after lingering began: a client still uploading a body it did not need (many read
/// the answer only once their upload is done) gets to finish it and read the answer instead
/// of a reset, as long as it keeps sending.
///
/// A streamed response (`HTTPBodyStream`) goes `handling ──head──▶ streaming ──end──▶ writing`:
/// while `streaming`, its producer writes the body over time; nothing is due from the client
/// (no deadline) unless the socket stops taking output (the write timeout), and the client
/// closing its side ends it, since nobody is left to read it.
///
/// A WebSocket upgrade goes `handling ──101──▶ webSocket ──close frame queued──▶ writing`:
/// frames flow both ways; the connection is closed when nothing arrives for the idle timeout
/// or the client does not read what is queued within the write timeout. Once the server's
/// close frame is queued the connection lingers (the client's answering close is read and
/// dropped); after the client's close frame it closes once the answer is written.
struct ConnectionStateMachine {
    enum State: Equatable {
        /// Waiting for the first byte of a request (a new or a kept-alive connection).
        case idle
        /// Part of a request head has arrived.
        case readingHead
        /// The head was admitted; its body is arriving.
        case readingBody
        /// A handler is working on the request; nothing more is parsed until it answers, so
        /// pipelined responses stay in order.
        case handling
        /// A response is queued; `after` says what follows once it is written.
        case writing(after: AfterWrite)
        /// A streamed response's head is queued and its body is being produced; `after` says
        /// what follows once its end is written.
        case streaming(after: AfterWrite)
        /// Upgraded to WebSocket: frames flow both ways.
        case webSocket
        /// The final response is out and the write side shut; unread input is dropped.
        case lingering
        case closed
    }

    enum AfterWrite: Equatable {
        /// Wait for the next request on this connection.
        case nextRequest
        /// Close the connection.
        case close
        /// Part of a body was never read: half-close and drain before closing.
        case linger
    }

    /// When the connection's current deadline passes, what it means.
    enum Deadline: Equatable {
        /// Nothing is due from the client (a handler runs; it bounds itself).
        case none
        /// Close quietly: an idle keep-alive or new connection, a client not reading its
        /// response, or the end of lingering.
        case close
        /// Answer `408` and close: a head or body did not arrive in time.
        case requestTimeout
    }

    enum Action: Equatable {
        case none
        /// Hand the complete request to the application.
        case dispatch
        /// Drop the request the parser completed: it was answered from its head already.
        case ignoreRequest
        /// Queue `100 Continue` before the body is read.
        case sendContinue
        /// Shut the write side and start dropping input (lingering close).
        case shutdownWrite
        case close
        /// Queue a `408` and close after writing it.
        case sendRequestTimeout
        /// Graceful shutdown began during a streamed response: tell its producer.
        case endStream
        /// Graceful shutdown began on a WebSocket: send close `1001`.
        case endWebSocket
    }

    struct Timeouts: Equatable {
        /// For the whole head, from its first byte (and for a new connection's silence).
        var header: UInt64
        /// For the whole body, from the head's admission.
        var body: UInt64
        var keepAlive: UInt64
        var write: UInt64
        var linger: UInt64
    }

    private(set) var state: State = .idle
    private(set) var deadline: UInt64
    private(set) var deadlineKind: Deadline = .close
    /// The head just admitted has no body: the parser's next `.request` is this request.
    private var requestAnsweredEarly = false
    /// When lingering ends whatever still arrives (the body timeout after it began).
    private var lingerEnds: UInt64 = 0
    private var shuttingDown = false
    /// A WebSocket's idle timeout, and whether its output is blocked (the write timeout runs).
    private var webSocketIdle: UInt64 = 0
    private var outputBlocked = false
    let timeouts: Timeouts

    /// A new connection: it must send a request head within the header timeout.
    init(timeouts: Timeouts, now: UInt64) {
        self.timeouts = timeouts
        deadline = now &+ timeouts.header
    }

    /// Whether a handler is running.
    var isHandling: Bool { state == .handling }

    /// Whether a streamed response's body is being produced.
    var isStreaming: Bool {
        if case .streaming = state { return true }
        return false
    }

    /// Whether the connection is an upgraded WebSocket.
    var isWebSocket: Bool { state == .webSocket }

    /// Whether the connection may be closed now without losing anything in flight (idle,
    /// between requests).
    var isIdle: Bool { state == .idle }

    // MARK: - Input

    /// Request bytes arrived (not while lingering: those are dropped).
    mutating func bytesArrived(now: UInt64) {
        switch state {
        case .idle:
            state = .readingHead
            setDeadline(.requestTimeout, now &+ timeouts.header)
        default:
            // Nothing else moves a deadline: the head and the body each have one deadline
            // for the whole of them, set when they start. Restarting it on every read would
            // let a client trickling a byte every few seconds keep its slot forever.
            break
        }
    }

    /// Bytes arrived while lingering (and were dropped): the client is still sending. It
    /// lingers the linger time again, never past the body timeout from when lingering began.
    mutating func lingeringInputArrived(now: UInt64) {
        guard state == .lingering else { return }
        setDeadline(.close, min(now &+ timeouts.linger, lingerEnds))
    }

    /// The application admitted a complete head: read its body (if any), all of it within
    /// the body timeout from now.
    mutating func headAdmitted(hasBody: Bool, expectsContinue: Bool, now: UInt64) -> Action {
        guard state == .readingHead || state == .idle else { return .none }
        state = .readingBody
        if hasBody {
            setDeadline(.requestTimeout, now &+ timeouts.body)
            return expectsContinue ? .sendContinue : .none
        }
        return .none
    }

    /// The application answered from the head alone (or the server refused the rest of a body
    /// being read: the input budget). Returns what follows that answer. A body not yet read
    /// is never read: the connection lingers and closes.
    mutating func answeredFromHead(hasBody: Bool, keepAlive: Bool) -> AfterWrite {
        let after: AfterWrite = hasBody ? .linger : (keepAlive && !shuttingDown ? .nextRequest : .close)
        requestAnsweredEarly = !hasBody
        state = .writing(after: after)
        setDeadline(.none, 0)
        return after
    }

    /// The parser completed a request (head and body).
    mutating func requestComplete() -> Action {
        if requestAnsweredEarly {
            requestAnsweredEarly = false
            return .ignoreRequest
        }
        guard state == .readingBody else { return .ignoreRequest }
        state = .handling
        setDeadline(.none, 0)
        return .dispatch
    }

    /// A final response was queued. `keepAlive` is what the request and the response allow.
    /// Returns what follows the response.
    @discardableResult
    mutating func responseQueued(keepAlive: Bool) -> AfterWrite {
        let after: AfterWrite = keepAlive && !shuttingDown ? .nextRequest : .close
        state = .writing(after: after)
        setDeadline(.none, 0)
        return after
    }

    /// The head of a streamed response was queued (instead of `responseQueued`): its body
    /// follows over time. `keepAlive`: the request, the response and the body's framing
    /// allow another request after it (a close-delimited body does not).
    @discardableResult
    mutating func streamStarted(keepAlive: Bool) -> AfterWrite {
        guard state == .handling else { return .close }
        let after: AfterWrite = keepAlive && !shuttingDown ? .nextRequest : .close
        state = .streaming(after: after)
        setDeadline(.none, 0)
        return after
    }

    /// A `101` to WebSocket was queued: frames flow from now on; nothing arriving for
    /// `idleTimeout` closes the connection.
    mutating func webSocketStarted(idleTimeout: UInt64, now: UInt64) {
        guard state == .handling else { return }
        state = .webSocket
        webSocketIdle = idleTimeout
        outputBlocked = false
        setDeadline(.close, now &+ idleTimeout)
    }

    /// A frame arrived on the WebSocket: the idle timeout starts again (unless the client is
    /// not reading: then the write timeout keeps running).
    mutating func webSocketActivity(now: UInt64) {
        guard state == .webSocket, !outputBlocked else { return }
        setDeadline(.close, now &+ webSocketIdle)
    }

    /// The server's close frame is queued: write it, then half-close and drop what the
    /// client still sends (its answering close) until it closes or the linger time passes.
    mutating func webSocketEnded() {
        guard state == .webSocket else { return }
        state = .writing(after: .linger)
        if !outputBlocked { setDeadline(.none, 0) }
    }

    /// The client's close frame arrived and the answer is queued: close once it is written.
    mutating func webSocketClosedByPeer() {
        guard state == .webSocket else { return }
        state = .writing(after: .close)
        if !outputBlocked { setDeadline(.none, 0) }
    }

    /// The producer finished and the end of the body is queued: the rest is an ordinary write.
    /// A write deadline already running (the client is behind) stays.
    mutating func streamEnded() {
        guard case .streaming(let after) = state else { return }
        state = .writing(after: after)
    }

    /// The producer gave up without finishing its body: what it wrote is sent, then the
    /// connection closes without the end of the body, so the client cannot take a cut-off
    /// body for a complete one.
    mutating func streamAbandoned() {
        guard isStreaming else { return }
        state = .writing(after: .close)
    }

    /// The bytes could not be parsed: a final error response is queued, then close.
    mutating func protocolErrorQueued() {
        state = .writing(after: .close)
        requestAnsweredEarly = false
        setDeadline(.none, 0)
    }

    // MARK: - Output

    /// The socket would not take all of the queued output: the client must read it in time.
    mutating func writeBlocked(now: UInt64) {
        if state == .webSocket {
            if !outputBlocked { setDeadline(.close, now &+ timeouts.write) }
            outputBlocked = true
            return
        }
        if deadlineKind != .close || deadline == 0 {
            setDeadline(.close, now &+ timeouts.write)
        }
    }

    /// Some output went out while blocked: the client is reading, extend its time.
    mutating func wroteSome(now: UInt64) {
        switch state {
        case .webSocket:
            if outputBlocked { setDeadline(.close, now &+ timeouts.write) }
        case .writing, .streaming:
            if deadlineKind == .close { setDeadline(.close, now &+ timeouts.write) }
        default:
            break
        }
    }

    /// All queued output was written. `hasBufferedInput`: bytes of a next request wait in
    /// the parser.
    mutating func outputDrained(hasBufferedInput: Bool, now: UInt64) -> Action {
        outputBlocked = false
        switch state {
        case .webSocket:
            // The client has read everything: it is idle-timed again.
            setDeadline(.close, now &+ webSocketIdle)
            return .none
        case .writing(.nextRequest):
            if hasBufferedInput {
                state = .readingHead
                setDeadline(.requestTimeout, now &+ timeouts.header)
            } else {
                state = .idle
                setDeadline(.close, now &+ timeouts.keepAlive)
            }
            return .none
        case .writing(.close):
            state = .closed
            return .close
        case .writing(.linger):
            state = .lingering
            lingerEnds = now &+ max(timeouts.body, timeouts.linger)
            setDeadline(.close, now &+ timeouts.linger)
            return .shutdownWrite
        case .readingBody:
            // `100 Continue` went out; the body is still due under the body deadline.
            return .none
        case .streaming:
            // The client has read everything so far; the producer sets the pace now.
            setDeadline(.none, 0)
            return .none
        default:
            return .none
        }
    }

    // MARK: - Time, peers and shutdown

    /// The deadline passed (the loop calls this when `now >= deadline`).
    mutating func deadlinePassed() -> Action {
        switch deadlineKind {
        case .none:
            return .none
        case .close:
            state = .closed
            return .close
        case .requestTimeout:
            state = .writing(after: .close)
            setDeadline(.close, deadline &+ timeouts.write)
            return .sendRequestTimeout
        }
    }

    /// The peer will send nothing more. Close unless a response is still owed or queued.
    mutating func peerClosedInput() -> Action {
        switch state {
        case .idle, .readingHead, .readingBody, .lingering, .streaming, .webSocket:
            // A stream has no end of its own to wait for: nobody is left to read it (and a
            // dead stream would otherwise be found only at its next write).
            state = .closed
            return .close
        case .handling, .writing, .closed:
            return .none
        }
    }

    /// Graceful shutdown began: idle connections close now, the others after their
    /// current response (a streamed one's producer is told).
    mutating func shutdownBegan() -> Action {
        shuttingDown = true
        switch state {
        case .idle:
            state = .closed
            return .close
        case .writing(.nextRequest):
            state = .writing(after: .close)
            return .none
        case .streaming:
            state = .streaming(after: .close)
            return .endStream
        case .webSocket:
            return .endWebSocket
        default:
            return .none
        }
    }

    private mutating func setDeadline(_ kind: Deadline, _ time: UInt64) {
        deadlineKind = kind
        deadline = time
    }
}
