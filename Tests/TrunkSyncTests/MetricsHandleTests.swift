import Foundation
import TestSupport
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// The metric handles (`Counter`, `HTTPRouteMetrics`) and the text `Metrics.render()`
/// makes of them, without a server.
final class MetricsHandleTests: XCTestCase {
    func testCounterIncrements() {
        let counter = Counter()
        XCTAssertEqual(counter.value, 0)
        counter.increment()
        counter.increment(by: 5)
        counter.increment(by: 0)
        counter.increment(by: -3)  // ignored: a counter never goes down
        XCTAssertEqual(counter.value, 6)
    }

    func testCounterCountsEveryConcurrentIncrement() {
        let counter = Counter()
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            for _ in 0..<10_000 { counter.increment() }
        }
        XCTAssertEqual(counter.value, 80_000)
    }

    func testCountersRenderWithTheirValues() {
        let metrics = Metrics()
        metrics.eventsPushed.increment(by: 3)
        metrics.rateLimited("token").increment()
        metrics.rateLimited("token").increment()
        let lines = render(metrics)
        XCTAssertTrue(lines.contains("trunk_sync_events_pushed_total 3"))
        XCTAssertTrue(lines.contains("trunk_sync_events_pulled_total 0"))
        XCTAssertTrue(lines.contains(#"trunk_sync_rate_limited_total{limit="token"} 2"#))
        XCTAssertTrue(lines.contains(#"trunk_sync_rate_limited_total{limit="otp"} 0"#))
        // One HELP/TYPE per family, even with several label sets.
        XCTAssertEqual(lines.filter { $0 == "# TYPE trunk_sync_rate_limited_total counter" }.count, 1)
    }

    func testRouteHandleIsSharedPerPattern() {
        let metrics = Metrics()
        XCTAssertTrue(metrics.route("/a") === metrics.route("/a"))
        XCTAssertFalse(metrics.route("/a") === metrics.route("/b"))
        metrics.route("/a").record(method: .get, status: 200, nanoseconds: 1)
        metrics.route("/a").record(method: .post, status: 201, nanoseconds: 1)
        let lines = render(metrics)
        XCTAssertTrue(lines.contains(#"trunk_sync_http_requests_total{method="GET",route="/a",status="200"} 1"#))
        XCTAssertTrue(lines.contains(#"trunk_sync_http_requests_total{method="POST",route="/a",status="201"} 1"#))
        XCTAssertTrue(lines.contains(#"trunk_sync_http_request_duration_seconds_count{route="/a"} 2"#))
        // A route never recorded has no series at all.
        XCTAssertFalse(lines.contains { $0.contains(#"route="/b""#) })
    }

    func testUnknownMethodsCountAsOther() {
        let metrics = Metrics()
        let route = metrics.route("/x")
        route.record(method: HTTPMethod(rawValue: "FOO"), status: 200, nanoseconds: 1)
        route.record(method: HTTPMethod(rawValue: "BAR"), status: 200, nanoseconds: 1)
        route.record(method: HTTPMethod(rawValue: "get"), status: 200, nanoseconds: 1)  // methods are case-sensitive
        route.record(method: .trace, status: 405, nanoseconds: 1)
        route.record(method: .options, status: 204, nanoseconds: 1)
        let requests = render(metrics).filter { $0.hasPrefix("trunk_sync_http_requests_total{") }
        XCTAssertEqual(
            requests,
            [
                #"trunk_sync_http_requests_total{method="OPTIONS",route="/x",status="204"} 1"#,
                #"trunk_sync_http_requests_total{method="other",route="/x",status="200"} 3"#,
                #"trunk_sync_http_requests_total{method="other",route="/x",status="405"} 1"#,
            ])
    }

    func testUnusualStatusesCountAsOther() {
        let metrics = Metrics()
        let route = metrics.route("/x")
        for status in [299, 418, 599, 600, 999, -1, 0] {
            route.record(method: .get, status: status, nanoseconds: 1)
        }
        route.record(method: .get, status: 200, nanoseconds: 1)
        route.record(method: .get, status: 505, nanoseconds: 1)
        let requests = render(metrics).filter { $0.hasPrefix("trunk_sync_http_requests_total{") }
        XCTAssertEqual(
            requests,
            [
                #"trunk_sync_http_requests_total{method="GET",route="/x",status="200"} 1"#,
                #"trunk_sync_http_requests_total{method="GET",route="/x",status="505"} 1"#,
                #"trunk_sync_http_requests_total{method="GET",route="/x",status="other"} 7"#,
            ])
    }

    func testHistogramBucketsAreCumulativeWithCountAndSum() throws {
        let metrics = Metrics()
        let route = metrics.route("/h")
        let durations: [UInt64] = [
            500_000,  // 0.5 ms
            1_000_000,  // exactly 1 ms: le="0.001" (bounds are inclusive)
            1_000_001,  // just over: le="0.0025"
            30_000_000,  // 30 ms: le="0.05"
            2_000_000_000,  // 2 s: le="2.5"
            61_000_000_000,  // over the last bound: +Inf only
        ]
        for duration in durations { route.record(method: .get, status: 200, nanoseconds: duration) }
        let histogram = render(metrics).filter { $0.hasPrefix("trunk_sync_http_request_duration_seconds") }
        let expectedBuckets: [(String, Int)] = [
            ("0.001", 2), ("0.0025", 3), ("0.005", 3), ("0.01", 3), ("0.025", 3), ("0.05", 4), ("0.1", 4),
            ("0.25", 4), ("0.5", 4), ("1", 4), ("2.5", 5), ("5", 5), ("10", 5), ("30", 5), ("60", 5), ("+Inf", 6),
        ]
        XCTAssertEqual(
            Array(histogram.prefix(expectedBuckets.count)),
            expectedBuckets.map {
                #"trunk_sync_http_request_duration_seconds_bucket{route="/h",le="\#($0.0)"} \#($0.1)"#
            })
        XCTAssertEqual(histogram.count, expectedBuckets.count + 2)
        XCTAssertEqual(histogram.last, #"trunk_sync_http_request_duration_seconds_count{route="/h"} 6"#)
        let sumLine = histogram[expectedBuckets.count]
        let prefix = #"trunk_sync_http_request_duration_seconds_sum{route="/h"} "#
        XCTAssertTrue(sumLine.hasPrefix(prefix), sumLine)
        let sum = try XCTUnwrap(Double(sumLine.dropFirst(prefix.count)))
        XCTAssertEqual(sum, Double(durations.reduce(0, +)) / 1e9, accuracy: 1e-9)
        XCTAssertEqual(sum, 63.032500001, accuracy: 1e-9)
    }

    func testRenderParsesAsPrometheusText() throws {
        let metrics = Metrics()
        metrics.eventsPushed.increment(by: 2)
        metrics.rateLimited("mail").increment()
        metrics.gauge("trunk_sync_test_gauge", help: "A gauge.") { 2.5 }
        metrics.gauge("trunk_sync_test_whole", help: "A whole gauge.") { 7 }
        metrics.route("/x").record(method: .get, status: 200, nanoseconds: 3_000_000)
        metrics.route("/x").record(method: HTTPMethod(rawValue: "FOO"), status: 299, nanoseconds: 1)
        // Label values are escaped (patterns are the server's own, but the format must hold).
        let odd = "/we\"ird\\route"
        metrics.route(odd).record(method: .post, status: 201, nanoseconds: 20_000_000)
        let text = metrics.render()
        XCTAssertTrue(text.hasSuffix("\n"))
        XCTAssertTrue(text.contains(#"route="/we\"ird\\route""#), text)
        let samples = try prometheusSamples(text)
        XCTAssertEqual(samples["trunk_sync_events_pushed_total"], 2)
        XCTAssertEqual(samples["trunk_sync_rate_limited_total{limit=mail}"], 1)
        XCTAssertEqual(samples["trunk_sync_test_gauge"], 2.5)
        XCTAssertEqual(samples["trunk_sync_test_whole"], 7)
        XCTAssertEqual(samples["trunk_sync_http_requests_total{method=GET,route=/x,status=200}"], 1)
        XCTAssertEqual(samples["trunk_sync_http_requests_total{method=other,route=/x,status=other}"], 1)
        XCTAssertEqual(samples["trunk_sync_http_requests_total{method=POST,route=\(odd),status=201}"], 1)
        XCTAssertEqual(samples["trunk_sync_http_request_duration_seconds_bucket{le=0.005,route=/x}"], 2)
        XCTAssertEqual(samples["trunk_sync_http_request_duration_seconds_bucket{le=0.001,route=/x}"], 1)
        XCTAssertEqual(samples["trunk_sync_http_request_duration_seconds_count{route=\(odd)}"], 1)
        XCTAssertEqual(
            samples["trunk_sync_http_request_duration_seconds_sum{route=\(odd)}"] ?? 0, 0.02, accuracy: 1e-12)
    }

    // MARK: - Helpers

    func render(_ metrics: Metrics) -> [String] { metrics.render().split(separator: "\n").map(String.init) }
}
