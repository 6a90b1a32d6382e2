import Foundation
import HTTPServer

/// What a route declares about itself, read before its body is: which API it belongs to,
/// how large a body it takes, whether it needs a signed-in caller, and its handler.
public final class Endpoint: Sendable {
    /// How the handler runs and what it is given.
    public enum Handler: Sendable {
        /// Answers on the event loop: no I/O, no waiting (`/healthz`).
        case inline(@Sendable (HTTPRequest) -> HTTPResponse)
        /// Runs as a task; no bearer token needed.
        case open(@Sendable (HTTPRequest) async throws -> HTTPResponse)
        /// Runs as a task once the authentication stage has verified the bearer token.
        case authenticated(@Sendable (HTTPRequest, AccessClaims) async throws -> HTTPResponse)
        /// Always this error, decided from the head (the route's parameters): the body is read
        /// and dropped, never held, so the connection stays usable (`Admission.answerAfterBody`).
        /// For routes that take any body a real route of theirs takes, only to refuse it.
        case refused(@Sendable (_ parameters: [String: String]) -> APIError)
    }

    /// The shape of its errors.
    public let family: APIFamily
    /// The largest body accepted, in bytes; a larger one is refused with `413` from the head.
    public let bodyLimit: Int
    public let handler: Handler
    /// The bearer token may come as the `access_token` query parameter when there is no
    /// `Authorization` header: only for the event stream, since a browser's `EventSource`
    /// cannot send headers. (The access log writes paths without their query.)
    public let acceptsQueryToken: Bool
    /// Its request counts and latencies (shared by the methods of one pattern).
    let metrics: HTTPRouteMetrics

    init(
        family: APIFamily, bodyLimit: Int, acceptsQueryToken: Bool = false, handler: Handler,
        metrics: HTTPRouteMetrics
    ) {
        self.family = family
        self.bodyLimit = bodyLimit
        self.acceptsQueryToken = acceptsQueryToken
        self.handler = handler
        self.metrics = metrics
    }

    /// Body limits of the route kinds.
    public enum BodyLimit {
        /// Routes that read no body: only an empty one (or a few stray bytes) is accepted.
        public static let none = 1024
        /// Sign-in and account requests: a few small fields.
        public static let small = 4 * 1024
    }
}

/// Collects the application's routes, each with its declarations.
public struct Routes: Sendable {
    private(set) var router = Router<Endpoint>()
    let metrics: Metrics

    init(metrics: Metrics) { self.metrics = metrics }

    /// Adds a route of `family` with `bodyLimit` and `handler` (see
    /// `Endpoint.acceptsQueryToken`).
    public mutating func add(
        _ method: HTTPMethod, _ pattern: String, family: APIFamily, bodyLimit: Int = Endpoint.BodyLimit.none,
        acceptsQueryToken: Bool = false, _ handler: Endpoint.Handler
    ) {
        router.add(
            method, pattern,
            Endpoint(
                family: family, bodyLimit: bodyLimit, acceptsQueryToken: acceptsQueryToken, handler: handler,
                metrics: metrics.route(pattern)))
    }

    /// What each route declares, in the order added: for checks that the routes and their
    /// description (`docs/openapi.json`) agree.
    public var declarations:
        [(method: HTTPMethod, pattern: String, family: APIFamily, bodyLimit: Int, authenticated: Bool)]
    {
        router.entries.map { route in
            let authenticated: Bool
            if case .authenticated = route.endpoint.handler { authenticated = true } else { authenticated = false }
            return (route.method, route.pattern, route.endpoint.family, route.endpoint.bodyLimit, authenticated)
        }
    }
}
