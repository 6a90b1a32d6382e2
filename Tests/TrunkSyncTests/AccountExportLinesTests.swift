import Foundation
import JSON
import XCTest

@testable import TrunkSync

/// The export turns each page's JSON array into NDJSON lines with a `kind`: every object of
/// the array becomes one line, and nothing inside a string or a nested value is touched.
final class AccountExportLinesTests: XCTestCase {
    func lines(_ array: String) -> [String] {
        let bytes = Accounts.lines(kind: "event", fromArray: Array(array.utf8))
        XCTAssertEqual(bytes.last, UInt8(ascii: "\n"), "every line ends with a newline")
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
            .dropLast().map(String.init)
    }

    func testEachObjectBecomesALineWithItsKind() throws {
        let awkward =
            #"[{"id":"a","payload":{"s":"}],{[\"\\","n":[1,{"x":[]}],"e":{}}},{"id":"b","t":"\\"},{"id":"c"}]"#
        let result = lines(awkward)
        XCTAssertEqual(result.count, 3)
        XCTAssertEqual(result[0], #"{"kind":"event","id":"a","payload":{"s":"}],{[\"\\","n":[1,{"x":[]}],"e":{}}}"#)
        XCTAssertEqual(result[1], #"{"kind":"event","id":"b","t":"\\"}"#)
        XCTAssertEqual(result[2], #"{"kind":"event","id":"c"}"#)
        let original = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(awkward.utf8)) as? [[String: Any]])
        for (line, object) in zip(result, original) {
            var parsed = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            XCTAssertEqual(parsed.removeValue(forKey: "kind") as? String, "event")
            XCTAssertEqual(NSDictionary(dictionary: parsed), NSDictionary(dictionary: object))
        }
    }

    func testAnEmptyPageIsNoLines() {
        XCTAssertEqual(Accounts.lines(kind: "event", fromArray: Array("[]".utf8)), [])
    }
}
