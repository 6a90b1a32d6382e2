import Foundation

/// One event of the user's log, as pulled from the server.
public struct SyncEvent: Sendable, Equatable, Identifiable {
    /// The server's id of the stored event.
    public var id: UUID
    /// The id the recording device gave the event; the same on every device and retry.
    public var clientID: UUID
    /// The event's position in the user's log: 1, 2, 3, …, increasing (consecutive but once
    /// across a restore of the server's database, which moves it far ahead).
    public var seq: Int64
    public var type: String
    /// The payload's JSON text (an object), exactly as the server returned it.
    public var payload: Data
    /// When the recording device recorded it (its clock).
    public var clientTimestamp: Date
    /// When the server stored it (whole milliseconds, strictly increasing per user).
    public var createdAt: Date

    public init(
        id: UUID, clientID: UUID, seq: Int64, type: String, payload: Data, clientTimestamp: Date, createdAt: Date
    ) {
        self.id = id
        self.clientID = clientID
        self.seq = seq
        self.type = type
        self.payload = payload
        self.clientTimestamp = clientTimestamp
        self.createdAt = createdAt
    }

    /// The payload decoded as `type` (with `decoder`; ISO 8601 dates by default, as
    /// `record` encodes them).
    public func decode<T: Decodable>(_ type: T.Type, using decoder: JSONDecoder? = nil) throws -> T {
        try (decoder ?? TrunkSyncClient.defaultDecoder()).decode(type, from: payload)
    }

    /// The payload as Foundation objects (`[String: Any]`).
    public func payloadObject() throws -> [String: Any] {
        guard let object = try JSONSerialization.jsonObject(with: payload) as? [String: Any] else {
            throw TrunkSyncError.invalidResponse("payload of event \(seq) is not a JSON object")
        }
        return object
    }
}

/// What one `sync` did.
public struct SyncReport: Sendable, Equatable {
    /// Events of the outbox the server stored now.
    public var pushed = 0
    /// Events of the outbox the server already had (an earlier push whose answer was lost):
    /// removed from the outbox, not stored twice.
    public var duplicates = 0
    /// Events pulled and handed to the handler.
    public var pulled = 0
    /// Pages pulled.
    public var pages = 0
    /// Events the server refused, moved to the quarantine (`quarantinedEvents()`).
    public var rejected: [RejectedEvent] = []
    /// The cursor after the pull: the `seq` of the last event applied.
    public var cursor: Int64 = 0

    public init() {}
}

/// An event the server refused: which one, which field, why. It is in the quarantine.
public struct RejectedEvent: Sendable, Equatable {
    public var clientID: UUID
    public var type: String
    public var rejection: Rejection

    /// The field the server named (`payload`, `type`, …).
    public var field: String { rejection.field }
    /// The server's reason.
    public var reason: String { rejection.reason }
}

/// An event the server refused, kept in the quarantine until the app drops or retries it.
public struct QuarantinedEvent: Sendable, Equatable {
    public var clientID: UUID
    public var type: String
    /// The payload's JSON text as recorded.
    public var payload: Data
    public var clientTimestamp: Date
    public var rejection: Rejection
}

/// What `signOut` did.
public struct SignOutResult: Sendable, Equatable {
    /// Events recorded by the user that are still not on the server. They stay in the
    /// user's outbox on this device and are pushed the next time the same user signs in
    /// (unless `signOut(discardingUnsentEvents: true)` deleted them). Nil when the outbox
    /// could not be read (its events, however many, are kept all the same).
    public var unsentEvents: Int?
    /// Events of the user's quarantine (kept or discarded alike); nil when it could not be
    /// read.
    public var quarantinedEvents: Int?
    /// Whether the server revoked the session: its own answer said so (false when it could
    /// not be reached, or a page of something in the way answered, such as a proxy's `401`:
    /// the local session is removed all the same, but the server's may still be live).
    public var serverSessionRevoked: Bool
}

/// The signed-in user.
public struct User: Sendable, Equatable {
    public var id: UUID
    public var email: String?
}

