import CSystem
import Foundation
import Logging
import Synchronization

/// The epoll loop behind `HTTPServer`. All connection state is confined to the loop's
/// thread; other threads reach it only through the `Mailbox`.
///
/// The loop knows HTTP and nothing else: what a request means is the `HTTPResponder`'s
/// business, and each connection's lifecycle is its `ConnectionStateMachine`'s. The loop
/// does the I/O those two ask for.
final class EventLoop<Responder: HTTPResponder>: @unchecked Sendable {
    typealias Context = Responder.Context

    private let configuration: HTTPServerConfiguration
    private let responder: Responder
    private let logger: Logger
    private let mailbox = Mailbox<Context>()
    /// Handlers run here: on this loop's thread (`LoopExecutor`).
    let executor: LoopExecutor
    private let stopped = StopSignal()
    /// Whether the loop's thread was started: a loop told to stop before it ran never will,
    /// and its executor runs what it is given off the loop at once.
    private let lifecycle = Mutex(Lifecycle.new)
    private enum Lifecycle { case new, running, stopped }
    private let timeouts: ConnectionStateMachine.Timeouts

    private var epoll: Int32 = -1
    private var listener: Int32 = -1
    private var reserveFD: Int32 = -1
    private(set) var boundPort = 0
    private var connections: [Int32: Connection<Context>] = [:]
    /// This loop's streamed bodies, for fan-outs (`HTTPBodyFanOut`).
    private let streamTable = StreamTable()
    /// The server's caps, shared by all its loops: connections in all, and per client
    /// (`IPAddress.client`).
    private let caps: ConnectionCaps
    /// The server's budget for answers waiting in output buffers, shared by all its loops.
    private let outputBudget: ByteBudget
    /// The server's budget for request bodies being read, shared by all its loops.
    private let inputBudget: ByteBudget
    /// Each owner's share of it, shared by all its loops (nil: no per-client share).
    private let inputShares: Shares?
    /// Each owner's share of the output budget's large answers, shared by all its loops (nil:
    /// no per-client share).
    private let outputShares: Shares?
    /// This loop's place among the server's loops (0 for the first), for its thread's name.
    let index: Int
    /// Connections refused by the per-client cap since it was last logged, and the last
    /// client refused: one line per 10 s at most, however hard someone pushes (the sweep
    /// writes what is left after a burst).
    private var refusedPerClient = RefusalTally()
    private var lastRefusedClient: IPAddress? = nil
    /// Answers refused for the output budget since it was last logged, likewise.
    private var refusedAnswers = RefusalTally()
    /// Answers refused for their owner's share of it since it was last logged, likewise.
    private var refusedAnswerShares = RefusalTally()
    /// Request bodies refused for the input budget since it was last logged, likewise.
    private var refusedBodies = RefusalTally()
    /// Request bodies refused for their owner's share of it since it was last logged, likewise.
    private var refusedShares = RefusalTally()
    private var nextConnectionID: UInt64 = 0
    private var shuttingDown = false
    /// The accept queue may hold connections no new edge will report (accept failed for want
    /// of descriptors or memory): retry from the periodic sweep.
    private var acceptRetryPending = false
    /// Gives freed memory back after a burst of connections or requests.
    private var memoryRelease = MemoryRelease()
    private var shutdownDeadline: UInt64 = 0
    private var now: UInt64 = 0
    private let dates = DateHeaderCache()

    private let connectionCount = Atomic<Int>(0)
    private let inFlightCount = Atomic<Int>(0)

    private static var listenerToken: UInt64 { UInt64.max }
    private static var wakeToken: UInt64 { UInt64.max - 1 }
    private static var readChunk: Int { 64 * 1024 }
    /// Rounds one call of `drive` may make (each a read, a parsed request, a flush) before
    /// the connection yields to the loop's others: a client pipelining requests that the
    /// loop answers at once (`/healthz`, `/openapi.json`, a `404`, a `401`) as fast as it
    /// reads the answers would otherwise keep the loop in one connection for as long as it
    /// goes on, and every other connection of the loop would wait. About 30 answered
    /// requests, or 4 MiB read, per turn.
    private static var driveRoundsPerTurn: Int { 64 }
    /// Connections whose turn ended with work left, driven again once the loop has handled
    /// what else is ready (their data is already read or still in the socket: edge-triggered
    /// epoll would not report it again).
    private var deferredDrives: [(fd: Int32, id: UInt64)] = []
    /// Where every connection's reads land first (loop thread only). Reading straight into
    /// each parser's buffer made every connection hold a zero-filled 64 KiB buffer for its
    /// whole life; copying the few bytes a read returns keeps idle connections small.
    private var readBuffer = [UInt8](repeating: 0, count: 64 * 1024)
    /// Parser and output buffers that connections gave up when they went idle, for the next
    /// connection that reads a request (loop thread only): an idle connection holds no
    /// buffer, and a loop answering requests on many keep-alive connections does not
    /// allocate (and zero) two per request. At most `spareLimit` of each, small ones only.
    private var spareInputs: [[UInt8]] = []
    private var spareOutputs: [[UInt8]] = []
    private static var spareLimit: Int { 64 }
    private static var spareMaxBytes: Int { 4096 }
    private let serverLine: [UInt8]

    private let epollIn = csystem_epollin()
    private let epollOut = csystem_epollout()
    private let epollRDHUP = csystem_epollrdhup()
    private let epollHUP = csystem_epollhup()
    private let epollErr = csystem_epollerr()
    private let epollET = csystem_epollet()

    init(
        configuration: HTTPServerConfiguration, responder: Responder, logger: Logger, index: Int = 0,
        caps: ConnectionCaps, outputBudget: ByteBudget, inputBudget: ByteBudget, inputShares: Shares?,
        outputShares: Shares?
    ) {
        self.configuration = configuration
        self.index = index
        self.caps = caps
        self.outputBudget = outputBudget
        self.inputBudget = inputBudget
        self.inputShares = inputShares
        self.outputShares = outputShares
        self.responder = responder
        self.logger = logger
        self.serverLine = Array("Server: \(configuration.serverName)\r\n".utf8)
        let mailbox = self.mailbox
        self.executor = LoopExecutor(index: index, wake: { mailbox.wake() })
        timeouts = ConnectionStateMachine.Timeouts(
            header: configuration.headerTimeout.nanosecondsClamped, body: configuration.bodyTimeout.nanosecondsClamped,
            keepAlive: configuration.keepAliveTimeout.nanosecondsClamped,
            write: configuration.writeTimeout.nanosecondsClamped, linger: configuration.lingerTimeout.nanosecondsClamped
        )
    }

    var statistics: (connections: Int, inFlight: Int) {
        (connectionCount.load(ordering: .relaxed), inFlightCount.load(ordering: .relaxed))
    }

    /// Streamed bodies in this loop's table now.
    var streamedBodyCount: Int { streamTable.count }

    /// Bytes of output buffer (capacity) this loop's connections keep now (for tests: read it
    /// on the loop's thread).
    var outputCapacity: Int { connections.values.reduce(0) { $0 + $1.output.capacity } }

    // MARK: - Start and stop

    /// How a loop's listening socket binds its port.
    enum PortSharing: Int32 {
        /// The port is this socket's alone (a server with one loop).
        case exclusive = 0
        /// Joins the port the server's first loop bound (`SO_REUSEPORT`).
        case join = 1
        /// The first of several loops: the port must be free of every other socket, then it
        /// is bound with `SO_REUSEPORT` for the others to join.
        case first = 2
    }

