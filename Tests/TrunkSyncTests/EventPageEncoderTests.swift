import Foundation
import JSON
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// The pull's byte-level row encoder against the straightforward encoding it replaced
/// (decode each column, write with `JSONWriter`): same bytes for awkward values.
final class EventPageEncoderTests: XCTestCase {
    static let query = """
        select seq::int8, id::uuid, type::text, payload::jsonb, client_id::uuid,
               client_timestamp::timestamptz, created_at::timestamptz
        from (values
          (1, '00000000-0000-0000-0000-000000000000', 'sprout_planted', '{}',
           'ffffffff-ffff-ffff-ffff-ffffffffffff', '2026-11-22 04:10:02.123+00', '1970-01-01 00:00:00+00'),
          (9, 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', e'quote " back \\\\ nl \\n cr \\r tab \\t ctl \\x01 \\x1f del \\x7f',
           '{"text": "ünïcødé 🌱 \\"q\\" \\\\", "n": [1, 2.5, -3, true, null], "deep": {"x": {"y": "z"}}}',
           '123e4567-e89b-12d3-a456-426614174000', '1969-12-31 23:59:59.999999+00', '1900-02-28 12:34:56.000001+00'),
          (10, '6ba7b810-9dad-11d1-80b4-00c04fd430c8', 'ünïcødé 🌱', '[1, "two", {"three": 3}]',
           '6ba7b811-9dad-11d1-80b4-00c04fd430c8', '0001-01-01 00:00:00+00', '9999-12-31 23:59:59.999999+00'),
          (9223372036854775807, '6ba7b812-9dad-11d1-80b4-00c04fd430c8', 'x', '"a string"',
           '6ba7b814-9dad-11d1-80b4-00c04fd430c8', '2000-01-01 00:00:00+00', '2000-02-29 23:59:59.5+00')
        ) as v(seq, id, type, payload, client_id, client_timestamp, created_at)
        order by seq
        """

    /// The encoding `EventStore.pull` used before `EventPageEncoder`.
    static func reference(_ rows: PostgresResult, count: Int) throws -> [UInt8] {
        var writer = JSONWriter(capacity: 256)
        writer.beginArray()
        for index in 0..<count {
            let row = rows[index]
            writer.beginObject()
            writer.string("id", try row.decode(UUID.self, column: 1).uuidString.lowercased())
            writer.int("seq", try row.decode(Int64.self, column: 0))
            writer.string("type", try row.decode(String.self, column: 2))
            try row.withRawBytes(column: 3) { bytes in
                guard let bytes, bytes.first == 1 else { throw UnexpectedJSONB() }
                writer.raw("payload", Array(bytes.dropFirst()))
            }
            writer.string("client_id", try row.decode(UUID.self, column: 4).uuidString.lowercased())
            writer.string(
                "client_timestamp", RFC3339.format(try row.decode(PostgresTimestamp.self, column: 5), fractionDigits: 6)
            )
            writer.string(
                "created_at", RFC3339.format(try row.decode(PostgresTimestamp.self, column: 6), fractionDigits: 3))
            writer.endObject()
        }
        writer.endArray()
        return writer.bytes
    }

    func testEncodesExactlyAsTheReference() throws {
        let connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        let rows = try connection.query(Self.query)
        XCTAssertEqual(rows.count, 4)
        for count in 0...rows.count {
            let (json, lastSeq, _) = try EventPageEncoder.encode(rows, count: count)
            let expected = try Self.reference(rows, count: count)
            XCTAssertEqual(String(decoding: json, as: UTF8.self), String(decoding: expected, as: UTF8.self))
            XCTAssertEqual(lastSeq, count == 0 ? nil : try rows[count - 1].decode(Int64.self, column: 0))
        }
        let (json, _, _) = try EventPageEncoder.encode(rows, count: rows.count)
        let parsed = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(json)) as? [[String: Any]])
        XCTAssertEqual(parsed[1]["type"] as? String, "quote \" back \\ nl \n cr \r tab \t ctl \u{01} \u{1f} del \u{7f}")
        XCTAssertEqual(parsed[3]["seq"] as? Int, Int.max)
    }

    /// The stream's framing: one message per event, `id:` its seq, `data:` the very object
    /// of the pull (each on one line, line breaks in strings escaped).
    func testServerSentEventsFramingWrapsEachPullObject() throws {
        let connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        let rows = try connection.query(Self.query)
        let (sse, lastSeq, _) = try EventPageEncoder.encode(rows, count: rows.count, framing: .serverSentEvents)
        XCTAssertEqual(lastSeq, Int64.max)
        let objects = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(try Self.reference(rows, count: rows.count))) as? [Any])
        var expected = ""
        for index in 0..<rows.count {
            let single = try Self.reference(rows, count: index + 1)
            let previous = index == 0 ? 1 : try Self.reference(rows, count: index).count
            // The reference array's element `index`: what follows the previous prefix's `]`.
            let object = String(decoding: single[previous..<(single.count - 1)], as: UTF8.self)
            let trimmed = object.hasPrefix(",") ? String(object.dropFirst()) : object
            expected += "id: \(try rows[index].decode(Int64.self, column: 0))\nevent: event\ndata: \(trimmed)\n\n"
        }
        XCTAssertEqual(objects.count, rows.count)
        XCTAssertEqual(String(decoding: sse, as: UTF8.self), expected)
        let (empty, none, _) = try EventPageEncoder.encode(rows, count: 0, framing: .serverSentEvents)
        XCTAssertEqual(empty, [])
        XCTAssertNil(none)
    }

    func testRejectsAnotherShapeAndNulls() throws {
        let connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        func page(_ seq: String, _ type: String, _ clientTimestamp: String) throws -> PostgresResult {
            try connection.query(
                """
                select \(seq) as seq, gen_random_uuid() as id, \(type) as type, '{}'::jsonb as payload,
                       gen_random_uuid() as client_id, \(clientTimestamp) as client_timestamp, now() as created_at
                """)
        }
        XCTAssertNoThrow(try EventPageEncoder.encode(try page("1::int8", "'t'::text", "now()"), count: 1))
        XCTAssertThrowsError(try EventPageEncoder.encode(try page("1::int4", "'t'::text", "now()"), count: 1))
        XCTAssertThrowsError(try EventPageEncoder.encode(try page("1::int8", "null::text", "now()"), count: 1))
        XCTAssertThrowsError(
            try EventPageEncoder.encode(try page("1::int8", "'t'::text", "'infinity'::timestamptz"), count: 1))
    }
}