/// Something the client did that an app may want to log or count (`Configuration.observer`).
public enum ClientEvent: Sendable {
    /// A request is about to be sent.
    case request(method: String, path: String)
    /// A request failed in a way worth retrying; the client waits `delay` seconds first.
    /// `status` is the HTTP status (nil for a network error), `retryAfter` the server's
    /// `Retry-After` when it sent one.
    case retrying(
        method: String, path: String, status: Int?, retryAfter: TimeInterval?, delay: TimeInterval,
        attempt: Int, error: String)
    /// The access token was refreshed: `proactive` before it expired, else after a `401`.
    case tokenRefreshed(proactive: Bool)
    /// A batch of the outbox was stored (`created` new, `duplicates` already there).
    case batchPushed(events: Int, created: Int, duplicates: Int)
    /// The server refused events; they were moved to the quarantine.
    case eventsRejected([RejectedEvent])
    /// A page was pulled and applied; the cursor is now `cursor`.
    case pageApplied(events: Int, cursor: Int64)
    /// The outbox or quarantine file was repaired: when it was opened (a torn write,
    /// damage), or later, when a frame of it was found damaged (`LogRecovery.damagedEvents`
    /// names the events set aside; their bytes are in `damagedCopy`).
    case logRecovered(LogRecovery)
    /// The session was lost (refresh refused): the user must sign in again.
    case sessionExpired
}

/// Errors of the client.
public enum TrunkSyncError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The call needs a signed-in user.
    case notSignedIn
    /// The server no longer accepts the session (revoked, or its refresh token was used
    /// twice): sign in again. The outbox is kept.
    case sessionExpired
    /// The sign-in code is wrong, expired or used.
    case invalidCode
    /// The server refused for now; try again after `retryAfter` seconds (429/503 whose
    /// wait is longer than `RetryPolicy.maxRetryAfter`, or after every retry).
    case rateLimited(retryAfter: TimeInterval?, code: String, message: String)
    /// The event cannot be recorded (type, payload).
    case invalidEvent(String)
    /// The server answered with an error.
    case server(ServerError)
    /// The server could not be reached (after every retry).
    case network(String)
    /// The server's answer could not be read.
    case invalidResponse(String)
    /// `exportData` got a body that is not a whole export: it ended without the server's end
    /// line (cut short on the way, where the break was not seen as one, e.g. by a proxy that
    /// closed the connection instead), its count or last `seq` is not what came, or something
    /// follows it. Nothing was written to the destination; export again.
    case incompleteExport(String)
    /// Reading or writing the storage directory failed.
    case storage(String)
    /// Another client (in this process or another) has this storage directory open.
    case storageInUse(String)
    /// `deleteAccount` sent the deletion and got no answer (the connection broke, the request
    /// timed out, a `5xx`): the account may or may not be deleted. The client signed out and
    /// removed the user's data on this device all the same; signing in again shows whether
    /// the account still exists (a new, empty one if it was deleted).
    case outcomeUnknown(String)

    public var description: String {
        switch self {
        case .notSignedIn: return "not signed in"
        case .sessionExpired: return "the session expired; sign in again"
        case .invalidCode: return "the code is wrong, expired or used"
        case .rateLimited(let retryAfter, let code, let message):
            return "\(code): \(message) (retry after \(retryAfter.map { "\(Int($0.rounded(.up))) s" } ?? "a while"))"
        case .invalidEvent(let reason): return "invalid event: \(reason)"
        case .server(let error): return error.description
        case .network(let reason): return "network: \(reason)"
        case .invalidResponse(let reason): return "invalid response: \(reason)"
        case .incompleteExport(let reason): return "incomplete export: \(reason)"
        case .storage(let reason): return "storage: \(reason)"
        case .storageInUse(let path): return "storage \(path) is in use by another client"
        case .outcomeUnknown(let reason): return "outcome unknown: \(reason)"
        }
    }
}

/// An error answer of the server: status, code, message and, for refused events, which
/// event and field.
public struct ServerError: Error, Sendable, Equatable, CustomStringConvertible {
    public struct FieldProblem: Sendable, Equatable {
        /// Index of the event in the batch.
        public var index: Int
        public var field: String
        public var reason: String
    }

    public var status: Int
    public var code: String
    public var message: String
    public var details: [FieldProblem]
    public var retryAfter: TimeInterval?

    public var description: String { "\(status) \(code): \(message)" }
}