    /// Binds this loop's listening socket to `port` (0: a free one) and starts its thread.
    /// Returns the port bound.
    func start(port requested: Int, sharing: PortSharing) throws -> Int {
        guard lifecycle.withLock({ $0 == .new }) else { throw HTTPServerError.shutDownBeforeStart }
        let limit = csystem_raise_fd_limit()
        var port: Int32 = 0
        var reason = [CChar](repeating: 0, count: 256)
        let fd = csystem_listen(
            configuration.host, Int32(requested), 4096, sharing.rawValue, &port, &reason, reason.count)
        guard fd >= 0 else {
            throw HTTPServerError(
                description: String(decoding: reason.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        listener = fd
        boundPort = Int(port)
        epoll = csystem_epoll_create()
        guard epoll >= 0, mailbox.eventFD >= 0,
            csystem_epoll_add(epoll, listener, epollIn | epollET, Self.listenerToken) == 0,
            csystem_epoll_add(epoll, mailbox.eventFD, epollIn | epollET, Self.wakeToken) == 0
        else {
            let error = errno
            closeDescriptors()
            throw HTTPServerError(description: "cannot set up epoll: errno \(error)")
        }
        reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC)
        logger.debug("file descriptor limit", metadata: ["nofile": "\(limit)"])
        let proceed = lifecycle.withLock { state -> Bool in
            guard state == .new else { return false }
            state = .running
            return true
        }
        guard proceed else {
            closeDescriptors()
            throw HTTPServerError.shutDownBeforeStart
        }
        // Joinable and registered: the process joins it before exiting (csystem_threads_join_all).
        let context = Unmanaged.passRetained(LoopThreadBody { [self] in run() }).toOpaque()
        let entry: @convention(c) (UnsafeMutableRawPointer?) -> Void = { context in
            guard let context else { return }
            Unmanaged<LoopThreadBody>.fromOpaque(context).takeRetainedValue().body()
        }
        let result = csystem_thread_start("http-loop-\(index)", 1 << 20, entry, context)
        guard result == 0 else {
            Unmanaged<LoopThreadBody>.fromOpaque(context).release()
            closeDescriptors()
            lifecycle.withLock { $0 = .new }  // never ran: `requestShutdown` stops the executor
            throw HTTPServerError(description: "cannot start the event loop's thread: errno \(result)")
        }
        return boundPort
    }

    /// The listener, epoll and reserve descriptors of a loop that will not run.
    private func closeDescriptors() {
        if listener >= 0 { close(listener) }
        if epoll >= 0 { close(epoll) }
        if reserveFD >= 0 { close(reserveFD) }
        (listener, epoll, reserveFD) = (-1, -1, -1)
    }

    /// Begins graceful shutdown. A loop that never ran (its start failed, or another
    /// listener's did) is stopped at once: `waitUntilStopped` returns, and jobs given to its
    /// executor (a database pool closing) run off the loop instead of waiting for ever.
    func requestShutdown() {
        let neverRan = lifecycle.withLock { state -> Bool in
            guard state == .new else { return false }
            state = .stopped
            return true
        }
        guard neverRan else {
            mailbox.requestShutdown()
            return
        }
        executor.stop()
        stopped.signal()
    }

    func waitUntilStopped() async { await stopped.wait() }

    // MARK: - The loop

    private func run() {
        if configuration.loopScheduling == .batch {
            let error = csystem_thread_set_batch_scheduling(1)
            if error != 0 {
                logger.warning(
                    "cannot schedule the event loop as SCHED_BATCH; it runs as SCHED_OTHER",
                    metadata: ["loop": "\(index)", "errno": "\(error)"])
            }
        }
        var events = [csystem_event](repeating: csystem_event(), count: 256)
        var nextSweep: UInt64 = 0
        var jobsLeft = false
        executor.epoll = epoll
        executor.streamTable = streamTable
        streamTable.finishShortSends = { [unowned self] short in finishShortSends(short) }
        executor.attachToCurrentThread()
        while true {
            let writeWithin = responder.loopWillWait()
            var timeout: Int32 = jobsLeft ? 0 : connections.isEmpty && !shuttingDown ? 1000 : 250
            // Drained while another loop still serves: only its requests can need this loop
            // now (below), so look often for the moment they are done.
            if shuttingDown, connections.isEmpty { timeout = min(timeout, 10) }
            if let writeWithin { timeout = min(timeout, max(0, writeWithin)) }
            let count = csystem_epoll_wait(epoll, &events, Int32(events.count), timeout)
            now = monotonicNow()
            if count < 0 {
                if errno == EINTR { continue }
                preconditionFailure("epoll_wait failed with errno \(errno)")  // EBADF/EFAULT/EINVAL: a bug
            }
            for index in 0..<Int(count) {
                let event = events[index]
                switch event.data {
                // Not once shutdown has closed the listener (earlier in the same batch).
                case Self.listenerToken: if listener >= 0 { acceptConnections() }
                case Self.wakeToken: handleMailbox()
                case let token where token & LoopExecutor.sourceTokenBit != 0 && token < Self.wakeToken:
                    executor.dispatch(token: token, flags: event.events)
                default: handle(event.events, on: Int32(truncatingIfNeeded: event.data))
                }
            }
            jobsLeft = executor.runQueuedJobs()
            // Streams the jobs just wrote on this thread (a fan-out's share): sent now. Sending
            // may resume a producer waiting for room, whose job then runs without sleeping.
            if driveLocalStreamsReady() { jobsLeft = true }
            if driveDeferred() { jobsLeft = true }
            if now >= nextSweep {
                sweepDeadlines()
                logRefusals()
                if acceptRetryPending, listener >= 0 { acceptConnections() }
                if memoryRelease.shouldRelease(now: now) { memoryRelease.release(now: now) }
                nextSweep = now + 250_000_000
            }
            // Not before every loop of the server has drained: a request on another loop may
            // be waiting on this one (its queries on this loop's database pool share, which
            // lends connections to busy loops, `PoolShares`), and a loop that stopped would
            // never read their answers: that request would hang until the deadline.
            if shuttingDown, caps.openConnections == 0 || now >= shutdownDeadline { break }
        }
        for connection in Array(connections.values) {
            // Still open at the shutdown deadline: a reset where output waits for a client
            // that does not read (the kernel would keep the socket past the process's exit).
            if connection.hasPendingOutput { _ = csystem_reset_on_close_if_unsent(connection.fd, 1) }
            closeConnection(connection)
        }
        if listener >= 0 { close(listener) }
        close(epoll)
        close(mailbox.eventFD)
        if reserveFD >= 0 { close(reserveFD) }
        responder.loopDidStop()
        executor.streamTable = nil
        streamTable.finishShortSends = nil
        executor.detachFromCurrentThread()
        // Last: from here on, jobs run one at a time off this thread.
        executor.stop()
        logger.info("HTTP server stopped", metadata: ["loop": "\(index)"])
        stopped.signal()
    }

    private func handle(_ flags: UInt32, on fd: Int32) {
        guard let connection = connections[fd] else { return }
        if flags & (epollErr | epollHUP) != 0 {
            // Reset or fully closed: nobody is left to answer. While a handler runs nothing
            // more is read, so this is the only news of it: closing cancels the handler (a
            // long-poll stops waiting) instead of keeping it until its answer fails to send.
            // A client that only shut its sending side (FIN) still gets its answer.
            if flags & epollIn == 0 || connection.lifecycle.isHandling || connection.lifecycle.isStreaming
                || connection.lifecycle.isWebSocket
            {
                closeConnection(connection)
                return
            }
            // Bytes arrived before the reset: they are read as usual, and a request among
            // them that starts a handler is cancelled at once (`drive`).
            connection.hungUp = true
        }
        if flags & epollRDHUP != 0 { connection.peerClosedInput = true }
        if flags & epollIn != 0 { connection.readable = true }
        if flags & epollOut != 0 { connection.writable = true }
        drive(connection)
    }

    // MARK: - Accepting

    private func acceptConnections() {
        var address = [CChar](repeating: 0, count: 64)
        var raw = [UInt8](repeating: 0, count: 16)
        var family: Int32 = 0
        var refusedForDescriptors = 0
        defer {
            if refusedForDescriptors > 0 {
                logger.warning(
                    "out of file descriptors; refused connections", metadata: ["refused": "\(refusedForDescriptors)"])
            }
        }
        if reserveFD < 0 { reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC) }
        while true {
            let fd = csystem_accept(listener, &address, address.count, &raw, &family)
            if fd < 0 {
                let error = errno
                switch error {
                case EAGAIN, EWOULDBLOCK:
                    acceptRetryPending = false
                    return
                case ECONNABORTED, EPROTO: continue
                case EMFILE, ENFILE:
                    // Out of descriptors. The listener is edge-triggered: returning while
                    // connections are still queued would leave them stuck until another one
                    // arrives. Take each with the reserve descriptor, refuse it with a 503, and
                    // go on until the queue is empty. Another thread may take the freed
                    // descriptor meanwhile; then the sweep retries until one is free again.
                    guard reserveFD >= 0 else {
                        if !acceptRetryPending {
                            logger.error("out of file descriptors and no reserve left; retrying to accept")
                        }
                        acceptRetryPending = true
                        return
                    }
                    let refusal = refusalResponse()  // built first: nothing may take the freed descriptor
                    close(reserveFD)
                    let dropped = csystem_accept(listener, &address, address.count, &raw, &family)
                    let acceptError = errno
                    if dropped >= 0 {
                        _ = refusal.withUnsafeBytes { buffer in
                            buffer.baseAddress.map { csystem_send(dropped, $0, buffer.count) }
                        }
                        close(dropped)
                        refusedForDescriptors += 1
                    }
                    reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC)
                    if dropped < 0 {
                        acceptRetryPending = acceptError != EAGAIN && acceptError != EWOULDBLOCK
                        return
                    }
                    continue
                default:
                    if !acceptRetryPending { logger.error("accept failed; retrying", metadata: ["errno": "\(error)"]) }
                    acceptRetryPending = true
                    return
                }
            }
            if shuttingDown || !caps.takeConnection() {
                refuseConnection(fd)
                continue
            }
            let peer: IPAddress? =
                switch family {
                case 4: IPAddress(bytes: raw.prefix(4))
                case 6: IPAddress(bytes: raw)
                default: nil
                }
            let trusted =
                peer.map { !configuration.trustedProxies.isEmpty && configuration.trustedProxies.contains($0) } ?? false
            var clientKey: IPAddress? = nil
            if configuration.maxConnectionsPerClient > 0, !trusted, let peer {
                let key = peer.client
                if !caps.takeClientSlot(key) {
                    caps.releaseConnection()
                    refuseConnection(fd)
                    refusedPerClient.count += 1
                    lastRefusedClient = key
                    logRefusals()
                    continue
                }
                clientKey = key
            }
            _ = csystem_set_nodelay(fd)
            guard csystem_epoll_add(epoll, fd, epollIn | epollOut | epollRDHUP | epollET, UInt64(fd)) == 0 else {
                close(fd)
                caps.releaseConnection()
                if let clientKey { caps.releaseClientSlot(clientKey) }
                continue
            }
            nextConnectionID &+= 1
            let remote = String(decoding: address.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let connection = Connection<Context>(
                fd: fd, id: nextConnectionID, remoteAddress: remote, peerAddress: peer, clientKey: clientKey,
                peerIsTrustedProxy: trusted, limits: configuration.limits,
                lifecycle: ConnectionStateMachine(timeouts: timeouts, now: now))
            connections[fd] = connection
            connectionCount.store(connections.count, ordering: .relaxed)
            memoryRelease.worked(now: now)
        }
    }

    /// Logs the refusals (by the per-client cap, for the output budget) since the last line of
    /// each kind, if any and if that line is 10 s old (or there was none).
    private func logRefusals() {
        if let refused = refusedPerClient.due(now: now) {
            logger.warning(
                "connections over the per-client cap refused",
                metadata: [
                    "refused": "\(refused)", "cap": "\(configuration.maxConnectionsPerClient)",
                    "last_client": "\(lastRefusedClient?.clientText ?? "")",
                ])
        }
        /// One line for refusals by a budget: how many, what it holds, its limit.
        func budgetWarning(_ message: Logger.Message, _ refused: Int, held: Int, limit: Int) {
            logger.warning(
                message,
                metadata: [
                    "refused": "\(refused)", "buffered_bytes": "\(held)", "limit_bytes": "\(limit)",
                    "loop": "\(index)",
                ])
        }
        if let refused = refusedAnswers.due(now: now) {
            budgetWarning(
                "answers refused: the output buffers hold as many unread answers as they may", refused,
                held: outputBudget.heldBytes, limit: outputBudget.limit)
        }
        if let refused = refusedAnswerShares.due(now: now), let outputShares {
            budgetWarning(
                "answers refused: their account or client holds its share of the unread answers", refused,
                held: outputBudget.heldBytes, limit: outputShares.limit)
        }
        if let refused = refusedBodies.due(now: now) {
            budgetWarning(
                "request bodies refused: the bodies being read hold as much as they may", refused,
                held: inputBudget.heldBytes, limit: inputBudget.limit)
        }
        if let refused = refusedShares.due(now: now), let inputShares {
            budgetWarning(
                "request bodies refused: their account or client holds its share of the bodies being read", refused,
                held: inputBudget.heldBytes, limit: inputShares.limit)
        }
    }

    private func refuseConnection(_ fd: Int32) {
        let output = refusalResponse()
        _ = output.withUnsafeBytes { buffer in
            buffer.baseAddress.map { csystem_send(fd, $0, buffer.count) }
        }
        close(fd)
    }

    /// The `503` for a connection the server cannot take, serialized like any response.
    private func refusalResponse() -> [UInt8] {
        var output: [UInt8] = []
        serialize(responder.refuseConnection(), keepAlive: false, omitBody: false, into: &output)
        return output
    }

    // MARK: - Reading, parsing, writing

    private func drive(_ connection: Connection<Context>) {
        var rounds = 0
        while true {
            rounds &+= 1
            if rounds > Self.driveRoundsPerTurn {
                deferDrive(connection)
                return
            }
            if connection.hasPendingOutput {
                guard connection.writable else {
                    holdUnsent(connection)
                    return
                }
                guard flush(connection) else { return }
                if connection.hasPendingOutput {
                    holdUnsent(connection)
                    connection.lifecycle.writeBlocked(now: now)
                    return
                }
                if connection.heldOutput != 0 {
                    countHeldOutput(connection)
                    if connection.outputShare != nil { releaseOutputShare(connection) }  // sent whole
                }
                // A stream or a WebSocket writes now and then and waits long in between: it
                // keeps no output buffer (a small one goes to the loop's spares, which its next
                // write takes: a fan-out to 10,000 streams allocates none per stream); a
                // connection answering requests keeps one no larger than a small answer needs,
                // so what it keeps uncounted once sent stays small (the output `ByteBudget`).
                if connection.output.capacity > Self.keptOutputCapacity {
                    connection.output = []
                } else if connection.lifecycle.isStreaming || connection.lifecycle.isWebSocket {
                    keepSpareOutput(of: connection)
                } else {
                    connection.output.removeAll(keepingCapacity: true)
                }
                connection.outputOffset = 0
                switch connection.lifecycle.outputDrained(
                    hasBufferedInput: connection.parser.bufferedByteCount > 0, now: now)
                {
                case .close:
                    closeConnection(connection)
                    return
                case .shutdownWrite:
                    _ = shutdown(connection.fd, Int32(SHUT_WR))
                default:
                    break
                }
            }
            switch connection.lifecycle.state {
            case .handling:
                if connection.hungUp { closeConnection(connection) }
                return
            case .streaming:
                if connection.hungUp
                    || (connection.peerClosedInput && connection.lifecycle.peerClosedInput() == .close)
                {
                    closeConnection(connection)
                    return
                }
                // Nothing more is parsed until the body ends (responses stay in order): take
                // what the producer wrote once the socket has sent what was taken before.
                guard pumpStream(connection) else { return }
                continue
            case .webSocket:
                if connection.hungUp {
                    closeConnection(connection)
                    return
                }
                guard let webSocket = connection.webSocket else { return }
                // Frames already received first, then what the session queued, then more input.
                if handleFrames(connection, webSocket) || pumpWebSocket(connection, webSocket) { continue }
                guard connection.readable else {
                    if connection.peerClosedInput {
                        // Half-open: the client will send nothing more, not even a close frame.
                        _ = connection.lifecycle.peerClosedInput()
                        closeConnection(connection)
                    }
                    return
                }
                guard readInput(connection) else { return }
                continue
            case .closed:
                return
            case .lingering:
                discardInput(connection)
                return
            case .writing:
                if connection.hasPendingOutput { return }
            default:
                break
            }

            if let event = connection.parser.next() {
                switch event {
                case .head(let head): admit(head, on: connection)
                case .request(let head, let body): requestComplete(head, body: body, on: connection)
                case .error(let error): reject(error, on: connection)
                case .body, .end: break  // stream mode only
                }
                continue
            }
            if connection.countsChunkedInput, !holdChunkedInput(connection) { continue }

            if connection.parser.isClosed {
                if !connection.hasPendingOutput { closeConnection(connection) }
                return
            }
            guard connection.readable else {
                // Everything the peer sent was read and it will send nothing more.
                if connection.peerClosedInput, connection.lifecycle.peerClosedInput() == .close {
                    closeConnection(connection)
                    return
                }
                if connection.lifecycle.state == .idle, !connection.hasPendingOutput {
                    // Waiting for the next request, maybe for long: keep no buffer (they go
                    // to the loop's spares for the next connection that reads a request).
                    keepSpare(input: connection.parser.releaseBufferBetweenRequests())
                    keepSpareOutput(of: connection)
                }
                return
            }
            guard readInput(connection) else { return }
        }
    }

    /// Ends a connection's turn with work left: it is driven again after the others.
    private func deferDrive(_ connection: Connection<Context>) {
        guard !connection.driveDeferred else { return }
        connection.driveDeferred = true
        deferredDrives.append((connection.fd, connection.id))
    }

    /// Drives the connections whose turn ended with work left; true when some used up
    /// their turn again (the loop then does not sleep).
    private func driveDeferred() -> Bool {
        guard !deferredDrives.isEmpty else { return false }
        var due: [(fd: Int32, id: UInt64)] = []
        swap(&due, &deferredDrives)
        for (fd, id) in due {
            guard let connection = connections[fd], connection.id == id else { continue }
            connection.driveDeferred = false
            drive(connection)
        }
        return !deferredDrives.isEmpty
    }

    /// Keeps a buffer a connection gave up, if small and the spares are not full.
    private func keepSpare(input: [UInt8]) {
        guard !input.isEmpty, input.count <= Self.spareMaxBytes, spareInputs.count < Self.spareLimit else { return }
        spareInputs.append(input)
    }

    /// Takes the (sent) output buffer of a connection going idle, keeping it if it is small
    /// and the spares are not full.
    private func keepSpareOutput(of connection: Connection<Context>) {
        guard connection.output.capacity > 0 else { return }
        if connection.output.capacity <= Self.spareMaxBytes, spareOutputs.count < Self.spareLimit {
            connection.output.removeAll(keepingCapacity: true)
            spareOutputs.append(connection.output)
        }
        connection.output = []
    }

    /// Reads once into the connection's parser (its WebSocket's, once upgraded). False when
    /// the read found the connection reset (it is closed: nobody is left to answer).
    private func readInput(_ connection: Connection<Context>) -> Bool {
        let fd = connection.fd
        let webSocket = connection.webSocket
        if webSocket == nil {
            // A request is coming: give an idle connection spare buffers back.
            if connection.parser.hasNoBuffer, var spare = spareInputs.popLast() { connection.parser.adopt(&spare) }
            if connection.output.capacity == 0, let spare = spareOutputs.popLast() { connection.output = spare }
        }
        let received = readBuffer.withUnsafeMutableBytes { buffer -> Int in
            while true {
                let count = recv(fd, buffer.baseAddress, buffer.count, 0)
                if count < 0, errno == EINTR { continue }
                if count > 0 {
                    let bytes = UnsafeRawBufferPointer(rebasing: buffer[0..<count])
                    if let webSocket { webSocket.parser.feed(bytes) } else { connection.parser.feed(bytes) }
                }
                return count
            }
        }
        if received > 0 {
            if received < Self.readChunk { connection.readable = false }
            if webSocket != nil {
                connection.lifecycle.webSocketActivity(now: now)
            } else {
                connection.lifecycle.bytesArrived(now: now)
            }
        } else if received == 0 {
            connection.readable = false
            connection.peerClosedInput = true
        } else if errno != EAGAIN && errno != EWOULDBLOCK {
            closeConnection(connection)
            return false
        } else {
            connection.readable = false
        }
        return true
    }

    /// Lingering close: read and drop what the client still sends, until EOF. What arrives
    /// extends the linger (`lingeringInputArrived`); a client sending faster than one turn's
    /// reads gets its next turn after the other connections'.
    private func discardInput(_ connection: Connection<Context>) {
        guard connection.readable else { return }
        let fd = connection.fd
        var dropped = false
        defer { if dropped { connection.lifecycle.lingeringInputArrived(now: now) } }
        for _ in 0..<Self.driveRoundsPerTurn {
            let count = readBuffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                dropped = true
                continue
            }
            if count < 0, errno == EINTR { continue }
            connection.readable = false
            if count == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) { closeConnection(connection) }
            return
        }
        deferDrive(connection)
    }

    /// The output buffer a connection answering requests keeps once its answer is sent: what
    /// a small answer (`ByteBudget.smallAnswer`) and its head need. A larger one is freed.
    private static var keptOutputCapacity: Int { ByteBudget.smallAnswer + 16 * 1024 }

    /// Counts what `connection` has not sent yet in the output budget, unless it is an open
    /// stream's or WebSocket's (their writers count what they hold, `HTTPBodyWriter`): a small
    /// answer is counted only once the socket did not take it at once, a large one from when
    /// it was queued.
    @inline(__always)
    private func holdUnsent(_ connection: Connection<Context>) {
        if connection.heldOutput != 0 || !(connection.lifecycle.isStreaming || connection.lifecycle.isWebSocket) {
            countHeldOutput(connection)
        }
    }

    /// Sets what `connection` holds in the output budget to its unsent output.
    private func countHeldOutput(_ connection: Connection<Context>) {
        let unsent = connection.output.count - connection.outputOffset
        outputBudget.adjust(by: unsent - connection.heldOutput)
        connection.heldOutput = unsent
    }

    /// Queues a whole answer (from the head, or the final one) within the output budget and
    /// its owner's share: one to a `GET` whose body is over `ByteBudget.smallAnswer` and does
    /// not fit either is replaced by the responder's `503` (`refuseAnswer`) before it is
    /// queued. The answer to a request that may have changed something (`POST`, `PATCH` …) is
    /// never refused, only counted (in the share too): the client must learn what happened (a
    /// retry would not tell it again: a REST insert answers only the rows it stored), and such
    /// an answer is bounded by what the request itself carried. A large answer is counted from
    /// here, settled to what was queued once it is serialized; a small one only if the socket
    /// does not take it (`holdUnsent`), and never in a share.
    /// `queued` moves the lifecycle on and says whether the connection is kept alive after it.
    private func queueAnswer(
        _ response: consuming HTTPResponse, context: Context, on connection: Connection<Context>,
        queued: () -> Bool
    ) {
        var response = response
        var counted = connection.requestIsHead ? 0 : response.body.count
        if counted <= ByteBudget.smallAnswer {
            counted = 0
        } else if let refusal = holdAnswer(counted, context: context, on: connection) {
            counted = 0
            switch refusal {
            case .total: refusedAnswers.count += 1
            case .perClient: refusedAnswerShares.count += 1
            }
            logRefusals()
            response = responder.refuseAnswer(context: context, over: refusal)
        }
        let keepAlive = queued()
        responder.complete(&response, context: context)
        serialize(
            response, framing: response.stream == nil ? .length : connection.requestIsHTTP10 ? .untilClose : .chunked,
            keepAlive: keepAlive, omitBody: connection.requestIsHead, into: &connection.output)
        if counted > 0 {
            connection.heldOutput = counted
            countHeldOutput(connection)
        }
    }

    /// Counts a large answer of `bytes` in the output budget and, with per-client shares, in its
    /// owner's share (asked of the responder; one lock), held there whole until it is sent or
    /// the connection closes (`releaseOutputShare`). Nil when queued; else the limit that
    /// refused it, and nothing is counted. The answer to a request that is not a `GET` is
    /// counted in both whatever their limits, never refused.
    private func holdAnswer(_ bytes: Int, context: Context, on connection: Connection<Context>) -> BudgetLimit? {
        let refusable = connection.requestIsGet
        if !refusable {
            outputBudget.adjust(by: bytes)
        } else if !outputBudget.admit(bytes) {
            return .total
        }
        guard let outputShares else { return nil }
        // Not reached in practice: a connection reads its next request once its answer is sent.
        if connection.outputShare != nil { releaseOutputShare(connection) }
        let owner = shareOwner(context: context, on: connection)
        if !refusable {
            outputShares.hold(bytes, for: owner)
        } else if !outputShares.admit(bytes, for: owner) {
            outputBudget.adjust(by: -bytes)
            return .perClient
        }
        connection.outputShare = owner
        connection.outputShareBytes = bytes
        return nil
    }

    /// Whose share a large body or answer of the connection's request counts in: the account
    /// the responder names, else the request's client address.
    private func shareOwner(context: Context, on connection: Connection<Context>) -> ShareKey {
        responder.shareKey(context: context) ?? .client(connection.clientIP ?? IPAddress(high: 0, low: 0))
    }

    /// Gives back the share of the output budget the connection's large answer held.
    private func releaseOutputShare(_ connection: Connection<Context>) {
        guard let owner = connection.outputShare else { return }
        outputShares?.release(connection.outputShareBytes, of: owner)
        connection.outputShare = nil
        connection.outputShareBytes = 0
    }

    /// Writes as much pending output as the socket takes. False if the connection was closed.
    private func flush(_ connection: Connection<Context>) -> Bool {
        while connection.outputOffset < connection.output.count {
            let offset = connection.outputOffset
            let sent = connection.output.withUnsafeBytes { buffer -> Int in
                guard let base = buffer.baseAddress else { return 0 }
                return csystem_send(connection.fd, base + offset, buffer.count - offset)
            }
            if sent > 0 {
                connection.outputOffset += sent
                connection.lifecycle.wroteSome(now: now)
            } else if sent < 0, errno == EAGAIN || errno == EWOULDBLOCK {
                connection.writable = false
                return true
            } else if sent < 0, errno == EINTR {
                continue
            } else {
                closeConnection(connection)
                return false
            }
        }
        return true
    }

    private static var continueLine: [UInt8] { Array("HTTP/1.1 100 Continue\r\n\r\n".utf8) }

    // MARK: - Requests

    private func admit(_ head: HTTPRequestHead, on connection: Connection<Context>) {
        connection.requestKeepAlive = head.keepAlive
        connection.requestIsHead = head.method == .head
        connection.requestIsGet = head.method == .get
        connection.requestIsHTTP10 = head.version == .http10
        if connection.peerIsTrustedProxy {
            // Per request: one proxy connection carries many clients in turn. Only for trusted
            // peers, so without trusted proxies nothing here runs or allocates.
            let forwarded = configuration.trustedProxies.forwardedClient(head.headers.values(for: "x-forwarded-for"))
            connection.clientAddress = forwarded?.description ?? connection.remoteAddress
            connection.clientIP = forwarded ?? connection.peerAddress
        }
        switch admitBody(responder.admit(head, client: connection.clientAddress), head, on: connection) {
        case .readBody(let limit, let context):
            connection.context = context
            connection.parser.limitBody(to: limit)
            let action = connection.lifecycle.headAdmitted(
                hasBody: head.hasBody, expectsContinue: head.expectsContinue, now: now)
            if action == .sendContinue { connection.output.append(contentsOf: Self.continueLine) }
        case .answerAfterBody(let response, let context):
            connection.context = context
            connection.prepared = response
            connection.parser.discardBody()
            let action = connection.lifecycle.headAdmitted(
                hasBody: head.hasBody, expectsContinue: head.expectsContinue, now: now)
            if action == .sendContinue { connection.output.append(contentsOf: Self.continueLine) }
        case .answer(let response, let context):
            queueAnswer(consume response, context: context, on: connection) {
                connection.lifecycle.answeredFromHead(hasBody: head.hasBody, keepAlive: head.keepAlive) == .nextRequest
            }
        }
    }

    /// Counts the body an admitted request announces in the input budget (and its owner's
    /// share) before a byte of it is read: a `Content-Length` over `ByteBudget.smallBody`
    /// that does not fit turns the admission into the responder's `503` from the head
    /// (`refuseBody`; the body is never read, the connection lingers and closes). A chunked
    /// body is counted as it grows (`holdChunkedInput`). A small body costs this switch and
    /// nothing else.
    private func admitBody(
        _ admission: Admission<Context>, _ head: HTTPRequestHead, on connection: Connection<Context>
    ) -> Admission<Context> {
        guard case .readBody = admission else { return admission }
        switch head.bodyFraming {
        case .contentLength(let length) where length > ByteBudget.smallBody:
            guard case .readBody(_, let context) = admission,
                let refusal = holdInput(length, context: context, on: connection)
            else { return admission }
            return .answer(refuseBody(over: refusal, context: context), context)
        case .chunked:
            connection.countsChunkedInput = true
        default:
            break
        }
        return admission
    }

    /// Counts a chunked body's buffer in the input budget once it grows past
    /// `ByteBudget.smallBody` (the parser has just taken all it could). Growth that does not
    /// fit cuts the body off: the body is dropped and the responder's `503` (`refuseBody`)
    /// queued, then the connection lingers and closes. False when it was cut off.
    private func holdChunkedInput(_ connection: Connection<Context>) -> Bool {
        let size = connection.parser.bodyCapacity
        guard size > connection.heldInput, size > ByteBudget.smallBody else { return true }
        guard let context = connection.context else {  // not reached: a body being read has its context
            reject(.bodyTooLarge, on: connection)
            return false
        }
        guard let refusal = holdInput(size - connection.heldInput, context: context, on: connection) else {
            return true
        }
        releaseInput(connection)
        connection.parser = HTTPRequestParser(limits: connection.parser.limits)  // frees the body; never read again
        connection.context = nil
        var response = refuseBody(over: refusal, context: context)
        // Like an answer from the head to a request whose body is still due: linger, close.
        let after = connection.lifecycle.answeredFromHead(hasBody: true, keepAlive: false)
        responder.complete(&response, context: context)
        serialize(
            response, keepAlive: after == .nextRequest, omitBody: connection.requestIsHead, into: &connection.output)
        return false
    }

    /// Counts `bytes` more of the connection's request body in the input budget and, with
    /// per-client shares, in its owner's share (the owner is asked of the responder once per
    /// body, when it is first counted). Nil when both had room; else the limit that refused
    /// it, and nothing more is counted.
    private func holdInput(_ bytes: Int, context: Context, on connection: Connection<Context>) -> BudgetLimit? {
        guard inputBudget.admit(bytes) else { return .total }
        if let inputShares {
            let owner = connection.inputShare ?? shareOwner(context: context, on: connection)
            guard inputShares.admit(bytes, for: owner) else {
                inputBudget.adjust(by: -bytes)
                return .perClient
            }
            connection.inputShare = owner
        }
        connection.heldInput += bytes
        return nil
    }

    /// The responder's `503` for a body `limit` refused, tallied for the log.
    private func refuseBody(over limit: BudgetLimit, context: Context) -> HTTPResponse {
        switch limit {
        case .total: refusedBodies.count += 1
        case .perClient: refusedShares.count += 1
        }
        logRefusals()
        return responder.refuseBody(context: context, over: limit)
    }

    /// Gives back what the connection's request body held in the input budget (and its
    /// owner's share).
    private func releaseInput(_ connection: Connection<Context>) {
        connection.countsChunkedInput = false
        guard connection.heldInput != 0 else { return }
        giveBackInput(connection.heldInput, share: connection.inputShare)
        connection.heldInput = 0
        connection.inputShare = nil
    }

    /// Gives back `bytes` of a request body held in the input budget and, when counted there,
    /// in `share`. Thread-safe: a handler's task calls it wherever it finishes.
    private func giveBackInput(_ bytes: Int, share: ShareKey?) {
        inputBudget.adjust(by: -bytes)
        if let share { inputShares?.release(bytes, of: share) }
    }

    private func requestComplete(
        _ head: consuming HTTPRequestHead, body: consuming [UInt8], on connection: Connection<Context>
    ) {
        // The body's share of the input budget stays counted until the request is answered:
        // given back here for a body dropped or answered at once, by the handler's task for
        // one it works on (`.later`).
        guard connection.lifecycle.requestComplete() == .dispatch, let context = connection.context else {
            releaseInput(connection)
            return
        }
        if let prepared = connection.prepared {
            releaseInput(connection)
            connection.prepared = nil
            finish(prepared, context: context, on: connection)
            return
        }
        var request = HTTPRequest(head: head, body: body, remoteAddress: connection.clientAddress)
        if connection.peerIsTrustedProxy {
            // The leftmost entry is the scheme the client used (proxies in a chain append theirs).
            request.forwardedHTTPS =
                request.headers["x-forwarded-proto"]?.split(separator: ",").first?.trimmingCharacters(in: .whitespaces)
                .lowercased() == "https"
        }
        switch responder.respond(to: request, context: context) {
        case .now(let response, let context):
            releaseInput(connection)
            finish(response, context: context, on: connection)
        case .later(let operation):
            inFlightCount.wrappingAdd(1, ordering: .relaxed)
            // Nothing more is parsed while the handler runs, which may take long (a long-poll,
            // then a stream): the parser keeps no buffer meanwhile unless bytes wait in it.
            keepSpare(input: connection.parser.releaseBufferBetweenRequests())
            let mailbox = self.mailbox
            let executor = self.executor
            let fd = connection.fd
            let id = connection.id
            let heldInput = connection.heldInput  // now the task's to give back
            let inputShare = connection.inputShare
            connection.heldInput = 0
            connection.inputShare = nil
            connection.countsChunkedInput = false
            // On the loop's thread: read, handled and answered without leaving it (unless the
            // handler itself awaits work elsewhere).
            connection.handlerTask = Task(executorPreference: executor) { [self] in
                let (response, context) = await operation()
                // The handler is done with the body (also when its connection closed meanwhile).
                if heldInput != 0 { giveBackInput(heldInput, share: inputShare) }
                let completion = Mailbox<Context>.Completion(
                    fd: fd, connectionID: id, response: response, context: context)
                if executor.isOnLoopThread {
                    complete(completion)
                } else {
                    mailbox.post(completion)
                }
            }
        }
    }

    private func handleMailbox() {
        let (completions, streamsReady, shutdown) = mailbox.drain()
        for completion in completions { complete(completion) }
        for ready in streamsReady { driveReady(ready.fd, ready.connectionID) }
        if shutdown, !shuttingDown { beginShutdown() }
    }

    /// Drives the streams written on this thread since the last call; false when there were none.
    private func driveLocalStreamsReady() -> Bool {
        let ready = mailbox.takeLocalStreamsReady()
        for stream in ready { driveReady(stream.fd, stream.connectionID) }
        return !ready.isEmpty
    }

    /// A streamed body or WebSocket has something to send: unless its connection is gone.
    private func driveReady(_ fd: Int32, _ connectionID: UInt64) {
        guard let connection = connections[fd], connection.id == connectionID,
            connection.lifecycle.isStreaming || connection.lifecycle.isWebSocket
        else { return }
        drive(connection)
    }

    /// A handler's answer, on the loop's thread.
    private func complete(_ completion: Mailbox<Context>.Completion) {
        inFlightCount.wrappingAdd(-1, ordering: .relaxed)
        memoryRelease.worked(now: now)
        guard let connection = connections[completion.fd], connection.id == completion.connectionID,
            connection.lifecycle.isHandling
        else {
            // The client went away meanwhile. A streamed body's producer still runs once,
            // to learn that nobody reads it and release what it holds (a WebSocket session
            // too: its socket is over from the start).
            if let stream = completion.response.stream { runUnsent(stream) }
            if let upgrade = completion.response.webSocket { runUnconnected(upgrade) }
            return
        }
        connection.handlerTask = nil
        finish(completion.response, context: completion.context, on: connection)
        drive(connection)
    }

    // MARK: - Streamed bodies

    /// Queues the head of a streamed response and starts its producer.
    private func startStream(
        _ response: HTTPResponse, _ body: HTTPBodyStream, keepAlive: Bool, context: Context,
        on connection: Connection<Context>
    ) {
        var response = response
        let chunked = !connection.requestIsHTTP10
        let after = connection.lifecycle.streamStarted(keepAlive: keepAlive && chunked)
        responder.complete(&response, context: context)
        serialize(
            response, framing: chunked ? .chunked : .untilClose, keepAlive: after == .nextRequest, omitBody: false,
            into: &connection.output)
        connection.context = nil
        let mailbox = self.mailbox
        let executor = self.executor
        let fd = connection.fd
        let id = connection.id
        let writer = HTTPBodyWriter(bufferLimit: body.bufferLimit, loop: executor, budget: outputBudget) {
            // Written on this loop's thread (its share of a fan-out): the loop sends it after
            // the job, with no lock or wake-up; from anywhere else, through the mailbox.
            if LoopExecutor.current === executor {
                mailbox.postStreamReadyOnLoop(fd: fd, connectionID: id)
            } else {
                mailbox.postStreamReady(fd: fd, connectionID: id)
            }
        }
        let producer = Task {
            await body.produce(writer)
            writer.producerReturned()
        }
        writer.started(producer)
        connection.stream = ActiveStream(writer: writer, chunked: chunked, shutdown: body.shutdown)
        streamTable.join(writer, fd: fd, chunked: chunked)
        // Answered after shutdown began: the producer is told at once, as the others were.
        if shuttingDown, body.shutdown == .cancel { writer.shutdownBegan() }
    }

    /// Runs a streamed body's producer that has nobody to send to: its writer is closed and
    /// its task cancelled from the start.
    private func runUnsent(_ body: HTTPBodyStream) {
        let writer = HTTPBodyWriter.closed()
        Task { await body.produce(writer) }.cancel()
    }

    /// Moves what the producer wrote into the connection's output, framed, once what was
    /// taken before has been sent. Returns whether output was queued (the caller flushes it).
    private func pumpStream(_ connection: Connection<Context>) -> Bool {
        // The writer alone, not a copy of the whole `ActiveStream` (a retain and a release of
        // its producer's task too, per stream and commit of a fan-out).
        guard let writer = connection.stream?.writer, !connection.hasPendingOutput else { return false }
        // The head went out before anything of the body is taken: from now on a fan-out
        // may send to this socket at once when the writer holds nothing.
        streamTable.headSent(writer)
        let chunked = connection.stream?.chunked ?? true
        let (chunks, end) = writer.take()
        var size = 0
        for chunk in chunks { size += chunk.count }
        if size > 0 {
            if connection.output.capacity == 0, let spare = spareOutputs.popLast() { connection.output = spare }
            connection.output.reserveCapacity(size + 16)
            if chunked {
                appendHex(size, to: &connection.output)
                connection.output.append(contentsOf: Self.crlf)
            }
            for chunk in chunks { connection.output.append(contentsOf: chunk) }
            if chunked { connection.output.append(contentsOf: Self.crlf) }
        }
        switch end {
        case .open:
            break
        case .finished:
            connection.stream = nil
            streamTable.leave(writer)
            connection.lifecycle.streamEnded()
            if chunked { connection.output.append(contentsOf: Self.lastChunk) }
        case .abandoned:
            connection.stream = nil
            streamTable.leave(writer)
            connection.lifecycle.streamAbandoned()
        }
        if end != .open, !connection.hasPendingOutput {
            // Nothing left to send: what follows the body (the close that ends it) is now.
            if connection.lifecycle.outputDrained(hasBufferedInput: false, now: now) == .close {
                closeConnection(connection)
                return false
            }
        }
        return connection.hasPendingOutput
    }

    // MARK: - WebSocket

    /// Queues the `101` and starts the session; bytes the client sent after its handshake
    /// are its first frames.
    private func startWebSocket(
        _ response: HTTPResponse, _ upgrade: WebSocketUpgrade, context: Context, on connection: Connection<Context>
    ) {
        var response = response
        connection.lifecycle.webSocketStarted(idleTimeout: upgrade.settings.idleTimeout.nanosecondsClamped, now: now)
        responder.complete(&response, context: context)
        serialize(response, keepAlive: false, upgrade: true, omitBody: true, into: &connection.output)
        connection.context = nil
        let mailbox = self.mailbox
        let fd = connection.fd
        let id = connection.id
        let socket = WebSocket(settings: upgrade.settings, budget: outputBudget) {
            mailbox.postStreamReady(fd: fd, connectionID: id)
        }
        var parser = WebSocketFrameParser(limits: upgrade.settings.limits)
        parser.feed(connection.parser.takeBufferedBytes())
        connection.parser = HTTPRequestParser(limits: connection.parser.limits)  // its buffer is not needed again
        let session = Task {
            await upgrade.session(socket)
            socket.writer.producerReturned()
        }
        connection.webSocket = ActiveWebSocket(parser: parser, socket: socket, session: session)
    }

    /// A session whose connection closed before its `101` was sent: it runs once with a
    /// socket that is over from the start.
    private func runUnconnected(_ upgrade: WebSocketUpgrade) {
        let socket = WebSocket(settings: upgrade.settings, wake: {})
        socket.connectionEnded()
        Task { await upgrade.session(socket) }.cancel()
    }

    /// Handles the frames parsed so far. Returns whether output was queued or the
    /// connection's state changed (the caller goes round again).
    private func handleFrames(_ connection: Connection<Context>, _ webSocket: ActiveWebSocket) -> Bool {
        var progressed = false
        while let event = webSocket.parser.next() {
            switch event {
            case .text(let bytes), .binary(let bytes):
                let message: WebSocketMessage = if case .text = event { .text(bytes) } else { .binary(bytes) }
                guard webSocket.socket.deliver(message) else {
                    endWebSocket(
                        connection, webSocket, .policyViolation, "messages arrive faster than they are handled")
                    return true
                }
            case .ping(let payload):
                WebSocketFrame.append(opcode: 0xA, payload: payload, to: &connection.output)
                progressed = true
            case .pong:
                break
            case .close(let code, _):
                // Answer with the client's code (or none), then close once it is written.
                webSocket.socket.connectionEnded()
                webSocket.session.cancel()
                if !webSocket.closeSent {
                    webSocket.closeSent = true
                    if let code {
                        connection.output.append(contentsOf: WebSocketFrame.close(code))
                    } else {
                        WebSocketFrame.append(opcode: 0x8, payload: [], to: &connection.output)
                    }
                }
                connection.webSocket = nil
                connection.lifecycle.webSocketClosedByPeer()
                return true
            case .error(let code, let reason):
                endWebSocket(connection, webSocket, code, reason)
                return true
            }
        }
        return progressed
    }

    /// Moves what the session queued into the connection's output once what was taken
    /// before is sent; a session that closed (or returned) gets its close frame. Returns
    /// whether output was queued or the state changed.
    private func pumpWebSocket(_ connection: Connection<Context>, _ webSocket: ActiveWebSocket) -> Bool {
        guard !connection.hasPendingOutput else { return false }
        let (chunks, end) = webSocket.socket.writer.take()
        if !chunks.isEmpty, connection.output.capacity == 0, let spare = spareOutputs.popLast() {
            connection.output = spare
        }
        for chunk in chunks { connection.output.append(contentsOf: chunk) }
        if end != .open {
            let (code, reason) = webSocket.socket.closeRequest
            endWebSocket(connection, webSocket, code, reason)
            return true
        }
        return connection.hasPendingOutput
    }

    /// Queues the server's close frame (after what is queued already), ends the session's
    /// side, and lets the connection linger for the client's answering close.
    private func endWebSocket(
        _ connection: Connection<Context>, _ webSocket: ActiveWebSocket, _ code: WebSocketCloseCode, _ reason: String
    ) {
        webSocket.socket.connectionEnded()
        webSocket.session.cancel()
        if !webSocket.closeSent {
            webSocket.closeSent = true
            connection.output.append(contentsOf: WebSocketFrame.close(code, reason: reason))
        }
        connection.webSocket = nil
        connection.lifecycle.webSocketEnded()
    }

    /// Queues the final response to the current request (or the head of a streamed one).
    private func finish(_ response: consuming HTTPResponse, context: Context, on connection: Connection<Context>) {
        // Consumed, not copied: the pipeline appends to the handler's headers in place.
        var response = response
        if let upgrade = response.webSocket {
            if response.status.code == 101, !connection.requestIsHTTP10, !connection.requestIsHead {
                startWebSocket(response, upgrade, context: context, on: connection)
                return
            }
            // An HTTP/1.0 client cannot be upgraded (nor a `HEAD`): answer like a bad request.
            runUnconnected(upgrade)
            response = responder.reject(.invalidUpgrade, peer: connection.remoteAddress)
        }
        let keepAlive = connection.requestKeepAlive && !response.closeConnection && !connection.parser.isClosed
        if let stream = response.stream {
            if Self.bodyAllowed(response.status.code), !connection.requestIsHead {
                startStream(response, stream, keepAlive: keepAlive, context: context, on: connection)
                return
            }
            runUnsent(stream)  // a `HEAD`, or a status without a body: only the head is sent
        }
        queueAnswer(consume response, context: context, on: connection) {
            connection.lifecycle.responseQueued(keepAlive: keepAlive) == .nextRequest
        }
        connection.context = nil
    }

    private func reject(_ error: HTTPParserError, on connection: Connection<Context>) {
        releaseInput(connection)  // the parser dropped what it collected
        connection.context = nil
        connection.lifecycle.protocolErrorQueued()
        serialize(
            responder.reject(error, peer: connection.remoteAddress), keepAlive: false, omitBody: false,
            into: &connection.output)
    }

    /// How a response's body is delimited.
    enum Framing {
        /// `Content-Length` (the body is known).
        case length
        /// `Transfer-Encoding: chunked` (a streamed body, HTTP/1.1).
        case chunked
        /// Neither: the body ends when the connection closes (a streamed body, HTTP/1.0).
        case untilClose
    }

    private static func bodyAllowed(_ code: Int) -> Bool { !(code < 200 || code == 204 || code == 304) }

    private func serialize(
        _ response: HTTPResponse, framing: Framing = .length, keepAlive: Bool, upgrade: Bool = false, omitBody: Bool,
        into output: inout [UInt8]
    ) {
        let code = response.status.code
        let bodyAllowed = Self.bodyAllowed(code)
        let sendsBody = bodyAllowed && !omitBody && framing == .length
        // The head is written on the stack and appended with one copy: it is a dozen pieces.
        var headLength = Self.headFixedBytes + serverLine.count
        for field in response.headers { headLength += field.name.utf8.count + field.value.utf8.count + 4 }
        output.reserveCapacity(output.count + headLength + (sendsBody ? response.body.count : 0))
        HTTPStatus.appendStatusLine(code, to: &output)
        ByteWriter.append(to: &output, capacity: headLength) { head in
            for field in response.headers {
                head.write(field.name)
                head.write(Self.colonSpace)
                head.write(field.value)
                head.write(Self.crlf)
            }
            if bodyAllowed {
                switch framing {
                case .length:
                    head.write(Self.contentLengthPrefix)
                    head.writeDecimal(response.body.count)
                    head.write(Self.crlf)
                case .chunked:
                    head.write(Self.chunkedLine)
                case .untilClose:
                    break
                }
            }
            dates.write(now: now, to: &head)
            head.write(serverLine)
            head.write(upgrade ? Self.upgradeLine : keepAlive ? Self.keepAliveLine : Self.closeLine)
            head.write(Self.crlf)
        }
        if sendsBody { output.append(contentsOf: response.body) }
    }

    /// What a response head holds besides its status line, its fields and the `Server` line:
    /// `Content-Length` (or `Transfer-Encoding`), `Date`, `Connection`, the empty line.
    private static var headFixedBytes: Int { 128 }

    private static var colonSpace: StaticString { ": " }
    private static var crlf: StaticString { "\r\n" }
    private static var contentLengthPrefix: StaticString { "Content-Length: " }
    private static var keepAliveLine: StaticString { "Connection: keep-alive\r\n" }
    private static var closeLine: StaticString { "Connection: close\r\n" }
    private static var upgradeLine: StaticString { "Connection: Upgrade\r\n" }
    private static var chunkedLine: StaticString { "Transfer-Encoding: chunked\r\n" }
    private static var lastChunk: StaticString { "0\r\n\r\n" }

    // MARK: - Deadlines and shutdown

    private func sweepDeadlines() {
        for connection in Array(connections.values)
        where connection.lifecycle.deadlineKind != .none && now >= connection.lifecycle.deadline {
            switch connection.lifecycle.deadlinePassed() {
            case .close:
                // A client that stopped reading (or an idle one that never took its last
                // answer) gets a reset: a graceful close would wait behind bytes it never takes.
                _ = csystem_reset_on_close_if_unsent(connection.fd, connection.hasPendingOutput ? 1 : 0)
                closeConnection(connection)
            case .sendRequestTimeout:
                connection.context = nil
                serialize(
                    responder.reject(.timeout, peer: connection.remoteAddress), keepAlive: false, omitBody: false,
                    into: &connection.output)
                connection.readable = false
                drive(connection)
            default:
                break
            }
        }
    }

    private func beginShutdown() {
        shuttingDown = true
        shutdownDeadline = now + configuration.shutdownTimeout.nanosecondsClamped
        if listener >= 0 {
            _ = csystem_epoll_delete(epoll, listener)
            close(listener)
            listener = -1
        }
        logger.info(
            "shutting down",
            metadata: [
                "loop": "\(index)", "connections": "\(connections.count)",
                "in_flight": "\(inFlightCount.load(ordering: .relaxed))",
            ])
        for connection in Array(connections.values) {
            let action = connection.lifecycle.shutdownBegan()
            if action == .close
                || (connection.lifecycle.state == .readingHead && connection.parser.bufferedByteCount == 0)
            {
                closeConnection(connection)
            } else if action == .endStream, let stream = connection.stream, stream.shutdown == .cancel {
                stream.writer.shutdownBegan()
            } else if action == .endWebSocket, let webSocket = connection.webSocket {
                endWebSocket(connection, webSocket, .goingAway, "server shutting down")
                drive(connection)
            }
        }
    }

    private func closeConnection(_ connection: Connection<Context>) {
        guard connections[connection.fd] === connection else { return }
        connections.removeValue(forKey: connection.fd)
        connectionCount.store(connections.count, ordering: .relaxed)
        caps.releaseConnection()
        if let key = connection.clientKey { caps.releaseClientSlot(key) }
        if connection.heldOutput != 0 {
            outputBudget.adjust(by: -connection.heldOutput)
            connection.heldOutput = 0
        }
        releaseOutputShare(connection)
        releaseInput(connection)
        connection.output = []  // freed now, not whenever the last reference to the connection goes
        connection.outputOffset = 0
        if connection.lifecycle.isHandling {
            connection.handlerTask?.cancel()
        }
        if let stream = connection.stream {
            connection.stream = nil
            streamTable.leave(stream.writer)
            stream.writer.close()  // cancels the producer, tells a detached body's holder
        }
        if let webSocket = connection.webSocket {
            connection.webSocket = nil
            webSocket.socket.connectionEnded()
            webSocket.session.cancel()
        }
        close(connection.fd)  // also removes it from epoll
    }
}

