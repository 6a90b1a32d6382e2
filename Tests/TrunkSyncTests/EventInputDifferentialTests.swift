import Foundation
import JSON
import Postgres
import XCTest

@testable import TrunkSync

/// The event decoder against the one before it (`ReferenceEventInput`) on random bodies:
/// escaped and unknown keys, repeated keys, strings with every kind of escape, types around
/// their length limit, payloads with numbers of every form, malformed JSON — in both
/// dialects. Same events (every field, payload bytes included), same problems, same
/// refusals, same failures.
final class EventInputDifferentialTests: XCTestCase {
    /// SplitMix64: the same bodies on every run.
    struct Generator: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    struct Outcome: Equatable, CustomStringConvertible {
        var events: [String] = []
        var problems: [FieldProblem] = []
        var refusal: APIError? = nil
        var failure: JSONScanner.Failure? = nil

        var description: String {
            "events \(events) problems \(problems) refusal \(String(describing: refusal)) failure \(String(describing: failure))"
        }
    }

    static func describe(_ event: IncomingEvent) -> String {
        "\(event.clientID) \(event.type.unicodeScalars.map { $0.value }) \(event.payload.bytes) \(event.clientTimestamp.microsecondsSinceEpoch)"
    }

    /// Decodes `body` (an array of events) with the current decoder.
    static func current(_ body: [UInt8], _ dialect: EventInput.Dialect) -> Outcome {
        var input = EventInput(dialect)
        var outcome = decode(body) { (scanner, index) throws(JSONScanner.Failure) in
            try input.event(&scanner, index: index)
        }
        outcome.problems = input.problems
        outcome.refusal = input.refusal
        return outcome
    }

    /// The same with the reference decoder.
    static func reference(_ body: [UInt8], _ dialect: EventInput.Dialect) -> Outcome {
        var input = ReferenceEventInput(dialect)
        var outcome = decode(body) { (scanner, index) throws(JSONScanner.Failure) in
            try input.event(&scanner, index: index)
        }
        outcome.problems = input.problems
        outcome.refusal = input.refusal
        return outcome
    }

