import Foundation
import TestSupport
import TrunkSyncClient
import XCTest

/// Exactly once on the server: through a `kill -9` of the recording process, a server
/// killed mid-sync, and acknowledgements lost in a crash; paged pull on a second device.
final class OutboxSyncTests: ClientTestCase {
    /// 500 events recorded while the server is down, by a process killed with SIGKILL part
    /// way and then started again; one sync stores each exactly once, and a second device
    /// pulls them all, in order, across pages.
    func testEventsRecordedOfflineThroughAKillReachTheServerExactlyOnceAndAnotherDevicePullsThem() async throws {
        let email = "crash@example.com"
        let server = try startServer()
        let storage = try makeStorage()
        do {
            let client = try makeClient(server, storage: storage)
            try await signIn(client, server, as: email)
            await client.close()
        }
        server.kill()

        // The recording process, killed after it reported 150 durable events.
        let arguments = [
            "--url", server.url.absoluteString, "--storage", storage.path, "record", "offline", #"{"device":"a"}"#,
        ]
        let first = try ExampleProcess(exampleBinary(), arguments + ["--count", "500", "--interval-ms", "2"])
        let reported = first.stdout.waitForLines(containing: "recorded ", count: 150, timeout: 60)
        first.kill()
        XCTAssertNotNil(reported, first.output)
        let printed = first.stdout.lines(containing: "recorded ").map { String($0.dropFirst("recorded ".count)) }

        // Restarted: what `record` returned for is there; the torn record (if any) is not.
        let durable: Int
        do {
            let client = try makeClient(server, storage: storage)
            durable = await client.pendingCount
            await client.close()
        }
        XCTAssertTrue(
            (printed.count...(printed.count + 1)).contains(durable),
            "\(printed.count) printed, \(durable) in the outbox")
        XCTAssertLessThan(durable, 500, "the process was killed before it finished")
        let second = try ExampleProcess(
            exampleBinary(), arguments + ["--count", String(500 - durable), "--start", String(durable)])
        XCTAssertEqual(second.waitForExit(timeout: 120), 0, second.output)

        try server.restart()
        let client = try makeClient(server, storage: storage) { $0.maxBatchEvents = 120 }
        try await assertEqual(await client.pendingCount, 500)
        let report = try await client.sync { _ in }
        XCTAssertEqual(report.pushed, 500)
        XCTAssertEqual(report.duplicates, 0)
        XCTAssertEqual(report.pulled, 500)
        try await assertEqual(await client.pendingCount, 0)

        let stored = try serverEvents(server, email)
        XCTAssertEqual(stored.count, 500)
        XCTAssertEqual(Set(stored.map(\.clientID)).count, 500)
        XCTAssertTrue(Set(printed).isSubset(of: Set(stored.map(\.clientID))), "every reported event is stored")
        let indexes = try stored.map { event -> Int in
            let object = try JSONSerialization.jsonObject(with: Data(event.payload.utf8)) as? [String: Any]
            return try XCTUnwrap(object?["index"] as? Int)
        }
        XCTAssertEqual(indexes.sorted(), Array(0..<500), "each recorded event once, none lost")

        // A second device with its own storage pulls everything, in order, 100 at a time.
        let device = try makeClient(server, storage: try makeStorage()) { $0.pullLimit = 100 }
        try await signIn(device, server, as: email)
        let pulled = Collected()
        let pulledReport = try await device.sync { events in await pulled.add(events) }
        XCTAssertEqual(pulledReport.pulled, 500)
        XCTAssertEqual(pulledReport.pages, 5)
        XCTAssertEqual(pulledReport.pushed, 0)
        let events = await pulled.events
        XCTAssertEqual(events.map(\.seq), Array(1...500))
        XCTAssertEqual(events.map { $0.clientID.uuidString.lowercased() }, stored.map(\.clientID))
        try await assertEqual(await device.cursor, 500)
        try await assertEqual(try await device.sync { _ in }.pulled, 0, "nothing twice")
    }

