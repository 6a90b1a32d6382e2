import Foundation
import JSON
import Postgres

/// Parses and validates a push body `{"events": [...]}` in one pass over the bytes, with the
/// rules every event follows (`EventInput`).
enum PushRequest {
    enum Outcome {
        case events([IncomingEvent])
        /// Not JSON, or not of the push's shape: the reason, with a byte offset.
        case malformed(String)
        /// Events with problems: nothing is stored.
        case invalid([FieldProblem])
    }

    static func parse(_ body: [UInt8], limits: JSONLimits = .default) -> Outcome {
        body.withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(buffer, limits: limits)
            var input = EventInput(.native)
            var events: [IncomingEvent] = []
            // An event takes at least ~100 bytes of the body (its four fields): no growing.
            events.reserveCapacity(min(EventInput.maxEvents, buffer.count / 100))
            var sawEvents = false
            do throws(JSONScanner.Failure) {
                guard scanner.peek() == UInt8(ascii: "{") else { throw scanner.fail("the body must be a JSON object") }
                try scanner.objectUTF8 {
                    (scanner: inout JSONScanner, key: UnsafeBufferPointer<UInt8>) throws(JSONScanner.Failure) in
                    guard JSONScanner.equals(key, "events") else {
                        try scanner.skipValue()
                        _ = scanner.takeViolation()
                        return
                    }
                    // One array: a second would restart the count (and the problems' indices),
                    // so a body could carry any number of events past the limit.
                    guard !sawEvents else { throw scanner.fail("\"events\" appears more than once") }
                    sawEvents = true
                    guard scanner.peek() == UInt8(ascii: "[") else { throw scanner.fail("\"events\" must be an array") }
                    try scanner.array { (scanner: inout JSONScanner, index: Int) throws(JSONScanner.Failure) in
                        guard index < EventInput.maxEvents else {
                            throw scanner.fail("a push holds at most \(EventInput.maxEvents) events")
                        }
                        if let event = try input.event(&scanner, index: index) { events.append(event) }
                    }
                }
                try scanner.expectEnd()
            } catch {
                return .malformed("\(error.reason) at byte \(error.offset)")
            }
            if !sawEvents { return .malformed("the body needs an \"events\" array") }
            if !input.problems.isEmpty { return .invalid(input.problems) }
            if events.isEmpty { return .malformed("\"events\" is empty") }
            return .events(events)
        }
    }
}
