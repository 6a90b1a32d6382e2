/// An HTTP request method such as `GET` or `POST` (case-sensitive, as on the wire).
public struct HTTPMethod: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The method name exactly as sent. Methods produced by the parser are always
    /// non-empty tokens (RFC 9110 `tchar`s).
    public let rawValue: String

    /// Wraps a method name without checking it; the parser only produces valid tokens.
    public init(rawValue: String) {
        self.rawValue = rawValue
    }

    /// `GET`
    public static let get = HTTPMethod(rawValue: "GET")
    /// `HEAD`
    public static let head = HTTPMethod(rawValue: "HEAD")
    /// `POST`
    public static let post = HTTPMethod(rawValue: "POST")
    /// `PUT`
    public static let put = HTTPMethod(rawValue: "PUT")
    /// `DELETE`
    public static let delete = HTTPMethod(rawValue: "DELETE")
    /// `PATCH`
    public static let patch = HTTPMethod(rawValue: "PATCH")
    /// `OPTIONS`
    public static let options = HTTPMethod(rawValue: "OPTIONS")
    /// `TRACE`
    public static let trace = HTTPMethod(rawValue: "TRACE")
    /// `CONNECT`
    public static let connect = HTTPMethod(rawValue: "CONNECT")

    /// The method name.
    public var description: String { rawValue }
}

/// An HTTP protocol version. The parser accepts only 1.0 and 1.1.
public struct HTTPVersion: Hashable, Sendable, CustomStringConvertible {
    /// The major version digit.
    public var major: Int
    /// The minor version digit.
    public var minor: Int

    /// Creates a version from its two digits.
    public init(major: Int, minor: Int) {
        self.major = major
        self.minor = minor
    }

    /// `HTTP/1.0`
    public static let http10 = HTTPVersion(major: 1, minor: 0)
    /// `HTTP/1.1`
    public static let http11 = HTTPVersion(major: 1, minor: 1)

    /// The version as written on the wire, e.g. `HTTP/1.1`.
    public var description: String { "HTTP/\(major).\(minor)" }
}

/// Header fields in the order received, with case-insensitive lookup by name.
///
/// Names keep their original spelling; values are stored without leading or trailing
/// whitespace. Repeated fields stay separate entries.
public struct HTTPHeaders: RandomAccessCollection, Hashable, Sendable, ExpressibleByDictionaryLiteral {
    /// One header field line.
    public struct Field: Hashable, Sendable {
        /// The field name as sent (a token; compare it case-insensitively).
        public var name: String
        /// The field value without surrounding whitespace.
        public var value: String

        /// Creates a field.
        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    private var fields: [Field]

    /// Creates an empty header list.
    public init() {
        fields = []
    }

    /// Creates a header list from fields, keeping their order.
    public init(_ fields: [Field]) {
        self.fields = fields
    }

    /// Creates a header list from `name: value` pairs, keeping their order.
    public init(dictionaryLiteral elements: (String, String)...) {
        fields = elements.map { Field(name: $0.0, value: $0.1) }
    }

    /// The position of the first field.
    public var startIndex: Int { fields.startIndex }
    /// The position past the last field.
    public var endIndex: Int { fields.endIndex }
    /// The field at `position`.
    public subscript(position: Int) -> Field { fields[position] }

    /// The value of the first field called `name` (case-insensitive), or `nil`.
    public subscript(name: String) -> String? {
        first(name)
    }

    /// The value of the first field called `name` (case-insensitive), or `nil`.
    public func first(_ name: String) -> String? {
        for field in fields where HTTPHeaders.namesEqual(field.name, name) {
            return field.value
        }
        return nil
    }

    /// The values of every field called `name` (case-insensitive), in order.
    public func values(for name: String) -> [String] {
        fields.filter { HTTPHeaders.namesEqual($0.name, name) }.map(\.value)
    }

    /// Whether at least one field is called `name` (case-insensitive).
    public func contains(_ name: String) -> Bool {
        fields.contains { HTTPHeaders.namesEqual($0.name, name) }
    }

    /// Appends a field after the existing ones.
    public mutating func append(name: String, value: String) {
        fields.append(Field(name: name, value: value))
    }

    /// Reserves room for `count` fields.
    public mutating func reserveCapacity(_ count: Int) {
        fields.reserveCapacity(count)
    }

    /// ASCII case-insensitive comparison of two field names.
    static func namesEqual(_ lhs: String, _ rhs: String) -> Bool {
        guard lhs.utf8.count == rhs.utf8.count else { return false }
        var left = lhs.utf8.makeIterator()
        var right = rhs.utf8.makeIterator()
        while true {
            switch (left.next(), right.next()) {
            case (nil, nil):
                return true
            case (let a?, let b?):
                if a != b && asciiLowercased(a) != asciiLowercased(b) { return false }
            default:
                return false
            }
        }
    }

