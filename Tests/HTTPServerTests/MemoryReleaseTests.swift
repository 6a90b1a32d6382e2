import XCTest

@testable import HTTPServer

/// When a loop gives freed memory back: after a burst, once quiet; never during steady work.
final class MemoryReleaseTests: XCTestCase {
    func testReleasesOnceAfterABurstWhenTheLoopHasBeenQuiet() {
        var release = MemoryRelease(burst: 3, quiet: 100)
        for time in [10, 20, 30] as [UInt64] { release.worked(now: time) }
        XCTAssertFalse(release.shouldRelease(now: 129), "not quiet for long enough yet")
        XCTAssertTrue(release.shouldRelease(now: 130))
        XCTAssertFalse(release.shouldRelease(now: 529), "the follow-up waits five times as long")
        XCTAssertTrue(release.shouldRelease(now: 530), "for what the burst freed after the first")
        XCTAssertFalse(release.shouldRelease(now: 10_000), "then nothing until the next burst")
    }

    func testSmallOrSteadyWorkNeverReleases() {
        var release = MemoryRelease(burst: 3, quiet: 100)
        release.worked(now: 10)
        release.worked(now: 20)
        XCTAssertFalse(release.shouldRelease(now: 1_000), "two pieces of work are no burst")
        XCTAssertFalse(release.shouldRelease(now: 10_000), "and leave no follow-up")
        var steady = MemoryRelease(burst: 3, quiet: 100)
        for time in stride(from: 0 as UInt64, to: 2_000, by: 50) {
            steady.worked(now: time)
            XCTAssertFalse(steady.shouldRelease(now: time + 49), "never quiet for 100")
        }
    }
}
