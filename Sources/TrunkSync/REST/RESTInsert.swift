import Foundation
import Postgres

/// Reads insert and update bodies of the REST routes: one object or an array of objects.
enum RESTInsert {
    static let maxPayloadBytes = 64 * 1024

    /// Events to insert. `user_id`, when given, must be the caller; `id`, `seq` and
    /// `created_at` are the server's to assign and are ignored; a missing `payload` is `{}`
    /// and a missing `client_timestamp` is now.
    static func parseEvents(_ body: [UInt8], caller: UUID, columns: [String]?) throws -> [IncomingEvent] {
        let allowed = columns.map(Set.init)
        let now = PostgresTimestamp(Date())
        return try body.withUnsafeBufferPointer { buffer -> [IncomingEvent] in
            var scanner = JSONScanner(buffer)
            var events: [IncomingEvent] = []
            var failure: APIError? = nil
            do throws(JSONScanner.Failure) {
                func one(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) {
                    guard scanner.peek() == UInt8(ascii: "{") else { throw scanner.fail("expected an object") }
                    var clientID: UUID?
                    var type: String?
                    var payload = PostgresJSON("{}")
                    var timestamp: PostgresTimestamp? = nil
                    try scanner.object { (scanner: inout JSONScanner, key: String) throws(JSONScanner.Failure) in
                        if let allowed, !allowed.contains(key) {
                            _ = try scanner.skipValue()
                            return
                        }
                        let isString = scanner.peek() == UInt8(ascii: "\"")
                        let isNull = scanner.peek() == UInt8(ascii: "n")
                        switch key {
                        case "user_id":
                            let text = isString ? try scanner.string() : nil
                            if text == nil { _ = try scanner.skipValue() }
                            if failure == nil {
                                if let text, let id = UUID(uuidString: text) {
                                    if id != caller { failure = RESTError.foreignUser }
                                } else if !isNull {
                                    failure = RESTError.badValue(text ?? "", type: "uuid")
                                }
                            }
                        case "client_id":
                            let text = isString ? try scanner.string() : nil
                            if text == nil { _ = try scanner.skipValue() }
                            if let text, let id = UUID(uuidString: text) {
                                clientID = id
                            } else if failure == nil, !isNull {
                                failure = RESTError.badValue(text ?? "", type: "uuid")
                            }
                        case "type":
                            let text = isString ? try scanner.string() : nil
                            if text == nil { _ = try scanner.skipValue() }
                            if let text, (1...128).contains(text.unicodeScalars.count) {
                                type = text
                            } else if failure == nil, !isNull {
                                failure = APIError(
                                    status: 400, code: "23514",
                                    message: "new row for relation \"events\" violates check constraint \"events_type_check\"")
                            }
                        case "payload":
                            let range = try scanner.skipValue()
                            if range.count > maxPayloadBytes, failure == nil {
                                failure = APIError(status: 400, code: "22001", message: "payload is larger than \(maxPayloadBytes) bytes")
                            }
                            if !isNull { payload = scanner.bytes(range) }
                        case "client_timestamp":
                            let text = isString ? try scanner.string() : nil
                            if text == nil { _ = try scanner.skipValue() }
                            if let text, let parsed = RFC3339.parse(text) {
                                timestamp = parsed
                            } else if failure == nil, !isNull {
                                failure = RESTError.badValue(text ?? "", type: "timestamp with time zone")
                            }
                        case "id", "seq", "created_at":
                            _ = try scanner.skipValue()
                        default:
                            _ = try scanner.skipValue()
                            if failure == nil {
                                failure = APIError(
                                    status: 400, code: "PGRST204",
                                    message: "Could not find the '\(key)' column of 'events' in the schema cache")
                            }
                        }
                    }
                    guard failure == nil else { return }
                    guard let clientID else {
                        failure = notNull("client_id")
                        return
                    }
                    guard let type else {
                        failure = notNull("type")
                        return
                    }
                    events.append(IncomingEvent(clientID: clientID, type: type, payload: payload, clientTimestamp: timestamp ?? now))
                }
                if scanner.peek() == UInt8(ascii: "[") {
                    try scanner.array { (scanner: inout JSONScanner, _: Int) throws(JSONScanner.Failure) in try one(&scanner) }
                } else {
                    try one(&scanner)
                }
                scanner.skipWhitespace()
                guard scanner.isAtEnd else { throw scanner.fail("unexpected data after the JSON value") }
            } catch {
                throw APIError(status: 400, code: "PGRST102", message: "Empty or invalid json", details: .text("\(error.reason) at byte \(error.offset)"))
            }
            if let failure { throw failure }
            return events
        }
    }

    static func notNull(_ column: String) -> APIError {
        APIError(
            status: 400, code: "23502", message: "null value in column \"\(column)\" of relation \"events\" violates not-null constraint")
    }

    struct ProfileChange {
        /// `.some(nil)` clears the name.
        var fullName: String??
    }

    /// A profile change: `full_name` (string or null); `id`, when given, must be the caller;
    /// `updated_at` is the server's.
    static func parseProfile(_ body: [UInt8], caller: UUID, allowArray: Bool) throws -> ProfileChange {
        guard var value = JSONValue.parse(body) else {
            throw APIError(status: 400, code: "PGRST102", message: "Empty or invalid json")
        }
        if allowArray, case .array(let items) = value {
            guard items.count == 1 else {
                throw APIError(status: 400, code: "PGRST102", message: "Only the caller's own profile can be written")
            }
            value = items[0]
        }
        guard let object = value.objectValue else {
            throw APIError(status: 400, code: "PGRST102", message: "Expected a JSON object")
        }
        var change = ProfileChange(fullName: nil)
        for (key, member) in object {
            switch key {
            case "full_name":
                switch member {
                case .null: change.fullName = .some(nil)
                case .string(let text): change.fullName = .some(text)
                default: throw RESTError.badValue("\(member)", type: "text")
                }
            case "id":
                guard let text = member.stringValue, let id = UUID(uuidString: text) else {
                    throw RESTError.badValue(member.stringValue ?? "", type: "uuid")
                }
                guard id == caller else {
                    throw APIError(status: 403, code: "42501", message: "new row violates row-level security policy for table \"profiles\"")
                }
            case "updated_at":
                continue
            default:
                throw APIError(status: 400, code: "PGRST204", message: "Could not find the '\(key)' column of 'profiles' in the schema cache")
            }
        }
        guard let fullName = change.fullName else {
            throw APIError(status: 400, code: "PGRST204", message: "Nothing to update: only full_name can be changed")
        }
        change.fullName = fullName
        return change
    }
}
