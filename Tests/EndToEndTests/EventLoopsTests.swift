import Foundation
import TestSupport
import XCTest

/// The public listener with several event loops (`TRUNK_SYNC_EVENT_LOOPS`) through the real
/// binary: connections land on several loops, and per-user state is shared by all of them —
/// a push read on one loop wakes long-polls and writes to streams held by the others. With
/// one loop, the same works.
final class EventLoopsTests: EndToEndTestCase {
    func session(_ server: ServerProcess, _ email: String) throws -> String {
        var environment = server.environment
        environment["TRUNK_SYNC_DB_POOL_TIMEOUT"] = "5"
        let result = try Command.run(Command.trunkSyncBinary(), ["token", "--email", email], environment: environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        return try XCTUnwrap(object["access_token"] as? String)
    }

    func push(_ server: ServerProcess, _ token: String) throws {
        let body =
            #"{"events":[{"client_id":"\#(UUID().uuidString.lowercased())","type":"note","payload":{"n":1},"client_timestamp":"2026-11-22T04:10:02.123Z"}]}"#
        let (response, _) = try server.exchange(
            request("POST", "/sync/v1/events", headers: [("Authorization", "Bearer \(token)")], body: body))
        XCTAssertEqual(response.status, 200, response.bodyText)
    }

    /// Open connections of each loop, as `/metrics` shows them.
    func perLoop(_ server: ServerProcess) throws -> [Int: Int] {
        var counts: [Int: Int] = [:]
        for (name, value) in try server.metrics() where name.hasPrefix("trunk_sync_http_loop_connections{loop=\"") {
            let index =
                Int(name.dropFirst("trunk_sync_http_loop_connections{loop=\"".count).prefix { $0.isNumber }) ?? -1
            counts[index] = Int(value)
        }
        return counts
    }

    /// Streams and long-polls of one user on `loops` loops, then one push: every one of them
    /// gets the event.
    func deliverOnePushToEveryStreamAndLongPoll(loops: Int) throws {
        let server = try startServer(["TRUNK_SYNC_EVENT_LOOPS": "\(loops)", "TRUNK_SYNC_STREAM_MAX_PER_USER": "20"])
        let token = try session(server, "loops@example.com")
        var streams: [EventStreamClient] = []
        for _ in 0..<12 {
            let stream = try EventStreamClient(
                server: server, target: "/sync/v1/stream?after=0", headers: [("Authorization", "Bearer \(token)")])
            XCTAssertEqual(try stream.next(), .retry(1000))
            streams.append(stream)
        }
        var polls: [RawClient] = []
        for _ in 0..<12 {
            let client = try server.connect()
            try client.send(
                request("GET", "/sync/v1/events?after=0&wait=30", headers: [("Authorization", "Bearer \(token)")]))
            polls.append(client)
        }
        XCTAssertTrue(
            eventually(within: 20, interval: .milliseconds(50)) {
                (try? server.metrics()["trunk_sync_longpolls_waiting"]) == 12
            }, "the long-polls did not all wait")
        let counts = try perLoop(server)
        XCTAssertEqual(counts.count, loops, "\(counts)")
        XCTAssertEqual(counts.values.reduce(0, +), 24, "\(counts)")
        if loops > 1 {
            // SO_REUSEPORT spreads the 24 connections by a hash: all on one of `loops` loops
            // would be a loops^-23 chance.
            XCTAssertGreaterThan(counts.values.filter { $0 > 0 }.count, 1, "\(counts)")
        }

        try push(server, token)  // on a connection of its own, on whichever loop
        for poll in polls {
            let response = try poll.readResponse(timeout: 10)
            XCTAssertEqual(response.status, 200, response.bodyText)
            XCTAssertEqual((response.jsonObject?["events"] as? [Any])?.count, 1, response.bodyText)
        }
        for stream in streams {
            XCTAssertEqual(try stream.events(1, timeout: 10).map(\.id), [1])
        }
    }

    func testStreamsAndLongPollsOnSeveralLoopsAllGetAPushReadOnAnother() throws {
        try deliverOnePushToEveryStreamAndLongPoll(loops: 4)
    }

    func testOneLoopStillServesStreamsAndLongPolls() throws {
        try deliverOnePushToEveryStreamAndLongPoll(loops: 1)
    }

    /// The scheduling policy (`SCHED_OTHER` 0, `SCHED_BATCH` 3) of each of the process's
    /// event-loop threads (`http-loop-N`: the public listener's and the admin listener's),
    /// from /proc.
    func loopPolicies(_ server: ServerProcess) throws -> [Int] {
        let tasks = "/proc/\(server.process.processIdentifier)/task"
        var policies: [Int] = []
        for tid in try FileManager.default.contentsOfDirectory(atPath: tasks) {
            guard let name = try? String(contentsOfFile: "\(tasks)/\(tid)/comm", encoding: .utf8),
                name.hasPrefix("http-loop-"),
                let stat = try? String(contentsOfFile: "\(tasks)/\(tid)/stat", encoding: .utf8),
                let end = stat.lastIndex(of: ")")
            else { continue }
            // Fields after the name start at field 3 (state); the policy is field 41.
            let fields = stat[stat.index(after: end)...].split(separator: " ")
            policies.append(Int(fields[41 - 3]) ?? -1)
        }
        return policies
    }

    /// `event_loop_scheduling`: the loops run as SCHED_BATCH by default (a loop woken by a
    /// request does not preempt a busy thread), as SCHED_OTHER with `normal`; both listeners'
    /// loops follow it.
    func testLoopThreadsAreScheduledAsTheSettingSays() throws {
        for (value, policy) in [(nil, 3), ("normal", 0), ("BATCH", 3)] as [(String?, Int)] {
            var environment = ["TRUNK_SYNC_EVENT_LOOPS": "2"]
            environment["TRUNK_SYNC_EVENT_LOOP_SCHEDULING"] = value
            let server = try startServer(environment)
            // Each loop sets its policy when its thread starts, which may be just after the
            // listening line.
            var seen: [Int] = []
            XCTAssertTrue(
                try eventually(within: 10) {
                    seen = try loopPolicies(server)
                    return seen.count == 3 && seen.allSatisfy { $0 == policy }
                }, "\(value ?? "default"): \(seen)")
            let (response, _) = try server.exchange(request("GET", "/healthz"))
            XCTAssertEqual(response.status, 200, response.bodyText)
            XCTAssertEqual(server.stop(), 0)
        }
    }
}
