import Foundation
import HTTPServer
import JSON
import Logging
import Postgres

/// The native sync API: `POST /sync/v1/events` (push) and `GET /sync/v1/events` (pull,
/// optionally long-polling).
public struct SyncRoutes: Sendable {
    let store: EventStore
    let notifier: EventNotifier
    let metrics: Metrics
    let revocations: SessionRevocations?

    /// The largest push: 1000 events of at most 64 KiB of payload each would not fit, and
    /// need not: clients send batches of a few hundred small events.
    public static let pushBodyLimit = 10 * 1024 * 1024

    /// `revocations`: a long-poll whose session is revoked while it waits answers `401`.
    public init(
        store: EventStore, notifier: EventNotifier, metrics: Metrics = Metrics(), revocations: SessionRevocations? = nil
    ) {
        self.metrics = metrics
        self.revocations = revocations
        self.store = store
        self.notifier = notifier
    }

    public func register(in routes: inout Routes) {
        routes.add(
            .post, "/sync/v1/events", family: .native, bodyLimit: Self.pushBodyLimit,
            .authenticated { request, claims in try await push(request, user: claims.userID) })
        routes.add(
            .get, "/sync/v1/events", family: .native,
            .authenticated { request, claims in try await pull(request, claims: claims) })
    }

    func push(_ request: HTTPRequest, user: UUID) async throws -> HTTPResponse {
        let events: [IncomingEvent]
        switch PushRequest.parse(request.body) {
        case .malformed(let reason):
            throw APIError.badRequest("invalid_json", "The body is not a valid push: \(reason).")
        case .invalid(let problems):
            throw EventInput.invalid(problems)
        case .events(let parsed):
            events = parsed
        }
        guard let results = try await store.push(events, for: user) else {
            throw APIError.unauthorized
        }
        let created = results.filter(\.created).count
        metrics.eventsPushed.increment(by: created)
        metrics.eventsDuplicate.increment(by: results.count - created)
        return .json(.ok, Self.pushResponse(results))
    }

    /// `{"accepted":…,"duplicates":…,"results":[{"client_id":…,"status":…,"seq":…},…]}`,
    /// written as bytes (what `JSONWriter` writes, without its per-member bookkeeping: every
    /// value here is a number, a UUID or a constant that needs no escaping).
    static func pushResponse(_ results: [EventStore.PushResult]) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(80 * results.count + 64)
        func append(_ text: StaticString) {
            bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
        }
        func append(_ number: Int64) { bytes.append(contentsOf: String(number).utf8) }
        let created = results.filter(\.created).count
        append(#"{"accepted":"#)
        append(Int64(created))
        append(#","duplicates":"#)
        append(Int64(results.count - created))
        append(#","results":["#)
        for (index, result) in results.enumerated() {
            append(index == 0 ? #"{"client_id":""# : #",{"client_id":""#)
            UUIDText.withLowercase(result.clientID) { bytes.append(contentsOf: $0) }
            append(result.created ? #"","status":"created","seq":"# : #"","status":"duplicate","seq":"#)
            append(result.seq)
            append("}")
        }
        append("]}")
        return bytes
    }

    struct PullParameters {
        var after: Int64 = 0
        var limit = 500
        var wait = 0
    }

    /// The query's parameters, each at most once (else `400 invalid_parameter`).
    static func uniqueQueryItems(_ request: HTTPRequest) throws(APIError) -> [(name: String, value: String)] {
        let items = request.queryItems
        // A pull names a few parameters: compared pairwise, without hashing, up to 8; a
        // longer query (at most what the request line's limit lets in) through a set.
        if items.count <= 8 {
            for index in items.indices.dropFirst() {
                let name = items[index].name
                if items[..<index].contains(where: { $0.name == name }) {
                    throw APIError.badRequest("invalid_parameter", "\(name) is given more than once.")
                }
            }
            return items
        }
        var seen = Set<String>()
        for (name, _) in items where !seen.insert(name).inserted {
            throw APIError.badRequest("invalid_parameter", "\(name) is given more than once.")
        }
        return items
    }

    /// A cursor (`after`): a non-negative integer.
    static func cursor(_ value: String) throws(APIError) -> Int64 {
        guard let number = Int64(value), number >= 0 else {
            throw APIError.badRequest("invalid_parameter", "after must be a non-negative integer.")
        }
        return number
    }

    static func parameters(_ request: HTTPRequest) throws -> PullParameters {
        var parameters = PullParameters()
        for (name, value) in try uniqueQueryItems(request) {
            switch name {
            case "after":
                parameters.after = try cursor(value)
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

    func pull(_ request: HTTPRequest, claims: AccessClaims) async throws -> HTTPResponse {
        let user = claims.userID
        let parameters = try Self.parameters(request)
        var page = try await store.pull(for: user, after: parameters.after, limit: parameters.limit)
        if page.count == 0, parameters.wait > 0 {
            // Held until an event comes or `wait` runs out: a wake-up that brings nothing (the
            // listener reconnecting, another session of the user signed out) waits again.
            let deadline = ContinuousClock.now.advanced(by: .seconds(parameters.wait))
            while page.count == 0 {
                // Taken before the re-check, so a commit between the two is not missed.
                // Released on every way out of here — the re-pull throwing (database busy or
                // lost), the task cancelled (the client went away), the wait ending: a ticket
                // left behind counts as waiting for ever (`trunk_sync_longpolls_waiting`) and
                // keeps its memory. Releasing twice is harmless.
                let ticket = notifier.ticket(for: user)
                defer { ticket.cancel() }
                page = try await store.pull(for: user, after: parameters.after, limit: parameters.limit)
                let remaining = ContinuousClock.now.duration(to: deadline)
                if page.count > 0 || remaining <= .zero { break }
                await ticket.wait(timeout: remaining)
                // A revocation wakes the user's long-polls: the signed-out session gets
                // nothing more, however long it meant to wait.
                if revocations?.isRevoked(claims.sessionID) == true { throw APIError.unauthorized }
                if Task.isCancelled { break }
                if notifier.isShutDown || ContinuousClock.now >= deadline {
                    page = try await store.pull(for: user, after: parameters.after, limit: parameters.limit)
                    break
                }
            }
        }
        metrics.eventsPulled.increment(by: page.count)
        var writer = JSONWriter(capacity: page.eventsJSON.count + 64)
        writer.beginObject()
        writer.raw("events", page.eventsJSON)
        writer.int("next_after", page.lastSeq ?? parameters.after)
        writer.bool("has_more", page.hasMore)
        writer.endObject()
        return .json(.ok, writer.bytes)
    }
}
