import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

final class SyncTests: XCTestCase {
    var app: AppHarness!

    override func setUp() async throws { app = try await AppHarness() }
    override func tearDown() async throws { await app.stop() }

    static func event(_ id: UUID = UUID(), type: String = "sprout_planted", payload: Any = ["n": 1]) -> [String: Any] {
        ["client_id": id.uuidString, "type": type, "payload": payload, "client_timestamp": "2026-11-22T04:10:02.123Z"]
    }

    func push(_ events: [[String: Any]], token: String) async throws -> AppHarness.Response {
        try await app.request("POST", "/sync/v1/events", json: ["events": events], bearer: token)
    }

    func pull(_ query: String, token: String) async throws -> AppHarness.Response {
        try await app.request("GET", "/sync/v1/events?" + query, bearer: token)
    }

    func eventCount() throws -> Int {
        try app.owner().query("select count(*) from events")[0].decode(Int.self, column: 0)
    }

    func testPushThenPullKeepsPayloadAndClientID() async throws {
        let token = try await app.token("a@example.com")
        let id = UUID()
        let payload: [String: Any] = [
            "text": "ünïcødé 🌱 \"quoted\" \\ back",
            "nested": ["list": [1, 2.5, -3, true, NSNull()], "deep": ["x": ["y": "z"]]],
            "big": 12_345_678_901_234, "small": -0.000123,
        ]
        let pushed = try await push([Self.event(id, payload: payload)], token: token)
        XCTAssertEqual(pushed.status, 200, pushed.text)
        XCTAssertEqual(pushed.json["accepted"] as? Int, 1)
        XCTAssertEqual(pushed.json["duplicates"] as? Int, 0)
        let results = try XCTUnwrap(pushed.json["results"] as? [[String: Any]])
        XCTAssertEqual(results.first?["status"] as? String, "created")
        XCTAssertEqual(results.first?["seq"] as? Int, 1)
        XCTAssertEqual(results.first?["client_id"] as? String, id.uuidString.lowercased())

        let pulled = try await pull("after=0", token: token)
        XCTAssertEqual(pulled.status, 200)
        let events = try XCTUnwrap(pulled.json["events"] as? [[String: Any]])
        XCTAssertEqual(events.count, 1)
        let event = events[0]
        XCTAssertEqual(event["client_id"] as? String, id.uuidString.lowercased())
        XCTAssertEqual(event["type"] as? String, "sprout_planted")
        XCTAssertEqual(event["seq"] as? Int, 1)
        XCTAssertEqual(event["payload"] as? NSDictionary, payload as NSDictionary)
        XCTAssertNotNil(UUID(uuidString: event["id"] as? String ?? ""))
        XCTAssertEqual(event["client_timestamp"] as? String, "2026-11-22T04:10:02.123000Z")
        let created = try XCTUnwrap(event["created_at"] as? String)
        XCTAssertNotNil(RFC3339.parse(created))
        XCTAssertEqual(pulled.json["next_after"] as? Int, 1)
        XCTAssertEqual(pulled.json["has_more"] as? Bool, false)
    }