/// Appends `value` in lowercase hexadecimal ASCII (a chunk size).
func appendHex(_ value: Int, to output: inout [UInt8]) {
    let digits: StaticString = "0123456789abcdef"
    var shift = (Int.bitWidth - value.leadingZeroBitCount + 3) / 4 * 4 - 4
    if shift < 0 { shift = 0 }
    while shift >= 0 {
        output.append(digits.utf8Start[(value >> shift) & 0xF])
        shift -= 4
    }
}

extension Array where Element == UInt8 {
    @inline(__always)
    mutating func append(contentsOf text: StaticString) {
        append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// Appends the UTF-8 of `text` with one copy (a native or small string's bytes are
    /// contiguous), not byte by byte through its `utf8` view.
    @inlinable @inline(__always)
    public mutating func append(utf8 text: String) {
        let done: Void? = text.utf8.withContiguousStorageIfAvailable { append(contentsOf: $0) }
        if done == nil { append(contentsOf: text.utf8) }
    }
}

extension HTTPParserError {
    /// A WebSocket upgrade the connection cannot make (HTTP/1.0, `HEAD`).
    static let invalidUpgrade = HTTPParserError(
        status: 400, code: "invalid_upgrade", message: "A WebSocket upgrade needs an HTTP/1.1 GET request.")

