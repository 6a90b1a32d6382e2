import CSystem
import Foundation
import HTTPServer
import Logging
import Postgres
import Synchronization

/// Per-request values visible to everything a handler calls.
public enum RequestContext {
    /// The current request's id (`X-Request-Id`), while a handler runs: the log handler
    /// adds it to every line.
    @TaskLocal public static var requestID: String?
}

/// The path of every request from head to response, as named stages (see
/// docs/ARCHITECTURE.md):
///
///     admit:    request id → (admin listener: Host, Origin, media type) → CORS preflight →
///               route → body limit → authenticate                    (head only, on the loop)
///     respond:  revocation and expiry again → handler → errors in the family's shape
///               (a task, unless inline)
///     complete: X-Request-Id and CORS headers → observe (access log + metrics)
///
/// The HTTP server calls these; it knows nothing of what they do.
public struct RequestPipeline: HTTPResponder {
    /// What travels with a request from its head to its response. What admission learned
    /// is fixed from then on and kept in one object: copying a context from stage to stage
    /// costs one reference count, not one per field.
    public struct Context: Sendable {
        final class Admitted: Sendable {
            let requestID: String
            let method: HTTPMethod
            let path: String
            let origin: String?
            let started: UInt64
            let endpoint: Endpoint?
            let parameters: [String: String]
            let client: String
            /// The caller, verified from the head (routes that need a signed-in caller).
            let claims: AccessClaims?

            init(
                requestID: String, method: HTTPMethod, path: String, origin: String?, started: UInt64,
                endpoint: Endpoint?, parameters: [String: String], client: String, claims: AccessClaims?
            ) {
                self.requestID = requestID
                self.method = method
                self.path = path
                self.origin = origin
                self.started = started
                self.endpoint = endpoint
                self.parameters = parameters
                self.client = client
                self.claims = claims
            }
        }

        let admitted: Admitted
        /// The caller, once the authentication stage knows it (for the access log).
        var userID: UUID? = nil

        init(
            requestID: String, method: HTTPMethod, path: String, origin: String? = nil, started: UInt64,
            endpoint: Endpoint? = nil, parameters: [String: String] = [:], client: String = "",
            claims: AccessClaims? = nil
        ) {
            admitted = Admitted(
                requestID: requestID, method: method, path: path, origin: origin, started: started,
                endpoint: endpoint, parameters: parameters, client: client, claims: claims)
        }

        var requestID: String { admitted.requestID }
        var method: HTTPMethod { admitted.method }
        var path: String { admitted.path }
        var origin: String? { admitted.origin }
        var started: UInt64 { admitted.started }
        var endpoint: Endpoint? { admitted.endpoint }
        var parameters: [String: String] { admitted.parameters }
        /// The client's address (for the access log).
        var client: String { admitted.client }
        /// The caller's verified claims, when the route needs a signed-in caller.
        var claims: AccessClaims? { admitted.claims }
    }

    let router: Router<Endpoint>
    let cors: CORSPolicy
    let authenticator: Authenticator
    let accessLog: AccessLog?
    /// The admin listener's Host, Origin and media type checks (nil on the public listener).
    let requestGuard: AdminRequestGuard?
    let logger: Logger
    private let requestIDs = RequestIDGenerator()
    private let unmatched: HTTPRouteMetrics
    private let preflight: HTTPRouteMetrics
    private let answersRefused: Counter
    private let answersRefusedPerClient: Counter
    private let bodiesRefused: Counter
    private let bodiesRefusedPerClient: Counter

    init(
        routes: Routes, corsOrigins: [String], authenticator: Authenticator, accessLog: AccessLog?,
        requestGuard: AdminRequestGuard? = nil, logger: Logger
    ) {
        self.requestGuard = requestGuard
        router = routes.router
        cors = CORSPolicy(origins: corsOrigins)
        self.authenticator = authenticator
        self.accessLog = accessLog
        self.logger = logger
        unmatched = routes.metrics.route("unmatched")
        preflight = routes.metrics.route("OPTIONS")
        answersRefused = routes.metrics.answersRefused
        answersRefusedPerClient = routes.metrics.answersRefusedPerClient
        bodiesRefused = routes.metrics.bodiesRefused
        bodiesRefusedPerClient = routes.metrics.bodiesRefusedPerClient
    }

    // MARK: - Stages on the head

