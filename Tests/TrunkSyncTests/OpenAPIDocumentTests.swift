import Foundation
import HTTPServer
import TestSupport
import TrunkSync
import XCTest

/// docs/openapi.json is what `GET /openapi.json` serves, a valid OpenAPI 3.1 document, and a
/// description of exactly the application's routes with their body limits, authentication
/// and error shapes.
final class OpenAPIDocumentTests: XCTestCase {
    static let path = repositoryRoot() + "/docs/openapi.json"

    func document() throws -> [String: Any] {
        let data = try Data(contentsOf: URL(fileURLWithPath: Self.path))
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    func python() throws -> String {
        guard let path = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"], !path.isEmpty else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_PYTHON is not set: run the tests with `make test`")
        }
        return path
    }

    func testServedDocumentIsDocsOpenAPIJSONByteForByte() throws {
        let file = try Data(contentsOf: URL(fileURLWithPath: Self.path))
        XCTAssertFalse(file.isEmpty)
        XCTAssertTrue(
            Array(file) == OpenAPIDocument.bytes,
            "docs/openapi.json and the embedded copy differ: run scripts/openapi-embed.sh")
    }

    /// The REST filters' patterns take `is.` in any case, as the server does (PostgREST
    /// reads it so): a client validating against the document is not refused what works.
    func testFilterPatternsTakeIsInAnyCase() throws {
        var patterns: [String] = []
        func collect(_ value: Any) {
            if let object = value as? [String: Any] {
                if let pattern = object["pattern"] as? String, pattern.contains("is\\.") { patterns.append(pattern) }
                object.values.forEach(collect)
            } else if let array = value as? [Any] {
                array.forEach(collect)
            }
        }
        collect(try document())
        XCTAssertFalse(patterns.isEmpty)
        for pattern in patterns {
            let regex = try NSRegularExpression(pattern: pattern)
            func matches(_ text: String) -> Bool {
                regex.firstMatch(in: text, range: NSRange(text.startIndex..., in: text)) != nil
            }
            // A column's filter, or `or=(…)`'s list naming the column that may be null.
            var form: (String) -> String = { $0 }
            if pattern.hasPrefix("^\\("),
                let column = pattern.range(of: #"[a-z_]+(?=\\\.\(not\\\.\)\?is\\\.)"#, options: .regularExpression)
            {
                form = { "(" + pattern[column] + "." + $0 + ")" }
            }
            for text in ["is.null", "is.NULL", "not.is.Not_Null", "is.not_null"] {
                XCTAssertTrue(matches(form(text)), "\(form(text)) against \(pattern)")
            }
            for text in ["is.nul", "is.true", "is.not-null"] {
                XCTAssertFalse(matches(form(text)), "\(form(text)) against \(pattern)")
            }
        }
    }

    /// openapi-spec-validator (in the test venv) accepts it as OpenAPI 3.1, and refuses a
    /// broken copy (so the check can fail).
    func testDocumentIsValidOpenAPI31() throws {
        let script = """
            import json, sys
            from openapi_spec_validator import OpenAPIV31SpecValidator, validate
            document = json.load(open(sys.argv[1], encoding="utf-8"))
            assert document["openapi"].startswith("3.1."), document["openapi"]
            if len(sys.argv) > 2:
                document["paths"]["/healthz"]["get"]["responses"]["200"] = {"content": {}}  # no description
            validate(document, cls=OpenAPIV31SpecValidator)
            print("valid")
            """
        let result = try Command.run(try python(), ["-c", script, Self.path])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        XCTAssertEqual(result.stdout, "valid\n")
        let broken = try Command.run(try python(), ["-c", script, Self.path, "break"])
        XCTAssertNotEqual(broken.status, 0, broken.stdout)
    }

    /// Every route of `Application.routes()` is an operation of the document with the same
    /// body limit (`x-body-limit`), bearer security exactly when the route authenticates, and
    /// error answers in its family's shape; and the document describes no other operation.
    func testEveryRouteIsDescribedAndNothingElse() async throws {
        let app = try await AppHarness()
        let declarations = app.application.routes().declarations
        await app.stop()
        let document = try document()
        let paths = try XCTUnwrap(document["paths"] as? [String: [String: Any]])
        let components = try XCTUnwrap(document["components"] as? [String: Any])
        let responses = try XCTUnwrap(components["responses"] as? [String: Any])
        var described = Set<String>()
        for (path, item) in paths {
            for method in item.keys where method != "parameters" { described.insert("\(method.uppercased()) \(path)") }
        }
        var routes = Set<String>()
        for route in declarations {
            let path = route.pattern.split(separator: "/").map {
                $0.hasPrefix(":") ? "{\($0.dropFirst())}" : String($0)
            }
            .joined(separator: "/")
            let name = "\(route.method.rawValue) /\(path)"
            routes.insert(name)
            guard let operation = paths["/" + path]?[route.method.rawValue.lowercased()] as? [String: Any] else {
                XCTFail("\(name) is not described")
                continue
            }
            XCTAssertEqual(operation["x-body-limit"] as? Int, route.bodyLimit, "\(name): x-body-limit")
            let security = operation["security"] as? [[String: Any]] ?? []
            XCTAssertEqual(
                security.contains { $0["bearerAuth"] != nil }, route.authenticated,
                "\(name): bearerAuth security exactly when the route authenticates")
            let statuses = try XCTUnwrap(operation["responses"] as? [String: Any], name)
            if route.authenticated { XCTAssertNotNil(statuses["401"], "\(name): 401") }
            XCTAssertNotNil(statuses["413"], "\(name): 413")
            let shape: String
            switch route.family {
            case .native: shape = "#/components/schemas/NativeError"
            case .auth: shape = "#/components/schemas/AuthError"
            case .rest: shape = "#/components/schemas/RESTError"
            }
            for (status, response) in statuses where Int(status).map({ $0 >= 400 }) ?? true {
                // The error's schema, following a reference to a shared response.
                var object = response as? [String: Any] ?? [:]
                if let reference = object["$ref"] as? String {
                    object = responses[String(reference.split(separator: "/").last ?? "")] as? [String: Any] ?? [:]
                }
                let text = String(
                    decoding: try JSONSerialization.data(withJSONObject: object["content"] ?? [:]), as: UTF8.self
                )
                .replacingOccurrences(of: "\\/", with: "/")
                let pushError = route.family == .native && text.contains("#/components/schemas/PushError")
                XCTAssertTrue(text.contains(shape) || pushError, "\(name) \(status): not in the shape of \(shape)")
            }
        }
        XCTAssertEqual(described.subtracting(routes), [], "described operations that are not routes")
        XCTAssertEqual(routes.subtracting(described), [], "routes that are not described")
    }
}