    /// The request head or body did not arrive in time.
    static let timeout = HTTPParserError(
        status: 408, code: "request_timeout", message: "The request was not received in time.")
}

func monotonicNow() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

/// Refusals counted for a warning written at most once per 10 s, however hard someone pushes
/// (the loop's sweep writes what is left after a burst).
struct RefusalTally {
    /// Refusals since the last line.
    var count = 0
    /// When the last line was written (the loop's monotonic nanoseconds; 0: never).
    private var logged: UInt64 = 0

    /// The refusals to log now, if any and if the last line is 10 s old (or there was none);
    /// they are then counted as logged.
    mutating func due(now: UInt64) -> Int? {
        guard count > 0, logged == 0 || now >= logged &+ 10_000_000_000 else { return nil }
        defer {
            count = 0
            logged = now
        }
        return count
    }
}

/// Resumes everyone waiting once the loop has stopped.
final class StopSignal: @unchecked Sendable {
    private let lock = NSLock()
    private var done = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    func signal() {
        lock.lock()
        done = true
        let toResume = waiters
        waiters = []
        lock.unlock()
        for waiter in toResume { waiter.resume() }
    }

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            lock.lock()
            if done {
                lock.unlock()
                continuation.resume()
            } else {
                waiters.append(continuation)
                lock.unlock()
            }
        }
    }
}

