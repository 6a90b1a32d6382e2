import Foundation
import XCTest

@testable import TrunkSyncClient

/// What goes over the wire and into the storage directory besides the log frames: push
/// bodies, pulled pages, timestamps, the per-server storage key, the quarantine's repair.
final class WireFormatTests: XCTestCase {
    func testThePushBodyCarriesThePayloadBytesAsRecorded() throws {
        let stored = StoredEvent(
            clientID: UUID(uuidString: "6F1F0E3C-1111-4C3E-9D7A-3A1C8F0F2B10")!, type: "a \"quoted\"\ntype",
            payload: Array(#"{"big":12345678901234567890,"x":1e308}"#.utf8), clientTimestamp: "2026-11-22T04:10:02.123Z"
        )
        let body = String(decoding: TrunkSyncClient.pushBody([stored, stored]), as: UTF8.self)
        let one =
            #"{"client_id":"6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b10","type":"a \"quoted\"\ntype","#
            + #""payload":{"big":12345678901234567890,"x":1e308},"client_timestamp":"2026-11-22T04:10:02.123Z"}"#
        XCTAssertEqual(body, #"{"events":["# + one + "," + one + "]}")
        XCTAssertNotNil(try JSONSerialization.jsonObject(with: Data(body.utf8)))
    }

    /// Only results whose status says stored acknowledge an event; a body without results
    /// is not a push answer.
    func testAPushAnswerAcknowledgesOnlyCreatedAndDuplicateEvents() throws {
        let (created, duplicate, other) = (UUID(), UUID(), UUID())
        let body = """
            {"accepted":1,"duplicates":1,"results":[
            {"client_id":"\(created.uuidString.lowercased())","status":"created","seq":1},
            {"client_id":"\(duplicate.uuidString.lowercased())","status":"duplicate","seq":2},
            {"client_id":"\(other.uuidString.lowercased())","status":"refused"}]}
            """
        let answer = try TrunkSyncClient.parsePushAnswer(Data(body.utf8))
        XCTAssertEqual(answer.ids, [created, duplicate])
        XCTAssertEqual(answer.created, 1)
        XCTAssertEqual(answer.duplicates, 1)
        XCTAssertThrowsError(try TrunkSyncClient.parsePushAnswer(Data(#"{"accepted":3,"duplicates":0}"#.utf8)))
        XCTAssertThrowsError(try TrunkSyncClient.parsePushAnswer(Data()))
    }

    func testAPulledPageKeepsPayloadBytesAndParsesTimestamps() throws {
        let body = #"""
            {"events":[{"id":"0b0e3c2a-7c55-4f55-9d0e-52b2ac0f5b11","seq":7,"type":"t\u00e9\ud83d\ude00",
            "payload":{"big": 12345678901234567890, "s": "a\"b", "n": [1, {"x": null}]},
            "client_id":"6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b10","client_timestamp":"2026-11-22T04:10:02.123456Z",
            "created_at":"2026-11-22T04:10:03.5+01:00"}],"next_after":7,"has_more":true}
            """#
        let page = try EventPage.parse(Data(body.utf8))
        XCTAssertEqual(page.nextAfter, 7)
        XCTAssertTrue(page.hasMore)
        let event = try XCTUnwrap(page.events.first)
        XCTAssertEqual(event.seq, 7)
        XCTAssertEqual(event.type, "té😀")
        XCTAssertEqual(
            String(decoding: event.payload, as: UTF8.self),
            #"{"big": 12345678901234567890, "s": "a\"b", "n": [1, {"x": null}]}"#)
        XCTAssertEqual(event.clientTimestamp.timeIntervalSince1970, 1_795_320_602.123456, accuracy: 0.000_01)
        XCTAssertEqual(event.createdAt.timeIntervalSince1970, 1_795_320_603.5 - 3600, accuracy: 0.000_01)
        struct Payload: Decodable { var s: String }
        XCTAssertEqual(try event.decode(Payload.self).s, "a\"b")
        XCTAssertThrowsError(try EventPage.parse(Data(#"{"events":[{"seq":1}],"next_after":1,"has_more":false}"#.utf8)))
    }

    /// A page that says there is more must move the cursor: else `sync` asked for the same
    /// page forever (a server or a proxy answering garbage).
    func testAPageWithMoreMustMovePastTheCursor() throws {
        func page(_ json: String) throws -> EventPage { try EventPage.parse(Data(json.utf8)) }
        XCTAssertThrowsError(try page(#"{"events":[],"next_after":5,"has_more":true}"#).check(after: 5))
        XCTAssertThrowsError(try page(#"{"events":[],"next_after":4,"has_more":false}"#).check(after: 5))
        XCTAssertNoThrow(try page(#"{"events":[],"next_after":5,"has_more":false}"#).check(after: 5))
        XCTAssertNoThrow(try page(#"{"events":[],"next_after":9,"has_more":true}"#).check(after: 5))
    }

    /// A `Retry-After` date is counted from the answer's `Date`, not this device's clock (off
    /// by years here): 30 s, not 0 (and not hours for a clock running behind).
    func testARetryAfterDateIsCountedFromTheAnswersDate() {
        func answer(_ headers: [String: String]) -> HTTPAnswer {
            HTTPAnswer(status: 503, headers: headers, body: Data())
        }
        XCTAssertEqual(
            answer(["retry-after": "Sat, 01 Jan 2000 00:00:30 GMT", "date": "Sat, 01 Jan 2000 00:00:00 GMT"])
                .retryAfter, 30)
        XCTAssertEqual(
            answer(["retry-after": "Sat, 01 Jan 2000 00:00:30 GMT"]).retryAfter, 0, "no Date: the device's clock")
        XCTAssertEqual(answer(["retry-after": "7"]).retryAfter, 7)
    }

    /// Storage in the temporary or the caches folder (emptied by the system when space runs
    /// low) is told; elsewhere it is not. Which folder is "elsewhere" depends on the machine
    /// (a checkout may itself be under the temporary folder), so that side is checked against
    /// folders the test names.
    func testStorageTheSystemMayPurgeIsTold() async throws {
        let server = URL(string: "http://127.0.0.1:9")!
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("ts-\(UUID().uuidString)")
        let caches = try XCTUnwrap(FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask).first)
            .appendingPathComponent("ts-\(UUID().uuidString)")
        defer { for directory in [temporary, caches] { try? FileManager.default.removeItem(at: directory) } }
        for directory in [temporary, caches] {
            let client = try TrunkSyncClient(url: server, storageDirectory: directory)
            XCTAssertFalse(client.storagePersisted, directory.path)
            await client.close()
        }
        let root = URL(fileURLWithPath: "/var/cache-of-the-test/purged", isDirectory: true)
        XCTAssertTrue(StorageLayout.isPurgeable(root, folders: [root]))
        XCTAssertTrue(StorageLayout.isPurgeable(root.appendingPathComponent("app/data"), folders: [root]))
        XCTAssertFalse(
            StorageLayout.isPurgeable(URL(fileURLWithPath: "/var/cache-of-the-test/purged-not/app"), folders: [root]),
            "a sibling whose name starts the same is not inside")
        XCTAssertFalse(StorageLayout.isPurgeable(URL(fileURLWithPath: "/srv/app/data"), folders: [root]))
    }

    func testTimestampsAreWrittenInUTCWithMilliseconds() {
        let date = Date(timeIntervalSince1970: 1_795_320_602.1239)
        XCTAssertEqual(RFC3339.format(date), "2026-11-22T04:10:02.123Z")
        XCTAssertEqual(RFC3339.format(Date(timeIntervalSince1970: 0)), "1970-01-01T00:00:00.000Z")
        XCTAssertEqual(RFC3339.format(Date(timeIntervalSince1970: 951_782_400)), "2000-02-29T00:00:00.000Z")
        XCTAssertEqual(RFC3339.parse("2000-02-29T00:00:00Z")?.timeIntervalSince1970, 951_782_400)
        XCTAssertNil(RFC3339.parse("2000-02-29 garbage"))
    }

    func testStorageIsPerServer() {
        let a = StorageLayout.key(for: URL(string: "https://sync.example.com")!)
        let b = StorageLayout.key(for: URL(string: "https://sync.example.com/other")!)
        let c = StorageLayout.key(for: URL(string: "http://127.0.0.1:8080")!)
        XCTAssertTrue(a.hasPrefix("sync.example.com-443-"))
        XCTAssertTrue(c.hasPrefix("127.0.0.1-8080-"))
        XCTAssertNotEqual(a, b)
        XCTAssertEqual(a, StorageLayout.key(for: URL(string: "https://sync.example.com/")!))
    }

    func testAnEventInTheQuarantineAndTheOutboxIsDroppedFromTheOutbox() throws {
        let user = UUID()
        let userDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("user-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: userDirectory) }
        do {
            let store = try UserStore(userID: user, directory: userDirectory)
            try store.outbox.append([
                StoredEvent(
                    clientID: UUID(), type: "a", payload: Array("{}".utf8), clientTimestamp: "2026-01-01T00:00:00.000Z"),
                StoredEvent(
                    clientID: UUID(), type: "b", payload: Array("{}".utf8), clientTimestamp: "2026-01-01T00:00:00.000Z"),
            ])
            // A crash between the two writes of a move to the quarantine.
            var rejected = try XCTUnwrap(store.outbox.read(store.outbox.ids[0]))
            rejected.rejection = Rejection(
                status: 400, code: "validation_failed", field: "payload", reason: "bad", rejectedAt: Date())
            try store.quarantine.append([rejected])
            store.close()
        }
        let store = try UserStore(userID: user, directory: userDirectory)
        XCTAssertEqual(store.outbox.count, 1)
        XCTAssertEqual(store.quarantine.count, 1)
        XCTAssertEqual(try store.quarantine.all().first?.rejection?.field, "payload")
    }

    /// `requeueQuarantined` cut short by a crash after its one write (the outbox's frame),
    /// before the quarantine's drop: the next open finishes it, the events in the outbox
    /// and out of the quarantine; a stay quarantined by an earlier version (no stay id) too.
    /// A move into the quarantine again, cut short the same way, still ends there.
    func testARequeueCutShortByACrashIsFinishedOnTheNextOpen() throws {
        let user = UUID()
        let userDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("user-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: userDirectory) }
        let event = { (type: String) in
            StoredEvent(
                clientID: UUID(), type: type, payload: Array("{}".utf8), clientTimestamp: "2026-01-01T00:00:00.000Z")
        }
        let rejection = Rejection(
            status: 400, code: "validation_failed", field: "payload", reason: "bad", rejectedAt: Date())
        let (a, b, c) = (event("a"), event("b"), event("c"))
        do {
            let store = try UserStore(userID: user, directory: userDirectory)
            try store.outbox.append([a, b, c])
            var refused = try XCTUnwrap(store.outbox.read(a.clientID))
            refused.rejection = rejection
            try store.moveToQuarantine([refused])
            // What an earlier version's move left: a stay without an id.
            var old = try XCTUnwrap(store.outbox.read(b.clientID))
            old.rejection = rejection
            try store.quarantine.append([old])
            try store.outbox.remove([b.clientID], as: .drop)
            XCTAssertEqual(store.outbox.ids, [c.clientID])
            XCTAssertEqual(try store.writeRequeue([a.clientID, b.clientID]), [a.clientID, b.clientID])
            store.close()  // the crash, before the quarantine's drop
        }
        do {
            let store = try UserStore(userID: user, directory: userDirectory)
            XCTAssertEqual(store.outbox.ids, [c.clientID, a.clientID, b.clientID])
            XCTAssertEqual(store.quarantine.count, 0)
            XCTAssertNil(try XCTUnwrap(store.outbox.read(a.clientID)).rejection)
            // Refused again: the move into the quarantine cut short after its first write.
            var again = try XCTUnwrap(store.outbox.read(a.clientID))
            again.rejection = rejection
            again.quarantineID = UUID()
            again.requeuedFrom = nil
            try store.quarantine.append([again])
            store.close()
        }
        let store = try UserStore(userID: user, directory: userDirectory)
        XCTAssertEqual(store.outbox.ids, [c.clientID, b.clientID])
        XCTAssertEqual(store.quarantine.ids, [a.clientID])
        // And a requeue that finished leaves nothing to finish.
        try store.requeue([a.clientID])
        store.close()
        let reopened = try UserStore(userID: user, directory: userDirectory)
        XCTAssertEqual(reopened.outbox.ids, [c.clientID, b.clientID, a.clientID])
        XCTAssertEqual(reopened.quarantine.count, 0)
    }

    /// Every folder `createDirectory` makes has its entry synced into its parent, each level
    /// it created (a user's first sign-in makes `users/` and `users/<id>/`), innermost out;
    /// an existing folder syncs nothing.
    func testCreatingAFolderSyncsTheParentOfEachLevelItCreated() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("dirs-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: base) }
        var synced: [String] = []
        let deep = base.appendingPathComponent("users").appendingPathComponent("someone")
        try FileSystem.createDirectory(deep) { synced.append($0.path) }
        XCTAssertEqual(
            synced, [base.appendingPathComponent("users").path, base.path, base.deletingLastPathComponent().path])
        var isDirectory: ObjCBool = false
        XCTAssertTrue(
            FileManager.default.fileExists(atPath: deep.path, isDirectory: &isDirectory) && isDirectory.boolValue)
        synced = []
        try FileSystem.createDirectory(deep) { synced.append($0.path) }
        try FileSystem.createDirectory(base.appendingPathComponent("other")) { synced.append($0.path) }
        XCTAssertEqual(synced, [base.path])
        // The real sync on a real folder (no error for a directory).
        try FileSystem.createDirectory(base.appendingPathComponent("real").appendingPathComponent("one"))
    }
}
