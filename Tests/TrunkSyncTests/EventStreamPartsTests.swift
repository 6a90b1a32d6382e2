import Foundation
import Logging
import Postgres
import TestSupport
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// The event stream's parts without a server: its inputs, its slots, and the subscription
/// that wakes it (the whole stream is in `EventStreamTests`, end to end).
final class EventStreamPartsTests: XCTestCase {
    func request(_ query: String?, headers: HTTPHeaders = [:]) -> HTTPRequest {
        HTTPRequest(method: .get, path: "/sync/v1/stream", query: query, headers: headers)
    }

    func testStartingPointIsAfterOrTheLastEventIDWhichWins() throws {
        XCTAssertEqual(try StreamRoutes.startingPoint(request(nil)), 0)
        XCTAssertEqual(try StreamRoutes.startingPoint(request("after=42&access_token=t")), 42)
        XCTAssertEqual(try StreamRoutes.startingPoint(request("after=42", headers: ["Last-Event-ID": "7"])), 7)
        XCTAssertEqual(try StreamRoutes.startingPoint(request("after=42", headers: ["Last-Event-ID": ""])), 42)
        XCTAssertEqual(try StreamRoutes.startingPoint(request(nil, headers: ["Last-Event-ID": " 9 "])), 9)
    }

    func testEachParameterAtMostOnceWhateverTheQuerysLength() throws {
        let many = (1...12).map { "p\($0)=\($0)" }
        for count in [2, 8, 9, 12] {
            let names = many.prefix(count)
            XCTAssertEqual(try SyncRoutes.uniqueQueryItems(request(names.joined(separator: "&"))).count, count)
            // The last one repeats the first: found pairwise (up to 8) and through a set (more).
            let repeated = names.dropLast() + ["p1=again"]
            let query = repeated.joined(separator: "&")
            XCTAssertThrowsError(try SyncRoutes.uniqueQueryItems(request(query)), "\(count)") {
                XCTAssertEqual(($0 as? APIError)?.code, "invalid_parameter")
                XCTAssertEqual(($0 as? APIError)?.message, "p1 is given more than once.")
            }
        }
    }

    func testStartingPointRefusesWhatIsNotACursor() {
        for (query, headers, code) in [
            ("after=-1", [:], "invalid_parameter"), ("after=1.5", [:], "invalid_parameter"),
            ("after=99999999999999999999", [:], "invalid_parameter"), ("after=1&after=2", [:], "invalid_parameter"),
            ("wait=5", [:], "invalid_parameter"), ("access_token=a&access_token=b", [:], "invalid_parameter"),
            ("", ["Last-Event-ID": "x"], "invalid_last_event_id"),
            ("", ["Last-Event-ID": "-1"], "invalid_last_event_id"),
        ] as [(String, HTTPHeaders, String)] {
            XCTAssertThrowsError(try StreamRoutes.startingPoint(request(query, headers: headers)), query) { error in
                XCTAssertEqual((error as? APIError)?.code, code, query)
            }
        }
        var twice = HTTPHeaders()
        twice.append(name: "Last-Event-ID", value: "1")
        twice.append(name: "Last-Event-ID", value: "2")
        XCTAssertThrowsError(try StreamRoutes.startingPoint(request(nil, headers: twice)))
    }

    func testAcceptMustNameTheEventStreamType() {
        XCTAssertTrue(StreamRoutes.acceptsEventStream(["Accept": "text/event-stream"]))
        XCTAssertTrue(StreamRoutes.acceptsEventStream(["Accept": "application/json, Text/Event-Stream;q=0.9"]))
        XCTAssertFalse(StreamRoutes.acceptsEventStream([:]))
        XCTAssertFalse(StreamRoutes.acceptsEventStream(["Accept": "*/*"]))
        XCTAssertFalse(StreamRoutes.acceptsEventStream(["Accept": "text/event-streams"]))
    }

    /// Streams over a database that is never asked (close it after).
    func streams(perUser: Int, total: Int) throws -> (EventStreams, Database) {
        var settings = EventStreams.Settings()
        settings.maxPerUser = perUser
        settings.maxTotal = total
        let database = try Database(
            try PostgresConfiguration("postgres://nobody@127.0.0.1:1/none"), settings: Database.Settings(),
            logger: Logger(label: "test"))
        let streams = EventStreams(
            settings: settings, store: EventStore(database: database), notifier: EventNotifier(listener: nil),
            revocations: nil, metrics: Metrics(), logger: Logger(label: "test"))
        return (streams, database)
    }

