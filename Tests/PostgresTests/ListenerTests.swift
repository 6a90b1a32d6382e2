import Foundation
import Postgres
import TestSupport
import XCTest

final class ListenerTests: XCTestCase {
    func listenerConfiguration() throws -> PostgresConfiguration {
        var configuration = try TestDatabase.adminConfiguration()
        configuration.setParameter("application_name", "listener-under-test")
        return configuration
    }

    func testDeliversNotificationsAndSurvivesAReconnect() async throws {
        let listener = PostgresListener(
            try listenerConfiguration(), channels: ["trunk test"], logger: TestDatabase.quietLogger)
        var events = listener.events().makeAsyncIterator()
        listener.start()
        // A hang would fail the test, not stall the suite: stopping ends the stream.
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30)); listener.stop()
        }
        defer { watchdog.cancel() }
        let first = await nextEvent(&events)
        XCTAssertEqual(first, .listening)

        let sender = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try sender.query("select pg_notify($1, $2)", "trunk test", "payload ü")
        let received = await nextEvent(&events)
        XCTAssertEqual(received, .notification(PostgresNotification(channel: "trunk test", payload: "payload ü")))

        // Kill the listener's backend: it must reconnect and LISTEN again on its own.
        try sender.query(
            "select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'listener-under-test'")
        let again = await nextEvent(&events)
        XCTAssertEqual(again, .listening)
        XCTAssertTrue(listener.isListening)
        XCTAssertEqual(listener.session, 2, "the second connection it listens on")
        try sender.query("select pg_notify($1, $2)", "trunk test", "after reconnect")
        let afterReconnect = await nextEvent(&events)
        XCTAssertEqual(
            afterReconnect, .notification(PostgresNotification(channel: "trunk test", payload: "after reconnect")))

        listener.stop()
        let end = await nextEvent(&events)
        XCTAssertNil(end, "the stream finishes when the listener stops")
    }

    func testASubscriberThatFallsBehindItsBufferIsToldItMissedNotifications() async throws {
        let listener = PostgresListener(
            try listenerConfiguration(), channels: ["burst"], logger: TestDatabase.quietLogger)
        var slow = listener.events().makeAsyncIterator()
        var marker = listener.events().makeAsyncIterator()
        listener.start()
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30)); listener.stop()
        }
        defer { watchdog.cancel() }
        let listening = await nextEvent(&slow)
        XCTAssertEqual(listening, .listening)
        XCTAssertEqual(listener.session, 1)
        let sender = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        // More than the 10,000 a subscriber's buffer holds, while `slow` reads nothing.
        try sender.query("select count(pg_notify('burst', n::text)) from generate_series(1, 10100) n")
        try sender.query("select pg_notify('burst', 'last')")
        try sender.query("select pg_notify('burst', 'fence')")
        // The listener hands each event to every subscriber before the next event: once
        // `marker` has the fence, `slow` has had the last one. (`marker` having the last one
        // said nothing: `slow` may come after it in that turn, and the test then read `slow`
        // while it was being filled: it was no longer full when the last one came, nothing
        // was dropped, no `.listening` followed, and the test waited for the watchdog.)
        while let event = await nextEvent(&marker),
            event != .notification(PostgresNotification(channel: "burst", payload: "fence"))
        {}
        var received: [PostgresListenerEvent] = []
        while received.last != .notification(PostgresNotification(channel: "burst", payload: "last")) {
            guard let event = await nextEvent(&slow) else { break }
            received.append(event)
        }
        let after = await nextEvent(&slow)
        XCTAssertEqual(after, .listening, "the newest event says notifications were lost")
        XCTAssertLessThan(received.count, 10_102, "the oldest were dropped")
        XCTAssertEqual(listener.session, 1, "no reconnect")
        listener.stop()
    }

    func testCloseReturnsOnceTheConnectionIsClosedAndTheStreamsFinished() async throws {
        let listener = PostgresListener(
            try listenerConfiguration(), channels: ["closing"], logger: TestDatabase.quietLogger)
        var events = listener.events().makeAsyncIterator()
        listener.start()
        let listening = await nextEvent(&events)
        XCTAssertEqual(listening, .listening)
        try await withTimeout(30, "close()") { await listener.close() }
        XCTAssertNil(listener.session)
        let end = await nextEvent(&events)
        XCTAssertNil(end, "the stream finished")
        // Closed, not abandoned: the server sees the session end (libpq says goodbye).
        let gone = try await waitUntil(10) {
            try PostgresConnection.connect(try TestDatabase.adminConfiguration()).query(
                "select count(*) from pg_stat_activity where application_name = 'listener-under-test'")[0]
                .decode(Int.self, column: 0) == 0
        }
        XCTAssertTrue(gone, "the listening session ended")
    }

    func testCloseEndsAListenerThatCannotConnect() async throws {
        var unreachable = try listenerConfiguration()
        unreachable.setParameter("port", String(try unusedPort()))
        let listener = PostgresListener(unreachable, channels: ["never"], logger: TestDatabase.quietLogger)
        var events = listener.events().makeAsyncIterator()
        listener.start()
        XCTAssertFalse(listener.isListening)
        // Connecting or waiting out its backoff on the loop: close() ends either at once.
        try await withTimeout(30, "close()") { await listener.close() }
        let end = await nextEvent(&events)
        XCTAssertNil(end, "the stream finished without a .listening")
    }

    func testNotificationsOnOtherChannelsAreNotDelivered() async throws {
        let listener = PostgresListener(
            try listenerConfiguration(), channels: ["wanted"], logger: TestDatabase.quietLogger)
        var events = listener.events().makeAsyncIterator()
        listener.start()
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30)); listener.stop()
        }
        defer { watchdog.cancel() }
        let listening = await nextEvent(&events)
        XCTAssertEqual(listening, .listening)
        let sender = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try sender.query("select pg_notify('unwanted', 'x')")
        try sender.query("select pg_notify('wanted', 'y')")
        let received = await nextEvent(&events)
        XCTAssertEqual(received, .notification(PostgresNotification(channel: "wanted", payload: "y")))
        listener.stop()
    }

    func testASubscriberToSomeChannelsGetsOnlyTheirNotificationsAndEveryListening() async throws {
        let listener = PostgresListener(
            try listenerConfiguration(), channels: ["one", "two"], logger: TestDatabase.quietLogger)
        var onlyTwo = listener.events(channels: ["two"]).makeAsyncIterator()
        var all = listener.events().makeAsyncIterator()
        listener.start()
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30)); listener.stop()
        }
        defer { watchdog.cancel() }
        let listeningTwo = await nextEvent(&onlyTwo)
        XCTAssertEqual(listeningTwo, .listening)
        let listeningAll = await nextEvent(&all)
        XCTAssertEqual(listeningAll, .listening)
        let sender = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try sender.query("select pg_notify('one', 'a')")
        try sender.query("select pg_notify('two', 'b')")
        // Each subscriber gets events in the order they came: `all` sees 'one' then 'two';
        // `onlyTwo`'s next is 'two', so 'one' never entered its stream.
        let firstAll = await nextEvent(&all)
        XCTAssertEqual(firstAll, .notification(PostgresNotification(channel: "one", payload: "a")))
        let secondAll = await nextEvent(&all)
        XCTAssertEqual(secondAll, .notification(PostgresNotification(channel: "two", payload: "b")))
        let firstTwo = await nextEvent(&onlyTwo)
        XCTAssertEqual(firstTwo, .notification(PostgresNotification(channel: "two", payload: "b")))
        // A reconnect reaches every subscriber, whatever its channels.
        try sender.query(
            "select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'listener-under-test'")
        let againTwo = await nextEvent(&onlyTwo)
        XCTAssertEqual(againTwo, .listening)
        let againAll = await nextEvent(&all)
        XCTAssertEqual(againAll, .listening)
        listener.stop()
    }
}

/// The next event, or nil when the stream ended (each test's watchdog bounds the wait).
func nextEvent(_ iterator: inout AsyncStream<PostgresListenerEvent>.Iterator) async -> PostgresListenerEvent? {
    await iterator.next()
}
