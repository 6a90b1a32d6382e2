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
        let listener = PostgresListener(try listenerConfiguration(), channels: ["trunk test"], logger: TestDatabase.quietLogger)
        var events = listener.events().makeAsyncIterator()
        listener.start()
        // A hang would fail the test, not stall the suite: stopping ends the stream.
        let watchdog = Task { try await Task.sleep(for: .seconds(30)); listener.stop() }
        defer { watchdog.cancel() }
        let first = await nextEvent(&events)
        XCTAssertEqual(first, .listening)

        let sender = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        try sender.query("select pg_notify($1, $2)", "trunk test", "payload ü")
        let received = await nextEvent(&events)
        XCTAssertEqual(received, .notification(PostgresNotification(channel: "trunk test", payload: "payload ü")))

        // Kill the listener's backend: it must reconnect and LISTEN again on its own.
        try sender.query("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'listener-under-test'")
        let again = await nextEvent(&events)
        XCTAssertEqual(again, .listening)
        XCTAssertTrue(listener.isListening)
        try sender.query("select pg_notify($1, $2)", "trunk test", "after reconnect")
        let afterReconnect = await nextEvent(&events)
        XCTAssertEqual(afterReconnect, .notification(PostgresNotification(channel: "trunk test", payload: "after reconnect")))

        listener.stop()
        let end = await nextEvent(&events)
        XCTAssertNil(end, "the stream finishes when the listener stops")
    }

    func testNotificationsOnOtherChannelsAreNotDelivered() async throws {
        let listener = PostgresListener(try listenerConfiguration(), channels: ["wanted"], logger: TestDatabase.quietLogger)
        var events = listener.events().makeAsyncIterator()
        listener.start()
        let watchdog = Task { try await Task.sleep(for: .seconds(30)); listener.stop() }
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
}

/// The next event, or nil when the stream ended (each test's watchdog bounds the wait).
func nextEvent(_ iterator: inout AsyncStream<PostgresListenerEvent>.Iterator) async -> PostgresListenerEvent? {
    await iterator.next()
}
