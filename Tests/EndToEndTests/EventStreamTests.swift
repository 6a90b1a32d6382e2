import Foundation
import Postgres
import TestSupport
import XCTest

#if canImport(Glibc)
    import Glibc
#endif

/// `GET /sync/v1/stream` through the real binary: backlog then live, resuming with
/// `Last-Event-ID`, other instances, slow readers, token expiry, logout, heartbeats,
/// SIGTERM, other users, limits, and every bad input.
final class EventStreamTests: EndToEndTestCase {
    /// A session for `email` from `trunk-sync token` (access token, user id).
    func session(_ server: ServerProcess, _ email: String) throws -> (token: String, user: String) {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", email], environment: server.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let user = try XCTUnwrap(object["user"] as? [String: Any])
        return (try XCTUnwrap(object["access_token"] as? String), try XCTUnwrap(user["id"] as? String))
    }

    /// Pushes `count` events (payloads padded to about `padding` bytes); their seqs.
    @discardableResult
    func push(_ server: ServerProcess, _ token: String, count: Int, padding: Int = 0, tag: String = "n") throws
        -> [Int64]
    {
        let pad = String(repeating: "x", count: padding)
        let events = (0..<count).map { index in
            #"{"client_id":"\#(UUID().uuidString.lowercased())","type":"note","payload":{"\#(tag)":\#(index),"pad":"\#(pad)"},"client_timestamp":"2026-11-22T04:10:02.123Z"}"#
        }
        let body = #"{"events":[\#(events.joined(separator: ","))]}"#
        let (response, _) = try server.exchange(
            request("POST", "/sync/v1/events", headers: [("Authorization", "Bearer \(token)")], body: body))
        XCTAssertEqual(response.status, 200, response.bodyText)
        let results = try XCTUnwrap(response.jsonObject?["results"] as? [[String: Any]])
        return results.compactMap { ($0["seq"] as? NSNumber)?.int64Value }
    }

