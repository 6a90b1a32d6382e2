import Foundation
import TestSupport
import XCTest

@testable import TrunkSyncClient

/// Sign-in, tokens, sign-out and users, against the real server.
final class SessionTests: ClientTestCase {
    /// The code comes by real mail (an SMTP server receives it); the session outlives the
    /// client; a second client cannot open the same storage meanwhile.
    func testSignInWithTheMailedCodeLastsAcrossRestarts() async throws {
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startServer([
            "TRUNK_SYNC_MAILER": "smtp", "TRUNK_SYNC_SMTP_URL": "smtp://127.0.0.1:\(sink.port)?tls=none",
            "TRUNK_SYNC_MAIL_FROM": "Trunk <no-reply@trunk.example>",
        ])
        let storage = try makeStorage()
        var client = try makeClient(server, storage: storage)
        XCTAssertFalse(client.isSignedIn)
        try await client.sendCode(to: "mail@example.com")
        let arrived = await waitUntil(20) { ((try? sink.received()) ?? []).count == 1 }
        XCTAssertTrue(arrived, "no mail arrived")
        let mail = try XCTUnwrap(try sink.received().first)
        XCTAssertEqual(mail.recipients, ["mail@example.com"])
        let code = String(try XCTUnwrap(mail.body?.firstMatch(of: /\b(\d{6})\b/)).1)

        let wrong = String((Int(code)! + 1) % 1_000_000).leftPadded(to: 6)
        do {
            try await client.verify(email: "mail@example.com", code: wrong)
            XCTFail("a wrong code signed in")
        } catch TrunkSyncError.invalidCode {}
        XCTAssertFalse(client.isSignedIn)

        try await client.verify(email: "mail@example.com", code: code)
        XCTAssertTrue(client.isSignedIn)
        let user = try XCTUnwrap(client.currentUser)
        XCTAssertEqual(user.email, "mail@example.com")
        XCTAssertEqual(user.id.uuidString.lowercased(), try userID(server, "mail@example.com"))

        XCTAssertThrowsError(try TrunkSyncClient(url: server.url, storageDirectory: storage)) { error in
            guard case TrunkSyncError.storageInUse(_) = error else { return XCTFail("\(error)") }
        }
        await client.close()

        client = try makeClient(server, storage: storage)
        XCTAssertTrue(client.isSignedIn, "signed in after a restart")
        XCTAssertEqual(client.currentUser, user)
        let token = try await client.accessToken()
        let answer = try await rawRequest("GET", server.url.appendingPathComponent("auth/v1/user"), token: token)
        XCTAssertEqual(answer.status, 200, answer.body)
        XCTAssertTrue(answer.body.contains("mail@example.com"))
    }

    /// The example signs in with the code typed on its stdin, records and syncs.
    func testTheExampleSignsInWithTheCodeFromStdinAndSyncs() async throws {
        let server = try startServer()
        let storage = try makeStorage()
        let base = ["--url", server.url.absoluteString, "--storage", storage.path]
        let signIn = try ExampleProcess(exampleBinary(), base + ["sign-in", "cli@example.com"])
        XCTAssertNotNil(
            signIn.stdout.waitForLines(containing: "code sent to cli@example.com", timeout: 20), signIn.output)
        signIn.write(try server.code(for: "cli@example.com") + "\n")
        XCTAssertEqual(signIn.waitForExit(timeout: 20), 0, signIn.output)
        XCTAssertEqual(signIn.stdout.lines(containing: "signed in as cli@example.com").count, 1, signIn.output)

        let record = try ExampleProcess(exampleBinary(), base + ["record", "cli", #"{"text":"from the shell"}"#])
        XCTAssertEqual(record.waitForExit(timeout: 20), 0, record.output)
        let id = try XCTUnwrap(record.stdout.lines(containing: "recorded ").first?.dropFirst("recorded ".count))
        let sync = try ExampleProcess(exampleBinary(), base + ["sync"])
        XCTAssertEqual(sync.waitForExit(timeout: 20), 0, sync.output)
        XCTAssertEqual(sync.stdout.lines(containing: "pushed 1 duplicates 0 pulled 1").count, 1, sync.output)
        XCTAssertEqual(
            sync.stdout.lines(containing: "event 1 \(id) cli {\"text\": \"from the shell\"}").count, 1, sync.output)
    }

    /// Before expiry the token is refreshed once for any number of concurrent calls, and the
    /// new refresh token is on disk; a 401 refreshes once and the request goes through.
    func testTokensRefreshBeforeExpiryOnceForConcurrentCallsAndOnA401() async throws {
        let server = try startServer()
        let storage = try makeStorage()
        let clock = TestClock()
        let events = EventLogBox()
        var client = try makeClient(server, storage: storage, events: events) { $0.now = { clock.now() } }
        try await signIn(client, server, as: "tokens@example.com")
        let sessionFile = try XCTUnwrap(
            FileManager.default.enumerator(at: storage, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL }
                .first { $0.lastPathComponent == "session.json" })
        func storedSession() throws -> [String: Any] {
            try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(contentsOf: sessionFile)) as? [String: Any])
        }
        _ = try await client.accessToken()
        let firstRefreshToken = try XCTUnwrap(try storedSession()["refresh_token"] as? String)
        XCTAssertEqual(events.refreshes, [], "a fresh token is used as it is")

        clock.advance(by: 3600 - 30)  // within the refresh margin (60 s) of the 1-hour token
        let signedIn = client
        let tokens = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<8 { group.addTask { try await signedIn.accessToken() } }
            return try await group.reduce(into: [String]()) { $0.append($1) }
        }
        XCTAssertEqual(Set(tokens).count, 1, "every caller got the one new token")
        XCTAssertEqual(events.refreshes, [true], "one proactive refresh")
        XCTAssertEqual(events.requests("POST", "/auth/v1/token").count, 1)
        let stored = try storedSession()
        XCTAssertEqual(stored["access_token"] as? String, tokens.first)
        XCTAssertNotEqual(stored["refresh_token"] as? String, firstRefreshToken, "the rotated refresh token is stored")

