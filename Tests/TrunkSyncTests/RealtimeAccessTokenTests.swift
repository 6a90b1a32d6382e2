import Foundation
import TestSupport
import TrunkCrypto
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// `access_token` on a joined channel as Supabase Realtime takes it, for what the clients
/// send: `null` (an `accessToken` callback without a token) changes nothing; the app's key
/// (what they send once signed out) keeps the channel but withholds its changes until a token
/// of its user comes, and the channel still ends with its last user token's session.
final class RealtimeAccessTokenTests: XCTestCase {
    /// A Supabase project's anon key: a JWT of the `anon` role naming no user (not signed by
    /// this server, which never issues one).
    static let anonJWT =
        Base64URL.encode(#"{"alg":"HS256","typ":"JWT"}"#) + "."
        + Base64URL.encode(#"{"iss":"supabase","role":"anon","iat":1700000000,"exp":2000000000}"#) + "."
        + Base64URL.encode("signature")

    static func join(_ ref: String, token: String) -> String {
        #"["\#(ref)","\#(ref)","realtime:room","phx_join",{"config":{"postgres_changes":[{"event":"INSERT","schema":"public","table":"events"}]},"access_token":"\#(token)"}]"#
    }

    func testNullIsIgnoredAndTheAppsKeyWithholdsChangesUntilATokenOfTheUserComes() async throws {
        let app = try await AppHarness()
        do {
            let email = try XCTUnwrap(Email("realtime-key@example.com"))
            let first = try await app.application.auth.issueSession(email: email)
            let channel = try RealtimeJoinGraceTests.Harness(app, grace: .seconds(3600), apiKey: "anon-key")
            // Another socket of the user that always delivers: once it has a row, the hub has
            // written that row to every channel it was for.
            let witness = try RealtimeJoinGraceTests.Harness(app, grace: .seconds(3600), feed: channel.feed)

            for harness in [channel, witness] {
                harness.send(Self.join("1", token: first.accessToken))
                let joined = try await harness.waitFor(#""1","1","realtime:room","phx_reply",{"status":"ok""#)
                XCTAssertTrue(joined, harness.sent)
            }

            func pushed(_ type: String) async throws {
                try await RealtimeRevocationTests.push(app, first.accessToken, type: type)
                let arrived = try await witness.waitFor(type)
                XCTAssertTrue(arrived, "the witness did not get \(type)")
            }

            // null (and no access_token at all) changes nothing: the channel delivers.
            channel.send(#"["1","2","realtime:room","access_token",{"access_token":null}]"#)
            channel.send(#"["1","3","realtime:room","access_token",{}]"#)
            let ignored = try await channel.waitFor(#""3","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(ignored, channel.sent)
            try await pushed("after-null")
            let delivered = try await channel.waitFor("after-null")
            XCTAssertTrue(delivered, "a row after access_token null was not delivered")

            // Each form of the app's key: the channel stays, delivers nothing.
            for (index, key) in ["anon-key", "sb_publishable_0123456789abcdef", Self.anonJWT].enumerated() {
                channel.send(#"["1","k\#(index)","realtime:room","access_token",{"access_token":"\#(key)"}]"#)
                let kept = try await channel.waitFor(#""k\#(index)","realtime:room","phx_reply",{"status":"ok""#)
                XCTAssertTrue(kept, channel.sent)
                try await pushed("withheld-\(index)")
                let answered = try await channel.heartbeat(index)
                XCTAssertTrue(answered)
            }
            XCTAssertFalse(
                channel.sent.contains("withheld-"), "a row went to a channel on the app's key: \(channel.sent)")
            XCTAssertFalse(channel.sent.contains("phx_close"), "the app's key ended the channel: \(channel.sent)")
            XCTAssertEqual(channel.feed.channelCount, 2)

            // A token of the user: it delivers again (what was withheld is not sent later).
            let second = try await app.application.auth.issueSession(email: email)
            channel.send(#"["1","4","realtime:room","access_token",{"access_token":"\#(second.accessToken)"}]"#)
            let followed = try await channel.waitFor(#""4","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(followed)
            try await pushed("delivered-again")
            let again = try await channel.waitFor("delivered-again")
            XCTAssertTrue(again, "a token of the user did not turn delivery back on")
            XCTAssertFalse(channel.sent.contains("withheld-"), channel.sent)

            // On the key again, the channel still ends with the session of its last user token.
            channel.send(#"["1","5","realtime:room","access_token",{"access_token":"anon-key"}]"#)
            let keyed = try await channel.waitFor(#""5","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(keyed)
            let claims = try app.application.tokens.verify(second.accessToken, now: AuthService.now())
            channel.revocations.record([(claims.sessionID, claims.userID, claims.expiresAt)])
            let ended = try await channel.waitFor(#""realtime:room","phx_close""#)
            XCTAssertTrue(ended, "a channel on the app's key outlived its last token's session")
            XCTAssertTrue(channel.sent.contains("The session was signed out"), channel.sent)
            XCTAssertFalse(witness.sent.contains("phx_close"), "the first session's channel ended too")

            await channel.finish(keepFeed: true)
            await witness.finish()
        } catch {
            await app.stop()
            throw error
        }
        await app.stop()
    }

    /// An `access_token` that is neither a string nor null is no token: the channel ends, and
    /// nothing else on the socket changes.
    func testAnAccessTokenThatIsNotAStringEndsTheChannel() async throws {
        let app = try await AppHarness()
        do {
            let email = try XCTUnwrap(Email("realtime-key-shape@example.com"))
            let session = try await app.application.auth.issueSession(email: email)
            let channel = try RealtimeJoinGraceTests.Harness(app, grace: .seconds(3600))
            channel.send(Self.join("1", token: session.accessToken))
            let joined = try await channel.waitFor(#""1","1","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(joined, channel.sent)
            channel.send(#"["1","2","realtime:room","access_token",{"access_token":42}]"#)
            let ended = try await channel.waitFor(#""realtime:room","phx_close""#)
            XCTAssertTrue(ended, channel.sent)
            XCTAssertTrue(channel.sent.contains("access_token must be a string"), channel.sent)
            let answered = try await channel.heartbeat(0)
            XCTAssertTrue(answered, "the socket stays open")
            await channel.finish()
        } catch {
            await app.stop()
            throw error
        }
        await app.stop()
    }

    /// The forms of the app's key are told from a user's token without verifying them.
    func testWhatIsTheAppsKey() {
        XCTAssertTrue(RealtimeSession.isAnonJWT(Self.anonJWT))
        let withUser =
            Base64URL.encode(#"{"alg":"HS256"}"#) + "." + Base64URL.encode(#"{"role":"anon","sub":"x"}"#) + ".c2ln"
        XCTAssertFalse(RealtimeSession.isAnonJWT(withUser), "a token naming a user is not a key")
        let authenticated =
            Base64URL.encode(#"{"alg":"HS256"}"#) + "." + Base64URL.encode(#"{"role":"authenticated"}"#) + ".c2ln"
        XCTAssertFalse(RealtimeSession.isAnonJWT(authenticated))
        XCTAssertFalse(RealtimeSession.isAnonJWT("anon-key"))
        XCTAssertFalse(RealtimeSession.isAnonJWT("a.b.c"))
    }
}
