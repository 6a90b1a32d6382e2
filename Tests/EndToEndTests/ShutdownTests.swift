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

    /// A database that accepts and never answers holds start-up in its checks (the role check
    /// up to 5 s, then the signing keys' connection up to the URL's connect_timeout): a SIGTERM
    /// or SIGINT meanwhile (docker compose stop, Ctrl-C) ends it at once with exit 0 and one
    /// line, every connection attempt abandoned and every thread joined.
    func testASignalDuringStartUpStopsItCleanly() throws {
        let password = "pw-\(UUID().uuidString)"
        // While the role check connects (its first wait), then while the signing keys'
        // connection does: once the role check gave up after its own 5 s, the third
        // connection (after the listener's and the role check's).
        for (number, stage, connections) in [
            (SIGTERM, "connecting to the database", 1), (SIGINT, "cannot check the database role", 3),
        ] {
            let mute = try MuteServer()
            defer { mute.stop() }
            let url = "postgres://trunk:\(password)@127.0.0.1:\(mute.port)/db?connect_timeout=600&sslmode=disable"
            let server = try launchServer(on: try PostgresConfiguration(url), ["TRUNK_SYNC_DATABASE_URL": url])
            XCTAssertNotNil(
                server.stderr.waitForLine(containing: stage, timeout: 30), "\(stage) never logged: \(server.logs)")
            XCTAssertTrue(eventually(within: 30) { mute.accepted >= connections }, "\(mute.accepted) connections")
            server.signal(number)
            // Far less than the 600 s the signing keys' attempt would wait.
            XCTAssertEqual(server.waitForExit(timeout: 60), 0, server.logs)
            XCTAssertTrue(server.stderr.waitForEnd(timeout: 10))
            let lines = server.logs.split(separator: "\n")
            XCTAssertTrue(lines.last?.hasSuffix("stopped during start-up") == true, server.logs)
            XCTAssertTrue(server.logs.contains("signal received, shutting down"), server.logs)
            for unexpected in ["listening", "still running at exit", "cannot load signing keys", password] {
                XCTAssertFalse(server.logs.contains(unexpected), "\(unexpected) in: \(server.logs)")
            }
            if number == SIGTERM {  // the role check was cut short, not timed out
                XCTAssertFalse(server.logs.contains("cannot check the database role"), server.logs)
            }
        }
    }

    func testInvalidHTTPSettingsStopStartUpWithOneClearLine() throws {
        for (variable, value) in [
            ("TRUNK_SYNC_HTTP_HEADER_TIMEOUT", "soon"), ("TRUNK_SYNC_HTTP_IDLE_TIMEOUT", "0"),
            ("TRUNK_SYNC_HTTP_MAX_CONNECTIONS", "-1"), ("TRUNK_SYNC_HOST", "http://0.0.0.0"),
            ("TRUNK_SYNC_HOST", "nowhere.invalid"), ("TRUNK_SYNC_CORS_ORIGINS", "https://app.example.com/"),
        ] {
            let server = try launchServer([variable: value])
            let status = server.waitForExit(timeout: 10)
            XCTAssertEqual(status.map { $0 != 0 }, true, variable)
            XCTAssertTrue(server.stderr.waitForEnd(timeout: 5))
            XCTAssertTrue(server.logs.contains(variable), "\(variable) not named in: \(server.logs)")
            XCTAssertFalse(server.logs.contains(" listening "))
            // One line, before start-up waited on the database.
            let lines = server.logs.split(separator: "\n")
            XCTAssertEqual(lines.count, 1, server.logs)
            if !variable.hasPrefix("TRUNK_SYNC_HTTP_") {  // the value, when it is not secret and not a number
                XCTAssertTrue(lines.first?.contains(value) ?? false, server.logs)
            }
        }
    }
}
