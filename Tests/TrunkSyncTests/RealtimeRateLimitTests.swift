import Foundation
import Synchronization
import TestSupport
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// What one socket's messages can make the server do is bounded: its joins (each checks a
/// token and may read the database) and its messages of any kind, each per second on
/// average with bursts a normal client never passes (a reconnect rejoins every channel at
/// once). Over either, the message is refused with Supabase Realtime's reason and the socket
/// closed. The time is a clock moved by hand.
final class RealtimeRateLimitTests: XCTestCase {
    /// A clock that stands still until `advance`.
    final class ManualClock: Sendable {
        private let instant = Mutex(ContinuousClock.now)
        var now: ContinuousClock.Instant { instant.withLock { $0 } }
        func advance(_ duration: Duration) { instant.withLock { $0 += duration } }
    }

    func testTheAllowanceTakesABurstThenRefillsAtItsRate() {
        let clock = ManualClock()
        var limit = RealtimeRateLimit(perSecond: 4, burst: 10)
        for taken in 0..<10 { XCTAssertTrue(limit.take(at: clock.now), "message \(taken) of the burst refused") }
        XCTAssertFalse(limit.take(at: clock.now), "an 11th message at once was taken")
        clock.advance(.milliseconds(240))
        XCTAssertFalse(limit.take(at: clock.now), "taken before a whole message accrued")
        clock.advance(.milliseconds(10))
        XCTAssertTrue(limit.take(at: clock.now), "a quarter second at 4 per second gives one")
        XCTAssertFalse(limit.take(at: clock.now))
        // A long quiet refills the burst, not more.
        clock.advance(.seconds(3600))
        for _ in 0..<10 { XCTAssertTrue(limit.take(at: clock.now)) }
        XCTAssertFalse(limit.take(at: clock.now), "a long quiet gave more than the burst")
        // A clock read that goes back gives nothing and takes nothing away.
        var early = RealtimeRateLimit(perSecond: 1, burst: 1)
        let then = clock.now
        clock.advance(.seconds(1))
        XCTAssertTrue(early.take(at: clock.now))
        XCTAssertFalse(early.take(at: then))
        XCTAssertTrue(early.take(at: clock.now + .seconds(1)))
    }

    /// A session on an in-process socket whose rate limits read `clock`.
    func harness(
        _ app: AppHarness, clock: ManualClock, maxChannelsPerSocket: Int = 100,
        configure: @escaping (inout RealtimeFeed.Settings) -> Void = { _ in }
    ) throws -> RealtimeJoinGraceTests.Harness {
        try RealtimeJoinGraceTests.Harness(app, grace: .seconds(3600), maxChannelsPerSocket: maxChannelsPerSocket) {
            $0.clock = { clock.now }
            configure(&$0)
        }
    }

    func withApp(_ body: (AppHarness, String) async throws -> Void) async throws {
        try await RealtimeJoinGraceTests.withApp("realtime-rate@example.com", body)
    }

