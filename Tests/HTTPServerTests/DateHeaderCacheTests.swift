import XCTest

@testable import HTTPServer

/// The `Date` header: formatted once per wall-clock second, reused in between without
/// reading the clock (the loop's monotonic time says when the second ends).
final class DateHeaderCacheTests: XCTestCase {
    /// A wall clock the test sets, counting how often it is read.
    private final class Clock: @unchecked Sendable {  // one test thread
        var seconds = 784_111_777  // Sun, 06 Nov 1994 08:49:37 GMT
        var nanoseconds = 250_000_000
        var reads = 0
    }

    private func line(_ cache: DateHeaderCache, now: UInt64) -> String {
        var output: [UInt8] = []
        cache.appendHeaderLine(now: now, to: &output)
        return String(decoding: output, as: UTF8.self)
    }

    func testFormatsTheSecondAsAnIMFFixdate() {
        XCTAssertEqual(
            String(decoding: DateHeaderCache.headerLine(seconds: 784_111_777), as: UTF8.self),
            "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n")
        XCTAssertEqual(
            String(decoding: DateHeaderCache.headerLine(seconds: 1_709_251_199), as: UTF8.self),
            "Date: Thu, 29 Feb 2024 23:59:59 GMT\r\n")
    }

    func testReadsTheWallClockOncePerSecond() {
        let clock = Clock()
        let cache = DateHeaderCache {
            clock.reads += 1
            return (clock.seconds, clock.nanoseconds)
        }
        // 0.25 s into a second at monotonic 1_000: the line holds until monotonic 750_001_000.
        XCTAssertEqual(line(cache, now: 1_000), "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n")
        XCTAssertEqual(line(cache, now: 500_000_000), "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n")
        XCTAssertEqual(line(cache, now: 750_000_999), "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n")
        XCTAssertEqual(clock.reads, 1, "within the second the clock is not read again")

        clock.seconds += 1
        clock.nanoseconds = 0
        XCTAssertEqual(line(cache, now: 750_001_000), "Date: Sun, 06 Nov 1994 08:49:38 GMT\r\n")
        XCTAssertEqual(clock.reads, 2)

        // The wall clock jumped (set by an operator): the next second's line shows it.
        clock.seconds += 3600
        XCTAssertEqual(line(cache, now: 1_750_001_000), "Date: Sun, 06 Nov 1994 09:49:38 GMT\r\n")
        XCTAssertEqual(clock.reads, 3)
    }
}
