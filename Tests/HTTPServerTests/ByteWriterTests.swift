import HTTPServer
import XCTest

/// Text written in pieces on the stack and appended once: what response heads and access
/// log lines are made with.
final class ByteWriterTests: XCTestCase {
    private func written(capacity: Int, _ body: (inout ByteWriter) -> Void) -> String {
        var output = Array("> ".utf8)
        ByteWriter.append(to: &output, capacity: capacity, body)
        return String(decoding: output, as: UTF8.self)
    }

    func testWritesThePiecesAfterWhatTheOutputHolds() {
        let text = written(capacity: 64) { writer in
            writer.write("Content-Length: " as StaticString)
            writer.writeDecimal(15)
            writer.write([0x0D, 0x0A])
            writer.write("X-Request-Id: ")
            writer.write(String(repeating: "é", count: 3))  // a native string, not ASCII
            writer.write(UInt8(ascii: "!"))
        }
        XCTAssertEqual(text, "> Content-Length: 15\r\nX-Request-Id: ééé!")
    }

    func testDecimals() {
        func decimal(_ value: Int, width: Int = 1) -> String {
            written(capacity: 32) { $0.writeDecimal(value, width: width) }
        }
        XCTAssertEqual(decimal(0), "> 0")
        XCTAssertEqual(decimal(7, width: 3), "> 007")
        XCTAssertEqual(decimal(1234, width: 2), "> 1234")
        XCTAssertEqual(decimal(-5, width: 2), "> 00")
        XCTAssertEqual(decimal(Int.max), "> \(Int.max)")
        XCTAssertEqual(decimal(1, width: 40), "> " + String(repeating: "0", count: 19) + "1", "at most 20 digits")
    }

    func testNeverWritesPastItsCapacity() {
        XCTAssertEqual(written(capacity: 5) { $0.write("hello, world") }, "> hello")
        XCTAssertEqual(
            written(capacity: 4) { writer in
                writer.write("ab" as StaticString)
                writer.writeDecimal(12345)
                writer.write(UInt8(ascii: "x"))
            }, "> ab12")
    }
}
