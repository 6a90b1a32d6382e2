import Foundation
import JSON
import XCTest

@testable import TrunkSync

/// The push decoder on its own: the body's shape, each field's rules, problems by index.
final class PushRequestTests: XCTestCase {
    let id = "6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b10"

    func event(
        id: String? = nil, type: String = #""note""#, payload: String = #"{"text":"hi"}"#,
        timestamp: String = #""2026-11-22T04:10:02.123Z""#
    ) -> String {
        #"{"client_id":"\#(id ?? self.id)","type":\#(type),"payload":\#(payload),"client_timestamp":\#(timestamp)}"#
    }

    func parse(_ body: String) -> PushRequest.Outcome { PushRequest.parse(Array(body.utf8)) }

    func testAValidPushKeepsThePayloadBytesAsWritten() throws {
        guard
            case .events(let events) = parse(
                #"{"events":[\#(event(payload: #"{"b":1, "a":[1e308]}"#))], "extra": true}"#)
        else { return XCTFail("valid") }
        XCTAssertEqual(events.count, 1)
        XCTAssertEqual(events[0].clientID, UUID(uuidString: id))
        XCTAssertEqual(events[0].type, "note")
        XCTAssertEqual(String(decoding: events[0].payload.bytes, as: UTF8.self), #"{"b":1, "a":[1e308]}"#)
        XCTAssertEqual(RFC3339.format(events[0].clientTimestamp, fractionDigits: 3), "2026-11-22T04:10:02.123Z")
    }

    func testProblemsAreListedByIndexAndFieldAndNothingPasses() {
        let body = #"{"events":[\#(event()),\#(event(id: "x", type: "7")),{"type":"t"},42]}"#
        guard case .invalid(let problems) = parse(body) else { return XCTFail("invalid") }
        XCTAssertEqual(
            problems.map { "\($0.index) \($0.field)" },
            ["1 client_id", "1 type", "2 payload", "2 client_timestamp", "2 client_id", "3 "])
        XCTAssertTrue(problems.allSatisfy { !$0.reason.isEmpty })
    }

    func testFieldRules() {
        let cases: [(String, String)] = [
            (event(type: #""""#), "type"), (event(type: "\"" + String(repeating: "é", count: 129) + "\""), "type"),
            (event(type: #""a\u0000""#), "type"), (event(payload: "[]"), "payload"),
            (event(payload: "null"), "payload"),
            (event(payload: #"{"n":1e400}"#), "payload"), (event(payload: #"{"s":"\udfff"}"#), "payload"),
            (event(timestamp: #""2026-11-22""#), "client_timestamp"),
            (event(timestamp: "1700000000"), "client_timestamp"),
            (event(id: "6F1F0E3C-1111-4C3E-9D7A-3A1C8F0F2B1"), "client_id"),
            (
                #"{"client_id":"\#(id)","client_id":"\#(id)","type":"t","payload":{},"client_timestamp":"2026-11-22T04:10:02Z"}"#,
                "client_id"
            ),
        ]
        for (eventJSON, field) in cases {
            guard case .invalid(let problems) = parse(#"{"events":[\#(eventJSON)]}"#) else {
                XCTFail("\(eventJSON) should be invalid")
                continue
            }
            XCTAssertEqual(problems.first?.field, field, eventJSON)
        }
        // 128 characters (not bytes) is the limit; upper-case UUIDs are UUIDs.
        guard
            case .events = parse(
                #"{"events":[\#(event(id: id.uppercased(), type: "\"" + String(repeating: "é", count: 128) + "\""))]}"#)
        else { return XCTFail("128 characters are allowed") }
    }

    func testMalformedBodiesSayWhereAndWhy() {
        for body in [
            "", "[]", "{}", #"{"events":{}}"#, #"{"events":[]}"#, #"{"events":[1,]}"#, #"{"events":[]} x"#,
            "{\"events\":[",
        ] {
            guard case .malformed(let reason) = parse(body) else {
                XCTFail("\(body) is malformed")
                continue
            }
            XCTAssertFalse(reason.isEmpty, body)
        }
        let many = Array(repeating: event(), count: 1001).joined(separator: ",")
        guard case .malformed(let reason) = parse(#"{"events":[\#(many)]}"#) else { return XCTFail("1001 events") }
        XCTAssertTrue(reason.contains("at most 1000"), reason)
        // A second "events" array would restart the count: refused, whatever each holds.
        let half = Array(repeating: event(), count: 600).joined(separator: ",")
        for body in [#"{"events":[\#(half)],"events":[\#(half)]}"#, #"{"events":[\#(event())],"x":1,"events":[]}"#] {
            guard case .malformed(let reason) = parse(body) else {
                XCTFail("two \"events\" arrays")
                continue
            }
            XCTAssertTrue(reason.contains("more than once"), reason)
        }
    }

    func testPayloadLimitIsMeasuredAsStored() {
        let fits = #"{"s":""# + String(repeating: "a", count: 64 * 1024 - 9) + #""}"#  // {"s": "…"} = 65536
        guard case .events = parse(#"{"events":[\#(event(payload: fits))]}"#) else { return XCTFail("64 KiB fits") }
        let over = #"{"s":""# + String(repeating: "a", count: 64 * 1024 - 8) + #""}"#
        guard case .invalid(let problems) = parse(#"{"events":[\#(event(payload: over))]}"#) else {
            return XCTFail("one byte over")
        }
        XCTAssertEqual(problems.first?.field, "payload")
    }

    /// The push's answer, written as bytes: what JSONWriter wrote for it before.
    func testThePushResponseIsWhatJSONWriterWrites() throws {
        for results in [
            [], [EventStore.PushResult(clientID: UUID(), created: true, seq: 1)],
            (0..<100).map {
                EventStore.PushResult(clientID: UUID(), created: $0 % 3 != 0, seq: Int64($0) * 1_000_003 - 7)
            },
        ] {
            var writer = JSONWriter(capacity: 64)
            writer.beginObject()
            let created = results.filter(\.created).count
            writer.int("accepted", Int64(created))
            writer.int("duplicates", Int64(results.count - created))
            writer.beginArray("results")
            for result in results {
                writer.beginObject()
                writer.string("client_id", UUIDText.lowercase(result.clientID))
                writer.string("status", result.created ? "created" : "duplicate")
                writer.int("seq", result.seq)
                writer.endObject()
            }
            writer.endArray()
            writer.endObject()
            XCTAssertEqual(
                String(decoding: SyncRoutes.pushResponse(results), as: UTF8.self),
                String(decoding: writer.bytes, as: UTF8.self))
        }
    }
}
