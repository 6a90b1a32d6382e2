import Postgres
import XCTest

@testable import TrunkSync

final class RFC3339Tests: XCTestCase {
    func testUpToNineFractionDigitsAreReadDownToMicroseconds() throws {
        let expected = try XCTUnwrap(RFC3339.parse("2026-11-22T04:10:02.123456Z"))
        for text in ["2026-11-22T04:10:02.1234567Z", "2026-11-22T04:10:02.12345678Z", "2026-11-22T04:10:02.123456789Z"]
        {
            XCTAssertEqual(RFC3339.parse(text), expected, text)
        }
        XCTAssertEqual(
            RFC3339.parse("2026-11-22T04:10:02.1Z")?.microsecondsSinceEpoch, expected.microsecondsSinceEpoch - 23456)
        XCTAssertNil(RFC3339.parse("2026-11-22T04:10:02.1234567891Z"), "ten digits")
        XCTAssertNil(RFC3339.parse("2026-11-22T04:10:02.Z"))
    }

    func testTimesOutsideYearsOneToNineThousandNineHundredNinetyNineAreRefused() throws {
        XCTAssertNil(RFC3339.parse("0000-01-01T00:00:00Z"))
        XCTAssertNil(RFC3339.parse("0001-01-01T00:00:00+01:00"), "year 0 in UTC")
        XCTAssertNil(RFC3339.parse("9999-12-31T23:59:59-01:00"), "year 10000 in UTC")
        let first = try XCTUnwrap(RFC3339.parse("0001-01-01T00:00:00Z"))
        let last = try XCTUnwrap(RFC3339.parse("9999-12-31T23:59:59.999999Z"))
        XCTAssertEqual(RFC3339.format(first), "0001-01-01T00:00:00.000000Z")
        XCTAssertEqual(RFC3339.format(last), "9999-12-31T23:59:59.999999Z")
    }

    func testWhatPostgresWouldTakeButRFC3339DoesNotIsRefused() {
        for text in [
            "now", "epoch", "infinity", "2026-11-22", "2026-11-22T04:10:02", "2026-02-30T00:00:00Z",
            "2026-11-22T24:00:00Z",
        ] {
            XCTAssertNil(RFC3339.parse(text), text)
        }
    }
}