    /// SIGKILL while pushes are in flight, then again while a second device is between two
    /// pages: the client retries until the server is back; nothing is lost or doubled.
    func testTheServerKilledAndRestartedInTheMiddleOfASyncLosesAndDoublesNothing() async throws {
        let email = "midsync@example.com"
        let server = try startServer()
        let events = EventLogBox()
        let client = try makeClient(server, storage: try makeStorage(), events: events) { $0.maxBatchEvents = 50 }
        try await signIn(client, server, as: email)
        let device = try makeClient(server, storage: try makeStorage()) { $0.pullLimit = 40 }
        try await signIn(device, server, as: email)
        var recorded: [UUID] = []
        for index in 0..<300 { recorded.append(try await client.record(type: "midsync", payload: ["index": index])) }

        // Kill the server a moment after the third push went out (while it may be in flight),
        // and start it again; a later push waits for the kill, so at least one meets a dead
        // server.
        let pushes = Counter()
        let killed = Latch()
        let restarted = Done()
        events.onEvent { event in
            guard case .request("POST", "/sync/v1/events") = event else { return }
            let number = pushes.increment()
            if number == 3 {
                Thread.detachNewThread {
                    usleep(3000)
                    server.kill()
                    killed.open()
                    try? server.restart()
                    restarted.signal()
                }
            } else if number > 3 {
                _ = killed.wait(timeout: 30)
            }
        }
        let report = try await withTimeout(90, "sync through a server restart") { try await client.sync { _ in } }
        XCTAssertTrue(restarted.wait(timeout: 30))
        // When the kill came after the batch in flight was committed, its answer was lost:
        // the retry finds those 50 already stored (duplicates), and stores nothing twice.
        XCTAssertEqual(report.pushed + report.duplicates, 300)
        XCTAssertTrue([0, 50].contains(report.duplicates), "only the batch in flight is sent again: \(report)")
        try await assertEqual(await client.pendingCount, 0)
        XCTAssertFalse(events.retries.isEmpty, "the client retried while the server was down")
        let stored = try serverEvents(server, email)
        XCTAssertEqual(stored.map(\.clientID), recorded.map { $0.uuidString.lowercased() }, "each once, in order")

        // The other device pulls 40 at a time; the server dies after its second page.
        let pulled = Collected()
        let pages = Counter()
        let restartedAgain = Done()
        let pulledReport = try await withTimeout(90, "pull through a server restart") {
            try await device.sync { page in
                await pulled.add(page)
                if pages.increment() == 2 {
                    server.kill()
                    Thread.detachNewThread {
                        try? server.restart()
                        restartedAgain.signal()
                    }
                }
            }
        }
        XCTAssertTrue(restartedAgain.wait(timeout: 30))
        XCTAssertEqual(pulledReport.pulled, 300)
        try await assertEqual(await pulled.events.map(\.seq), Array(1...300))
        try await assertEqual(await pulled.events.map(\.clientID), recorded)
    }

    /// A crash after the server stored a batch but before the outbox recorded that (here:
    /// the outbox file put back as it was) sends the batch again; the server recognises every
    /// event by its client_id and stores none twice.
    func testAcknowledgementsLostInACrashMeanDuplicatesNotDoubles() async throws {
        let email = "acks@example.com"
        let server = try startServer()
        let storage = try makeStorage()
        var client = try makeClient(server, storage: storage)
        try await signIn(client, server, as: email)
        for index in 0..<10 { _ = try await client.record(type: "ack", payload: ["index": index]) }
        await client.close()
        let outbox = try XCTUnwrap(
            FileManager.default.enumerator(at: storage, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL }
                .first { $0.lastPathComponent == "outbox.log" })
        let beforeSync = try Data(contentsOf: outbox)

        client = try makeClient(server, storage: storage)
        try await assertEqual(try await client.sync { _ in }.pushed, 10)
        await client.close()
        XCTAssertEqual(try Data(contentsOf: outbox).count, 16, "compacted to its header once all was acknowledged")
        try beforeSync.write(to: outbox)

        client = try makeClient(server, storage: storage)
        try await assertEqual(await client.pendingCount, 10)
        let report = try await client.sync { _ in }
        XCTAssertEqual(report.pushed, 0)
        XCTAssertEqual(report.duplicates, 10)
        try await assertEqual(await client.pendingCount, 0)
        XCTAssertEqual(try serverEvents(server, email).count, 10)
    }

