import Foundation
import Postgres
import TestSupport
import XCTest

final class ErrorAndTransactionTests: XCTestCase {
    var connection: PostgresConnection!

    override func setUpWithError() throws {
        connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try connection.execute("create temporary table items (id int primary key, secret text)")
    }

    func testUniqueViolationIsRecognisableAndItsDescriptionLeaksNoData() throws {
        try connection.query("insert into items values (1, $1)", "first")
        XCTAssertThrowsError(try connection.query("insert into items values (1, $1)", "private-value")) { error in
            guard let error = error as? PostgresError else { return XCTFail("not a PostgresError: \(error)") }
            XCTAssertTrue(error.isUniqueViolation)
            XCTAssertEqual(error.kind, .server)
            XCTAssertEqual(error.constraint, "items_pkey")
            XCTAssertFalse(error.description.contains("(id)=(1)"), error.description)
            XCTAssertTrue(error.description.contains("23505"), error.description)
            XCTAssertTrue(error.debugDescription.contains("(id)=(1)"), error.debugDescription)
        }
        // The connection stays usable after a statement error.
        XCTAssertEqual(try connection.query("select count(*) from items")[0].decode(Int.self, column: 0), 1)
    }

    func testOtherSQLStates() throws {
        XCTAssertThrowsError(try connection.query("select * from no_such_table")) {
            XCTAssertEqual(($0 as? PostgresError)?.sqlState, .undefinedTable)
        }
        XCTAssertThrowsError(try connection.query("select $1::uuid", "not-a-uuid")) {
            XCTAssertEqual(($0 as? PostgresError)?.sqlState, .invalidTextRepresentation)
            XCTAssertFalse("\($0)".contains("not-a-uuid"))
        }
    }

    struct Boom: Error {}

    func testTransactionRollsBackOnAThrownError() throws {
        XCTAssertThrowsError(
            try connection.transaction { connection in
                try connection.query("insert into items values (2, 'x')")
                throw Boom()
            }
        ) { XCTAssertTrue($0 is Boom) }
        XCTAssertFalse(connection.isInTransaction)
        XCTAssertEqual(try connection.query("select count(*) from items")[0].decode(Int.self, column: 0), 0)
    }

    func testTransactionRollsBackOnAServerError() throws {
        XCTAssertThrowsError(
            try connection.transaction { connection in
                try connection.query("insert into items values (3, 'x')")
                try connection.query("insert into items values (3, 'again')")
            })
        XCTAssertFalse(connection.isInTransaction)
        XCTAssertEqual(try connection.query("select count(*) from items")[0].decode(Int.self, column: 0), 0)
    }

    func testTransactionCommits() throws {
        let value = try connection.transaction { connection -> Int in
            try connection.query("insert into items values (4, 'x')")
            return 4
        }
        XCTAssertEqual(value, 4)
        XCTAssertEqual(try connection.query("select count(*) from items")[0].decode(Int.self, column: 0), 1)
    }
}
