import Foundation
import XCTest

@testable import TrunkSyncClient

/// `ExportCheck`: an export's body is whole only when it ends with the server's end line,
/// whose count and last `seq` are those of the event lines before it, and nothing follows
/// it — however the body is cut into pieces.
final class ExportCheckTests: XCTestCase {
    static let account = #"{"kind":"account","id":"a","email":"me@example.com","user_metadata":{}}"#

    static func event(_ seq: Int) -> String {
        #"{"kind":"event","id":"e\#(seq)","seq":\#(seq),"type":"note","payload":{"text":"a\nb \"}\" {\"kind\":\"end\"}"},"client_id":"c"}"#
    }

    static func end(_ events: Int, _ lastSeq: Int) -> String {
        #"{"kind":"end","events":\#(events),"last_seq":\#(lastSeq)}"#
    }

    static func body(_ lines: [String]) -> [UInt8] { Array(lines.map { $0 + "\n" }.joined().utf8) }

    /// Checks `body` pushed whole, byte by byte, and in pieces of 7 bytes: the same outcome.
    func check(_ body: [UInt8], file: StaticString = #filePath, line: UInt = #line) throws -> ExportCheck.End {
        var outcomes: [Result<ExportCheck.End, Error>] = []
        for size in [body.count + 1, 1, 7] {
            outcomes.append(
                Result {
                    var check = ExportCheck()
                    for start in stride(from: 0, to: body.count, by: size) {
                        try check.push(body[start..<min(start + size, body.count)])
                    }
                    return try check.finish()
                })
        }
        let descriptions = outcomes.map { "\($0)" }
        XCTAssertEqual(Set(descriptions).count, 1, "\(descriptions)", file: file, line: line)
        return try outcomes[0].get()
    }

    func assertIncomplete(
        _ body: [UInt8], _ reason: String, file: StaticString = #filePath, line: UInt = #line
    ) {
        XCTAssertThrowsError(try check(body), file: file, line: line) { error in
            guard let incomplete = error as? ExportCheck.Incomplete else {
                return XCTFail("\(error)", file: file, line: line)
            }
            XCTAssertTrue(incomplete.description.contains(reason), incomplete.description, file: file, line: line)
        }
    }

    func testAWholeExportIsTheEndLinesCount() throws {
        let lines = [Self.account] + (1...3).map(Self.event) + [Self.end(3, 3)]
        XCTAssertEqual(try check(Self.body(lines)), ExportCheck.End(events: 3, lastSeq: 3))
        // An account without events; seqs that jump (a restore moved them ahead).
        XCTAssertEqual(try check(Self.body([Self.account, Self.end(0, 0)])), ExportCheck.End(events: 0, lastSeq: 0))
        let jumping = [Self.account, Self.event(2), Self.event(1_000_000_007), Self.end(2, 1_000_000_007)]
        XCTAssertEqual(try check(Self.body(jumping)), ExportCheck.End(events: 2, lastSeq: 1_000_000_007))
    }

    func testABodyWithoutItsEndLineIsIncomplete() {
        let events = [Self.account] + (1...3).map(Self.event)
        assertIncomplete(Self.body(events), "no end line: 3 event line(s) came")
        assertIncomplete(Self.body([Self.account]), "no end line: 0 event line(s)")
        assertIncomplete([], "empty")
        // Cut in the middle of a line, also of the end line itself.
        let whole = Self.body(events + [Self.end(3, 3)])
        assertIncomplete(Array(whole.dropLast(30)), "stops in the middle of line 5")
        assertIncomplete(Array(whole.dropLast(1)), "stops in the middle of line 5")
        assertIncomplete(Array(Self.body(events).dropLast(1)), "stops in the middle of line 4")
    }