/// The `Date` header line, formatted once per second of the wall clock. Between two
/// seconds it is reused without reading the clock: the loop's monotonic `now` (read once per
/// wake-up) tells when the next second begins.
final class DateHeaderCache {
    /// The wall clock: seconds and nanoseconds since 1970 (`CLOCK_REALTIME`; a test's own).
    typealias WallClock = () -> (seconds: Int, nanoseconds: Int)

    private let wallClock: WallClock
    /// The monotonic time at which `line` becomes stale (the next wall-clock second).
    private var validUntil: UInt64 = 0
    private(set) var line: [UInt8] = []

    init(wallClock: @escaping WallClock = DateHeaderCache.realtime) {
        self.wallClock = wallClock
    }

    /// Appends `Date: …\r\n` for the wall-clock second of `now` (monotonic nanoseconds).
    func appendHeaderLine(now: UInt64, to output: inout [UInt8]) {
        refresh(now: now)
        output.append(contentsOf: line)
    }

    /// Writes `Date: …\r\n` for the wall-clock second of `now` (monotonic nanoseconds).
    func write(now: UInt64, to writer: inout ByteWriter) {
        refresh(now: now)
        writer.write(line)
    }

    private func refresh(now: UInt64) {
        guard now >= validUntil || line.isEmpty else { return }
        let (seconds, nanoseconds) = wallClock()
        line = Self.headerLine(seconds: seconds)
        validUntil = now &+ UInt64(1_000_000_000 - min(max(nanoseconds, 0), 999_999_999))
    }

