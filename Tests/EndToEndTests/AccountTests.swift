import Foundation
import Postgres
import Synchronization
import TestSupport
import XCTest

/// Account self-service through the real binary and a real Postgres: a user confirms with a
/// mailed code and deletes their account (every row gone, every token refused, long-polls
/// ended, nobody else touched), or takes a streamed copy of their data.
final class AccountTests: EndToEndTestCase {
    func send(
        _ server: ServerProcess, _ method: String, _ path: String, body: String? = nil, token: String? = nil,
        timeout: Double = 10
    ) throws -> RawResponse {
        var headers: [(String, String)] = []
        if body != nil { headers.append(("Content-Type", "application/json")) }
        if let token { headers.append(("Authorization", "Bearer \(token)")) }
        let (response, client) = try server.exchange(
            request(method, path, headers: headers, body: body), timeout: timeout)
        client.close()
        return response
    }

    /// A session for `email` from `trunk-sync token` (access token, refresh token, user id).
    func session(_ server: ServerProcess, _ email: String) throws -> (access: String, refresh: String, user: String) {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", email], environment: server.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        return (
            try XCTUnwrap(object["access_token"] as? String), try XCTUnwrap(object["refresh_token"] as? String),
            try XCTUnwrap((object["user"] as? [String: Any])?["id"] as? String)
        )
    }

    /// Pushes `count` small events as the holder of `token`.
    func push(_ server: ServerProcess, _ token: String, count: Int) throws {
        let events = (0..<count).map { index in
            #"{"client_id":"\#(UUID().uuidString.lowercased())","type":"note","payload":{"n":\#(index)},"client_timestamp":"2026-11-22T04:10:02.123Z"}"#
        }
        let response = try send(
            server, "POST", "/sync/v1/events", body: #"{"events":[\#(events.joined(separator: ","))]}"#, token: token)
        XCTAssertEqual(response.status, 200, response.bodyText)
    }

    /// Asks for a confirmation code as the holder of `token` and reads it from the log mailer's
    /// line (the `round`-th code mailed to `email`, counting from 1).
    func confirmationCode(_ server: ServerProcess, _ email: String, token: String, round: Int = 1) throws -> String {
        let asked = try send(server, "POST", "/auth/v1/reauthenticate", token: token)
        XCTAssertEqual(asked.status, 200, asked.bodyText)
        XCTAssertEqual(asked.bodyText, "{}")
        let marker = "confirmation code for \(email): "
        XCTAssertTrue(eventually(within: 5) { server.logs.components(separatedBy: marker).count > round }, server.logs)
        let line = try XCTUnwrap(server.logs.split(separator: "\n").last { $0.contains(marker) })
        return String(try XCTUnwrap(line.firstMatch(of: /: (\d{6})/)).output.1)
    }

    /// Rows of `user` in every table that holds a user's rows, as the owner counts them.
    func rows(of user: String, email: String, in server: ServerProcess) throws -> [String: Int] {
        let owner = try PostgresConnection.connect(server.database)
        var counts: [String: Int] = [:]
        for (table, filter) in [
            ("users", "id = $1::uuid or lower(email) = $2"), ("sessions", "user_id = $1::uuid"),
            ("refresh_tokens", "user_id = $1::uuid"), ("events", "user_id = $1::uuid"),
            ("otp_codes", "email = $2"), ("reauthentication_codes", "user_id = $1::uuid"),
            ("account_exports", "user_id = $1::uuid"),
        ] {
            // Both parameters typed in every statement, whether its filter uses them or not.
            let typed = "$1::uuid is not null and $2::text is not null and (\(filter))"
            counts[table] = try owner.query("select count(*) from \(table) where \(typed)", user, email)[0]
                .decode(Int.self, column: 0)
        }
        return counts
    }

    func testDeletionNeedsTheMailedCodeThenRemovesEveryRowAndEndsEveryToken() throws {
        let server = try startServer(["TRUNK_SYNC_OTP_RESEND_INTERVAL": "0"])
        let email = "leaving@example.com"
        let first = try session(server, email)
        let second = try session(server, email)
        let other = try session(server, "staying@example.com")
        try push(server, first.access, count: 30)
        try push(server, other.access, count: 5)
        // A sign-in code pending for the address too.
        XCTAssertEqual(try send(server, "POST", "/auth/v1/otp", body: #"{"email":"\#(email)"}"#).status, 200)
        let before = try rows(of: first.user, email: email, in: server)
        XCTAssertEqual(before["events"], 30)
        XCTAssertEqual(before["sessions"], 2)

        // Without a code asked for, with a malformed one, with a wrong one: nothing happens.
        let code = try confirmationCode(server, email, token: first.access)
        let wrong = code == "000000" ? "111111" : "000000"
        for body in [#"{"code":"\#(wrong)"}"#, #"{"code":"12ab56"}"#] {
            let refused = try send(server, "DELETE", "/sync/v1/account", body: body, token: first.access)
            assertJSONError(refused, status: 400, code: "reauthentication_not_valid")
            XCTAssertEqual(refused.jsonObject?["error_code"] as? String, "reauthentication_not_valid", "GoTrue's shape")
            XCTAssertNotNil(refused.jsonObject?["msg"])
        }
        for body in [#"{}"#, #"{"code":""}"#, #"{"code":42}"#] {
            assertJSONError(
                try send(server, "DELETE", "/sync/v1/account", body: body, token: first.access), status: 400)
        }
        assertJSONError(
            try send(server, "DELETE", "/sync/v1/account", body: "not json", token: first.access), status: 400)
        assertJSONError(try send(server, "DELETE", "/sync/v1/account", body: #"{"code":"\#(code)"}"#), status: 401)
        // Another user's code is no use to this one, and theirs is none to them.
        let othersCode = try confirmationCode(server, "staying@example.com", token: other.access)
        let otherBefore = try rows(of: other.user, email: "staying@example.com", in: server)
        if othersCode != code {
            assertJSONError(
                try send(
                    server, "DELETE", "/sync/v1/account", body: #"{"code":"\#(othersCode)"}"#, token: first.access),
                status: 400, code: "reauthentication_not_valid")
        }
        var after = try rows(of: first.user, email: email, in: server)
        after["reauthentication_codes"] = before["reauthentication_codes"]
        XCTAssertEqual(after, before, "a refused confirmation deletes nothing")

        // A long-poll of the user waits while the account goes.
        let polling = try server.connect()
        try polling.send(
            request("GET", "/sync/v1/events?after=30&wait=30", headers: [("Authorization", "Bearer \(second.access)")]))
        XCTAssertTrue(
            eventually(within: 10) { (try? server.metrics()["trunk_sync_longpolls_waiting"]) == 1 })

        let deleted = try send(
            server, "DELETE", "/sync/v1/account", body: #"{"code":" \#(code) "}"#, token: first.access)
        XCTAssertEqual(deleted.status, 204, deleted.bodyText)
        let deletedAt = Date()
        let ended = try polling.readResponse(timeout: 5)
        XCTAssertEqual(ended.status, 401, "the waiting long-poll ends at once")
        XCTAssertLessThan(Date().timeIntervalSince(deletedAt), 2)

        let left = try rows(of: first.user, email: email, in: server)
        XCTAssertEqual(left.values.reduce(0, +), 0, "\(left)")
        XCTAssertEqual(try rows(of: other.user, email: "staying@example.com", in: server), otherBefore)

        // Every token of the user, on every route.
        for token in [first.access, second.access] {
            for (method, path) in [
                ("GET", "/sync/v1/events"), ("GET", "/rest/v1/events"), ("GET", "/auth/v1/user"),
                ("GET", "/rest/v1/profiles"), ("POST", "/auth/v1/reauthenticate"),
            ] {
                XCTAssertEqual(try send(server, method, path, token: token).status, 401, "\(method) \(path)")
            }
            XCTAssertEqual(
                try send(server, "DELETE", "/sync/v1/account", body: #"{"code":"\#(code)"}"#, token: token).status, 401)
        }
        for refresh in [first.refresh, second.refresh] {
            let refreshed = try send(
                server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"\#(refresh)"}"#)
            XCTAssertEqual(refreshed.status, 400, refreshed.bodyText)
        }
        // The other user carries on.
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events", token: other.access).status, 200)

        // The log names the deletion by user id only.
        let line = try XCTUnwrap(server.stderr.waitForLine(containing: "account deleted", timeout: 5))
        XCTAssertTrue(line.contains(first.user), line)
        XCTAssertFalse(line.contains(email), line)
        XCTAssertFalse(
            server.logs.split(separator: "\n").contains { $0.contains(code) && !$0.contains("confirmation code for") })

        // The address can sign up again, as a new user with nothing.
        let again = try session(server, email)
        XCTAssertNotEqual(again.user, first.user)
        let pulled = try send(server, "GET", "/sync/v1/events?after=0", token: again.access)
        XCTAssertEqual(pulled.status, 200)
        XCTAssertEqual((pulled.jsonObject?["events"] as? [Any])?.count, 0)
    }

    func testConfirmationCodesFollowTheSignInRules() throws {
        let server = try startServer(["TRUNK_SYNC_OTP_MAX_ATTEMPTS": "2", "TRUNK_SYNC_OTP_RESEND_INTERVAL": "60"])
        let email = "careful@example.com"
        let user = try session(server, email)
        let code = try confirmationCode(server, email, token: user.access)
        // The resend interval holds.
        let again = try send(server, "POST", "/auth/v1/reauthenticate", token: user.access)
        assertJSONError(again, status: 429, code: "over_email_send_rate_limit")
        XCTAssertNotNil(again.header("retry-after"))
        // Two wrong guesses kill the code: the right one is refused after them.
        let wrong = code == "000000" ? "111111" : "000000"
        for _ in 0..<2 {
            XCTAssertEqual(
                try send(server, "DELETE", "/sync/v1/account", body: #"{"code":"\#(wrong)"}"#, token: user.access)
                    .status,
                400)
        }
        let late = try send(server, "DELETE", "/sync/v1/account", body: #"{"code":"\#(code)"}"#, token: user.access)
        assertJSONError(late, status: 400, code: "reauthentication_not_valid")
        XCTAssertEqual(try rows(of: user.user, email: email, in: server)["users"], 1)
        // A sign-in code is no confirmation code.
        XCTAssertEqual(try send(server, "POST", "/auth/v1/otp", body: #"{"email":"\#(email)"}"#).status, 200)
        XCTAssertTrue(eventually(within: 5) { server.logs.contains("sign-in code for \(email)") })
        let signInLine = try XCTUnwrap(
            server.logs.split(separator: "\n").last { $0.contains("sign-in code for \(email)") })
        let signInCode = String(try XCTUnwrap(signInLine.firstMatch(of: /: (\d{6})/)).output.1)
        assertJSONError(
            try send(server, "DELETE", "/sync/v1/account", body: #"{"code":"\#(signInCode)"}"#, token: user.access),
            status: 400, code: "reauthentication_not_valid")
        // The Supabase clients ask with GET.
        XCTAssertEqual(try send(server, "GET", "/auth/v1/reauthenticate", token: user.access).status, 429)
        XCTAssertEqual(try send(server, "GET", "/auth/v1/reauthenticate").status, 401)
    }

    // MARK: - Export

    /// Stores `count` events for `user` straight into the database (as the owner), as a push
    /// would have numbered them.
    func seed(_ server: ServerProcess, user: String, events count: Int) throws {
        let owner = try PostgresConnection.connect(server.database)
        try owner.query(
            """
            insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
            select $1::uuid, n, 'note', jsonb_build_object('n', n, 'text', 'ü "q" \\ line'), gen_random_uuid(),
                   now(), now() + n * interval '1 millisecond'
            from generate_series(1, $2::int) n
            """, user, Int64(count))
        try owner.query(
            "update users set last_seq = $2, last_event_at = now() + $2 * interval '1 millisecond' where id = $1::uuid",
            user, Int64(count))
    }

    /// The server's resident set (`VmRSS` of /proc/PID/status), in KiB.
    func residentKiB(_ server: ServerProcess) -> Int { Self.residentKiB(pid: server.process.processIdentifier) }

    static func residentKiB(pid: Int32) -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }

    /// Samples the server's RSS every 10 ms while `body` runs; the largest sample, in KiB.
    func peakResidentKiB(_ server: ServerProcess, during body: () throws -> Void) rethrows -> Int {
        try Self.peakResidentKiB(pid: server.process.processIdentifier, during: body)
    }

    /// Samples process `pid`'s RSS every 10 ms while `body` runs; the largest sample, in KiB.
    static func peakResidentKiB(pid: Int32, during body: () throws -> Void) rethrows -> Int {
        let peak = Mutex(0)
        let done = Mutex(false)
        let sampler = Thread {
            while !done.withLock({ $0 }) {
                let now = Self.residentKiB(pid: pid)
                peak.withLock { $0 = max($0, now) }
                usleep(10_000)
            }
        }
        sampler.start()
        defer { done.withLock { $0 = true } }
        try body()
        usleep(20_000)
        return peak.withLock { $0 }
    }

    /// Downloads the export with curl; (status, headers, body lines).
    func download(_ server: ServerProcess, token: String) throws -> (status: Int, headers: String, lines: [Substring]) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("export-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let result = try Command.run(
            "/usr/bin/curl",
            [
                "-sS", "-o", directory.path + "/body", "-D", directory.path + "/headers", "-w", "%{http_code}",
                "-H", "Authorization: Bearer \(token)", "http://127.0.0.1:\(server.port)/sync/v1/export",
            ])
        XCTAssertEqual(result.status, 0, "curl: \(result.stderr)")
        let body = try String(contentsOfFile: directory.path + "/body", encoding: .utf8)
        let headers = try String(contentsOfFile: directory.path + "/headers", encoding: .utf8)
        return (Int(result.stdout) ?? 0, headers, body.split(separator: "\n", omittingEmptySubsequences: false))
    }

    func testExportStreamsEveryEventInOrderInFlatMemory() throws {
        let server = try startServer()
        let user = try session(server, "big@example.com")
        let other = try session(server, "small@example.com")
        try seed(server, user: user.user, events: 100_000)
        try push(server, other.access, count: 3)
        XCTAssertEqual(
            try send(
                server, "PUT", "/auth/v1/user", body: #"{"data":{"full_name":"Big Ü","plan":"x"}}"#, token: user.access
            )
            .status, 200)
        // Warm up (allocator, libpq, prepared statements) with a page of each kind, then idle.
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0&limit=1000", token: user.access).status, 200)
        XCTAssertEqual(try download(server, token: other.access).status, 200)
        usleep(200_000)
        let idle = residentKiB(server)

        var exported: (status: Int, headers: String, lines: [Substring]) = (0, "", [])
        let peak = try peakResidentKiB(server) { exported = try download(server, token: user.access) }
        XCTAssertEqual(exported.status, 200)
        let headers = exported.headers.lowercased()
        XCTAssertTrue(headers.contains("content-type: application/x-ndjson"), headers)
        XCTAssertTrue(headers.contains("transfer-encoding: chunked"), headers)
        XCTAssertNotNil(
            exported.headers.firstMatch(
                of: /Content-Disposition: attachment; filename="trunk-sync-export-\d{4}-\d{2}-\d{2}\.ndjson"/),
            exported.headers)
        print("export of 100,000 events: RSS idle \(idle) KiB, peak \(peak) KiB while streaming")
        XCTAssertLessThan(peak - idle, 6 * 1024, "the server's memory stays flat while it streams")

        var lines = exported.lines
        XCTAssertEqual(lines.popLast(), "", "every line ends with a newline")
        XCTAssertEqual(lines.count, 100_002)
        XCTAssertEqual(lines.popLast(), #"{"kind":"end","events":100000,"last_seq":100000}"#, "the end line last")
        let account = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        XCTAssertEqual(account["kind"] as? String, "account")
        XCTAssertEqual(account["id"] as? String, user.user)
        XCTAssertEqual(account["email"] as? String, "big@example.com")
        XCTAssertEqual(account["full_name"] as? String, "Big Ü")
        XCTAssertEqual((account["user_metadata"] as? [String: Any])?["plan"] as? String, "x")
        XCTAssertNotNil(account["created_at"] as? String)
        var expected = 1
        for line in lines.dropFirst() {
            guard let event = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                return XCTFail("not a JSON object: \(line)")
            }
            guard event["kind"] as? String == "event", event["seq"] as? Int == expected else {
                return XCTFail("line \(expected): \(line)")
            }
            if expected == 1 {
                XCTAssertEqual((event["payload"] as? [String: Any])?["text"] as? String, "ü \"q\" \\ line")
                XCTAssertEqual(
                    Set(event.keys),
                    ["kind", "id", "seq", "type", "payload", "client_id", "client_timestamp", "created_at"])
            }
            expected += 1
        }
        // The other user's export has their events only.
        let small = try download(server, token: other.access)
        XCTAssertEqual(small.lines.count, 6)
        XCTAssertEqual(small.lines[4], #"{"kind":"end","events":3,"last_seq":3}"#)
        XCTAssertFalse(small.lines.joined().contains(user.user))
        // A user without events gets the account line and the end line.
        let empty = try session(server, "empty@example.com")
        let nothing = try download(server, token: empty.access)
        XCTAssertEqual(nothing.status, 200)
        XCTAssertEqual(nothing.lines.count, 3, "\(nothing.lines)")
        XCTAssertTrue(nothing.lines[0].hasPrefix(#"{"kind":"account","id":"\#(empty.user)""#), "\(nothing.lines[0])")
        XCTAssertEqual(nothing.lines[1], #"{"kind":"end","events":0,"last_seq":0}"#)
        // Bad input.
        assertJSONError(
            try send(server, "GET", "/sync/v1/export?after=3", token: user.access), status: 400,
            code: "invalid_parameter")
        assertJSONError(try send(server, "GET", "/sync/v1/export"), status: 401)
    }

    func testAStalledExportHoldsBoundedMemoryOneAtATimeAndEndsWithTheAccount() throws {
        let server = try startServer(["TRUNK_SYNC_OTP_RESEND_INTERVAL": "0"])
        let email = "stalled@example.com"
        let user = try session(server, email)
        try seed(server, user: user.user, events: 100_000)
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0&limit=1000", token: user.access).status, 200)
        usleep(200_000)
        let idle = residentKiB(server)

        // A client that reads the head, then nothing.
        let stalled = try server.connect()
        try stalled.send(request("GET", "/sync/v1/export", headers: [("Authorization", "Bearer \(user.access)")]))
        let head = try stalled.readResponse(timeout: 10, bodyExpected: false)
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(try server.metrics()["trunk_sync_longpolls_waiting"], 0, "an export is no waiting pull")
        let peak = peakResidentKiB(server) { usleep(2_000_000) }
        print("stalled export: RSS idle \(idle) KiB, peak \(peak) KiB")
        XCTAssertLessThan(peak - idle, 6 * 1024, "a client that stops reading makes the server buffer nothing more")
        XCTAssertTrue(server.isRunning)

        // One export per user at a time.
        assertJSONError(
            try send(server, "GET", "/sync/v1/export", token: user.access), status: 409, code: "export_in_progress")

        // Deleting the account ends the stalled export at once: the connection closes without
        // the body's last chunk.
        let code = try confirmationCode(server, email, token: user.access)
        XCTAssertEqual(
            try send(server, "DELETE", "/sync/v1/account", body: #"{"code":"\#(code)"}"#, token: user.access).status,
            204)
        XCTAssertTrue(try stalled.waitForClose(timeout: 10), "the export's connection is closed")
        XCTAssertEqual(try rows(of: user.user, email: email, in: server).values.reduce(0, +), 0)
        XCTAssertTrue(server.isRunning)
    }

    /// Signing out through another instance ends a stalled export within a second, as every
    /// other route and stream, and releases its lease.
    func testLogoutThroughAnotherInstanceEndsAStalledExportWithinASecond() throws {
        let server = try startServer()
        let other = try launchServer(on: server.database)
        try other.waitUntilListening(timeout: 15)
        let user = try session(server, "export-logout@example.com")
        try seed(server, user: user.user, events: 100_000)
        let stalled = try server.connect()
        try stalled.send(request("GET", "/sync/v1/export", headers: [("Authorization", "Bearer \(user.access)")]))
        XCTAssertEqual(try stalled.readResponse(timeout: 10, bodyExpected: false).status, 200)
        XCTAssertEqual(try send(other, "POST", "/auth/v1/logout", token: user.access).status, 204)
        XCTAssertTrue(try stalled.waitForClose(timeout: 1), "the export ends within a second of the logout")
        let owner = try PostgresConnection.connect(server.database)
        XCTAssertTrue(
            eventually(within: 5) {
                (try? owner.query("select count(*) from account_exports")[0].decode(Int.self, column: 0)) == 0
            }, "the lease is released")
    }

    func testAClientThatLeavesReleasesTheExport() throws {
        let server = try startServer()
        let user = try session(server, "leaver@example.com")
        try seed(server, user: user.user, events: 20_000)
        let leaving = try server.connect()
        try leaving.send(request("GET", "/sync/v1/export", headers: [("Authorization", "Bearer \(user.access)")]))
        XCTAssertEqual(try leaving.readResponse(timeout: 10, bodyExpected: false).status, 200)
        leaving.close()
        // The next export may start as soon as the server noticed; it is whole.
        var status = 0
        XCTAssertTrue(
            eventually(within: 10, interval: .milliseconds(50)) {
                status = (try? download(server, token: user.access))?.status ?? 0
                return status == 200
            }, "status \(status)")
        let owner = try PostgresConnection.connect(server.database)
        XCTAssertTrue(
            eventually(within: 5) {
                (try? owner.query("select count(*) from account_exports")[0].decode(Int.self, column: 0)) == 0
            }, "every lease released")
    }
}
