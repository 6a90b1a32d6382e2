import Foundation
import TestSupport
import XCTest

/// Long-poll bookkeeping through the real binary: however a waiting pull ends (the client
/// goes away, the database fails), `trunk_sync_longpolls_waiting` comes back down.
final class LongPollTests: EndToEndTestCase {
    func accessToken(_ server: ServerProcess, _ email: String) throws -> String {
        // The command gets the server's settings, but patience for its own pool.
        var environment = server.environment
        environment["TRUNK_SYNC_DB_POOL_TIMEOUT"] = "5"
        let result = try Command.run(Command.trunkSyncBinary(), ["token", "--email", email], environment: environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        let session = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        return try XCTUnwrap(session["access_token"] as? String)
    }

    /// The gauge as `/metrics` (on the admin listener) shows it now (nil when it cannot be read).
    func waiting(_ server: ServerProcess) -> Int? {
        guard let response = try? server.adminExchange(request("GET", "/metrics")) else { return nil }
        guard
            let line = response.bodyText.split(separator: "\n").first(where: {
                $0.hasPrefix("trunk_sync_longpolls_waiting ")
            })
        else { return nil }
        return Int(line.split(separator: " ").last ?? "")
    }

    func longPoll(_ token: String, wait: Int) -> String {
        request("GET", "/sync/v1/events?after=0&wait=\(wait)", headers: [("Authorization", "Bearer \(token)")])
    }

    func testClientsThatDropWhileWaitingReleaseTheirLongPolls() throws {
        let server = try startServer()
        let token = try accessToken(server, "drop@example.com")
        // 100 clients wait, then all go away at once (reset, as a killed app's socket may be).
        var clients: [RawClient] = []
        for _ in 0..<100 {
            let client = try server.connect()
            try client.send(longPoll(token, wait: 60))
            clients.append(client)
        }
        XCTAssertTrue(
            eventually(within: 20, interval: .milliseconds(50)) { waiting(server) == 100 },
            "\(waiting(server) ?? -1) waiting")
        clients.forEach { $0.reset() }
        clients = []
        XCTAssertTrue(
            eventually(within: 10, interval: .milliseconds(50)) { waiting(server) == 0 },
            "\(waiting(server) ?? -1) still waiting")

        // 100 more that go away while their pull is still on its way to the database:
        // some are cancelled between taking their ticket and waiting on it.
        for round in 0..<4 {
            var burst: [RawClient] = []
            for _ in 0..<25 {
                let client = try server.connect()
                try client.send(longPoll(token, wait: 60))
                burst.append(client)
            }
            if round % 2 == 1 { Thread.sleep(forTimeInterval: 0.002) }
            burst.forEach { $0.reset() }
        }
        XCTAssertTrue(
            eventually(within: 10, interval: .milliseconds(50)) { waiting(server) == 0 },
            "\(waiting(server) ?? -1) still waiting")
        assertServerHealthy(server)
    }

    func testLongPollsThatEndInADatabaseErrorAreReleased() throws {
        // One connection and no patience: most pulls find the pool busy, also the one a
        // long-poll makes right after taking its ticket.
        let server = try startServer(["TRUNK_SYNC_DB_POOL_SIZE": "1", "TRUNK_SYNC_DB_POOL_TIMEOUT": "0.005"])
        let token = try accessToken(server, "errors@example.com")
        var statuses: [Int: Int] = [:]
        for _ in 0..<3 {
            var clients: [RawClient] = []
            for _ in 0..<100 {
                let client = try server.connect()
                try client.send(longPoll(token, wait: 1))
                clients.append(client)
            }
            for client in clients {
                let response = try client.readResponse(timeout: 15)
                statuses[response.status, default: 0] += 1
                if response.status == 503 { assertJSONError(response, status: 503, code: "database_busy") }
                client.close()
            }
        }
        XCTAssertEqual(statuses.values.reduce(0, +), 300, "\(statuses)")
        XCTAssertGreaterThan(statuses[503] ?? 0, 0, "the pool was never busy: \(statuses)")
        XCTAssertTrue(
            eventually(within: 10, interval: .milliseconds(50)) { waiting(server) == 0 },
            "\(waiting(server) ?? -1) still waiting; answers \(statuses)")
        assertServerHealthy(server)
    }
}
