import Foundation
import Postgres
import Synchronization
import TestSupport
import XCTest

@testable import TrunkSync

/// The export's end line (`{"kind":"end","events":N,"last_seq":S}`): written last, once every
/// page has been, with the count of event lines and the last one's `seq`, so a copy cut
/// short where the HTTP framing was lost is still known as cut; never written by an export
/// that fails or is interrupted midway. In process, against a real Postgres.
final class AccountExportEndTests: XCTestCase {
    /// What an export wrote, piece by piece.
    final class Output: Sendable {
        let pieces = Mutex<[[UInt8]]>([])
        var lines: [String] {
            let text = String(decoding: pieces.withLock { $0.joined() }, as: UTF8.self)
            XCTAssertTrue(text.isEmpty || text.hasSuffix("\n"), "every line ends with a newline")
            return text.split(separator: "\n").map(String.init)
        }
        var writes: Int { pieces.withLock { $0.count } }
        func write(_ bytes: [UInt8]) { pieces.withLock { $0.append(bytes) } }
    }

    var app: AppHarness!
    var owner: PostgresConnection!

    override func setUp() async throws {
        app = try await AppHarness()
        owner = try app.owner()
    }

    override func tearDown() async throws {
        await app?.stop()
    }

    /// A user with events of the given `seqs` (stored straight, as a push would have numbered
    /// them; `lastSeq`: the user's counter, which a restore may have moved past them).
    func user(_ email: String, seqs: [Int64], lastSeq: Int64? = nil) async throws -> UUID {
        _ = try await app.token(email)
        let id = try owner.query("select id from users where email = $1", email)[0].decode(UUID.self, column: 0)
        for seq in seqs {
            try owner.query(
                """
                insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
                values ($1, $2, 'note', jsonb_build_object('n', $2::int8), gen_random_uuid(), now(),
                        now() + $2 * interval '1 millisecond')
                """, id, seq)
        }
        let last = lastSeq ?? seqs.last ?? 0
        try owner.query("update users set last_seq = $2 where id = $1", id, last)
        return id
    }

    func json(_ line: String) throws -> [String: Any] {
        try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], line)
    }

    func testAMultiPageExportEndsWithItsCountAndLastSeq() async throws {
        let id = try await user("pages@example.com", seqs: Array(1...23))
        let output = Output()
        let summary = try await app.application.accounts.export(id, pageSize: 5) { output.write($0) }
        XCTAssertEqual(summary, Accounts.ExportSummary(events: 23, lastSeq: 23))
        XCTAssertEqual(output.writes, 1 + 5 + 1, "the account, five pages, the end line")
        let lines = output.lines
        XCTAssertEqual(lines.count, 25)
        XCTAssertEqual(try json(lines[0])["kind"] as? String, "account")
        XCTAssertEqual(try lines.dropFirst().dropLast().map { try json($0)["seq"] as? Int }, Array(1...23))
        XCTAssertEqual(lines.last, #"{"kind":"end","events":23,"last_seq":23}"#)
        XCTAssertEqual(try owner.query("select count(*) from account_exports")[0].decode(Int.self, column: 0), 0)
    }

    func testAnExportWithoutEventsEndsWithZero() async throws {
        let id = try await user("empty@example.com", seqs: [])
        let output = Output()
        let summary = try await app.application.accounts.export(id) { output.write($0) }
        XCTAssertEqual(summary, Accounts.ExportSummary(events: 0, lastSeq: 0))
        let lines = output.lines
        XCTAssertEqual(lines.count, 2)
        XCTAssertTrue(lines[0].hasPrefix(#"{"kind":"account","id":"\#(id.uuidString.lowercased())""#), lines[0])
        XCTAssertEqual(lines[1], #"{"kind":"end","events":0,"last_seq":0}"#)
    }

    /// `last_seq` is the last event line's, not the user's counter: seqs that jump (a restore
    /// moved them ahead) and a counter past the last event stored.
    func testTheEndLinesLastSeqIsTheLastEventWritten() async throws {
        let id = try await user("gaps@example.com", seqs: [1, 2, 1_000_000_000, 1_000_000_001], lastSeq: 1_000_000_009)
        let output = Output()
        try await app.application.accounts.export(id, pageSize: 3) { output.write($0) }
        XCTAssertEqual(output.lines.last, #"{"kind":"end","events":4,"last_seq":1000000001}"#)
    }

    /// Interrupted before a page (a session revoked, the user deleted) or failing to write
    /// one (the client gone): what was written has no end line, and the lease is let go.
    func testAnExportCutMidwayHasNoEndLine() async throws {
        let id = try await user("cut@example.com", seqs: Array(1...20))
        let accounts = app.application.accounts
        final class Counter: Sendable {
            let value = Mutex(0)
            func next() -> Int {
                value.withLock { count in
                    count += 1; return count
                }
            }
        }
        let asked = Counter()
        let interrupted = Output()
        do {
            try await accounts.run(
                try await accounts.beginExport(id), pageSize: 5,
                proceed: { asked.next() <= 2 }, write: { interrupted.write($0) })
            XCTFail("an interrupted export ended")
        } catch Accounts.ExportError.interrupted {}
        XCTAssertEqual(interrupted.lines.count, 11, "the account and two pages")
        XCTAssertFalse(interrupted.lines.contains { $0.contains(#""kind":"end""#) }, "\(interrupted.lines)")

        struct Gone: Error {}
        let failing = Output()
        do {
            try await accounts.export(id, pageSize: 5) { bytes in
                if failing.writes == 3 { throw Gone() }
                failing.write(bytes)
            }
            XCTFail("an export whose write failed ended")
        } catch is Gone {}
        XCTAssertEqual(failing.lines.count, 11)
        XCTAssertFalse(failing.lines.contains { $0.contains(#""kind":"end""#) }, "\(failing.lines)")

        // The user deleted while the export runs: its next page finds no lease.
        let deleted = Output()
        do {
            try await accounts.export(id, pageSize: 5) { bytes in
                deleted.write(bytes)
                if deleted.writes == 2 { _ = try await accounts.delete(id) }
            }
            XCTFail("an export of a deleted user ended")
        } catch Accounts.ExportError.interrupted {}
        XCTAssertEqual(deleted.lines.count, 6)
        XCTAssertFalse(deleted.lines.contains { $0.contains(#""kind":"end""#) }, "\(deleted.lines)")
        XCTAssertEqual(try owner.query("select count(*) from account_exports")[0].decode(Int.self, column: 0), 0)
    }

    /// Through `GET /sync/v1/export` the body's last line is the end line.
    func testTheRoutesSendTheEndLineLast() async throws {
        _ = try await user("route@example.com", seqs: Array(1...300))
        let token = try await app.token("route@example.com")
        let answer = try await app.request("GET", "/sync/v1/export", bearer: token)
        XCTAssertEqual(answer.status, 200)
        let lines = answer.text.split(separator: "\n")
        XCTAssertEqual(lines.count, 302)
        XCTAssertEqual(lines.last, #"{"kind":"end","events":300,"last_seq":300}"#)
        XCTAssertTrue(answer.text.hasSuffix("}\n"))
    }
}
