import Foundation
import Postgres
import TestSupport
import XCTest

/// A push's notification lost between its commit and its `NOTIFY` (issue 23, item 6): two
/// instances on one database, the first reaching it through a proxy that cuts the
/// connection just before the notification. Committed events must still reach long-polls,
/// empty pulls and streams on both instances promptly, never after a long-poll's full wait.
final class LostNotificationTests: EndToEndTestCase {
    struct Instances {
        let proxied: ServerProcess
        let direct: ServerProcess
        let proxy: CuttingProxy
        let token: String
    }

    /// `direct` on a fresh database; `proxied` on the same one through a `CuttingProxy`.
    func instances() throws -> Instances {
        let direct = try startServer()
        let admin = try TestDatabase.adminConfiguration()
        let proxy = try CuttingProxy(targetPort: try XCTUnwrap(Int(admin["port"] ?? "")))
        addTeardownBlock { proxy.stop() }
        let url = try TestDatabase.url(of: direct.database)
        let proxied = try launchServer(on: direct.database, ["TRUNK_SYNC_DATABASE_URL": proxy.proxied(url)])
        try proxied.waitUntilListening(timeout: 15)
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", "lost@example.com"], environment: direct.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        let session = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        return Instances(
            proxied: proxied, direct: direct, proxy: proxy, token: try XCTUnwrap(session["access_token"] as? String))
    }

    func event(_ clientID: UUID) -> String {
        #"{"client_id":"\#(clientID.uuidString.lowercased())","type":"note","payload":{},"client_timestamp":"2026-11-22T04:10:02.123Z"}"#
    }

    func push(_ server: ServerProcess, _ token: String, _ clientID: UUID) throws -> RawResponse {
        try send(server, "POST", "/sync/v1/events", body: #"{"events":[\#(event(clientID))]}"#, token: token)
    }

    /// The seqs of a pull after `after`.
    func pulled(_ server: ServerProcess, _ token: String, after: Int64) throws -> [Int64] {
        let response = try send(server, "GET", "/sync/v1/events?after=\(after)", token: token)
        XCTAssertEqual(response.status, 200, response.bodyText)
        let events = response.jsonObject?["events"] as? [[String: Any]] ?? []
        return events.compactMap { ($0["seq"] as? NSNumber)?.int64Value }
    }

    /// A long-poll sent now, to be read later.
    func longPoll(_ server: ServerProcess, _ token: String, after: Int64) throws -> RawClient {
        let client = try server.connect()
        try client.send(
            request("GET", "/sync/v1/events?after=\(after)&wait=30", headers: [("Authorization", "Bearer \(token)")]))
        return client
    }

    /// The long-poll's events: its answer must come with them, well before its 30 s wait ends
    /// empty (the read's own limit is later still, so a long-poll that waited it out fails on
    /// its empty answer).
    func answered(_ client: RawClient) throws -> [Int64] {
        let response = try client.readResponse(timeout: 45)
        XCTAssertEqual(response.status, 200, response.bodyText)
        let events = response.jsonObject?["events"] as? [[String: Any]] ?? []
        return events.compactMap { ($0["seq"] as? NSNumber)?.int64Value }
    }

    func testAPushWhoseNotificationIsLostIsAnnouncedByItsRetry() throws {
        let setup = try instances()
        let (proxied, direct, token) = (setup.proxied, setup.direct, setup.token)
        XCTAssertEqual(try push(proxied, token, UUID()).status, 200)
        // Both instances learn that nothing follows seq 1 (empty pulls answered from memory).
        XCTAssertTrue(eventually(within: 10) { (try? pulled(direct, token, after: 1)) == [] })
        XCTAssertEqual(try pulled(proxied, token, after: 1), [])
        let waiting = try longPoll(direct, token, after: 1)
        // Both notifications of the push are lost: the one after its commit, and the one of
        // the same push run again on a fresh connection (it could not tell whether it
        // committed).
        setup.proxy.cutBeforeNotify(count: 2)
        let id = UUID()
        let cut = try push(proxied, token, id)
        XCTAssertEqual(setup.proxy.cuts, 2)
        XCTAssertEqual(cut.status, 503, "the outcome is unknown: retryable, never a server error; \(cut.bodyText)")
        XCTAssertEqual(cut.jsonObject?["code"] as? String, "database_unavailable")
        XCTAssertNotNil(cut.header("retry-after"))
        // The client retries: every event is already stored, and the retry announces them.
        let retry = try push(proxied, token, id)
        XCTAssertEqual(retry.status, 200, retry.bodyText)
        let result = (retry.jsonObject?["results"] as? [[String: Any]])?.first
        XCTAssertEqual((result?["seq"] as? NSNumber)?.int64Value, 2)
        XCTAssertEqual(try answered(waiting), [2], "the other instance's long-poll wakes")
        XCTAssertEqual(try pulled(proxied, token, after: 1), [2], "the pushing instance's empty-pull cache is cleared")
        XCTAssertTrue(eventually(within: 5) { (try? pulled(direct, token, after: 1)) == [2] })
    }

    func testAPushCutBeforeItsNotificationIsSettledOnAFreshConnection() throws {
        let setup = try instances()
        let (proxied, direct, token) = (setup.proxied, setup.direct, setup.token)
        XCTAssertEqual(try push(direct, token, UUID()).status, 200)
        XCTAssertTrue(eventually(within: 10) { (try? pulled(proxied, token, after: 1)) == [] })
        XCTAssertEqual(try pulled(direct, token, after: 1), [])
        let waitingHere = try longPoll(proxied, token, after: 1)
        let waitingThere = try longPoll(direct, token, after: 1)
        setup.proxy.cutBeforeNotify(count: 1)
        let cut = try push(proxied, token, UUID())
        XCTAssertEqual(setup.proxy.cuts, 1)
        // The server pushed again on a fresh connection, found the events stored, and
        // announced them: a success, and no retry needed.
        XCTAssertEqual(cut.status, 200, cut.bodyText)
        let result = (cut.jsonObject?["results"] as? [[String: Any]])?.first
        XCTAssertEqual((result?["seq"] as? NSNumber)?.int64Value, 2)
        XCTAssertEqual(try answered(waitingHere), [2])
        XCTAssertEqual(try answered(waitingThere), [2])
        XCTAssertEqual(try pulled(proxied, token, after: 1), [2])
        XCTAssertTrue(eventually(within: 5) { (try? pulled(direct, token, after: 1)) == [2] })
    }
}