    /// The events of a pull, each as its JSON text exactly as the pull response has it.
    func pulledEventTexts(_ server: ServerProcess, _ token: String, after: Int64 = 0) throws -> [String] {
        let (response, _) = try server.exchange(
            request("GET", "/sync/v1/events?after=\(after)&limit=1000", headers: [("Authorization", "Bearer \(token)")])
        )
        XCTAssertEqual(response.status, 200)
        // The array's elements: every object starts with `{"id":`, which no payload here holds.
        let text = response.bodyText
        guard let start = text.range(of: #""events":["#), let end = text.range(of: #"],"next_after""#) else {
            return []
        }
        let inner = String(text[start.upperBound..<end.lowerBound])
        if inner.isEmpty { return [] }
        let parts = inner.components(separatedBy: #"},{"id":"#)
        return parts.enumerated().map { index, part in
            (index > 0 ? #"{"id":"# : "") + part + (index < parts.count - 1 ? "}" : "")
        }
    }

    func open(
        _ server: ServerProcess, _ token: String, after: Int64? = nil, lastEventID: Int64? = nil,
        queryToken: Bool = false
    ) throws -> EventStreamClient {
        var query: [String] = []
        if let after { query.append("after=\(after)") }
        var headers: [(String, String)] = []
        if queryToken {
            query.append("access_token=\(token)")
        } else {
            headers.append(("Authorization", "Bearer \(token)"))
        }
        if let lastEventID { headers.append(("Last-Event-ID", String(lastEventID))) }
        let target = "/sync/v1/stream" + (query.isEmpty ? "" : "?" + query.joined(separator: "&"))
        return try EventStreamClient(server: server, target: target, headers: headers)
    }

    func metric(_ server: ServerProcess, _ name: String) -> Double {
        (try? server.metrics()[name]) ?? -1
    }

    // MARK: - Delivery

    func testBacklogThenLiveInOrderNothingTwiceEachEventAsInThePull() throws {
        let server = try startServer()
        let (token, _) = try session(server, "stream@example.com")
        try push(server, token, count: 250)  // more than one page of backlog
        let stream = try open(server, token, after: 0)
        XCTAssertEqual(stream.head.header("content-type"), "text/event-stream; charset=utf-8")
        XCTAssertEqual(stream.head.header("transfer-encoding"), "chunked")
        XCTAssertEqual(stream.head.header("cache-control"), "no-store")
        XCTAssertEqual(try stream.next(), .retry(1000), "retry: first")
        let backlog = try stream.events(250)
        XCTAssertEqual(backlog.map(\.id), Array(1...250))
        try push(server, token, count: 3)
        let live = try stream.events(3)
        XCTAssertEqual(live.map(\.id), [251, 252, 253])
        XCTAssertEqual((backlog + live).map(\.data), try pulledEventTexts(server, token), "each event as in the pull")
        XCTAssertTrue(try stream.noEvent(within: 0.5), "nothing twice")
        try push(server, token, count: 1)
        XCTAssertEqual(try stream.events(1).map(\.id), [254])
    }

    func testOneCommitOfMoreThanAPageReachesEveryLiveStreamOfTheUserWholeAndOnce() throws {
        let server = try startServer()
        let (token, _) = try session(server, "pages@example.com")
        try push(server, token, count: 2)
        // Two streams live at seq 2, read by the hub a page (100) at a time: its second read
        // starts where the first left both streams.
        let streams = try [open(server, token, after: 0), open(server, token, after: 1)]
        XCTAssertEqual(try streams[0].events(2).map(\.id), [1, 2])
        XCTAssertEqual(try streams[1].events(1).map(\.id), [2])
        try push(server, token, count: 150)
        for stream in streams {
            XCTAssertEqual(try stream.events(150).map(\.id), Array(3...152))
            XCTAssertTrue(try stream.noEvent(within: 0.3), "nothing twice")
        }
    }

    func testStartsAfterTheGivenSeqAndLastEventIDWinsOverAfter() throws {
        let server = try startServer()
        let (token, _) = try session(server, "start@example.com")
        try push(server, token, count: 10)
        let fromAfter = try open(server, token, after: 7)
        XCTAssertEqual(try fromAfter.events(3).map(\.id), [8, 9, 10])
        let fromHeader = try open(server, token, after: 2, lastEventID: 9)
        XCTAssertEqual(try fromHeader.events(1).map(\.id), [10])
        XCTAssertTrue(try fromHeader.noEvent(within: 0.3))
    }

    func testReconnectWithLastEventIDGetsExactlyTheEventsMissed() throws {
        let server = try startServer()
        let (token, _) = try session(server, "resume@example.com")
        try push(server, token, count: 5)
        let first = try open(server, token, after: 0)
        XCTAssertEqual(try first.events(5).map(\.id), [1, 2, 3, 4, 5])
        let last = try XCTUnwrap(first.lastEventID)
        first.close()
        try push(server, token, count: 100)
        let second = try open(server, token, after: 0, lastEventID: last)
        XCTAssertEqual(try second.events(100).map(\.id), Array(6...105))
        XCTAssertTrue(try second.noEvent(within: 0.5), "exactly those 100")
    }

    func testEventPushedThroughASecondInstanceArrivesWithinASecond() throws {
        let server = try startServer()
        let other = try launchServer(on: server.database)
        try other.waitUntilListening(timeout: 15)
        let (token, _) = try session(server, "instances@example.com")
        let stream = try open(server, token, after: 0)
        XCTAssertEqual(try stream.next(), .retry(1000))
        for round in 1...3 {
            let started = Date()
            try push(other, token, count: 1)
            XCTAssertEqual(try stream.events(1, timeout: 5).map(\.id), [Int64(round)])
            XCTAssertLessThan(Date().timeIntervalSince(started), 1, "round \(round)")
        }
    }

    func testAnotherUsersEventsNeverAppear() throws {
        let server = try startServer()
        let (mine, _) = try session(server, "mine@example.com")
        let (theirs, _) = try session(server, "theirs@example.com")
        try push(server, theirs, count: 5, tag: "theirs")
        let stream = try open(server, mine, after: 0)
        try push(server, theirs, count: 5, tag: "theirs")
        try push(server, mine, count: 2, tag: "mine")
        let events = try stream.events(2)
        XCTAssertEqual(events.map(\.id), [1, 2])
        XCTAssertTrue(events.allSatisfy { $0.data.contains(#""mine":"#) && !$0.data.contains("theirs") })
        try push(server, theirs, count: 3, tag: "theirs")
        XCTAssertTrue(try stream.noEvent(within: 0.5))
    }

    func testBrowserStyleQueryTokenWorksAndNeverReachesTheLog() throws {
        let server = try startServer()
        let (token, _) = try session(server, "query@example.com")
        try push(server, token, count: 2)
        let stream = try open(server, token, after: 0, queryToken: true)
        XCTAssertEqual(try stream.events(2).map(\.id), [1, 2])
        XCTAssertNotNil(
            server.stdout.waitForLine(containing: "/sync/v1/stream", timeout: 5)
                ?? server.stderr.waitForLine(containing: "/sync/v1/stream", timeout: 1), "an access log line")
        XCTAssertFalse(server.logs.contains(token), "the token is in the log")
        XCTAssertFalse(server.logs.contains("access_token"), "the query is in the log")
        // Only this route takes it.
        let (pull, _) = try server.exchange(request("GET", "/sync/v1/events?access_token=\(token)"))
        XCTAssertEqual(pull.status, 401)
    }

    /// A real browser: headless Chromium opens a page served from another origin, whose
    /// `EventSource` (which cannot send headers) passes the token in the query.
    func testBrowserEventSourceFromAnotherOriginReceivesBacklogAndLiveEvents() throws {
        guard let python = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"], !python.isEmpty else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_PYTHON is not set: run the tests with `make test`")
        }
        let pagePort = try freePort()
        let server = try startServer(["TRUNK_SYNC_CORS_ORIGINS": "http://127.0.0.1:\(pagePort)"])
        let (token, _) = try session(server, "browser@example.com")
        let result = try Command.run(
            python,
            [
                repositoryRoot() + "/Tests/Browser/eventsource.py", "http://127.0.0.1:\(server.port)", String(pagePort),
                token,
            ])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        let output = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], result.stdout)
        XCTAssertEqual(output["opened"] as? Bool, true)
        let received = try XCTUnwrap(output["received"] as? [[String: Any]])
        XCTAssertEqual(received.compactMap { $0["id"] as? String }, ["1", "2", "3", "4"], "lastEventId is the seq")
        XCTAssertEqual(received.compactMap { ($0["seq"] as? NSNumber)?.intValue }, [1, 2, 3, 4])
        XCTAssertEqual(
            received.compactMap { (($0["payload"] as? [String: Any])?["n"] as? NSNumber)?.intValue }, [1, 2, 3, 4])
        XCTAssertFalse(server.logs.contains(token), "the query token is in the log")
    }

    // MARK: - Ends

    func testSlowReaderIsCutOffAndItsResumeLosesNothing() throws {
        let server = try startServer(["TRUNK_SYNC_STREAM_BUFFER": "4096"])
        let (token, _) = try session(server, "slow@example.com")
        let stream = try open(server, token, after: 0)
        // The client reads nothing while more than every buffer on the way (the server's
        // 4 KiB, the sockets' few MiB) is pushed.
        var pushed = 0
        for _ in 0..<80 where metric(server, #"trunk_sync_streams_ended_total{reason="slow_reader"}"#) < 1 {
            pushed += try push(server, token, count: 50, padding: 4000).count
        }
        XCTAssertTrue(
            eventually(within: 10) { metric(server, #"trunk_sync_streams_ended_total{reason="slow_reader"}"#) == 1 },
            "the slow stream was not cut off after \(pushed) events")
        // It reads what was sent before the cut, then a clean end.
        let received = try stream.readToEnd(timeout: 30)
        XCTAssertLessThan(received.count, pushed)
        XCTAssertEqual(received.map(\.id), Array(1...Int64(received.count)), "in order, no gap")
        let resumed = try open(server, token, after: 0, lastEventID: try XCTUnwrap(stream.lastEventID))
        let rest = try resumed.events(pushed - received.count, timeout: 30)
        XCTAssertEqual(rest.map(\.id), Array(Int64(received.count + 1)...Int64(pushed)))
        XCTAssertTrue(try resumed.noEvent(within: 0.3))
    }

    func testABacklogReadSlowlyIsNotCutOffByTheHeartbeat() throws {
        let server = try startServer(["TRUNK_SYNC_STREAM_BUFFER": "4096", "TRUNK_SYNC_STREAM_HEARTBEAT": "1"])
        let (token, _) = try session(server, "backlog@example.com")
        for _ in 0..<4 { try push(server, token, count: 50, padding: 2000) }
        let stream = try open(server, token, after: 0)
        var received: [Int64] = []
        let slowUntil = Date().addingTimeInterval(2.5)  // heartbeats come while the buffer is full
        while received.count < 200 {
            if Date() < slowUntil { Thread.sleep(forTimeInterval: 0.1) }
            received += try stream.events(1).map(\.id)
        }
        XCTAssertEqual(received, Array(1...200))
        XCTAssertEqual(metric(server, #"trunk_sync_streams_ended_total{reason="slow_reader"}"#), 0)
    }

    func testTokenExpiryEndsTheStream() throws {
        let server = try startServer()
        let (token, _) = try session(server, "expiry@example.com")
        let short = try reissue(token, expiringIn: 2)
        let stream = try open(server, short, after: 0)
        let started = Date()
        XCTAssertEqual(try stream.readToEnd(timeout: 6).count, 0)
        let elapsed = Date().timeIntervalSince(started)
        XCTAssertGreaterThan(elapsed, 0.5)
        XCTAssertTrue(
            eventually(within: 2) { metric(server, #"trunk_sync_streams_ended_total{reason="token_expired"}"#) == 1 })
        XCTAssertEqual(metric(server, "trunk_sync_streams_open"), 0)
    }

    func testLogoutEndsTheStreamWithinASecond() throws {
        let server = try startServer()
        let (token, _) = try session(server, "logout@example.com")
        let stream = try open(server, token, after: 0)
        XCTAssertEqual(try stream.next(), .retry(1000))
        let (response, _) = try server.exchange(
            request("POST", "/auth/v1/logout", headers: [("Authorization", "Bearer \(token)")]))
        XCTAssertEqual(response.status, 204)
        let loggedOut = Date()
        XCTAssertEqual(try stream.readToEnd(timeout: 3).count, 0)
        XCTAssertLessThan(Date().timeIntervalSince(loggedOut), 1)
        let (again, _) = try server.exchange(
            request(
                "GET", "/sync/v1/stream",
                headers: [("Authorization", "Bearer \(token)"), ("Accept", "text/event-stream")]))
        XCTAssertEqual(again.status, 401, "the signed-out token opens no new stream")
    }

    /// The audit's case: a stream still sending a large backlog to a slow reader, and the
    /// session signed out (or the account deleted) through another instance. The stream ends
    /// within a second, as a live one does, and sends no more than what was already on its
    /// way (a few buffers), not the rest of the backlog.
    func testLogoutOrDeletionEndsAStreamStillSendingItsBacklog() throws {
        let server = try startServer()
        let other = try launchServer(on: server.database)
        try other.waitUntilListening(timeout: 15)
        for ending in ["logout", "deletion"] {
            let (token, _) = try session(server, "backlog-\(ending)@example.com")
            for _ in 0..<40 { try push(server, token, count: 50, padding: 4000) }  // 2,000 events, ~8 MB
            let stream = try open(server, token, after: 0)
            XCTAssertEqual(try stream.events(10).map(\.id), Array(1...10))
            // The reader stops; the server waits for it with its buffers full.
            let revokedBefore = metric(server, #"trunk_sync_streams_ended_total{reason="session_revoked"}"#)
            if ending == "logout" {
                let (response, _) = try other.exchange(
                    request("POST", "/auth/v1/logout", headers: [("Authorization", "Bearer \(token)")]))
                XCTAssertEqual(response.status, 204)
            } else {
                let result = try Command.run(
                    Command.trunkSyncBinary(), ["users", "delete", "backlog-\(ending)@example.com", "--yes"],
                    environment: other.environment)
                XCTAssertEqual(result.status, 0, result.stderr)
            }
            XCTAssertTrue(
                eventually(within: 1) {
                    metric(server, #"trunk_sync_streams_ended_total{reason="session_revoked"}"#) == revokedBefore + 1
                }, "\(ending): the stream did not end within a second")
            let rest = try stream.readToEnd(timeout: 30)
            XCTAssertLessThan(10 + rest.count, 2000, "\(ending): the backlog's rest was not sent")
            XCTAssertEqual(rest.map(\.id), Array(11...Int64(10 + rest.count)), "in order, then a clean end")
        }
        XCTAssertEqual(metric(server, "trunk_sync_streams_open"), 0)
    }

    /// A slow reader holds at most its writer's buffer and one page bounded in bytes (issue
    /// 23: a 100-event page of 64 KiB events, 6.4 MB, plus that page again as one write).
    /// Four streams of large events whose readers stop: the server's memory grows by a few
    /// MiB in all, not by 4 × 13 MB.
    func testSlowReadersOfLargeEventsHoldBoundedMemory() throws {
        let server = try startServer()
        let (token, _) = try session(server, "large@example.com")
        for _ in 0..<10 { try push(server, token, count: 20, padding: 60_000) }  // 200 events, 12 MB
        // Warm up: one stream reads everything once.
        let warm = try open(server, token, after: 0)
        XCTAssertEqual(try warm.events(200, timeout: 30).count, 200)
        warm.close()
        XCTAssertTrue(eventually(within: 5) { metric(server, "trunk_sync_streams_open") == 0 })
        usleep(200_000)
        let idle = AccountTests.residentKiB(pid: server.process.processIdentifier)
        var stalled: [EventStreamClient] = []
        let peak = try AccountTests.peakResidentKiB(pid: server.process.processIdentifier) {
            for _ in 0..<4 {
                let stream = try open(server, token, after: 0)
                XCTAssertEqual(try stream.next(), .retry(1000))
                stalled.append(stream)
            }
            usleep(1_500_000)  // the readers read nothing more; the producers wait
        }
        print("4 stalled streams of 60 KB events: RSS idle \(idle) KiB, peak \(peak) KiB")
        // 4 × (buffer + ~1.1 MiB page) is ~6 MiB; the allocator's arenas add a few more that
        // vary run to run (13–17 MiB seen). Before the bound it was ~45 MiB: 28 MiB tells them apart.
        XCTAssertLessThan(peak - idle, 28 * 1024, "each slow reader holds its buffer and one ~1 MiB page")
        // Nothing is lost: each reads its whole backlog when it reads again.
        for stream in stalled { XCTAssertEqual(try stream.events(200, timeout: 60).map(\.id), Array(1...200)) }
    }

    func testHeartbeatsArrive() throws {
        let server = try startServer(["TRUNK_SYNC_STREAM_HEARTBEAT": "1"])
        let (token, _) = try session(server, "heartbeat@example.com")
        let stream = try open(server, token, after: 0)
        XCTAssertEqual(try stream.next(), .retry(1000))
        XCTAssertEqual(try stream.next(timeout: 3), .comment("keep-alive"))
        XCTAssertEqual(try stream.next(timeout: 3), .comment("keep-alive"))
    }

    func testSIGTERMEndsEveryStreamPromptlyAndCleanly() throws {
        let server = try startServer()
        let (token, _) = try session(server, "sigterm@example.com")
        let streams = try (0..<3).map { _ in try open(server, token, after: 0) }
        for stream in streams { XCTAssertEqual(try stream.next(), .retry(1000)) }
        let started = Date()
        server.signal(SIGTERM)
        for stream in streams { XCTAssertEqual(try stream.readToEnd(timeout: 3).count, 0, "a clean end") }
        XCTAssertEqual(server.waitForExit(timeout: 5), 0)
        // Streams that held on would keep the server to its 10 s shutdown timeout; 5 s
        // separates the two and holds on a loaded machine.
        XCTAssertLessThan(Date().timeIntervalSince(started), 5)
    }

    /// A live stream while its database is lost (the primary dead, the standby not promoted
    /// yet; `make drill-failover` does that for real) and after it is back: the stream stays
    /// open with its heartbeat or ends cleanly, and is never counted `client_gone` while its
    /// client is there; once connections work again, an event pushed arrives on it, or on
    /// the client's reconnect with `Last-Event-ID` if it ended (`database_error`). Never open
    /// and silent.
    func testAStreamOpenAcrossALostDatabaseGetsWhatIsPushedOnceItIsBack() throws {
        let server = try startServer(["TRUNK_SYNC_STREAM_HEARTBEAT": "1"])
        let (token, _) = try session(server, "lostdb@example.com")
        try push(server, token, count: 3)
        var current = try open(server, token, after: 0)
        XCTAssertEqual(try current.events(3).map(\.id), [1, 2, 3])

        // Every connection of the server ends and no new one is accepted (from another
        // database: a database's own sessions cannot close it to connections).
        let name = try XCTUnwrap(server.database["dbname"])
        let monitor = try PostgresConnection.connect(server.database.withDatabase("postgres"))
        try monitor.execute("alter database \"\(name)\" with allow_connections false")
        defer { _ = try? monitor.execute("alter database \"\(name)\" with allow_connections true") }
        let backends = try monitor.query(
            "select pid from pg_stat_activity where datname = $1 and backend_type = 'client backend'", name
        ).map { try $0.decode(Int32.self, column: 0) }
        XCTAssertGreaterThanOrEqual(backends.count, 2, "the listener and at least one pool connection")
        for pid in backends {
            XCTAssertTrue(try monitor.query("select pg_terminate_backend($1)", pid)[0].decode(Bool.self, column: 0))
        }
        outage: for _ in 0..<2 {
            switch try current.next(timeout: 5) {
            case .comment("keep-alive")?: continue
            case nil: break outage
            case let other: XCTFail("during the outage: \(String(describing: other))")
            }
        }
        XCTAssertEqual(metric(server, #"trunk_sync_streams_ended_total{reason="client_gone"}"#), 0)

        try monitor.execute("alter database \"\(name)\" with allow_connections true")
        // A push may still meet a lost connection (503, safe to send again: the same
        // client_id is stored once).
        let body =
            #"{"events":[{"client_id":"5b0e8c1e-2f1d-4f57-9a51-3c1f0d7e6a10","type":"note","payload":{},"client_timestamp":"2026-11-26T14:00:00Z"}]}"#
        var pushed: RawResponse? = nil
        XCTAssertTrue(
            try eventually(within: 10, interval: .milliseconds(100)) {
                let (response, _) = try server.exchange(
                    request("POST", "/sync/v1/events", headers: [("Authorization", "Bearer \(token)")], body: body))
                XCTAssertTrue([200, 503].contains(response.status), response.bodyText)
                pushed = response
                return response.status == 200
            })
        let seq = try XCTUnwrap(
            ((pushed?.jsonObject?["results"] as? [[String: Any]])?.first?["seq"] as? NSNumber)?.int64Value)

        var received: [Int64] = []
        var ends = 0
        while !received.contains(seq) {
            switch current.ended ? nil : try current.next(timeout: 10) {
            case .event(let id, _)?: received.append(id)
            case .comment?, .retry?: continue
            case nil:
                // Ended cleanly: reconnect as an EventSource does.
                ends += 1
                guard ends <= 3 else { return XCTFail("the stream keeps ending") }
                let last = current.lastEventID ?? 3
                var resumed: EventStreamClient? = nil
                XCTAssertTrue(
                    eventually(within: 10, interval: .milliseconds(100)) {
                        resumed = try? open(server, token, after: 0, lastEventID: last)
                        return resumed != nil
                    })
                current = try XCTUnwrap(resumed)
            }
        }
        XCTAssertEqual(received, [seq], "exactly the event pushed, once")
        XCTAssertTrue(try current.noEvent(within: 0.5))
        XCTAssertEqual(metric(server, #"trunk_sync_streams_ended_total{reason="database_error"}"#), Double(ends))
        XCTAssertEqual(metric(server, #"trunk_sync_streams_ended_total{reason="client_gone"}"#), 0)
        XCTAssertEqual(metric(server, "trunk_sync_streams_open"), 1)
    }

    /// A live stream whose read fails (what a failover does to a read on the dead primary):
    /// the stream ends cleanly, with its last chunk, counted as `database_error` (not as
    /// `client_gone`: its client is there), so the client reconnects with `Last-Event-ID` and
    /// misses nothing.
    func testALiveReadThatFailsEndsTheStreamCleanlyAndTheResumeMissesNothing() throws {
        let server = try startServer()
        let (token, user) = try session(server, "readfails@example.com")
        try push(server, token, count: 3)
        let stream = try open(server, token, after: 0)
        XCTAssertEqual(try stream.events(3).map(\.id), [1, 2, 3])

        let owner = try PostgresConnection.connect(server.database)
        try owner.execute("revoke select on events from trunk_sync_app")
        defer { _ = try? owner.execute("grant select on events to trunk_sync_app") }
        // What a push from another instance announces: the stream's hub reads, and fails.
        try owner.query("select pg_notify('trunk_sync_events', $1)", user.lowercased())
        XCTAssertEqual(try stream.readToEnd(timeout: 10).count, 0, "the stream ends with its last chunk")
        XCTAssertTrue(
            eventually(within: 2) { metric(server, #"trunk_sync_streams_ended_total{reason="database_error"}"#) == 1 })
        XCTAssertEqual(metric(server, #"trunk_sync_streams_ended_total{reason="client_gone"}"#), 0)
        XCTAssertEqual(metric(server, "trunk_sync_streams_open"), 0)

        try owner.execute("grant select on events to trunk_sync_app")
        let seqs = try push(server, token, count: 2)
        let resumed = try open(server, token, after: 0, lastEventID: try XCTUnwrap(stream.lastEventID))
        XCTAssertEqual(try resumed.events(2).map(\.id), seqs)
        XCTAssertTrue(try resumed.noEvent(within: 0.5))
    }

    // MARK: - Limits and bad input

    func testStreamsPerUserAndPerServerAreLimitedBeforeTheStreamStarts() throws {
        let server = try startServer(["TRUNK_SYNC_STREAM_MAX_PER_USER": "2", "TRUNK_SYNC_STREAM_MAX": "3"])
        let (token, _) = try session(server, "limit@example.com")
        let (other, _) = try session(server, "limit-other@example.com")
        let first = try open(server, token)
        let second = try open(server, token)
        let streamHeaders = [("Authorization", "Bearer \(token)"), ("Accept", "text/event-stream")]
        let (third, _) = try server.exchange(request("GET", "/sync/v1/stream", headers: streamHeaders))
        assertJSONError(third, status: 429, code: "too_many_streams")
        XCTAssertEqual(third.header("retry-after"), "5")
        let others = try open(server, other)
        let (overServer, _) = try server.exchange(
            request(
                "GET", "/sync/v1/stream",
                headers: [("Authorization", "Bearer \(other)"), ("Accept", "text/event-stream")]))
        assertJSONError(overServer, status: 429, code: "too_many_streams")
        first.close()
        XCTAssertTrue(
            eventually(within: 5) { metric(server, "trunk_sync_streams_open") == 2 }, "the closed stream's slot")
        let again = try open(server, token)
        XCTAssertEqual(try again.next(), .retry(1000))
        withExtendedLifetime((second, others)) {}
    }

    func testBadInputIsAClearErrorAndOpensNothing() throws {
        let server = try startServer()
        let (token, _) = try session(server, "bad@example.com")
        let bearer = ("Authorization", "Bearer \(token)")
        let accept = ("Accept", "text/event-stream")
        let cases: [(String, [(String, String)], Int, String)] = [
            ("/sync/v1/stream", [bearer], 406, "not_acceptable"),
            ("/sync/v1/stream", [bearer, ("Accept", "application/json")], 406, "not_acceptable"),
            ("/sync/v1/stream?after=-1", [bearer, accept], 400, "invalid_parameter"),
            ("/sync/v1/stream?after=x", [bearer, accept], 400, "invalid_parameter"),
            ("/sync/v1/stream?after=1&after=2", [bearer, accept], 400, "invalid_parameter"),
            ("/sync/v1/stream?limit=5", [bearer, accept], 400, "invalid_parameter"),
            ("/sync/v1/stream", [bearer, accept, ("Last-Event-ID", "abc")], 400, "invalid_last_event_id"),
            ("/sync/v1/stream", [bearer, accept, ("Last-Event-ID", "-5")], 400, "invalid_last_event_id"),
            ("/sync/v1/stream", [accept], 401, "unauthorized"),
            ("/sync/v1/stream?access_token=", [accept], 401, "unauthorized"),
            ("/sync/v1/stream?access_token=not.a.token", [accept], 401, "unauthorized"),
            ("/sync/v1/stream", [("Authorization", "Bearer nope"), accept], 401, "unauthorized"),
        ]
        for (target, headers, status, code) in cases {
            let (response, _) = try server.exchange(request("GET", target, headers: headers))
            assertJSONError(response, status: status, code: code)
        }
        let (post, _) = try server.exchange(request("POST", "/sync/v1/stream", headers: [bearer, accept], body: ""))
        XCTAssertEqual(post.status, 405)
        XCTAssertEqual(metric(server, "trunk_sync_streams_opened_total"), 0)
        assertServerHealthy(server)
    }

    // MARK: - Helpers

    /// `token` with its `exp` `seconds` from now, signed again with the test servers' secret.
    func reissue(_ token: String, expiringIn seconds: Int) throws -> String {
        let script = """
            import jwt, sys, time
            claims = jwt.decode(sys.argv[1], options={"verify_signature": False})
            claims["exp"] = int(time.time()) + int(sys.argv[3])
            print(jwt.encode(claims, sys.argv[2], algorithm="HS256"))
            """
        let result = try Command.run(
            "/usr/bin/python3", ["-c", script, token, ServerProcess.jwtSecret, String(seconds)],
            environment: Command.environment([:]))
        XCTAssertEqual(result.status, 0, result.stderr)
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
