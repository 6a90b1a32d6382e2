import Foundation
import JSON
import Postgres

/// One event as received, checked: every field typed, the payload kept as raw JSON bytes.
public struct IncomingEvent: Sendable {
    public var clientID: UUID
    public var type: String
    public var payload: PostgresJSON
    public var clientTimestamp: PostgresTimestamp

    public init(clientID: UUID, type: String, payload: PostgresJSON, clientTimestamp: PostgresTimestamp) {
        self.clientID = clientID
        self.type = type
        self.payload = payload
        self.clientTimestamp = clientTimestamp
    }
}

/// A problem with one field of one event: the `details` of a `400`.
struct FieldProblem: Sendable, Equatable {
    var index: Int
    var field: String
    var reason: String
}

/// The one validation of events, for the native push (`POST /sync/v1/events`) and the REST
/// insert (`POST /rest/v1/events`): the same rules, the same reasons.
///
/// - `client_id`: a UUID in its canonical 8-4-4-4-12 hexadecimal form;
/// - `type`: a string of 1 to 128 characters;
/// - `payload`: a JSON object of at most 64 KiB *as stored* (numbers in plain decimal, as
///   PostgreSQL prints them — `1e308` counts 309 bytes), under the parser's I-JSON rules;
/// - `client_timestamp`: an RFC 3339 timestamp with a time zone.
///
/// The two APIs differ only where their clients expect it: the REST insert may leave out
/// `payload` (`{}`) and `client_timestamp` (now), may name `user_id` (the caller's), ignores
/// `id`, `seq` and `created_at`, and refuses unknown columns as PostgREST does.
struct EventInput {
    static let maxPayloadBytes = 64 * 1024

    /// The deepest an imported payload may nest: what a request body may (`JSONLimits`,
    /// 64 levels). A push's payload sits inside its body, so it nests less; a pull page
    /// holding one is still far within what clients' decoders read (Foundation's 512).
    static let maxPayloadDepth = 64
    static let maxTypeLength = 128
    static let maxEvents = 1000

    enum Dialect {
        case native
        /// `caller` is the signed-in user; `columns` the `columns=` parameter, if any.
        case rest(caller: UUID, columns: Set<String>?, now: PostgresTimestamp)
    }

    let dialect: Dialect
    var problems: [FieldProblem] = []
    /// A REST refusal that is not about a value (another user's row, an unknown column).
    var refusal: APIError? = nil

    init(_ dialect: Dialect) { self.dialect = dialect }

