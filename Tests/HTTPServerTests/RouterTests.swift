import XCTest

@testable import HTTPServer

final class RouterTests: XCTestCase {
    private func makeRouter() -> Router {
        var router = Router()
        router.addInline(.get, "/healthz") { _ in HTTPResponse(status: .ok, body: Array("health".utf8)) }
        router.add(.get, "/rest/v1/:table") { request in
            HTTPResponse(status: .ok, body: Array("list \(request.parameters["table"] ?? "")".utf8))
        }
        router.add(.post, "/rest/v1/:table") { _ in HTTPResponse(status: .created) }
        router.add(.get, "/users/:id/events/:seq") { _ in HTTPResponse(status: .ok) }
        router.add(.delete, "/users/:id") { _ in HTTPResponse(status: .noContent) }
        router.add(.get, "/users/me") { _ in HTTPResponse(status: .ok, body: Array("me".utf8)) }
        return router
    }

    /// The action and parameters of a found route, or nil.
    private func found(_ match: Router.Match) -> (Router.Action, [String: String])? {
        if case .found(let action, let parameters, _) = match { return (action, parameters) }
        return nil
    }

    private func run(_ action: Router.Action, _ request: HTTPRequest = HTTPRequest(method: .get, path: "/"))
        async throws
        -> HTTPResponse
    {
        switch action {
        case .inline(let handler): return handler(request)
        case .async(let handler): return try await handler(request)
        }
    }

    func testLiteralRouteMatches() async throws {
        let (action, parameters) = try XCTUnwrap(found(makeRouter().match(method: .get, path: "/healthz")))
        XCTAssertEqual(parameters, [:])
        let response = try await run(action)
        XCTAssertEqual(response.body, Array("health".utf8))
        guard case .inline = action else { return XCTFail("an inline route stays inline") }
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

    func testFirstMatchingRouteWins() async throws {
        var router = Router()
        router.addInline(.get, "/users/:id") { _ in HTTPResponse(status: .ok, body: Array("by id".utf8)) }
        router.addInline(.get, "/users/me") { _ in HTTPResponse(status: .ok, body: Array("me".utf8)) }
        let (action, parameters) = try XCTUnwrap(found(router.match(method: .get, path: "/users/me")))
        XCTAssertEqual(parameters, ["id": "me"])
        let response = try await run(action)
        XCTAssertEqual(response.body, Array("by id".utf8))
        // A route for another method does not shadow a later one for this method.
        let (later, _) = try XCTUnwrap(found(makeRouter().match(method: .get, path: "/users/me")))
        let laterResponse = try await run(later)
        XCTAssertEqual(laterResponse.body, Array("me".utf8))
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
    }

    func testHeadFallsBackToGet() async throws {
        let router = makeRouter()
        let (action, parameters) = try XCTUnwrap(found(router.match(method: .head, path: "/rest/v1/events")))
        XCTAssertEqual(parameters, ["table": "events"])
        var request = HTTPRequest(method: .head, path: "/rest/v1/events")
        request.parameters = parameters
        let response = try await run(action, request)
        XCTAssertEqual(response.body, Array("list events".utf8))

        guard case .methodNotAllowed(let allowed) = router.match(method: .head, path: "/users/1") else {
            return XCTFail("HEAD without a GET route should be not allowed")
        }
        XCTAssertEqual(allowed, ["DELETE", "OPTIONS"])
    }

    func testExplicitHeadRouteWinsOverGet() async throws {
        var router = Router()
        router.addInline(.get, "/x") { _ in HTTPResponse(status: .ok) }
        router.addInline(.head, "/x") { _ in HTTPResponse(status: .noContent) }
        let (action, _) = try XCTUnwrap(found(router.match(method: .head, path: "/x")))
        let response = try await run(action)
        XCTAssertEqual(response.status, .noContent)
    }

    func testEmptySegmentsAreIgnored() {
        let router = makeRouter()
        XCTAssertNotNil(found(router.match(method: .get, path: "/healthz/")))
        XCTAssertNotNil(found(router.match(method: .get, path: "//rest//v1/events")))
    }
}
