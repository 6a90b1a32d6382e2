import XCTest

@testable import HTTPServer

final class RouterTests: XCTestCase {
    private func makeRouter() -> Router<String> {
        var router = Router<String>()
        router.add(.get, "/healthz", "health")
        router.add(.get, "/rest/v1/:table", "list")
        router.add(.post, "/rest/v1/:table", "insert")
        router.add(.get, "/users/:id/events/:seq", "event")
        router.add(.delete, "/users/:id", "delete user")
        router.add(.get, "/users/me", "me")
        return router
    }

    /// The endpoint and parameters of a found route, or nil.
    private func found(_ match: Router<String>.Match) -> (String, [String: String])? {
        if case .found(let endpoint, let parameters, _) = match { return (endpoint, parameters) }
        return nil
    }

    func testLiteralRouteMatchesWithItsPattern() throws {
        guard
            case .found(let endpoint, let parameters, let pattern) = makeRouter().match(method: .get, path: "/healthz")
        else { return XCTFail("/healthz should match") }
        XCTAssertEqual(endpoint, "health")
        XCTAssertEqual(parameters, [:])
        XCTAssertEqual(pattern, "/healthz")
        guard case .found(_, _, let template) = makeRouter().match(method: .get, path: "/rest/v1/events") else {
            return XCTFail("/rest/v1/events should match")
        }
        XCTAssertEqual(template, "/rest/v1/:table", "metrics label by pattern, never by raw path")
    }

    func testParametersAreCapturedAndPercentDecoded() throws {
        let router = makeRouter()
        XCTAssertEqual(found(router.match(method: .get, path: "/rest/v1/events"))?.1, ["table": "events"])
        XCTAssertEqual(
            found(router.match(method: .get, path: "/users/42/events/7"))?.1, ["id": "42", "seq": "7"])
        // Path parameters decode %XX but keep `+` (only query strings use `+` for a space).
        XCTAssertEqual(
            found(router.match(method: .get, path: "/rest/v1/a%20b+c%2Fd"))?.1, ["table": "a b+c/d"])
        XCTAssertEqual(found(router.match(method: .get, path: "/rest/v1/100%"))?.1, ["table": "100%"])
    }

    func testFirstMatchingRouteWins() throws {
        var router = Router<String>()
        router.add(.get, "/users/:id", "by id")
        router.add(.get, "/users/me", "me")
        let (endpoint, parameters) = try XCTUnwrap(found(router.match(method: .get, path: "/users/me")))
        XCTAssertEqual(parameters, ["id": "me"])
        XCTAssertEqual(endpoint, "by id", "a literal route added later does not jump the queue")
        // A route for another method does not shadow a later one for this method.
        XCTAssertEqual(found(makeRouter().match(method: .get, path: "/users/me"))?.0, "me")
    }

    func testUnknownPathIsNotFound() {
        let router = makeRouter()
        for path in ["/", "/nope", "/healthz/extra", "/rest/v1", "/rest/v1/events/extra", "/users/1/events"] {
            guard case .notFound = router.match(method: .get, path: path) else {
                return XCTFail("\(path) should not match")
            }
        }
        XCTAssertEqual(router.allowedMethods(path: "/nope"), [])
    }

    func testWrongMethodIsNotAllowedWithAllowList() {
        let router = makeRouter()
        guard case .methodNotAllowed(let allowed) = router.match(method: .put, path: "/rest/v1/events") else {
            return XCTFail("PUT should be not allowed")
        }
        XCTAssertEqual(allowed, ["GET", "POST", "HEAD", "OPTIONS"])

        guard case .methodNotAllowed(let deleteOnly) = router.match(method: .get, path: "/users/1") else {
            return XCTFail("GET /users/1 should be not allowed")
        }
        XCTAssertEqual(deleteOnly, ["DELETE", "OPTIONS"], "no HEAD without GET")
        XCTAssertEqual(router.allowedMethods(path: "/healthz"), ["GET", "HEAD", "OPTIONS"])
        guard case .methodNotAllowed = router.match(method: .post, path: "/healthz") else {
            return XCTFail("POST /healthz should be not allowed")
        }
    }

    func testHeadFallsBackToGet() throws {
        let router = makeRouter()
        let (endpoint, parameters) = try XCTUnwrap(found(router.match(method: .head, path: "/rest/v1/events")))
        XCTAssertEqual(parameters, ["table": "events"])
        XCTAssertEqual(endpoint, "list")
        XCTAssertEqual(found(router.match(method: .head, path: "/healthz"))?.0, "health")

        guard case .methodNotAllowed(let allowed) = router.match(method: .head, path: "/users/1") else {
            return XCTFail("HEAD without a GET route should be not allowed")
        }
        XCTAssertEqual(allowed, ["DELETE", "OPTIONS"])
    }

    func testExplicitHeadRouteWinsOverGet() throws {
        var router = Router<String>()
        router.add(.get, "/x", "get")
        router.add(.head, "/x", "head")
        XCTAssertEqual(found(router.match(method: .head, path: "/x"))?.0, "head")
    }

    func testEmptySegmentsAreIgnored() {
        let router = makeRouter()
        XCTAssertEqual(found(router.match(method: .get, path: "/healthz/"))?.0, "health")
        XCTAssertNotNil(found(router.match(method: .get, path: "//rest//v1/events")))
    }
}
