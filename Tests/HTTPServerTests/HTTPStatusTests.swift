import HTTPServer
import XCTest

final class HTTPStatusTests: XCTestCase {
    /// Every status the server sends goes out with its standard reason phrase, not the
    /// fallback `Status N` (the admin listener's 421 did until session 8).
    func testEveryStatusTheServerSendsHasItsReasonPhrase() {
        let sent = [
            101, 200, 201, 204, 206, 301, 304, 400, 401, 403, 404, 405, 406, 408, 409, 411, 413, 414, 415, 421, 422,
            426, 429, 431, 500, 501, 502, 503, 504, 505,
        ]
        for code in sent {
            XCTAssertFalse(HTTPStatus(code).reason.hasPrefix("Status "), "\(code)")
        }
        XCTAssertEqual(HTTPStatus(421).reason, "Misdirected Request")
        XCTAssertEqual(HTTPStatus(599).reason, "Status 599", "an unknown code still has a phrase")
    }
}
