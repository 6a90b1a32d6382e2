import HTTPServer
import JSON
import Postgres

/// The API a route belongs to. Every error is one `APIError`; the family decides the shape
/// it is rendered in, so the same failure reads right to each kind of client.
public enum APIFamily: Sendable {
    /// `/sync/v1`, operations, unknown paths: `{"code", "message", "details"?, "hint"?}`.
    case native
    /// `/auth/v1` (Supabase Auth): `{"code", "error_code", "message", "msg"}` and
    /// `X-Supabase-Api-Version`.
    case auth
    /// `/rest/v1` (PostgREST): `{"code", "details", "hint", "message"}` and `Proxy-Status`.
    case rest
}

/// The one error type of every route: a status, a stable code, a message for people (never
/// a secret), optional details and hint, and `Retry-After` for `429` and `503`. Anything
/// else a handler throws becomes a bare `500` that reveals nothing.
public struct APIError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Details: Sendable, Equatable {
        /// Already encoded JSON (`[{"index": 0, "field": …}]`).
        case json([UInt8])
        /// A sentence (PostgREST's `details` is a string).
        case text(String)
    }

    public var status: Int
    public var code: String
    public var message: String
    public var details: Details? = nil
    public var hint: String? = nil
    /// Seconds to wait (`Retry-After`).
    public var retryAfter: Int? = nil

    public init(
        status: Int, code: String, message: String, details: Details? = nil, hint: String? = nil, retryAfter: Int? = nil
    ) {
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.hint = hint
        self.retryAfter = retryAfter
    }

    public var description: String { "\(status) \(code): \(message)" }

    /// The response in `family`'s shape.
    public func response(for family: APIFamily) -> HTTPResponse {
        var writer = JSONWriter(capacity: 160)
        var headers: HTTPHeaders = [:]
        writer.beginObject()
        switch family {
        case .native:
            writer.string("code", code)
            writer.string("message", message)
            switch details {
            case .json(let bytes): writer.raw("details", bytes)
            case .text(let text): writer.string("details", text)
            case nil: break
            }
            if let hint { writer.string("hint", hint) }
        case .auth:
            writer.string("code", code)
            writer.string("error_code", code)
            writer.string("message", message)
            writer.string("msg", message)
            headers.append(name: "X-Supabase-Api-Version", value: AuthRoutes.apiVersion)
        case .rest:
            let restCode = Self.postgrestCodes[code] ?? code
            writer.string("code", restCode)
            switch details {
            case .json(let bytes): writer.raw("details", bytes)
            case .text(let text): writer.string("details", text)
            case nil: writer.null("details")
            }
            writer.string("hint", hint)
            writer.string("message", message)
            headers.append(name: "Proxy-Status", value: "PostgREST; error=\(restCode)")
        }
        writer.endObject()
        if let retryAfter { headers.append(name: "Retry-After", value: String(retryAfter)) }
        return .json(HTTPStatus(status), writer.bytes, headers: headers)
    }

    /// PostgREST's own codes for the failures every family shares.
    private static let postgrestCodes = [
        "database_busy": "PGRST003", "database_unavailable": "PGRST000", "not_found": "PGRST125",
        "body_too_large": "PGRST413",
    ]

    // MARK: - Shared by every family

    static func badRequest(_ code: String, _ message: String, details: [UInt8]? = nil) -> APIError {
        APIError(status: 400, code: code, message: message, details: details.map { .json($0) })
    }

    /// Every connection of the pool is busy and none came free in time.
    public static let databaseBusy = APIError(
        status: 503, code: "database_busy", message: "The database is busy; retry shortly.", retryAfter: 1)
    /// The server's output buffers hold as many answers clients have not read as they may
    /// (`TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT`): a large answer is refused instead of queued.
    public static let outputBusy = APIError(
        status: 503, code: "server_busy", message: "The server is busy sending other answers; try again shortly.",
        retryAfter: 1)
    /// The request bodies being read hold as much as they may
    /// (`TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT`): a large body is refused instead of read.
    public static let inputBusy = APIError(
        status: 503, code: "server_busy", message: "The server is busy receiving other requests; try again shortly.",
        retryAfter: 1)
    /// The database cannot be reached, or a connection was lost mid-request.
    public static let databaseUnavailable = APIError(
        status: 503, code: "database_unavailable", message: "The database is not reachable; retry shortly.",
        retryAfter: 5)

    /// The one mapping of database failures a client can retry: pool exhausted → busy;
    /// connection failed or lost, pool closed → unavailable. Others are not the client's
    /// business (nil: a `500`).
    public static func serviceUnavailable(_ error: PostgresError) -> APIError? {
        switch error.kind {
        case .poolExhausted: return .databaseBusy
        case .connectionFailed, .connectionClosed, .poolClosed: return .databaseUnavailable
        default: return nil
        }
    }

    static func notFound() -> APIError { APIError(status: 404, code: "not_found", message: "Not found.") }

    static func methodNotAllowed(_ method: HTTPMethod) -> APIError {
        APIError(status: 405, code: "method_not_allowed", message: "Method \(method) is not allowed here.")
    }

    static func bodyTooLarge(limit: Int) -> APIError {
        APIError(
            status: 413, code: "body_too_large",
            message: "The request body is larger than this route accepts (\(limit) bytes).")
    }

    static let internalError = APIError(status: 500, code: "internal_error", message: "Internal server error.")
}

// MARK: - Native API

extension APIError {
    static let unauthorized = APIError(
        status: 401, code: "unauthorized", message: "A valid bearer access token is required.")
}