    func testSlotsPerUserAndPerServerAreGivenBack() async throws {
        let (streams, database) = try streams(perUser: 2, total: 3)
        let (alice, bob) = (UUID(), UUID())
        try streams.reserve(for: alice)
        try streams.reserve(for: alice)
        XCTAssertThrowsError(try streams.reserve(for: alice)) { XCTAssertEqual(($0 as? APIError)?.status, 429) }
        try streams.reserve(for: bob)
        XCTAssertThrowsError(try streams.reserve(for: bob)) { XCTAssertEqual(($0 as? APIError)?.retryAfter, 5) }
        streams.release(for: alice, entry: nil)
        XCTAssertEqual(streams.openCount, 2)
        try streams.reserve(for: bob)
        streams.close()
        streams.release(for: bob, entry: nil)
        XCTAssertThrowsError(try streams.reserve(for: UUID())) { XCTAssertEqual(($0 as? APIError)?.status, 503) }
        await database.close()
    }

    func testAStreamThatEndsLeavesItsLoopsShareAndEveryOtherStaysInItsOwnOnce() async throws {
        let (streams, database) = try streams(perUser: 10, total: 10)
        let user = UUID()
        let loops = [LoopExecutor(index: 0, wake: {}), LoopExecutor(index: 1, wake: {})]
        var entries: [EventStreams.Entry] = []
        for index in 0..<7 {
            let hub = try streams.reserve(for: user)
            let writer = HTTPBodyWriter(bufferLimit: 1024, loop: loops[index % 2], wake: {})
            entries.append(streams.register(session: UUID(), expiresAt: .max, writer: writer, hub: hub))
        }
        let hub = entries[0].hub
        // Each loop's streams in its own share: 0, 2, 4, 6 and 1, 3, 5.
        XCTAssertEqual(
            hub.sharedIDs.map { Set($0) },
            [Set([0, 2, 4, 6].map { entries[$0].id }), Set([1, 3, 5].map { entries[$0].id })])
        // Ended first, last and in the middle of their shares: the others stay, each once.
        for index in [0, 5, 4] { entries[index].finish(.clientGone) }
        XCTAssertEqual(
            hub.sharedIDs.map { $0.sorted() },
            [[2, 6].map { entries[$0].id }.sorted(), [1, 3].map { entries[$0].id }.sorted()])
        XCTAssertEqual(Set(hub.entries.map(\.id)), Set([1, 2, 3, 6].map { entries[$0].id }))
        // Ended twice (the hub and the connection's close handler both see it): left once.
        entries[2].finish(.slowReader)
        entries[2].finish(.clientGone)
        XCTAssertEqual(hub.sharedIDs.flatMap { $0 }.sorted(), [1, 3, 6].map { entries[$0].id }.sorted())
        for index in [1, 3, 6] { entries[index].finish(.shutdown) }
        XCTAssertEqual(hub.sharedIDs.flatMap { $0 }, [])
        XCTAssertEqual(streams.openCount, 0)
        streams.close()
        await database.close()
    }

    func testSubscriptionRemembersAWakeUpThatCameWhileItWasBusy() async throws {
        let notifier = EventNotifier(listener: nil)
        let user = UUID()
        let subscription = notifier.subscribe(to: user)
        XCTAssertEqual(notifier.waiting, 0, "streams are not long-polls")
        let before = notifier.generation
        notifier.wake(user)
        notifier.wake(user)
        notifier.wake(UUID())  // another user's
        let generation = await subscription.next()  // returns at once: woken meanwhile
        XCTAssertGreaterThan(generation, before)
        let waiting = Task { await subscription.next() }
        let suspended = await waitUntil(10) { subscription.isWaiting }
        XCTAssertTrue(suspended, "the task waits in next()")
        notifier.wake(user)
        let second = await waiting.value
        XCTAssertGreaterThan(second, generation)
        subscription.cancel()
        let cancelled = Task { await subscription.next() }
        cancelled.cancel()
        _ = await cancelled.value  // cancellation ends the wait
    }
}
