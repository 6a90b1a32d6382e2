import Foundation
import Postgres
import TestSupport
import XCTest

/// The JSON rules on every route that takes JSON: values that cannot be stored or that do
/// not fit a double are a `400` naming the field, the same on the native push and the REST
/// insert, and nothing is stored; numbers that fit come back as the same number.
final class JSONInputTests: XCTestCase {
    var app: AppHarness!
    var token = ""

    override func setUp() async throws {
        app = try await AppHarness()
        token = try await app.token("json@example.com")
    }

    override func tearDown() async throws { await app.stop() }

    func event(payload: String, type: String = #""t""#) -> String {
        #"{"client_id":"\#(UUID())","type":\#(type),"payload":\#(payload),"client_timestamp":"2026-11-22T04:10:02.123Z"}"#
    }

    /// Pushes `eventJSON` natively and inserts it through REST; both must answer 400 naming
    /// `field` (index 0), and store nothing.
    func assertRefusedOnBothRoutes(
        _ eventJSON: String, field: String, file: StaticString = #filePath, line: UInt = #line
    ) async throws {
        let native = try await app.request(
            "POST", "/sync/v1/events", rawBody: #"{"events":[\#(eventJSON)]}"#, bearer: token)
        let rest = try await app.request("POST", "/rest/v1/events", rawBody: eventJSON, bearer: token)
        for (name, response) in [("native", native), ("REST", rest)] {
            XCTAssertEqual(response.status, 400, "\(name): \(response.text)", file: file, line: line)
            XCTAssertEqual(
                response.json["code"] as? String, "validation_failed", "\(name): \(response.text)", file: file,
                line: line)
            let details = response.json["details"] as? [[String: Any]]
            XCTAssertEqual(
                details?.first?["field"] as? String, field, "\(name): \(response.text)", file: file, line: line)
            XCTAssertEqual(details?.first?["index"] as? Int, 0, "\(name): \(response.text)", file: file, line: line)
            XCTAssertFalse((details?.first?["reason"] as? String ?? "").isEmpty, file: file, line: line)
        }
        XCTAssertEqual(
            rest.headers["proxy-status"], "PostgREST; error=validation_failed", "REST keeps PostgREST's shape",
            file: file,
            line: line)
        let stored = try app.owner().query("select count(*) from events")[0].decode(Int.self, column: 0)
        XCTAssertEqual(stored, 0, "nothing stored", file: file, line: line)
    }

    func testNumbersOutsideADoubleAreRefusedOnBothRoutes() async throws {
        for number in [
            "1e400", "1e99999", "-1e99999", String(repeating: "7", count: 400),
            "0." + String(repeating: "3", count: 500) + "e-16000",
            "1e-400",
        ] {
            try await assertRefusedOnBothRoutes(event(payload: #"{"x":\#(number)}"#), field: "payload")
        }
    }

    func testStringsJsonbCannotStoreAreRefusedOnBothRoutes() async throws {
        try await assertRefusedOnBothRoutes(event(payload: #"{"x":"a\u0000b"}"#), field: "payload")
        try await assertRefusedOnBothRoutes(event(payload: #"{"x":"\ud800"}"#), field: "payload")
        try await assertRefusedOnBothRoutes(event(payload: #"{"x\u0000":1}"#), field: "payload")
        try await assertRefusedOnBothRoutes(event(payload: "{}", type: #""t\u0000""#), field: "type")
        try await assertRefusedOnBothRoutes(event(payload: "{}", type: #""\udc00""#), field: "type")
    }

    func testPayloadsThatAreNotObjectsAreRefusedOnBothRoutes() async throws {
        for payload in ["[1,2]", "5", #""{}""#, "true"] {
            try await assertRefusedOnBothRoutes(event(payload: payload), field: "payload")
        }
    }

    func testUUIDsAreParsedStrictly() async throws {
        for id in [
            "6f1f0e3c11114c3e9d7a3a1c8f0f2b10", "{6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b10}",
            "6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b1g",
        ] {
            let body = #"{"client_id":"\#(id)","type":"t","payload":{},"client_timestamp":"2026-11-22T04:10:02Z"}"#
            try await assertRefusedOnBothRoutes(body, field: "client_id")
        }
    }

    /// A payload's limit counts it as stored and returned: a short number can print as
    /// hundreds of digits, so 24 KB of `1e308` would otherwise make megabytes of pull.
    func testPayloadLimitCountsNumbersAsPostgresPrintsThem() async throws {
        let numbers = Array(repeating: "1e308", count: 300).joined(separator: ",")  // 1.8 KB written, ~93 KB printed
        try await assertRefusedOnBothRoutes(event(payload: #"{"n":[\#(numbers)]}"#), field: "payload")
        let fits = Array(repeating: "1e308", count: 150).joined(separator: ",")  // ~47 KB printed
        let pushed = try await app.request(
            "POST", "/sync/v1/events", rawBody: #"{"events":[\#(event(payload: #"{"n":[\#(fits)]}"#))]}"#, bearer: token
        )
        XCTAssertEqual(pushed.status, 200, pushed.text)
        let pulled = try await app.request("GET", "/sync/v1/events", bearer: token)
        XCTAssertLessThan(pulled.body.count, 64 * 1024 + 1024, "the answer stays within the payload limit")
    }

    func testNumbersThatFitComeBackAsTheSameNumber() async throws {
        let payload = #"{"max":1e308,"negzero":-0,"min":5e-324,"half":1.5,"big":12345678901234567890,"neg":-2.5e-3}"#
        let expected: [String: Double] = [
            // The nearest doubles to 5e-324 and 12345678901234567890, written so that the
            // compiler needs no rounding (and warns of none).
            "max": 1e308, "negzero": -0.0, "min": .leastNonzeroMagnitude, "half": 1.5, "big": 12345678901234567168,
            "neg": -2.5e-3,
        ]
        let native = try await app.request(
            "POST", "/sync/v1/events", rawBody: #"{"events":[\#(event(payload: payload))]}"#, bearer: token)
        XCTAssertEqual(native.status, 200, native.text)
        let rest = try await app.request("POST", "/rest/v1/events", rawBody: event(payload: payload), bearer: token)
        XCTAssertEqual(rest.status, 201, rest.text)

        let pulled = try await app.request("GET", "/sync/v1/events", bearer: token)
        let selected = try await app.request("GET", "/rest/v1/events?select=payload", bearer: token)
        let pulledPayloads =
            (pulled.json["events"] as? [[String: Any]])?.compactMap { $0["payload"] as? [String: Any] } ?? []
        let selectedPayloads =
            (try JSONSerialization.jsonObject(with: selected.body) as? [[String: Any]])?.compactMap {
                $0["payload"] as? [String: Any]
            } ?? []
        XCTAssertEqual(pulledPayloads.count, 2, pulled.text)
        XCTAssertEqual(selectedPayloads.count, 2, selected.text)
        for returned in pulledPayloads + selectedPayloads {
            for (key, value) in expected {
                let number = try XCTUnwrap(returned[key] as? NSNumber, key).doubleValue
                XCTAssertEqual(number, value, key)
            }
        }
    }

    func testUserMetadataFollowsTheSameRules() async throws {
        for body in [#"{"data":{"full_name":"a\u0000b"}}"#, #"{"data":{"n":1e400}}"#, #"{"data":{"x":"\ud800"}}"#] {
            let response = try await app.request("PUT", "/auth/v1/user", rawBody: body, bearer: token)
            XCTAssertEqual(response.status, 400, response.text)
            XCTAssertEqual(response.json["code"] as? String, "validation_failed", response.text)
            XCTAssertTrue((response.json["message"] as? String ?? "").hasPrefix("data."), response.text)
        }
        let metadata = try app.owner().query("select user_metadata::text, full_name from users")[0]
        XCTAssertEqual(try metadata.decode(String.self, column: 0), "{}", "nothing changed")
        XCTAssertNil(try metadata.decode(String?.self, column: 1))
    }
}
