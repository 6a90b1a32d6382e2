import Foundation
import JSON
import Postgres

/// Reads insert and update bodies of the REST routes: one object or an array of objects.
enum RESTInsert {
    /// Events to insert, under the same rules as a native push (`EventInput`, REST dialect).
    static func parseEvents(_ body: [UInt8], caller: UUID, columns: [String]?) throws -> [IncomingEvent] {
        var input = EventInput(.rest(caller: caller, columns: columns.map(Set.init), now: PostgresTimestamp(Date())))
        let events = try body.withUnsafeBufferPointer { buffer throws(APIError) -> [IncomingEvent] in
            var scanner = JSONScanner(buffer)
            var events: [IncomingEvent] = []
            do throws(JSONScanner.Failure) {
                if scanner.peek() == UInt8(ascii: "[") {
                    // No count limit of its own (as PostgREST): the route's body limit bounds it.
                    try scanner.array { (scanner: inout JSONScanner, index: Int) throws(JSONScanner.Failure) in
                        if let event = try input.event(&scanner, index: index) { events.append(event) }
                    }
                } else {
                    guard scanner.peek() == UInt8(ascii: "{") else {
                        throw scanner.fail("expected an object or an array")
                    }
                    if let event = try input.event(&scanner, index: 0) { events.append(event) }
                }
                try scanner.expectEnd()
            } catch {
                throw APIError(
                    status: 400, code: "PGRST102", message: "Empty or invalid json",
                    details: .text("\(error.reason) at byte \(error.offset)"))
            }
            return events
        }
        if let refusal = input.refusal { throw refusal }
        if !input.problems.isEmpty { throw EventInput.invalid(input.problems) }
        return events
    }

    struct ProfileChange {
        /// `.some(nil)` clears the name.
        var fullName: String??
    }

    /// A profile change: `full_name` (string or null); `id`, when given, must be the caller;
    /// `updated_at` is the server's.
    static func parseProfile(_ body: [UInt8], caller: UUID, allowArray: Bool) throws -> ProfileChange {
        var value: JSONValue
        do {
            value = try JSONValue.parse(body)
        } catch {
            throw APIError(
                status: 400, code: error.kind == .malformed ? "PGRST102" : "22023",
                message: error.kind == .malformed ? "Empty or invalid json" : "Invalid value in the body",
                details: .text(error.description))
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
                guard let text = member.stringValue, let id = UUIDText.parse(text) else {
                    throw RESTError.badValue(member.stringValue ?? "", type: "uuid")
                }
                guard id == caller else {
                    throw APIError(
                        status: 403, code: "42501",
                        message: "new row violates row-level security policy for table \"profiles\"")
                }
            case "updated_at":
                continue
            default:
                throw APIError(
                    status: 400, code: "PGRST204",
                    message: "Could not find the '\(key)' column of 'profiles' in the schema cache")
            }
        }
        guard let fullName = change.fullName else {
            throw APIError(status: 400, code: "PGRST204", message: "Nothing to update: only full_name can be changed")
        }
        change.fullName = fullName
        return change
    }
}
