import Foundation
import Postgres
import TestSupport
import XCTest

final class TypeRoundTripTests: XCTestCase {
    var connection: PostgresConnection!

    override func setUpWithError() throws {
        connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
    }

    private func echo<T: PostgresEncodable & PostgresDecodable & Equatable>(
        _ value: T, as sqlType: String, file: StaticString = #filePath, line: UInt = #line
    ) throws {
        let result = try connection.query("select $1::\(sqlType), ($1::\(sqlType))::text is not null", value)
        XCTAssertEqual(try result[0].decode(T.self, column: 0), value, file: file, line: line)
        // NULL of the same type decodes as nil.
        let null: T? = nil
        let nullResult = try connection.query("select $1::\(sqlType)", null)
        XCTAssertNil(try nullResult[0].decode(T?.self, column: 0), file: file, line: line)
        XCTAssertTrue(nullResult[0].isNull(column: 0), file: file, line: line)
    }

    func testText() throws {
        try echo("", as: "text")
        try echo("plain", as: "text")
        try echo("ünïcødé 🌱 日本語 \u{0001} tab\tnewline\n", as: "text")
        try echo(String(repeating: "x", count: 1 << 20), as: "text")
        XCTAssertEqual(
            try connection.query("select 'a'::varchar(5), 'b'::char(1), 'c'::name")[0].decode(String.self, column: 1),
            "b")
    }

    func testIntegers() throws {
        for value: Int64 in [0, 1, -1, .max, .min, 1 << 40] { try echo(value, as: "int8") }
        for value: Int32 in [0, .max, .min] { try echo(value, as: "int4") }
        try echo(42, as: "int8")
        let small = try connection.query("select 7::int2, 8::int4, 9::int8")[0]
        XCTAssertEqual(try small.decode(Int.self, column: 0), 7)
        XCTAssertEqual(try small.decode(Int64.self, column: 1), 8)
        XCTAssertEqual(try small.decode(Int32.self, column: 0), 7)
    }

    func testBoolAndDouble() throws {
        try echo(true, as: "bool")
        try echo(false, as: "bool")
        try echo(3.141592653589793, as: "float8")
        try echo(-0.0, as: "float8")
        XCTAssertEqual(try connection.query("select 1.5::float4")[0].decode(Double.self, column: 0), 1.5)
    }

    func testUUID() throws {
        let id = UUID()
        try echo(id, as: "uuid")
        let text = try connection.query("select $1::uuid::text", id)[0].decode(String.self, column: 0)
        XCTAssertEqual(text, id.uuidString.lowercased())
        XCTAssertEqual(
            try connection.query("select $1::uuid", id)[0].decode(String.self, column: 0), id.uuidString.lowercased())
    }

    func testTimestampKeepsMicroseconds() throws {
        for micros: Int64 in [0, 1, -1, 1_763_784_602_123_456, 946_684_800_000_000, -62_135_596_800_000_000] {
            try echo(PostgresTimestamp(microsecondsSinceEpoch: micros), as: "timestamptz")
        }
        let text = try connection.query(
            "select ($1::timestamptz at time zone 'UTC')::text",
            PostgresTimestamp(microsecondsSinceEpoch: 1_763_784_602_123_456)
        )[0].decode(String.self, column: 0)
        XCTAssertEqual(text, "2025-11-22 04:10:02.123456")
        let parsed = try connection.query("select '2026-11-22T04:10:02.123Z'::timestamptz")[0]
            .decode(PostgresTimestamp.self, column: 0)
        XCTAssertEqual(parsed.microsecondsSinceEpoch, 1_795_320_602_123_000)
        let date = Date(timeIntervalSince1970: 1_795_320_602.123)
        let roundTripped = try connection.query("select $1::timestamptz", date)[0].decode(Date.self, column: 0)
        XCTAssertEqual(roundTripped.timeIntervalSince1970, date.timeIntervalSince1970, accuracy: 0.000_001)
        XCTAssertThrowsError(
            try connection.query("select 'infinity'::timestamptz")[0].decode(PostgresTimestamp.self, column: 0))
    }

