import HTTPServer

/// An error in PostgREST's shape: `{"code","message","details","hint"}` and the header
/// `Proxy-Status: PostgREST; error=<code>`.
public struct RESTError: Error, HTTPResponseError, CustomStringConvertible {
    public var status: Int
    public var code: String
    public var message: String
    public var details: String? = nil
    public var hint: String? = nil

    public var description: String { "\(status) \(code): \(message)" }

    public var response: HTTPResponse {
        var writer = JSONWriter(capacity: 160)
        writer.beginObject()
        writer.string("code", code)
        writer.string("details", details)
        writer.string("hint", hint)
        writer.string("message", message)
        writer.endObject()
        var headers: HTTPHeaders = ["Proxy-Status": "PostgREST; error=\(code)"]
        if status == 503 { headers.append(name: "Retry-After", value: "1") }
        return .json(HTTPStatus(status), writer.bytes, headers: headers)
    }

    static func parse(_ message: String, details: String? = nil) -> RESTError {
        RESTError(status: 400, code: "PGRST100", message: message, details: details)
    }

    static func unknownColumn(_ column: String, in table: String) -> RESTError {
        RESTError(status: 400, code: "42703", message: "column \(table).\(column) does not exist")
    }

    static func badValue(_ value: String, type: String) -> RESTError {
        RESTError(status: 400, code: "22P02", message: "invalid input syntax for type \(type): \"\(value.prefix(100))\"")
    }

    static let jwt = RESTError(status: 401, code: "PGRST301", message: "JWT could not be verified", hint: nil)
    static let apiKey = RESTError(status: 401, code: "PGRST301", message: "Invalid API key")
    static let foreignUser = RESTError(
        status: 403, code: "42501", message: "new row violates row-level security policy for table \"events\"")
    static let busy = RESTError(status: 503, code: "PGRST000", message: "The database is busy; retry shortly")

    static func singular(_ count: Int) -> RESTError {
        RESTError(
            status: 406, code: "PGRST116", message: "JSON object requested, multiple (or no) rows returned",
            details: "The result contains \(count) rows")
    }
}