    func testAnEndLineThatDoesNotMatchWhatCameIsIncomplete() {
        let events = (1...3).map(Self.event)
        assertIncomplete(Self.body([Self.account] + events + [Self.end(4, 3)]), "counts 4 event line(s), but 3 came")
        assertIncomplete(Self.body([Self.account] + events.dropLast() + [Self.end(3, 3)]), "counts 3")
        assertIncomplete(Self.body([Self.account] + events + [Self.end(3, 2)]), "last seq is 2, but it is 3")
        assertIncomplete(Self.body([Self.account, Self.end(0, 5)]), "last seq is 5, but it is 0")
        for broken in [
            #"{"kind":"end","events":3}"#, #"{"kind":"end","events":"3","last_seq":3}"#,
            #"{"kind":"end","events":3.5,"last_seq":3}"#, #"{"kind":"end","events":-1,"last_seq":3}"#,
            #"{"kind":"end","events":3,"last_seq":3} x"#,
        ] {
            assertIncomplete(Self.body([Self.account] + events + [broken]), "end line cannot be read")
        }
    }

    /// A page missing and another repeated keeps the count but not the order of seqs.
    func testEventSeqsMustIncrease() throws {
        let repeated = [Self.account] + [1, 2, 3, 2, 3, 6].map(Self.event) + [Self.end(6, 6)]
        assertIncomplete(Self.body(repeated), "line 5 has seq 2, not after the previous event's 3")
        let same = [Self.account, Self.event(1), Self.event(1), Self.end(2, 1)]
        assertIncomplete(Self.body(same), "line 3 has seq 1, not after the previous event's 1")
        // The seq is the line's own member, not one of the payload's, wherever it is.
        let nested = #"{"kind":"event","payload":{"seq":9,"a":[{"seq":8}]},"note":"\"seq\":7","seq":4}"#
        XCTAssertEqual(
            try check(Self.body([Self.account, Self.event(3), nested, Self.end(2, 4)])),
            ExportCheck.End(events: 2, lastSeq: 4))
        XCTAssertEqual(try ExportCheck.seq(ofEventLine: Array(nested.utf8), line: 1), 4)
        for broken in [
            #"{"kind":"event","id":"e","payload":{"seq":5}}"#, #"{"kind":"event","seq":"5"}"#,
            #"{"kind":"event","seq":-5}"#, #"{"kind":"event","seq":5.5}"#,
            #"{"kind":"event","seq":99999999999999999999}"#,
            #"{"kind":"event","seq":"#,
        ] {
            assertIncomplete(Self.body([Self.account, broken, Self.end(1, 5)]), "line 2 is an event line")
        }
    }

    func testAnythingAfterTheEndLineOrOutOfPlaceIsRefused() {
        let whole = [Self.account, Self.event(1), Self.end(1, 1)]
        assertIncomplete(Self.body(whole + [Self.event(2)]), "goes on after its end line")
        assertIncomplete(Self.body(whole + [Self.end(1, 1)]), "goes on after its end line")
        assertIncomplete(Self.body(whole) + Array("\n".utf8), "goes on after its end line")
        assertIncomplete(Self.body(whole) + Array("{".utf8), "goes on after its end line")
        // Two exports one after the other are not one.
        assertIncomplete(Self.body(whole + whole), "goes on after its end line")
        assertIncomplete(Self.body([Self.event(1), Self.end(1, 1)]), "first line is not the account")
        assertIncomplete(Self.body([Self.account, Self.account, Self.end(0, 0)]), "line 2 is neither")
        assertIncomplete(Self.body([Self.account, "<html>", Self.end(0, 0)]), "line 2 is neither")
    }

    /// The file a download left, read in pieces.
    func testAFileIsCheckedInPieces() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("export-\(UUID().uuidString).ndjson")
        defer { try? FileManager.default.removeItem(at: url) }
        let lines = [Self.account] + (1...500).map(Self.event) + [Self.end(500, 500)]
        try Data(Self.body(lines)).write(to: url)
        XCTAssertEqual(try ExportCheck.file(url, pieceSize: 1000), ExportCheck.End(events: 500, lastSeq: 500))
        try Data(Self.body(Array(lines.dropLast()))).write(to: url)
        XCTAssertThrowsError(try ExportCheck.file(url, pieceSize: 1000))
    }
}