    public func admit(_ head: HTTPRequestHead, client: String) -> Admission<Context> {
        let requestID = RequestIDGenerator.sanitize(head.headers["x-request-id"]) ?? requestIDs.next()
        let origin = cors.isEnabled ? head.headers["origin"] : nil
        let started = monotonicNanoseconds()
        /// The context, with the route's endpoint once it is known to answer.
        func context(
            _ endpoint: Endpoint? = nil, _ parameters: [String: String] = [:], _ claims: AccessClaims? = nil
        ) -> Context {
            Context(
                requestID: requestID, method: head.method, path: head.path, origin: origin, started: started,
                endpoint: endpoint, parameters: parameters, client: client, claims: claims)
        }
        let match = router.match(method: head.method, path: head.path)
        if let requestGuard {
            var endpoint: Endpoint? = nil
            if case .found(let found, _, _) = match { endpoint = found }
            if let refusal = requestGuard.check(head, endpoint: endpoint) {
                return .answer(refusal.response(for: endpoint?.family ?? Self.family(of: head.path)), context())
            }
        }
        if head.method == .options {
            return .answer(options(head), context())
        }
        switch match {
        case .notFound:
            return .answerAfterBody(APIError.notFound().response(for: Self.family(of: head.path)), context())
        case .methodNotAllowed(let allowed):
            var response = APIError.methodNotAllowed(head.method).response(for: Self.family(of: head.path))
            response.headers.append(name: "Allow", value: allowed.joined(separator: ", "))
            return .answerAfterBody(response, context())
        case .found(let endpoint, let parameters, _):
            if case .contentLength(let length) = head.bodyFraming, length > endpoint.bodyLimit {
                return .answer(
                    APIError.bodyTooLarge(limit: endpoint.bodyLimit).response(for: endpoint.family),
                    context(endpoint, parameters))
            }
            if case .refused(let error) = endpoint.handler {
                return .answerAfterBody(error(parameters).response(for: endpoint.family), context(endpoint, parameters))
            }
            guard case .authenticated = endpoint.handler else {
                return .readBody(bodyLimit: endpoint.bodyLimit, context(endpoint, parameters))
            }
            // From the head, before a body byte is read: a caller without a valid token cannot
            // make the server take (and hold) a body. A small body (the usual push or insert of
            // a client whose token just expired) is read and dropped, then answered, so the
            // client refreshes and retries on the same connection. A larger one, a chunked one,
            // or one the client waits to send (`Expect: 100-continue`) is answered at once and
            // never read: the connection then lingers and closes (`Admission.answer`).
            do {
                let claims = try authenticator.authenticate(
                    headers: head.headers, query: head.query, family: endpoint.family,
                    queryToken: endpoint.acceptsQueryToken)
                return .readBody(bodyLimit: endpoint.bodyLimit, context(endpoint, parameters, claims))
            } catch {
                let response = error.response(for: endpoint.family)
                if case .contentLength(let length) = head.bodyFraming, length <= ByteBudget.smallBody,
                    !head.expectsContinue
                {
                    return .answerAfterBody(response, context(endpoint, parameters))
                }
                return .answer(response, context(endpoint, parameters))
            }
        }
    }

    /// A CORS preflight, or the methods a path allows.
    private func options(_ head: HTTPRequestHead) -> HTTPResponse {
        if head.headers["access-control-request-method"] != nil, cors.isEnabled {
            var headers: HTTPHeaders = [:]
            if let origin = cors.allowedOrigin(head.headers["origin"]) {
                headers.append(name: "Access-Control-Allow-Origin", value: origin)
                headers.append(name: "Access-Control-Allow-Methods", value: CORSPolicy.allowedMethods)
                headers.append(
                    name: "Access-Control-Allow-Headers",
                    value: head.headers["access-control-request-headers"] ?? CORSPolicy.defaultAllowedHeaders)
                headers.append(name: "Access-Control-Max-Age", value: "86400")
            }
            return HTTPResponse(status: .noContent, headers: headers)
        }
        let allowed = router.allowedMethods(path: head.path)
        if allowed.isEmpty, head.path != "*" {
            return APIError.notFound().response(for: Self.family(of: head.path))
        }
        return HTTPResponse(
            status: .noContent,
            headers: ["Allow": allowed.isEmpty ? CORSPolicy.allowedMethods : allowed.joined(separator: ", ")])
    }