    /// Joins: a burst of a socket's channels, then the rate; one more is refused with
    /// Supabase's reason and the socket closed (`1008`), counted and logged. Refused joins count.
    func testJoinsOverTheRateAreRefusedAndCloseTheSocket() async throws {
        try await withApp { app, token in
            let clock = ManualClock()
            let harness = try self.harness(app, clock: clock, maxChannelsPerSocket: 3) { $0.maxJoinsPerSecond = 2 }
            // The burst is the socket's 3 channels (more than 2 a second); joining a topic again counts.
            for ref in 1...2 {
                let joined = try await harness.join("\(ref)", token: token)
                XCTAssertTrue(joined, "join \(ref) refused")
            }
            let refused = try await harness.join("3", token: "not-a-token")
            XCTAssertFalse(refused)
            clock.advance(.milliseconds(500))
            let joined = try await harness.join("4", token: token)
            XCTAssertTrue(joined, "a join half a second later, at 2 a second, was refused")
            harness.send(#"["5","5","realtime:room","phx_join",{"access_token":"\#(token)"}]"#)
            let answered = try await harness.waitFor(
                #""5","realtime:room","phx_reply",{"status":"error","response":{"reason":"ClientJoinRateLimitReached: Too many joins per second"}}"#
            )
            XCTAssertTrue(answered, harness.sent)
            await harness.finish(keepFeed: true)
            XCTAssertEqual(harness.socket.closeRequest.0, .policyViolation)
            XCTAssertEqual(harness.socket.closeRequest.1, "ClientJoinRateLimitReached: Too many joins per second")
            XCTAssertEqual(harness.feed.closedRateLimited.value, 1)
            XCTAssertEqual(harness.feed.channelCount, 0, "the closed socket's channel was not left")
            XCTAssertTrue(
                harness.logs.lines.contains {
                    $0.hasPrefix("info realtime socket closed: ClientJoinRateLimitReached")
                        && $0.contains("ip=203.0.113.7")
                },
                "\(harness.logs.lines)")
            harness.feed.close()
        }
    }

    /// Messages of any kind (heartbeats here, malformed ones too): a burst, then the rate;
    /// one more is answered `Too many messages per second` and the socket closed.
    func testMessagesOverTheRateCloseTheSocket() async throws {
        try await withApp { app, _ in
            let clock = ManualClock()
            let harness = try self.harness(app, clock: clock, maxChannelsPerSocket: 2) { $0.maxMessagesPerSecond = 4 }
            for beat in 1...3 {
                let answered = try await harness.heartbeat(beat)
                XCTAssertTrue(answered, "heartbeat \(beat) of the burst of 4")
            }
            harness.send("not json")
            let malformed = try await harness.waitFor("malformed message")
            XCTAssertTrue(malformed)
            clock.advance(.milliseconds(250))
            let later = try await harness.heartbeat(5)
            XCTAssertTrue(later, "a heartbeat a quarter second later, at 4 a second, was refused")
            harness.send(#"[null,"h6","phoenix","heartbeat",{}]"#)
            let refused = try await harness.waitFor(
                #""h6","phoenix","phx_reply",{"status":"error","response":{"reason":"Too many messages per second"}}"#)
            XCTAssertTrue(refused, harness.sent)
            await harness.finish(keepFeed: true)
            XCTAssertEqual(harness.socket.closeRequest.0, .policyViolation)
            XCTAssertEqual(harness.socket.closeRequest.1, "Too many messages per second")
            XCTAssertEqual(harness.feed.closedRateLimited.value, 1)
            harness.feed.close()
        }
    }

    /// The defaults let a client that reconnects rejoin every channel a socket may have and
    /// send each its token, all at once (supabase-js does both), and then heartbeat.
    func testTheDefaultsTakeAFullReconnectAtOnce() async throws {
        try await withApp { app, token in
            let clock = ManualClock()
            let harness = try self.harness(app, clock: clock)
            let settings = harness.feed.settings
            XCTAssertEqual(settings.maxJoinsPerSecond, 10)
            XCTAssertEqual(settings.maxMessagesPerSecond, 100)
            XCTAssertEqual(settings.joinBurst, settings.maxChannelsPerSocket)
            let channels = settings.maxChannelsPerSocket
            // In batches the socket's inbox (64 KiB) takes; the clock stands still meanwhile.
            for (kind, event) in [("j", "phx_join"), ("t", "access_token")] {
                for batch in stride(from: 1, through: channels, by: 20) {
                    let indexes = batch...min(batch + 19, channels)
                    for index in indexes {
                        harness.send(
                            #"["\#(index)","\#(kind)\#(index)","realtime:c\#(index)","\#(event)",{"config":{"postgres_changes":[]},"access_token":"\#(token)"}]"#
                        )
                    }
                    let last = indexes.upperBound
                    let answered = try await harness.waitFor(
                        #""\#(kind)\#(last)","realtime:c\#(last)","phx_reply",{"status":"ok""#)
                    XCTAssertTrue(answered, harness.sent)
                }
            }
            XCTAssertFalse(harness.sent.contains("Too many"), harness.sent)
            XCTAssertEqual(harness.feed.channelCount, channels)
            clock.advance(.milliseconds(100))
            let answered = try await harness.heartbeat(1)
            XCTAssertTrue(answered, "a heartbeat after a full reconnect was refused")
            XCTAssertFalse(harness.socket.isClosed)
            await harness.finish()
        }
    }
}
