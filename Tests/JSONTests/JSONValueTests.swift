import XCTest

@testable import JSON

final class JSONValueTests: XCTestCase {
    func testParsesEveryValueKind() throws {
        let value = try JSONValue.parse(Array(#"{"a":[1,2.5,"x",true,false,null],"b":{"c":-0}}"#.utf8))
        XCTAssertEqual(
            value,
            .object([
                "a": .array([.number(1), .number(2.5), .string("x"), .bool(true), .bool(false), .null]),
                "b": .object(["c": .number(-0.0)]),
            ]))
    }

    func testProblemsNameTheMember() {
        func problem(_ text: String) -> JSONInputError? {
            do {
                _ = try JSONValue.parse(Array(text.utf8))
                return nil
            } catch { return error }
        }
        XCTAssertEqual(problem(#"{"data":{"name":"a\u0000"}}"#)?.path, "data.name")
        XCTAssertEqual(problem(#"{"data":{"name":"a\u0000"}}"#)?.kind, .invalidValue)
        XCTAssertEqual(problem(#"{"items":[1,2,1e400]}"#)?.path, "items[2]")
        XCTAssertEqual(problem(#"{"a":"\ud800"}"#)?.path, "a")
        XCTAssertEqual(problem(#"{"a":}"#)?.kind, .malformed)
        XCTAssertEqual(problem("[1] 2")?.kind, .malformed)
        XCTAssertEqual(problem(String(repeating: "[", count: 70) + String(repeating: "]", count: 70))?.kind, .malformed)
        XCTAssertNil(problem(#"{"ok":[1,{"b":null}]}"#))
    }

    func testTheDocumentSizeLimitHolds() {
        XCTAssertThrowsError(try JSONValue.parse(Array("[1,2,3]".utf8), limits: JSONLimits(maxBytes: 6))) { error in
            XCTAssertEqual((error as? JSONInputError)?.kind, .tooLarge)
        }
    }

    func testWritesKeysSortedAndNumbersInTheirShortestForm() throws {
        let value = JSONValue.object([
            "b": .number(1e308), "a": .number(Double("5e-324")!), "c": .number(1.5),
            // From text, as a client sends them (as literals the compiler warns of their rounding).
            "d": .number(Double("12345678901234567890")!),
            "e": .number(-0.0), "f": .number(42), "g": .string("q\"\n"),
        ])
        let text = String(decoding: value.jsonBytes, as: UTF8.self)
        XCTAssertEqual(
            text, #"{"a":5e-324,"b":1e+308,"c":1.5,"d":1.2345678901234567e+19,"e":-0.0,"f":42,"g":"q\"\n"}"#)
        // And it reads back as the same value.
        XCTAssertEqual(try JSONValue.parse(value.jsonBytes), value)
    }

    func testDecodingEntryPointKeepsTheParsersRulesAndNamesFields() {
        struct Body: Decodable {
            var email: String
            var count: Int?
        }
        func decode(_ text: String) -> Result<Body, JSONInputError> {
            do { return .success(try JSONBody.decode(Body.self, from: Array(text.utf8))) } catch {
                return .failure(error)
            }
        }
        XCTAssertEqual(try decode(#"{"email":"a@b.c","count":2}"#).get().count, 2)
        guard case .failure(let nul) = decode(#"{"email":"a\u0000@b.c"}"#) else { return XCTFail("NUL") }
        XCTAssertEqual(nul.kind, .invalidValue)
        XCTAssertEqual(nul.path, "email")
        guard case .failure(let type) = decode(#"{"email":"a@b.c","count":"two"}"#) else { return XCTFail("type") }
        XCTAssertEqual(type.kind, .wrongType)
        XCTAssertEqual(type.path, "count")
        guard case .failure(let missing) = decode(#"{"count":1}"#) else { return XCTFail("missing") }
        XCTAssertEqual(missing.path, "email")
        guard case .failure(let array) = decode("[1]") else { return XCTFail("array") }
        XCTAssertEqual(array.kind, .wrongType)
        guard case .failure(let broken) = decode("{") else { return XCTFail("broken") }
        XCTAssertEqual(broken.kind, .malformed)
    }
}
