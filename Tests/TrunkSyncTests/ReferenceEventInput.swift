import Foundation
import JSON
import Postgres

@testable import TrunkSync

/// The event decoder as it was before it matched keys and read strings as bytes (commit
/// 2e26c8b), kept to test the current one against: the same events, problems and refusals
/// for any body.
struct ReferenceEventInput {
    static let maxPayloadBytes = EventInput.maxPayloadBytes
    static let maxTypeLength = EventInput.maxTypeLength

    typealias Dialect = EventInput.Dialect

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
        try scanner.object { (scanner: inout JSONScanner, key: String) throws(JSONScanner.Failure) in
            if case .rest(_, let columns?, _) = dialect, !columns.contains(key) {
                try scanner.skipValue()
                _ = scanner.takeViolation()
                return
            }
            let bit = Self.fieldBit(key)
            if seen & bit != 0 { problem(key, "appears twice") }
            seen |= bit
            let isNull = scanner.peek() == UInt8(ascii: "n")
            let restAllowsNull: Bool
            if case .rest = dialect {
                restAllowsNull = isNull && (key == "payload" || key == "client_timestamp")
            } else {
                restAllowsNull = false
            }
            switch key {
            case "client_id":
                if case .text(let text) = try Self.string(&scanner), let id = UUIDText.parse(text) {
                    clientID = id
                } else {
                    problem(key, "must be a UUID")
                }
            case "type":
                switch try Self.string(&scanner) {
                case .text(let text):
                    let length = text.unicodeScalars.count
                    if length == 0 || length > Self.maxTypeLength {
                        problem(key, "must be 1 to \(Self.maxTypeLength) characters")
                    } else {
                        type = text
                    }
                case .notAString: problem(key, "must be a string")
                case .refused(let reason): problem(key, reason)
                }
            case "payload":
                if restAllowsNull {
                    try scanner.skipValue()
                    return
                }
                let isObject = scanner.peek() == UInt8(ascii: "{")
                let (range, stored) = try scanner.skipValueMeasured()
                if let violation = scanner.takeViolation() {
                    problem(key, violation.reason)
                } else if !isObject {
                    problem(key, "must be a JSON object")
                } else if stored > Self.maxPayloadBytes {
                    problem(
                        key,
                        "must be at most \(Self.maxPayloadBytes) bytes as stored (numbers in plain decimal); this one is \(stored)"
                    )
                } else {
                    payload = PostgresJSON(bytes: scanner.slice(range))
                }
            case "client_timestamp":
                if restAllowsNull {
                    try scanner.skipValue()
                    return
                }
                if case .text(let text) = try Self.string(&scanner), let parsed = RFC3339.parse(text) {
                    timestamp = parsed
                } else {
                    problem(key, "must be an RFC 3339 timestamp, e.g. 2026-11-22T04:10:02.123Z")
                }
            default:
                guard case .rest(let caller, _, _) = dialect, key == "user_id", !isNull else {
                    try scanner.skipValue()
                    _ = scanner.takeViolation()
                    if case .rest = dialect, !EventRecord.assignedByServer.contains(key), refusal == nil {
                        // PostgREST refuses columns the table does not have; `id`, `seq` and
                        // `created_at` are the server's to assign and are ignored.
                        refusal = APIError(
                            status: 400, code: "PGRST204",
                            message: "Could not find the '\(key)' column of 'events' in the schema cache")
                    }
                    return  // the native API ignores keys it does not know
                }
                if case .text(let text) = try Self.string(&scanner), let id = UUIDText.parse(text) {
                    if id != caller, refusal == nil { refusal = RESTError.foreignUser }
                } else {
                    problem(key, "must be a UUID")
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
            if payload == nil, seen & Self.fieldBit("payload") == 0 { problem("payload", "is required") }
            if timestamp == nil, seen & Self.fieldBit("client_timestamp") == 0 {
                problem("client_timestamp", "is required")
            }
        }
        if clientID == nil, seen & Self.fieldBit("client_id") == 0 { problem("client_id", "is required") }
        if type == nil, seen & Self.fieldBit("type") == 0 { problem("type", "is required") }
        guard problems.count == before, let clientID, let type, let payload, let timestamp else { return nil }
        return IncomingEvent(clientID: clientID, type: type, payload: payload, clientTimestamp: timestamp)
    }

    /// A bit for each field an event must have, 0 for any other key.
    @inline(__always)
    static func fieldBit(_ key: String) -> UInt8 {
        switch key {
        case "client_id": return 1
        case "type": return 2
        case "payload": return 4
        case "client_timestamp": return 8
        default: return 0
        }
    }

    enum StringValue {
        case text(String)
        case notAString
        /// A string the parser refuses (`\u0000`, an unpaired surrogate): why.
        case refused(String)
    }

    /// Reads a value that should be a string.
    private static func string(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> StringValue {
        guard scanner.peek() == UInt8(ascii: "\"") else {
            try scanner.skipValue()
            _ = scanner.takeViolation()
            return .notAString
        }
        let text = try scanner.string()
        if let violation = scanner.takeViolation() { return .refused(violation.reason) }
        return .text(text)
    }

}
