import XCTest

@testable import JSON

/// The one JSON parser: RFC 8259's grammar, I-JSON's numbers, strings jsonb can store.
final class JSONScannerTests: XCTestCase {
    enum Outcome: Equatable {
        case accepted(storedSize: Int)
        /// Well-formed, but a value is refused.
        case refused(String)
        /// Not JSON.
        case failed(String)
    }

    func scan(_ text: String, limits: JSONLimits = .default) -> Outcome {
        Array(text.utf8).withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(buffer, limits: limits)
            do throws(JSONScanner.Failure) {
                let (_, stored) = try scanner.skipValueMeasured()
                try scanner.expectEnd()
                if let violation = scanner.takeViolation() { return .refused(violation.reason) }
                return .accepted(storedSize: stored)
            } catch {
                return .failed(error.reason)
            }
        }
    }

    func assertAccepted(_ text: String, file: StaticString = #filePath, line: UInt = #line) {
        guard case .accepted = scan(text) else {
            return XCTFail("\(text.prefix(80)) should be accepted: \(scan(text))", file: file, line: line)
        }
    }

    func assertFailed(_ text: String, file: StaticString = #filePath, line: UInt = #line) {
        guard case .failed = scan(text) else {
            return XCTFail("\(text.prefix(80)) is not JSON: \(scan(text))", file: file, line: line)
        }
    }

    func assertRefused(_ text: String, containing part: String, file: StaticString = #filePath, line: UInt = #line) {
        guard case .refused(let reason) = scan(text) else {
            return XCTFail("\(text.prefix(80)) should be refused: \(scan(text))", file: file, line: line)
        }
        XCTAssertTrue(reason.contains(part), reason, file: file, line: line)
    }

    // MARK: - RFC 8259 grammar

    func testEveryKindOfValueIsAccepted() {
        for text in [
            "null", "true", "false", "0", "-0", "1", "-1", "10", "1.5", "-0.25", "1e5", "1E5", "1e+5", "1e-5", "2.5E-3",
            #""""#, #""a""#, #""\"\\\/\b\f\n\r\t""#, #""\u00e9\u20AC""#, #""\ud83d\ude00""#, "\"é€😀\"", "[]", "{}", "[1,2,3]",
            #"{"a":1,"b":[true,false,null],"c":{"d":"e"}}"#, " \t\r\n[ 1 , { \"a\" : 2 } ] \n",
        ] {
            assertAccepted(text)
        }
    }

    func testGrammarViolationsAreNotJSON() {
        for text in [
            "", " ", "nul", "tru", "falsey", "NULL", "True", "01", "-", "+1", "1.", ".5", "1e", "1e+", "0x10", "1_000", "NaN",
            "Infinity", "-Infinity", #""abc"#, #""\x""#, #""\u12""#, #""\u12G4""#, "'single'", "[1,]", "[,1]", "[1 2]",
            "{\"a\"}", "{\"a\":}", "{a:1}", "{\"a\":1,}", "{\"a\" 1}", "[", "]", "{", "}", "[1]]", "\"tab\there\"",
            "\"new\nline\"", "1 2", "[1] x", "/* comment */ 1", "\u{FEFF}1",
        ] {
            assertFailed(text)
        }
    }

    func testInvalidUTF8IsNotJSON() {
        for bytes: [UInt8] in [
            [0x22, 0xC3, 0x22],  // truncated two-byte sequence
            [0x22, 0xC0, 0xAF, 0x22],  // overlong
            [0x22, 0xED, 0xA0, 0x80, 0x22],  // an encoded surrogate
            [0x22, 0xF4, 0x90, 0x80, 0x80, 0x22],  // above U+10FFFF
            [0x22, 0xFF, 0x22],
        ] {
            let outcome = bytes.withUnsafeBufferPointer { buffer -> Bool in
                var scanner = JSONScanner(buffer)
                return (try? scanner.skipValue()) == nil
            }
            XCTAssertTrue(outcome, "\(bytes) is not UTF-8")
        }
    }

    func testNestingDeeperThanTheLimitFails() {
        assertAccepted(String(repeating: "[", count: 64) + String(repeating: "]", count: 64))
        assertFailed(String(repeating: "[", count: 65) + String(repeating: "]", count: 65))
        assertFailed(String(repeating: "{\"a\":", count: 65) + "1" + String(repeating: "}", count: 65))
        // A deep document fails fast, without recursing through all of it.
        assertFailed(String(repeating: "[", count: 100_000))
    }

    // MARK: - Strings jsonb can store

    func testNulAndUnpairedSurrogatesAreRefused() {
        assertRefused(#""\u0000""#, containing: "\\u0000")
        assertRefused(#"{"a":"x\u0000y"}"#, containing: "\\u0000")
        assertRefused(#""\ud800""#, containing: "unpaired surrogate")
        assertRefused(#""\udc00""#, containing: "unpaired surrogate")
        assertRefused(#""\ud800x""#, containing: "unpaired surrogate")
        assertRefused(#""\ud800\u0041""#, containing: "unpaired surrogate")
        assertRefused(#""\ud800\ud800""#, containing: "unpaired surrogate")
        assertAccepted(#""\ud800\udc00""#)
        assertAccepted(#""\u0001""#)
    }

    func testStringsLongerThanTheLimitAreRefused() {
        let limits = JSONLimits(maxStringBytes: 8)
        XCTAssertEqual(scan(#""12345678""#, limits: limits), .accepted(storedSize: 10))
        guard case .refused = scan(#""123456789""#, limits: limits) else { return XCTFail("9 bytes > 8") }
    }

    func testUnescapeDecodesEveryEscape() throws {
        let text = #""a\"b\\c\/d\be\ff\ng\rh\ti\u00e9\ud83d\ude00""#
        let decoded = Array(text.utf8).withUnsafeBufferPointer { buffer -> String? in
            var scanner = JSONScanner(buffer)
            return try? scanner.string()
        }
        XCTAssertEqual(decoded, "a\"b\\c/d\u{8}e\u{c}f\ng\rh\ti\u{e9}\u{1F600}")
    }

    // MARK: - I-JSON numbers

    func testNumbersThatFitADoubleAreAccepted() {
        for text in [
            "1e308", "-1e308", "1.7976931348623157e308", "5e-324", "-5e-324", "2.2250738585072014e-308", "0e400", "0.0e-400",
            "-0", "12345678901234567890", "0.1000000000000000055511151231257827",
        ] {
            assertAccepted(text)
        }
    }

    func testNumbersOutsideADoubleAreRefused() {
        for text in ["1e400", "-1e400", "1e99999", "-1e99999", "1.8e308", "1e-400", "-2e-324", "1e1000000000000"] {
            assertRefused(text, containing: "out of range")
        }
        assertRefused(String(repeating: "9", count: 400), containing: "characters")
        assertRefused("0." + String(repeating: "1", count: 500) + "e-16000", containing: "characters")
        assertRefused("[1, 2, 1e400]", containing: "out of range")
        assertRefused("{\"deep\": {\"x\": [1e400]}}", containing: "out of range")
    }

    func testTheNumberLengthLimitIsInclusive() {
        let forty = "1." + String(repeating: "0", count: 38)
        XCTAssertEqual(forty.count, 40)
        assertAccepted(forty)
        assertRefused(forty + "0", containing: "more than 40 characters")
    }

    // MARK: - Size once stored

    func testStoredSizeCountsPlainDecimalNumbersAndSeparatorSpaces() {
        XCTAssertEqual(scan("1"), .accepted(storedSize: 1))
        XCTAssertEqual(scan("1e3"), .accepted(storedSize: 4))  // 1000
        XCTAssertEqual(scan("1e308"), .accepted(storedSize: 309))
        XCTAssertEqual(scan("-1e308"), .accepted(storedSize: 310))
        XCTAssertEqual(scan("1e-3"), .accepted(storedSize: 5))  // 0.001
        XCTAssertEqual(scan("1.50"), .accepted(storedSize: 4))
        XCTAssertEqual(scan("5e-324"), .accepted(storedSize: 326))
        XCTAssertEqual(scan("12.5e1"), .accepted(storedSize: 6), "125 as written: never less than the input")
        XCTAssertEqual(scan(#"{"a":1,"b":2}"#), .accepted(storedSize: 16))  // {"a": 1, "b": 2}
        XCTAssertEqual(scan(#"[1,2,3]"#), .accepted(storedSize: 9))  // [1, 2, 3]
        XCTAssertEqual(scan(" { \"a\" :  1 } "), .accepted(storedSize: 8), "whitespace is not stored")  // {"a": 1}
    }

    func testStoredSizeIsNeverSmallerThanWhatPostgresPrints() {
        // What jsonb prints for these, measured with PostgreSQL 15.
        let printed = [
            "1e308": 309, "5e-324": 326, "1.5e-5": 8, "123.456e2": 8, "0.5": 3, "-0.0": 4, "[1e2,2e-1]": 10,
        ]
        for (text, length) in printed {
            guard case .accepted(let stored) = scan(text) else { return XCTFail(text) }
            XCTAssertGreaterThanOrEqual(stored, length, text)
        }
    }
}