    func testJSONBKeepsUnicodeNestingAndLargeDocuments() throws {
        let document = PostgresJSON(#"{"emoji":"🌱","nested":{"list":[1,2.5,-3e10,null,true]},"quote":"\"x\""}"#)
        let back = try connection.query("select $1::jsonb", document)[0].decode(PostgresJSON.self, column: 0)
        let reparsed = try JSONSerialization.jsonObject(with: Data(back.bytes)) as? NSDictionary
        let original = try JSONSerialization.jsonObject(with: Data(document.bytes)) as? NSDictionary
        XCTAssertEqual(reparsed, original)
        let large = PostgresJSON("[" + (0..<100_000).map { "{\"i\":\($0),\"s\":\"é\"}" }.joined(separator: ",") + "]")
        let count = try connection.query("select jsonb_array_length($1::jsonb), length($1::jsonb::text)", large)[0]
        XCTAssertEqual(try count.decode(Int.self, column: 0), 100_000)
        try echo(PostgresJSON("{}"), as: "jsonb")
        XCTAssertEqual(
            try connection.query("select '{\"a\": 1}'::json")[0].decode(String.self, column: 0), "{\"a\": 1}")
        XCTAssertThrowsError(try connection.query("select $1::jsonb", PostgresJSON("{not json"))) { error in
            XCTAssertEqual((error as? PostgresError)?.sqlState, .invalidTextRepresentation)
        }
    }

    func testArrays() throws {
        try echo(["a", "", "ü 🌱", "with,comma", "with\"quote"], as: "text[]")
        try echo([Int64]([1, -2, .max]), as: "int8[]")
        try echo([UUID(), UUID()], as: "uuid[]")
        try echo(
            [PostgresTimestamp(microsecondsSinceEpoch: 5), PostgresTimestamp(microsecondsSinceEpoch: -5)],
            as: "timestamptz[]")
        try echo([String](), as: "text[]")
        let documents = [PostgresJSON("{\"a\":1}"), PostgresJSON("[\"b\"]")]
        let rows = try connection.query("select d::text from unnest($1::jsonb[]) as d", documents)
        XCTAssertEqual(try rows.map { try $0.decode(String.self, column: 0) }, ["{\"a\": 1}", "[\"b\"]"])
    }

    /// Each element type writes itself into the array's bytes (no array of its own): the
    /// same bytes as its length and `postgresBinaryBytes`, as many as it says.
    func testArrayElementsAreWrittenInPlaceAsTheirBinaryForm() {
        func check<T: PostgresArrayElement>(_ elements: [T], file: StaticString = #filePath, line: UInt = #line) {
            var expected: [UInt8] = []
            let header = [Int32(elements.isEmpty ? 0 : 1), 0, Int32(bitPattern: T.postgresElementType)]
            for value in header + (elements.isEmpty ? [] : [Int32(elements.count), 1]) {
                withUnsafeBytes(of: value.bigEndian) { expected.append(contentsOf: $0) }
            }
            for element in elements {
                let bytes = element.postgresBinaryBytes
                withUnsafeBytes(of: Int32(bytes.count).bigEndian) { expected.append(contentsOf: $0) }
                expected.append(contentsOf: bytes)
            }
            XCTAssertEqual(elements.postgresBind.bytes, expected, file: file, line: line)
            XCTAssertEqual(
                elements.reduce(elements.isEmpty ? 12 : 20) { $0 + $1.postgresArrayElementSize }, expected.count,
                file: file, line: line)
        }
        check(["a", "", "ü 🌱"])
        check([Int64]([1, -2, .max]))
        check([UUID(), UUID()])
        check([PostgresTimestamp(microsecondsSinceEpoch: 5), PostgresTimestamp(microsecondsSinceEpoch: -5)])
        check([PostgresJSON("{\"a\":1}"), PostgresJSON("[]")])
        check([PostgresJSON]())
        check([String(repeating: "ß", count: 1000), "🌱"])
    }

    func testBytea() throws {
        let bytes = PostgresBytes((0...255).map { UInt8($0) })
        try echo(bytes, as: "bytea")
    }

    func testDecodingTheWrongTypeIsAnErrorNotACrash() throws {
        let row = try connection.query("select 'text'::text, null::int8")[0]
        XCTAssertThrowsError(try row.decode(Int64.self, column: 0)) { error in
            XCTAssertEqual((error as? PostgresError)?.kind, .decoding)
        }
        XCTAssertThrowsError(try row.decode(Int64.self, column: 1))
        XCTAssertThrowsError(try row.decode(String.self, column: 7))
    }

    func testResultMetadata() throws {
        let result = try connection.query("select 1 as one, 'x' as two union all select 2, 'y'")
        XCTAssertEqual(result.count, 2)
        XCTAssertEqual(result.columnCount, 2)
        XCTAssertEqual(result.columnName(1), "two")
        try connection.execute("create temporary table t (x int)")
        XCTAssertEqual(try connection.query("insert into t select generate_series(1, 3)").affectedRows, 3)
    }
}
