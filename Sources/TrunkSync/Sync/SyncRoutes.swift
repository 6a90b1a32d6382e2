import Foundation
import HTTPServer
import Logging
import Postgres

/// The native sync API: `POST /sync/v1/events` (push) and `GET /sync/v1/events` (pull,
/// optionally long-polling).
public struct SyncRoutes: Sendable {
    let store: EventStore
    let notifier: EventNotifier
    let tokens: TokenIssuer
    let metrics: Metrics

    public init(store: EventStore, notifier: EventNotifier, tokens: TokenIssuer, metrics: Metrics = Metrics()) {
        self.metrics = metrics
        self.store = store
        self.notifier = notifier
        self.tokens = tokens
    }

    public func register(in router: inout Router) {
        router.add(.post, "/sync/v1/events") { request in try await push(request) }
        router.add(.get, "/sync/v1/events") { request in try await pull(request) }
    }

    /// The user of the bearer token; `401` otherwise.
    func authenticate(_ request: HTTPRequest) throws -> UUID {
        guard let header = request.headers["authorization"] else { throw APIError.unauthorized }
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { throw APIError.unauthorized }
        do {
            return try tokens.verify(String(parts[1]), now: Int64(Date().timeIntervalSince1970)).userID
        } catch {
            throw APIError.unauthorized
        }
    }

    /// Maps pool exhaustion and lost connections to `503` with `Retry-After`.
    static func database<T>(_ work: () async throws -> T) async throws -> T {
        do {
            return try await work()
        } catch let error as PostgresError {
            if let unavailable = error.asServiceUnavailable { throw unavailable }
            throw error
        }
    }

    func push(_ request: HTTPRequest) async throws -> HTTPResponse {
        let user = try authenticate(request)
        let events: [IncomingEvent]
        switch PushRequest.parse(request.body) {
        case .malformed(let reason):
            throw APIError.badRequest("invalid_json", "The body is not a valid push: \(reason).")
        case .invalid(let problems):
            var details = JSONWriter(capacity: 64 * problems.count)
            details.beginArray()
            for problem in problems {
                details.beginObject()
                details.int("index", Int64(problem.index))
                details.string("field", problem.field)
                details.string("reason", problem.reason)
                details.endObject()
            }
            details.endArray()
            let indexes = Set(problems.map(\.index)).count
            throw APIError.badRequest(
                "validation_failed", "\(indexes) event(s) are invalid; nothing was stored.", details: details.bytes)
        case .events(let parsed):
            events = parsed
        }
        guard let results = try await Self.database({ try await store.push(events, for: user) }) else {
            throw APIError.unauthorized
        }
        var writer = JSONWriter(capacity: 64 * results.count + 64)
        writer.beginObject()
        let created = results.filter(\.created).count
        metrics.increment("trunk_sync_events_pushed_total", by: Double(created))
        metrics.increment("trunk_sync_events_duplicate_total", by: Double(results.count - created))
        writer.int("accepted", Int64(created))
        writer.int("duplicates", Int64(results.count - created))
        writer.beginArray("results")
        for result in results {
            writer.beginObject()
            writer.string("client_id", result.clientID.uuidString.lowercased())
            writer.string("status", result.created ? "created" : "duplicate")
            writer.int("seq", result.seq)
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return .json(.ok, writer.bytes)
    }

    struct PullParameters {
        var after: Int64 = 0
        var limit = 500
        var wait = 0
    }

    static func parameters(_ request: HTTPRequest) throws -> PullParameters {
        var parameters = PullParameters()
        var seen = Set<String>()
        for (name, value) in request.queryItems {
            guard seen.insert(name).inserted else {
                throw APIError.badRequest("invalid_parameter", "\(name) is given more than once.")
            }
            switch name {
            case "after":
                guard let number = Int64(value), number >= 0 else {
                    throw APIError.badRequest("invalid_parameter", "after must be a non-negative integer.")
                }
                parameters.after = number
            case "limit":
                guard let number = Int(value), (1...1000).contains(number) else {
                    throw APIError.badRequest("invalid_parameter", "limit must be an integer from 1 to 1000.")
                }
                parameters.limit = number
            case "wait":
                guard let number = Int(value), (0...60).contains(number) else {
                    throw APIError.badRequest("invalid_parameter", "wait must be an integer from 0 to 60 (seconds).")
                }
                parameters.wait = number
            default:
                throw APIError.badRequest("invalid_parameter", "Unknown parameter \(name); use after, limit and wait.")
            }
        }
        return parameters
    }

    func pull(_ request: HTTPRequest) async throws -> HTTPResponse {
        let user = try authenticate(request)
        let parameters = try Self.parameters(request)
        var page = try await Self.database { try await store.pull(for: user, after: parameters.after, limit: parameters.limit) }
        if page.count == 0, parameters.wait > 0 {
            let ticket = notifier.ticket(for: user)
            page = try await Self.database { try await store.pull(for: user, after: parameters.after, limit: parameters.limit) }
            if page.count == 0 {
                await ticket.wait(timeout: .seconds(parameters.wait))
                if !Task.isCancelled {
                    page = try await Self.database {
                        try await store.pull(for: user, after: parameters.after, limit: parameters.limit)
                    }
                }
            } else {
                ticket.cancel()
            }
        }
        metrics.increment("trunk_sync_events_pulled_total", by: Double(page.count))
        var writer = JSONWriter(capacity: page.eventsJSON.count + 64)
        writer.beginObject()
        writer.raw("events", page.eventsJSON)
        writer.int("next_after", page.lastSeq ?? parameters.after)
        writer.bool("has_more", page.hasMore)
        writer.endObject()
        return .json(.ok, writer.bytes)
    }
}
