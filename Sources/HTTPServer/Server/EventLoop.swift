import CSystem
import Foundation
import Logging
import Synchronization

/// The epoll loop behind `HTTPServer`. All connection state is confined to the loop's
/// thread; other threads reach it only through the `Mailbox`.
final class EventLoop: @unchecked Sendable {
    private let configuration: HTTPServerConfiguration
    private let router: Router
    private let logger: Logger
    private let cors: CORSPolicy
    private let mailbox = Mailbox()
    private let stopped = StopSignal()

    private var epoll: Int32 = -1
    private var listener: Int32 = -1
    private var reserveFD: Int32 = -1
    private(set) var boundPort = 0
    private var connections: [Int32: Connection] = [:]
    private var nextConnectionID: UInt64 = 0
    private var shuttingDown = false
    /// The accept queue may hold connections no new edge will report (accept failed for want
    /// of descriptors or memory): retry from the periodic sweep.
    private var acceptRetryPending = false
    private var shutdownDeadline: UInt64 = 0
    private var now: UInt64 = 0
    private let dates = DateHeaderCache()
    private let requestIDs = RequestIDGenerator()

    private let connectionCount = Atomic<Int>(0)
    private let inFlightCount = Atomic<Int>(0)

    private static let listenerToken = UInt64.max
    private static let wakeToken = UInt64.max - 1
    private static let readChunk = 64 * 1024
    /// Where every connection's reads land first (loop thread only). Reading straight into
    /// each parser's buffer made every connection hold a zero-filled 64 KiB buffer for its
    /// whole life; copying the few bytes a read returns keeps idle connections small.
    private var readBuffer = [UInt8](repeating: 0, count: readChunk)

    private let epollIn = csystem_epollin()
    private let epollOut = csystem_epollout()
    private let epollRDHUP = csystem_epollrdhup()
    private let epollHUP = csystem_epollhup()
    private let epollErr = csystem_epollerr()
    private let epollET = csystem_epollet()

    init(configuration: HTTPServerConfiguration, router: Router, logger: Logger) {
        self.configuration = configuration
        self.router = router
        self.logger = logger
        self.cors = CORSPolicy(origins: configuration.corsOrigins)
    }

    var statistics: (connections: Int, inFlight: Int) {
        (connectionCount.load(ordering: .relaxed), inFlightCount.load(ordering: .relaxed))
    }

    // MARK: - Start and stop