    /// What the database stores is the payload exactly as written (PostgreSQL's `jsonb` of
    /// its bytes), the `type` with its escapes decoded: the push decoder hands over the
    /// payload's bytes, never a re-encoding.
    func testStoredRowsAreThePayloadBytesAsWrittenAndTheDecodedType() async throws {
        let token = try await app.token("bytes@example.com")
        let payloads = [
            #"{"a":1}"#, #" { "s" : "\u00e9\n\"\\\/\ud83d\ude00 é 🌱" , "n" : [ 1e3, -0.5E-2, 12.50, 0, -0 ] } "#,
            #"{"deep":{"x":[{"y":null},true,false,"\u0041"]},"b":"last","b":"again"}"#,
            #"{"big":123456789012345678901234567890,"tiny":1e-300}"#,
        ]
        let types = [#""plain""#, #""\u0074ype \u00e9\ud83c\udf31""#, #""tab\there""#, #""é🌱""#]
        let ids = payloads.map { _ in UUID() }
        let events = zip(ids, zip(types, payloads)).map { id, pair in
            #"{"client_id":"\#(id)","type":\#(pair.0),"payload":\#(pair.1),"client_timestamp":"2026-11-22T04:10:02.123456Z"}"#
        }
        let pushed = try await app.request(
            "POST", "/sync/v1/events", rawBody: #"{"events":[\#(events.joined(separator: ","))]}"#, bearer: token)
        XCTAssertEqual(pushed.status, 200, pushed.text)
        let owner = try app.owner()
        for (index, id) in ids.enumerated() {
            let row = try owner.query(
                """
                select payload::text = $2::jsonb::text, payload::text, type = ($3::json #>> '{}'), type,
                       client_timestamp = '2026-11-22T04:10:02.123456Z'
                from events where client_id = $1
                """, id, payloads[index], types[index])[0]
            let stored = try row.decode(String.self, column: 1)
            let type = try row.decode(String.self, column: 3)
            XCTAssertEqual(try row.decode(Bool.self, column: 0), true, stored)
            XCTAssertEqual(try row.decode(Bool.self, column: 2), true, type)
            XCTAssertEqual(try row.decode(Bool.self, column: 4), true)
        }
    }

    func testANumberPostgresCannotKeepIsRefusedBeforeTheBatchIsStored() async throws {
        let token = try await app.token("numbers@example.com")
        func body(_ payloads: [String]) -> String {
            let events = payloads.map {
                #"{"client_id":"\#(UUID())","type":"n","payload":\#($0),"client_timestamp":"2026-11-22T04:10:02Z"}"#
            }
            return #"{"events":[\#(events.joined(separator: ","))]}"#
        }
        // PostgreSQL keeps at most 16383 digits after the point: one more would fail the
        // insert (and the whole batch) with a database error on every retry.
        let refused = try await app.request(
            "POST", "/sync/v1/events", rawBody: body([#"{"a":1}"#, #"{"z":0e-16384}"#]), bearer: token)
        XCTAssertEqual(refused.status, 400, refused.text)
        let details = refused.json["details"] as? [[String: Any]]
        XCTAssertEqual(details?.first?["index"] as? Int, 1, refused.text)
        XCTAssertEqual(details?.first?["field"] as? String, "payload", refused.text)
        XCTAssertEqual(try eventCount(), 0)
        let kept = try await app.request(
            "POST", "/sync/v1/events", rawBody: body([#"{"z":0e-16383}"#, #"{"z":-0e99999}"#]), bearer: token)
        XCTAssertEqual(kept.status, 200, kept.text)
        let lengths = try app.owner().query(
            "select length(payload->>'z') from events where type = 'n' order by seq")
        XCTAssertEqual(try lengths.map { try $0.decode(Int.self, column: 0) }, [16385, 1])
    }

    func testDuplicatesAcrossAndWithinBatches() async throws {
        let token = try await app.token("d@example.com")
        let (a, b, c) = (UUID(), UUID(), UUID())
        let first = try await push([Self.event(a), Self.event(b)], token: token)
        XCTAssertEqual(first.json["accepted"] as? Int, 2)
        let second = try await push([Self.event(b), Self.event(c), Self.event(c), Self.event(a)], token: token)
        XCTAssertEqual(second.status, 200)
        XCTAssertEqual(second.json["accepted"] as? Int, 1)
        XCTAssertEqual(second.json["duplicates"] as? Int, 3)
        let results = try XCTUnwrap(second.json["results"] as? [[String: Any]])
        XCTAssertEqual(results.map { $0["status"] as? String }, ["duplicate", "created", "duplicate", "duplicate"])
        XCTAssertEqual(results.map { $0["seq"] as? Int }, [2, 3, 3, 1])
        XCTAssertEqual(try eventCount(), 3)
    }

    func testARetriedBatchWithNewEventsLeavesNoGapInSeqOrTime() async throws {
        // The push first inserts without looking repeats up; a repeat sends it back for a
        // second attempt that must leave no trace of the first.
        let token = try await app.token("r@example.com")
        let old = (0..<3).map { _ in UUID() }
        let new = (0..<3).map { _ in UUID() }
        let first = try await push(old.map { Self.event($0) }, token: token)
        XCTAssertEqual(first.json["accepted"] as? Int, 3)
        let mixed = try await push([new[0], old[1], new[1], old[2], new[2]].map { Self.event($0) }, token: token)
        XCTAssertEqual(mixed.status, 200, mixed.text)
        let results = try XCTUnwrap(mixed.json["results"] as? [[String: Any]])
        XCTAssertEqual(results.map { $0["seq"] as? Int }, [4, 2, 5, 3, 6])
        XCTAssertEqual(
            results.map { $0["status"] as? String }, ["created", "duplicate", "created", "duplicate", "created"])
        let next = try await push([Self.event()], token: token)
        XCTAssertEqual((next.json["results"] as? [[String: Any]])?.first?["seq"] as? Int, 7)
        let rows = try app.owner().query(
            """
            select e.seq, e.created_at, u.last_seq from events e join users u on u.id = e.user_id
            where u.email = 'r@example.com' order by e.seq
            """)
        XCTAssertEqual(try rows.map { try $0.decode(Int.self, column: 0) }, Array(1...7))
        XCTAssertEqual(try rows[0].decode(Int.self, column: 2), 7)
        let times = try rows.map { try $0.decode(PostgresTimestamp.self, column: 1).microsecondsSinceEpoch }
        XCTAssertTrue(zip(times, times.dropFirst()).allSatisfy { $1 - $0 >= 1000 }, "\(times)")
    }

    func testEveryValidationFailureIs400WithDetailsAndStoresNothing() async throws {
        let token = try await app.token("v@example.com")
        let good = Self.event()
        var missing = Self.event()
        missing.removeValue(forKey: "type")
        let bigPayload = ["blob": String(repeating: "x", count: 70_000)]
        let cases: [(body: String, code: String, field: String?)] = [
            (
                #"{"events":[{"client_id":"nope","type":"t","payload":{},"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "client_id"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"","payload":{},"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "type"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"\#(String(repeating: "t", count: 129))","payload":{},"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "type"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":[1],"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "payload"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":"{}","client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "payload"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":{},"client_timestamp":"now"}]}"#,
                "validation_failed", "client_timestamp"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":{},"client_timestamp":"2026-02-30T00:00:00Z"}]}"#,
                "validation_failed", "client_timestamp"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":{},"client_timestamp":"infinity"}]}"#,
                "validation_failed", "client_timestamp"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":7,"payload":{},"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "type"
            ),
            (#"{"events":[42]}"#, "validation_failed", ""),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":{"a":"\u0000"},"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "payload"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":{"a":"\ud800"},"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "payload"
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":{"a":1e999999},"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "validation_failed", "payload"
            ),
            (#"{"events":[]}"#, "invalid_json", nil),
            (#"{"events":{}}"#, "invalid_json", nil),
            (#"{}"#, "invalid_json", nil),
            (#"[]"#, "invalid_json", nil),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":{},"client_timestamp":"2026-11-22T04:10:02Z"}]} trailing"#,
                "invalid_json", nil
            ),
            (
                #"{"events":[{"client_id":"\#(UUID())","type":"t","payload":{"a":tru},"client_timestamp":"2026-11-22T04:10:02Z"}]}"#,
                "invalid_json", nil
            ),
            ("not json at all", "invalid_json", nil),
            ("", "invalid_json", nil),
        ]
        for testCase in cases {
            let response = try await app.request("POST", "/sync/v1/events", rawBody: testCase.body, bearer: token)
            XCTAssertEqual(response.status, 400, String(testCase.body.prefix(120)))
            XCTAssertEqual(response.json["code"] as? String, testCase.code, response.text)
            XCTAssertNotNil(response.json["message"] as? String)
            if let field = testCase.field {
                let details = response.json["details"] as? [[String: Any]]
                XCTAssertEqual(details?.first?["field"] as? String, field, response.text)
                XCTAssertEqual(details?.first?["index"] as? Int, 0, response.text)
            }
        }
        // One bad event among good ones rejects the whole batch, naming each bad index.
        let mixed = try await push(
            [good, missing, Self.event(), ["client_id": "x"], Self.event(payload: bigPayload)], token: token)
        XCTAssertEqual(mixed.status, 400)
        let details = try XCTUnwrap(mixed.json["details"] as? [[String: Any]])
        XCTAssertEqual(Set(details.compactMap { $0["index"] as? Int }), [1, 3, 4])
        XCTAssertTrue(details.contains { $0["index"] as? Int == 1 && $0["field"] as? String == "type" })
        XCTAssertTrue(details.contains { $0["index"] as? Int == 4 && $0["field"] as? String == "payload" })
        let tooMany = try await push((0..<1001).map { _ in Self.event() }, token: token)
        XCTAssertEqual(tooMany.status, 400)
        // Nor past the limit in two arrays under one key repeated.
        let eventJSON = { String(decoding: try JSONSerialization.data(withJSONObject: Self.event()), as: UTF8.self) }
        let half = try (0..<600).map { _ in try eventJSON() }.joined(separator: ",")
        let twice = try await app.request(
            "POST", "/sync/v1/events", rawBody: #"{"events":[\#(half)],"events":[\#(half)]}"#, bearer: token)
        XCTAssertEqual(twice.status, 400, twice.text)
        XCTAssertEqual(twice.json["code"] as? String, "invalid_json", twice.text)
        XCTAssertEqual(try eventCount(), 0)
    }

    func testAnotherUserNeverSeesOrChangesTheseEvents() async throws {
        let alice = try await app.token("alice@example.com")
        let bob = try await app.token("bob@example.com")
        let shared = UUID()
        _ = try await push([Self.event(shared, payload: ["owner": "alice"]), Self.event()], token: alice)
        let bobPull = try await pull("after=0", token: bob)
        XCTAssertEqual((bobPull.json["events"] as? [Any])?.count, 0)
        // Bob pushing the same client_id makes his own event and leaves Alice's alone.
        let bobPush = try await push([Self.event(shared, payload: ["owner": "bob"])], token: bob)
        XCTAssertEqual(bobPush.json["accepted"] as? Int, 1)
        let aliceEvents = try await pull("after=0", token: alice).json["events"] as? [[String: Any]]
        XCTAssertEqual(aliceEvents?.count, 2)
        XCTAssertEqual((aliceEvents?.first?["payload"] as? [String: Any])?["owner"] as? String, "alice")
        let bobEvents = try await pull("after=0", token: bob).json["events"] as? [[String: Any]]
        XCTAssertEqual(bobEvents?.count, 1)
        XCTAssertEqual(bobEvents?.first?["seq"] as? Int, 1, "each user has a sequence of their own")
    }

    func testTokensAreRequired() async throws {
        let token = try await app.token("t@example.com")
        for bad in [nil, "garbage", String(token.dropLast(2))] {
            let pushed = try await app.request("POST", "/sync/v1/events", json: ["events": [Self.event()]], bearer: bad)
            XCTAssertEqual(pushed.status, 401)
            XCTAssertEqual(pushed.json["code"] as? String, "unauthorized")
            let pulled = try await app.request("GET", "/sync/v1/events", bearer: bad)
            XCTAssertEqual(pulled.status, 401)
        }
        XCTAssertEqual(try eventCount(), 0)
    }

    func testBadPullParametersAre400() async throws {
        let token = try await app.token("p@example.com")
        for query in [
            "after=-1", "after=x", "limit=0", "limit=1001", "wait=61", "wait=-1", "after=1&after=2", "cursor=1",
            "limit=1.5",
        ] {
            let response = try await pull(query, token: token)
            XCTAssertEqual(response.status, 400, query)
            XCTAssertEqual(response.json["code"] as? String, "invalid_parameter", query)
        }
    }

    func testPagesFollowTheCursorWithStrictlyIncreasingTimes() async throws {
        let token = try await app.token("page@example.com")
        for _ in 0..<3 { _ = try await push((0..<4).map { _ in Self.event() }, token: token) }
        var cursor = 0
        var seen: [Int] = []
        var times: [String] = []
        while true {
            let page = try await pull("after=\(cursor)&limit=5", token: token)
            let events = try XCTUnwrap(page.json["events"] as? [[String: Any]])
            seen += events.compactMap { $0["seq"] as? Int }
            times += events.compactMap { $0["created_at"] as? String }
            cursor = try XCTUnwrap(page.json["next_after"] as? Int)
            if page.json["has_more"] as? Bool != true { break }
            XCTAssertEqual(events.count, 5)
        }
        XCTAssertEqual(seen, Array(1...12))
        let micros = times.compactMap { RFC3339.parse($0)?.microsecondsSinceEpoch }
        XCTAssertEqual(micros.count, 12)
        for (earlier, later) in zip(micros, micros.dropFirst()) {
            XCTAssertGreaterThanOrEqual(later - earlier, 1000, "consecutive events differ by at least 1 ms")
            XCTAssertEqual(later % 1000, 0, "whole milliseconds")
        }
    }

    /// A page is cut at ~1 MiB of events whatever `limit` asks for (`EventStore.pullPageBytes`):
    /// 1,000 events of 64 KiB were one 64 MB answer, held while a client did not read it.
    /// The cut page says `has_more`, and following `next_after` gets every event once.
    func testAPullPageIsCutAtAMegabyteAndTheCursorGetsTheRest() async throws {
        let token = try await app.token("bigpage@example.com")
        let filler = String(repeating: "x", count: 60_000)
        let pushed = try await push((0..<40).map { _ in Self.event(payload: ["f": filler]) }, token: token)
        XCTAssertEqual(pushed.status, 200, pushed.text)
        var cursor = 0
        var seen: [Int] = []
        var pages = 0
        while true {
            let page = try await pull("after=\(cursor)&limit=1000", token: token)
            XCTAssertEqual(page.status, 200, page.text)
            XCTAssertLessThan(
                page.body.count, EventStore.pullPageBytes + 70_000, "one page of \(page.body.count) bytes")
            let events = try XCTUnwrap(page.json["events"] as? [[String: Any]])
            XCTAssertFalse(events.isEmpty)
            seen += events.compactMap { $0["seq"] as? Int }
            cursor = try XCTUnwrap(page.json["next_after"] as? Int)
            XCTAssertEqual(cursor, seen.last)
            pages += 1
            if page.json["has_more"] as? Bool != true { break }
        }
        XCTAssertEqual(seen, Array(1...40))
        XCTAssertGreaterThan(pages, 2)
    }

    /// Several writers push for one user while a reader follows the cursor: the reader gets
    /// every event exactly once. A bigserial or now() cursor fails this.
    func testConcurrentWritersAndAFollowingReaderLoseNothing() async throws {
        let token = try await app.token("race@example.com")
        let writers = 4
        let batches = 15
        let perBatch = 10
        let harness: AppHarness = app
        let total = writers * batches * perBatch
        let reader = Task { () -> [String] in
            var cursor = 0
            var received: [String] = []
            let deadline = Date().addingTimeInterval(60)
            while received.count < total, Date() < deadline {
                let page = try await harness.request("GET", "/sync/v1/events?after=\(cursor)&limit=37", bearer: token)
                let events = page.json["events"] as? [[String: Any]] ?? []
                received += events.compactMap { $0["client_id"] as? String }
                cursor = page.json["next_after"] as? Int ?? cursor
            }
            return received
        }
        let pushed = try await withThrowingTaskGroup(of: [String].self) { group in
            for _ in 0..<writers {
                group.addTask {
                    var ids: [String] = []
                    for _ in 0..<batches {
                        let events = (0..<perBatch).map { _ in Self.event() }
                        ids += events.compactMap { ($0["client_id"] as? String)?.lowercased() }
                        let response = try await harness.request(
                            "POST", "/sync/v1/events", json: ["events": events], bearer: token)
                        guard response.status == 200 else {
                            throw TestEnvironmentError("push failed: \(response.text)")
                        }
                    }
                    return ids
                }
            }
            return try await group.reduce(into: [String]()) { $0 += $1 }
        }
        let received = try await reader.value
        XCTAssertEqual(received.count, total, "every event arrives exactly once")
        XCTAssertEqual(Set(received).count, total)
        XCTAssertEqual(Set(received), Set(pushed))
        let seqs = try app.owner().query("select seq from events order by seq").map {
            try $0.decode(Int.self, column: 0)
        }
        XCTAssertEqual(seqs, Array(1...total), "no gaps")
    }

    func testLongPollWakesOnAPushThroughASecondInstance() async throws {
        let second = try await AppHarness(sharing: app)
        let token = try await app.token("lp@example.com")
        let waiting = Task { [app] in
            try await app!.request("GET", "/sync/v1/events?after=0&wait=30", bearer: token)
        }
        // The poll is registered when the first instance counts a waiter.
        let deadline = Date().addingTimeInterval(10)
        while app.application.notifier.waiting == 0, Date() < deadline { try await Task.sleep(for: .milliseconds(5)) }
        XCTAssertEqual(app.application.notifier.waiting, 1)
        let pushedAt = Date()
        let pushed = try await second.request(
            "POST", "/sync/v1/events", json: ["events": [Self.event()]], bearer: token)
        XCTAssertEqual(pushed.status, 200)
        let response = try await waiting.value
        // Woken by the push, not by the poll's 30 s running out: a bound far from both, which
        // a loaded machine keeps (the wake-up latency itself is a figure for bench/).
        XCTAssertLessThan(Date().timeIntervalSince(pushedAt), 10)
        XCTAssertEqual((response.json["events"] as? [Any])?.count, 1)
        await second.stop()
    }

    func testLongPollTimesOutWithAnEmptyPageAndShutdownAnswersAtOnce() async throws {
        let token = try await app.token("quiet@example.com")
        let started = Date()
        let empty = try await pull("after=0&wait=1", token: token)
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.9)
        XCTAssertEqual(empty.status, 200)
        XCTAssertEqual((empty.json["events"] as? [Any])?.count, 0)
        XCTAssertEqual(empty.json["next_after"] as? Int, 0)
        let harness: AppHarness = app
        let waiting = Task { try await harness.request("GET", "/sync/v1/events?after=0&wait=60", bearer: token) }
        while app.application.notifier.waiting == 0 { try await Task.sleep(for: .milliseconds(5)) }
        let shutdownAt = Date()
        app.application.beginShutdown()
        let answered = try await waiting.value
        // Answered by the shutdown, not by the poll's 60 s (a bound a loaded machine keeps).
        XCTAssertLessThan(Date().timeIntervalSince(shutdownAt), 10)
        XCTAssertEqual(answered.status, 200)
        XCTAssertEqual((answered.json["events"] as? [Any])?.count, 0)
    }
}

final class SyncPoolTests: XCTestCase {
    func testPoolExhaustionAnswers503WithRetryAfterAndRecovers() async throws {
        // One loop: its pool share is the one connection (with N loops each loop has one).
        let app = try await AppHarness(environment: [
            "TRUNK_SYNC_DB_POOL_SIZE": "1", "TRUNK_SYNC_DB_POOL_TIMEOUT": "0.3", "TRUNK_SYNC_EVENT_LOOPS": "1",
        ])
        let token = try await app.token("busy@example.com")
        // A reader with one event: its pull from the start always reads the database (an
        // empty pull may be answered from memory).
        let reader = try await app.token("reader@example.com")
        let seeded = try await app.request(
            "POST", "/sync/v1/events", json: ["events": [SyncTests.event()]], bearer: reader)
        XCTAssertEqual(seeded.status, 200)
        // Block the only connection: a push waits for the user's row lock held here.
        let blocker = try app.owner()
        try blocker.execute("begin")
        try blocker.query("select 1 from users for update")
        let harness: AppHarness = app
        let stuck = Task {
            try await harness.request("POST", "/sync/v1/events", json: ["events": [SyncTests.event()]], bearer: token)
        }
        var busy: AppHarness.Response? = nil
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            let response = try await app.request("GET", "/sync/v1/events?after=0", bearer: reader)
            if response.status == 503 {
                busy = response
                break
            }
        }
        XCTAssertEqual(busy?.json["code"] as? String, "database_busy")
        XCTAssertEqual(busy?.headers["retry-after"], "1")
        try blocker.execute("commit")
        let unblocked = try await stuck.value
        XCTAssertEqual(unblocked.status, 200)
        let recovered = try await app.request("GET", "/sync/v1/events", bearer: token)
        XCTAssertEqual(recovered.status, 200)
        await app.stop()
    }
}
