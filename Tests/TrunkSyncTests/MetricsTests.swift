import Foundation
import TestSupport
import TrunkSync
import XCTest

final class MetricsTests: XCTestCase {
    func samples(_ text: String) throws -> [String: Double] { try prometheusSamples(text) }

    /// Every metric the server exports is in the operator's table (docs/operations.md,
    /// "Monitor"): a metric added without it fails here.
    func testEveryMetricIsDocumented() async throws {
        let app = try await AppHarness()
        let text = try await app.request("GET", "/metrics", admin: true).text
        await app.stop()
        let names = text.split(separator: "\n").filter { $0.hasPrefix("# TYPE ") }.map {
            String($0.split(separator: " ")[2])
        }
        XCTAssertGreaterThan(names.count, 20, text)
        let docs = try String(contentsOfFile: repositoryRoot() + "/docs/operations.md", encoding: .utf8)
        for name in names {
            XCTAssertTrue(
                docs.contains("`\(name)`") || docs.contains("`\(name){"), "\(name) is not in docs/operations.md")
        }
        // And the other way: every trunk_sync_ name the guides give is a metric the server
        // exports, unless it is a database object (a role, function or channel the migrations
        // make) or the console's cookie, so an alert on a metric renamed or removed fails here.
        var migrations = ""
        let directory = repositoryRoot() + "/migrations/"
        for file in try FileManager.default.contentsOfDirectory(atPath: directory) where file.hasSuffix(".sql") {
            migrations += try String(contentsOfFile: directory + file, encoding: .utf8)
        }
        let exported = Set(names)
        let pattern = try NSRegularExpression(pattern: "trunk_sync_[a-z0-9_]*[a-z0-9]")
        for file in ["README.md", "docs/operations.md", "config/README.md", "docs/api.md", "docs/realtime.md"] {
            let text = try String(contentsOfFile: repositoryRoot() + "/" + file, encoding: .utf8)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                guard let range = Range(match.range, in: text) else { continue }
                let name = String(text[range])
                guard !exported.contains(name), !migrations.contains(name),
                    !["trunk_sync_console", "trunk_sync_server"].contains(name)
                else { continue }
                XCTFail("\(file) names \(name), which /metrics does not export")
            }
        }
    }

    func testMetricsParseAsPrometheusTextAndCountersMove() async throws {
        let app = try await AppHarness(environment: ["TRUNK_SYNC_RATE_LIMIT_OTP": "1/\(rateWindow())"])
        let publicMetrics = try await app.request("GET", "/metrics")
        XCTAssertEqual(publicMetrics.status, 404, "not on the public listener")
        let before = try samples(try await app.request("GET", "/metrics", admin: true).text)
        XCTAssertEqual(before["trunk_sync_events_pushed_total"], 0)
        let token = try await app.token("m@example.com")
        let events = (0..<3).map { _ in SyncTests.event() }
        _ = try await app.request("POST", "/sync/v1/events", json: ["events": events + [events[0]]], bearer: token)
        _ = try await app.request("GET", "/sync/v1/events", bearer: token)
        _ = try await app.request("POST", "/auth/v1/otp", json: ["email": "m@example.com"])
        _ = try await app.request("POST", "/auth/v1/otp", json: ["email": "n@example.com"])
        let response = try await app.request("GET", "/metrics", admin: true)
        XCTAssertEqual(response.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8")
        let after = try samples(response.text)
        XCTAssertEqual(after["trunk_sync_events_pushed_total"], 3)
        XCTAssertEqual(after["trunk_sync_events_duplicate_total"], 1)
        XCTAssertEqual(after["trunk_sync_events_pulled_total"], 3)
        XCTAssertEqual(after["trunk_sync_signin_codes_sent_total"], 1)
        XCTAssertEqual(after["trunk_sync_rate_limited_total{limit=otp}"], 1)
        XCTAssertNotNil(after["trunk_sync_db_pool_connections_open"])
        XCTAssertEqual(after["trunk_sync_longpolls_waiting"], 0)
        XCTAssertNotNil(after["trunk_sync_http_connections"])
        XCTAssertEqual(after["trunk_sync_http_requests_in_flight"], 0)
        for name in Metrics.rateLimitNames {
            XCTAssertNotNil(after["trunk_sync_rate_limited_total{limit=\(name)}"], name)
        }
        XCTAssertEqual(after["trunk_sync_http_requests_total{method=POST,route=/sync/v1/events,status=200}"], 1)
        XCTAssertEqual(after["trunk_sync_http_requests_total{method=POST,route=/auth/v1/otp,status=429}"], 1)
        XCTAssertEqual(after["trunk_sync_http_request_duration_seconds_count{route=/sync/v1/events}"], 2)
        XCTAssertEqual(after["trunk_sync_http_request_duration_seconds_bucket{le=+Inf,route=/sync/v1/events}"], 2)
        await app.stop()
    }
}