    @inline(__always)
    static func asciiLowercased(_ byte: UInt8) -> UInt8 {
        byte &- 0x41 < 26 ? byte | 0x20 : byte
    }
}

/// The head of a parsed request: request line, header fields and what the parser
/// derived from them (framing, keep-alive, `Expect: 100-continue`).
///
/// Immutable, and one reference: the loop hands a head from the parser to the application
/// and on to the request without copying its fields (each a reference count) every time.
public struct HTTPRequestHead: Hashable, Sendable {
    /// How the request body is delimited.
    public enum BodyFraming: Hashable, Sendable {
        /// Neither `Content-Length` nor `Transfer-Encoding`: the request has no body.
        case empty
        /// `Content-Length` with this many bytes (possibly 0).
        case contentLength(Int)
        /// `Transfer-Encoding: chunked`.
        case chunked
    }

    private final class Storage: Sendable {
        let method: HTTPMethod
        let target: String
        let path: String
        let query: String?
        let version: HTTPVersion
        let headers: HTTPHeaders
        let keepAlive: Bool
        let expectsContinue: Bool
        let bodyFraming: BodyFraming

        init(
            method: HTTPMethod, target: String, path: String, query: String?, version: HTTPVersion,
            headers: HTTPHeaders, keepAlive: Bool, expectsContinue: Bool, bodyFraming: BodyFraming
        ) {
            self.method = method
            self.target = target
            self.path = path
            self.query = query
            self.version = version
            self.headers = headers
            self.keepAlive = keepAlive
            self.expectsContinue = expectsContinue
            self.bodyFraming = bodyFraming
        }
    }

    private let storage: Storage

    /// The request method.
    public var method: HTTPMethod { storage.method }
    /// The request target exactly as sent (origin-form `/p?q`, `*`, or absolute-form URL).
    public var target: String { storage.target }
    /// The path part of the target, not percent-decoded: `/p` for `/p?q`, `*` for the
    /// asterisk-form, and the path of an absolute-form URL (`/` when it has none).
    public var path: String { storage.path }
    /// The raw query string after the first `?` (without it, not decoded), or `nil` when the
    /// target has no `?`.
    public var query: String? { storage.query }
    /// The protocol version (1.0 or 1.1).
    public var version: HTTPVersion { storage.version }
    /// The header fields in received order.
    public var headers: HTTPHeaders { storage.headers }
    /// Whether the connection may carry another request after this one: HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive` (and no `close`).
    public var keepAlive: Bool { storage.keepAlive }
    /// Whether an HTTP/1.1 client sent `Expect: 100-continue` for a request that has a body:
    /// the server should answer `100 Continue` (or a final status) before the body arrives.
    /// Always `false` for HTTP/1.0 (RFC 9110 §10.1.1) and for requests without a body.
    public var expectsContinue: Bool { storage.expectsContinue }
    /// How the body is delimited.
    public var bodyFraming: BodyFraming { storage.bodyFraming }

    /// Creates a request head.
    public init(
        method: HTTPMethod,
        target: String,
        path: String,
        query: String?,
        version: HTTPVersion,
        headers: HTTPHeaders,
        keepAlive: Bool,
        expectsContinue: Bool,
        bodyFraming: BodyFraming
    ) {
        storage = Storage(
            method: method, target: target, path: path, query: query, version: version, headers: headers,
            keepAlive: keepAlive, expectsContinue: expectsContinue, bodyFraming: bodyFraming)
    }

    /// Whether body bytes follow the head (chunked, or a non-zero `Content-Length`).
    public var hasBody: Bool { Self.hasBody(bodyFraming) }

    /// Whether a body framed so has bytes.
    static func hasBody(_ framing: BodyFraming) -> Bool {
        switch framing {
        case .empty: false
        case .contentLength(let length): length > 0
        case .chunked: true
        }
    }

    /// Whether two heads have the same fields (the same object, or equal field by field).
    public static func == (lhs: HTTPRequestHead, rhs: HTTPRequestHead) -> Bool {
        lhs.storage === rhs.storage
            || (lhs.method == rhs.method && lhs.target == rhs.target && lhs.path == rhs.path && lhs.query == rhs.query
                && lhs.version == rhs.version && lhs.headers == rhs.headers && lhs.keepAlive == rhs.keepAlive
                && lhs.expectsContinue == rhs.expectsContinue && lhs.bodyFraming == rhs.bodyFraming)
    }

    /// Hashes every field, consistently with `==`.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(method)
        hasher.combine(target)
        hasher.combine(path)
        hasher.combine(query)
        hasher.combine(version)
        hasher.combine(headers)
        hasher.combine(keepAlive)
        hasher.combine(expectsContinue)
        hasher.combine(bodyFraming)
    }
}
