/// Maps method + path patterns to handlers. Patterns are literal segments and `:name`
/// parameters (`/rest/v1/:table`); the first matching route wins.
public struct Router: Sendable {
    /// A handler that may suspend (database work, long-polls).
    public typealias Handler = @Sendable (HTTPRequest) async throws -> HTTPResponse
    /// A handler cheap enough to run on the event loop itself (no I/O, no locks held long).
    public typealias InlineHandler = @Sendable (HTTPRequest) -> HTTPResponse

    enum Action: Sendable {
        case async(Handler)
        case inline(InlineHandler)
    }

    struct Route: Sendable {
        let method: HTTPMethod
        let pattern: String
        let segments: [Segment]
        let action: Action
    }

    enum Segment: Sendable, Equatable {
        case literal(String)
        case parameter(String)
    }

    enum Match {
        case found(Action, [String: String], route: String)
        case methodNotAllowed(allowed: [String])
        case notFound
    }

    private var routes: [Route] = []

    /// An empty router.
    public init() {}

    /// Adds a route whose handler runs as a task.
    public mutating func add(_ method: HTTPMethod, _ pattern: String, _ handler: @escaping Handler) {
        routes.append(Route(method: method, pattern: pattern, segments: Self.parse(pattern), action: .async(handler)))
    }

    /// Adds a route whose handler runs inline on the event loop (for trivial answers such as
    /// `/healthz`).
    public mutating func addInline(_ method: HTTPMethod, _ pattern: String, _ handler: @escaping InlineHandler) {
        routes.append(Route(method: method, pattern: pattern, segments: Self.parse(pattern), action: .inline(handler)))
    }

    static func parse(_ pattern: String) -> [Segment] {
        pattern.split(separator: "/", omittingEmptySubsequences: true).map { part in
            part.hasPrefix(":") ? .parameter(String(part.dropFirst())) : .literal(String(part))
        }
    }

    /// Finds the route for `method` and `path`. `HEAD` falls back to `GET`.
    func match(method: HTTPMethod, path: String) -> Match {
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        var allowed: [String] = []
        var fallback: (Action, [String: String], String)? = nil
        for route in routes {
            guard let parameters = Self.bind(route.segments, to: parts) else { continue }
            if route.method == method { return .found(route.action, parameters, route: route.pattern) }
            if method == .head, route.method == .get, fallback == nil {
                fallback = (route.action, parameters, route.pattern)
            }
            if !allowed.contains(route.method.rawValue) { allowed.append(route.method.rawValue) }
        }
        if let fallback { return .found(fallback.0, fallback.1, route: fallback.2) }
        if allowed.isEmpty { return .notFound }
        if allowed.contains("GET"), !allowed.contains("HEAD") { allowed.append("HEAD") }
        allowed.append("OPTIONS")
        return .methodNotAllowed(allowed: allowed)
    }

    /// The methods a path accepts (for `OPTIONS` and `405`), empty when no route matches.
    func allowedMethods(path: String) -> [String] {
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
