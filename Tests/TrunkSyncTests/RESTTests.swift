import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

final class RESTTests: XCTestCase {
    var app: AppHarness!
    var token: String!
    var userID: String!

    override func setUp() async throws {
        app = try await AppHarness()
        let session = try await app.application.auth.issueSession(email: try XCTUnwrap(Email("rest@example.com")))
        token = session.accessToken
        userID = session.user.id.uuidString.lowercased()
    }

    override func tearDown() async throws { await app.stop() }

    func row(_ clientID: UUID = UUID(), user: String? = nil, timestamp: String = "2026-11-22T04:10:02.123Z") -> [String:
        Any]
    {
        var row: [String: Any] = [
            "type": "sprout_planted", "payload": ["a": 1], "client_id": clientID.uuidString,
            "client_timestamp": timestamp,
        ]
        row["user_id"] = user ?? userID
        return row
    }

    func insert(_ body: Any, prefer: String? = nil, query: String = "") async throws -> AppHarness.Response {
        try await app.request(
            "POST", "/rest/v1/events" + query, json: body, bearer: token, headers: prefer.map { ["Prefer": $0] } ?? [:])
    }

    func get(_ path: String, headers: [String: String] = [:], bearer: String? = nil) async throws -> AppHarness.Response
    {
        try await app.request("GET", path, bearer: bearer ?? token, headers: headers)
    }

    func assertPostgRESTError(
        _ response: AppHarness.Response, _ status: Int, _ code: String, file: StaticString = #filePath,
        line: UInt = #line
    ) {
        XCTAssertEqual(response.status, status, response.text, file: file, line: line)
        XCTAssertEqual(response.json["code"] as? String, code, response.text, file: file, line: line)
        XCTAssertNotNil(response.json["message"] as? String, file: file, line: line)
        XCTAssertTrue(
            response.json.keys.contains("details") && response.json.keys.contains("hint"), file: file, line: line)
        XCTAssertEqual(response.headers["proxy-status"], "PostgREST; error=\(code)", file: file, line: line)
    }

    /// Stores one event of each type, in order: seq 1, 2, ….
    func insertTypes(_ types: [String], line: UInt = #line) async throws {
        for type in types {
            var event = row()
            event["type"] = type
            let stored = try await insert(event)
            XCTAssertEqual(stored.status, 201, stored.text, line: line)
        }
    }

    /// Asserts the seqs of the events `query` selects, in order.
    func expectSeqs(_ query: String, _ seqs: [Int], line: UInt = #line) async throws {
        let response = try await get("/rest/v1/events?select=seq&order=seq&" + query)
        XCTAssertEqual(response.status, 200, query + " " + response.text, line: line)
        XCTAssertEqual(array(response).compactMap { $0["seq"] as? Int }, seqs, query, line: line)
    }

    func array(_ response: AppHarness.Response) -> [[String: Any]] {
        (try? JSONSerialization.jsonObject(with: response.body)) as? [[String: Any]] ?? []
    }

    /// The audit's attack: 20 events of 60 KB and `select=payload,payload,…(×900)` built a
    /// 1 GB answer. Now refused from the query string alone, and an answer holds each column
    /// once, so its size is bounded by its rows (docs/api.md: "Limits and errors").
    func testRepeatedColumnsAreRefusedAndAnswersStayWithinTheRowBound() async throws {
        let big = String(repeating: "x", count: 60_000)
        let rows: [[String: Any]] = (0..<20).map { _ in
            var event = row()
            event["payload"] = ["s": big]
            return event
        }
        let inserted = try await insert(rows)
        XCTAssertEqual(inserted.status, 201)
        let attack = try await get(
            "/rest/v1/events?select=" + Array(repeating: "payload", count: 900).joined(separator: ",") + "&limit=20")
        assertPostgRESTError(attack, 400, "PGRST100")
        XCTAssertLessThan(attack.body.count, 1024)
        let twice = try await get("/rest/v1/events?select=seq,payload,seq")
        assertPostgRESTError(twice, 400, "PGRST100")
        XCTAssertEqual(twice.json["details"] as? String, "column seq is selected more than once")
        // Every column once: at most one payload per row, plus the fixed fields.
        let all = try await get(
            "/rest/v1/events?select=id,user_id,seq,type,payload,client_id,client_timestamp,created_at&limit=20")
        XCTAssertEqual(all.status, 200)
        XCTAssertEqual(array(all).count, 20)
        XCTAssertLessThanOrEqual(all.body.count, 20 * RESTRoutes.maxEventRowBytes)
    }

