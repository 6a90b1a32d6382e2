import Foundation
import Synchronization
import XCTest

@testable import TrunkSync

/// The rules that keep an empty pull answered from memory no staler than a notification:
/// what is recorded, what is refused, and when nothing is trusted.
final class LastSeqCacheTests: XCTestCase {
    /// The listener's session as the test sets it.
    final class Session: Sendable {
        let value = Mutex<UInt64?>(1)
        func set(_ session: UInt64?) { value.withLock { $0 = session } }
    }

    let user = UUID()
    let session = Session()

    func listeningCache(capacity: Int = 16, maxAge: Duration = .seconds(3600)) -> LastSeqCache {
        let session = self.session
        let cache = LastSeqCache(capacity: capacity, maxAge: maxAge, session: { session.value.withLock { $0 } })
        cache.listening(session: 1)
        return cache
    }

    func testARecordedPullMakesLaterPullsAtOrAfterItKnownEmpty() throws {
        let cache = listeningCache()
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5), "nothing known yet")
        cache.record(user, newest: 5, since: try XCTUnwrap(cache.ticket()))
        XCTAssertTrue(cache.isKnownEmpty(user, after: 5))
        XCTAssertTrue(cache.isKnownEmpty(user, after: 9))
        XCTAssertFalse(cache.isKnownEmpty(user, after: 4), "event 5 is after 4")
        XCTAssertFalse(cache.isKnownEmpty(UUID(), after: 5), "another user")
    }

    func testACommitAnnouncedForgetsTheUser() throws {
        let cache = listeningCache()
        cache.record(user, newest: 5, since: try XCTUnwrap(cache.ticket()))
        cache.invalidate(user)
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5))
        // A pull that starts afterwards may teach it again.
        cache.record(user, newest: 6, since: try XCTUnwrap(cache.ticket()))
        XCTAssertTrue(cache.isKnownEmpty(user, after: 6))
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5))
    }

    func testAPullThatStartedBeforeACommitWasAnnouncedRecordsNothing() throws {
        let cache = listeningCache()
        // The pull takes its ticket, its snapshot misses a commit whose notification is
        // handled before the pull's answer comes back.
        let ticket = try XCTUnwrap(cache.ticket())
        cache.invalidate(user)
        cache.record(user, newest: 5, since: ticket)
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5))
        // Also when the user was known before.
        cache.record(user, newest: 5, since: try XCTUnwrap(cache.ticket()))
        let late = try XCTUnwrap(cache.ticket())
        cache.invalidate(user)
        cache.record(user, newest: 5, since: late)
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5))
        // Another user's commit does not block this user's record.
        let other = try XCTUnwrap(cache.ticket())
        cache.invalidate(UUID())
        cache.record(user, newest: 7, since: other)
        XCTAssertTrue(cache.isKnownEmpty(user, after: 7))
    }

    func testTwoRecordsKeepTheSmallerBound() throws {
        let cache = listeningCache()
        cache.record(user, newest: 5, since: try XCTUnwrap(cache.ticket()))
        // A pull far beyond the newest event found nothing either: it does not move the bound.
        cache.record(user, newest: 1_000_000, since: try XCTUnwrap(cache.ticket()))
        XCTAssertTrue(cache.isKnownEmpty(user, after: 5))
        cache.record(user, newest: 3, since: try XCTUnwrap(cache.ticket()))
        XCTAssertTrue(cache.isKnownEmpty(user, after: 3))
        XCTAssertFalse(cache.isKnownEmpty(user, after: 2))
    }

    func testNothingIsTrustedWhileTheListenerIsAwayNorAfterItReconnectsUntilCleared() throws {
        let cache = listeningCache()
        cache.record(user, newest: 5, since: try XCTUnwrap(cache.ticket()))
        session.set(nil)
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5), "listener disconnected")
        XCTAssertNil(cache.ticket())
        // Reconnected, but the reconnect not yet handled: notifications in between were lost.
        session.set(2)
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5))
        XCTAssertNil(cache.ticket())
        cache.listening(session: 2)
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5), "cleared on reconnect")
        XCTAssertEqual(cache.count, 0)
        cache.record(user, newest: 5, since: try XCTUnwrap(cache.ticket()))
        XCTAssertTrue(cache.isKnownEmpty(user, after: 5))
    }

    func testAPullThatStartedBeforeAClearRecordsNothing() throws {
        let cache = listeningCache()
        let ticket = try XCTUnwrap(cache.ticket())
        cache.listening(session: 1)  // notifications lost (a subscriber fell behind)
        cache.record(user, newest: 5, since: ticket)
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5))
    }

    func testAnEntryIsTrustedOnlyForItsMaximumAge() throws {
        // A notification lost between a commit and its NOTIFY is outlived by no entry.
        let cache = listeningCache(maxAge: .zero)
        cache.record(user, newest: 5, since: try XCTUnwrap(cache.ticket()))
        XCTAssertFalse(cache.isKnownEmpty(user, after: 5))
        // An expired bound is replaced by the next record, not combined with it.
        cache.record(user, newest: 9, since: try XCTUnwrap(cache.ticket()))
        XCTAssertEqual(cache.count, 1)
        let fresh = listeningCache(maxAge: .seconds(60))
        fresh.record(user, newest: 5, since: try XCTUnwrap(fresh.ticket()))
        XCTAssertTrue(fresh.isKnownEmpty(user, after: 5))
    }

    func testWithoutAListenerNothingIsEverKnown() {
        let cache = LastSeqCache(session: { nil })
        cache.listening(session: nil)
        XCTAssertNil(cache.ticket())
        XCTAssertFalse(cache.isKnownEmpty(user, after: 0))
    }

    func testMemoryIsBoundedAndAFullCacheForgetsEverythingSafely() throws {
        let cache = listeningCache(capacity: 4)
        let users = (0..<4).map { _ in UUID() }
        for user in users { cache.record(user, newest: 1, since: try XCTUnwrap(cache.ticket())) }
        XCTAssertEqual(cache.count, 4)
        // A fifth user clears everything rather than dropping one entry (which could be an
        // invalidation marker a pull in flight still needs).
        let inFlight = try XCTUnwrap(cache.ticket())
        cache.invalidate(users[0])
        cache.record(UUID(), newest: 1, since: try XCTUnwrap(cache.ticket()))
        XCTAssertEqual(cache.count, 0)
        cache.record(users[0], newest: 1, since: inFlight)
        XCTAssertFalse(cache.isKnownEmpty(users[0], after: 1), "the marker's absence lets no older pull in")
        // Invalidations of unknown users are bounded the same way.
        for _ in 0..<100 { cache.invalidate(UUID()) }
        XCTAssertLessThanOrEqual(cache.count, 4)
    }
}