    /// A proxy's body limit below a batch (nginx's `client_max_body_size`): the batch is halved
    /// until it fits, and that size is kept for the rest of the push, rather than sending a
    /// full batch, and halving it again, after each one that went through.
    func testAProxys413HalvesTheBatchAndTheSizeThatFitIsKept() async throws {
        let email = "proxy-limit@example.com"
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let events = EventLogBox()
        var configuration = TrunkSyncClient.Configuration()
        configuration.retry = Self.quickRetry
        configuration.maxBatchEvents = 16
        configuration.observer = { events.record($0) }
        let client = try TrunkSyncClient(
            url: proxy.url, storageDirectory: try makeStorage(), configuration: configuration)
        try await signIn(client, server, as: email)
        let pad = String(repeating: "x", count: 3000)
        for index in 0..<16 { _ = try await client.record(type: "note", payload: ["n": String(index), "pad": pad]) }

        try proxy.limitBodies(to: 16 * 1024)  // 4 events of ~3.1 KB fit, 8 do not
        let report = try await client.push()
        XCTAssertEqual(report.pushed, 16)
        XCTAssertEqual(report.rejected.count, 0, "nothing quarantined")
        XCTAssertEqual(events.requests("POST", "/sync/v1/events").count, 6, "16 and 8 refused, then 4 batches of 4")
        XCTAssertEqual(try serverEvents(server, email).count, 16)
        await client.close()
    }

