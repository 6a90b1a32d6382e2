import Foundation
import Logging
import TestSupport
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// A channel of a signed-out session ends within a second even when no wake-up reaches its
/// hub: a channel registered just after the revocation's wake-up (its token was checked
/// before the revocation), or a revocation loaded after the listener reconnected.
final class RealtimeRevocationTests: XCTestCase {
    func testARevokedSessionEndsItsChannelWithoutAWakeUp() async throws {
        let app = try await AppHarness()
        do {
            let session = try await app.application.auth.issueSession(
                email: try XCTUnwrap(Email("realtime-revoked@example.com")))
            let claims = try app.application.tokens.verify(session.accessToken, now: AuthService.now())
            // Revocations recorded here wake nobody: nothing follows the listener.
            let logger = Logger(label: "realtime-revocation-test")
            let revocations = SessionRevocations(database: nil, logger: logger)
            let feed = RealtimeFeed(
                settings: RealtimeFeed.Settings(), database: app.application.database,
                notifier: app.application.notifier, revocations: revocations, tokens: app.application.tokens,
                metrics: Metrics(), logger: logger)
            let socket = WebSocket(settings: WebSocketSettings(), wake: {})
            let channel = RealtimeChannel(
                id: feed.nextChannelID(), user: claims.userID, session: claims.sessionID,
                expiresAt: claims.expiresAt, socket: socket, version: .v2, topic: "realtime:room", joinRef: "1",
                bindings: [])
            try await feed.join(channel)
            revocations.record([(claims.sessionID, claims.userID, claims.expiresAt)])
            let deadline = ContinuousClock.now + .seconds(30)
            while !channel.isEnded, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
            }
            XCTAssertTrue(channel.isEnded, "the channel of a signed-out session is still joined")
            let sent = String(decoding: socket.writer.take().bytes.joined(), as: UTF8.self)
            XCTAssertTrue(sent.contains("The session was signed out"), sent)
            XCTAssertTrue(sent.contains("phx_close"), sent)
            XCTAssertEqual(feed.channelCount, 0)
            feed.close()
        } catch {
            await app.stop()
            throw error
        }
        await app.stop()
    }
}