    // MARK: - Stages on the whole request

    public func respond(to request: consuming HTTPRequest, context: Context) -> Reply<Context> {
        guard let endpoint = context.endpoint else {
            return .now(APIError.notFound().response(for: .native), context)
        }
        var request = request  // moved: consumed, not copied
        request.requestID = context.requestID
        request.parameters = context.parameters
        let family = endpoint.family
        switch endpoint.handler {
        case .inline(let handler):
            return .now(handler(request), context)
        case .refused(let error):  // answered from the head (`admit`)
            return .now(error(context.parameters).response(for: family), context)
        case .open(let handler):
            return .later { [self, request] in
                await RequestContext.$requestID.withValue(request.requestID) {
                    do {
                        return (try await handler(request), context)
                    } catch {
                        return (render(error, family: family), context)
                    }
                }
            }
        case .authenticated(let handler):
            return .later { [self, request] in
                await RequestContext.$requestID.withValue(request.requestID) {
                    var context = context
                    do {
                        // Verified from the head (`admit`); only what may have changed since
                        // the body began is checked again: revocation and expiry.
                        let claims: AccessClaims
                        if let admitted = context.claims {
                            try authenticator.stillValid(admitted, family: family)
                            claims = admitted
                        } else {
                            claims = try authenticator.authenticate(
                                request, family: family, queryToken: endpoint.acceptsQueryToken)
                        }
                        context.userID = claims.userID
                        return (try await handler(request, claims), context)
                    } catch {
                        return (render(error, family: family), context)
                    }
                }
            }
        }
    }

    /// The error stage: an `APIError` in the family's shape; a database failure a client
    /// may retry as `503` with `Retry-After`; anything else a bare `500` (logged).
    func render(_ error: any Error, family: APIFamily) -> HTTPResponse {
        if let error = error as? APIError { return error.response(for: family) }
        if let error = error as? PostgresError, let unavailable = APIError.serviceUnavailable(error) {
            logger.warning("database unavailable", metadata: ["error": "\(error)"])
            return unavailable.response(for: family)
        }
        logger.error("request failed", metadata: ["error": "\(error)"])
        return APIError.internalError.response(for: family)
    }

    // MARK: - Stages on the response

    public func complete(_ response: inout HTTPResponse, context: Context) {
        response.headers.append(name: "X-Request-Id", value: context.requestID)
        if requestGuard != nil { AdminRequestGuard.secure(&response.headers) }
        if let origin = context.origin, let allowed = cors.allowedOrigin(origin),
            !response.headers.contains("access-control-allow-origin")
        {
            response.headers.append(name: "Access-Control-Allow-Origin", value: allowed)
            response.headers.append(name: "Access-Control-Expose-Headers", value: CORSPolicy.exposedHeaders)
            if allowed != "*" { response.headers.append(name: "Vary", value: "Origin") }
        }
        observe(response.status.code, context: context)
    }

    /// One observation per request: metrics and the access log.
    private func observe(_ status: Int, context: Context) {
        let elapsed = monotonicNanoseconds() &- context.started
        let metrics = context.endpoint?.metrics ?? (context.method == .options ? preflight : unmatched)
        metrics.record(method: context.method, status: status, nanoseconds: elapsed)
        accessLog?.record(
            AccessLog.Entry(
                method: context.method.rawValue, path: context.path, status: status, nanoseconds: elapsed,
                requestID: context.requestID, userID: context.userID, client: context.client))
    }

    public func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse {
        let requestID = requestIDs.next()
        var response = APIError(status: error.status, code: error.code, message: error.message).response(for: .native)
        response.headers.append(name: "X-Request-Id", value: requestID)
        logger.info(
            "rejected request",
            metadata: ["status": "\(error.status)", "code": "\(error.code)", "request_id": "\(requestID)"])
        return response
    }

    public func refuseConnection() -> HTTPResponse {
        var response = APIError(
            status: 503, code: "server_busy", message: "Too many connections; try again later.", retryAfter: 1
        ).response(for: .native)
        response.headers.append(name: "X-Request-Id", value: requestIDs.next())
        return response
    }