    func testInsertMinimalByDefaultAndRepresentationOnRequest() async throws {
        let minimal = try await insert(row())
        XCTAssertEqual(minimal.status, 201)
        XCTAssertTrue(minimal.body.isEmpty)
        let id = UUID()
        let represented = try await insert(row(id), prefer: "return=representation")
        XCTAssertEqual(represented.status, 201)
        let rows = array(represented)
        XCTAssertEqual(rows.count, 1)
        XCTAssertEqual(rows.first?["client_id"] as? String, id.uuidString.lowercased())
        XCTAssertEqual(rows.first?["user_id"] as? String, userID)
        XCTAssertEqual(rows.first?["seq"] as? Int, 2)
        XCTAssertEqual(rows.first?["client_timestamp"] as? String, "2026-11-22T04:10:02.123+00:00")
        // Without user_id the caller is the owner.
        var anonymous = row()
        anonymous.removeValue(forKey: "user_id")
        let owned = try await insert(anonymous, prefer: "return=representation")
        XCTAssertEqual(array(owned).first?["user_id"] as? String, userID)
    }

    func testDuplicatesAreSkippedRowByRowAndNeverFailTheBatch() async throws {
        let (a, b, c) = (UUID(), UUID(), UUID())
        _ = try await insert(row(a))
        let batch = try await insert(
            [row(a), row(b), row(c)], prefer: "return=representation",
            query: "?columns=%22client_timestamp%22%2C%22type%22%2C%22payload%22%2C%22client_id%22%2C%22user_id%22")
        XCTAssertEqual(batch.status, 201, batch.text)
        XCTAssertEqual(
            Set(array(batch).compactMap { $0["client_id"] as? String }),
            [b, c].map { $0.uuidString.lowercased() }.reduce(into: Set<String>()) { $0.insert($1) })
        let upsert = try await insert(
            [row(a)], prefer: "return=representation,resolution=ignore-duplicates", query: "?on_conflict=client_id")
        XCTAssertEqual(upsert.status, 201)
        XCTAssertEqual(upsert.text, "[]")
        let merge = try await insert(
            [row(b)], prefer: "resolution=merge-duplicates", query: "?on_conflict=user_id,client_id")
        XCTAssertEqual(merge.status, 201)
        let count = try app.owner().query("select count(*) from events")[0].decode(Int.self, column: 0)
        XCTAssertEqual(count, 3)
    }

    func testForeignUserIDIs403AndStoresNothing() async throws {
        let foreign = try await insert([row(), row(user: UUID().uuidString)])
        assertPostgRESTError(foreign, 403, "42501")
        let count = try app.owner().query("select count(*) from events")[0].decode(Int.self, column: 0)
        XCTAssertEqual(count, 0)
    }

    func testSelectOrderedAndGreaterThanCreatedAtInEveryClientEncoding() async throws {
        for _ in 0..<3 { _ = try await insert(row()) }
        let all = array(try await get("/rest/v1/events?select=*&order=created_at.asc"))
        XCTAssertEqual(all.count, 3)
        let first = try XCTUnwrap(all.first?["created_at"] as? String)
        XCTAssertTrue(first.hasSuffix("+00:00"), first)
        let parsed = try XCTUnwrap(RFC3339.parse(first))
        // JS: `*` plain, `:` plain; Python: %2A and %3A, +00:00 as %2B00%3A00, 6 digits; Swift: ms and Z.
        let millis = RFC3339.format(parsed, fractionDigits: 3, zulu: true)
        let micros = RFC3339.format(parsed, fractionDigits: 6, zulu: false)
        let encodedMicros = micros.replacingOccurrences(of: ":", with: "%3A").replacingOccurrences(of: "+", with: "%2B")
        for query in [
            "select=*&order=created_at.asc&created_at=gt.\(first)".replacingOccurrences(of: "+", with: "%2B"),
            "select=%2A&order=created_at.asc&created_at=gt.\(encodedMicros)",
            "select=*&order=created_at.asc&created_at=gt.\(millis)",
        ] {
            let rest = try await get("/rest/v1/events?" + query)
            XCTAssertEqual(rest.status, 200, query + " " + rest.text)
            XCTAssertEqual(array(rest).map { $0["seq"] as? Int }, [2, 3], query)
        }
        let descending = array(try await get("/rest/v1/events?order=seq.desc.nullslast&limit=2"))
        XCTAssertEqual(descending.map { $0["seq"] as? Int }, [3, 2])
        let columns = array(try await get("/rest/v1/events?select=seq,type&seq=gte.2&seq=lte.2"))
        XCTAssertEqual(columns.count, 1)
        XCTAssertEqual(Set(columns[0].keys), ["seq", "type"])
    }

