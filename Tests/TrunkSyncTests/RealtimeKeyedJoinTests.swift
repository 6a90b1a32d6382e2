import Foundation
import TestSupport
import TrunkCrypto
import XCTest

@testable import HTTPServer
@testable import TrunkSync

/// A join with the app's key (signed out, or before sign-in), as Supabase Realtime takes it:
/// answered as any join, delivering nothing, until the first token of a user binds it to
/// that user. Such a channel is in no hub: no row of anyone reaches it while it has no user.
final class RealtimeKeyedJoinTests: XCTestCase {
    typealias Harness = RealtimeJoinGraceTests.Harness

    static let bindings =
        #"[{"event":"INSERT","schema":"public","table":"events"},{"event":"*","schema":"public","table":"events","filter":"type=eq.later"}]"#

    /// A vsn 2.0.0 join of `topic` whose payload's `access_token` member is `token` (JSON
    /// text; nil: none at all).
    static func join(_ ref: String, _ topic: String, token: String?, bindings: String = bindings) -> String {
        let member = token.map { #","access_token":\#($0)"# } ?? ""
        return
            #"["\#(ref)","\#(ref)","realtime:\#(topic)","phx_join",{"config":{"postgres_changes":\#(bindings)}\#(member)}]"#
    }

    static func quoted(_ text: String) -> String { "\"\(text)\"" }

    /// Two signed-in users and their tokens.
    struct Users {
        let a: String
        let b: String
    }

    func withUsers(_ body: (AppHarness, Users) async throws -> Void) async throws {
        try await RealtimeJoinGraceTests.withApp("keyed-a@example.com") { app, a in
            let b = try await app.application.auth.issueSession(email: try XCTUnwrap(Email("keyed-b@example.com")))
            try await body(app, Users(a: a, b: b.accessToken))
        }
    }

    func testAJoinWithTheAppsKeyIsSubscribedGetsNoRowAndTheFirstUserTokenBindsIt() async throws {
        try await withUsers { app, users in
            let keyed = try Harness(app, grace: .seconds(3600), apiKey: "anon-key")
            let feed = keyed.feed
            // Signed-in sockets of A and B: once one has a row, the hub has written that row
            // to every channel it was for.
            let witnessA = try Harness(app, grace: .seconds(3600), feed: feed)
            let witnessB = try Harness(app, grace: .seconds(3600), feed: feed)
            for (witness, token) in [(witnessA, users.a), (witnessB, users.b)] {
                witness.send(Self.join("1", "room", token: Self.quoted(token)))
                let joined = try await witness.waitFor(#""1","1","realtime:room","phx_reply",{"status":"ok""#)
                XCTAssertTrue(joined, witness.sent)
            }

            // Each form of the app's key, and none at all (as Supabase: the socket's apikey).
            let forms: [(String, String?)] = [
                ("none", nil), ("null", "null"), ("apikey", Self.quoted("anon-key")),
                ("publishable", Self.quoted("sb_publishable_0123456789abcdef")),
                ("anonjwt", Self.quoted(RealtimeAccessTokenTests.anonJWT)),
            ]
            for (index, (topic, token)) in forms.enumerated() {
                keyed.send(Self.join("\(index)", topic, token: token))
                let joined = try await keyed.waitFor(
                    #""\#(index)","\#(index)","realtime:\#(topic)","phx_reply",{"status":"ok","response":{"postgres_changes":[{"id":1,"event":"INSERT","schema":"public","table":"events"},{"id":2,"event":"*","schema":"public","table":"events","filter":"type=eq.later"}]}}]"#
                )
                XCTAssertTrue(joined, "a join with the app's key (\(topic)) was not answered as a join: \(keyed.sent)")
                let subscribed = try await keyed.waitFor(
                    #"["\#(index)",null,"realtime:\#(topic)","system",{"extension":"postgres_changes","status":"ok""#)
                XCTAssertTrue(subscribed, keyed.sent)
            }
            XCTAssertEqual(feed.channelCount, 2, "a channel without a user was registered with the feed")
            keyed.grace.end()
            XCTAssertFalse(keyed.socket.isClosed, "a socket with a channel joined with the key was closed")

            func pushed(_ token: String, _ type: String, seenBy witness: Harness) async throws {
                try await RealtimeRevocationTests.push(app, token, type: type)
                let arrived = try await witness.waitFor(type)
                XCTAssertTrue(arrived, "the witness did not get \(type)")
            }
            // Nobody's rows reach a channel without a user, `null` and the key change nothing.
            try await pushed(users.a, "a-while-keyed", seenBy: witnessA)
            try await pushed(users.b, "b-while-keyed", seenBy: witnessB)
            keyed.send(#"["0","n","realtime:none","access_token",{"access_token":null}]"#)
            keyed.send(#"["0","k","realtime:none","access_token",{"access_token":"anon-key"}]"#)
            let kept = try await keyed.waitFor(#""k","realtime:none","phx_reply",{"status":"ok""#)
            XCTAssertTrue(kept, keyed.sent)
            try await pushed(users.a, "a-still-keyed", seenBy: witnessA)
            let answered = try await keyed.heartbeat(0)
            XCTAssertTrue(answered)
            XCTAssertFalse(keyed.sent.contains("postgres_changes\",{\"ids\""), "a row reached a channel without a user")

            // A's token binds one channel to A: A's rows from then on, never B's, none before.
            keyed.send(#"["0","t","realtime:none","access_token",{"access_token":"\#(users.a)"}]"#)
            let bound = try await keyed.waitFor(#""t","realtime:none","phx_reply",{"status":"ok""#)
            XCTAssertTrue(bound, keyed.sent)
            XCTAssertEqual(feed.channelCount, 3)
            try await pushed(users.b, "b-after-bind", seenBy: witnessB)
            try await pushed(users.a, "later", seenBy: witnessA)
            let delivered = try await keyed.waitFor(
                #"["0",null,"realtime:none","postgres_changes",{"ids":[1,2],"data":{"#)
            XCTAssertTrue(delivered, "the bound channel did not get its user's row: \(keyed.sent)")
            let answeredAgain = try await keyed.heartbeat(1)
            XCTAssertTrue(answeredAgain)
            for withheld in ["a-while-keyed", "b-while-keyed", "a-still-keyed", "b-after-bind"] {
                XCTAssertFalse(keyed.sent.contains(withheld), "\(withheld) reached the socket: \(keyed.sent)")
            }
            XCTAssertEqual(
                keyed.sent.components(separatedBy: "\"postgres_changes\",{\"ids\"").count - 1, 1,
                "only the bound channel gets the row: \(keyed.sent)")

            // Bound, it is a channel of A's session: its sign-out ends it, not the others.
            let claims = try app.application.tokens.verify(users.a, now: AuthService.now())
            keyed.revocations.record([(claims.sessionID, claims.userID, claims.expiresAt)])
            let ended = try await keyed.waitFor(#""realtime:none","phx_close""#)
            XCTAssertTrue(ended, "the bound channel outlived its session")
            XCTAssertFalse(keyed.sent.contains(#""realtime:apikey","phx_close""#), keyed.sent)

            await keyed.finish(keepFeed: true)
            await witnessA.finish(keepFeed: true)
            await witnessB.finish()
        }
    }

    /// What a token refused at a join is refused for a channel joined with the key too: it
    /// ends it (`system` error, `phx_close`) and its topic is no longer joined.
    func testARefusedTokenEndsAChannelJoinedWithTheKey() async throws {
        try await withUsers { app, users in
            let keyed = try Harness(app, grace: .seconds(3600), apiKey: "anon-key")
            let revoked = try await app.application.auth.issueSession(
                email: try XCTUnwrap(Email("keyed-revoked@example.com")))
            let claims = try app.application.tokens.verify(revoked.accessToken, now: AuthService.now())
            keyed.revocations.record([(claims.sessionID, claims.userID, claims.expiresAt)])
            let refused: [(String, String, String)] = [
                ("forged", Self.quoted(users.a.dropLast(4) + "AAAA"), "Invalid or expired access_token"),
                ("empty", Self.quoted(""), "Invalid or expired access_token"),
                ("revoked", Self.quoted(revoked.accessToken), "The session was signed out"),
                ("number", "42", "access_token must be a string"),
            ]
            for (index, (topic, token, reason)) in refused.enumerated() {
                keyed.send(Self.join("\(index)", topic, token: nil))
                let joined = try await keyed.waitFor(#""\#(index)","realtime:\#(topic)","phx_reply",{"status":"ok""#)
                XCTAssertTrue(joined, keyed.sent)
                keyed.send(#"["\#(index)","t","realtime:\#(topic)","access_token",{"access_token":\#(token)}]"#)
                let ended = try await keyed.waitFor(#""realtime:\#(topic)","phx_close""#)
                XCTAssertTrue(ended, keyed.sent)
                XCTAssertTrue(keyed.sent.contains("Access token refused: \(reason)"), keyed.sent)
                keyed.send(#"["\#(index)","u","realtime:\#(topic)","access_token",{"access_token":null}]"#)
                let unmatched = try await keyed.waitFor(#""u","realtime:\#(topic)","phx_reply",{"status":"error""#)
                XCTAssertTrue(unmatched, keyed.sent)
            }
            // The same tokens are refused at the join as before.
            for (index, (topic, token, _)) in refused.enumerated() {
                keyed.send(Self.join("j\(index)", topic, token: token))
                let joinRefused = try await keyed.waitFor(
                    #""j\#(index)","realtime:\#(topic)","phx_reply",{"status":"error""#)
                XCTAssertTrue(joinRefused, keyed.sent)
            }
            XCTAssertEqual(keyed.feed.channelCount, 0)
            await keyed.finish()
        }
    }

    /// Channels joined with the key count against the socket's channels, and hold their
    /// bindings and filters together within what one user's may hold; binding one registers
    /// it under the user's limits, and one over them ends it.
    func testChannelsJoinedWithTheKeyAreBounded() async throws {
        try await withUsers { app, users in
            let keyed = try Harness(app, grace: .seconds(3600), maxChannelsPerUser: 1, maxChannelsPerSocket: 3) {
                $0.maxBindingsPerUser = 4
                $0.maxFilterBytesPerUser = 20
            }
            let entry = #"{"event":"INSERT","schema":"public","table":"events"}"#
            let one = "[\(entry)]"
            let three = "[" + Array(repeating: entry, count: 3).joined(separator: ",") + "]"
            keyed.send(Self.join("1", "first", token: nil))  // 2 bindings, 13 bytes of filters
            keyed.send(Self.join("2", "second", token: nil))  // 26 bytes together: refused
            let overBytes = try await keyed.waitFor(#""2","realtime:second","phx_reply",{"status":"error""#)
            XCTAssertTrue(overBytes, keyed.sent)
            XCTAssertTrue(keyed.sent.contains("26 bytes of postgres_changes filters; at most 20"), keyed.sent)
            keyed.send(Self.join("3", "second", token: nil, bindings: three))
            let overBindings = try await keyed.waitFor(#""3","realtime:second","phx_reply",{"status":"error""#)
            XCTAssertTrue(overBindings, keyed.sent)
            XCTAssertTrue(keyed.sent.contains("5 postgres_changes bindings; at most 4"), keyed.sent)
            keyed.send(Self.join("4", "second", token: nil, bindings: one))
            keyed.send(Self.join("5", "third", token: nil, bindings: one))
            keyed.send(Self.join("6", "fourth", token: nil, bindings: one))
            let overChannels = try await keyed.waitFor(#""6","realtime:fourth","phx_reply",{"status":"error""#)
            XCTAssertTrue(overChannels, keyed.sent)
            XCTAssertTrue(keyed.sent.contains("this socket has 3 channels joined already"), keyed.sent)
            XCTAssertTrue(keyed.sent.contains(#""5","realtime:third","phx_reply",{"status":"ok""#), keyed.sent)

            // A has one channel here already (TRUNK_SYNC_REALTIME_MAX_CHANNELS_PER_USER=1).
            let other = try Harness(app, grace: .seconds(3600), feed: keyed.feed)
            let joined = try await other.join("1", token: users.a)
            XCTAssertTrue(joined, other.sent)
            keyed.send(#"["1","t","realtime:first","access_token",{"access_token":"\#(users.a)"}]"#)
            let ended = try await keyed.waitFor(#""realtime:first","phx_close""#)
            XCTAssertTrue(ended, keyed.sent)
            XCTAssertTrue(keyed.sent.contains("Access token refused: this account has 1 channels joined already"))
            // Its room is free again; B binds another.
            keyed.send(Self.join("7", "fourth", token: nil, bindings: one))
            let rejoined = try await keyed.waitFor(#""7","realtime:fourth","phx_reply",{"status":"ok""#)
            XCTAssertTrue(rejoined, keyed.sent)
            keyed.send(#"["5","b","realtime:third","access_token",{"access_token":"\#(users.b)"}]"#)
            let bound = try await keyed.waitFor(#""b","realtime:third","phx_reply",{"status":"ok""#)
            XCTAssertTrue(bound, keyed.sent)
            XCTAssertEqual(keyed.feed.channelCount, 2)
            await keyed.finish(keepFeed: true)
            await other.finish()
        }
    }

    /// The key is public: every socket's channels joined with it together hold at most
    /// `maxKeyedChannelsInUsers` users' worth of bindings and filters (else the sockets a few
    /// addresses may open would each hold a user's worth, parsed, without an account). What
    /// a channel held is given back when it is left, replaced, bound, ended, or its socket
    /// closes.
    func testChannelsJoinedWithTheKeyAreBoundedOverEverySocket() async throws {
        try await withUsers { app, users in
            let first = try Harness(app, grace: .seconds(3600)) {
                $0.maxBindingsPerUser = 2
                $0.maxFilterBytesPerUser = 1000
                $0.maxKeyedChannelsInUsers = 1
            }
            let feed = first.feed
            first.send(Self.join("1", "room", token: nil))  // 2 bindings: all the feed may hold
            let joined = try await first.waitFor(#""1","1","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(joined, first.sent)
            let second = try Harness(app, grace: .seconds(3600), feed: feed)
            second.send(Self.join("1", "room", token: nil))
            let refused = try await second.waitFor(#""1","1","realtime:room","phx_reply",{"status":"error""#)
            XCTAssertTrue(refused, second.sent)
            XCTAssertTrue(second.sent.contains("channels without a signed-in user as it may"), second.sent)

            // Each way a channel joined with the key goes gives back what it held.
            func secondJoins(_ ref: String) async throws {
                second.send(Self.join(ref, "room", token: nil))
                let joined = try await second.waitFor(
                    #""\#(ref)","\#(ref)","realtime:room","phx_reply",{"status":"ok""#)
                XCTAssertTrue(joined, second.sent)
                XCTAssertEqual(feed.keyedChannelCount, 1)
            }
            first.send(#"["1","2","realtime:room","phx_leave",{}]"#)
            let left = try await first.waitFor(#""1","2","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(left, first.sent)
            try await secondJoins("2")
            second.send(#"["2","3","realtime:room","access_token",{"access_token":"\#(users.a)"}]"#)  // bound
            let bound = try await second.waitFor(#""2","3","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(bound, second.sent)
            XCTAssertEqual(feed.keyedChannelCount, 0)
            try await secondJoins("4")  // replaces the bound one
            second.send(#"["4","5","realtime:room","access_token",{"access_token":"not a token"}]"#)  // ends it
            let ended = try await second.waitFor(#""realtime:room","phx_close""#)
            XCTAssertTrue(ended, second.sent)
            XCTAssertEqual(feed.keyedChannelCount, 0)
            try await secondJoins("6")
            second.send(Self.join("7", "room", token: nil))  // replaced by a join of its topic
            let replaced = try await second.waitFor(#""7","7","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(replaced, second.sent)
            XCTAssertEqual(feed.keyedChannelCount, 1)
            await second.finish(keepFeed: true)  // its socket closes
            XCTAssertEqual(feed.keyedChannelCount, 0)
            first.send(Self.join("8", "room", token: nil))
            let again = try await first.waitFor(#""8","8","realtime:room","phx_reply",{"status":"ok""#)
            XCTAssertTrue(again, first.sent)
            await first.finish()
        }
    }
}
