import Foundation
import TestSupport
import TrunkSyncClient
import XCTest

/// Deleting the account and taking a copy of it from the client library, against the real
/// server.
final class ClientAccountTests: ClientTestCase {
    /// The confirmation code the log mailer printed for `email` the `number`-th time.
    func confirmationCode(_ server: SyncServer, _ email: String, number: Int = 1) async throws -> String {
        let needle = "confirmation code for \(email): "
        let arrived = await waitUntil(10) { server.logs.components(separatedBy: needle).count > number }
        XCTAssertTrue(arrived, "no confirmation code for \(email)")
        let line = try XCTUnwrap(
            server.logs.split(separator: "\n").filter { $0.contains(needle) }.dropFirst(number - 1).first)
        return String(try XCTUnwrap(line.firstMatch(of: /: (\d{6})\b/)).1)
    }

    func testDeleteAccountTakesTheMailedCodeAndRemovesTheUserHereAndOnEveryDevice() async throws {
        let server = try startServer(["TRUNK_SYNC_OTP_RESEND_INTERVAL": "0"])
        let email = "goodbye@example.com"
        let storage = try makeStorage()
        let client = try makeClient(server, storage: storage)
        let otherDevice = try makeClient(server, storage: try makeStorage()) { $0.retry = Self.quickRetry }
        try await signIn(client, server, as: email)
        try await signIn(otherDevice, server, as: email)
        let user = try XCTUnwrap(client.currentUser)
        for index in 0..<3 { _ = try await client.record(type: "note", payload: ["index": index]) }
        _ = try await client.sync { _ in }
        _ = try await client.record(type: "note", payload: ["index": 3])  // not sent

        try await client.reauthenticate()
        let code = try await confirmationCode(server, email)
        do {
            try await client.deleteAccount(code: code == "000000" ? "111111" : "000000")
            XCTFail("a wrong code deleted the account")
        } catch TrunkSyncError.invalidCode {}
        XCTAssertTrue(client.isSignedIn)
        XCTAssertEqual(try server.rows("select count(*)::text from events")[0][0], "3", "nothing deleted")

        try await client.deleteAccount(code: code)
        XCTAssertFalse(client.isSignedIn)
        XCTAssertEqual(try server.rows("select count(*)::text from users")[0][0], "0")
        XCTAssertEqual(try server.rows("select count(*)::text from events")[0][0], "0")
        let serverDirectory = try XCTUnwrap(
            try FileManager.default.contentsOfDirectory(at: storage, includingPropertiesForKeys: nil).first)
        XCTAssertFalse(
            FileManager.default.fileExists(
                atPath: serverDirectory.appendingPathComponent("users/\(user.id.uuidString.lowercased())").path),
            "the user's outbox, quarantine and cursor are gone from this device")
        XCTAssertFalse(
            FileManager.default.fileExists(atPath: serverDirectory.appendingPathComponent("session.json").path))
        do {
            try await client.reauthenticate()
            XCTFail("signed out")
        } catch TrunkSyncError.notSignedIn {}

        // The other device finds its session ended.
        do {
            _ = try await otherDevice.sync { _ in }
            XCTFail("the other device still syncs")
        } catch TrunkSyncError.sessionExpired {}
        XCTAssertFalse(otherDevice.isSignedIn)
    }

    func testExportDataWritesTheWholeCopyToAFile() async throws {
        let server = try startServer()
        let client = try makeClient(server, storage: try makeStorage())
        try await signIn(client, server, as: "copy@example.com")
        for index in 0..<1200 { _ = try await client.record(type: "note", payload: ["index": index]) }
        _ = try await client.sync { _ in }
        let file = try makeStorage().appendingPathComponent("export.ndjson")
        try Data("an older file".utf8).write(to: file)

        try await client.exportData(to: file)
        let lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n")
        XCTAssertEqual(lines.count, 1201)
        let account = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        XCTAssertEqual(account["kind"] as? String, "account")
        XCTAssertEqual(account["email"] as? String, "copy@example.com")
        let seqs = try lines.dropFirst().map { line -> Int in
            let event = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            XCTAssertEqual(event["kind"] as? String, "event")
            return try XCTUnwrap(event["seq"] as? Int)
        }
        XCTAssertEqual(seqs, Array(1...1200))

        await client.close()
        let signedOut = try makeClient(server, storage: try makeStorage())
        do {
            try await signedOut.exportData(to: file)
            XCTFail("exported without a session")
        } catch TrunkSyncError.notSignedIn {}
        XCTAssertEqual(
            try String(contentsOf: file, encoding: .utf8).split(separator: "\n").count, 1201, "left as it was")
    }

    /// A directory given as the destination (say the app's documents folder, meant as "put it
    /// there") is refused, and stays as it was with everything in it: it was removed, with
    /// all it held, and the export put in its place.
    func testAnExportToADirectoryLeavesTheDirectory() async throws {
        let server = try startServer()
        let client = try makeClient(server, storage: try makeStorage())
        try await signIn(client, server, as: "folder@example.com")
        let folder = try makeStorage().appendingPathComponent("Documents", isDirectory: true)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let kept = folder.appendingPathComponent("the user's own file.txt")
        try Data("mine".utf8).write(to: kept)
        do {
            try await client.exportData(to: folder)
            XCTFail("exported over a directory")
        } catch TrunkSyncError.storage(let reason) {
            XCTAssertTrue(reason.contains("is a directory"), reason)
        }
        XCTAssertEqual(try String(contentsOf: kept, encoding: .utf8), "mine")
    }

    /// An export cut short on the server (the account deleted while it streams) is no file:
    /// the download fails and the destination stays as it was.
    func testAnExportCutShortLeavesNoFile() async throws {
        let server = try startServer()
        let client = try makeClient(server, storage: try makeStorage())
        try await signIn(client, server, as: "cut@example.com")
        let user = try userID(server, "cut@example.com")
        let owner = try server.connect()
        try owner.query(
            """
            insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
            select $1::uuid, n, 'note', jsonb_build_object('n', n), gen_random_uuid(), now(), now() + n * interval '1 millisecond'
            from generate_series(1, 200000) n
            """, user)
        try owner.query("update users set last_seq = 200000 where id = $1::uuid", user)
        let file = try makeStorage().appendingPathComponent("export.ndjson")
        try Data("before".utf8).write(to: file)

        let export = Task { try await client.exportData(to: file) }
        let started = await waitUntil(10) {
            (try? server.rows("select count(*)::text from account_exports"))?.first?.first == "1"
        }
        XCTAssertTrue(started)
        try owner.query("delete from users where id = $1::uuid", user)
        do {
            try await export.value
            XCTFail("an incomplete export was taken for a whole one")
        } catch TrunkSyncError.network(_) {}
        XCTAssertEqual(try String(contentsOf: file, encoding: .utf8), "before")
    }
}
