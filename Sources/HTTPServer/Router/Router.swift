/// Maps method + path patterns to values of the application's choosing (its endpoints).
/// Patterns are literal segments and `:name` parameters (`/rest/v1/:table`); among the
/// routes matching a path, the first added wins.
public struct Router<Endpoint: Sendable>: Sendable {
    struct Route: Sendable {
        let method: HTTPMethod
        let pattern: String
        let segments: [Segment]
        let endpoint: Endpoint
    }

    enum Segment: Sendable, Equatable {
        case literal(String)
        case parameter(String)

        var isParameter: Bool { if case .parameter = self { true } else { false } }
    }

    /// The result of matching a request line.
    public enum Match: Sendable {
        /// The endpoint, the decoded parameters and the route pattern (for bounded metric labels).
        case found(Endpoint, parameters: [String: String], pattern: String)
        /// The path exists with other methods (for `405` and its `Allow` header).
        case methodNotAllowed(allowed: [String])
        case notFound
    }

    private var routes: [Route] = []
    /// Route indexes of the patterns without parameters, by path: most requests are found
    /// with one hash look-up and no splitting.
    private var literal: [String: [Int]] = [:]

    /// An empty router.
    public init() {}

    /// Adds a route.
    public mutating func add(_ method: HTTPMethod, _ pattern: String, _ endpoint: Endpoint) {
        let segments = Self.parse(pattern)
        let parts = pattern.split(separator: "/", omittingEmptySubsequences: true)
        // A literal route goes into the fast map unless an earlier route with parameters
        // matches its path too (that one must keep winning).
        let shadowed = routes.contains {
            $0.segments.contains(where: \.isParameter) && Self.bind($0.segments, to: parts) != nil
        }
        routes.append(Route(method: method, pattern: pattern, segments: segments, endpoint: endpoint))
        if !segments.contains(where: \.isParameter), !shadowed {
            literal["/" + parts.joined(separator: "/"), default: []].append(routes.count - 1)
        }
    }

    /// Every route as (method, pattern), in order.
    public var patterns: [(method: HTTPMethod, pattern: String)] { routes.map { ($0.method, $0.pattern) } }

    /// Every route as (method, pattern, endpoint), in order.
    public var entries: [(method: HTTPMethod, pattern: String, endpoint: Endpoint)] {
        routes.map { ($0.method, $0.pattern, $0.endpoint) }
    }

    static func parse(_ pattern: String) -> [Segment] {
        pattern.split(separator: "/", omittingEmptySubsequences: true).map { part in
            part.hasPrefix(":") ? .parameter(String(part.dropFirst())) : .literal(String(part))
        }
    }

    /// Finds the route for `method` and `path`. `HEAD` falls back to `GET`.
    public func match(method: HTTPMethod, path: String) -> Match {
        if let indexes = literal[path] {
            for index in indexes where routes[index].method == method {
                return .found(routes[index].endpoint, parameters: [:], pattern: routes[index].pattern)
            }
        }
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        var allowed: [String] = []
        var fallback: (Endpoint, [String: String], String)? = nil
        for route in routes {
            guard let parameters = Self.bind(route.segments, to: parts) else { continue }
            if route.method == method { return .found(route.endpoint, parameters: parameters, pattern: route.pattern) }
            if method == .head, route.method == .get, fallback == nil {
                fallback = (route.endpoint, parameters, route.pattern)
            }
            if !allowed.contains(route.method.rawValue) { allowed.append(route.method.rawValue) }
        }
        if let fallback { return .found(fallback.0, parameters: fallback.1, pattern: fallback.2) }
        if allowed.isEmpty { return .notFound }
        if allowed.contains("GET"), !allowed.contains("HEAD") { allowed.append("HEAD") }
        allowed.append("OPTIONS")
        return .methodNotAllowed(allowed: allowed)
    }

    /// The methods a path accepts (for `OPTIONS` and `405`), empty when no route matches.
    public func allowedMethods(path: String) -> [String] {
        if case .methodNotAllowed(let allowed) = match(method: HTTPMethod(rawValue: "\u{0}"), path: path) {
            return allowed
        }
        return []
    }

    private static func bind(_ segments: [Segment], to parts: [Substring]) -> [String: String]? {
        guard segments.count == parts.count else { return nil }
        var parameters: [String: String] = [:]
        for (segment, part) in zip(segments, parts) {
            switch segment {
            case .literal(let text): if text != part { return nil }
            case .parameter(let name):
                parameters[name] = QueryString.percentDecode(Array(part.utf8), plusAsSpace: false)
            }
        }
        return parameters
    }
}
