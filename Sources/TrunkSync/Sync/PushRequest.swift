import Foundation
import Postgres

/// One event of a push, checked: every field typed, the payload kept as raw JSON bytes.
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

/// A problem with one field of one event.
struct FieldProblem: Sendable, Equatable {
    var index: Int
    var field: String
    var reason: String
}

/// Parses and validates a push body `{"events": [...]}` in one pass over the bytes.
enum PushRequest {
    static let maxEvents = 1000
    static let maxPayloadBytes = 64 * 1024
    static let maxTypeLength = 128

    enum Outcome {
        case events([IncomingEvent])
        case malformed(String)
        case invalid([FieldProblem])
    }

    static func parse(_ body: [UInt8]) -> Outcome {
        body.withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(buffer)
            var events: [IncomingEvent] = []
            var problems: [FieldProblem] = []
            var sawEvents = false
            do throws(JSONScanner.Failure) {
                guard scanner.peek() == UInt8(ascii: "{") else { throw scanner.fail("the body must be a JSON object") }
                try scanner.object { (scanner: inout JSONScanner, key: String) throws(JSONScanner.Failure) in
                    guard key == "events" else {
                        _ = try scanner.skipValue()
                        return
                    }
                    sawEvents = true
                    guard scanner.peek() == UInt8(ascii: "[") else { throw scanner.fail("\"events\" must be an array") }
                    try scanner.array { (scanner: inout JSONScanner, index: Int) throws(JSONScanner.Failure) in
                        guard index < maxEvents else {
                            throw scanner.fail("a push holds at most \(maxEvents) events")
                        }
                        if let event = try parseEvent(&scanner, index: index, problems: &problems) {
                            events.append(event)
                        }
                    }
                }
                scanner.skipWhitespace()
                guard scanner.isAtEnd else { throw scanner.fail("unexpected data after the JSON object") }
            } catch {
                return .malformed("\(error.reason) at byte \(error.offset)")
            }
            if !sawEvents { return .malformed("the body needs an \"events\" array") }
            if !problems.isEmpty { return .invalid(problems) }
            if events.isEmpty { return .malformed("\"events\" is empty") }
            return .events(events)
        }
    }

    private static func parseEvent(_ scanner: inout JSONScanner, index: Int, problems: inout [FieldProblem])
        throws(JSONScanner.Failure) -> IncomingEvent?
    {
        guard scanner.peek() == UInt8(ascii: "{") else {
            _ = try scanner.skipValue()
            problems.append(FieldProblem(index: index, field: "", reason: "must be an object"))
            return nil
        }
        var clientID: UUID?
        var type: String?
        var payload: PostgresJSON?
        var timestamp: PostgresTimestamp?
        var seen = Set<String>()
        let before = problems.count
        func problem(_ field: String, _ reason: String) { problems.append(FieldProblem(index: index, field: field, reason: reason)) }
        try scanner.object { (scanner: inout JSONScanner, key: String) throws(JSONScanner.Failure) in
            if !seen.insert(key).inserted, ["client_id", "type", "payload", "client_timestamp"].contains(key) {
                problem(key, "appears twice")
            }
            switch key {
            case "client_id":
                let text = scanner.peek() == UInt8(ascii: "\"") ? try scanner.string() : nil
                if text == nil { _ = try scanner.skipValue() }
                if let text, let id = UUID(uuidString: text) {
                    clientID = id
                } else {
                    problem("client_id", "must be a UUID")
                }
            case "type":
                if scanner.peek() == UInt8(ascii: "\"") {
                    let text = try scanner.string()
                    let length = text.unicodeScalars.count
                    if length == 0 || length > maxTypeLength {
                        problem("type", "must be 1 to \(maxTypeLength) characters")
                    } else {
                        type = text
                    }
                } else {
                    _ = try scanner.skipValue()
                    problem("type", "must be a string")
                }
            case "payload":
                let isObject = scanner.peek() == UInt8(ascii: "{")
                let range = try scanner.skipValue()
                if !isObject {
                    problem("payload", "must be a JSON object")
                } else if range.count > maxPayloadBytes {
                    problem("payload", "must be at most \(maxPayloadBytes) bytes")
                } else {
                    payload = scanner.bytes(range)
                }
            case "client_timestamp":
                let text = scanner.peek() == UInt8(ascii: "\"") ? try scanner.string() : nil
                if text == nil { _ = try scanner.skipValue() }
                if let text, let parsed = RFC3339.parse(text) {
                    timestamp = parsed
                } else {
                    problem("client_timestamp", "must be an RFC 3339 timestamp, e.g. 2026-11-22T04:10:02.123Z")
                }
            default:
                _ = try scanner.skipValue()
            }
        }
        if clientID == nil, !seen.contains("client_id") { problem("client_id", "is required") }
        if type == nil, !seen.contains("type") { problem("type", "is required") }
        if payload == nil, !seen.contains("payload") { problem("payload", "is required") }
        if timestamp == nil, !seen.contains("client_timestamp") { problem("client_timestamp", "is required") }
        guard problems.count == before, let clientID, let type, let payload, let timestamp else { return nil }
        return IncomingEvent(clientID: clientID, type: type, payload: payload, clientTimestamp: timestamp)
    }
}

extension JSONScanner {
    /// A copy of the bytes in `range`, as JSON.
    func bytes(_ range: Range<Int>) -> PostgresJSON {
        PostgresJSON(bytes: slice(range))
    }
}