    /// The events `event` reads from the array `body`, or where the scanner failed.
    private static func decode(
        _ body: [UInt8], _ event: (inout JSONScanner, Int) throws(JSONScanner.Failure) -> IncomingEvent?
    ) -> Outcome {
        var outcome = Outcome()
        body.withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(buffer)
            do throws(JSONScanner.Failure) {
                try scanner.array { (scanner: inout JSONScanner, index: Int) throws(JSONScanner.Failure) in
                    if let decoded = try event(&scanner, index) { outcome.events.append(describe(decoded)) }
                }
                try scanner.expectEnd()
            } catch {
                outcome.failure = error
            }
        }
        return outcome
    }

    static let keys = [
        #""client_id""#, #""type""#, #""payload""#, #""client_timestamp""#, #""user_id""#, #""id""#, #""seq""#,
        #""created_at""#, #""note""#, #""client\u005fid""#, #""typ\u0065""#, #""\u0070ayload""#,
        #""client_timestamp\u0000""#, #""Type""#, #""typé""#, #""""#, #""client_timestam""#, #""\ud83d\ude00""#,
    ]

    static func pick<T>(_ choices: [T], _ random: inout Generator) -> T {
        choices[Int(random.next() % UInt64(choices.count))]
    }

    static func uuidText(_ random: inout Generator) -> String {
        func hex(_ count: Int) -> String {
            String((0..<count).map { _ in pick(Array("0123456789ABCDEF"), &random) })
        }
        let id = "\(hex(8))-\(hex(4))-4\(hex(3))-8\(hex(3))-\(hex(12))"
        switch random.next() % 6 {
        case 0: return id
        case 1: return id.lowercased()
        case 2: return String(id.dropLast())
        case 3: return id.replacingOccurrences(of: "-", with: #"\u002d"#)
        case 4: return "9b2d0c1e-0000-4000-8000-00000000000" + pick(["1", "g", "G", "é"], &random)
        default: return "b809ce7f-53cb-40bc-89aa-e00a0a03bc4a"  // the caller, in the REST dialect
        }
    }

    static func stringBody(_ random: inout Generator, length: Int) -> String {
        let pieces = [
            "a", "Z", "_", "é", "€", "😀", #"\n"#, #"\""#, #"\\"#, #"\/"#, #"\u00e9"#, #"\ud83d\ude00"#, #"\u0041"#, " ",
            #"\t"#, #"\b"#, #"\f"#, #"\r"#,
        ]
        var text = ""
        for _ in 0..<length { text += pick(pieces, &random) }
        if random.next() % 40 == 0 { text += pick([#"\u0000"#, #"\udfff"#, #"\ud83d"#, #"\ud83dx"#], &random) }
        return text
    }

    static func number(_ random: inout Generator) -> String {
        pick(
            [
                "0", "-0", "7", "12.5", "-3.25", "1e3", "1E-3", "2.5e+10", "1e308", "1e400", "1e-400", "0.0", "-0.000",
                String(repeating: "9", count: 40), String(repeating: "9", count: 41),
                "0." + String(repeating: "0", count: 37) + "1",
                "123456789012345678901234567890", "0e999999", "4.9e-324", "1.7976931348623157e308",
            ], &random)
    }

    static func value(_ random: inout Generator, depth: Int) -> String {
        switch random.next() % (depth > 3 ? 5 : 8) {
        case 0: return number(&random)
        case 1: return "\"" + stringBody(&random, length: Int(random.next() % 6)) + "\""
        case 2: return pick(["true", "false", "null"], &random)
        case 3: return "\"" + stringBody(&random, length: 1) + "\""
        case 4: return number(&random)
        case 5, 6:
            let count = Int(random.next() % 4)
            let members = (0..<count).map { _ in
                "\"" + stringBody(&random, length: Int(random.next() % 3)) + "\" : " + value(&random, depth: depth + 1)
            }
            return "{" + members.joined(separator: ", ") + "}"
        default:
            let count = Int(random.next() % 4)
            return "[" + (0..<count).map { _ in value(&random, depth: depth + 1) }.joined(separator: ",") + "]"
        }
    }

    static func memberValue(_ key: String, _ random: inout Generator) -> String {
        if random.next() % 8 == 0 { return value(&random, depth: 2) }
        switch key {
        case #""client_id""#, #""client\u005fid""#, #""user_id""#: return "\"" + uuidText(&random) + "\""
        case #""type""#, #""typ\u0065""#:
            let length = pick([0, 1, 5, 127, 128, 129], &random)
            return "\"" + stringBody(&random, length: length) + "\""
        case #""payload""#, #""\u0070ayload""#:
            return random.next() % 6 == 0
                ? pick(["null", "[]", "3"], &random) : "{\"k\": " + value(&random, depth: 1) + "}"
        case #""client_timestamp""#:
            return "\""
                + pick(
                    [
                        "2026-11-22T04:10:02.123Z", "2026-11-22t04:10:02z", "2026-11-22 04:10:02+02:00",
                        "2026-11-22T04:10:02",
                        #"2026-11-22T04:10:02\u002e5Z"#, "2026-02-30T00:00:00Z", "0000-01-01T00:00:00Z", "now",
                        "2026-11-22T04:10:02.1234567891Z", "9999-12-31T23:59:59.999999-01:00",
                    ], &random) + "\""
        default: return value(&random, depth: 2)
        }
    }

    static func event(_ random: inout Generator) -> String {
        if random.next() % 20 == 0 { return value(&random, depth: 2) }
        var members: [String] = []
        for key in [#""client_id""#, #""type""#, #""payload""#, #""client_timestamp""#] where random.next() % 12 != 0 {
            members.append(key + ":" + memberValue(key, &random))
        }
        for _ in 0..<Int(random.next() % 3) {
            let key = pick(keys, &random)
            members.insert(key + ":" + memberValue(key, &random), at: Int(random.next() % UInt64(members.count + 1)))
        }
        return "{" + members.joined(separator: random.next() % 2 == 0 ? "," : " ,\n ") + "}"
    }

    static func body(_ random: inout Generator) -> String {
        var text = "[" + (0..<Int(random.next() % 4 + 1)).map { _ in event(&random) }.joined(separator: ",") + "]"
        if random.next() % 25 == 0 {  // not JSON: cut short, or a stray byte
            let bytes = Array(text.utf8)
            let cut = Int(random.next() % UInt64(bytes.count))
            text = String(decoding: bytes[..<cut], as: UTF8.self) + pick(["", "}", ",", "\u{7}", "\"x"], &random)
        }
        return text
    }

    func testTheDecoderDecidesAsTheOneBeforeIt() {
        var random = Generator(state: 2026)
        let caller = UUID(uuidString: "b809ce7f-53cb-40bc-89aa-e00a0a03bc4a") ?? UUID()
        let now = PostgresTimestamp(microsecondsSinceEpoch: 1_795_727_612_000_000)
        let dialects: [EventInput.Dialect] = [
            .native, .rest(caller: caller, columns: nil, now: now),
            .rest(caller: caller, columns: ["client_id", "type", "payload", "user_id"], now: now),
        ]
        var kinds = (events: 0, problems: 0, refusals: 0, failures: 0)
        for round in 0..<3000 {
            let body = Array(Self.body(&random).utf8)
            for dialect in dialects {
                let current = Self.current(body, dialect)
                let reference = Self.reference(body, dialect)
                XCTAssertEqual(current, reference, "round \(round): \(String(decoding: body, as: UTF8.self))")
                kinds.events += current.events.count
                kinds.problems += current.problems.count
                kinds.refusals += current.refusal == nil ? 0 : 1
                kinds.failures += current.failure == nil ? 0 : 1
            }
        }
        // The bodies reach every outcome, many times.
        XCTAssertGreaterThan(kinds.events, 1000)
        XCTAssertGreaterThan(kinds.problems, 1000)
        XCTAssertGreaterThan(kinds.refusals, 100)
        XCTAssertGreaterThan(kinds.failures, 100)
    }

    /// The push body as a whole: the native dialect behind `PushRequest`, with its own keys
    /// matched as bytes (`"events"`, escaped or not).
    func testThePushBodyKeyIsMatchedWithItsEscapes() {
        let event =
            #"{"client_id":"6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b10","type":"t","payload":{},"client_timestamp":"2026-11-22T04:10:02Z"}"#
        for key in [#""events""#, #""\u0065vents""#, #""even\u0074s""#] {
            guard case .events(let events) = PushRequest.parse(Array(#"{\#(key):[\#(event)]}"#.utf8)) else {
                XCTFail("\(key) is \"events\"")
                continue
            }
            XCTAssertEqual(events.count, 1)
        }
        for key in [#""Events""#, #""events ""#, #""event""#, #""""#] {
            guard case .malformed(let reason) = PushRequest.parse(Array(#"{\#(key):[\#(event)]}"#.utf8)) else {
                XCTFail("\(key) is not \"events\"")
                continue
            }
            XCTAssertTrue(reason.contains("needs an \"events\" array"), reason)
        }
    }
}
