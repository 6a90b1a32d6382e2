import Foundation
import Logging
import TestSupport
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// What one commit can cost through Realtime: each change of a user's is matched against
/// every `postgres_changes` binding of the user's channels, so their number is bounded per
/// user, and an `in.(…)` filter is one look-up, not a scan of its values.
final class RealtimeLimitsTests: XCTestCase {
    func testInFiltersMatchTheirValuesOnly() throws {
        let filter = try RealtimeBinding.parseFilter("seq=in.(1,2,3)", table: .events)
        XCTAssertTrue(filter.matches(.int(2)))
        XCTAssertFalse(filter.matches(.int(4)))
        XCTAssertFalse(filter.matches(.text("2")), "a value of another type is not a member")
        XCTAssertFalse(filter.matches(.null))
        let types = try RealtimeBinding.parseFilter(#"type=in.("a b",c)"#, table: .events)
        XCTAssertTrue(types.matches(.text("a b")))
        XCTAssertTrue(types.matches(.text("c")))
        XCTAssertFalse(types.matches(.text("a")))
        let many = (0..<100).map(String.init).joined(separator: ",")
        let hundred = try RealtimeBinding.parseFilter("seq=in.(\(many))", table: .events)
        XCTAssertTrue(hundred.matches(.int(99)))
        XCTAssertThrowsError(try RealtimeBinding.parseFilter("seq=in.(\(many),100)", table: .events))
    }

    /// Conditions joined by commas (newer Supabase ANDs them) are refused, not read as one
    /// value that matches nothing; a value with a comma is still a value.
    func testSeveralConditionsInOneFilterAreRefused() throws {
        XCTAssertThrowsError(try RealtimeBinding.parseFilter("type=eq.note,seq=gt.5", table: .events))
        XCTAssertThrowsError(try RealtimeBinding.parseFilter("seq=gt.5,type=in.(a,b)", table: .events))
        let comma = try RealtimeBinding.parseFilter("type=eq.a,b", table: .events)
        XCTAssertTrue(comma.matches(.text("a,b")))
        XCTAssertNoThrow(try RealtimeBinding.parseFilter("type=eq.a,=b", table: .events))
    }

    func testAUsersBindingsTogetherAreBoundedAndLeavingGivesThemBack() async throws {
        let app = try await AppHarness()
        do {
            func signedUp(_ email: String) async throws -> UUID {
                let session = try await app.application.auth.issueSession(email: try XCTUnwrap(Email(email)))
                return try app.application.tokens.verify(session.accessToken, now: AuthService.now()).userID
            }
            let user = try await signedUp("bindings@example.com")
            let otherUser = try await signedUp("other-bindings@example.com")
            var settings = RealtimeFeed.Settings()
            settings.maxBindingsPerUser = 10
            let logger = Logger(label: "realtime-limits-test")
            let feed = RealtimeFeed(
                settings: settings, database: app.application.database, notifier: app.application.notifier,
                revocations: SessionRevocations(database: nil, logger: logger), tokens: app.application.tokens,
                metrics: Metrics(), logger: logger)
            let binding = try RealtimeBinding.parse(
                .object(["event": .string("INSERT"), "schema": .string("public"), "table": .string("events")]), id: 1)
            func channel(_ bindings: Int) -> RealtimeChannel {
                RealtimeChannel(
                    id: feed.nextChannelID(), user: user, session: UUID(), expiresAt: AuthService.now() + 600,
                    socket: WebSocket(settings: WebSocketSettings(), wake: {}), version: .v2,
                    topic: "realtime:room", joinRef: "1", bindings: Array(repeating: binding, count: bindings))
            }
            let first = channel(6)
            try await feed.join(first)
            do {
                try await feed.join(channel(5))
                XCTFail("11 bindings for one user")
            } catch {
                XCTAssertTrue(error.reason.contains("at most 10"), error.reason)
            }
            try await feed.join(channel(4))  // 10: the limit itself
            XCTAssertEqual(feed.channelCount, 2)
            feed.leave(first)
            try await feed.join(channel(6))  // what the channel that left had is free again
            // Another user's bindings are counted apart.
            let other = RealtimeChannel(
                id: feed.nextChannelID(), user: otherUser, session: UUID(), expiresAt: AuthService.now() + 600,
                socket: WebSocket(settings: WebSocketSettings(), wake: {}), version: .v2, topic: "realtime:x",
                joinRef: "1", bindings: Array(repeating: binding, count: 10))
            try await feed.join(other)
            XCTAssertEqual(feed.channelCount, 3)
            feed.close()
        } catch {
            await app.stop()
            throw error
        }
        await app.stop()
    }
}