    /// An outbox frame damaged while the client runs (its bytes changed on disk after the
    /// outbox was opened and read whole) no longer stops every push until the app restarts:
    /// the events around it go out, in order, once each; its bytes are kept beside the outbox
    /// and the app is told which event it was (`.logRecovered`); opened again, the outbox has
    /// nothing wrong and nothing left to send. (Every push threw `.storage`.)
    func testAnOutboxFrameDamagedWhileTheClientRunsIsSetAsideAndTheRestIsPushed() async throws {
        let email = "damaged@example.com"
        let server = try startServer()
        let storage = try makeStorage()
        let events = EventLogBox()
        let client = try makeClient(server, storage: storage, events: events)
        try await signIn(client, server, as: email)
        var ids: [UUID] = []
        for index in 0..<3 { ids.append(try await client.record(type: "note", payload: ["index": index])) }

        // The middle event's frame, one byte of its payload changed in place (the payload is a
        // JSON string in the record: its quotes escaped).
        let outbox = try XCTUnwrap(
            FileManager.default.enumerator(at: storage, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL }
                .first { $0.lastPathComponent == "outbox.log" })
        let bytes = try Data(contentsOf: outbox)
        let marker = try XCTUnwrap(bytes.range(of: Data(#"index\":1"#.utf8)))
        let handle = try FileHandle(forUpdating: outbox)
        try handle.seek(toOffset: UInt64(marker.lowerBound + 8))
        try handle.write(contentsOf: Data("7".utf8))
        try handle.close()

        let report = try await client.push()
        XCTAssertEqual(report.pushed, 2)
        XCTAssertEqual(
            try serverEvents(server, email).map(\.clientID), [ids[0], ids[2]].map { $0.uuidString.lowercased() })
        let recoveries = events.all.compactMap { _, event -> LogRecovery? in
            if case .logRecovered(let recovery) = event { return recovery }
            return nil
        }
        XCTAssertEqual(recoveries.map(\.damagedEvents), [[ids[1]]])
        let copy = try XCTUnwrap(recoveries.first?.damagedCopy)
        XCTAssertEqual(copy.deletingLastPathComponent().path, outbox.deletingLastPathComponent().path)
        let kept = try Data(contentsOf: copy)
        XCTAssertNotNil(kept.range(of: Data(#"index\":7"#.utf8)), "the damaged bytes, as found")
        XCTAssertNotNil(kept.range(of: Data(ids[1].uuidString.utf8)))
        try await assertEqual(await client.pendingCount, 0)
        try await assertEqual(try await client.push().pushed, 0)

        await client.close()
        let reopenedEvents = EventLogBox()
        let reopened = try makeClient(server, storage: storage, events: reopenedEvents)
        try await assertEqual(await reopened.pendingCount, 0)
        try await assertEqual(try await reopened.push().pushed, 0)
        XCTAssertFalse(
            reopenedEvents.all.contains { _, event in
                if case .logRecovered = event { return true }
                return false
            }, "opened again, nothing wrong")
        XCTAssertEqual(try serverEvents(server, email).count, 2)
    }

    /// A `400` that is not the server's (an HTML page of a proxy in the way) says nothing
    /// about the event: the push fails and the event stays in the outbox, not in the
    /// quarantine, and goes with the next push. (It was quarantined: with every push refused
    /// that way, the whole outbox, one event at a time, never to sync unless the app
    /// requeued it.)
    func testA400PageThatIsNotTheServersQuarantinesNothing() async throws {
        let email = "proxy-400@example.com"
        let server = try startServer()
        let proxy = try HoldingProxy(upstream: server.port)
        defer { proxy.stop() }
        let client = try makeClient(via: proxy, storage: try makeStorage())
        try await signIn(client, server, as: email)
        let id = try await client.record(type: "note", payload: ["text": "fine"])
        try proxy.answerInstead("/sync/v1/events", status: 400)
        do {
            _ = try await client.push()
            XCTFail("a proxy's 400 page was taken for the server's refusal")
        } catch TrunkSyncError.server(let error) {
            XCTAssertEqual(error.status, 400)
        }
        try await assertEqual(try await client.quarantinedEvents().count, 0)
        try await assertEqual(await client.pendingCount, 1)
        try await assertEqual(try await client.push().pushed, 1)
        XCTAssertEqual(try serverEvents(server, email).map(\.clientID), [id.uuidString.lowercased()])
    }

    /// A batch the server refuses names the bad event and field; that event moves to the
    /// quarantine and the others are stored.
    func testARefusedEventIsQuarantinedAndTheRestIsPushed() async throws {
        let email = "quarantine@example.com"
        let server = try startServer()
        let events = EventLogBox()
        let client = try makeClient(server, storage: try makeStorage(), events: events)
        try await signIn(client, server, as: email)
        let good1 = try await client.record(type: "note", payload: ["text": "fine"])
        // JSON allows \u0000; PostgreSQL cannot store it, so the server refuses the payload.
        let bad = try await client.record(type: "note", payload: ["text": "nul \u{0} inside"])
        let good2 = try await client.record(type: "note", payload: ["text": "also fine"])
        do {
            _ = try await client.record(type: "", payload: ["text": "no type"])
            XCTFail("an empty type is refused at once")
        } catch TrunkSyncError.invalidEvent(_) {}

        let report = try await client.sync { _ in }
        XCTAssertEqual(report.pushed, 2)
        XCTAssertEqual(report.rejected.map(\.clientID), [bad])
        XCTAssertEqual(report.rejected.first?.field, "payload")
        XCTAssertTrue(report.rejected.first?.reason.contains("\\u0000") ?? false, "\(report.rejected)")
        try await assertEqual(await client.pendingCount, 0, "the bad event does not block the outbox")
        XCTAssertEqual(
            try serverEvents(server, email).map(\.clientID), [good1, good2].map { $0.uuidString.lowercased() })

        let quarantined = try await client.quarantinedEvents()
        XCTAssertEqual(quarantined.map(\.clientID), [bad])
        XCTAssertEqual(quarantined.first?.rejection.status, 400)
        XCTAssertEqual(quarantined.first?.rejection.code, "validation_failed")
        XCTAssertEqual(
            String(decoding: quarantined.first?.payload ?? Data(), as: UTF8.self), #"{"text":"nul \u0000 inside"}"#)

        try await client.requeueQuarantined([bad])
        try await assertEqual(await client.pendingCount, 1)
        try await assertEqual(try await client.sync { _ in }.rejected.map(\.clientID), [bad], "same id, refused again")
        try await client.discardQuarantined()
        try await assertEqual(try await client.quarantinedEvents().count, 0)
    }
}