    func start() throws -> Int {
        let limit = csystem_raise_fd_limit()
        var port: Int32 = 0
        var reason = [CChar](repeating: 0, count: 256)
        let fd = csystem_listen(configuration.host, Int32(configuration.port), 4096, &port, &reason, reason.count)
        guard fd >= 0 else {
            throw HTTPServerError(description: String(decoding: reason.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        listener = fd
        boundPort = Int(port)
        epoll = csystem_epoll_create()
        guard epoll >= 0, mailbox.eventFD >= 0,
            csystem_epoll_add(epoll, listener, epollIn | epollET, Self.listenerToken) == 0,
            csystem_epoll_add(epoll, mailbox.eventFD, epollIn | epollET, Self.wakeToken) == 0
        else {
            close(fd)
            throw HTTPServerError(description: "cannot set up epoll: errno \(errno)")
        }
        reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC)
        logger.debug("file descriptor limit", metadata: ["nofile": "\(limit)"])
        let thread = Thread { [self] in
            _ = csystem_set_thread_name("http-loop")
            run()
        }
        thread.stackSize = 1 << 20
        thread.start()
        return boundPort
    }

    func requestShutdown() { mailbox.requestShutdown() }

    func waitUntilStopped() async { await stopped.wait() }

    // MARK: - The loop

    private func run() {
        var events = [csystem_event](repeating: csystem_event(), count: 256)
        var nextSweep: UInt64 = 0
        while true {
            let timeout: Int32 = connections.isEmpty && !shuttingDown ? 1000 : 250
            let count = csystem_epoll_wait(epoll, &events, Int32(events.count), timeout)
            now = monotonicNow()
            if count < 0 {
                if errno == EINTR { continue }
                preconditionFailure("epoll_wait failed with errno \(errno)")  // EBADF/EFAULT/EINVAL: a bug
            }
            for index in 0..<Int(count) {
                let event = events[index]
                switch event.data {
                case Self.listenerToken: acceptConnections()
                case Self.wakeToken: handleMailbox()
                default: handle(event.events, on: Int32(truncatingIfNeeded: event.data))
                }
            }
            if now >= nextSweep {
                sweepDeadlines()
                if acceptRetryPending, listener >= 0 { acceptConnections() }
                nextSweep = now + 250_000_000
            }
            if shuttingDown, connections.isEmpty || now >= shutdownDeadline { break }
        }
        for connection in Array(connections.values) { closeConnection(connection) }
        if listener >= 0 { close(listener) }
        close(epoll)
        close(mailbox.eventFD)
        if reserveFD >= 0 { close(reserveFD) }
        logger.info("HTTP server stopped")
        stopped.signal()
    }

    private func handle(_ flags: UInt32, on fd: Int32) {
        guard let connection = connections[fd] else { return }
        if flags & (epollErr | epollHUP) != 0, flags & epollIn == 0 {
            // Reset or fully closed: nobody is left to answer.
            closeConnection(connection)
            return
        }
        if flags & epollRDHUP != 0 { connection.peerClosedInput = true }
        if flags & epollIn != 0 { connection.readable = true }
        if flags & epollOut != 0 { connection.writable = true }
        drive(connection)
    }

    // MARK: - Accepting

    private func acceptConnections() {
        var address = [CChar](repeating: 0, count: 64)
        var refusedForDescriptors = 0
        defer {
            if refusedForDescriptors > 0 {
                logger.warning("out of file descriptors; refused connections", metadata: ["refused": "\(refusedForDescriptors)"])
            }
        }
        if reserveFD < 0 { reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC) }
        while true {
            let fd = csystem_accept(listener, &address, address.count)
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
                    let dropped = csystem_accept(listener, &address, address.count)
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
            if connections.count >= configuration.maxConnections || shuttingDown {
                refuseConnection(fd)
                continue
            }
            _ = csystem_set_nodelay(fd)
            guard csystem_epoll_add(epoll, fd, epollIn | epollOut | epollRDHUP | epollET, UInt64(fd)) == 0 else {
                close(fd)
                continue
            }
            nextConnectionID &+= 1
            let remote = String(decoding: address.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let connection = Connection(fd: fd, id: nextConnectionID, remoteAddress: remote, limits: configuration.limits)
            connection.deadlineKind = .idle
            connection.deadline = now + configuration.headerTimeout.nanosecondsClamped
            connections[fd] = connection
            connectionCount.store(connections.count, ordering: .relaxed)
        }
    }

    private func refuseConnection(_ fd: Int32) {
        let output = refusalResponse()
        _ = output.withUnsafeBytes { buffer in
            buffer.baseAddress.map { csystem_send(fd, $0, buffer.count) }
        }
        close(fd)
    }

    /// The `503` for a connection the server cannot take. Serialized like any response, so it
    /// carries Date, Server and a request id too.
    private func refusalResponse() -> [UInt8] {
        var output: [UInt8] = []
        serialize(
            .error(
                .serviceUnavailable, code: "server_busy", message: "Too many connections; try again later.",
                headers: ["Retry-After": "1"]),
            requestID: requestIDs.next(), origin: nil, keepAlive: false, omitBody: false, into: &output)
        return output
    }

    // MARK: - Reading, parsing, writing

    private func drive(_ connection: Connection) {
        while true {
            if connection.hasPendingOutput {
                guard connection.writable, flush(connection) else { return }
                if connection.hasPendingOutput {
                    if connection.deadlineKind != .write {
                        connection.deadlineKind = .write
                        connection.deadline = now + configuration.writeTimeout.nanosecondsClamped
                    }
                    return
                }
                if connection.output.capacity > 256 * 1024 { connection.output = [] } else { connection.output.removeAll(keepingCapacity: true) }
                connection.outputOffset = 0
                if connection.closeAfterWrite {
                    closeConnection(connection)
                    return
                }
                // Only a final response ends a request: after an interim `100 Continue` the
                // body is still due, under the body deadline.
                if !connection.inFlight, connection.deadlineKind != .body { waitForNextRequest(connection) }
            }
            if connection.inFlight { return }

            if let event = connection.parser.next() {
                switch event {
                case .head(let head):
                    if head.hasBody {
                        connection.deadlineKind = .body
                        connection.deadline = now + configuration.bodyIdleTimeout.nanosecondsClamped
                    }
                    if head.expectsContinue { connection.output.append(contentsOf: Self.continueLine) }
                case .request(let head, let body):
                    dispatch(head, body: body, on: connection)
                case .error(let error):
                    sendParserError(error, on: connection)
                case .body, .end:
                    break  // stream mode only
                }
                continue
            }

            if connection.parser.isClosed {
                if !connection.hasPendingOutput { closeConnection(connection) }
                return
            }
            if !connection.readable {
                if connection.peerClosedInput { closeConnection(connection) }
                return
            }
            let wasIdle = connection.parser.isIdle
            let fd = connection.fd
            let received = readBuffer.withUnsafeMutableBytes { buffer -> Int in
                while true {
                    let count = read(fd, buffer.baseAddress, buffer.count)
                    if count < 0, errno == EINTR { continue }
                    if count > 0 { connection.parser.feed(UnsafeRawBufferPointer(rebasing: buffer[0..<count])) }
                    return count
                }
            }
            if received > 0 {
                if received < Self.readChunk { connection.readable = false }
                if wasIdle, connection.deadlineKind == .idle {
                    connection.deadlineKind = .header
                    connection.deadline = now + configuration.headerTimeout.nanosecondsClamped
                } else if connection.deadlineKind == .body {
                    connection.deadline = now + configuration.bodyIdleTimeout.nanosecondsClamped
                }
            } else if received == 0 {
                connection.readable = false
                connection.peerClosedInput = true
                closeConnection(connection)  // EOF: whatever was half-sent is abandoned
                return
            } else if errno == EAGAIN || errno == EWOULDBLOCK {
                connection.readable = false
            } else {
                closeConnection(connection)
                return
            }
        }
    }

    /// Writes as much pending output as the socket takes. False when the connection was closed.
    private func flush(_ connection: Connection) -> Bool {
        while connection.outputOffset < connection.output.count {
            let offset = connection.outputOffset
            let sent = connection.output.withUnsafeBytes { buffer -> Int in
                guard let base = buffer.baseAddress else { return 0 }
                return csystem_send(connection.fd, base + offset, buffer.count - offset)
            }
            if sent > 0 {
                connection.outputOffset += sent
                if connection.deadlineKind == .write {
                    connection.deadline = now + configuration.writeTimeout.nanosecondsClamped
                }
            } else if sent < 0, errno == EAGAIN || errno == EWOULDBLOCK {
                connection.writable = false
                return true
            } else {
                closeConnection(connection)
                return false
            }
        }
        return true
    }

    private func waitForNextRequest(_ connection: Connection) {
        if connection.parser.bufferedByteCount > 0 {
            connection.deadlineKind = .header
            connection.deadline = now + configuration.headerTimeout.nanosecondsClamped
        } else {
            connection.deadlineKind = .idle
            connection.deadline = now + configuration.keepAliveTimeout.nanosecondsClamped
        }
    }

    private static let continueLine = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)

    // MARK: - Dispatch

    private func dispatch(_ head: HTTPRequestHead, body: [UInt8], on connection: Connection) {
        let requestID = RequestIDGenerator.sanitize(head.headers["x-request-id"]) ?? requestIDs.next()
        connection.current = Connection.RequestInfo(
            method: head.method, path: head.path, requestID: requestID, route: "unmatched",
            origin: head.headers["origin"], keepAlive: head.keepAlive, started: now)
        connection.deadlineKind = .none
        var request = HTTPRequest(
            method: head.method, path: head.path, query: head.query, headers: head.headers, body: body,
            requestID: requestID, remoteAddress: connection.remoteAddress)

        if head.method == .options {
            connection.current?.route = "OPTIONS"
            respond(optionsResponse(request), on: connection)
            return
        }
        switch router.match(method: head.method, path: head.path) {
        case .notFound:
            respond(.error(.notFound, code: "not_found", message: "Not found."), on: connection)
        case .methodNotAllowed(let allowed):
            respond(
                .error(
                    .methodNotAllowed, code: "method_not_allowed", message: "Method \(head.method) is not allowed here.",
                    headers: ["Allow": allowed.joined(separator: ", ")]), on: connection)
        case .found(.inline(let handler), let parameters, let route):
            connection.current?.route = route
            request.parameters = parameters
            respond(handler(request), on: connection)
        case .found(.async(let handler), let parameters, let route):
            connection.current?.route = route
            request.parameters = parameters
            connection.inFlight = true
            inFlightCount.wrappingAdd(1, ordering: .relaxed)
            let mailbox = self.mailbox
            let fd = connection.fd
            let id = connection.id
            let logger = self.logger
            connection.handlerTask = Task { [request] in
                // Every log line written while handling carries the request id.
                let response: HTTPResponse = await RequestContext.$requestID.withValue(request.requestID) {
                    do {
                        return try await handler(request)
                    } catch let error as HTTPResponseError {
                        return error.response
                    } catch {
                        logger.error("request failed", metadata: ["error": "\(error)"])
                        return .error(.internalServerError, code: "internal_error", message: "Internal server error.")
                    }
                }
                mailbox.post(Mailbox.Completion(fd: fd, connectionID: id, response: response))
            }
        }
    }

    private func optionsResponse(_ request: HTTPRequest) -> HTTPResponse {
        let allowed = router.allowedMethods(path: request.path)
        if request.headers["access-control-request-method"] != nil, cors.isEnabled {
            var headers: HTTPHeaders = [:]
            if let origin = cors.allowedOrigin(request.headers["origin"]) {
                headers.append(name: "Access-Control-Allow-Origin", value: origin)
                headers.append(name: "Access-Control-Allow-Methods", value: CORSPolicy.allowedMethods)
                headers.append(
                    name: "Access-Control-Allow-Headers",
                    value: request.headers["access-control-request-headers"] ?? CORSPolicy.defaultAllowedHeaders)
                headers.append(name: "Access-Control-Max-Age", value: "86400")
            }
            return HTTPResponse(status: .noContent, headers: headers)
        }
        if allowed.isEmpty, request.path != "*" {
            return .error(.notFound, code: "not_found", message: "Not found.")
        }
        return HTTPResponse(status: .noContent, headers: ["Allow": allowed.isEmpty ? CORSPolicy.allowedMethods : allowed.joined(separator: ", ")])
    }

    private func handleMailbox() {
        let (completions, shutdown) = mailbox.drain()
        for completion in completions {
            guard let connection = connections[completion.fd], connection.id == completion.connectionID else {
                continue  // the client went away meanwhile
            }
            connection.inFlight = false
            connection.handlerTask = nil
            inFlightCount.wrappingAdd(-1, ordering: .relaxed)
            respond(completion.response, on: connection)
            drive(connection)
        }
        if shutdown, !shuttingDown { beginShutdown() }
    }

    // MARK: - Responses

    private func respond(_ response: HTTPResponse, on connection: Connection) {
        let info = connection.current
        let keepAlive =
            (info?.keepAlive ?? false) && !response.closeConnection && !shuttingDown && !connection.parser.isClosed
        connection.closeAfterWrite = !keepAlive
        let isHead = info?.method == .head
        serialize(response, requestID: info?.requestID, origin: info?.origin, keepAlive: keepAlive, omitBody: isHead, into: &connection.output)
        if let info {
            let milliseconds = Double(monotonicNow() &- info.started) / 1_000_000
            configuration.observer?(
                RequestObservation(
                    method: info.method, route: info.route, status: response.status.code, seconds: milliseconds / 1000))
            logger.info(
                "request",
                metadata: [
                    "method": "\(info.method)", "path": "\(info.path)", "status": "\(response.status.code)",
                    "duration_ms": "\(String(format: "%.2f", milliseconds))", "request_id": "\(info.requestID)",
                ])
        }
        connection.current = nil
    }

    private func sendParserError(_ error: HTTPParserError, on connection: Connection) {
        connection.current = nil
        connection.closeAfterWrite = true
        let requestID = requestIDs.next()
        serialize(
            .error(HTTPStatus(error.status), code: error.code, message: error.message), requestID: requestID,
            origin: nil, keepAlive: false, omitBody: false, into: &connection.output)
        logger.info("rejected request", metadata: ["status": "\(error.status)", "code": "\(error.code)", "request_id": "\(requestID)"])
    }

    private func serialize(
        _ response: HTTPResponse, requestID: String?, origin: String?, keepAlive: Bool, omitBody: Bool,
        into output: inout [UInt8]
    ) {
        let code = response.status.code
        let bodyAllowed = !(code < 200 || code == 204 || code == 304)
        output.reserveCapacity(output.count + 256 + response.body.count)
        output.append(contentsOf: "HTTP/1.1 \(code) \(response.status.reason)\r\n".utf8)
        for field in response.headers {
            output.append(contentsOf: field.name.utf8)
            output.append(contentsOf: Self.colonSpace)
            output.append(contentsOf: field.value.utf8)
            output.append(contentsOf: Self.crlf)
        }
        if bodyAllowed {
            output.append(contentsOf: "Content-Length: \(response.body.count)\r\n".utf8)
        }
        output.append(contentsOf: dates.headerLine(now: now))
        output.append(contentsOf: "Server: \(configuration.serverName)\r\n".utf8)
        if let requestID { output.append(contentsOf: "X-Request-Id: \(requestID)\r\n".utf8) }
        if let allowed = cors.allowedOrigin(origin), !response.headers.contains("access-control-allow-origin") {
            output.append(contentsOf: "Access-Control-Allow-Origin: \(allowed)\r\n".utf8)
            output.append(contentsOf: "Access-Control-Expose-Headers: \(CORSPolicy.exposedHeaders)\r\n".utf8)
            if allowed != "*" { output.append(contentsOf: "Vary: Origin\r\n".utf8) }
        }
        output.append(contentsOf: keepAlive ? Self.keepAliveLine : Self.closeLine)
        output.append(contentsOf: Self.crlf)
        if bodyAllowed, !omitBody { output.append(contentsOf: response.body) }
    }

    private static let colonSpace = Array(": ".utf8)
    private static let crlf = Array("\r\n".utf8)
    private static let keepAliveLine = Array("Connection: keep-alive\r\n".utf8)
    private static let closeLine = Array("Connection: close\r\n".utf8)

    // MARK: - Deadlines and shutdown

    private func sweepDeadlines() {
        for connection in Array(connections.values)
        where connection.deadlineKind != .none && now >= connection.deadline {
            switch connection.deadlineKind {
            case .idle, .write, .none:
                closeConnection(connection)
            case .header, .body:
                connection.deadlineKind = .write
                connection.deadline = now + configuration.writeTimeout.nanosecondsClamped
                let error = HTTPParserError.timeout
                sendParserError(error, on: connection)
                connection.readable = false
                drive(connection)
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
            "shutting down", metadata: ["connections": "\(connections.count)", "in_flight": "\(inFlightCount.load(ordering: .relaxed))"])
        for connection in Array(connections.values)
        where !connection.inFlight && !connection.hasPendingOutput && connection.parser.isIdle {
            closeConnection(connection)
        }
    }

    private func closeConnection(_ connection: Connection) {
        guard connections[connection.fd] === connection else { return }
        connections.removeValue(forKey: connection.fd)
        connectionCount.store(connections.count, ordering: .relaxed)
        if connection.inFlight {
            connection.handlerTask?.cancel()
            connection.inFlight = false
            inFlightCount.wrappingAdd(-1, ordering: .relaxed)
        }
        close(connection.fd)  // also removes it from epoll
    }
}

extension HTTPParserError {
    /// The request head or body did not arrive in time.
    static let timeout = HTTPParserError(
        status: 408, code: "request_timeout", message: "The request was not received in time.")
}

func monotonicNow() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
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

/// The `Date` header line, formatted once per second.
final class DateHeaderCache {
    private var second: Int = -1
    private var line: [UInt8] = []

    func headerLine(now _: UInt64) -> [UInt8] {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        if time.tv_sec != second {
            second = time.tv_sec
            var seconds = time_t(time.tv_sec)
            var parts = tm()
            gmtime_r(&seconds, &parts)
            let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
            let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
            let text = String(
                format: "Date: %@, %02d %@ %04d %02d:%02d:%02d GMT\r\n", days[Int(parts.tm_wday)], Int(parts.tm_mday),
                months[Int(parts.tm_mon)], Int(parts.tm_year) + 1900, Int(parts.tm_hour), Int(parts.tm_min),
                Int(parts.tm_sec))
            line = Array(text.utf8)
        }
        return line
    }
}

/// Request ids: a random per-process prefix and a counter (unique, cheap, unguessable
/// enough to correlate logs without revealing request counts across restarts).
final class RequestIDGenerator {
    private let prefix: String
    private var counter: UInt64 = 0

    init() {
        prefix = String(UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12)).lowercased()
    }

    func next() -> String {
        counter &+= 1
        return prefix + "-" + String(counter, radix: 16)
    }

    /// A client-sent id if it is 1–128 characters of `[A-Za-z0-9._:-]`, else nil.
    static func sanitize(_ value: String?) -> String? {
        guard let value, (1...128).contains(value.utf8.count) else { return nil }
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."),
                UInt8(ascii: ":"):
                continue
            default: return nil
            }
        }
        return value
    }
}
