import Foundation
import TestSupport
import XCTest

@testable import TrunkSyncClient

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

    /// A client of `proxy` on `storage`, signed in as `email` with a recorded event not sent
    /// yet and a confirmation code asked for: the code.
    func readyToDelete(
        _ server: SyncServer, _ proxy: HoldingProxy, _ storage: URL, _ email: String,
        _ configure: (inout TrunkSyncClient.Configuration) -> Void = { _ in }
    ) async throws -> (TrunkSyncClient, String) {
        let client = try makeClient(via: proxy, storage: storage, configure)
        try await signIn(client, server, as: email)
        _ = try await client.record(type: "note", payload: ["text": "pushed"])
        _ = try await client.sync { _ in }
        _ = try await client.record(type: "note", payload: ["text": "not sent"])
        try await client.reauthenticate()
        return (client, try await confirmationCode(server, email))
    }

    /// The folder `client` keeps for `user` under `storage`, and the deletion marker beside it.
    func userFiles(_ storage: URL, _ user: UUID) throws -> (folder: String, marker: String, session: String) {
        let serverDirectory = try XCTUnwrap(
            try FileManager.default.contentsOfDirectory(at: storage, includingPropertiesForKeys: nil).first)
        let users = serverDirectory.appendingPathComponent("users")
        let id = user.uuidString.lowercased()
        return (
            users.appendingPathComponent(id).path, users.appendingPathComponent(id + ".cleanup").path,
            serverDirectory.appendingPathComponent("session.json").path
        )
    }

    /// The deletion's answer never comes (the request times out; the server deletes after):
    /// not claimed done, but signed out and nothing of the user left here, unsent events
    /// included. (It threw `.network`, still signed in, everything kept.)
    func testADeletionWhoseAnswerIsLostSignsOutAndRemovesTheDataHere() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let email = "lost-answer@example.com"
        let storage = try makeStorage()
        let (client, code) = try await readyToDelete(server, proxy, storage, email) { $0.requestTimeout = 2 }
        let user = try XCTUnwrap(client.currentUser)
        let token = try await client.accessToken()

        try proxy.hold("/sync/v1/account")
        do {
            try await client.deleteAccount(code: code)
            XCTFail("a deletion without an answer was claimed")
        } catch TrunkSyncError.outcomeUnknown(let reason) {
            XCTAssertTrue(reason.contains("may or may not be deleted"), reason)
        }
        XCTAssertTrue(proxy.arrived(timeout: 1), "the deletion went out")
        try proxy.release()
        XCTAssertFalse(client.isSignedIn)
        try await assertEqual(await client.pendingCount, 0)
        let files = try userFiles(storage, user.id)
        for path in [files.folder, files.marker, files.session] {
            XCTAssertFalse(FileManager.default.fileExists(atPath: path), "\(path) is left")
        }
        // The session was revoked (or the account deleted by the held request): dead either way.
        let answer = try await rawRequest("GET", server.url.appendingPathComponent("sync/v1/events"), token: token)
        XCTAssertEqual(answer.status, 401, answer.body)
        await client.close()
    }

    /// The server cannot be reached at all (connection refused: the request never went
    /// out): `.network`, nothing changed here or there, still signed in with the unsent
    /// event. (It was taken for a lost answer: signed out, the unsent event deleted, the
    /// account still there.)
    func testADeletionThatCannotReachTheServerChangesNothing() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let email = "unreachable@example.com"
        let storage = try makeStorage()
        let (client, code) = try await readyToDelete(server, proxy, storage, email)
        proxy.stop()
        do {
            try await client.deleteAccount(code: code)
            XCTFail("deleted without a server")
        } catch TrunkSyncError.network(_) {}
        XCTAssertTrue(client.isSignedIn)
        try await assertEqual(await client.pendingCount, 1, "the unsent event is kept")
        XCTAssertEqual(try server.rows("select count(*)::text from users")[0][0], "1")
    }

    /// A gateway answers `502` for a deletion the server did (its answer lost between them),
    /// and removing the user's folder fails here: `.outcomeUnknown`, signed out; the next
    /// open of the storage removes the folder, and does not sign the user in. (It threw
    /// `.server(502)` and kept session, outbox and cursor.)
    func testADeletionAnswered502AndALocalRemovalThatFailsIsFinishedAtTheNextOpen() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let email = "gateway@example.com"
        let storage = try makeStorage()
        let (client, code) = try await readyToDelete(server, proxy, storage, email)
        let user = try XCTUnwrap(client.currentUser)
        let files = try userFiles(storage, user.id)
        await client.setRemoveItem { url in
            guard url.path != files.folder else { throw StorageFailure(message: "refused for the test") }
            try FileSystem.remove(url)
        }

        try proxy.loseAnswer("/sync/v1/account", status: 502)
        do {
            try await client.deleteAccount(code: code)
            XCTFail("a deletion answered 502 was claimed")
        } catch TrunkSyncError.outcomeUnknown(let reason) {
            XCTAssertTrue(reason.contains("removed at the next open"), reason)
        }
        XCTAssertEqual(try server.rows("select count(*)::text from users")[0][0], "0", "the server deleted it")
        XCTAssertFalse(client.isSignedIn)
        XCTAssertFalse(FileManager.default.fileExists(atPath: files.session))
        XCTAssertTrue(FileManager.default.fileExists(atPath: files.folder), "the removal failed")
        XCTAssertTrue(FileManager.default.fileExists(atPath: files.marker))
        await client.close()

        let reopened = try TrunkSyncClient(url: proxy.url, storageDirectory: storage)
        XCTAssertFalse(reopened.isSignedIn)
        XCTAssertFalse(FileManager.default.fileExists(atPath: files.folder), "the next open removed the folder")
        XCTAssertFalse(FileManager.default.fileExists(atPath: files.marker))
        await reopened.close()
    }

    /// A crash (or a failure) after the marker was written but before the session went: the
    /// next open neither signs that user in nor keeps their data.
    func testAPendingDeletionFoundAtOpenIsFinishedBeforeSigningIn() async throws {
        let server = try startServer()
        let storage = try makeStorage()
        var client = try makeClient(server, storage: storage)
        try await signIn(client, server, as: "pending@example.com")
        let user = try XCTUnwrap(client.currentUser)
        _ = try await client.record(type: "note", payload: ["text": "kept?"])
        await client.close()
        let files = try userFiles(storage, user.id)
        try Data("delete".utf8).write(to: URL(fileURLWithPath: files.marker))

        client = try makeClient(server, storage: storage)
        XCTAssertFalse(client.isSignedIn)
        for path in [files.folder, files.marker, files.session] {
            XCTAssertFalse(FileManager.default.fileExists(atPath: path), "\(path) is left")
        }
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
        var lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n")
        XCTAssertEqual(lines.count, 1202)
        let account = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        XCTAssertEqual(account["kind"] as? String, "account")
        XCTAssertEqual(account["email"] as? String, "copy@example.com")
        XCTAssertEqual(lines.removeLast(), #"{"kind":"end","events":1200,"last_seq":1200}"#)
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
            try String(contentsOf: file, encoding: .utf8).split(separator: "\n").count, 1202, "left as it was")
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

    /// An export answered `200` with a page of something in the way (a captive portal, a
    /// proxy set up wrong), not NDJSON: refused, the file at the destination (an earlier
    /// copy) left as it was. (The page was put in its place, and the call said it exported.)
    func testAnExportAnsweredWithAPageInTheWayLeavesTheFile() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let client = try makeClient(via: proxy, storage: try makeStorage())
        try await signIn(client, server, as: "portal@example.com")
        let file = try makeStorage().appendingPathComponent("export.ndjson")
        try Data("an earlier copy".utf8).write(to: file)
        try proxy.answerInstead("/sync/v1/export", status: 200)
        do {
            try await client.exportData(to: file)
            XCTFail("a page in the way was taken for the export")
        } catch TrunkSyncError.invalidResponse(let reason) {
            XCTAssertTrue(reason.contains("text/html"), reason)
        }
        XCTAssertEqual(try String(contentsOf: file, encoding: .utf8), "an earlier copy")
        try await client.exportData(to: file)
        XCTAssertTrue(try String(contentsOf: file, encoding: .utf8).hasPrefix(#"{"kind":"account""#))
    }

    /// An export answered with a proxy's `401` page (HTML, not the server's JSON) spends no
    /// refresh: it is a failure (`http_401`) and the file is left as it was; the server's own
    /// `401` still refreshes once and the export goes through.
    func testAnExportAnsweredWithAProxys401PageSpendsNoRefresh() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let events = EventLogBox()
        let client = try makeClient(via: proxy, storage: try makeStorage(), events: events)
        try await signIn(client, server, as: "export-401-page@example.com")
        let file = try makeStorage().appendingPathComponent("export.ndjson")
        try Data("an earlier copy".utf8).write(to: file)
        try proxy.answerInstead("/sync/v1/export", status: 401)
        do {
            try await client.exportData(to: file)
            XCTFail("a proxy's 401 page was taken for the export")
        } catch TrunkSyncError.server(let error) {
            XCTAssertEqual(error.code, "http_401")
        }
        XCTAssertEqual(events.refreshes, [], "no refresh spent on a proxy's 401 page")
        XCTAssertEqual(try String(contentsOf: file, encoding: .utf8), "an earlier copy")
        try await client.exportData(to: file)
        XCTAssertTrue(try String(contentsOf: file, encoding: .utf8).hasPrefix(#"{"kind":"account""#))
    }

    /// An export whose end was lost on the way where the break did not show (a proxy that
    /// passes on what it got without a length and closes the connection: a close-delimited
    /// body) is refused, and the file at the destination (an earlier copy) left as it was; so
    /// is one whose end line does not count the event lines that came, or with a line after
    /// its end line. (The cut copy was put in place, and the call said it exported.)
    func testAnExportWithoutAMatchingEndLineIsRefusedAndLeavesTheFile() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let client = try makeClient(via: proxy, storage: try makeStorage())
        try await signIn(client, server, as: "end@example.com")
        for index in 0..<30 { _ = try await client.record(type: "note", payload: ["index": index]) }
        _ = try await client.sync { _ in }
        let folder = try makeStorage()
        let file = folder.appendingPathComponent("export.ndjson")
        try Data("an earlier copy".utf8).write(to: file)
        for (how, reason) in [
            ("drop-last", "no end line: 30 event line(s) came"),
            ("drop-second", "the end line counts 30 event line(s), but 29 came"),
            ("repeat-last", "goes on after its end line"),
        ] {
            try proxy.rewriteAnswer("/sync/v1/export", how)
            do {
                try await client.exportData(to: file)
                XCTFail("\(how): taken for a whole export")
            } catch TrunkSyncError.incompleteExport(let message) {
                XCTAssertTrue(message.contains(reason), "\(how): \(message)")
                XCTAssertTrue(message.contains("\(file.path) is as it was"), message)
            }
            XCTAssertEqual(try String(contentsOf: file, encoding: .utf8), "an earlier copy", how)
            XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: folder.path), ["export.ndjson"], how)
        }
        // The same proxy passing the body on as it is: whole.
        try await client.exportData(to: file)
        let lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n")
        XCTAssertEqual(lines.count, 32)
        XCTAssertEqual(lines.last, #"{"kind":"end","events":30,"last_seq":30}"#)
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
