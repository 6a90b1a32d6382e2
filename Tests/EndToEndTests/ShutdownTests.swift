import Foundation
import Postgres
import TestSupport
import XCTest

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// SIGTERM: stop accepting, finish what is in flight, exit 0; and start-up refusals.
final class ShutdownTests: EndToEndTestCase {
    func testSIGTERMFinishesTheRequestInFlightThenExitsZero() throws {
        let server = try startServer()
        // /readyz reads schema_migrations: holding an exclusive lock on it keeps the request in flight.
        let blocker = try PostgresConnection.connect(server.database)
        try blocker.execute("begin")
        try blocker.execute("lock table schema_migrations in access exclusive mode")
        var locked = true
        defer { if locked { try? blocker.execute("rollback") } }

        let client = try server.connect()
        try client.send(request("GET", "/readyz"))
        let waiting = try eventually(within: 5) {
            try blocker.query("select count(*)::int8 from pg_locks where not granted")[0].decode(Int64.self, column: 0)
                > 0
        }
        XCTAssertTrue(waiting, "the /readyz query never waited for the lock")

        server.signal(SIGTERM)
        XCTAssertTrue(eventually(within: 5) { !server.acceptsConnections() }, "still accepting after SIGTERM")
        XCTAssertTrue(server.isRunning, "exited with a request in flight")

        try blocker.execute("commit")
        locked = false
        let response = try client.readResponse(timeout: 10)
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.bodyText, #"{"status":"ready"}"#)
        XCTAssertTrue(response.closesConnection, "no keep-alive while shutting down")
        XCTAssertEqual(server.waitForExit(timeout: 10), 0)
    }

    func testSIGTERMWithIdleConnectionsExitsZeroPromptly() throws {
        let server = try startServer()
        var clients: [RawClient] = []
        for index in 0..<20 {
            let client = try server.connect()
            if index.isMultiple(of: 2) {
                try client.send(request("GET", "/healthz"))
                XCTAssertEqual(try client.readResponse().status, 200)
            }
            clients.append(client)
        }
        let started = ContinuousClock.now
        XCTAssertEqual(server.stop(timeout: 5), 0)
        // Idle connections would hold shutdown to its 10 s timeout; 4 s separates the two and
        // holds on a loaded machine.
        XCTAssertLessThan(ContinuousClock.now - started, .seconds(4), "shutdown waited for idle connections")
        XCTAssertTrue(try clients.allSatisfy { try $0.waitForClose(timeout: 1) })
    }

    func testInvalidHTTPSettingsStopStartUpWithOneClearLine() throws {
        for (variable, value) in [
            ("TRUNK_SYNC_HTTP_HEADER_TIMEOUT", "soon"), ("TRUNK_SYNC_HTTP_IDLE_TIMEOUT", "0"),
            ("TRUNK_SYNC_HTTP_MAX_CONNECTIONS", "-1"),
        ] {
            let server = try launchServer([variable: value])
            let status = server.waitForExit(timeout: 10)
            XCTAssertEqual(status.map { $0 != 0 }, true, variable)
            XCTAssertTrue(server.stderr.waitForEnd(timeout: 5))
            XCTAssertTrue(server.logs.contains(variable), "\(variable) not named in: \(server.logs)")
            XCTAssertFalse(server.logs.contains(" listening "))
        }
    }
}