    /// Reads one event object at `index`; nil when it has problems (recorded).
    mutating func event(_ scanner: inout JSONScanner, index: Int) throws(JSONScanner.Failure) -> IncomingEvent? {
        let before = problems.count
        func problem(_ field: String, _ reason: String) {
            problems.append(FieldProblem(index: index, field: field, reason: reason))
        }
        guard scanner.peek() == UInt8(ascii: "{") else {
            try scanner.skipValue()
            _ = scanner.takeViolation()
            problem("", "must be an object")
            return nil
        }
        var clientID: UUID?
        var type: String?
        var payload: PostgresJSON?
        var timestamp: PostgresTimestamp?
        // The known fields met so far (bits of `Self.fieldBit`): no set of strings per event.
        var seen: UInt8 = 0
        let dialect = self.dialect
        // Keys are matched as bytes: no `String` per key. For these names (lower-case ASCII
        // letters and `_`) that is what `String`'s `==` finds too: no other text is
        // canonically equivalent to them.
        try scanner.objectUTF8 {
            (scanner: inout JSONScanner, keyUTF8: UnsafeBufferPointer<UInt8>) throws(JSONScanner.Failure) in
            if case .rest(_, let columns?, _) = dialect, !columns.contains(String(decoding: keyUTF8, as: UTF8.self)) {
                try scanner.skipValue()
                _ = scanner.takeViolation()
                return
            }
            let field = Field(keyUTF8)
            let bit = field.bit
            if seen & bit != 0 { problem(field.name, "appears twice") }
            seen |= bit
            let isNull = scanner.peek() == UInt8(ascii: "n")
            let restAllowsNull: Bool
            if case .rest = dialect {
                restAllowsNull = isNull && (field == .payload || field == .clientTimestamp)
            } else {
                restAllowsNull = false
            }
            switch field {
            case .clientID:
                if case .text(let id?) = try Self.string(&scanner, UUIDText.parse) {
                    clientID = id
                } else {
                    problem(field.name, "must be a UUID")
                }
            case .type:
                switch try Self.string(&scanner, Self.typeText) {
                case .text(let text?): type = text
                case .text(nil): problem(field.name, "must be 1 to \(Self.maxTypeLength) characters")
                case .notAString: problem(field.name, "must be a string")
                case .refused(let reason): problem(field.name, reason)
                }
            case .payload:
                if restAllowsNull {
                    try scanner.skipValue()
                    return
                }
                let isObject = scanner.peek() == UInt8(ascii: "{")
                let (range, stored) = try scanner.skipValueMeasured()
                if let violation = scanner.takeViolation() {
                    problem(field.name, violation.reason)
                } else if !isObject {
                    problem(field.name, "must be a JSON object")
                } else if stored > Self.maxPayloadBytes {
                    problem(
                        field.name,
                        "must be at most \(Self.maxPayloadBytes) bytes as stored (numbers in plain decimal); this one is \(stored)"
                    )
                } else {
                    payload = PostgresJSON(bytes: scanner.slice(range))
                }
            case .clientTimestamp:
                if restAllowsNull {
                    try scanner.skipValue()
                    return
                }
                if case .text(let parsed?) = try Self.string(&scanner, RFC3339.parse) {
                    timestamp = parsed
                } else {
                    problem(field.name, "must be an RFC 3339 timestamp, e.g. 2026-11-22T04:10:02.123Z")
                }
            case .userID, .other:
                guard case .rest(let caller, _, _) = dialect, field == .userID, !isNull else {
                    try scanner.skipValue()
                    _ = scanner.takeViolation()
                    if case .rest = dialect, refusal == nil {
                        let key = String(decoding: keyUTF8, as: UTF8.self)
                        if !EventRecord.assignedByServer.contains(key) {
                            // PostgREST refuses columns the table does not have; `id`, `seq` and
                            // `created_at` are the server's to assign and are ignored.
                            refusal = APIError(
                                status: 400, code: "PGRST204",
                                message: "Could not find the '\(key)' column of 'events' in the schema cache")
                        }
                    }
                    return  // the native API ignores keys it does not know
                }
                if case .text(let id?) = try Self.string(&scanner, UUIDText.parse) {
                    if id != caller, refusal == nil { refusal = RESTError.foreignUser }
                } else {
                    problem(field.name, "must be a UUID")
                }
            }
        }
        func hasProblem(_ field: String) -> Bool { problems[before...].contains { $0.field == field } }
        switch dialect {
        case .rest(_, _, let now):
            // Left out or null: an empty payload, the time of arrival.
            if payload == nil, !hasProblem("payload") { payload = PostgresJSON("{}") }
            if timestamp == nil, !hasProblem("client_timestamp") { timestamp = now }
        case .native:
            if payload == nil, seen & Field.payload.bit == 0 { problem("payload", "is required") }
            if timestamp == nil, seen & Field.clientTimestamp.bit == 0 { problem("client_timestamp", "is required") }
        }
        if clientID == nil, seen & Field.clientID.bit == 0 { problem("client_id", "is required") }
        if type == nil, seen & Field.type.bit == 0 { problem("type", "is required") }
        guard problems.count == before, let clientID, let type, let payload, let timestamp else { return nil }
        return IncomingEvent(clientID: clientID, type: type, payload: payload, clientTimestamp: timestamp)
    }

    /// An event's key, matched as bytes.
    enum Field: Equatable {
        case clientID, type, payload, clientTimestamp, userID, other

