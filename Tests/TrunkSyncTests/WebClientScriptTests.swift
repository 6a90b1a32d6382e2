import Foundation
import TestSupport
import XCTest

@testable import TrunkSync

/// The binary serves exactly clients/web/trunk-sync.js (scripts/web-client-embed.sh).
final class WebClientScriptTests: XCTestCase {
    func testEmbeddedScriptIsTheFileByteForByte() throws {
        let file = try Data(contentsOf: URL(fileURLWithPath: repositoryRoot() + "/clients/web/trunk-sync.js"))
        XCTAssertFalse(file.isEmpty)
        XCTAssertTrue(
            Array(file) == WebClientScript.bytes, "clients/web/trunk-sync.js differs: run scripts/web-client-embed.sh")
    }

    func testETagMatching() {
        XCTAssertTrue(WebClientRoute.matches(WebClientRoute.etag))
        XCTAssertTrue(WebClientRoute.matches("\"a\", W/\(WebClientRoute.etag)"))
        XCTAssertTrue(WebClientRoute.matches("*"))
        XCTAssertFalse(WebClientRoute.matches("\"a\""))
        XCTAssertFalse(WebClientRoute.matches(""))
    }
}