    /// `Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n` (RFC 9110 IMF-fixdate).
    static func headerLine(seconds: Int) -> [UInt8] {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        let text = String(
            format: "Date: %@, %02d %@ %04d %02d:%02d:%02d GMT\r\n", days[Int(parts.tm_wday)], Int(parts.tm_mday),
            months[Int(parts.tm_mon)], Int(parts.tm_year) + 1900, Int(parts.tm_hour), Int(parts.tm_min),
            Int(parts.tm_sec))
        return Array(text.utf8)
    }

    static func realtime() -> (seconds: Int, nanoseconds: Int) {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return (Int(time.tv_sec), Int(time.tv_nsec))
    }
}

/// The loop thread's work, carried through C.
private final class LoopThreadBody: @unchecked Sendable {  // runs once, on the new thread
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

extension EventLoop {
    /// Sends of a fan-out that did not go out whole (`StreamTable.send`): what the socket did
    /// not take becomes the connection's output, sent as the client reads; a send that
    /// failed closes the connection (its body's holder is told).
    fileprivate func finishShortSends(_ short: [StreamTable.ShortSend]) {
        for send in short {
            guard let connection = connections[send.target.fd], connection.stream?.writer === send.target.writer
            else { continue }
            if send.sent < 0, send.error != EAGAIN, send.error != EWOULDBLOCK {
                closeConnection(connection)
                continue
            }
            let rest = send.frame[(send.frame.startIndex + max(send.sent, 0))...]
            // Its head was sent and its writer held nothing: no other output waits.
            connection.output.removeAll(keepingCapacity: true)
            connection.outputOffset = 0
            if connection.output.capacity == 0, let spare = spareOutputs.popLast() { connection.output = spare }
            connection.output.append(contentsOf: rest)
            send.target.writer.holdUnsent(rest.count)
            drive(connection)  // sends what the socket takes now, else waits until it is writable
        }
    }
}
