import Foundation
import Glibc
import HTTPServer
import Synchronization
import TestSupport
import TrunkSync
import XCTest

/// The attack on the output side by one account: connections that ask for a large pull page
/// and never read it. Each account holds at most `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT_PER_CLIENT`
/// of such answers: past it, its next large answer is `503 server_busy` (the route's shape,
/// `Retry-After: 1`) while another user's large pull is answered, and once its connections
/// are gone its share comes back (docs/api.md, "Limits and errors").
final class OutputShareTests: XCTestCase {
    /// Events of ~60 KB a user pulls in one page of ~1 MB.
    static let events = 16
    static let pull = "/sync/v1/events?after=0&limit=1000"
    /// Room in each account's share for two such pages, not three.
    static let perClient = 2_500_000

    var app: AppHarness!

    override func setUp() async throws {
        app = try await AppHarness(environment: [
            "TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT": "\(16 * 1024 * 1024)",
            "TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT_PER_CLIENT": "\(Self.perClient)",
        ])
    }

    override func tearDown() async throws { await app?.stop() }

    /// A signed-up user with a pull page of ~1 MB, and its share's key.
    func user(_ email: String) async throws -> (token: String, key: ShareKey) {
        let token = try await app.token(email)
        let text = String(repeating: "x", count: 60_000)
        let events: [[String: Any]] = (0..<Self.events).map { _ in
            [
                "client_id": UUID().uuidString, "type": "note", "payload": ["text": text],
                "client_timestamp": "2026-11-22T04:10:02.123Z",
            ]
        }
        let pushed = try await app.request("POST", "/sync/v1/events", json: ["events": events], bearer: token)
        XCTAssertEqual(pushed.status, 200, pushed.text)
        let id = try app.owner().query("select id from users where email = '\(email)'")[0].decode(UUID.self, column: 0)
        return (token, .account(id))
    }

    /// A connection that asks for `token`'s pull page 8 times in a row and reads nothing, once
    /// the server holds a page in `key`'s share (`held` bytes with it). On loopback the kernel
    /// takes a page or a few whole (its send buffer grows to 4 MiB): the next one waits in the
    /// server, the ones after it are not read yet.
    func nonReader(_ token: String, _ key: ShareKey, holding held: Int) async throws -> Int32 {
        let socket = try connectedSocket(port: app.server.port, receiveBuffer: 4096)
        let request = String(
            repeating: "GET \(Self.pull) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(token)\r\n\r\n",
            count: 8)
        let sent = Array(request.utf8).withUnsafeBytes { send(socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        XCTAssertEqual(sent, request.utf8.count)
        let server = app.server
        let holding = await waitUntil(30) { server.bufferedOutputBytes(of: key) == held }
        XCTAssertTrue(holding, "the share holds \(server.bufferedOutputBytes(of: key)), not \(held)")
        return socket
    }

    func testAUserWithUnreadLargePullsUpToTheirShareIs503WhileAnotherUsersLargePullIsAnswered() async throws {
        let server = app.server
        let (mine, myShare) = try await user("output@example.com")
        let (theirs, theirShare) = try await user("other-output@example.com")
        let page = try await app.request("GET", Self.pull, bearer: mine)
        XCTAssertEqual(page.status, 200)
        let size = page.body.count
        XCTAssertTrue(
            (2 * size...3 * size).contains(Self.perClient) && size > 64 * 1024,
            "precondition: two pages of \(size) bytes fit the share, three do not")
        let sentWhole = await waitUntil(10) { server.bufferedOutputBytes(of: myShare) == 0 }
        XCTAssertTrue(sentWhole, "a page read whole holds no share")

        let first = try await nonReader(mine, myShare, holding: size)
        let second = try await nonReader(mine, myShare, holding: 2 * size)

        // A third would take them past their share, though the total has room for it. Until
        // the kernel's send buffers stop growing, a connection may get a page through whole
        // and hold no share until its next page is queued (after its query): ask until the
        // server holds both again.
        let harness = app!
        let refusal = Mutex<AppHarness.Response?>(nil)
        let refusedInTime = try await waitUntil(30) {
            let answer = try await harness.request("GET", Self.pull, bearer: mine)
            guard answer.status == 503 else { return false }
            refusal.withLock { $0 = answer }
            return true
        }
        XCTAssertTrue(refusedInTime, "never refused")
        let refused = try XCTUnwrap(refusal.withLock { $0 })
        XCTAssertEqual(refused.json["code"] as? String, "server_busy", String(refused.text.prefix(300)))
        XCTAssertEqual(refused.headers["retry-after"], "1")
        // Their small answers still go.
        let small = try await app.request("GET", "/sync/v1/events?after=0&limit=1", bearer: mine)
        XCTAssertEqual(small.status, 200, small.text)

        // Another user's large pull is answered.
        let other = try await app.request("GET", Self.pull, bearer: theirs)
        XCTAssertEqual(other.status, 200, String(other.text.prefix(300)))
        XCTAssertEqual(other.body.count, size)
        let perClient = try await app.metric(#"trunk_sync_http_answers_refused_total{limit="per_client"}"#)
        XCTAssertEqual(perClient, 1, "refused once, by their share")
        let total = try await app.metric(#"trunk_sync_http_answers_refused_total{limit="total"}"#)
        XCTAssertEqual(total, 0)

        // Their non-readers go (with unread bytes: a reset): the share comes back, and their
        // large pull is answered again.
        close(first)
        close(second)
        let released = await waitUntil(30) {
            server.bufferedOutputBytes(of: myShare) == 0 && server.bufferedOutputBytes(of: theirShare) == 0
                && server.bufferedOutputBytes == 0
        }
        XCTAssertTrue(released, "still held: \(server.bufferedOutputBytes(of: myShare))")
        let again = try await app.request("GET", Self.pull, bearer: mine)
        XCTAssertEqual(again.status, 200)
        XCTAssertEqual(again.body.count, size)
    }
}
