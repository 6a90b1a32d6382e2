import Foundation
import TestSupport
import TrunkSyncClient
import XCTest

/// What the client reads of an answer is bounded (`Configuration.maxAnswerBytes`): a
/// misbehaving proxy's endless or huge `200` fails the call clearly, the connection closed,
/// instead of growing the client's memory for as long as it comes.
final class AnswerLimitTests: ClientTestCase {
    /// A client signed in as `email` through a `HoldingProxy` (stop it after), reading at most
    /// 256 KiB of an answer.
    private func clientBehindProxy(_ email: String) async throws -> (HoldingProxy, TrunkSyncClient) {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        do {
            let client = try makeClient(via: proxy, storage: try makeStorage()) { $0.maxAnswerBytes = 256 * 1024 }
            try await signIn(client, server, as: email)
            return (proxy, client)
        } catch {
            proxy.stop()
            throw error
        }
    }

    /// A pull answered with a body that never ends (chunked, no length): the request is
    /// cancelled at the limit (the proxy never gets to send it all) and the sync fails with
    /// `.invalidResponse` naming the limit; the cursor stays, the next sync pulls. (It read
    /// the whole 64 MiB, and would have read on for as long as it came.)
    func testAPullAnsweredWithoutEndIsCutAtTheLimit() async throws {
        let (proxy, client) = try await clientBehindProxy("endless-pull@example.com")
        defer { proxy.stop() }
        _ = try await client.record(type: "note", payload: ["n": 1])
        try await assertEqual(try await client.push().pushed, 1)
        try proxy.answerHuge("/sync/v1/events", announced: false)
        do {
            _ = try await client.sync { _ in }
            XCTFail("a pull answered without end was taken")
        } catch TrunkSyncError.invalidResponse(let reason) {
            XCTAssertTrue(reason.contains("over 262144 bytes"), reason)
        }
        XCTAssertEqual(proxy.hugeAnswer(timeout: 60), "cut", "the client read on past its limit")
        try await assertEqual(await client.cursor, 0)
        try await assertEqual(try await client.sync { _ in }.pulled, 1)
    }

    /// A push answered with a `Content-Length` past the limit: refused from the head and the
    /// first piece, the body not read; the events stay in the outbox and the next push stores
    /// them. (It read the 64 MiB and failed only on parsing them.)
    func testAPushAnswerAnnouncedPastTheLimitIsNotRead() async throws {
        let (proxy, client) = try await clientBehindProxy("huge-push@example.com")
        defer { proxy.stop() }
        _ = try await client.record(type: "note", payload: ["n": 1])
        try proxy.answerHuge("/sync/v1/events", announced: true)
        do {
            _ = try await client.push()
            XCTFail("a push answer past the limit was taken")
        } catch TrunkSyncError.invalidResponse(let reason) {
            XCTAssertTrue(reason.contains("the push was answered 200 with a body of over 262144 bytes"), reason)
        }
        XCTAssertEqual(proxy.hugeAnswer(timeout: 60), "cut", "the client read the body")
        try await assertEqual(await client.pendingCount, 1)
        try await assertEqual(try await client.push().pushed, 1)
        try await assertEqual(await client.pendingCount, 0)
    }
}