    /// A query value percent-encoded for the URL (PostgREST's clients encode it so).
    func encoded(_ value: String) -> String {
        value.addingPercentEncoding(
            withAllowedCharacters: CharacterSet(
                charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")) ?? value
    }

    /// `in.(…)` and `is.` (supabase-js `.in()`, `.is()`) against PostgreSQL: values of each
    /// column type; quoted values holding commas, quotes, backslashes, parentheses, spaces and
    /// a combining mark after a quote all match exactly what was stored (the list reaches
    /// PostgreSQL as one array literal); `in.()` matches nothing; `is.null` / `is.not_null`.
    func testInAndIsFilters() async throws {
        let types = ["a", "b,c", #"d"e"#, #"f\g"#, "\"\u{301}h", "(i)", " j ", "k"]
        var clientIDs: [String] = []
        for type in types {
            var event = row()
            event["type"] = type
            clientIDs.append(event["client_id"] as! String)
            let stored = try await insert(event)
            XCTAssertEqual(stored.status, 201, stored.text)
        }
        func quoted(_ value: String) -> String {  // by scalar: `"` + U+0301 is one Character
            var text = "\""
            for scalar in value.unicodeScalars {
                if scalar == "\\" || scalar == "\"" { text.unicodeScalars.append("\\") }
                text.unicodeScalars.append(scalar)
            }
            return text + "\""
        }
        func expectRows(_ path: String, _ count: Int, line: UInt = #line) async throws {
            let response = try await get(path)
            XCTAssertEqual(array(response).count, count, path + " " + response.text, line: line)
        }
        let allButK = types.dropLast().map(quoted).joined(separator: ",")
        try await expectSeqs("type=in." + encoded("(\(allButK))"), [1, 2, 3, 4, 5, 6, 7])
        try await expectSeqs("type=in." + encoded("(a,k)"), [1, 8])
        try await expectSeqs("type=in." + encoded(#"(a,"b,c",b)"#), [1, 2])
        try await expectSeqs("type=in." + encoded("(j)"), [])
        // supabase-js quotes only values with a comma or parenthesis, and escapes nothing:
        // `.in('type', ['d"e'])` sends `in.(d"e)`.
        try await expectSeqs("type=in." + encoded(#"(d"e,k)"#), [3, 8])
        try await expectSeqs("type=in.()", [])
        try await expectSeqs("seq=in.(2,4,99)", [2, 4])
        try await expectSeqs("seq=in.(2,4)&type=in.(a,k)", [])
        try await expectSeqs("client_id=in." + encoded("(\(clientIDs[0].lowercased()),\(clientIDs[7]))"), [1, 8])
        let stamps = array(try await get("/rest/v1/events?select=created_at&order=seq&seq=in.(3,6)"))
            .compactMap { $0["created_at"] as? String }
        XCTAssertEqual(stamps.count, 2)
        try await expectSeqs("created_at=in." + encoded("(\(stamps.joined(separator: ",")))"), [3, 6])
        try await expectSeqs("type=is.not_null&seq=lte.2", [1, 2])
        try await expectSeqs("type=is.null", [])
        try await expectSeqs("type=is.NOT_NULL&seq=lte.2", [1, 2])  // any case, as PostgREST
        try await expectSeqs("or=(type.is.Null,seq.eq.3)", [3])

        // profiles: full_name is null until set.
        let path = "/rest/v1/profiles?select=full_name&full_name="
        try await expectRows(path + "is.null", 1)
        try await expectRows(path + "is.not_null", 0)
        let named = try await app.request(
            "PATCH", "/rest/v1/profiles?id=in.(\(userID!))&full_name=is.null", json: ["full_name": "Ann"], bearer: token
        )
        XCTAssertEqual(named.status, 204, named.text)
        try await expectRows(path + "is.null", 0)
        try await expectRows(path + "in.(Ann,Bob)", 1)

        // Refused with a clear error and nothing read or changed.
        let refusals: [(String, String)] = [
            ("seq=in.(1,x)", "22P02"), ("seq=in.1,2", "PGRST100"), ("seq=in.(1,2", "PGRST100"),
            ("type=in." + encoded(#"("ab)"#), "PGRST100"),
            ("type=in." + encoded(#"("a"b)"#), "PGRST100"), ("type=in." + encoded("(a(b)"), "PGRST100"),
            ("client_id=in.(nope)", "22P02"), ("created_at=in.(yesterday)", "22P02"),
            ("created_at=in.(0001-01-01T00:30:00%2B01:00)", "22P02"),
            ("payload=in.(1)", "PGRST100"), ("type=in.(a%00b)", "22P02"),
            ("seq=in.(" + (0...1000).map(String.init).joined(separator: ",") + ")", "PGRST100"),
            ("type=is.true", "42804"), ("type=is.UNKNOWN", "42804"), ("type=is.maybe", "PGRST100"),
            ("type=not.in.(a,x", "PGRST100"), ("type=not.is.true", "42804"),
        ]
        for (query, code) in refusals {
            assertPostgRESTError(try await get("/rest/v1/events?" + query), 400, code)
        }
        let refusedUpdate = try await app.request(
            "PATCH", "/rest/v1/profiles?full_name=is.true", json: ["full_name": "Eve"], bearer: token)
        assertPostgRESTError(refusedUpdate, 400, "42804")
        try await expectRows(path + "in.(Ann)", 1)
    }

    /// `not.` before each operator, `like` and `ilike` over the stored values: `*` and `%`
    /// any characters, `_` one, `\` escaping; a negated condition leaves out what it matched.
    func testNotLikeAndIlikeFilters() async throws {
        try await insertTypes(["sprout_planted", "Sprout_Watered", "100%", "100 plants", "sproutXplanted"])
        try await expectSeqs("type=like.sprout*", [1, 5])
        try await expectSeqs("type=like." + encoded("sprout%"), [1, 5])
        try await expectSeqs("type=like." + encoded(#"sprout\_*"#), [1])
        try await expectSeqs("type=ilike.sprout*", [1, 2, 5])
        try await expectSeqs("type=ilike.*WATERED", [2])
        try await expectSeqs("type=like." + encoded(#"100\%"#), [3])
        try await expectSeqs("type=like.100_*", [3, 4])
        try await expectSeqs("type=not.like.100*", [1, 2, 5])
        try await expectSeqs("type=not.ilike.sprout*&type=like.100*", [3, 4])
        try await expectSeqs("seq=not.in.(1,2,3)", [4, 5])
        try await expectSeqs("seq=not.gt.2", [1, 2])
        try await expectSeqs("seq=not.eq.2&seq=not.eq.4", [1, 3, 5])
        try await expectSeqs("type=not.is.null", [1, 2, 3, 4, 5])
        try await expectSeqs("type=not.is.not_null", [])

        // profiles: `not.is.null` and `ilike` on the name, in a select and an update.
        let path = "/rest/v1/profiles?select=full_name&full_name="
        let untouched = try await app.request(
            "PATCH", "/rest/v1/profiles?full_name=not.is.null", json: ["full_name": "Ann"], bearer: token)
        XCTAssertEqual(untouched.status, 204, untouched.text)
        func count(_ query: String) async throws -> Int { array(try await get(path + query)).count }
        let notNull = try await count("not.is.null")
        XCTAssertEqual(notNull, 0, "a null name is not `not null`")
        let named = try await app.request(
            "PATCH", "/rest/v1/profiles?full_name=is.null", json: ["full_name": "Ann"], bearer: token)
        XCTAssertEqual(named.status, 204, named.text)
        let (ilike, like, notIlike) = (
            try await count("ilike.a*"), try await count("like.a*"), try await count("not.ilike.a*")
        )
        XCTAssertEqual([ilike, like, notIlike], [1, 0, 0])

        // like on a column that is not text: PostgreSQL's code, and nothing read.
        for query in ["seq=like.1*", "created_at=not.ilike.2026*", "client_id=like.*"] {
            let refused = try await get("/rest/v1/events?" + query)
            assertPostgRESTError(refused, 400, "42883")
            XCTAssertTrue((refused.json["message"] as? String)?.hasPrefix("operator does not exist: ") == true)
        }
    }

    /// `or=`, `and=` and `not.` on groups over the stored rows, nested, with quoted values;
    /// a profile update whose `or` matches nothing changes nothing.
    func testOrAndAndFilters() async throws {
        try await insertTypes(["a", "b,c", "d)", "e"])
        try await expectSeqs("or=" + encoded("(type.eq.a,seq.eq.4)"), [1, 4])
        try await expectSeqs("or=" + encoded(#"(type.eq."b,c",type.eq."d)")"#), [2, 3])
        try await expectSeqs("or=" + encoded(#"(type.in.("b,c",e),and(seq.gt.2,seq.lt.4))"#), [2, 3, 4])
        try await expectSeqs("not.or=" + encoded("(seq.eq.1,seq.eq.2)"), [3, 4])
        try await expectSeqs("and=" + encoded("(seq.gte.2,or(type.like.e*,seq.eq.2))"), [2, 4])
        try await expectSeqs("or=" + encoded("(seq.eq.1,seq.eq.2)") + "&or=" + encoded("(seq.eq.2,seq.eq.3)"), [2])
        try await expectSeqs("or=" + encoded("(type.not.eq.a,seq.eq.1)") + "&seq=lte.2", [1, 2])
        try await expectSeqs("or=" + encoded("(not.and(seq.gt.1,seq.lt.4),type.ilike.D*)"), [1, 3, 4])

        let unchanged = try await app.request(
            "PATCH", "/rest/v1/profiles?or=" + encoded("(full_name.eq.x,full_name.eq.y)"), json: ["full_name": "Z"],
            bearer: token)
        XCTAssertEqual(unchanged.status, 204, unchanged.text)
        let profile = try await get("/rest/v1/profiles?select=full_name")
        XCTAssertEqual(profile.text, #"[{"full_name":null}]"#)
    }

    /// A `like` pattern ending in its escape character (`\`, which PostgreSQL refuses with
    /// `22025` once a row's text reaches it) is the client's mistake: a 400 from the query
    /// string, whether any row reaches the end of the pattern or not, never a 500.
    func testALikePatternEndingInItsEscapeIs400() async throws {
        try await insertTypes(["abc\\"])
        for query in [
            "type=like." + encoded("abc\\"), "type=ilike." + encoded("ABC\\"), "type=like." + encoded("x\\"),
            "or=" + encoded(#"(type.like."abc\\",seq.eq.9)"#),
        ] {
            let response = try await get("/rest/v1/events?select=seq&" + query)
            assertPostgRESTError(response, 400, "22025")
        }
        let patch = try await app.request(
            "PATCH", "/rest/v1/profiles?full_name=like." + encoded("x\\"), json: ["full_name": "Z"], bearer: token)
        assertPostgRESTError(patch, 400, "22025")
    }

    func testContentRangeCountAndLimits() async throws {
        let empty = try await get("/rest/v1/events")
        XCTAssertEqual(empty.text, "[]")
        XCTAssertEqual(empty.headers["content-range"], "*/0")
        for _ in 0..<5 { _ = try await insert(row()) }
        let page = try await get("/rest/v1/events?limit=2&offset=1", headers: ["Prefer": "count=exact"])
        XCTAssertEqual(page.headers["content-range"], "1-2/5")
        let plain = try await get("/rest/v1/events")
        XCTAssertEqual(plain.headers["content-range"], "0-4/*")
    }

    func testAnotherUsersRowsNeverAppear() async throws {
        _ = try await insert(row())
        let other = try await app.application.auth.issueSession(email: try XCTUnwrap(Email("other@example.com")))
        let theirs = try await get("/rest/v1/events?select=*", bearer: other.accessToken)
        XCTAssertEqual(theirs.text, "[]")
        let filtered = try await get("/rest/v1/events?user_id=eq.\(userID!)", bearer: other.accessToken)
        XCTAssertEqual(filtered.text, "[]")
        let profile = try await get("/rest/v1/profiles?id=eq.\(userID!)", bearer: other.accessToken)
        XCTAssertEqual(profile.text, "[]")
    }

    func testProfilesSingleUpdateAndUpsert() async throws {
        let none = try await get(
            "/rest/v1/profiles?select=full_name&id=eq.\(userID!)",
            headers: ["Accept": "application/vnd.pgrst.object+json"])
        XCTAssertEqual(none.status, 200)
        XCTAssertEqual(none.text, #"{"full_name":null}"#)
        let update = try await app.request(
            "PUT", "/auth/v1/user", json: ["data": ["full_name": "Alice"]], bearer: token)
        XCTAssertEqual(update.status, 200)
        let named = try await get(
            "/rest/v1/profiles?select=full_name&id=eq.\(userID!)",
            headers: ["Accept": "application/vnd.pgrst.object+json"])
        XCTAssertEqual(named.text, #"{"full_name":"Alice"}"#)
        let patched = try await app.request(
            "PATCH", "/rest/v1/profiles?id=eq.\(userID!)", json: ["full_name": "B"], bearer: token,
            headers: ["Prefer": "return=representation"])
        XCTAssertEqual(patched.status, 200)
        XCTAssertEqual(array(patched).first?["full_name"] as? String, "B")
        let user = try await app.request("GET", "/auth/v1/user", bearer: token)
        XCTAssertEqual(
            (user.json["user_metadata"] as? [String: Any])?["full_name"] as? String, "B", "one full_name for both APIs")
        let upsert = try await app.request(
            "POST", "/rest/v1/profiles", json: ["id": userID!, "full_name": "C"], bearer: token,
            headers: ["Prefer": "return=representation"])
        XCTAssertEqual(upsert.status, 201)
        XCTAssertEqual(array(upsert).first?["full_name"] as? String, "C")
        let foreign = try await app.request(
            "POST", "/rest/v1/profiles", json: ["id": UUID().uuidString, "full_name": "X"], bearer: token)
        assertPostgRESTError(foreign, 403, "42501")
        let minimal = try await app.request(
            "PATCH", "/rest/v1/profiles?id=eq.\(userID!)", json: ["full_name": "D"], bearer: token)
        XCTAssertEqual(minimal.status, 204)
        // `.or()` on an update is refused by name and changes nothing.
        for query in ["or=(id.eq.\(userID!),full_name.fts.D)", "full_name=match.D", "full_name=not.fts.D"] {
            let refused = try await app.request(
                "PATCH", "/rest/v1/profiles?\(query)", json: ["full_name": "E"], bearer: token)
            assertPostgRESTError(refused, 400, "PGRST100")
            XCTAssertTrue(
                (refused.json["message"] as? String)?.hasSuffix("is not supported by this server.") == true,
                refused.text)
        }
        let unchanged = try await get(
            "/rest/v1/profiles?select=full_name", headers: ["Accept": "application/vnd.pgrst.object+json"])
        XCTAssertEqual(unchanged.text, #"{"full_name":"D"}"#)
    }

    func testSingleWithZeroOrSeveralRowsIs406() async throws {
        let zero = try await get("/rest/v1/events?select=*", headers: ["Accept": "application/vnd.pgrst.object+json"])
        assertPostgRESTError(zero, 406, "PGRST116")
        _ = try await insert([row(), row()])
        let several = try await get(
            "/rest/v1/events?select=*", headers: ["Accept": "application/vnd.pgrst.object+json"])
        assertPostgRESTError(several, 406, "PGRST116")
    }

    /// supabase-js names the schema on every request (`Accept-Profile` for a read,
    /// `Content-Profile` for a write): `public` is served; another (`.schema('sync')`) is
    /// refused as PostgREST refuses a schema it does not expose, not answered from `public`.
    func testOnlyThePublicSchemaIsServed() async throws {
        _ = try await insert([row()])
        let publicRead = try await get("/rest/v1/events?select=seq", headers: ["Accept-Profile": "public"])
        XCTAssertEqual(publicRead.text, #"[{"seq":1}]"#)
        let publicWrite = try await app.request(
            "POST", "/rest/v1/events", json: row(), bearer: token, headers: ["Content-Profile": "public"])
        XCTAssertEqual(publicWrite.status, 201, publicWrite.text)
        let otherRead = try await get("/rest/v1/events?select=seq", headers: ["Accept-Profile": "sync"])
        assertPostgRESTError(otherRead, 406, "PGRST106")
        XCTAssertEqual(otherRead.json["message"] as? String, "Invalid schema: sync")
        let profile = try await get("/rest/v1/profiles", headers: ["Accept-Profile": "private"])
        assertPostgRESTError(profile, 406, "PGRST106")
        let otherWrite = try await app.request(
            "POST", "/rest/v1/events", json: row(), bearer: token, headers: ["Content-Profile": "sync"])
        assertPostgRESTError(otherWrite, 406, "PGRST106")
        let update = try await app.request(
            "PATCH", "/rest/v1/profiles", json: ["full_name": "X"], bearer: token, headers: ["Content-Profile": "sync"])
        assertPostgRESTError(update, 406, "PGRST106")
        let stored = try await get("/rest/v1/events?select=seq")
        XCTAssertEqual(array(stored).count, 2, "the refused write stored nothing")
        let name = try await get("/rest/v1/profiles?select=full_name")
        XCTAssertEqual(name.text, #"[{"full_name":null}]"#)
    }

    func testEveryBadRequestHasThePostgRESTShapeAndChangesNothing() async throws {
        let reads: [(String, Int, String)] = [
            ("/rest/v1/events?nope=eq.1", 400, "42703"),
            ("/rest/v1/events?select=nope", 400, "42703"),
            ("/rest/v1/events?seq=like.1", 400, "42883"),
            ("/rest/v1/events?seq=1", 400, "PGRST100"),
            ("/rest/v1/events?seq=eq.x", 400, "22P02"),
            ("/rest/v1/events?client_id=eq.nope", 400, "22P02"),
            ("/rest/v1/events?created_at=gt.yesterday", 400, "22P02"),
            ("/rest/v1/events?payload=eq.{}", 400, "PGRST100"),
            ("/rest/v1/events?order=seq.sideways", 400, "PGRST100"),
            ("/rest/v1/events?order=nope.asc", 400, "42703"),
            ("/rest/v1/events?order=payload.asc", 400, "PGRST100"),
            ("/rest/v1/events?order=seq,payload.desc", 400, "PGRST100"),
            ("/rest/v1/events?limit=-1", 400, "PGRST100"),
            ("/rest/v1/events?select=seq::text", 400, "PGRST100"),
            ("/rest/v1/events?or=(type.eq.a,)", 400, "PGRST100"),
            ("/rest/v1/events?and=(seq.gt.1,seq.lt.x)", 400, "22P02"),
            ("/rest/v1/events?seq=not.not.eq.1", 400, "PGRST100"),
            ("/rest/v1/events?seq=in.(1,x)", 400, "22P02"),
            ("/rest/v1/events?type=is.false", 400, "42804"),
            ("/rest/v1/profiles?or=(full_name.eq.a,full_name.is.maybe)", 400, "PGRST100"),
            ("/rest/v1/nothing", 404, "PGRST205"),
        ]
        for (path, status, code) in reads {
            assertPostgRESTError(try await get(path), status, code)
        }
        // A read of a table that is not here takes no body (1 KiB at most, as every read);
        // an insert into one is told the table is unknown, whatever its size.
        let port = try XCTUnwrap(Int(app.baseURL.split(separator: ":").last ?? ""))
        let filler = String(repeating: "x", count: 2048)
        for (method, status) in [("GET", "413"), ("POST", "404")] {
            let answer = try rawExchange(
                port: port,
                "\(method) /rest/v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    + "Content-Type: application/json\r\nContent-Length: \(filler.utf8.count)\r\n\r\n\(filler)")
            XCTAssertTrue(answer.hasPrefix("HTTP/1.1 \(status) "), "\(method): \(answer)")
            XCTAssertTrue(answer.contains(status == "413" ? "PGRST413" : "PGRST205"), "\(method): \(answer)")
        }
        let bearerless = try await app.request("GET", "/rest/v1/events")
        assertPostgRESTError(bearerless, 401, "PGRST301")
        let badJWT = try await get("/rest/v1/events", bearer: "not-a-jwt")
        assertPostgRESTError(badJWT, 401, "PGRST301")
        let writes: [(Any?, String?, Int, String)] = [
            (["type": "t", "client_id": UUID().uuidString, "extra": 1], nil, 400, "PGRST204"),
            // Events follow the same rules, with the same details, as a native push.
            (["type": "t"], nil, 400, "validation_failed"),
            (["client_id": UUID().uuidString], nil, 400, "validation_failed"),
            (["type": "t", "client_id": "x"], nil, 400, "validation_failed"),
            (["type": "t", "client_id": UUID().uuidString, "client_timestamp": "now"], nil, 400, "validation_failed"),
            (["type": "", "client_id": UUID().uuidString], nil, 400, "validation_failed"),
            (["type": "t", "client_id": UUID().uuidString, "payload": [1, 2]], nil, 400, "validation_failed"),
            (nil, "{broken", 400, "PGRST102"),
            (nil, "42", 400, "PGRST102"),
            // A zero PostgreSQL cannot keep (more than 16383 digits after the point).
            (
                nil, #"{"type":"t","client_id":"\#(UUID().uuidString)","payload":{"z":0e-16384}}"#, 400,
                "validation_failed"
            ),
        ]
        for (json, raw, status, code) in writes {
            let response = try await app.request("POST", "/rest/v1/events", json: json, rawBody: raw, bearer: token)
            assertPostgRESTError(response, status, code)
        }
        for method in ["PATCH", "DELETE"] {
            let response = try await app.request(method, "/rest/v1/events?seq=eq.1", json: ["type": "x"], bearer: token)
            XCTAssertEqual(response.status, 405, method)
        }
        let count = try app.owner().query("select count(*) from events")[0].decode(Int.self, column: 0)
        XCTAssertEqual(count, 0)
    }

    /// `return=representation` answers at most 1000 rows, as a select (docs/api.md "Limits
    /// and errors"): a larger insert asking for it is refused before anything is stored (it
    /// was answered whole, hundreds of megabytes for a 10 MiB body of payloads that print
    /// large). `single()` of an insert of other than one row is refused before storing too,
    /// where PostgREST rolls it back.
    func testRepresentationOfAnInsertIsBoundedAndRefusalsStoreNothing() async throws {
        func stored() throws -> Int {
            try app.owner().query("select count(*) from events")[0].decode(Int.self, column: 0)
        }
        let rows = (0..<1001).map { _ in row() }
        let refused = try await insert(rows, prefer: "return=representation")
        assertPostgRESTError(refused, 400, "validation_failed")
        XCTAssertEqual(try stored(), 0)
        let object = ["Prefer": "return=representation", "Accept": "application/vnd.pgrst.object+json"]
        let several = try await app.request(
            "POST", "/rest/v1/events", json: [row(), row()], bearer: token, headers: object)
        assertPostgRESTError(several, 406, "PGRST116")
        XCTAssertEqual(try stored(), 0)
        let one = try await app.request("POST", "/rest/v1/events", json: [row()], bearer: token, headers: object)
        XCTAssertEqual(one.status, 201, one.text)
        XCTAssertEqual(one.json["seq"] as? Int, 1)
        // Without a representation, any batch the body limit allows is stored.
        let minimal = try await insert(rows)
        XCTAssertEqual(minimal.status, 201, minimal.text)
        XCTAssertEqual(try stored(), 1002)
    }

    /// A refused insert's details list the problems of the first 1,000 invalid events (as
    /// many as a push holds), the message counts them all: a 10 MiB body of 100,000 small
    /// invalid events was answered with 20 MB of details.
    func testTheDetailsOfARefusedInsertNameAtMostAThousandEvents() async throws {
        let rows = (0..<1500).map { _ in ["type": "", "client_id": "x", "payload": [:] as [String: Any]] }
        let refused = try await insert(rows)
        assertPostgRESTError(refused, 400, "validation_failed")
        let details = try XCTUnwrap(refused.json["details"] as? [[String: Any]], refused.text)
        let named = Set(details.compactMap { $0["index"] as? Int })
        XCTAssertEqual(named, Set(0..<1000))
        XCTAssertGreaterThan(details.count, 1000, "every problem of a listed event")
        XCTAssertTrue((refused.json["message"] as? String ?? "").hasPrefix("1500 event(s) are invalid"), refused.text)
    }

    func testResponsesAreCappedAt1000Rows() async throws {
        let rows = (0..<1005).map { _ in row() }
        let inserted = try await insert(rows)
        XCTAssertEqual(inserted.status, 201)
        let page = try await get("/rest/v1/events?select=seq&limit=5000")
        XCTAssertEqual(array(page).count, 1000)
    }
}

final class RESTStatementTimeoutTests: XCTestCase {
    /// A statement that runs longer than `rest_statement_timeout` is cancelled: `400 57014`
    /// in PostgREST's shape, naming the limit. The statement here waits on a lock the test
    /// holds, so it runs over whatever the machine's speed; without the limit it would wait
    /// until the client gives up. Afterwards the same routes answer again.
    func testAStatementOverTheLimitIsCancelledWith400AndTheNextRequestIsServed() async throws {
        let app = try await AppHarness(environment: [
            "TRUNK_SYNC_REST_STATEMENT_TIMEOUT": "0.2", "TRUNK_SYNC_EVENT_LOOPS": "1", "TRUNK_SYNC_DB_POOL_SIZE": "1",
        ])
        let session = try await app.application.auth.issueSession(email: try XCTUnwrap(Email("slow@example.com")))
        let token = session.accessToken
        let row: [String: Any] = [
            "type": "note", "payload": ["a": 1], "client_id": UUID().uuidString,
            "client_timestamp": "2026-11-27T08:00:00Z", "user_id": session.user.id.uuidString.lowercased(),
        ]
        let inserted = try await app.request("POST", "/rest/v1/events", json: row, bearer: token)
        XCTAssertEqual(inserted.status, 201, inserted.text)

        let owner = try app.owner()
        try owner.query("begin")
        try owner.query("lock table events, users in access exclusive mode")
        for path in ["/rest/v1/events?select=seq", "/rest/v1/profiles?select=id"] {
            let cancelled = try await app.request("GET", path, bearer: token, headers: ["Prefer": "count=exact"])
            XCTAssertEqual(cancelled.status, 400, "\(path): \(cancelled.text)")
            XCTAssertEqual(cancelled.json["code"] as? String, "57014", path)
            XCTAssertEqual(cancelled.json["message"] as? String, "canceling statement due to statement timeout")
            XCTAssertTrue((cancelled.json["details"] as? String)?.contains("rest_statement_timeout") == true)
            XCTAssertEqual(cancelled.headers["proxy-status"], "PostgREST; error=57014")
        }
        try owner.query("commit")

        // The one connection was rolled back and serves the next requests. The limit travels
        // with the REST transaction's scope (set for that transaction only); a pull does not
        // carry it.
        let rest = try await app.statements.during {
            let page = try await app.request("GET", "/rest/v1/events?select=seq", bearer: token)
            XCTAssertEqual(page.status, 200, page.text)
            XCTAssertEqual(page.text, #"[{"seq":1}]"#)
        }
        XCTAssertTrue(rest.contains { $0.contains("set_config('statement_timeout'") }, "\(rest)")
        let sync = try await app.statements.during {
            let pull = try await app.request("GET", "/sync/v1/events?after=0", bearer: token)
            XCTAssertEqual(pull.status, 200, pull.text)
        }
        XCTAssertFalse(sync.isEmpty)
        XCTAssertFalse(sync.contains { $0.contains("statement_timeout") }, "\(sync)")
        await app.stop()
    }
}

final class RESTAPIKeyTests: XCTestCase {
    func testConfiguredAPIKeyIsRequired() async throws {
        let app = try await AppHarness(environment: ["TRUNK_SYNC_API_KEY": "anon-key"])
        let session = try await app.application.auth.issueSession(email: try XCTUnwrap(Email("k@example.com")))
        let missing = try await app.request("GET", "/rest/v1/events", bearer: session.accessToken)
        XCTAssertEqual(missing.status, 401)
        let wrong = try await app.request(
            "GET", "/rest/v1/events", bearer: session.accessToken, headers: ["apikey": "nope"])
        XCTAssertEqual(wrong.status, 401)
        let right = try await app.request(
            "GET", "/rest/v1/events", bearer: session.accessToken, headers: ["apikey": "anon-key"])
        XCTAssertEqual(right.status, 200)
        await app.stop()
    }
}
