import Foundation
import HTTPServer
import Logging
import Synchronization
import XCTest

@testable import TrunkSync

/// Per-loop copies of what every request updates (route metrics, request id counters):
/// each event loop writes its own slot, readers see the sum, and request ids stay unique
/// across loops and other threads.
final class LoopSlotTests: XCTestCase {
    /// A responder that never sees a request: the test only needs running loops.
    struct Idle: HTTPResponder {
        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> {
            .answer(HTTPResponse(status: .notFound), 0)
        }
        func respond(to request: HTTPRequest, context: Int) -> Reply<Int> { .now(HTTPResponse(status: .notFound), 0) }
        func complete(_ response: inout HTTPResponse, context: Int) {}
        func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse { HTTPResponse(status: .badRequest) }
        func refuseConnection() -> HTTPResponse { HTTPResponse(status: .serviceUnavailable) }
    }

    /// Runs `body` once on each of two loops' threads, then on this thread.
    func onEveryLoopAndHere(_ body: @escaping @Sendable () -> Void) async throws {
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        configuration.loops = 2
        let server = HTTPServer(configuration: configuration, responder: Idle(), logger: Logger(label: "test"))
        try server.start()
        for executor in server.executors {
            await Task(executorPreference: executor) {
                XCTAssertEqual(LoopExecutor.current?.index, executor.index)
                body()
            }.value
        }
        server.shutdown()
        await server.waitUntilStopped()
        body()
    }

    func testEachLoopHasItsSlotAndOtherThreadsShareTheLast() async throws {
        XCTAssertGreaterThanOrEqual(LoopSlot.count, 2)
        XCTAssertEqual(LoopSlot.current, LoopSlot.count - 1, "not a loop's thread")
        let slots = Mutex<[Int]>([])
        try await onEveryLoopAndHere { slots.withLock { $0.append(LoopSlot.current) } }
        let expected = [0, min(1, LoopSlot.count - 1), LoopSlot.count - 1]
        XCTAssertEqual(slots.withLock { $0 }, expected)
    }

    func testRouteMetricsSumWhatEveryLoopCounted() async throws {
        let metrics = Metrics()
        let route = metrics.route("/x")
        try await onEveryLoopAndHere {
            route.record(method: .get, status: 200, nanoseconds: 2_000_000)
            route.record(method: .post, status: 503, nanoseconds: 20_000_000)
        }
        XCTAssertEqual(route.totals().requests, 6)
        XCTAssertEqual(route.totals().serverErrors, 3)
        let text = metrics.render()
        XCTAssertTrue(text.contains(#"trunk_sync_http_requests_total{method="GET",route="/x",status="200"} 3"#), text)
        XCTAssertTrue(text.contains(#"trunk_sync_http_requests_total{method="POST",route="/x",status="503"} 3"#), text)
        XCTAssertTrue(
            text.contains(#"trunk_sync_http_request_duration_seconds_bucket{route="/x",le="0.0025"} 3"#), text)
        XCTAssertTrue(text.contains(#"trunk_sync_http_request_duration_seconds_bucket{route="/x",le="+Inf"} 6"#), text)
        XCTAssertTrue(text.contains(#"trunk_sync_http_request_duration_seconds_count{route="/x"} 6"#), text)
        XCTAssertTrue(text.contains(#"trunk_sync_http_request_duration_seconds_sum{route="/x"} 0.066"#), text)
        XCTAssertEqual(metrics.requestTotals().requests, 6)
    }

    func testRequestIDsAreUniqueAcrossLoopsAndThreadsAndSmall() async throws {
        let generator = RequestIDGenerator()
        let ids = Mutex<[String]>([])
        try await onEveryLoopAndHere {
            let made = (0..<1000).map { _ in generator.next() }
            ids.withLock { $0 += made }
        }
        let all = ids.withLock { $0 }
        XCTAssertEqual(all.count, 3000)
        XCTAssertEqual(Set(all).count, 3000, "no id twice")
        let prefix = all[0].prefix(7)
        for id in all {
            XCTAssertEqual(id.prefix(7), prefix, "one prefix per generator")
            XCTAssertNotNil(id.wholeMatch(of: /[0-9a-f]{6}-[0-9a-f]{1,16}/), id)
            XCTAssertLessThanOrEqual(id.utf8.count, 15, "a small string while the counter has eight hex digits")
            XCTAssertEqual(RequestIDGenerator.sanitize(id), id, "what a client may send back")
        }
    }

    func testRequestIDFormat() {
        let prefix = (
            UInt8(ascii: "a"), UInt8(ascii: "b"), UInt8(ascii: "c"), UInt8(ascii: "0"), UInt8(ascii: "1"),
            UInt8(ascii: "2")
        )
        XCTAssertEqual(RequestIDGenerator.format(prefix: prefix, 0), "abc012-0")
        XCTAssertEqual(RequestIDGenerator.format(prefix: prefix, 1), "abc012-1")
        XCTAssertEqual(RequestIDGenerator.format(prefix: prefix, 255), "abc012-ff")
        XCTAssertEqual(RequestIDGenerator.format(prefix: prefix, 0xdead_beef), "abc012-deadbeef")
        XCTAssertEqual(RequestIDGenerator.format(prefix: prefix, UInt64.max), "abc012-ffffffffffffffff")
    }
}
