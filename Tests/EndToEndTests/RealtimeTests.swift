import Foundation
import Postgres
import TestSupport
import XCTest

/// `GET /realtime/v1/websocket` through the real binary: Supabase's own Realtime client
/// (Python `realtime`, which supabase-py uses), an independent WebSocket client (`websockets`)
/// holding the server to realtime-js's and supabase-swift's message shapes, and raw sockets
/// for the edge cases of RFC 6455 (Tests/Compat/realtime_*.py).
final class RealtimeTests: EndToEndTestCase {
    func python() throws -> String {
        guard let path = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"], !path.isEmpty else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_PYTHON is not set: run the tests with `make test`")
        }
        return path
    }

    /// A signed-in session of `email` (`trunk-sync token`), as JSON text.
    func session(_ server: ServerProcess, _ email: String) throws -> String {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", email], environment: server.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Runs a script that stops once at `pause` (a line it prints) until `during` is done
    /// and a line is written to its stdin. Returns its output.
    func runScript(
        _ script: String, _ arguments: [String], pause: String, during: () throws -> Void
    ) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try python())
        process.arguments = [repositoryRoot() + "/Tests/Compat/" + script] + arguments
        let input = Pipe()
        let output = Pipe()
        let errors = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let stdout = OutputCollector(reading: output.fileHandleForReading)
        let stderr = OutputCollector(reading: errors.fileHandleForReading)
        defer { if process.isRunning { process.terminate() } }
        // Only a script that paused reads the go-ahead: one that failed before has exited, and
        // writing to its closed pipe would kill the test process with SIGPIPE (its output,
        // which says what failed, lost with it).
        if stdout.waitForLine(containing: pause, timeout: 240) != nil {
            try during()
            input.fileHandleForWriting.write(Data("go\n".utf8))
        }
        try? input.fileHandleForWriting.close()
        if !stdout.waitForEnd(timeout: 200) { process.terminate() }
        process.waitUntilExit()
        return (process.terminationStatus, stdout.text + stderr.text)
    }

    func assertSteps(
        _ result: (status: Int32, output: String), _ steps: [String], file: StaticString = #filePath, line: UInt = #line
    ) {
        XCTAssertEqual(result.status, 0, result.output, file: file, line: line)
        for step in steps {
            XCTAssertTrue(
                result.output.contains("ok \(step)"), "missing step \(step): \(result.output)", file: file, line: line)
        }
    }

    /// The real client subscribes on one instance and receives inserts made through another,
    /// subscribes before sign-in (with the app's key) and gets its user's rows once signed in,
    /// re-subscribes after a dropped connection and a restart, follows a refreshed token,
    /// keeps its channel through `set_auth(None)` and `set_auth(<the key>)` (which withholds
    /// rows until the token is back), never sees another user's row, and sign-out ends its
    /// channel.
    func testSupabaseRealtimeClient() throws {
        // One public URL for all three (a token names it as its issuer): the restarted server
        // listens on a fixed port, the others on port 0.
        let settings = ["TRUNK_SYNC_API_KEY": "anon-key", "TRUNK_SYNC_PUBLIC_URL": "http://sync.test"]
        let server = try startServer(settings)
        let other = try launchServer(on: server.database, settings)
        try other.waitUntilListening(timeout: 15)
        let a = try session(server, "realtime-a@example.com")
        let b = try session(server, "realtime-b@example.com")
        var restarted: ServerProcess? = nil
        let result = try runScript(
            "realtime_flow.py", ["http://127.0.0.1:\(server.port)", "http://127.0.0.1:\(other.port)", a, b],
            pause: "restart now"
        ) {
            XCTAssertNotNil(server.stop())
            let again = try launchServer(
                on: server.database, settings.merging(["TRUNK_SYNC_PORT": "\(server.port)"]) { $1 })
            try again.waitUntilListening(timeout: 15)
            restarted = again
        }
        assertSteps(
            result,
            [
                "subscribe", "subscribes before sign-in", "insert through another instance arrives",
                "a binding without a table gets events and profile changes", "filters",
                "access_token refresh keeps the channel",
                "set_auth(None) changes nothing, set_auth(key) withholds rows and keeps the channel",
                "re-subscribes after a dropped connection", "re-subscribes after a server restart",
                "never another user's row",
                "sign-out ends the channel",
            ])
        _ = restarted?.stop()
        _ = other.stop()
    }

    /// Every way a session ends stops its channels: signing out, a refresh token replayed
    /// (also for a channel that follows the session by a token swapped in with
    /// `access_token`, and not the one it joined with), `trunk-sync users delete`.
    func testEverySessionEndStopsItsChannels() throws {
        let server = try startServer(["TRUNK_SYNC_API_KEY": "anon-key"])
        let (first, second) = (
            try session(server, "realtime-e@example.com"), try session(server, "realtime-e@example.com")
        )
        let deleted = try session(server, "realtime-f@example.com")
        let result = try runScript(
            "realtime_revocation.py", ["http://127.0.0.1:\(server.port)", first, second, deleted],
            pause: "age and delete now"
        ) {
            let removal = try Command.run(
                Command.trunkSyncBinary(), ["users", "delete", "--yes", "realtime-f@example.com"],
                environment: server.environment)
            XCTAssertEqual(removal.status, 0, removal.stderr)
            // Past the 10 s in which a rotated refresh token is taken again without revoking.
            try PostgresConnection.connect(server.database).execute(
                "update refresh_tokens set rotated_at = now() - interval '1 minute' where rotated_at is not null")
        }
        assertSteps(
            result,
            [
                "a channel follows the session of the token swapped in",
                "trunk-sync users delete ends the account's channels",
                "refresh token reuse ends the channel that follows the session by access_token",
            ])
    }

    /// The WebSocket layer's edge cases with raw sockets, and the Phoenix protocol with an
    /// independent client in both serializers; SIGTERM closes open sockets with 1001.
    func testWebSocketEdgeCasesAndProtocolShapes() throws {
        let server = try startServer([
            "TRUNK_SYNC_API_KEY": "anon-key", "TRUNK_SYNC_REALTIME_BUFFER": "4096",
            "TRUNK_SYNC_REALTIME_MAX_CHANNELS_PER_USER": "3", "TRUNK_SYNC_REALTIME_MAX_FILTER_BYTES": "1024",
        ])
        let a = try session(server, "realtime-c@example.com")
        let b = try session(server, "realtime-d@example.com")
        let result = try runScript(
            "realtime_protocol.py", ["http://127.0.0.1:\(server.port)", a, b, ServerProcess.jwtSecret],
            pause: "stop now"
        ) {
            server.signal(SIGTERM)
            XCTAssertEqual(server.waitForExit(timeout: 20), 0)
        }
        assertSteps(
            result,
            [
                "handshake", "refused handshakes", "ping/pong, heartbeat, close handshake",
                "unmasked client frame -> 1002",
                "oversized frame -> 1009", "oversized fragmented message -> 1009", "fragmented control frame -> 1002",
                "text that is not UTF-8 -> 1007",
                "oversized control frame, reserved bits, unknown opcode, stray continuation, bad close code -> 1002",
                "half-open connection is closed", "slow reader is closed with 1013",
                "a join before sign-in (no access_token, the app's key) is ok",
                "channels over the per-user cap are refused", "vsn 2.0.0 (realtime-js)",
                "Broadcast (binary and JSON) and Presence refused", "bad joins",
                "a user's filters together are bounded in bytes",
                "a token past its exp is refused at the join and in access_token",
                "a token expiring while joined ends the channel",
                "phx_leave", "profiles UPDATE arrives", "profiles UPDATE arrives after updateUser",
                "vsn 1.0.0 (supabase-swift shapes)",
                "access_token of another user ends the channel",
                "shutdown closes with 1001",
            ])
    }

    /// Sockets over `TRUNK_SYNC_REALTIME_MAX` are refused `429` with `Retry-After` before the
    /// upgrade (the clients retry with backoff); a closed socket gives its slot back.
    func testSocketsOverTheInstanceCapGet429() throws {
        let server = try startServer(["TRUNK_SYNC_REALTIME_MAX": "1"])
        let handshake = request(
            "GET", "/realtime/v1/websocket?vsn=2.0.0",
            headers: [
                ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("Sec-WebSocket-Version", "13"),
            ])
        let first = try server.connect()
        try first.send(handshake)
        let upgraded = try first.readResponse(bodyExpected: false)
        XCTAssertEqual(upgraded.status, 101)
        XCTAssertEqual(upgraded.header("sec-websocket-accept"), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        let (refused, _) = try server.exchange(handshake)
        assertJSONError(refused, status: 429, code: "too_many_sockets")
        XCTAssertNotNil(refused.header("retry-after"))
        first.close()
        let freed = eventually(within: 10) {
            ((try? server.exchange(handshake, bodyExpected: false))?.0.status ?? 0) == 101
        }
        XCTAssertTrue(freed, "the closed socket's slot was not given back")
    }
}
