import Foundation

/// One answer of `GET /sync/v1/events`: `{"events": […], "next_after": N, "has_more": B}`.
struct EventPage: Sendable, Equatable {
    var events: [SyncEvent]
    var nextAfter: Int64
    var hasMore: Bool

    static func parse(_ body: Data) throws -> EventPage {
        var reader = RawJSONReader(Array(body))
        var events: [SyncEvent] = []
        var nextAfter: Int64?
        var hasMore: Bool?
        do {
            try reader.readObject { key, reader in
                switch key {
                case "events":
                    try reader.readArray { reader in events.append(try parseEvent(&reader)) }
                case "next_after": nextAfter = try reader.readInt64()
                case "has_more": hasMore = try reader.readBool()
                default: _ = try reader.readRaw()
                }
            }
        } catch let error as TrunkSyncError {
            throw error
        } catch {
            throw TrunkSyncError.invalidResponse("pull page: \(error)")
        }
        guard let nextAfter, let hasMore else {
            throw TrunkSyncError.invalidResponse("pull page without next_after or has_more")
        }
        return EventPage(events: events, nextAfter: nextAfter, hasMore: hasMore)
    }

    /// Throws unless this is a page the server sends after `cursor`: events in increasing
    /// `seq` after it, `next_after` not behind them, and, when it says there is more, a
    /// `next_after` past `cursor` (else a pull would ask for the same page forever).
    func check(after cursor: Int64) throws {
        var previous = cursor
        for event in events {
            guard event.seq > previous else {
                throw TrunkSyncError.invalidResponse("events out of order after \(cursor): seq \(event.seq)")
            }
            previous = event.seq
        }
        guard nextAfter >= previous else {
            throw TrunkSyncError.invalidResponse("next_after \(nextAfter) behind seq \(previous)")
        }
        guard !hasMore || nextAfter > cursor else {
            throw TrunkSyncError.invalidResponse("has_more without moving past \(cursor)")
        }
    }

    private static func parseEvent(_ reader: inout RawJSONReader) throws -> SyncEvent {
        var id: UUID?
        var clientID: UUID?
        var seq: Int64?
        var type: String?
        var payload: Data?
        var clientTimestamp: Date?
        var createdAt: Date?
        try reader.readObject { key, reader in
            switch key {
            case "id": id = UUID(uuidString: try reader.readString())
            case "client_id": clientID = UUID(uuidString: try reader.readString())
            case "seq": seq = try reader.readInt64()
            case "type": type = try reader.readString()
            case "payload": payload = Data(try reader.readRaw())
            case "client_timestamp": clientTimestamp = RFC3339.parse(try reader.readString())
            case "created_at": createdAt = RFC3339.parse(try reader.readString())
            default: _ = try reader.readRaw()
            }
        }
        guard let id, let clientID, let seq, let type, let payload, let clientTimestamp, let createdAt else {
            throw TrunkSyncError.invalidResponse("an event of the page lacks a field or has a bad one")
        }
        return SyncEvent(
            id: id, clientID: clientID, seq: seq, type: type, payload: payload, clientTimestamp: clientTimestamp,
            createdAt: createdAt)
    }
}

/// How `liveEvents()` hears of new events: the next non-empty page after a cursor, or an
/// empty one when nothing came for a while.
///
/// Today there is one feed, `LongPollFeed`. The server's `GET /sync/v1/stream` (Server-Sent
/// Events, resumable with `Last-Event-ID`) would be a second one: a feed that keeps one
/// stream open and hands out the events it buffered implements this protocol, and
/// `liveEvents()` chooses it; the cursor handling of `liveEvents()` stays as it is.
protocol LiveFeed: Sendable {
    func nextPage(after cursor: Int64) async throws -> EventPage
}

/// `GET /sync/v1/events?after=&limit=&wait=`: the server answers at once when events are
/// there and otherwise holds the request until the user's next push (or `wait` seconds).
struct LongPollFeed: LiveFeed {
    let client: TrunkSyncClient
    let wait: Int

    func nextPage(after cursor: Int64) async throws -> EventPage {
        try await client.fetchPage(
            after: cursor, wait: wait,
            retry: TrunkSyncClient.RetryRules(unlimited: client.configuration.liveRetriesForever))
    }
}
