import Foundation
import JSON
import Logging
import Synchronization
import TestSupport
import TrunkCrypto
import XCTest

@testable import HTTPServer
@testable import Postgres
@testable import TrunkSync

/// The request pipeline's stages one by one (admit, respond, complete), the authenticator
/// and the error model: no database, no sockets. Heads come from the real parser.
final class PipelineStageTests: XCTestCase {
    // MARK: - Admit: routing and body limits

    func testAdmitKnownRouteReadsBodyUpToTheRouteLimit() throws {
        let harness = PipelineHarness()
        let cases: [(HTTPRequestHead, Int)] = [
            (try head("GET", "/x"), Endpoint.BodyLimit.none),
            (try head("HEAD", "/x"), Endpoint.BodyLimit.none),  // HEAD falls back to GET
            (try head("POST", "/upload", body: 16), 16),  // exactly the limit
            (try head("POST", "/upload", ["Transfer-Encoding": "chunked"]), 16),  // cut off later by the server
            (try head("POST", "/auth/v1/otp", body: 32), 32),
            (
                try head(
                    "POST", "/rest/v1/events",
                    ["Authorization": "Bearer \(signedToken(exp: Int64(Date().timeIntervalSince1970) + 600))"], body: 0),
                64
            ),
        ]
        for (head, limit) in cases {
            guard case .readBody(let bodyLimit, let context) = harness.pipeline.admit(head, client: "192.0.2.1") else {
                XCTFail("\(head.method) \(head.path): not admitted to read its body")
                continue
            }
            XCTAssertEqual(bodyLimit, limit, "\(head.method) \(head.path)")
            XCTAssertEqual(context.endpoint?.bodyLimit, limit)
            XCTAssertEqual(context.method, head.method)
            XCTAssertEqual(context.path, head.path)
        }
        // Route parameters are matched from the head and kept for the handler.
        guard case .readBody(_, let context) = harness.pipeline.admit(try head("GET", "/echo/a%20b?q=1"), client: "")
        else { return XCTFail("/echo/:name not admitted") }
        XCTAssertEqual(context.parameters, ["name": "a b"])
        XCTAssertEqual(context.path, "/echo/a%20b")
    }

