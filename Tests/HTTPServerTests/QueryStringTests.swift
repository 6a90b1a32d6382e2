import HTTPServer
import XCTest

final class QueryStringTests: XCTestCase {
    private func pairs(_ query: String) -> [String] {
        QueryString.parse(query).map { "\($0.name)=\($0.value)" }
    }

    func testPlusIsASpaceAndEscapedPlusIsAPlus() {
        XCTAssertEqual(pairs("q=a+b"), ["q=a b"])
        XCTAssertEqual(pairs("q=a%2Bb"), ["q=a+b"])
        XCTAssertEqual(pairs("q=a%2bb"), ["q=a+b"], "hex digits in either case")
        XCTAssertEqual(pairs("a+b=c"), ["a b=c"], "names are decoded too")
    }

    func testPercentEscapesDecode() {
        XCTAssertEqual(pairs("select=%2A"), ["select=*"])
        XCTAssertEqual(pairs("created_at=gt.2026-11-22T04%3A10%3A02.123Z"), ["created_at=gt.2026-11-22T04:10:02.123Z"])
        XCTAssertEqual(pairs("email=a%40example.com"), ["email=a@example.com"])
        XCTAssertEqual(pairs("name=J%C3%BCrgen"), ["name=Jürgen"], "UTF-8 sequences")
        XCTAssertEqual(pairs("x=%26%3D"), ["x=&="], "escaped separators stay in the value")
    }

    func testMalformedEscapesAreKeptAsTheyAre() {
        XCTAssertEqual(pairs("x=100%"), ["x=100%"])
        XCTAssertEqual(pairs("x=%4"), ["x=%4"])
        XCTAssertEqual(pairs("x=%zz"), ["x=%zz"])
        XCTAssertEqual(pairs("x=%%41"), ["x=%A"])
        XCTAssertEqual(pairs("x=a%2"), ["x=a%2"])
        XCTAssertEqual(pairs("x=%G1"), ["x=%G1"])
    }

    func testInvalidUTF8BecomesReplacementCharacters() {
        XCTAssertEqual(pairs("x=%FF"), ["x=\u{FFFD}"])
    }

    func testPairsKeepOrderAndEmptySegmentsAreSkipped() {
        XCTAssertEqual(pairs("a=1&&b=2&a=3&"), ["a=1", "b=2", "a=3"])
        XCTAssertEqual(pairs("flag&x="), ["flag=", "x="])
        XCTAssertEqual(pairs("a=b=c"), ["a=b=c"], "only the first = separates")
        XCTAssertEqual(pairs(""), [])
    }

    func testRequestQueryValue() {
        let request = HTTPRequest(method: .get, path: "/sync/v1/events", query: "after=4%32&limit=10&after=7")
        XCTAssertEqual(request.queryValue("after"), "42", "the first value wins")
        XCTAssertEqual(request.queryValue("limit"), "10")
        XCTAssertNil(request.queryValue("wait"))
        XCTAssertTrue(HTTPRequest(method: .get, path: "/").queryItems.isEmpty)
    }

    func testPercentDecodeWithoutPlusAsSpace() {
        XCTAssertEqual(QueryString.percentDecode(Array("a+b%20c".utf8), plusAsSpace: false), "a+b c")
        XCTAssertEqual(QueryString.percentDecode(Array("a+b%20c".utf8), plusAsSpace: true), "a b c")
    }
}
