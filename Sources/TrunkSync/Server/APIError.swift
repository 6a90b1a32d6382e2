import HTTPServer
import Postgres

/// An error of the native API: `{"code", "message", "details"?, "hint"?}` with its status.
public struct APIError: Error, HTTPResponseError, CustomStringConvertible {
    public var status: Int
    public var code: String
    public var message: String
    /// Already encoded JSON for `details`, if any.
    public var details: [UInt8]? = nil
    public var hint: String? = nil
    public var retryAfter: Int? = nil

    public var description: String { "\(status) \(code): \(message)" }

    public var response: HTTPResponse {
        var writer = JSONWriter(capacity: 128 + (details?.count ?? 0))
        writer.beginObject()
        writer.string("code", code)
        writer.string("message", message)
        if let details { writer.raw("details", details) }
        if let hint { writer.string("hint", hint) }
        writer.endObject()
        var headers: HTTPHeaders = [:]
        if let retryAfter { headers.append(name: "Retry-After", value: String(retryAfter)) }
        return .json(HTTPStatus(status), writer.bytes, headers: headers)
    }

    static func badRequest(_ code: String, _ message: String, details: [UInt8]? = nil) -> APIError {
        APIError(status: 400, code: code, message: message, details: details)
    }

    static let unauthorized = APIError(
        status: 401, code: "unauthorized", message: "A valid bearer access token is required.")
    static let busy = APIError(
        status: 503, code: "database_busy", message: "The database is busy; retry shortly.", retryAfter: 1)
    static let unavailable = APIError(
        status: 503, code: "database_unavailable", message: "The database is not reachable; retry shortly.",
        retryAfter: 5)
}

extension PostgresError {
    /// The `503` a client should see for pool exhaustion and lost connections, else nil.
    var asServiceUnavailable: APIError? {
        switch kind {
        case .poolExhausted: return .busy
        case .connectionFailed, .connectionClosed, .poolClosed: return .unavailable
        default: return nil
        }
    }
}