    func testAdmitUnknownPathAnswers404AfterTheBodyInTheNativeShape() throws {
        let harness = PipelineHarness()
        for head in [try head("GET", "/nope"), try head("POST", "/nope", body: 10), try head("GET", "/auth/v1")] {
            let (response, context) = try answerAfterBody(harness.pipeline.admit(head, client: ""))
            XCTAssertEqual(response.status.code, 404)
            try assertJSON(response, #"{"code":"not_found","message":"Not found."}"#)
            XCTAssertEqual(headerNames(response), ["Content-Type"])
            XCTAssertNil(context.endpoint)
        }
    }

    func testAdmitUnknownAuthPathAnswersInTheGoTrueShape() throws {
        let harness = PipelineHarness()
        let (response, _) = try answerAfterBody(harness.pipeline.admit(try head("GET", "/auth/v1/nope"), client: ""))
        XCTAssertEqual(response.status.code, 404)
        try assertJSON(
            response, #"{"code":"not_found","error_code":"not_found","message":"Not found.","msg":"Not found."}"#)
        XCTAssertEqual(response.headers["X-Supabase-Api-Version"], "2024-01-01")
        XCTAssertNil(response.headers["Proxy-Status"])
    }

    func testAdmitUnknownRESTPathAnswersInThePostgRESTShape() throws {
        let harness = PipelineHarness()
        let (response, _) = try answerAfterBody(harness.pipeline.admit(try head("GET", "/rest/v1/nope"), client: ""))
        XCTAssertEqual(response.status.code, 404)
        try assertJSON(response, #"{"code":"PGRST125","details":null,"hint":null,"message":"Not found."}"#)
        XCTAssertEqual(response.headers["Proxy-Status"], "PostgREST; error=PGRST125")
        XCTAssertNil(response.headers["X-Supabase-Api-Version"])
    }

    func testAdmitWrongMethodAnswers405WithAllowInTheFamilyShape() throws {
        let harness = PipelineHarness()
        let (native, _) = try answerAfterBody(harness.pipeline.admit(try head("POST", "/x", body: 3), client: ""))
        XCTAssertEqual(native.status.code, 405)
        XCTAssertEqual(native.headers.values(for: "Allow"), ["GET, HEAD, OPTIONS"])
        try assertJSON(native, #"{"code":"method_not_allowed","message":"Method POST is not allowed here."}"#)

        let (auth, _) = try answerAfterBody(harness.pipeline.admit(try head("DELETE", "/auth/v1/user"), client: ""))
        XCTAssertEqual(auth.status.code, 405)
        XCTAssertEqual(auth.headers["Allow"], "GET, HEAD, OPTIONS")
        XCTAssertEqual(auth.headers["X-Supabase-Api-Version"], "2024-01-01")
        try assertJSON(
            auth,
            #"{"code":"method_not_allowed","error_code":"method_not_allowed","message":"Method DELETE is not allowed here.","msg":"Method DELETE is not allowed here."}"#
        )

        let (rest, _) = try answerAfterBody(harness.pipeline.admit(try head("PUT", "/rest/v1/events"), client: ""))
        XCTAssertEqual(rest.status.code, 405)
        XCTAssertEqual(rest.headers["Allow"], "GET, POST, HEAD, OPTIONS")
        XCTAssertEqual(rest.headers["Proxy-Status"], "PostgREST; error=method_not_allowed")
        try assertJSON(
            rest,
            #"{"code":"method_not_allowed","details":null,"hint":null,"message":"Method PUT is not allowed here."}"#)
    }

    func testAdmitContentLengthOverTheRouteLimitAnswers413AtOnceInTheFamilyShape() throws {
        let harness = PipelineHarness()

        let (native, context) = try answer(harness.pipeline.admit(try head("POST", "/upload", body: 17), client: ""))
        XCTAssertEqual(native.status.code, 413)
        try assertJSON(
            native,
            #"{"code":"body_too_large","message":"The request body is larger than this route accepts (16 bytes)."}"#)
        XCTAssertTrue(context.endpoint === harness.endpoint(.post, "/upload"), "the 413 is observed under its route")

        let (none, _) = try answer(harness.pipeline.admit(try head("GET", "/x", body: 1025), client: ""))
        XCTAssertEqual(none.status.code, 413)
        try assertJSON(
            none,
            #"{"code":"body_too_large","message":"The request body is larger than this route accepts (1024 bytes)."}"#)

        let (auth, _) = try answer(harness.pipeline.admit(try head("POST", "/auth/v1/otp", body: 33), client: ""))
        XCTAssertEqual(auth.status.code, 413)
        XCTAssertEqual(auth.headers["X-Supabase-Api-Version"], "2024-01-01")
        let authMessage = "The request body is larger than this route accepts (32 bytes)."
        try assertJSON(
            auth,
            #"{"code":"body_too_large","error_code":"body_too_large","message":"\#(authMessage)","msg":"\#(authMessage)"}"#
        )

        // Before authentication: no token needed to be refused.
        let (rest, _) = try answer(harness.pipeline.admit(try head("POST", "/rest/v1/events", body: 65), client: ""))
        XCTAssertEqual(rest.status.code, 413)
        XCTAssertEqual(rest.headers["Proxy-Status"], "PostgREST; error=PGRST413")
        try assertJSON(
            rest,
            #"{"code":"PGRST413","details":null,"hint":null,"message":"The request body is larger than this route accepts (64 bytes)."}"#
        )
    }

    // MARK: - Admit: OPTIONS

    func testPreflightFromAnAllowedOriginGetsCORSHeaders() throws {
        let harness = PipelineHarness(corsOrigins: [listedOrigin])
        let (response, _) = try answer(
            harness.pipeline.admit(
                try head(
                    "OPTIONS", "/rest/v1/events",
                    [
                        "Origin": listedOrigin, "Access-Control-Request-Method": "POST",
                        "Access-Control-Request-Headers": "authorization, apikey",
                    ]), client: ""))
        XCTAssertEqual(response.status.code, 204)
        XCTAssertEqual(response.headers["Access-Control-Allow-Origin"], listedOrigin)
        XCTAssertEqual(response.headers["Access-Control-Allow-Methods"], "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
        XCTAssertEqual(response.headers["Access-Control-Allow-Headers"], "authorization, apikey")
        XCTAssertEqual(response.headers["Access-Control-Max-Age"], "86400")
        XCTAssertNil(response.headers["Allow"])
        XCTAssertTrue(response.body.isEmpty)

        // Without Access-Control-Request-Headers: the default list.
        let (defaults, _) = try answer(
            harness.pipeline.admit(
                try head("OPTIONS", "/x", ["Origin": listedOrigin, "Access-Control-Request-Method": "GET"]), client: "")
        )
        XCTAssertEqual(defaults.headers["Access-Control-Allow-Headers"], CORSPolicy.defaultAllowedHeaders)
        XCTAssertTrue(defaults.headers["Access-Control-Allow-Headers"]?.contains("x-request-id") == true)

        // Any origin.
        let any = PipelineHarness(corsOrigins: ["*"])
        let (star, _) = try answer(
            any.pipeline.admit(
                try head(
                    "OPTIONS", "/x", ["Origin": "https://elsewhere.test", "Access-Control-Request-Method": "GET"]),
                client: ""))
        XCTAssertEqual(star.headers["Access-Control-Allow-Origin"], "*")
    }

    func testPreflightFromADisallowedOriginGetsNoCORSHeaders() throws {
        let harness = PipelineHarness(corsOrigins: [listedOrigin])
        let (response, context) = try answer(
            harness.pipeline.admit(
                try head("OPTIONS", "/x", ["Origin": "https://evil.test", "Access-Control-Request-Method": "GET"]),
                client: ""))
        XCTAssertEqual(response.status.code, 204)
        XCTAssertEqual(headerNames(response), [])
        var completed = response
        harness.pipeline.complete(&completed, context: context)
        XCTAssertEqual(headerNames(completed), ["X-Request-Id"])
    }

    func testOptionsWithoutCORSConfiguredAnswersAllow() throws {
        let harness = PipelineHarness()
        // Even a browser's preflight gets no CORS headers when no origin is configured.
        let (response, context) = try answer(
            harness.pipeline.admit(
                try head("OPTIONS", "/x", ["Origin": listedOrigin, "Access-Control-Request-Method": "GET"]), client: "")
        )
        XCTAssertEqual(response.status.code, 204)
        XCTAssertEqual(response.headers.values(for: "Allow"), ["GET, HEAD, OPTIONS"])
        XCTAssertNil(response.headers["Access-Control-Allow-Origin"])
        XCTAssertNil(context.origin)

        let (rest, _) = try answer(harness.pipeline.admit(try head("OPTIONS", "/rest/v1/events"), client: ""))
        XCTAssertEqual(rest.headers["Allow"], "GET, POST, HEAD, OPTIONS")

        let (server, _) = try answer(harness.pipeline.admit(try head("OPTIONS", "*"), client: ""))
        XCTAssertEqual(server.status.code, 204)
        XCTAssertEqual(server.headers["Allow"], "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")

        let (unknown, _) = try answer(harness.pipeline.admit(try head("OPTIONS", "/auth/v1/nope"), client: ""))
        XCTAssertEqual(unknown.status.code, 404)
        XCTAssertEqual(unknown.headers["X-Supabase-Api-Version"], "2024-01-01")
    }

    // MARK: - Admit: request id

    func testRequestIDIsTakenWhenWellFormedAndReplacedWhenNot() throws {
        let harness = PipelineHarness()
        func requestID(_ value: String?) throws -> String {
            var headers: HTTPHeaders = [:]
            if let value { headers.append(name: "X-Request-Id", value: value) }
            let head = try head("GET", "/x", headers)
            guard case .readBody(_, let context) = harness.pipeline.admit(head, client: "") else {
                throw TestEnvironmentError("GET /x not admitted")
            }
            return context.requestID
        }
        let longest = String(repeating: "a", count: 128)
        for kept in ["abc-DEF_1.2:3", "7", longest, "0f8fad5b-d9cb-469f-a165-70867728950e"] {
            XCTAssertEqual(try requestID(kept), kept)
        }
        var generated: [String] = []
        for replaced in [
            "abc def", String(repeating: "a", count: 129), String(repeating: "b", count: 200), "a/b", "id\"x",
            "caf\u{E9}", "a,b", nil,
        ] as [String?] {
            let id = try requestID(replaced)
            XCTAssertNotEqual(id, replaced)
            XCTAssertNotNil(
                id.range(of: "^[0-9a-f]{6}-[0-9a-f]+$", options: .regularExpression), "generated id \(id)")
            generated.append(id)
        }
        XCTAssertEqual(Set(generated).count, generated.count, "generated ids are unique")
        XCTAssertEqual(Set(generated.map { $0.prefix(7) }).count, 1, "one per-process prefix")
        // Unit check of the rule itself.
        XCTAssertNil(RequestIDGenerator.sanitize(""))
        XCTAssertEqual(RequestIDGenerator.sanitize("A.z:0_9-"), "A.z:0_9-")
    }

    // MARK: - Respond: handlers

    func testInlineHandlerAnswersNowAndOthersLater() async throws {
        let harness = PipelineHarness()
        let context = try admitted(harness, try head("GET", "/x", ["X-Request-Id": "inline-1"]))
        let request = HTTPRequest(method: .get, path: "/x")
        guard case .now(let response, let after) = harness.pipeline.respond(to: request, context: context) else {
            return XCTFail("an inline handler answers on the loop")
        }
        XCTAssertEqual(response.status.code, 200)
        XCTAssertEqual(String(decoding: response.body, as: UTF8.self), #"{"ok":true}"#)
        XCTAssertEqual(after.requestID, "inline-1")

        let open = try admitted(harness, try head("GET", "/echo/a%20b", ["X-Request-Id": "open-1"]))
        guard case .later = harness.pipeline.respond(to: HTTPRequest(method: .get, path: "/echo/a%20b"), context: open)
        else { return XCTFail("an open handler runs as a task") }
    }

    func testOpenHandlerSeesRequestIDParametersAndTaskLocal() async throws {
        let harness = PipelineHarness()
        let (response, context) = await harness.run(try head("GET", "/echo/a%20b?x=1", ["X-Request-Id": "req-42"]))
        XCTAssertEqual(response.status.code, 200)
        try assertJSON(response, #"{"name":"a b","request_id":"req-42","task_local":"req-42","query":"x=1"}"#)
        XCTAssertEqual(context.requestID, "req-42")
        XCTAssertNil(context.userID)
        XCTAssertNil(RequestContext.requestID, "the task-local is set only while the handler runs")
    }

    func testAuthenticatedWithoutTokenIs401InEachFamilyShape() async throws {
        let harness = PipelineHarness()
        let native = harness.atHead(try head("GET", "/sync/v1/me"))
        XCTAssertEqual(native.0.status.code, 401)
        try assertJSON(native.0, #"{"code":"unauthorized","message":"A valid bearer access token is required."}"#)

        let auth = harness.atHead(try head("GET", "/auth/v1/user"))
        XCTAssertEqual(auth.0.status.code, 401)
        XCTAssertEqual(auth.0.headers["X-Supabase-Api-Version"], "2024-01-01")
        try assertJSON(
            auth.0,
            #"{"code":"no_authorization","error_code":"no_authorization","message":"This endpoint requires a bearer access token","msg":"This endpoint requires a bearer access token"}"#
        )

        let rest = harness.atHead(try head("GET", "/rest/v1/events"))
        XCTAssertEqual(rest.0.status.code, 401)
        XCTAssertEqual(rest.0.headers["Proxy-Status"], "PostgREST; error=PGRST301")
        try assertJSON(rest.0, #"{"code":"PGRST301","details":null,"hint":null,"message":"JWT could not be verified"}"#)

        // Another scheme is no bearer token either.
        let basic = harness.atHead(try head("GET", "/auth/v1/user", ["Authorization": "Basic dXNlcjpwYXNz"]))
        XCTAssertEqual(try json(basic.0)["code"], .string("no_authorization"))

        for (_, context) in [native, auth, rest, basic] { XCTAssertNil(context.userID) }
        XCTAssertEqual(harness.handlerCalls.count, 0, "no handler ran")
    }

    func testAuthenticatedWithAnInvalidTokenIs401() async throws {
        let harness = PipelineHarness()
        let user = UUID()
        let now = Int64(Date().timeIntervalSince1970)
        let invalid = [
            "abc",
            "a.b.c",
            signedToken(user: user, exp: now + 600, secret: "another-secret-another-secret-0000"),
            signedToken(user: user, exp: now - TokenIssuer.leeway - 60),  // expired beyond the leeway
            signedToken(user: user, exp: now + 600, audience: "anon"),
            signedToken(subject: "not-a-uuid", exp: now + 600),
            // Right key, wrong claims: another issuer, none, issued or valid only in the
            // future beyond the clock skew, no issue time, no session to revoke.
            signedToken(user: user, exp: now + 600, issuer: "http://other.example/auth/v1"),
            signedToken(user: user, exp: now + 600, issuer: testIssuer + "/"),
            signedToken(user: user, exp: now + 600, issuer: nil),
            signedToken(user: user, exp: now + 600, issuedAt: now + TokenIssuer.leeway + 60),
            signedToken(user: user, exp: now + 600, notBefore: now + TokenIssuer.leeway + 60),
            signedToken(user: user, exp: now + 600, issuedAt: nil),
            signedToken(user: user, session: nil, exp: now + 600),
        ]
        for token in invalid {
            let auth = harness.atHead(try head("GET", "/auth/v1/user", ["Authorization": "Bearer \(token)"]))
            XCTAssertEqual(auth.0.status.code, 401, token)
            try assertJSON(
                auth.0,
                #"{"code":"bad_jwt","error_code":"bad_jwt","message":"Invalid or expired access token","msg":"Invalid or expired access token"}"#
            )
            XCTAssertNil(auth.1.userID)

            let native = harness.atHead(try head("GET", "/sync/v1/me", ["Authorization": "Bearer \(token)"]))
            XCTAssertEqual(native.0.status.code, 401)
            XCTAssertEqual(try json(native.0)["code"], .string("unauthorized"))

            let rest = harness.atHead(try head("GET", "/rest/v1/events", ["Authorization": "Bearer \(token)"]))
            XCTAssertEqual(rest.0.status.code, 401)
            XCTAssertEqual(try json(rest.0)["code"], .string("PGRST301"))
        }
        XCTAssertEqual(harness.handlerCalls.count, 0, "no handler ran")
    }

    func testAuthenticatedWithAValidTokenHandsTheHandlerItsClaims() async throws {
        let harness = PipelineHarness()
        let user = UUID()
        let session = UUID()
        let expiry = Int64(Date().timeIntervalSince1970) + 600
        let token = signedToken(user: user, session: session, exp: expiry)
        for path in ["/sync/v1/me", "/auth/v1/user", "/rest/v1/events"] {
            let (response, context) = await harness.later(
                try head("GET", path, ["Authorization": "bearer \(token)", "X-Request-Id": "auth-1"]))
            XCTAssertEqual(response.status.code, 200, path)
            try assertJSON(
                response,
                #"{"user":"\#(user.uuidString.lowercased())","session":"\#(session.uuidString.lowercased())","exp":\#(expiry)}"#
            )
            XCTAssertEqual(context.userID, user, "the context returned carries the caller")
            XCTAssertEqual(context.requestID, "auth-1")
        }
        // Just expired, issued or valid from a little ahead (clocks of two instances): within
        // the leeway, still accepted.
        let now = Int64(Date().timeIntervalSince1970)
        for late in [
            signedToken(user: user, exp: now - 5), signedToken(user: user, exp: now + 600, issuedAt: now + 20),
            signedToken(user: user, exp: now + 600, notBefore: now + 20),
            signedToken(user: user, exp: now + 600, notBefore: now - 20),
        ] {
            let (accepted, context) = await harness.later(
                try head("GET", "/sync/v1/me", ["Authorization": "Bearer \(late)"]))
            XCTAssertEqual(accepted.status.code, 200, late)
            XCTAssertEqual(context.userID, user)
        }
        let late = signedToken(user: user, exp: Int64(Date().timeIntervalSince1970) - 5)
        let (accepted, context) = await harness.later(
            try head("GET", "/sync/v1/me", ["Authorization": "Bearer \(late)"]))
        XCTAssertEqual(accepted.status.code, 200)
        XCTAssertEqual(context.userID, user)
        // A token issued by TokenIssuer itself verifies too.
        let claims = try harness.tokens.verify(token, now: expiry - 10)
        XCTAssertEqual(claims, AccessClaims(userID: user, sessionID: session, expiresAt: expiry))
    }

    func testRESTAPIKeyIsCheckedBeforeTheToken() async throws {
        let harness = PipelineHarness(apiKey: "anon-key")
        let token = signedToken(user: UUID(), exp: Int64(Date().timeIntervalSince1970) + 600)
        for headers: HTTPHeaders in [
            ["Authorization": "Bearer \(token)"], ["Authorization": "Bearer \(token)", "apikey": "wrong"],
            // Compared byte for byte in constant time: the same length, a prefix, one more byte.
            ["Authorization": "Bearer \(token)", "apikey": "anon-kez"],
            ["Authorization": "Bearer \(token)", "apikey": "anon-ke"],
            ["Authorization": "Bearer \(token)", "apikey": "anon-key2"],
        ] {
            let (response, _) = harness.atHead(try head("GET", "/rest/v1/events", headers))
            XCTAssertEqual(response.status.code, 401)
            try assertJSON(response, #"{"code":"PGRST301","details":null,"hint":null,"message":"Invalid API key"}"#)
        }
        let (ok, _) = await harness.later(
            try head("GET", "/rest/v1/events", ["Authorization": "Bearer \(token)", "apikey": "anon-key"]))
        XCTAssertEqual(ok.status.code, 200)
        // Other families do not need it.
        let (native, _) = await harness.later(try head("GET", "/sync/v1/me", ["Authorization": "Bearer \(token)"]))
        XCTAssertEqual(native.status.code, 200)
    }

    func testAuthenticationIsDecidedFromTheHeadBeforeAnyBodyIsRead() throws {
        let harness = PipelineHarness(apiKey: "anon-key")
        let user = UUID()
        let token = signedToken(user: user, exp: Int64(Date().timeIntervalSince1970) + 600)
        // Without a valid token, a body the client waits to send (`Expect: 100-continue`) is
        // answered from the head: never read.
        let waits: HTTPHeaders = ["apikey": "anon-key", "Expect": "100-continue"]
        let (missing, _) = harness.atHead(try head("POST", "/rest/v1/events", waits, body: 60))
        XCTAssertEqual(missing.status.code, 401)
        try assertJSON(
            missing, #"{"code":"PGRST301","details":null,"hint":null,"message":"JWT could not be verified"}"#)
        // A small one sent anyway is read and dropped, then answered (the connection stays).
        let (wrongKey, _) = try answerAfterBody(
            harness.pipeline.admit(
                try head("POST", "/rest/v1/events", ["Authorization": "Bearer \(token)", "apikey": "x"], body: 60),
                client: ""))
        try assertJSON(wrongKey, #"{"code":"PGRST301","details":null,"hint":null,"message":"Invalid API key"}"#)
        // A body over the route's limit is still 413 first: a comparison, before any signature.
        let (tooLarge, _) = harness.atHead(try head("POST", "/rest/v1/events", body: 65))
        XCTAssertEqual(tooLarge.status.code, 413)
        // With a valid token the body is read, and the claims travel with the context.
        guard
            case .readBody(let limit, let context) = harness.pipeline.admit(
                try head(
                    "POST", "/rest/v1/events", ["Authorization": "Bearer \(token)", "apikey": "anon-key"], body: 60),
                client: "")
        else { return XCTFail("a signed-in insert is admitted") }
        XCTAssertEqual(limit, 64)
        XCTAssertEqual(context.claims?.userID, user)
        // The event stream's token may come in the query, from the head as well.
        let query = try harness.pipeline.admit(head("GET", "/sync/v1/query?access_token=\(token)"), client: "")
        guard case .readBody(_, let fromQuery) = query else { return XCTFail("a query token is accepted") }
        XCTAssertEqual(fromQuery.claims?.userID, user)
        let (badQuery, _) = harness.atHead(try head("GET", "/sync/v1/query?access_token=nope"))
        XCTAssertEqual(badQuery.status.code, 401)
        // Routes that need no caller verify nothing.
        guard case .readBody(_, let open) = harness.pipeline.admit(try head("POST", "/upload", body: 3), client: "")
        else { return XCTFail("an open route is admitted") }
        XCTAssertNil(open.claims)
        XCTAssertEqual(harness.handlerCalls.count, 0)
    }

    func testASessionRevokedOrATokenExpiredBetweenHeadAndBodyIsRefused() async throws {
        let harness = PipelineHarness()
        let user = UUID()
        let session = UUID()
        let expiry = Int64(Date().timeIntervalSince1970) + 600
        let token = signedToken(user: user, session: session, exp: expiry)
        var contexts: [RequestPipeline.Context] = []
        for path in ["/sync/v1/me", "/auth/v1/user", "/rest/v1/events"] {
            contexts.append(try admitted(harness, try head("GET", path, ["Authorization": "Bearer \(token)"])))
        }
        // Signed out while the body was on its way.
        harness.revocations.record([(session, user, expiry)])
        var codes: [String] = []
        for context in contexts {
            let request = HTTPRequest(method: context.method, path: context.path, remoteAddress: "192.0.2.1")
            guard case .later(let operation) = harness.pipeline.respond(to: request, context: context) else {
                return XCTFail("\(context.path) answered on the loop")
            }
            let (response, after) = await operation()
            XCTAssertEqual(response.status.code, 401, context.path)
            XCTAssertNil(after.userID)
            if case .string(let code) = try json(response)["code"] { codes.append(code) }
        }
        XCTAssertEqual(codes, ["unauthorized", "session_not_found", "PGRST301"], "each family's revoked answer")

        // Expired (beyond the leeway) since the head was verified.
        let endpoint = try XCTUnwrap(harness.endpoint(.get, "/sync/v1/me"))
        let stale = RequestPipeline.Context(
            requestID: "r", method: .get, path: "/sync/v1/me", started: 0, endpoint: endpoint,
            claims: AccessClaims(
                userID: user, sessionID: UUID(),
                expiresAt: Int64(Date().timeIntervalSince1970) - TokenIssuer.leeway - 1))
        guard
            case .later(let operation) = harness.pipeline.respond(
                to: HTTPRequest(method: .get, path: "/sync/v1/me"), context: stale)
        else { return XCTFail("answered on the loop") }
        let expired = await operation()
        XCTAssertEqual(expired.0.status.code, 401)
        XCTAssertEqual(harness.handlerCalls.count, 0, "no handler ran")

        // Neither: the claims from the head are handed over without verifying the token again.
        let another = signedToken(user: user, exp: expiry)  // another session, not revoked
        let fresh = try admitted(harness, try head("GET", "/sync/v1/me", ["Authorization": "Bearer \(another)"]))
        let other = RequestPipeline.Context(
            requestID: "r", method: .get, path: "/sync/v1/me", started: 0, endpoint: endpoint,
            claims: AccessClaims(userID: user, sessionID: UUID(), expiresAt: expiry))
        for context in [fresh, other] {
            guard
                case .later(let operation) = harness.pipeline.respond(
                    to: HTTPRequest(method: .get, path: "/sync/v1/me"), context: context)
            else { return XCTFail("answered on the loop") }
            let (response, after) = await operation()
            XCTAssertEqual(response.status.code, 200, "no Authorization in the request: the head's claims count")
            XCTAssertEqual(after.userID, user)
        }
    }

    // MARK: - Respond: errors

    func testHandlerAPIErrorRendersInTheFamilyShape() async throws {
        let harness = PipelineHarness()
        let native = await harness.later(try head("GET", "/fail/api"))
        XCTAssertEqual(native.0.status.code, 409)
        try assertJSON(native.0, #"{"code":"conflict_here","message":"It \"conflicts\".","hint":"Try again."}"#)

        let auth = await harness.later(try head("GET", "/auth/v1/fail/api"))
        XCTAssertEqual(auth.0.status.code, 409)
        try assertJSON(
            auth.0,
            #"{"code":"conflict_here","error_code":"conflict_here","message":"It \"conflicts\".","msg":"It \"conflicts\"."}"#
        )

        let rest = await harness.later(try head("GET", "/rest/v1/fail/api"))
        XCTAssertEqual(rest.0.status.code, 409)
        try assertJSON(
            rest.0, #"{"code":"conflict_here","details":null,"hint":"Try again.","message":"It \"conflicts\"."}"#)
        XCTAssertEqual(harness.logs.lines, [], "an APIError is an answer, not a failure to log")
    }

    func testPoolExhaustedIs503DatabaseBusyWithRetryAfter1() async throws {
        let harness = PipelineHarness()
        let message = "The database is busy; retry shortly."
        let native = await harness.later(try head("GET", "/fail/busy"))
        XCTAssertEqual(native.0.status.code, 503)
        XCTAssertEqual(native.0.headers.values(for: "Retry-After"), ["1"])
        try assertJSON(native.0, #"{"code":"database_busy","message":"\#(message)"}"#)

        let auth = await harness.later(try head("GET", "/auth/v1/fail/busy"))
        XCTAssertEqual(auth.0.status.code, 503)
        XCTAssertEqual(auth.0.headers["Retry-After"], "1")
        try assertJSON(
            auth.0,
            #"{"code":"database_busy","error_code":"database_busy","message":"\#(message)","msg":"\#(message)"}"#)

        let rest = await harness.later(try head("GET", "/rest/v1/fail/busy"))
        XCTAssertEqual(rest.0.status.code, 503)
        XCTAssertEqual(rest.0.headers["Retry-After"], "1")
        XCTAssertEqual(rest.0.headers["Proxy-Status"], "PostgREST; error=PGRST003")
        try assertJSON(rest.0, #"{"code":"PGRST003","details":null,"hint":null,"message":"\#(message)"}"#)
        XCTAssertEqual(harness.logs.lines.filter { $0.hasPrefix("warning database unavailable") }.count, 3)
    }

    func testLostConnectionIs503DatabaseUnavailableWithRetryAfter5() async throws {
        let harness = PipelineHarness()
        let message = "The database is not reachable; retry shortly."
        let native = await harness.later(try head("GET", "/fail/closed"))
        XCTAssertEqual(native.0.status.code, 503)
        XCTAssertEqual(native.0.headers.values(for: "Retry-After"), ["5"])
        try assertJSON(native.0, #"{"code":"database_unavailable","message":"\#(message)"}"#)

        let auth = await harness.later(try head("GET", "/auth/v1/fail/closed"))
        XCTAssertEqual(auth.0.status.code, 503)
        XCTAssertEqual(auth.0.headers["Retry-After"], "5")
        XCTAssertEqual(try json(auth.0)["error_code"], .string("database_unavailable"))

        let rest = await harness.later(try head("GET", "/rest/v1/fail/closed"))
        XCTAssertEqual(rest.0.status.code, 503)
        XCTAssertEqual(rest.0.headers["Retry-After"], "5")
        XCTAssertEqual(rest.0.headers["Proxy-Status"], "PostgREST; error=PGRST000")
        try assertJSON(rest.0, #"{"code":"PGRST000","details":null,"hint":null,"message":"\#(message)"}"#)
    }

    func testAnyOtherErrorIsABare500ThatRevealsNothing() async throws {
        let harness = PipelineHarness()
        for path in ["/fail/other", "/fail/server", "/fail/decoding"] {
            let (response, _) = await harness.later(try head("GET", path))
            XCTAssertEqual(response.status.code, 500, path)
            XCTAssertEqual(headerNames(response), ["Content-Type", "X-Request-Id"])
            try assertJSON(response, #"{"code":"internal_error","message":"Internal server error."}"#)
            let body = String(decoding: response.body, as: UTF8.self)
            for secret in ["hunter2", "secret-detail", "a@b.c", "duplicate", "query failed", "unexpected"] {
                XCTAssertFalse(body.contains(secret), "\(path) reveals \(secret)")
            }
        }
        let auth = await harness.later(try head("GET", "/auth/v1/fail/other"))
        XCTAssertEqual(auth.0.status.code, 500)
        try assertJSON(
            auth.0,
            #"{"code":"internal_error","error_code":"internal_error","message":"Internal server error.","msg":"Internal server error."}"#
        )
        let rest = await harness.later(try head("GET", "/rest/v1/fail/other"))
        XCTAssertEqual(rest.0.status.code, 500)
        try assertJSON(
            rest.0, #"{"code":"internal_error","details":null,"hint":null,"message":"Internal server error."}"#)
        // Logged for the operator, with the error.
        let failures = harness.logs.lines.filter { $0.hasPrefix("error request failed") }
        XCTAssertEqual(failures.count, 5)
        XCTAssertTrue(failures.first?.contains("hunter2") == true)
    }

    // MARK: - Complete

    func testCompleteAddsTheRequestID() async throws {
        let harness = PipelineHarness()
        let (response, _) = await harness.run(try head("GET", "/x", ["X-Request-Id": "given-1"]))
        XCTAssertEqual(response.headers.values(for: "X-Request-Id"), ["given-1"])
        XCTAssertEqual(headerNames(response), ["Content-Type", "X-Request-Id"])

        let (generated, context) = await harness.run(try head("GET", "/nope"))
        XCTAssertEqual(generated.headers.values(for: "X-Request-Id"), [context.requestID])
        XCTAssertFalse(context.requestID.isEmpty)
    }

    func testCompleteAddsCORSHeadersForAListedOrigin() async throws {
        let harness = PipelineHarness(corsOrigins: [listedOrigin, "https://other.example.com"])
        let (response, _) = await harness.run(try head("GET", "/x", ["Origin": listedOrigin]))
        XCTAssertEqual(response.headers.values(for: "Access-Control-Allow-Origin"), [listedOrigin])
        XCTAssertEqual(
            response.headers["Access-Control-Expose-Headers"],
            "Content-Range, X-Request-Id, X-Supabase-Api-Version, Retry-After, Date")
        XCTAssertEqual(response.headers.values(for: "Vary"), ["Origin"])

        // Origins compare case-insensitively; the one sent is echoed.
        let upper = "HTTPS://APP.EXAMPLE.COM"
        let (echoed, _) = await harness.run(try head("GET", "/x", ["Origin": upper]))
        XCTAssertEqual(echoed.headers["Access-Control-Allow-Origin"], upper)

        // Error answers carry them too (a browser must be able to read a 401).
        let (unauthorized, _) = await harness.run(try head("GET", "/auth/v1/user", ["Origin": listedOrigin]))
        XCTAssertEqual(unauthorized.status.code, 401)
        XCTAssertEqual(unauthorized.headers["Access-Control-Allow-Origin"], listedOrigin)
        let (tooLarge, _) = await harness.run(try head("POST", "/upload", ["Origin": listedOrigin], body: 100))
        XCTAssertEqual(tooLarge.status.code, 413)
        XCTAssertEqual(tooLarge.headers["Access-Control-Allow-Origin"], listedOrigin)
    }

    func testCompleteAddsCORSHeadersForAnyOriginWithoutVary() async throws {
        let harness = PipelineHarness(corsOrigins: ["*"])
        let (response, _) = await harness.run(try head("GET", "/x", ["Origin": "https://anything.test"]))
        XCTAssertEqual(response.headers.values(for: "Access-Control-Allow-Origin"), ["*"])
        XCTAssertEqual(
            response.headers["Access-Control-Expose-Headers"],
            "Content-Range, X-Request-Id, X-Supabase-Api-Version, Retry-After, Date")
        XCTAssertNil(response.headers["Vary"])
        // No Origin, no CORS headers.
        let (plain, _) = await harness.run(try head("GET", "/x"))
        XCTAssertEqual(headerNames(plain), ["Content-Type", "X-Request-Id"])
    }

    func testCompleteAddsNoCORSHeadersForADisallowedOrigin() async throws {
        let harness = PipelineHarness(corsOrigins: [listedOrigin])
        let (response, _) = await harness.run(try head("GET", "/x", ["Origin": "https://evil.test"]))
        XCTAssertEqual(headerNames(response), ["Content-Type", "X-Request-Id"])
        // Nor when CORS is not configured at all.
        let closed = PipelineHarness()
        let (none, _) = await closed.run(try head("GET", "/x", ["Origin": listedOrigin]))
        XCTAssertEqual(headerNames(none), ["Content-Type", "X-Request-Id"])
    }

    func testCompleteDoesNotRepeatCORSHeadersAPreflightAlreadyHas() async throws {
        let harness = PipelineHarness(corsOrigins: [listedOrigin])
        let (response, _) = await harness.run(
            try head("OPTIONS", "/x", ["Origin": listedOrigin, "Access-Control-Request-Method": "GET"]))
        XCTAssertEqual(response.status.code, 204)
        XCTAssertEqual(response.headers.values(for: "Access-Control-Allow-Origin"), [listedOrigin])
    }

    func testCompleteRecordsOneObservationUnderTheRoutePattern() async throws {
        let harness = PipelineHarness()
        _ = await harness.run(try head("GET", "/x"))
        var text = harness.metrics.render()
        XCTAssertTrue(
            lines(text).contains(#"trunk_sync_http_requests_total{method="GET",route="/x",status="200"} 1"#), text)
        XCTAssertTrue(lines(text).contains(#"trunk_sync_http_request_duration_seconds_count{route="/x"} 1"#), text)

        _ = await harness.run(try head("GET", "/x"))
        _ = await harness.run(try head("HEAD", "/x"))
        _ = await harness.run(try head("GET", "/nope/1"))
        _ = await harness.run(try head("GET", "/nope/2"))
        _ = await harness.run(try head("POST", "/x"))
        _ = await harness.run(try head("POST", "/upload", body: 17))
        _ = await harness.run(try head("GET", "/fail/busy"))
        _ = await harness.run(try head("GET", "/fail/abc%20def"))
        _ = await harness.run(try head("OPTIONS", "/x"))
        text = harness.metrics.render()
        let requests = lines(text).filter { $0.hasPrefix("trunk_sync_http_requests_total{") }
        XCTAssertEqual(
            Set(requests),
            [
                #"trunk_sync_http_requests_total{method="GET",route="/x",status="200"} 2"#,
                #"trunk_sync_http_requests_total{method="HEAD",route="/x",status="200"} 1"#,
                #"trunk_sync_http_requests_total{method="GET",route="unmatched",status="404"} 2"#,
                #"trunk_sync_http_requests_total{method="POST",route="unmatched",status="405"} 1"#,
                #"trunk_sync_http_requests_total{method="POST",route="/upload",status="413"} 1"#,
                #"trunk_sync_http_requests_total{method="GET",route="/fail/:kind",status="503"} 1"#,
                #"trunk_sync_http_requests_total{method="GET",route="/fail/:kind",status="500"} 1"#,
                #"trunk_sync_http_requests_total{method="OPTIONS",route="OPTIONS",status="204"} 1"#,
            ], text)
        XCTAssertTrue(lines(text).contains(#"trunk_sync_http_request_duration_seconds_count{route="/x"} 3"#), text)
        XCTAssertTrue(
            lines(text).contains(#"trunk_sync_http_request_duration_seconds_count{route="/fail/:kind"} 2"#), text)
        XCTAssertFalse(text.contains("/nope"), "raw paths never become labels")
    }

    // MARK: - Answers outside a route

    func testRejectAndRefuseAnswerInTheNativeShapeWithARequestID() throws {
        let harness = PipelineHarness()
        let rejected = harness.pipeline.reject(.headerTooLarge, peer: "192.0.2.1")
        XCTAssertEqual(rejected.status.code, 431)
        try assertJSON(rejected, #"{"code":"header_too_large","message":"The request header section is too large."}"#)
        XCTAssertEqual(rejected.headers.values(for: "X-Request-Id").count, 1)

        let refused = harness.pipeline.refuseConnection()
        XCTAssertEqual(refused.status.code, 503)
        XCTAssertEqual(refused.headers["Retry-After"], "1")
        XCTAssertEqual(refused.headers.values(for: "X-Request-Id").count, 1)
        try assertJSON(refused, #"{"code":"server_busy","message":"Too many connections; try again later."}"#)
    }

    func testFamilyOfAPathFollowsItsPrefix() {
        XCTAssertEqual(RequestPipeline.family(of: "/auth/v1/token"), .auth)
        XCTAssertEqual(RequestPipeline.family(of: "/rest/v1/events"), .rest)
        XCTAssertEqual(RequestPipeline.family(of: "/auth/v1"), .native)
        XCTAssertEqual(RequestPipeline.family(of: "/authx/v1/"), .native)
        XCTAssertEqual(RequestPipeline.family(of: "/sync/v1/events"), .native)
    }

    // MARK: - Authenticator.bearerToken

    func testBearerTokenParsing() {
        for header in ["Bearer abc", "bearer abc", "BEARER  abc ", "BeArEr abc", "Bearer \tabc\t"] {
            XCTAssertEqual(Authenticator.bearerToken(header), "abc", header)
        }
        for header in [
            "Basic abc", "Bearer", "Bearer ", "Bearer   ", "Bearerabc", "Bearer\tabc", "Token abc", "",
            "B\u{E9}arer abc", "Bearer\u{E9}abc",
        ] as [String?] + [nil] {
            XCTAssertNil(Authenticator.bearerToken(header), String(describing: header))
        }
        // The token is kept as sent (a JWT's dots and dashes included).
        XCTAssertEqual(Authenticator.bearerToken("Bearer eyJ.a-b_c.d"), "eyJ.a-b_c.d")
    }

    // MARK: - APIError.response(for:)

    func testAPIErrorNativeShape() throws {
        let details = Array(#"[{"index":0,"field":"client_id","reason":"missing"}]"#.utf8)
        let error = APIError(
            status: 400, code: "invalid_event", message: "Event 0 is invalid.", details: .json(details),
            hint: "Send a client_id.")
        let response = error.response(for: .native)
        XCTAssertEqual(response.status.code, 400)
        XCTAssertEqual(headerNames(response), ["Content-Type"])
        XCTAssertEqual(response.headers["Content-Type"], "application/json; charset=utf-8")
        try assertJSON(
            response,
            #"{"code":"invalid_event","message":"Event 0 is invalid.","details":[{"index":0,"field":"client_id","reason":"missing"}],"hint":"Send a client_id."}"#
        )
        let text = APIError(status: 422, code: "x", message: "m", details: .text("a \"quoted\"\nline")).response(
            for: .native)
        try assertJSON(text, #"{"code":"x","message":"m","details":"a \"quoted\"\nline"}"#)
        try assertJSON(
            APIError(status: 418, code: "c", message: "\u{1}\\").response(for: .native),
            #"{"code":"c","message":"\u0001\\"}"#)
    }

    func testAPIErrorAuthShapeLeavesDetailsOut() throws {
        let error = APIError(
            status: 400, code: "validation_failed", message: "Bad email", details: .text("more"), hint: "fix it")
        let response = error.response(for: .auth)
        XCTAssertEqual(headerNames(response), ["X-Supabase-Api-Version", "Content-Type"])
        XCTAssertEqual(response.headers["X-Supabase-Api-Version"], AuthRoutes.apiVersion)
        try assertJSON(
            response,
            #"{"code":"validation_failed","error_code":"validation_failed","message":"Bad email","msg":"Bad email"}"#)

        let limited = AuthError.overRequestRateLimit(retryAfter: 30).response(for: .auth)
        XCTAssertEqual(limited.status.code, 429)
        XCTAssertEqual(limited.headers.values(for: "Retry-After"), ["30"])
        XCTAssertEqual(try json(limited)["error_code"], .string("over_request_rate_limit"))
    }

    func testAPIErrorRESTShape() throws {
        let json = APIError(
            status: 400, code: "PGRST102", message: "Invalid body", details: .json(Array(#"{"at":3}"#.utf8)), hint: "h")
        let response = json.response(for: .rest)
        XCTAssertEqual(headerNames(response), ["Proxy-Status", "Content-Type"])
        XCTAssertEqual(response.headers["Proxy-Status"], "PostgREST; error=PGRST102")
        try assertJSON(response, #"{"code":"PGRST102","details":{"at":3},"hint":"h","message":"Invalid body"}"#)

        try assertJSON(
            RESTError.singular(2).response(for: .rest),
            #"{"code":"PGRST116","details":"The result contains 2 rows","hint":null,"message":"JSON object requested, multiple (or no) rows returned"}"#
        )
        // Shared codes map to PostgREST's own.
        let busy = APIError.databaseBusy.response(for: .rest)
        XCTAssertEqual(headerNames(busy), ["Proxy-Status", "Retry-After", "Content-Type"])
        XCTAssertEqual(busy.headers["Proxy-Status"], "PostgREST; error=PGRST003")
        XCTAssertEqual(busy.headers["Retry-After"], "1")
        XCTAssertEqual(try self.json(APIError.databaseUnavailable.response(for: .rest))["code"], .string("PGRST000"))
        XCTAssertEqual(try self.json(APIError.bodyTooLarge(limit: 5).response(for: .rest))["code"], .string("PGRST413"))
    }

    func testAPIErrorRetryAfterInEveryFamily() throws {
        for family in [APIFamily.native, .auth, .rest] {
            XCTAssertEqual(APIError.databaseBusy.response(for: family).headers.values(for: "Retry-After"), ["1"])
            XCTAssertEqual(APIError.databaseUnavailable.response(for: family).headers.values(for: "Retry-After"), ["5"])
            XCTAssertNil(APIError.notFound().response(for: family).headers["Retry-After"])
            XCTAssertEqual(APIError.databaseBusy.response(for: family).status.code, 503)
        }
    }

    func testServiceUnavailableMapsOnlyWhatAClientCanRetry() {
        func error(_ kind: PostgresError.Kind) -> PostgresError { PostgresError(kind: kind, message: "m") }
        XCTAssertEqual(APIError.serviceUnavailable(error(.poolExhausted)), .databaseBusy)
        for kind in [PostgresError.Kind.connectionFailed, .connectionClosed, .poolClosed] {
            XCTAssertEqual(APIError.serviceUnavailable(error(kind)), .databaseUnavailable, "\(kind)")
        }
        for kind in [PostgresError.Kind.server, .decoding, .invalidConfiguration] {
            XCTAssertNil(APIError.serviceUnavailable(error(kind)), "\(kind)")
        }
        XCTAssertEqual(APIError.databaseBusy.description, "503 database_busy: The database is busy; retry shortly.")
    }

    // MARK: - Helpers

    /// A head as the parser reports it.
    func head(_ method: String, _ target: String, _ headers: HTTPHeaders = [:], body: Int? = nil) throws
        -> HTTPRequestHead
    {
        var text = "\(method) \(target) HTTP/1.1\r\nHost: test\r\n"
        for field in headers { text += "\(field.name): \(field.value)\r\n" }
        if let body { text += "Content-Length: \(body)\r\n" }
        text += "\r\n"
        var parser = HTTPRequestParser(bodyMode: .stream)
        parser.feed(Array(text.utf8))
        while let event = parser.next() {
            switch event {
            case .head(let head): return head
            case .error(let error): throw TestEnvironmentError("\(method) \(target): \(error)")
            default: continue
            }
        }
        throw TestEnvironmentError("\(method) \(target): no head")
    }

    func admitted(_ harness: PipelineHarness, _ head: HTTPRequestHead) throws -> RequestPipeline.Context {
        guard case .readBody(_, let context) = harness.pipeline.admit(head, client: "") else {
            throw TestEnvironmentError("\(head.method) \(head.path) not admitted")
        }
        return context
    }

    func answer(_ admission: Admission<RequestPipeline.Context>) throws -> (HTTPResponse, RequestPipeline.Context) {
        guard case .answer(let response, let context) = admission else {
            throw TestEnvironmentError("expected .answer, got \(admission)")
        }
        return (response, context)
    }

    func answerAfterBody(_ admission: Admission<RequestPipeline.Context>) throws -> (
        HTTPResponse, RequestPipeline.Context
    ) {
        guard case .answerAfterBody(let response, let context) = admission else {
            throw TestEnvironmentError("expected .answerAfterBody, got \(admission)")
        }
        return (response, context)
    }

    func json(_ response: HTTPResponse) throws -> [String: TestJSON] {
        guard case .object(let object) = try TestJSON(parsing: response.body) else {
            throw TestEnvironmentError("not a JSON object: \(String(decoding: response.body, as: UTF8.self))")
        }
        return object
    }

    func assertJSON(_ response: HTTPResponse, _ expected: String, file: StaticString = #filePath, line: UInt = #line)
        throws
    {
        XCTAssertEqual(response.headers["Content-Type"], "application/json; charset=utf-8", file: file, line: line)
        XCTAssertEqual(
            try TestJSON(parsing: response.body), try TestJSON(parsing: Array(expected.utf8)),
            String(decoding: response.body, as: UTF8.self), file: file, line: line)
    }

    func headerNames(_ response: HTTPResponse) -> [String] { response.headers.map(\.name) }

    func lines(_ text: String) -> [String] { text.split(separator: "\n").map(String.init) }
}

// MARK: - Fixtures

let listedOrigin = "https://app.example.com"
private let testSecret = "pipeline-stage-tests-secret-0123456789"

/// The issuer of `PipelineHarness`'s tokens.
let testIssuer = "http://trunk-sync.test/auth/v1"

/// A JWT signed with HS256 carrying the claims `TokenIssuer.verify` checks; nil leaves a
/// claim out.
func signedToken(
    user: UUID = UUID(), subject: String? = nil, session: UUID? = UUID(), exp: Int64,
    audience: String = "authenticated",
    issuer: String? = testIssuer, issuedAt: Int64? = Int64(Date().timeIntervalSince1970), notBefore: Int64? = nil,
    secret: String = testSecret
) -> String {
    var payload = #"{"sub":"\#(subject ?? user.uuidString.lowercased())","aud":"\#(audience)","exp":\#(exp)"#
    if let session { payload += #","session_id":"\#(session.uuidString.lowercased())""# }
    if let issuer { payload += #","iss":"\#(issuer)""# }
    if let issuedAt { payload += #","iat":\#(issuedAt)"# }
    if let notBefore { payload += #","nbf":\#(notBefore)"# }
    payload += "}"
    return JWT.sign(payload: Array(payload.utf8), with: JWT.HS256Key(secret: secret))
}

private struct TestFailure: Error, CustomStringConvertible {
    var description: String { "unexpected secret-detail password=hunter2" }
}

/// The handler of `/…/fail/:kind`: throws what `kind` names.
private func fail(_ request: HTTPRequest) async throws -> HTTPResponse {
    switch request.parameters["kind"] {
    case "api": throw APIError(status: 409, code: "conflict_here", message: "It \"conflicts\".", hint: "Try again.")
    case "busy": throw PostgresError(kind: .poolExhausted, message: "no connection became free")
    case "closed": throw PostgresError(kind: .connectionClosed, message: "server closed the connection")
    case "server":
        throw PostgresError(
            kind: .server, message: "query failed", sqlState: .uniqueViolation,
            serverMessage: "duplicate key value violates unique constraint", detail: "Key (email)=(a@b.c) exists.")
    case "decoding": throw PostgresError(kind: .decoding, message: "query failed: column 0 is not a uuid")
    default: throw TestFailure()
    }
}

/// A pipeline over a few routes of each family, with an HS256 token issuer and a logger
/// that keeps its lines.
struct PipelineHarness: Sendable {
    let metrics: Metrics
    let tokens: TokenIssuer
    let logs: LogLines
    let handlerCalls: CallCounter
    let routes: Routes
    let pipeline: RequestPipeline
    /// The authenticator's revoked sessions.
    let revocations = SessionRevocations(database: nil, logger: Logger(label: "test.revocations"))

    init(corsOrigins: [String] = [], apiKey: String? = nil) {
        let metrics = Metrics()
        let logs = LogLines()
        let calls = CallCounter()
        var routes = Routes(metrics: metrics)
        routes.add(.get, "/x", family: .native, .inline { _ in .json(.ok, #"{"ok":true}"#) })
        routes.add(
            .post, "/upload", family: .native, bodyLimit: 16,
            .open { request in .json(.ok, #"{"bytes":\#(request.body.count)}"#) })
        routes.add(
            .get, "/echo/:name", family: .native,
            .open { request in
                var writer = JSONWriter()
                writer.beginObject()
                writer.string("name", request.parameters["name"])
                writer.string("request_id", request.requestID)
                writer.string("task_local", RequestContext.requestID)
                writer.string("query", request.query)
                writer.endObject()
                return .json(.ok, writer.bytes)
            })
        let whoAmI: Endpoint.Handler = .authenticated { _, claims in
            calls.value.wrappingAdd(1, ordering: .relaxed)
            return .json(
                .ok,
                #"{"user":"\#(claims.userID.uuidString.lowercased())","session":"\#(claims.sessionID.uuidString.lowercased())","exp":\#(claims.expiresAt)}"#
            )
        }
        routes.add(.get, "/sync/v1/me", family: .native, whoAmI)
        routes.add(.get, "/auth/v1/user", family: .auth, whoAmI)
        routes.add(.get, "/sync/v1/query", family: .native, acceptsQueryToken: true, whoAmI)
        routes.add(.post, "/auth/v1/otp", family: .auth, bodyLimit: 32, .open { _ in .json(.ok, "{}") })
        routes.add(.get, "/rest/v1/events", family: .rest, whoAmI)
        routes.add(.post, "/rest/v1/events", family: .rest, bodyLimit: 64, whoAmI)
        routes.add(.get, "/fail/:kind", family: .native, .open(fail))
        routes.add(.get, "/auth/v1/fail/:kind", family: .auth, .open(fail))
        routes.add(.get, "/rest/v1/fail/:kind", family: .rest, .open(fail))

        let tokens = TokenIssuer(secret: testSecret, issuer: testIssuer, lifetime: 3600)
        self.metrics = metrics
        self.tokens = tokens
        self.logs = logs
        self.handlerCalls = calls
        self.routes = routes
        pipeline = RequestPipeline(
            routes: routes, corsOrigins: corsOrigins,
            authenticator: Authenticator(tokens: tokens, apiKey: apiKey, revocations: revocations),
            accessLog: nil, logger: Logger(label: "test.pipeline", factory: { _ in CapturingLogHandler(lines: logs) }))
    }

    func endpoint(_ method: HTTPMethod, _ path: String) -> Endpoint? {
        if case .found(let endpoint, _, _) = routes.router.match(method: method, path: path) { return endpoint }
        return nil
    }

    /// All three stages as the server runs them; the response as it would be written.
    func run(_ head: HTTPRequestHead, body: [UInt8] = []) async -> (HTTPResponse, RequestPipeline.Context) {
        let outcome: (HTTPResponse, RequestPipeline.Context)
        switch pipeline.admit(head, client: "192.0.2.1") {
        case .answer(let answer, let admitted), .answerAfterBody(let answer, let admitted):
            outcome = (answer, admitted)
        case .readBody(_, let admitted):
            let request = HTTPRequest(
                method: head.method, path: head.path, query: head.query, headers: head.headers, body: body,
                remoteAddress: "192.0.2.1")
            switch pipeline.respond(to: request, context: admitted) {
            case .now(let answer, let after): outcome = (answer, after)
            case .later(let operation): outcome = await operation()
            }
        }
        var response = outcome.0
        pipeline.complete(&response, context: outcome.1)
        return (response, outcome.1)
    }

    /// The answer given from the head alone (`Admission.answer`), as it would be written: fails
    /// the test if the head was admitted to have its body read.
    func atHead(_ head: HTTPRequestHead, file: StaticString = #filePath, line: UInt = #line) -> (
        HTTPResponse, RequestPipeline.Context
    ) {
        guard case .answer(var response, let context) = pipeline.admit(head, client: "192.0.2.1") else {
            XCTFail("\(head.method) \(head.path) not answered from the head", file: file, line: line)
            return (
                HTTPResponse(status: 599), RequestPipeline.Context(requestID: "", method: .get, path: "", started: 0)
            )
        }
        pipeline.complete(&response, context: context)
        return (response, context)
    }

    /// Like `run`, for routes whose handler runs later: fails the test if it answered on
    /// the loop or from the head.
    func later(_ head: HTTPRequestHead, file: StaticString = #filePath, line: UInt = #line) async -> (
        HTTPResponse, RequestPipeline.Context
    ) {
        guard case .readBody(_, let admitted) = pipeline.admit(head, client: "192.0.2.1") else {
            XCTFail("\(head.method) \(head.path) not admitted", file: file, line: line)
            return (
                HTTPResponse(status: 599), RequestPipeline.Context(requestID: "", method: .get, path: "", started: 0)
            )
        }
        let request = HTTPRequest(
            method: head.method, path: head.path, query: head.query, headers: head.headers, remoteAddress: "192.0.2.1")
        guard case .later(let operation) = pipeline.respond(to: request, context: admitted) else {
            XCTFail("\(head.method) \(head.path) answered on the loop", file: file, line: line)
            return (HTTPResponse(status: 599), admitted)
        }
        let outcome = await operation()
        var response = outcome.0
        pipeline.complete(&response, context: outcome.1)
        return (response, outcome.1)
    }
}

/// An atomic counter a `Sendable` closure can share.
final class CallCounter: Sendable {
    let value = Atomic<Int>(0)
    var count: Int { value.load(ordering: .relaxed) }
}

/// Log lines kept as `level message key=value…`.
final class LogLines: Sendable {
    private let storage = Mutex<[String]>([])
    var lines: [String] { storage.withLock { $0 } }
    func append(_ line: String) { storage.withLock { $0.append(line) } }
}

struct CapturingLogHandler: LogHandler {
    let lines: LogLines
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let fields = metadata.merging(event.metadata ?? [:]) { _, new in new }
            .map { "\($0.key)=\($0.value)" }.sorted()
        lines.append((["\(event.level)", "\(event.message)"] + fields).joined(separator: " "))
    }
}

/// Parsed JSON that compares by value (numbers as doubles), so bodies can be compared with
/// their expected text whatever the order of members.
indirect enum TestJSON: Equatable, CustomStringConvertible {
    case null
    case number(Double)
    case string(String)
    case array([TestJSON])
    case object([String: TestJSON])

    init(parsing bytes: [UInt8]) throws {
        self = try TestJSON(any: JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed]))
    }

    init(any: Any) throws {
        switch any {
        case is NSNull: self = .null
        case let string as String: self = .string(string)
        case let array as [Any]: self = .array(try array.map(TestJSON.init(any:)))
        case let object as [String: Any]: self = .object(try object.mapValues(TestJSON.init(any:)))
        // Numbers and booleans alike (true is 1): both sides of a comparison parse the same way.
        case let number as NSNumber: self = .number(number.doubleValue)
        default: throw TestEnvironmentError("unexpected JSON value \(any)")
        }
    }

    var description: String {
        switch self {
        case .null: "null"
        case .number(let value): "\(value)"
        case .string(let value): JSONText.quote(value)
        case .array(let values): "[" + values.map(\.description).joined(separator: ",") + "]"
        case .object(let members):
            "{"
                + members.sorted { $0.key < $1.key }.map { JSONText.quote($0.key) + ":" + $0.value.description }
                .joined(separator: ",") + "}"
        }
    }
}
