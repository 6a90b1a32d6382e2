/// A response status code with its reason phrase.
public struct HTTPStatus: Hashable, Sendable, ExpressibleByIntegerLiteral, CustomStringConvertible {
    /// The numeric code.
    public let code: Int

    /// A status from its code.
    public init(_ code: Int) { self.code = code }
    /// A status from an integer literal.
    public init(integerLiteral code: Int) { self.code = code }

    /// The standard reason phrase.
    public var reason: String {
        switch code {
        case 100: return "Continue"
        case 101: return "Switching Protocols"
        case 200: return "OK"
        case 201: return "Created"
        case 204: return "No Content"
        case 206: return "Partial Content"
        case 301: return "Moved Permanently"
        case 304: return "Not Modified"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 406: return "Not Acceptable"
        case 408: return "Request Timeout"
        case 409: return "Conflict"
        case 411: return "Length Required"
        case 413: return "Content Too Large"
        case 414: return "URI Too Long"
        case 415: return "Unsupported Media Type"
        case 421: return "Misdirected Request"
        case 422: return "Unprocessable Content"
        case 426: return "Upgrade Required"
        case 429: return "Too Many Requests"
        case 431: return "Request Header Fields Too Large"
        case 500: return "Internal Server Error"
        case 501: return "Not Implemented"
        case 502: return "Bad Gateway"
        case 503: return "Service Unavailable"
        case 504: return "Gateway Timeout"
        case 505: return "HTTP Version Not Supported"
        default: return "Status \(code)"
        }
    }

    /// `200 OK`.
    public var description: String { "\(code) \(reason)" }

    /// Appends `HTTP/1.1 <code> <reason>\r\n`; the usual lines come prebuilt.
    static func appendStatusLine(_ code: Int, to output: inout [UInt8]) {
        switch code {
        case 200: output.append(contentsOf: "HTTP/1.1 200 OK\r\n" as StaticString)
        case 204: output.append(contentsOf: "HTTP/1.1 204 No Content\r\n" as StaticString)
        default: output.append(contentsOf: "HTTP/1.1 \(code) \(HTTPStatus(code).reason)\r\n".utf8)
        }
    }

    public static let ok: HTTPStatus = 200
    public static let created: HTTPStatus = 201
    public static let noContent: HTTPStatus = 204
    public static let badRequest: HTTPStatus = 400
    public static let unauthorized: HTTPStatus = 401
    public static let forbidden: HTTPStatus = 403
    public static let notFound: HTTPStatus = 404
    public static let methodNotAllowed: HTTPStatus = 405
    public static let contentTooLarge: HTTPStatus = 413
    public static let tooManyRequests: HTTPStatus = 429
    public static let internalServerError: HTTPStatus = 500
    public static let serviceUnavailable: HTTPStatus = 503
}

/// What a handler answers. The server adds `Content-Length` (or `Transfer-Encoding:
/// chunked` for a streamed body), `Date`, `Server` and `Connection`; the application's
/// pipeline adds `X-Request-Id` and CORS headers.
public struct HTTPResponse: Sendable {
    /// The status.
    public var status: HTTPStatus
    /// Header fields set by the handler.
    public var headers: HTTPHeaders
    /// The body (not sent for `HEAD` and 1xx/204/304, but still counted in `Content-Length`
    /// for `HEAD`).
    public var body: [UInt8]
    /// Close the connection after this response.
    public var closeConnection = false
    /// A body produced over time instead of `body` (see `HTTPBodyStream`).
    public var stream: HTTPBodyStream? = nil
    /// With status `101`: the connection becomes a WebSocket (see `HTTPResponse.webSocket`).
    public var webSocket: WebSocketUpgrade? = nil

    /// A response from its parts.
    public init(status: HTTPStatus, headers: HTTPHeaders = [:], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A JSON response from already encoded UTF-8 bytes.
    public static func json(_ status: HTTPStatus, _ body: [UInt8], headers: HTTPHeaders = [:]) -> HTTPResponse {
        var all = headers
        all.reserveCapacity(all.count + 4)  // room for what the pipeline adds (request id, CORS)
        all.append(name: "Content-Type", value: "application/json; charset=utf-8")
        return HTTPResponse(status: status, headers: all, body: body)
    }

    /// A response whose body `produce` writes over time, sent as it comes (chunked, or
    /// close-delimited to an HTTP/1.0 client). See `HTTPBodyStream` and `HTTPBodyWriter`.
    public static func streamed(
        _ status: HTTPStatus, headers: HTTPHeaders = [:], bufferLimit: Int = 64 * 1024,
        shutdown: HTTPBodyStream.Shutdown = .finish, _ produce: @escaping @Sendable (HTTPBodyWriter) async -> Void
    ) -> HTTPResponse {
        var response = HTTPResponse(status: status, headers: headers)
        response.stream = HTTPBodyStream(bufferLimit: bufferLimit, shutdown: shutdown, produce: produce)
        return response
    }

    /// A JSON response from a string of JSON.
    public static func json(_ status: HTTPStatus, _ text: String, headers: HTTPHeaders = [:]) -> HTTPResponse {
        json(status, Array(text.utf8), headers: headers)
    }
}

/// Minimal JSON string quoting for server-generated bodies.
public enum JSONText {
    /// `text` as a JSON string literal.
    public static func quote(_ text: String) -> String {
        var out = "\""
        out.reserveCapacity(text.utf8.count + 2)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
        return out
    }
}
