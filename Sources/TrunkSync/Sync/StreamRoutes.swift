import Foundation
import HTTPServer

/// `GET /sync/v1/stream`: the user's events as Server-Sent Events, the backlog after the
/// starting point and then every new event as it commits (on any instance).
///
/// The handler decides everything that can still be an HTTP answer — the parameters
/// (`400`), the media type (`406`), the limits (`429`), the first page from the database
/// (`503`) — and only then answers with the streamed body (`EventStreams.run`).
struct StreamRoutes: Sendable {
    let streams: EventStreams

    static let path = "/sync/v1/stream"

    func register(in routes: inout Routes) {
        routes.add(
            .get, Self.path, family: .native, acceptsQueryToken: true,
            .authenticated { request, claims in try await stream(request, claims: claims) })
    }

    /// `after`, or the `Last-Event-ID` a reconnecting `EventSource` sends (which wins).
    static func startingPoint(_ request: HTTPRequest) throws(APIError) -> Int64 {
        var after: Int64 = 0
        for (name, value) in try SyncRoutes.uniqueQueryItems(request) {
            switch name {
            case "after":
                after = try SyncRoutes.cursor(value)
            case "access_token":
                break  // read by the authentication stage
            default:
                throw APIError.badRequest(
                    "invalid_parameter", "Unknown parameter \(name); use after (and access_token).")
            }
        }
        let lastEventIDs = request.headers.values(for: "last-event-id")
        if lastEventIDs.count > 1 {
            throw APIError.badRequest("invalid_last_event_id", "Last-Event-ID is given more than once.")
        }
        if let text = lastEventIDs.first?.trimmingCharacters(in: .whitespaces), !text.isEmpty {
            guard let number = Int64(text), number >= 0 else {
                throw APIError.badRequest(
                    "invalid_last_event_id", "Last-Event-ID must be the non-negative integer id of an event.")
            }
            after = number
        }
        return after
    }

    /// Whether `Accept` names `text/event-stream` (a browser's `EventSource` always does).
    /// An absent or generic `Accept` is refused: an endless body is sent only to a client
    /// that asked for one.
    static func acceptsEventStream(_ headers: HTTPHeaders) -> Bool {
        for value in headers.values(for: "accept") {
            for range in value.split(separator: ",") {
                let type = range.split(separator: ";", maxSplits: 1).first ?? ""
                if type.trimmingCharacters(in: .whitespaces).lowercased() == "text/event-stream" { return true }
            }
        }
        return false
    }

    static let notAcceptable = APIError(
        status: 406, code: "not_acceptable",
        message: "This route sends Server-Sent Events only: send Accept: text/event-stream.")

    func stream(_ request: HTTPRequest, claims: AccessClaims) async throws -> HTTPResponse {
        let after = try Self.startingPoint(request)
        guard Self.acceptsEventStream(request.headers) else { throw Self.notAcceptable }
        let hub = try streams.reserve(for: claims.userID)
        let start: EventStreams.Start
        do {
            let first = try await streams.pulls.page(
                for: claims.userID, after: after, limit: streams.settings.pageSize,
                notBefore: streams.notifier.generation)
            start = EventStreams.Start(
                user: claims.userID, session: claims.sessionID, expiresAt: claims.expiresAt, hub: hub,
                firstPage: first, cursor: after)
        } catch {
            streams.release(for: claims.userID, entry: nil)
            throw error
        }
        let streams = self.streams
        return .streamed(
            .ok,
            headers: [
                "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store",
                // nginx and others: pass each event on at once instead of buffering the body.
                "X-Accel-Buffering": "no",
            ], bufferLimit: streams.settings.bufferBytes, shutdown: .cancel
        ) { writer in
            await streams.run(start, writer: writer)
        }
    }
}