    /// An answer the output buffers cannot hold now (all unread answers, or this caller's
    /// large ones, hold as much as they may): `503 server_busy` in the route's shape, the same
    /// answer for both.
    public func refuseAnswer(context: Context, over limit: BudgetLimit) -> HTTPResponse {
        switch limit {
        case .total: answersRefused.increment()
        case .perClient: answersRefusedPerClient.increment()
        }
        return APIError.outputBusy.response(for: context.endpoint?.family ?? Self.family(of: context.path))
    }

    /// A body the server cannot hold now (all bodies being read, or this caller's, hold as
    /// much as they may): `503 server_busy` in the route's shape, the same answer for both.
    public func refuseBody(context: Context, over limit: BudgetLimit) -> HTTPResponse {
        switch limit {
        case .total: bodiesRefused.increment()
        case .perClient: bodiesRefusedPerClient.increment()
        }
        return APIError.inputBusy.response(for: context.endpoint?.family ?? Self.family(of: context.path))
    }

    /// A signed-in caller's large bodies and large answers count against their account's
    /// share of the input and output budgets (every session and device of theirs together,
    /// whatever their addresses); a request without a verified token, against its client
    /// address's.
    public func shareKey(context: Context) -> ShareKey? {
        context.claims.map { .account($0.userID) }
    }

    public func loopWillWait() -> Int32? {
        accessLog?.loopWillWait()
    }

    public func loopDidStop() {
        accessLog?.loopDidStop()
    }

    /// The family of a path, for answers given before a route is known.
    static func family(of path: String) -> APIFamily {
        if path.hasPrefix("/auth/v1/") { return .auth }
        if path.hasPrefix("/rest/v1/") { return .rest }
        return .native
    }
}

func monotonicNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

/// Request ids: a random per-process prefix and a counter (unique, cheap, unguessable
/// enough to correlate logs without revealing request counts across restarts).
///
/// Each event loop counts in a cell of its own (`LoopSlot`: no cache line shared between
/// loops on a request's path): slot `s` of `n` hands out `s + 1`, `s + 1 + n`, … so no two
/// slots give the same number.
final class RequestIDGenerator: @unchecked Sendable {  // the cells are only touched atomically
    /// Six lowercase hex digits.
    private let prefix: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8)
    private let cells: UnsafeMutablePointer<UInt64>
    private static let stride = 8  // one cache line per slot

    /// Six random hex digits: with a dash and up to eight digits of counter, an id fits
    /// Swift's 15-byte small-string form and costs no allocation.
    init() {
        var random = UInt32.random(in: 0..<(1 << 24))
        var digits = [UInt8](repeating: 0, count: 6)
        for index in (0..<6).reversed() {
            digits[index] = Self.hexDigit(Int(random & 0xF))
            random >>= 4
        }
        prefix = (digits[0], digits[1], digits[2], digits[3], digits[4], digits[5])
        cells = UnsafeMutableRawPointer.allocate(byteCount: Self.stride * 8 * LoopSlot.count, alignment: 64)
            .bindMemory(to: UInt64.self, capacity: Self.stride * LoopSlot.count)
        cells.initialize(repeating: 0, count: Self.stride * LoopSlot.count)
    }

    deinit { UnsafeMutableRawPointer(cells).deallocate() }

    func next() -> String {
        let slot = LoopSlot.current
        let count = csystem_atomic_fetch_add(cells + slot * Self.stride, 1)
        return Self.format(prefix: prefix, count &* UInt64(LoopSlot.count) &+ UInt64(slot) &+ 1)
    }

    /// `prefix-<value in lowercase hex>`.
    static func format(prefix: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8), _ value: UInt64) -> String {
        let digits = max(1, (UInt64.bitWidth - value.leadingZeroBitCount + 3) / 4)
        return String(unsafeUninitializedCapacity: 7 + digits) { buffer in
            buffer[0] = prefix.0
            buffer[1] = prefix.1
            buffer[2] = prefix.2
            buffer[3] = prefix.3
            buffer[4] = prefix.4
            buffer[5] = prefix.5
            buffer[6] = UInt8(ascii: "-")
            var rest = value
            for index in (7..<(7 + digits)).reversed() {
                buffer[index] = hexDigit(Int(rest & 0xF))
                rest >>= 4
            }
            return 7 + digits
        }
    }

    private static func hexDigit(_ value: Int) -> UInt8 {
        value < 10 ? UInt8(ascii: "0") + UInt8(value) : UInt8(ascii: "a") + UInt8(value - 10)
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