        // A token the server refuses (401): one refresh, then the push goes through.
        await client.close()
        var session = try storedSession()
        session["access_token"] = "not-a-token"
        try JSONSerialization.data(withJSONObject: session).write(to: sessionFile)
        let retried = EventLogBox()
        client = try makeClient(server, storage: storage, events: retried)
        _ = try await client.record(type: "note", payload: ["after": "401"])
        try await assertEqual(try await client.push().pushed, 1)
        XCTAssertEqual(retried.refreshes, [false], "one refresh after the 401")
        XCTAssertEqual(retried.requests("POST", "/sync/v1/events").count, 2)
    }

    /// A session revoked elsewhere ends in `.sessionExpired` at the next refresh; the user
    /// is signed out and the outbox kept for their next sign-in.
    func testARevokedSessionSignsOutAndKeepsTheOutbox() async throws {
        let server = try startServer()
        let storage = try makeStorage()
        let clock = TestClock()
        let client = try makeClient(server, storage: storage) { $0.now = { clock.now() } }
        try await signIn(client, server, as: "revoked@example.com")
        let token = try await client.accessToken()
        let logout = try await rawRequest(
            "POST", URL(string: "\(server.url.absoluteString)/auth/v1/logout?scope=local")!, token: token)
        XCTAssertEqual(logout.status, 204)
        _ = try await client.record(type: "note", payload: ["kept": true])
        clock.advance(by: 3590)
        do {
            _ = try await client.push()
            XCTFail("pushed with a revoked session")
        } catch TrunkSyncError.sessionExpired {}
        XCTAssertFalse(client.isSignedIn)
        try await signIn(client, server, as: "revoked@example.com")
        try await assertEqual(await client.pendingCount, 1)
        try await assertEqual(try await client.push().pushed, 1)
    }

    /// Sign-out revokes the session (its access token is refused by /auth/v1/user) and
    /// removes session and cursor; unsent events stay for the user's next sign-in.
    func testSignOutRemovesTheSessionAndKeepsUnsentEvents() async throws {
        let email = "signout@example.com"
        let server = try startServer()
        let storage = try makeStorage()
        let client = try makeClient(server, storage: storage) { $0.retry.maxAttempts = 2 }
        try await signIn(client, server, as: email)
        _ = try await client.record(type: "note", payload: ["n": 1])
        try await assertEqual(try await client.sync { _ in }.pulled, 1)
        try await assertEqual(await client.cursor, 1)
        let token = try await client.accessToken()
        let userURL = server.url.appendingPathComponent("auth/v1/user")
        try await assertEqual(try await rawRequest("GET", userURL, token: token).status, 200)

        let result = try await client.signOut()
        XCTAssertTrue(result.serverSessionRevoked)
        XCTAssertEqual(result.unsentEvents, 0)
        let refused = try await rawRequest("GET", userURL, token: token)
        XCTAssertTrue([401, 403].contains(refused.status), "\(refused)")
        XCTAssertFalse(client.isSignedIn)
        XCTAssertNil(client.currentUser)
        try await assertEqual(await client.cursor, 0)
        let files =
            FileManager.default.enumerator(at: storage, includingPropertiesForKeys: nil)?
            .compactMap { ($0 as? URL)?.lastPathComponent } ?? []
        XCTAssertFalse(files.contains("session.json"))
        XCTAssertFalse(files.contains("cursor.json"))
        do {
            _ = try await client.record(type: "note", payload: ["n": 2])
            XCTFail("recorded while signed out")
        } catch TrunkSyncError.notSignedIn {}

        // Signed out while the server is down: the unsent events are kept and reported.
        try await signIn(client, server, as: email)
        try await assertEqual(await client.cursor, 0, "the cursor was removed")
        _ = try await client.record(type: "note", payload: ["n": 2])
        _ = try await client.record(type: "note", payload: ["n": 3])
        server.kill()
        let offline = try await client.signOut()
        XCTAssertEqual(offline.unsentEvents, 2)
        XCTAssertFalse(offline.serverSessionRevoked)
        XCTAssertFalse(client.isSignedIn)

        try server.restart()
        try await signIn(client, server, as: email)
        try await assertEqual(await client.pendingCount, 2, "the same user's unsent events are back")
        let report = try await client.sync { _ in }
        XCTAssertEqual(report.pushed, 2)
        XCTAssertEqual(report.pulled, 3, "from seq 0 again: the cursor was removed")
        XCTAssertEqual(try serverEvents(server, email).count, 3)

        // Discarding deletes the user's outbox on this device.
        _ = try await client.record(type: "note", payload: ["n": 4])
        server.kill()
        let discarded = try await client.signOut(discardingUnsentEvents: true)
        XCTAssertEqual(discarded.unsentEvents, 1)
        try server.restart()
        try await signIn(client, server, as: email)
        try await assertEqual(await client.pendingCount, 0)
    }

    /// A client on `storage` signed in as `email`, with one event pushed and pulled (its
    /// cursor stored), and the user's folder and its clean-up marker.
    func signedInWithACursor(_ server: SyncServer, _ storage: URL, _ email: String) async throws
        -> (client: TrunkSyncClient, folder: URL, marker: URL)
    {
        let client = try makeClient(server, storage: storage)
        try await signIn(client, server, as: email)
        _ = try await client.record(type: "note", payload: ["n": 1])
        try await assertEqual(try await client.sync { _ in }.pulled, 1)
        let serverDirectory = try XCTUnwrap(
            try FileManager.default.contentsOfDirectory(at: storage, includingPropertiesForKeys: nil).first)
        let users = serverDirectory.appendingPathComponent("users")
        let id = try XCTUnwrap(client.currentUser).id.uuidString.lowercased()
        return (client, users.appendingPathComponent(id), users.appendingPathComponent(id + ".cleanup"))
    }

    /// The user's outbox holds a record this version cannot read (a newer version of the app
    /// wrote it): the client opens signed in all the same, calls that need the outbox throw
    /// `.storage`, and `signOut` signs out, forgets the cursor and keeps the outbox. (Opening
    /// threw `.storage`: no client, so no way to sign out.)
    func testSignOutWorksWhenTheOutboxCannotBeRead() async throws {
        let server = try startServer()
        let storage = try makeStorage()
        var (client, folder, marker) = try await signedInWithACursor(server, storage, "unreadable@example.com")
        _ = try await client.record(type: "note", payload: ["n": 2])
        await client.close()
        let outbox = try FileHandle(forWritingTo: folder.appendingPathComponent("outbox.log"))
        outbox.seekToEndOfFile()
        outbox.write(Data(FramedLog.frame(Array(#"{"op":"from_a_later_version"}"#.utf8))))
        try outbox.close()

        client = try makeClient(server, storage: storage)
        XCTAssertTrue(client.isSignedIn)
        do {
            _ = try await client.record(type: "note", payload: ["n": 3])
            XCTFail("recorded into an outbox it cannot read")
        } catch TrunkSyncError.storage(let reason) {
            XCTAssertTrue(reason.contains("unreadable record"), reason)
        }
        let result = try await client.signOut()
        XCTAssertNil(result.unsentEvents, "not known")
        XCTAssertTrue(result.serverSessionRevoked)
        XCTAssertFalse(client.isSignedIn)
        XCTAssertFalse(FileManager.default.fileExists(atPath: folder.appendingPathComponent("cursor.json").path))
        XCTAssertTrue(FileManager.default.fileExists(atPath: folder.appendingPathComponent("outbox.log").path))
        XCTAssertFalse(FileManager.default.fileExists(atPath: marker.path))
        await client.close()
        client = try makeClient(server, storage: storage)
        XCTAssertFalse(client.isSignedIn, "signed out for good")
    }

    /// Removing the cursor fails at sign-out: signed out all the same, and the next open
    /// removes it (the same user's next sign-in then pulls from the start, as after any
    /// sign-out). (signOut threw `.storage` and stayed signed in.)
    func testACursorSignOutCouldNotRemoveGoesAtTheNextOpen() async throws {
        let email = "cursor-stays@example.com"
        let server = try startServer()
        let storage = try makeStorage()
        var (client, folder, marker) = try await signedInWithACursor(server, storage, email)
        let cursorFile = folder.appendingPathComponent("cursor.json")
        await client.setRemoveItem { url in
            guard url.path != cursorFile.path else { throw StorageFailure(message: "refused for the test") }
            try FileSystem.remove(url)
        }

        let result = try await client.signOut()
        XCTAssertEqual(result.unsentEvents, 0)
        XCTAssertFalse(client.isSignedIn)
        XCTAssertTrue(FileManager.default.fileExists(atPath: cursorFile.path), "the removal failed")
        XCTAssertTrue(FileManager.default.fileExists(atPath: marker.path))
        await client.close()

        client = try makeClient(server, storage: storage)
        XCTAssertFalse(client.isSignedIn)
        XCTAssertFalse(FileManager.default.fileExists(atPath: cursorFile.path), "the next open removed it")
        XCTAssertFalse(FileManager.default.fileExists(atPath: marker.path))
        try await signIn(client, server, as: email)
        try await assertEqual(try await client.sync { _ in }.pulled, 1, "from the start")
    }

    /// A refresh answered `404` or `403` with a page that is not the server's (a proxy set up
    /// wrong while the server is redeployed, a captive portal) is a failure, not the end of
    /// the session: the user stays signed in and the next refresh goes through. (It signed
    /// the user out.)
    func testARefreshRefusedByAPageInTheWayKeepsTheSession() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let client = try makeClient(via: proxy, storage: try makeStorage())
        try await signIn(client, server, as: "portal@example.com")
        for status in [404, 403] {
            try proxy.answerInstead("/auth/v1/token", status: status)
            do {
                try await client.refreshSession()
                XCTFail("a page in the way refreshed the session")
            } catch TrunkSyncError.server(let error) {
                XCTAssertEqual(error.status, status)
            }
            XCTAssertTrue(client.isSignedIn, "signed out by a page that is not the server's")
        }
        try await client.refreshSession()
        _ = try await client.record(type: "note", payload: ["n": 1])
        try await assertEqual(try await client.push().pushed, 1)
        await client.close()
    }

    /// The server rotates the refresh token but its answer arrives mangled (a `200` that is
    /// not a session: a proxy in the way): the refresh asks again at once, within the
    /// server's reuse interval, and gets another token of the same session. (It threw
    /// `.invalidResponse` keeping the old token, whose next use, later, revoked the session.)
    func testARefreshWhoseAnswerIsMangledAsksAgainAtOnce() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let events = EventLogBox()
        let client = try makeClient(via: proxy, storage: try makeStorage(), events: events)
        try await signIn(client, server, as: "mangled@example.com")
        try proxy.loseAnswer("/auth/v1/token", status: 200)
        try await client.refreshSession()
        XCTAssertEqual(events.requests("POST", "/auth/v1/token").count, 2, "asked again once")
        XCTAssertTrue(client.isSignedIn)
        try await client.refreshSession()
        _ = try await client.record(type: "note", payload: ["n": 1])
        try await assertEqual(try await client.push().pushed, 1)
    }

    /// Signing out while a push waits out a backoff (the server is down) ends that wait:
    /// `signOut` returns without waiting for the push's remaining tries, which here take
    /// hours (up to 1000 tries, waits growing to 10 minutes), and the events stay in the
    /// outbox for the user's next sign-in. Twice: the push's own retries, then the retries
    /// of the token refresh it started (its token about to expire); signOut's own push and
    /// logout then refresh with their one quick retry, not with the 1000.
    func testSignOutEndsTheBackoffOfAPushInProgress() async throws {
        let email = "backoff-signout@example.com"
        let server = try startServer()
        let events = EventLogBox()
        let clock = TestClock()
        let client = try makeClient(server, storage: try makeStorage(), events: events) {
            $0.retry = TrunkSyncClient.RetryPolicy(maxAttempts: 1000, baseDelay: 0.05, maxDelay: 600)
            $0.now = { clock.now() }
        }
        var stored = 0
        for (round, retried) in ["/sync/v1/events", "/auth/v1/token"].enumerated() {
            try await signIn(client, server, as: email)
            let recorded = [
                try await client.record(type: "note", payload: ["round": round, "n": 1]),
                try await client.record(type: "note", payload: ["round": round, "n": 2]),
            ]
            if retried == "/auth/v1/token" { clock.advance(by: 3600 - 30) }  // within the refresh margin
            server.kill()
            let earlier = events.retries.count
            let pushing = Task { try await client.push() }
            let retrying = await waitUntil(30) { events.retries.dropFirst(earlier).contains { $0.path == retried } }
            XCTAssertTrue(retrying, "\(retried) is not retrying")

            let finished = Counter()
            let signingOut = Task {
                defer { _ = finished.increment() }
                return try await client.signOut()
            }
            let returned = await waitUntil(60) { finished.current == 1 }
            XCTAssertTrue(returned, "signOut waited for the backoff of \(retried)")
            guard returned else { return }
            let result = try await signingOut.value
            XCTAssertEqual(result.unsentEvents, 2)
            XCTAssertFalse(result.serverSessionRevoked)
            XCTAssertFalse(client.isSignedIn)
            do {
                _ = try await pushing.value
                XCTFail("the push went on after the sign-out")
            } catch TrunkSyncError.notSignedIn {}

            try server.restart()
            try await signIn(client, server, as: email)
            try await assertEqual(await client.pendingCount, 2, "kept for the user's next sign-in")
            try await assertEqual(try await client.push().pushed, 2)
            stored += 2
            let onServer = try serverEvents(server, email).map(\.clientID)
            XCTAssertEqual(onServer.count, stored)
            XCTAssertEqual(Array(onServer.suffix(2)), recorded.map { $0.uuidString.lowercased() })
        }
    }

    /// A sign-out answered by a page of something in the way (a proxy's `401` or `403` asking
    /// for its own credentials, a captive portal's `200`) is not the server's revocation:
    /// `serverSessionRevoked` is false, as when the server cannot be reached (the session is
    /// still live there; signed out here all the same). Only the server's own answer (its
    /// `204`, or its JSON `401`/`403`: it no longer knows the session) says revoked. (Any
    /// `2xx`, `401` or `403` said so.)
    func testASignOutAnsweredByAPageInTheWayIsNotARevocation() async throws {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let client = try makeClient(via: proxy, storage: try makeStorage()) { $0.retry.maxAttempts = 1 }
        for status in [401, 403, 200] {
            try await signIn(client, server, as: "signout-page-\(status)@example.com")
            let token = try await client.accessToken()
            try proxy.answerInstead("/auth/v1/logout", status: status)
            let result = try await client.signOut()
            XCTAssertFalse(result.serverSessionRevoked, "a \(status) page")
            XCTAssertFalse(client.isSignedIn)
            let user = try await rawRequest("GET", server.url.appendingPathComponent("auth/v1/user"), token: token)
            XCTAssertEqual(user.status, 200, "the session is still live on the server after a \(status) page")
        }
    }

    /// A token refresh whose answer comes only after the user signed out and signed in
    /// again (a slow connection): that answer is about the session signOut revoked, not the
    /// new one. Before: the refresh's 400 (the old session is revoked) signed the new
    /// session out, its session file removed.
    func testARefreshAnsweredAfterSignOutAndSignInAgainLeavesTheNewSession() async throws {
        let email = "late-refresh@example.com"
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let client = try makeClient(via: proxy, storage: try makeStorage())
        try await signIn(client, server, as: email)
        _ = try await client.record(type: "note", payload: ["n": 1])

        try proxy.hold("/auth/v1/token")
        let refreshing = Task { try await client.refreshSession() }
        XCTAssertTrue(proxy.arrived(timeout: 30), "the refresh")
        let result = try await client.signOut()
        XCTAssertTrue(result.serverSessionRevoked)
        try await signIn(client, server, as: email)
        let newToken = try await client.accessToken()

        try proxy.release()
        do {
            try await refreshing.value
        } catch TrunkSyncError.notSignedIn {
        } catch TrunkSyncError.sessionExpired {}
        XCTAssertTrue(client.isSignedIn, "the late answer signed the new session out")
        try await assertEqual(try await client.accessToken(), newToken)
        _ = try await client.record(type: "note", payload: ["n": 2])
        try await assertEqual(try await client.push().pushed, 1)
        await client.close()
    }

    /// A live loop whose body still runs while the user signs out and in again: when it asks
    /// for its next page the stream ends (`.notSignedIn`), and the page it handed out before
    /// does not become the new sign-in's cursor (signOut removed the cursor, so the next sync
    /// pulls from the start). Before: that page's cursor was stored for the new sign-in, whose
    /// sync then skipped those events, and the stream went on.
    func testALiveLoopFromBeforeASignOutLeavesTheNextSignInsCursor() async throws {
        let email = "live-signout@example.com"
        let server = try startServer()
        let client = try makeClient(server, storage: try makeStorage()) { $0.longPollWait = 1 }
        try await signIn(client, server, as: email)
        for n in 0..<3 { _ = try await client.record(type: "note", payload: ["n": n]) }
        try await assertEqual(try await client.push().pushed, 3)

        let pages = Counter()
        let finished = Counter()
        let (gate, open) = AsyncStream<Void>.makeStream()
        let stream = client.liveEvents()
        let consumer = Task { () -> Error? in
            defer { _ = finished.increment() }
            do {
                for try await _ in stream {
                    _ = pages.increment()
                    for await _ in gate { break }  // the body runs until the test opens it
                }
                return nil
            } catch {
                return error
            }
        }
        let delivered = await waitUntil(30) { pages.current == 1 }
        XCTAssertTrue(delivered, "the live page")
        try await client.signOut()
        try await signIn(client, server, as: email)
        open.yield()
        _ = await waitUntil(30) {
            let cursor = await client.cursor
            return finished.current == 1 || cursor != 0
        }
        consumer.cancel()
        open.finish()
        let error = await consumer.value
        XCTAssertEqual(error as? TrunkSyncError, .notSignedIn, "the stream went on after the sign-out")
        try await assertEqual(await client.cursor, 0)
        let pulled = Collected()
        _ = try await client.sync { await pulled.add($0) }
        try await assertEqual(await pulled.events.count, 3)
    }

    /// Two users on one device: each has their own outbox and cursor; neither sees or
    /// pushes the other's events.
    func testTwoUsersOnOneDeviceStayApart() async throws {
        let server = try startServer()
        let client = try makeClient(server, storage: try makeStorage())
        try await signIn(client, server, as: "ann@example.com")
        let ann1 = try await client.record(type: "ann", payload: ["n": 1])
        let ann2 = try await client.record(type: "ann", payload: ["n": 2])
        try await assertEqual(try await client.sync { _ in }.pulled, 2)
        let ann3 = try await client.record(type: "ann", payload: ["n": 3])  // not synced yet

        try await signIn(client, server, as: "bob@example.com")
        try await assertEqual(await client.pendingCount, 0, "Ann's outbox is not Bob's")
        try await assertEqual(await client.cursor, 0, "nor is her cursor")
        let bob1 = try await client.record(type: "bob", payload: ["n": 1])
        let pulledByBob = Collected()
        let bobReport = try await client.sync { events in await pulledByBob.add(events) }
        XCTAssertEqual(bobReport.pushed, 1)
        try await assertEqual(await pulledByBob.events.map(\.clientID), [bob1])
        XCTAssertEqual(try serverEvents(server, "bob@example.com").map(\.clientID), [bob1.uuidString.lowercased()])

        try await signIn(client, server, as: "ann@example.com")
        try await assertEqual(await client.pendingCount, 1)
        try await assertEqual(await client.cursor, 2)
        let pulledByAnn = Collected()
        let annReport = try await client.sync { events in await pulledByAnn.add(events) }
        XCTAssertEqual(annReport.pushed, 1)
        try await assertEqual(await pulledByAnn.events.map(\.clientID), [ann3], "only what is new to Ann")
        XCTAssertEqual(
            try serverEvents(server, "ann@example.com").map(\.clientID),
            [ann1, ann2, ann3].map { $0.uuidString.lowercased() })
    }

    /// Another user signing in while the first one's push waits out a `503`'s Retry-After:
    /// the push never goes on with the new user's token (which would store the first user's
    /// events in the second one's account); what it did not send stays in the first user's
    /// outbox and reaches their account once they sign in again.
    func testAnotherSignInDuringAPushBackoffNeverSendsTheEventsToTheNewUser() async throws {
        let (first, second) = ("first@example.com", "second@example.com")
        // One pool connection, held below by a pull stuck on a lock: the push gets `503`.
        let server = try startServer([
            "TRUNK_SYNC_DB_POOL_SIZE": "1", "TRUNK_SYNC_DB_POOL_TIMEOUT": "1", "TRUNK_SYNC_EVENT_LOOPS": "1",
        ])
        let events = EventLogBox()
        let client = try makeClient(server, storage: try makeStorage(), events: events)
        try await signIn(client, server, as: first)
        try await client.sendCode(to: second)
        let secondCode = try server.code(for: second)
        let event = try await client.record(type: "private", payload: ["owner": "first"])
        let token = try await client.accessToken()

        let (blocker, stuck) = try await holdThePoolConnection(server, token: token)

        // At the push's first 503: the pool goes free and the second user signs in while the
        // push waits to try again.
        let signedIn = Done()
        let once = Counter()
        events.onEvent { event in
            guard case .retrying(_, "/sync/v1/events", 503, _, _, _, _) = event, once.increment() == 1 else { return }
            Task.detached {
                try? blocker.run("commit")
                do { try await client.verify(email: second, code: secondCode) } catch { XCTFail("verify: \(error)") }
                signedIn.signal()
            }
        }
        var interrupted = false
        do {
            _ = try await withTimeout(30, "push") { try await client.push() }
        } catch TrunkSyncError.notSignedIn {
            interrupted = true
        }
        XCTAssertTrue(signedIn.wait(timeout: 30), "the second user did not sign in")
        try await assertEqual((try await stuck.value).status, 200)
        XCTAssertEqual(client.currentUser?.email, second)
        XCTAssertEqual(try serverEvents(server, second).count, 0, "the first user's event went to the second")

        try await signIn(client, server, as: first)
        try await assertEqual(await client.pendingCount, interrupted ? 1 : 0, "kept for the first user")
        _ = try await client.push()
        XCTAssertEqual(try serverEvents(server, first).map(\.clientID), [event.uuidString.lowercased()])
    }

    /// Events pushed by one device arrive on another's `liveEvents()` while it long-polls.
    func testLiveEventsArriveFromTheOtherDevice() async throws {
        let email = "live@example.com"
        let server = try startServer()
        let phone = try makeClient(server, storage: try makeStorage())
        try await signIn(phone, server, as: email)
        let laptopEvents = EventLogBox()
        let laptop = try makeClient(server, storage: try makeStorage(), events: laptopEvents) { $0.longPollWait = 20 }
        try await signIn(laptop, server, as: email)

        let received = Collected()
        let live = Task {
            for try await events in laptop.liveEvents() { await received.add(events) }
        }
        defer { live.cancel() }
        let metrics = server.adminURL.appendingPathComponent("metrics")
        let waiting = await waitUntil(10) {
            ((try? await rawRequest("GET", metrics))?.body ?? "").contains("trunk_sync_longpolls_waiting 1")
        }
        XCTAssertTrue(waiting, "the laptop's long-poll is waiting at the server")

        var sent: [UUID] = []
        for index in 0..<3 { sent.append(try await phone.record(type: "live", payload: ["index": index])) }
        let startedAt = Date()
        _ = try await phone.push()
        let arrived = await waitUntil(10) { await received.events.count == 3 }
        XCTAssertTrue(arrived, "live events did not arrive")
        XCTAssertLessThan(Date().timeIntervalSince(startedAt), 5, "long before the long-poll's 20 s ran out")
        try await assertEqual(await received.events.map(\.clientID), sent)
        try await assertEqual(try await received.events.map { try $0.decode([String: Int].self)["index"] }, [0, 1, 2])

        // The next page; the first one's cursor is stored once the loop asked for more.
        let fourth = try await phone.record(type: "live", payload: ["index": 3])
        _ = try await phone.push()
        let arrivedAgain = await waitUntil(10) { await received.events.count == 4 }
        XCTAssertTrue(arrivedAgain)
        try await assertEqual(await received.events.last?.clientID, fourth)
        try await assertGreaterThanOrEqual(await laptop.cursor, 3)

        live.cancel()
        let ended = await waitUntil(10) { live.isCancelled }
        XCTAssertTrue(ended)
        _ = await live.result
        let cursor = await laptop.cursor
        try await assertEqual(try await laptop.sync { _ in }.pulled, 4 - Int(cursor), "the rest, once")
    }
    /// A phone on a new server and a laptop behind a `HoldingProxy` in front of it, both
    /// signed in as `email`, the laptop caught up (its long-polls wait 20 s), and the laptop's
    /// live loop collecting into `received` once `start` is called: what a proxy does to the
    /// live loop. Stop the proxy and cancel the loop after.
    private func laptopBehindProxy(
        _ email: String, _ configure: (inout TrunkSyncClient.Configuration) -> Void = { _ in }
    ) async throws -> (
        proxy: HoldingProxy, phone: TrunkSyncClient, events: EventLogBox, received: Collected,
        start: () -> Task<Void, Error>
    ) {
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        let phone = try makeClient(server, storage: try makeStorage())
        try await signIn(phone, server, as: email)
        let events = EventLogBox()
        let laptop = try makeClient(via: proxy, storage: try makeStorage(), events: events) {
            $0.longPollWait = 20
            configure(&$0)
        }
        try await signIn(laptop, server, as: email)
        _ = try await laptop.sync { _ in }
        let received = Collected()
        let start = {
            Task { for try await page in laptop.liveEvents() { await received.add(page) } }
        }
        return (proxy, phone, events, received, start)
    }

    /// A long-poll answered `200` with a body that is not a page (a proxy's page, a body cut
    /// short or mangled on the way), or with a page of something in the way (a proxy's `404`
    /// while it is set up wrong): the live loop backs off, tells the observer (`.retrying`
    /// with that status) and goes on; events pushed after still arrive. (It ended with
    /// `.invalidResponse`, or `.server` for the `404`, and the app heard of nothing new.)
    func testALiveLoopGoesOnAfterAnAnswerItCannotRead() async throws {
        let (proxy, phone, events, received, start) = try await laptopBehindProxy("live-unreadable@example.com")
        defer { proxy.stop() }
        try proxy.answerInstead("/sync/v1/events", status: 200)
        let live = start()
        defer { live.cancel() }
        let retried = await waitUntil(20) { events.retries.contains { $0.status == 200 } }
        XCTAssertTrue(retried, "the unreadable 200 was not retried")
        let first = try await phone.record(type: "live", payload: ["index": 0])
        _ = try await phone.push()
        let arrived = await waitUntil(20) { await received.events.count == 1 }
        XCTAssertTrue(arrived, "the live loop ended after a 200 it could not read")

        // A later long-poll (the next, or the one after the one waiting now) gets a proxy's
        // 404 page.
        try proxy.answerInstead("/sync/v1/events", status: 404)
        let second = try await phone.record(type: "live", payload: ["index": 1])
        _ = try await phone.push()
        let retried404 = await waitUntil(20) { events.retries.contains { $0.status == 404 } }
        XCTAssertTrue(retried404, "the 404 page was not retried")
        let third = try await phone.record(type: "live", payload: ["index": 2])
        _ = try await phone.push()
        let arrivedAgain = await waitUntil(20) { await received.events.count == 3 }
        XCTAssertTrue(arrivedAgain, "the live loop ended after a proxy's 404 page")
        try await assertEqual(await received.events.map(\.clientID), [first, second, third])
        XCTAssertTrue(
            events.retries.allSatisfy { $0.path == "/sync/v1/events" && $0.delay <= Self.quickRetry.maxDelay },
            "with the retry policy's backoff")
        XCTAssertLessThan(events.requests("GET", "/sync/v1/events").count, 20, "a few requests, not a hot loop")
    }

    /// A long-poll answered with a body that never ends (a proxy gone wrong): cut at
    /// `maxAnswerBytes`, the connection closed, and retried with backoff as any answer it
    /// cannot read; events pushed after still arrive. (It read on for as long as the body came.)
    func testALiveLoopCutsAnAnswerThatNeverEndsAndGoesOn() async throws {
        let (proxy, phone, events, received, start) = try await laptopBehindProxy("live-endless@example.com") {
            $0.maxAnswerBytes = 256 * 1024
        }
        defer { proxy.stop() }
        try proxy.answerHuge("/sync/v1/events", announced: false)
        let live = start()
        defer { live.cancel() }
        XCTAssertEqual(proxy.hugeAnswer(timeout: 60), "cut", "the live loop read on past its limit")
        let retried = await waitUntil(20) { events.retries.contains { $0.status == 200 } }
        XCTAssertTrue(retried, "the answer cut off was not retried")
        try await assertArrivesLive(phone, received, "after an answer cut off")
    }

    /// Long-polls answered with a proxy's `401` page (HTML, not the server's JSON: a proxy
    /// asking for its own credentials), three in a row: retried with backoff as any page in
    /// the way, and no refresh is spent on them (the token is not what it refused); events
    /// pushed after still arrive. (Each retry refreshed the session first.)
    func testALiveLoopSpendsNoRefreshOnAProxys401Page() async throws {
        let (proxy, phone, events, received, start) = try await laptopBehindProxy("live-401-page@example.com")
        defer { proxy.stop() }
        try proxy.answerInstead("/sync/v1/events", status: 401, times: 3)
        let live = start()
        defer { live.cancel() }
        let retried = await waitUntil(20) { events.retries.filter { $0.status == 401 }.count == 3 }
        XCTAssertTrue(retried, "three 401 pages retried: \(events.retries.map(\.status))")
        try await assertArrivesLive(phone, received, "after a proxy's 401 page")
        XCTAssertEqual(events.refreshes, [], "a refresh spent on a page in the way")
    }

    /// A long-poll answered `503` with a `Retry-After` of a day (a proxy in maintenance mode,
    /// a date counted from a clock that is off): the live loop waits `maxRetryAfter`, told to
    /// the observer, and asks again. (It ended with `.rateLimited`.)
    func testALiveLoopWaitsAtMostMaxRetryAfter() async throws {
        let (proxy, phone, events, received, start) = try await laptopBehindProxy("live-retry-after@example.com") {
            $0.retry.maxRetryAfter = 0.5
        }
        defer { proxy.stop() }
        try proxy.answerInstead("/sync/v1/events", status: 503, retryAfter: 86400)
        let live = start()
        defer { live.cancel() }
        let retried = await waitUntil(20) { events.retries.contains { $0.status == 503 } }
        XCTAssertTrue(retried, "the 503 was not retried")
        let retry = try XCTUnwrap(events.retries.first { $0.status == 503 })
        XCTAssertEqual(retry.retryAfter, 86400)
        XCTAssertLessThanOrEqual(retry.delay, 0.5 * 1.1 + 0.01, "maxRetryAfter, not a day")
        try await assertArrivesLive(phone, received, "after a day's Retry-After")
    }

    /// Records an event on `phone` and pushes it: the live loop collecting into `received`
    /// (nothing yet) hands it out, having gone on `after` what the test did to it.
    private func assertArrivesLive(
        _ phone: TrunkSyncClient, _ received: Collected, _ after: String, file: StaticString = #filePath,
        line: UInt = #line
    ) async throws {
        let id = try await phone.record(type: "live", payload: ["index": 0])
        _ = try await phone.push()
        let arrived = await waitUntil(20) { await received.events.count == 1 }
        XCTAssertTrue(arrived, "the live loop ended \(after)", file: file, line: line)
        try await assertEqual(await received.events.map(\.clientID), [id], file: file, line: line)
    }

    /// A first sign-in with a history of many pages, and a live loop asking for pages while
    /// the first `sync` pulls them (an app starts both at launch): the history comes once, by
    /// the pull; the live loop waits for it and hands out only what commits after. (It asked
    /// after the same stored cursor as the pull, page by page, and handed the history out a
    /// second time.)
    func testAFirstSignInDownloadsTheHistoryOnceBesideALiveLoop() async throws {
        let email = "history@example.com"
        let server = try startServer()
        let phone = try makeClient(server, storage: try makeStorage())
        try await signIn(phone, server, as: email)
        for index in 0..<1200 { _ = try await phone.record(type: "page", payload: ["index": index]) }
        _ = try await phone.push()
        let events = EventLogBox()
        let laptop = try makeClient(server, storage: try makeStorage(), events: events) {
            $0.pullLimit = 250
            $0.longPollWait = 20
        }
        try await signIn(laptop, server, as: email)

        let live = Collected()
        let pulled = Collected()
        let loop = LiveLoop()
        defer { loop.cancel() }
        let report = try await laptop.sync { page in
            await pulled.add(page)
            guard page.first?.seq == 1 else { return }
            // The live loop asks for its first page while the pull's first is applied.
            loop.start { for try await page in laptop.liveEvents() { await live.add(page) } }
            let asked = await waitUntil(20) {
                let waiting = await laptop.liveLoopsWaitingForPull
                let delivered = await live.events.count
                return waiting > 0 || delivered > 0
            }
            XCTAssertTrue(asked, "the live loop did not ask for a page")
        }
        XCTAssertEqual(report.pulled, 1200)
        try await assertEqual(await pulled.events.map(\.seq), Array(1...1200))

        for index in 0..<5 { _ = try await phone.record(type: "new", payload: ["index": index]) }
        _ = try await phone.push()
        let arrived = await waitUntil(20) { await live.events.count >= 5 }
        XCTAssertTrue(arrived, "the new events did not come live")
        try await assertEqual(await live.events.map(\.seq), Array(1201...1205), "the history came live too")
        XCTAssertLessThanOrEqual(
            events.requests("GET", "/sync/v1/events").count, 5 + 2, "5 pages pulled, at most 2 live requests")
    }
}

/// A live loop a test starts from a `sync` handler and cancels at its end.
final class LiveLoop: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var task: Task<Void, Error>?

    func start(_ body: @escaping @Sendable () async throws -> Void) {
        lock.withLock { task = Task { try await body() } }
    }
    func cancel() { lock.withLock { task }?.cancel() }
}

extension String {
    func leftPadded(to width: Int) -> String { String(repeating: "0", count: max(0, width - count)) + self }
}
