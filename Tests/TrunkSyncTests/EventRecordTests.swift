import Foundation
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// `EventRecord`, the one home of an event: its lists agree with each other, with the
/// migrated table and with what the encoder writes, and a page whose columns are not the
/// expected ones is refused rather than written under the wrong names.
final class EventRecordTests: XCTestCase {
    /// The names in a comma-separated column list.
    static func names(_ list: String) -> [String] {
        list.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
    }

    /// The keys of each object of a page, in the order written (a page of plain values: no
    /// key-like text inside strings).
    static func keys(_ json: [UInt8]) throws -> [String] {
        let text = String(decoding: json, as: UTF8.self)
        let pattern = try NSRegularExpression(pattern: #"[{,]"([a-z_]+)":"#)
        return pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap {
            Range($0.range(at: 1), in: text).map { String(text[$0]) }
        }
    }

    func testSelectListInsertListAndEncoderAgree() throws {
        let all = EventRecord.columns.map(\.name)
        XCTAssertEqual(all, ["id", "user_id", "seq", "type", "payload", "client_id", "client_timestamp", "created_at"])
        // Every reader selects the encoder's fields, in its order.
        XCTAssertEqual(Self.names(EventRecord.selectList), EventRecord.fields.map(\.name))
        XCTAssertEqual(EventRecord.fields.map(\.name), all.filter { $0 != "user_id" })
        // The push writes every column but the table's default, in the table's order.
        XCTAssertEqual(Self.names(EventRecord.insertList), all.filter { $0 != "id" })
        let insert = "insert into events (\(EventRecord.insertList))"
        XCTAssertTrue(EventStore.PushSteps.Batch.oneRoundTripSQL.contains(insert))
        XCTAssertTrue(EventStore.PushSteps.Batch.writeSQL.contains(insert))
        XCTAssertTrue(EventStore.pullSQL.hasPrefix("select \(EventRecord.selectList)\n"))
        // REST and Realtime serve every column, in the table's order, typed as it is.
        XCTAssertEqual(RESTRoutes.eventColumns.map(\.name), all)
        XCTAssertEqual(RESTRoutes.eventColumns.map(\.sql), all)
        XCTAssertEqual(RealtimeTable.events.columns.map(\.name), all)
        XCTAssertEqual(
            RealtimeTable.events.columnTypes,
            ["uuid", "uuid", "int8", "text", "jsonb", "uuid", "timestamptz", "timestamptz"])
        XCTAssertEqual(EventRecord.assignedByServer, ["id", "user_id", "seq", "created_at"])

        // The encoder writes the fields, in order, whatever order the select has them in.
        let connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        let values = """
            from (values (7::int8, '6ba7b810-9dad-11d1-80b4-00c04fd430c8'::uuid, 't'::text, '{}'::jsonb,
                          '6ba7b811-9dad-11d1-80b4-00c04fd430c8'::uuid, '2026-11-22 04:10:02.123456+00'::timestamptz,
                          '2026-11-22 04:10:03.5+00'::timestamptz))
              as v(seq, id, type, payload, client_id, client_timestamp, created_at)
            """
        let inOrder = try connection.query("select \(EventRecord.selectList) \(values)")
        let (json, lastSeq, _) = try EventPageEncoder.encode(inOrder, count: 1)
        XCTAssertEqual(try Self.keys(json), EventRecord.fields.map(\.name))
        XCTAssertEqual(lastSeq, 7)
        let reordered = try connection.query(
            "select created_at, client_timestamp, client_id, payload, type, id, seq \(values)")
        XCTAssertEqual(try EventPageEncoder.encode(reordered, count: 1).json, json)
    }

    /// The migrations and `EventRecord.columns` describe the same table.
    func testColumnsAreTheMigratedTables() throws {
        let (database, owner) = try migratedDatabase(prefix: "record")
        defer { try? TestDatabase.drop(database) }
        let rows = try owner.query(
            """
            select column_name::text, udt_name::text from information_schema.columns
            where table_schema = 'public' and table_name = 'events' order by ordinal_position
            """)
        let table = try rows.map { "\(try $0.decode(String.self, column: 0)) \(try $0.decode(String.self, column: 1))" }
        XCTAssertEqual(table, EventRecord.columns.map { "\($0.name) \($0.sqlType)" })
    }

    func testRefusesAResultOfOtherColumns() throws {
        let connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        let fine =
            "1::int8 as seq, gen_random_uuid() as id, 't'::text as type, '{}'::jsonb as payload, "
            + "gen_random_uuid() as client_id, now() as client_timestamp, now() as created_at"
        XCTAssertNoThrow(try EventRecord.Indexes(try connection.query("select \(fine)")))
        let others = [
            // A column renamed: its values would be written under another name.
            fine.replacingOccurrences(of: "as client_id", with: "as owner_id"),
            // One missing, one extra, one twice.
            fine.replacingOccurrences(of: ", now() as created_at", with: ""),
            fine + ", gen_random_uuid() as user_id",
            fine.replacingOccurrences(of: "now() as created_at", with: "now() as client_timestamp"),
            // Right name, wrong type.
            fine.replacingOccurrences(of: "1::int8 as seq", with: "1::int4 as seq"),
            // Unnamed columns (a select of bare values).
            "1::int8, gen_random_uuid(), 't'::text, '{}'::jsonb, gen_random_uuid(), now(), now()",
        ]
        for select in others {
            let result = try connection.query("select \(select)")
            XCTAssertThrowsError(try EventRecord.Indexes(result), select) { error in
                XCTAssertTrue(error is EventRecord.UnexpectedRow, "\(error)")
            }
            XCTAssertThrowsError(try EventPageEncoder.encode(result, count: 1), select)
            XCTAssertThrowsError(try EventPageEncoder.encode(result, count: 0), select)
        }
    }
}
