/// A complete request as handlers see it: head, whole body, and what the server added
/// (request id, client address, route parameters).
public struct HTTPRequest: Sendable {
    /// The method.
    public var method: HTTPMethod
    /// The path, still percent-encoded (route parameters are decoded).
    public var path: String
    /// The raw query string (after `?`), if any.
    public var query: String?
    /// The request's header fields.
    public var headers: HTTPHeaders
    /// The whole body (at most the server's body limit).
    public var body: [UInt8]
    /// The `X-Request-Id` the client sent (if well-formed) or one the server generated.
    public var requestID: String
    /// The client's IP address as text: the peer's, or, when the peer is a trusted proxy, the
    /// address it forwarded in `X-Forwarded-For` (see `TrustedProxies`). Use this wherever a
    /// request is attributed to a client (rate limits, sessions, logs).
    public var remoteAddress: String
    /// Parameters captured by the route pattern (`/users/:id` → `id`), percent-decoded.
    public var parameters: [String: String] = [:]
    /// Whether the client reached a trusted proxy over HTTPS: the peer is a trusted proxy
    /// and its `X-Forwarded-Proto` says `https`. False for any other peer, whatever it sends
    /// (the server itself speaks plain HTTP).
    public var forwardedHTTPS = false

    /// A request from its parts.
    public init(
        method: HTTPMethod, path: String, query: String? = nil, headers: HTTPHeaders = [:], body: [UInt8] = [],
        requestID: String = "", remoteAddress: String = ""
    ) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.requestID = requestID
        self.remoteAddress = remoteAddress
    }

    /// A request from a parsed head and its body, moving what it holds.
    init(head: consuming HTTPRequestHead, body: consuming [UInt8], remoteAddress: String) {
        method = head.method
        path = head.path
        query = head.query
        headers = head.headers
        self.body = body
        requestID = ""
        self.remoteAddress = remoteAddress
    }

    /// The query's name/value pairs in order, form-decoded (`+` is a space, `%XX` a byte).
    /// A pair that is not valid UTF-8 after decoding is kept with replacement characters.
    public var queryItems: [(name: String, value: String)] { QueryString.parse(query ?? "") }

    /// The first value of a query parameter.
    public func queryValue(_ name: String) -> String? {
        queryItems.first { $0.name == name }?.value
    }
}

/// Form-style query string decoding.
public enum QueryString {
    /// Splits `a=1&b=x+y` into decoded pairs; empty segments are skipped.
    public static func parse(_ query: String) -> [(name: String, value: String)] {
        var items: [(String, String)] = []
        for part in query.utf8.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: true) {
            if let equals = part.firstIndex(of: UInt8(ascii: "=")) {
                items.append((decode(part[..<equals]), decode(part[part.index(after: equals)...])))
            } else {
                items.append((decode(part[...]), ""))
            }
        }
        return items
    }

    /// Decodes `+` and `%XX`; a malformed escape is kept as it is.
    public static func decode(_ bytes: Substring.UTF8View.SubSequence) -> String {
        // The usual name or value (`after=99999`) has neither: made straight from the bytes,
        // without the array the decoding needs.
        guard bytes.contains(where: { $0 == UInt8(ascii: "%") || $0 == UInt8(ascii: "+") }) else {
            return String(decoding: bytes, as: UTF8.self)
        }
        return percentDecode(Array(bytes), plusAsSpace: true)
    }

    /// Decodes `%XX` (and `+` when `plusAsSpace`); malformed escapes stay as they are.
    public static func percentDecode(_ bytes: [UInt8], plusAsSpace: Bool) -> String {
        guard bytes.contains(UInt8(ascii: "%")) || (plusAsSpace && bytes.contains(UInt8(ascii: "+"))) else {
            return String(decoding: bytes, as: UTF8.self)
        }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "+"), plusAsSpace {
                out.append(UInt8(ascii: " "))
            } else if byte == UInt8(ascii: "%"), index + 2 < bytes.count,
                let high = hexValue(bytes[index + 1]), let low = hexValue(bytes[index + 2])
            {
                out.append(high << 4 | low)
                index += 2
            } else {
                out.append(byte)
            }
            index += 1
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}
