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
        scan(bytes: Array(text.utf8), limits: limits)
    }

    func scan(bytes: [UInt8], limits: JSONLimits = .default) -> Outcome {
        bytes.withUnsafeBufferPointer { buffer in
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
            #""""#, #""a""#, #""\"\\\/\b\f\n\r\t""#, #""\u00e9\u20AC""#, #""\ud83d\ude00""#, "\"é€😀\"", "[]", "{}",
            "[1,2,3]",
            #"{"a":1,"b":[true,false,null],"c":{"d":"e"}}"#, " \t\r\n[ 1 , { \"a\" : 2 } ] \n",
        ] {
            assertAccepted(text)
        }
    }

    func testGrammarViolationsAreNotJSON() {
        for text in [
            "", " ", "nul", "tru", "falsey", "NULL", "True", "01", "-", "+1", "1.", ".5", "1e", "1e+", "0x10", "1_000",
            "NaN",
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
            "1e308", "-1e308", "1.7976931348623157e308", "5e-324", "-5e-324", "2.2250738585072014e-308", "0e400",
            "0.0e-400",
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
        // A zero fits any double, but PostgreSQL keeps at most 16383 digits after the point
        // (more fails the whole insert): refused past that, as written or by the exponent.
        for text in ["0e-16384", "-0e-16384", "0.0e-16383", "0e-99999999", "[0.00e-16382]"] {
            assertRefused(text, containing: "16383 digits after the decimal point")
        }
        XCTAssertEqual(scan("0e-16383"), .accepted(storedSize: 16385))  // 0.000… (16383 zeros)
        XCTAssertEqual(scan("0.0e-16382"), .accepted(storedSize: 16385))
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
        // A zero prints as `0` whatever its exponent, without its sign.
        XCTAssertEqual(scan("0e70000"), .accepted(storedSize: 7))
        XCTAssertEqual(scan("-0.00e-2"), .accepted(storedSize: 8))  // 0.0000 (6), as written 8
        XCTAssertEqual(scan(#"{"a":1,"b":2}"#), .accepted(storedSize: 16))  // {"a": 1, "b": 2}
        XCTAssertEqual(scan(#"[1,2,3]"#), .accepted(storedSize: 9))  // [1, 2, 3]
        XCTAssertEqual(scan(" { \"a\" :  1 } "), .accepted(storedSize: 8), "whitespace is not stored")  // {"a": 1}
    }

    func testStoredSizeIsNeverSmallerThanWhatPostgresPrints() {
        // What jsonb prints for these, measured with PostgreSQL 15.
        let printed = [
            "1e308": 309, "5e-324": 326, "1.5e-5": 8, "123.456e2": 8, "0.5": 3, "-0.0": 3, "[1e2,2e-1]": 10,
            "0e-16383": 16385, "0e9": 1, "-0e-3": 5,
        ]
        for (text, length) in printed {
            guard case .accepted(let stored) = scan(text) else { return XCTFail(text) }
            XCTAssertGreaterThanOrEqual(stored, length, text)
        }
    }

    // MARK: - Reading as bytes

    /// SplitMix64: the same inputs on every run.
    struct Generator: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    func testStringsReadAsBytesAreTheStringsUTF8() throws {
        var random = Generator(state: 8)
        let pieces = [
            "a", "é", "€", "😀", #"\n"#, #"\""#, #"\\"#, #"\/"#, #"\u00e9"#, #"\ud83d\ude00"#, #"\u0041"#, #"\b"#,
            #"\f"#,
            #"\r"#, #"\t"#, #"\ud800"#, #"\udfff"#, #"\u0000"#, " ",
        ]
        for _ in 0..<2000 {
            let body = (0..<Int(random.next() % 8)).map { _ in pieces[Int(random.next() % UInt64(pieces.count))] }
                .joined()
            let text = Array(" \"\(body)\" ".utf8)
            let (string, bytes, violations) = text.withUnsafeBufferPointer { buffer in
                var first = JSONScanner(buffer)
                var second = JSONScanner(buffer)
                let string = try? first.string()
                let bytes = try? second.stringUTF8 { Array($0) }
                return (string, bytes, (first.takeViolation(), second.takeViolation()))
            }
            XCTAssertEqual(bytes, string.map { Array($0.utf8) }, body)
            XCTAssertEqual(violations.0, violations.1, body)
            // What Foundation makes of the strings PostgreSQL can store.
            if violations.0 == nil, let string {
                let decoded = try JSONSerialization.jsonObject(with: Data(text), options: .fragmentsAllowed) as? String
                XCTAssertEqual(decoded, string, body)
            }
        }
    }

    func testObjectKeysReadAsBytesAreDecoded() throws {
        let text = Array(#"{"a":1, "t\u0079pe":2, "\ud83d\ude00":3, "":4, "é\n":5}"#.utf8)
        let (strings, bytes) = text.withUnsafeBufferPointer { buffer in
            var strings: [String] = []
            var bytes: [[UInt8]] = []
            var first = JSONScanner(buffer)
            var second = JSONScanner(buffer)
            try? first.object { (scanner: inout JSONScanner, key: String) throws(JSONScanner.Failure) in
                strings.append(key)
                try scanner.skipValue()
            }
            try? second.objectUTF8 {
                (scanner: inout JSONScanner, key: UnsafeBufferPointer<UInt8>) throws(JSONScanner.Failure) in
                bytes.append(Array(key))
                XCTAssertEqual(JSONScanner.equals(key, "type"), bytes.count == 2)
                try scanner.skipValue()
            }
            return (strings, bytes)
        }
        XCTAssertEqual(strings, ["a", "type", "😀", "", "é\n"])
        XCTAssertEqual(bytes, strings.map { Array($0.utf8) })
    }

    /// Numbers without an exponent skip strtod: what it would have said, for any of them.
    func testPlainNumbersAreJudgedAsStrtodJudgesThem() {
        var random = Generator(state: 40)
        let limits = JSONLimits(maxNumberLength: 400)
        func strtodOutcome(_ text: String) -> Outcome {
            let value = strtod(text, nil)
            let nonZero = text.contains { ("1"..."9").contains($0) }
            if !value.isFinite || (value == 0 && nonZero) { return .refused("out of range") }
            return .accepted(storedSize: text.utf8.count)
        }
        for _ in 0..<3000 {
            let long = random.next() % 20 == 0
            let integerDigits = Int(random.next() % (long ? 320 : 20)) + 1
            let fractionDigits = Int(random.next() % 3) == 0 ? 0 : Int(random.next() % 320) + 1
            let digit = { (random: inout Generator) in String(UInt8(ascii: "0") + UInt8(random.next() % 10)) }
            var text = random.next() % 2 == 0 ? "-" : ""
            text += integerDigits == 1 ? digit(&random) : "1" + (1..<integerDigits).map { _ in digit(&random) }.joined()
            if fractionDigits > 0 {
                let zeros = Int(random.next() % UInt64(fractionDigits + 1))
                let rest = (zeros..<fractionDigits).map { _ in digit(&random) }.joined()
                text += "." + String(repeating: "0", count: zeros) + rest
            }
            guard text.utf8.count <= limits.maxNumberLength else { continue }
            switch (scan(text, limits: limits), strtodOutcome(text)) {
            case (.accepted(let stored), .accepted(let expected)): XCTAssertEqual(stored, expected, text)
            case (.refused, .refused): break
            case (let scanned, let expected): XCTFail("\(text): \(scanned), strtod says \(expected)")
            }
        }
        XCTAssertEqual(scan(String(repeating: "9", count: 300), limits: limits), .accepted(storedSize: 300))
        guard case .refused = scan(String(repeating: "9", count: 309), limits: limits) else { return XCTFail("10^309") }
    }

    /// Strings are skipped 8 bytes at a time while they are plain ASCII: whatever the
    /// position of the byte that ends a run, it is read as itself.
    func testEveryByteThatEndsAPlainRunIsSeenAtEveryPosition() {
        for position in 0..<20 {
            let run = [UInt8](repeating: UInt8(ascii: "a"), count: position)
            func outcome(_ special: [UInt8], _ tail: String = "bcdefghijklmnopq\"") -> Outcome {
                scan(bytes: [UInt8(ascii: "\"")] + run + special + Array(tail.utf8))
            }
            let plain = run.count + 16 + 2
            XCTAssertEqual(outcome([], ""), .failed("unterminated string"), "\(position)")
            XCTAssertEqual(outcome([UInt8(ascii: "\"")], ""), .accepted(storedSize: position + 2), "\(position)")
            XCTAssertEqual(outcome([0x7F]), .accepted(storedSize: plain + 1), "\(position)")
            XCTAssertEqual(outcome(Array("é".utf8)), .accepted(storedSize: plain + 2), "\(position)")
            XCTAssertEqual(outcome(Array(#"\n"#.utf8)), .accepted(storedSize: plain + 2), "\(position)")
            XCTAssertEqual(
                outcome(Array(#"\u0000"#.utf8)), .refused("\\u0000 is not allowed in a string"), "\(position)")
            XCTAssertEqual(outcome([0x01]), .failed("control character in string"), "\(position)")
            XCTAssertEqual(outcome([0x1F]), .failed("control character in string"), "\(position)")
            XCTAssertEqual(outcome([0xFF]), .failed("invalid UTF-8"), "\(position)")
            XCTAssertEqual(outcome([0xC3]), .failed("invalid UTF-8"), "\(position)")
            XCTAssertEqual(outcome([UInt8(ascii: "\\"), UInt8(ascii: "x")]), .failed("invalid escape"), "\(position)")
        }
    }
}
