import XCTest

@testable import TrunkSync

final class RequestHistoryTests: XCTestCase {
    /// 2026-11-26 14:00:00 UTC, on a minute boundary.
    let t0 = 1_795_701_600.0

    func testCountsWhatArrivedBetweenSamplesInTheMinuteOfTheSample() {
        let history = RequestHistory(startedAt: t0)
        history.record(now: t0 + 5, requests: 30, errors: 0)
        history.record(now: t0 + 50, requests: 60, errors: 6)
        history.record(now: t0 + 65, requests: 180, errors: 6)
        let minutes = history.minutes(now: t0 + 90)
        XCTAssertEqual(minutes.map(\.start), [Int64(t0), Int64(t0) + 60])
        XCTAssertEqual(minutes[0].requestsPerSecond, 1)  // 60 in the full first minute
        XCTAssertEqual(minutes[0].errorsPerSecond, 0.1)
        XCTAssertEqual(minutes[1].requestsPerSecond, 4)  // 120 in the 30 s of the current minute
        XCTAssertEqual(minutes[1].errorsPerSecond, 0)
    }

    func testKeepsTheLastHourOnlyWithZerosForQuietMinutes() {
        let history = RequestHistory(startedAt: t0)
        var total: UInt64 = 0
        for minute in 0..<150 where minute % 2 == 0 {
            total += 60
            history.record(now: t0 + Double(minute * 60) + 30, requests: total, errors: 0)
        }
        let now = t0 + 149 * 60 + 59
        let minutes = history.minutes(now: now)
        XCTAssertEqual(minutes.count, 60)
        XCTAssertEqual(minutes.first?.start, Int64(t0) + 90 * 60)
        XCTAssertEqual(minutes.last?.start, Int64(t0) + 149 * 60)
        // Sampled minutes (even) got 60 requests, the others none; nothing older than an hour.
        for minute in minutes {
            let index = (minute.start - Int64(t0)) / 60
            XCTAssertEqual(minute.requestsPerSecond, index % 2 == 0 ? 1 : 0, "minute \(index)")
        }
    }

    func testStartsAtTheStartAndCountsAPartialFirstMinuteFromIt() {
        let history = RequestHistory(startedAt: t0 + 30)
        XCTAssertEqual(history.minutes(now: t0 + 30).count, 1)
        history.record(now: t0 + 40, requests: 20, errors: 0)
        let minutes = history.minutes(now: t0 + 40)
        XCTAssertEqual(minutes.map(\.start), [Int64(t0)])
        XCTAssertEqual(minutes[0].requestsPerSecond, 2)  // 20 in the 10 s since the start
    }

    func testTotalsReadBeforeTheLastSampleAddNothingAndCountNothingTwice() {
        let history = RequestHistory(startedAt: t0)
        history.record(now: t0 + 1, requests: 118, errors: 0)
        history.record(now: t0 + 2, requests: 60, errors: 0)  // read earlier, recorded later
        XCTAssertEqual(history.minutes(now: t0 + 59).first?.requestsPerSecond, 2)
        history.record(now: t0 + 3, requests: 177, errors: 0)
        XCTAssertEqual(history.minutes(now: t0 + 59).first?.requestsPerSecond, 3)  // 177 in 59 s
    }
}