        init(_ utf8: UnsafeBufferPointer<UInt8>) {
            switch utf8.count {
            case 9 where JSONScanner.equals(utf8, "client_id"): self = .clientID
            case 4 where JSONScanner.equals(utf8, "type"): self = .type
            case 7 where JSONScanner.equals(utf8, "payload"): self = .payload
            case 7 where JSONScanner.equals(utf8, "user_id"): self = .userID
            case 16 where JSONScanner.equals(utf8, "client_timestamp"): self = .clientTimestamp
            default: self = .other
            }
        }

        /// The key as problems name it.
        var name: String {
            switch self {
            case .clientID: return "client_id"
            case .type: return "type"
            case .payload: return "payload"
            case .clientTimestamp: return "client_timestamp"
            case .userID: return "user_id"
            case .other: return ""  // never named: no rule applies to other keys
            }
        }

        /// A bit for each field an event must have, 0 for any other key.
        var bit: UInt8 {
            switch self {
            case .clientID: return 1
            case .type: return 2
            case .payload: return 4
            case .clientTimestamp: return 8
            case .userID, .other: return 0
            }
        }
    }

    enum StringValue<T> {
        /// What the reader made of the string.
        case text(T)
        case notAString
        /// A string the parser refuses (`\u0000`, an unpaired surrogate): why.
        case refused(String)
    }

    /// Reads a value that should be a string; `read` gets its UTF-8 (escapes decoded).
    private static func string<T>(_ scanner: inout JSONScanner, _ read: (UnsafeBufferPointer<UInt8>) -> T)
        throws(JSONScanner.Failure) -> StringValue<T>
    {
        guard scanner.peek() == UInt8(ascii: "\"") else {
            try scanner.skipValue()
            _ = scanner.takeViolation()
            return .notAString
        }
        let value = try scanner.stringUTF8(read)
        if let violation = scanner.takeViolation() { return .refused(violation.reason) }
        return .text(value)
    }

    /// A `type`'s text when it has 1 to `maxTypeLength` characters (Unicode scalars), else
    /// nil. The scanner hands over valid UTF-8 only: its scalars are its bytes other than
    /// continuation bytes.
    private static func typeText(_ utf8: UnsafeBufferPointer<UInt8>) -> String? {
        guard utf8.count <= 4 * maxTypeLength else { return nil }
        var length = 0
        for byte in utf8 where byte & 0xC0 != 0x80 { length += 1 }
        guard length > 0, length <= maxTypeLength else { return nil }
        return String(decoding: utf8, as: UTF8.self)
    }

    /// The problems as the `details` of a `400`: `[{"index", "field", "reason"}]`.
    static func details(_ problems: [FieldProblem]) -> [UInt8] {
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
        return details.bytes
    }

    /// The most events whose problems a `400` lists: every event of a push (`maxEvents`).
    /// A REST insert has no such cap (`return=minimal`): a 10 MiB body of 100,000 small
    /// invalid events was answered with 20 MB of details.
    static let maxListedEvents = maxEvents

    /// The `400` for a batch with problems: nothing of it was stored. Its details list the
    /// problems of the first `maxListedEvents` invalid events; the message counts them all.
    static func invalid(_ problems: [FieldProblem]) -> APIError {
        var invalid = Set<Int>()
        var listedEvents = Set<Int>()
        var listed: [FieldProblem] = []
        for problem in problems {
            invalid.insert(problem.index)
            if listedEvents.contains(problem.index) || listedEvents.count < maxListedEvents {
                listedEvents.insert(problem.index)
                listed.append(problem)
            }
        }
        let count = invalid.count
        let message =
            count > maxListedEvents
            ? "\(count) event(s) are invalid; nothing was stored. The details list the first \(maxListedEvents)."
            : "\(count) event(s) are invalid; nothing was stored."
        return APIError(status: 400, code: "validation_failed", message: message, details: .json(details(listed)))
    }
}
