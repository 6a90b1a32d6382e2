import Foundation
import XCTest

@testable import TrunkSyncClient

/// The outbox file format (`FramedLog`, `EventLog`): what a crash or damage leaves behind
/// is read back without losing an acknowledged write and without failing.
final class OutboxFormatTests: XCTestCase {
    var directory: URL!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "outbox-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(at: directory)
    }

    var logURL: URL { directory.appendingPathComponent("outbox.log") }

    func event(_ index: Int, type: String = "note") -> StoredEvent {
        StoredEvent(
            clientID: UUID(), type: type, payload: Array(#"{"index":\#(index),"text":"h\u00e9 \"q\""}"#.utf8),
            clientTimestamp: "2026-11-23T10:00:00.\(String(format: "%03d", index % 1000))Z")
    }

    /// A log with `count` events appended one at a time (one frame each).
    func makeLog(_ count: Int) throws -> (EventLog, [StoredEvent]) {
        let log = try EventLog(url: logURL)
        let events = (0..<count).map { event($0) }
        for event in events { try log.append([event]) }
        return (log, events)
    }

    func fileBytes() throws -> [UInt8] { Array(try Data(contentsOf: logURL)) }
    func write(_ bytes: [UInt8]) throws { try Data(bytes).write(to: logURL) }

    // MARK: - Framing

    func testCRC32MatchesTheStandardCheckValue() {
        XCTAssertEqual(CRC32.checksum(Array("123456789".utf8)), 0xCBF4_3926)
        XCTAssertEqual(CRC32.checksum([]), 0)
    }

    func testAFrameIsLengthChecksumAndBody() throws {
        let body = Array(#"{"op":"ack","ids":[]}"#.utf8)
        let frame = FramedLog.frame(body)
        XCTAssertEqual(Array(frame[0..<4]), [0, 0, 0, UInt8(body.count)])
        XCTAssertEqual(FramedLog.readBigEndian(frame, at: 4), CRC32.checksum(body))
        XCTAssertEqual(Array(frame[8...]), body)
        let (scan, frames, _) = try scanBytes(FramedLog.header + frame + frame)
        XCTAssertEqual(frames.map(\.body), [body, body])
        XCTAssertEqual(scan.validEnd, FramedLog.header.count + 2 * frame.count)
        XCTAssertEqual(scan.tornBytes, 0)
        XCTAssertTrue(scan.damaged.isEmpty)
    }

    func testEventsComeBackExactlyAfterReopening() throws {
        let (log, events) = try makeLog(5)
        XCTAssertEqual(try log.all(), events)
        log.close()
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), events)
        XCTAssertNil(reopened.recovery)
        XCTAssertEqual(reopened.ids, events.map(\.clientID))
    }

    /// A file damaged throughout (or something else in its place) is kept aside whole and
    /// the log starts afresh, told; the outbox is never unreadable for good. (It was refused
    /// at every opening: every call needing the outbox failed with `.storage`.)
    func testAFileThatIsNotALogIsSetAsideAndTheLogStartsAfresh() throws {
        for garbage in [Array("hello, this is not an outbox at all".utf8), Array("hello".utf8)] {
            try write(garbage)
            let log = try EventLog(url: logURL)
            XCTAssertEqual(log.count, 0)
            let recovery = try XCTUnwrap(log.recovery)
            XCTAssertTrue(recovery.damagedHeader)
            let copy = try XCTUnwrap(recovery.damagedCopy)
            XCTAssertEqual(Array(try Data(contentsOf: copy)), garbage, "kept aside whole")
            XCTAssertEqual(try fileBytes(), FramedLog.header)
            let more = event(1)
            try log.append([more])
            log.close()
            let reopened = try EventLog(url: logURL)
            XCTAssertNil(reopened.recovery)
            XCTAssertEqual(try reopened.all(), [more])
            reopened.close()
            try FileManager.default.removeItem(at: copy)
        }
    }

    /// A damaged header (it holds nothing but the format's version) loses no event: its bytes
    /// are kept aside, told, and the frames after it are read as usual; the file is written
    /// anew with a good header. (The whole outbox was refused, its events stuck.)
    func testADamagedHeaderKeepsTheEventsAfterIt() throws {
        let (log, events) = try makeLog(3)
        log.close()
        let good = try fileBytes()
        let damages: [(inout [UInt8]) -> Void] = [
            { $0[3] ^= 0x20 },  // a bit flipped
            { bytes in for index in 0..<FramedLog.header.count { bytes[index] = 0 } },  // never written
        ]
        for damage in damages {
            var bytes = good
            damage(&bytes)
            try write(bytes)
            let reopened = try EventLog(url: logURL)
            XCTAssertEqual(try reopened.all(), events)
            let recovery = try XCTUnwrap(reopened.recovery)
            XCTAssertTrue(recovery.damagedHeader)
            XCTAssertEqual(recovery.damagedFrames, 0)
            XCTAssertEqual(recovery.damagedEvents, [])
            let copy = try XCTUnwrap(recovery.damagedCopy)
            XCTAssertEqual(Array(try Data(contentsOf: copy)), Array(bytes.prefix(FramedLog.header.count)))
            XCTAssertEqual(try fileBytes(), good, "written anew, header and frames")
            reopened.close()
            let again = try EventLog(url: logURL)
            XCTAssertNil(again.recovery)
            XCTAssertEqual(try again.all(), events)
            again.close()
        }
    }

    /// The header of a later version of the format (a newer client wrote the file; the user
    /// went back to an older one) is not damage: refused, the file left exactly as it is for
    /// the version that reads it, never set aside.
    func testALaterFormatIsRefusedAndLeftAsItIs() throws {
        let (log, _) = try makeLog(2)
        log.close()
        let later = Array("TRUNKSYNC-LOG-2\n".utf8) + (try fileBytes()).dropFirst(FramedLog.header.count)
        try write(later)
        XCTAssertThrowsError(try EventLog(url: logURL)) { error in
            XCTAssertTrue(String(describing: error).contains("version 2"), "\(error)")
        }
        XCTAssertEqual(try fileBytes(), later)
        XCTAssertEqual(
            try FileManager.default.contentsOfDirectory(atPath: directory.path), ["outbox.log"], "nothing set aside")
    }

    func testATornHeaderIsAnEmptyLog() throws {
        try write(Array(FramedLog.header.prefix(5)))
        let log = try EventLog(url: logURL)
        XCTAssertEqual(log.count, 0)
        XCTAssertEqual(try fileBytes(), FramedLog.header)
        try log.append([event(1)])
        XCTAssertEqual(log.count, 1)
    }

    // MARK: - Crashes and damage

    /// A crash during the last `append` leaves any prefix of its frame: every cut point
    /// reads back as the earlier events, the file is cut back, and appending goes on.
    func testATornLastRecordIsDroppedAtEveryCutPoint() throws {
        let (log, events) = try makeLog(3)
        log.close()
        let full = try fileBytes()
        let last = try XCTUnwrap(try scanBytes(full).frames.last)
        for cut in stride(from: last.offset + 1, to: full.count, by: 7) {
            try write(Array(full[0..<cut]))
            let reopened = try EventLog(url: logURL)
            XCTAssertEqual(try reopened.all(), Array(events.prefix(2)), "cut at \(cut)")
            XCTAssertEqual(reopened.recovery?.tornBytesDropped, cut - last.offset, "cut at \(cut)")
            XCTAssertNil(reopened.recovery?.damagedCopy)
            XCTAssertEqual(try fileBytes().count, last.offset, "the torn bytes are cut off")
            let more = event(9)
            try reopened.append([more])
            reopened.close()
            XCTAssertEqual(try EventLog(url: logURL).all(), Array(events.prefix(2)) + [more])
        }
    }

    func testAChecksumMismatchInTheLastRecordIsATornWrite() throws {
        let (log, events) = try makeLog(3)
        log.close()
        var bytes = try fileBytes()
        bytes[bytes.count - 3] ^= 0x55
        try write(bytes)
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), Array(events.prefix(2)))
        XCTAssertGreaterThan(reopened.recovery?.tornBytesDropped ?? 0, 0)
        XCTAssertNil(reopened.recovery?.damagedCopy)
    }

    /// Damage in the middle (not a crash: a crash only tears the end) loses nothing after
    /// it, and the damaged frame is kept aside rather than dropped silently.
    func testAChecksumMismatchInTheMiddleSkipsThatRecordAndKeepsItsBytes() throws {
        let (log, events) = try makeLog(4)
        log.close()
        var bytes = try fileBytes()
        let frames = try scanBytes(bytes).frames
        let damaged = frames[1]
        bytes[damaged.offset + FramedLog.frameHeaderSize + 10] ^= 0xFF
        try write(bytes)
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), [events[0], events[2], events[3]])
        let recovery = try XCTUnwrap(reopened.recovery)
        XCTAssertEqual(recovery.damagedFrames, 1)
        let copy = try XCTUnwrap(recovery.damagedCopy)
        XCTAssertEqual(Array(try Data(contentsOf: copy)), Array(bytes[damaged.range]))
        // The log was rewritten without it: opening again finds nothing wrong.
        reopened.close()
        let again = try EventLog(url: logURL)
        XCTAssertNil(again.recovery)
        XCTAssertEqual(try again.all(), [events[0], events[2], events[3]])
    }

    func testAZeroFilledTailIsDropped() throws {
        let (log, events) = try makeLog(2)
        log.close()
        try write(try fileBytes() + [UInt8](repeating: 0, count: 4096))
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), events)
        XCTAssertEqual(reopened.recovery?.tornBytesDropped, 4096)
        XCTAssertNil(reopened.recovery?.damagedCopy)
    }

    func testAnUnreadableTailIsKeptAside() throws {
        let (log, events) = try makeLog(2)
        log.close()
        let garbage: [UInt8] = [0xFF, 0xFF, 0xFF, 0xFF] + Array("not a frame".utf8)
        try write(try fileBytes() + garbage)
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), events)
        let copy = try XCTUnwrap(reopened.recovery?.damagedCopy)
        XCTAssertEqual(Array(try Data(contentsOf: copy)), garbage)
    }

    /// A frame's length field damaged while the client was not running: opening reads on at
    /// the next whole frame, not where the length points, and the frame whose length alone
    /// is wrong keeps its event (its body up to that frame, or up to the end of the file for
    /// the last one, matches its checksum). Nothing is lost, nothing is reported, and the file
    /// is written anew with the length right. (The scan followed the length: the event and
    /// every one after it were dropped, mostly unseen, as a torn write.)
    func testALengthFieldDamagedBeforeOpeningLosesNoEvent() throws {
        let damages: [(name: String, offset: Int, change: (UInt8) -> UInt8)] = [
            ("one longer", 3, { $0 &+ 1 }), ("one shorter", 3, { $0 &- 1 }), ("64 KiB longer", 1, { $0 ^ 0x01 }),
            ("16 MiB longer", 0, { $0 ^ 0x01 }),
        ]
        for (damaged, (how, offset, change)) in [2, 5].flatMap({ index in damages.map { (index, $0) } }) {
            let name = "frame \(damaged) of 6, length \(how)"
            let (log, events) = try makeLog(6)
            log.close()
            let frame = try scanBytes(try fileBytes()).frames[damaged]
            try damage(at: frame.offset + offset, change)

            let reopened = try EventLog(url: logURL)
            XCTAssertNil(reopened.recovery, name)
            XCTAssertEqual(try reopened.all(), events, name)
            reopened.close()
            let scan = try scanBytes(try fileBytes()).scan
            XCTAssertEqual(scan.repairedLengths, 0, name)
            XCTAssertEqual(scan.damaged, [], name)
            XCTAssertEqual(try EventLog(url: logURL).all(), events, name)
            try FileManager.default.removeItem(at: logURL)
        }
    }

    /// Frames zeroed in the middle of the file (a file system that lost their blocks): they
    /// are damage, kept aside and told, and the frames after them are read on. (Their zero
    /// length ended the readable part: every event after them was set aside too.)
    func testFramesZeroedInTheMiddleLoseOnlyTheirEvents() throws {
        let (log, events) = try makeLog(6)
        log.close()
        var bytes = try fileBytes()
        let frames = try scanBytes(bytes).frames
        for offset in frames[1].offset..<frames[2].range.upperBound { bytes[offset] = 0 }
        try write(bytes)

        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), [events[0]] + events[3...])
        let recovery = try XCTUnwrap(reopened.recovery)
        XCTAssertEqual(recovery.damagedFrames, 1)
        let copy = try XCTUnwrap(recovery.damagedCopy)
        XCTAssertEqual(
            Array(try Data(contentsOf: copy)),
            [UInt8](repeating: 0, count: frames[2].range.upperBound - frames[1].offset))
        reopened.close()
        XCTAssertNil(try EventLog(url: logURL).recovery)
    }

    /// A log opened in 7-byte chunks has the events, the recovery and the file that one
    /// opened in the default chunks has, whatever a crash or damage left in it.
    func testAnEventLogReadInSmallChunksIsTheSame() throws {
        let source = directory.appendingPathComponent("source.log")
        let log = try EventLog(url: source)
        let events = [10, 5000, 40, 300, 2, 70].enumerated().map { index, size in
            StoredEvent(
                clientID: UUID(), type: "note",
                payload: Array(#"{"text":"\#(String(repeating: "é", count: size))"}"#.utf8),
                clientTimestamp: "2026-11-23T10:00:00.00\(index)Z")
        }
        for event in events { try log.append([event]) }
        try log.remove([events[2].clientID], as: .ack)
        try log.remove([events[4].clientID], as: .drop)
        log.close()
        let full = Array(try Data(contentsOf: source))
        let frames = try scanBytes(full).frames.map(\.range)
        XCTAssertEqual(frames.count, 8)

        var files: [(String, [UInt8])] = [("clean", full), ("zero tail", full + [UInt8](repeating: 0, count: 100))]
        files.append(("garbage tail", full + [0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3]))
        for cut in [frames[7].lowerBound + 3, frames[7].lowerBound + 20, full.count - 1] {
            files.append(("cut at \(cut)", Array(full.prefix(cut))))
        }
        for index in [1, 3, 6] {
            var damaged = full
            damaged[frames[index].upperBound - 2] ^= 0x40
            files.append(("frame \(index) damaged", damaged))
        }
        let live = [events[0], events[1], events[3], events[5]]
        let expected = ["clean": live, "garbage tail": live, "frame 1 damaged": live.filter { $0 != events[1] }]
        for (name, bytes) in files {
            var opened: [(events: [StoredEvent], recovery: LogRecovery?, copy: [UInt8]?, file: [UInt8])] = []
            for (file, chunkSize) in [("whole", FramedLog.scanChunkSize), ("small", 7)] {
                let url = directory.appendingPathComponent("\(name)-\(file).log")
                try Data(bytes).write(to: url)
                let log = try EventLog(url: url, scanChunkSize: chunkSize)
                var recovery = log.recovery
                let copy = try recovery?.damagedCopy.map { Array(try Data(contentsOf: $0)) }
                recovery?.file = source
                recovery?.damagedCopy = nil
                opened.append((try log.all(), recovery, copy, Array(try Data(contentsOf: url))))
                log.close()
            }
            XCTAssertEqual(opened[0].events, opened[1].events, name)
            if let events = expected[name] { XCTAssertEqual(opened[1].events, events, name) }
            XCTAssertEqual(opened[0].recovery, opened[1].recovery, name)
            XCTAssertEqual(opened[0].copy, opened[1].copy, name)
            XCTAssertEqual(opened[0].file, opened[1].file, name)
        }
    }

    // MARK: - Damage found after opening

    /// Changes bytes of the open log's file in place (the same file, as a stray write or a
    /// failing disk would), not a new file renamed over it.
    func damage(at offset: Int, _ change: (UInt8) -> UInt8 = { $0 ^ 0xFF }) throws {
        let handle = try FileHandle(forUpdating: logURL)
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(offset))
        let byte = try XCTUnwrap(handle.read(upToCount: 1)?.first)
        try handle.seek(toOffset: UInt64(offset))
        try handle.write(contentsOf: [change(byte)])
    }

    /// A frame damaged while the log is open (its bytes changed on disk after it was read
    /// whole at opening) is set aside the first time it is read: its bytes kept beside the
    /// file, its event taken out and named, the others read on in order, and the file
    /// rewritten so that opening it again finds nothing wrong. The last frame too, which at
    /// opening would pass for a torn write. (Every read of the outbox threw, so every push
    /// failed, until the app restarted; then a damaged last frame was dropped unseen.)
    func testAFrameDamagedAfterOpeningIsSetAsideAndTheOthersReadOn() throws {
        for index in 0..<4 {
            try? FileManager.default.removeItem(at: directory)
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let (log, events) = try makeLog(4)
            var told: [LogRecovery] = []
            log.onRecovery = { told.append($0) }
            let frame = try scanBytes(try fileBytes()).frames[index]
            try damage(at: frame.offset + FramedLog.frameHeaderSize + 12)
            let damagedBytes = Array(try fileBytes()[frame.range])
            var rest = events
            rest.remove(at: index)

            XCTAssertEqual(try log.oldest(maxEvents: 10), rest, "frame \(index)")
            XCTAssertEqual(log.count, 3)
            XCTAssertEqual(told.count, 1, "frame \(index)")
            let recovery = try XCTUnwrap(told.first)
            XCTAssertEqual(recovery.damagedEvents, [events[index].clientID])
            XCTAssertEqual(recovery.damagedFrames, 1)
            XCTAssertEqual(recovery.file, logURL)
            let copy = try XCTUnwrap(recovery.damagedCopy)
            XCTAssertEqual(Array(try Data(contentsOf: copy)), damagedBytes, "the bytes as found")
            XCTAssertEqual(try log.all(), rest, "told once")
            XCTAssertEqual(told.count, 1)
            log.close()
            let reopened = try EventLog(url: logURL)
            XCTAssertNil(reopened.recovery, "frame \(index)")
            XCTAssertEqual(try reopened.all(), rest)
        }
    }

    /// A file cut short while open (a torn write found only now, something else truncating
    /// it): the events before the cut stay, those cut off are named, what is left of the
    /// first of them is kept, and appending goes on where the file now ends.
    func testAFileCutShortAfterOpeningKeepsTheEventsBeforeTheCut() throws {
        let (log, events) = try makeLog(4)
        var told: [LogRecovery] = []
        log.onRecovery = { told.append($0) }
        let frames = try scanBytes(try fileBytes()).frames
        let cut = frames[2].offset + 5
        let kept = Array(try fileBytes()[frames[2].offset..<cut])
        let handle = try FileHandle(forUpdating: logURL)
        try handle.truncate(atOffset: UInt64(cut))
        try handle.close()

        XCTAssertEqual(try log.all(), Array(events.prefix(2)))
        XCTAssertEqual(told.map(\.damagedEvents), [[events[2].clientID, events[3].clientID]])
        XCTAssertEqual(Array(try Data(contentsOf: try XCTUnwrap(told.first?.damagedCopy))), kept)
        let more = event(7)
        try log.append([more])
        log.close()
        let reopened = try EventLog(url: logURL)
        XCTAssertNil(reopened.recovery)
        XCTAssertEqual(try reopened.all(), Array(events.prefix(2)) + [more])
    }

    /// Appending, or acknowledging, when the file was cut short while open and nothing read
    /// it since: the new frame goes where the file now ends, after the events before the cut,
    /// not after a hole (where opening the file again took it for damage and left it out:
    /// an event `record` kept, never pushed).
    func testAWriteAfterTheFileWasCutShortIsKept() throws {
        for acknowledge in [false, true] {
            try? FileManager.default.removeItem(at: directory)
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let (log, events) = try makeLog(4)
            var told: [LogRecovery] = []
            log.onRecovery = { told.append($0) }
            let frames = try scanBytes(try fileBytes()).frames
            let handle = try FileHandle(forUpdating: logURL)
            try handle.truncate(atOffset: UInt64(frames[3].offset + 5))
            try handle.close()

            let more = event(7)
            var expected = Array(events.prefix(3))
            if acknowledge {
                try log.remove([events[0].clientID], as: .ack)
                expected.removeFirst()
            } else {
                try log.append([more])
                expected.append(more)
            }
            XCTAssertEqual(told.map(\.damagedEvents), [[events[3].clientID]])
            XCTAssertEqual(try log.all(), expected)
            log.close()
            let reopened = try EventLog(url: logURL)
            XCTAssertNil(reopened.recovery, "acknowledge: \(acknowledge)")
            XCTAssertEqual(try reopened.all(), expected, "acknowledge: \(acknowledge)")
        }
    }

    /// Only a frame's length field damaged: its body and checksum prove the event whole, so
    /// it stays, nothing is reported, and the file is rewritten with the length right before
    /// it is opened again. (Read by the index, the event looked fine; opened again, the scan
    /// followed the wrong length and lost it and the frames after it.)
    func testAFrameWhoseOnlyDamageIsItsLengthKeepsItsEvent() throws {
        let (log, events) = try makeLog(4)
        var told: [LogRecovery] = []
        log.onRecovery = { told.append($0) }
        let frame = try scanBytes(try fileBytes()).frames[1]
        try damage(at: frame.offset + 3) { $0 &+ 1 }

        XCTAssertEqual(try log.all(), events)
        XCTAssertTrue(told.isEmpty)
        log.close()
        let reopened = try EventLog(url: logURL)
        XCTAssertNil(reopened.recovery)
        XCTAssertEqual(try reopened.all(), events)
    }

    /// A compaction never copies a frame that changed on disk into the new file (where, as
    /// its last frame, it would pass for a torn write at the next opening and be dropped
    /// unseen): that event is set aside and named, the others are kept.
    func testACompactionSetsADamagedFrameAside() throws {
        let log = try EventLog(url: logURL)
        var told: [LogRecovery] = []
        log.onRecovery = { told.append($0) }
        let events = (0..<(EventLog.compactionThreshold + 10)).map { event($0) }
        try log.append(events)
        let frames = try scanBytes(try fileBytes()).frames
        try damage(at: frames[frames.count - 1].offset + FramedLog.frameHeaderSize + 12)

        try log.remove(events.dropLast(3).map(\.clientID), as: .ack)
        XCTAssertEqual(told.map(\.damagedEvents), [[events[events.count - 1].clientID]])
        XCTAssertEqual(try log.all(), Array(events.suffix(3).prefix(2)))
        log.close()
        let reopened = try EventLog(url: logURL)
        XCTAssertNil(reopened.recovery)
        XCTAssertEqual(try reopened.all(), Array(events.suffix(3).prefix(2)))
    }

    /// A damaged copy never replaces an earlier one (found in the same millisecond, or after
    /// the clock was set back): the earlier stays as it was.
    func testADamagedCopyNeverReplacesAnEarlierOne() throws {
        let (log, events) = try makeLog(4)
        let stopped = Date()
        log.now = { stopped }
        var told: [LogRecovery] = []
        log.onRecovery = { told.append($0) }
        let earlier = directory.appendingPathComponent(
            "outbox.log.damaged-\(Int(stopped.timeIntervalSince1970 * 1000))")
        try Data("earlier".utf8).write(to: earlier)
        let frames = try scanBytes(try fileBytes()).frames
        try damage(at: frames[1].offset + FramedLog.frameHeaderSize + 12)
        XCTAssertEqual(try log.all(), [events[0], events[2], events[3]])
        let next = try scanBytes(try fileBytes()).frames
        try damage(at: next[1].offset + FramedLog.frameHeaderSize + 12)
        XCTAssertEqual(try log.all(), [events[0], events[3]])

        let copies = told.compactMap(\.damagedCopy).map(\.path)
        XCTAssertEqual(copies.count, 2)
        XCTAssertEqual(Set(copies + [earlier.path]).count, 3, "\(copies)")
        XCTAssertEqual(try Data(contentsOf: earlier), Data("earlier".utf8))
        for copy in copies {
            XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: copy)).count, frames[1].range.count)
        }
    }

    // MARK: - Acknowledgements and compaction

    /// An append whose sync fails throws, and its frame is not in the file when it is next
    /// read: `record` said the event was not kept, so the app may record it again (a second
    /// id: twice on the server had the first come back). Likewise a removal.
    func testAnAppendThatFailsIsNotReadBackLater() throws {
        let (log, events) = try makeLog(2)
        let size = try fileBytes().count
        log.syncFile = { _ in throw StorageFailure(message: "fsync: I/O error (for the test)") }
        XCTAssertThrowsError(try log.append([event(2)]))
        XCTAssertThrowsError(try log.remove([events[0].clientID], as: .ack))
        XCTAssertEqual(try fileBytes().count, size, "cut back")
        log.close()
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(reopened.ids, events.map(\.clientID))
        XCTAssertNil(reopened.recovery)
    }

    func testAcknowledgedEventsStayAcknowledgedAfterReopening() throws {
        let (log, events) = try makeLog(5)
        try log.remove([events[0].clientID, events[2].clientID], as: .ack)
        try log.remove([events[4].clientID], as: .drop)
        XCTAssertEqual(try log.all(), [events[1], events[3]])
        XCTAssertEqual(try log.oldest(maxEvents: 1), [events[1]])
        log.close()
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), [events[1], events[3]])
        XCTAssertEqual(reopened.count, 2)
    }

    /// An event removed and appended again (moved to the quarantine and requeued while
    /// other events wait) is one event, in its new place, before and after reopening.
    func testAnEventRemovedAndAppendedAgainIsListedOnce() throws {
        let (log, events) = try makeLog(3)
        try log.remove([events[1].clientID], as: .drop)
        try log.append([events[1]])
        let expected = [events[0], events[2], events[1]]
        XCTAssertEqual(try log.all(), expected)
        XCTAssertEqual(log.ids, expected.map(\.clientID))
        XCTAssertEqual(try log.oldest(maxEvents: 10), expected)
        log.close()
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), expected)
        XCTAssertEqual(reopened.ids, expected.map(\.clientID))
        try reopened.rewrite()
        XCTAssertEqual(try reopened.all(), expected)
        try reopened.remove([events[0].clientID], as: .ack)
        XCTAssertEqual(try reopened.all(), [events[2], events[1]])
    }

    func testBatchesStopAtTheByteLimitButTakeAtLeastOneEvent() throws {
        let (log, events) = try makeLog(10)
        let size = events[0].payload.count + events[0].type.utf8.count
        XCTAssertEqual(try log.oldest(maxEvents: 100, maxBytes: size * 3), Array(events.prefix(3)))
        XCTAssertEqual(try log.oldest(maxEvents: 100, maxBytes: 1), Array(events.prefix(1)))
        XCTAssertEqual(try log.oldest(maxEvents: 4), Array(events.prefix(4)))
    }

    func testTheFileIsCutBackToItsHeaderWhenEverythingIsAcknowledged() throws {
        let (log, events) = try makeLog(20)
        try log.remove(events.prefix(10).map(\.clientID), as: .ack)
        XCTAssertGreaterThan(try fileBytes().count, FramedLog.header.count)
        try log.remove(events.suffix(10).map(\.clientID), as: .ack)
        XCTAssertEqual(try fileBytes(), FramedLog.header)
        XCTAssertEqual(log.count, 0)
        let more = event(99)
        try log.append([more])
        log.close()
        XCTAssertEqual(try EventLog(url: logURL).all(), [more])
    }

    func testMostlyDeadFramesAreRewrittenAway() throws {
        let log = try EventLog(url: logURL)
        let events = (0..<(EventLog.compactionThreshold + 10)).map { event($0) }
        try log.append(events)
        let sizeBefore = try fileBytes().count
        let keep = Array(events.suffix(3))
        try log.remove(events.dropLast(3).map(\.clientID), as: .ack)
        let sizeAfter = try fileBytes().count
        XCTAssertLessThan(sizeAfter, sizeBefore / 100, "rewritten with the 3 live events only")
        XCTAssertEqual(try log.all(), keep)
        log.close()
        let reopened = try EventLog(url: logURL)
        XCTAssertEqual(try reopened.all(), keep)
        XCTAssertNil(reopened.recovery)
    }

    // MARK: - Replacing a file (an export put in place)

    /// A downloaded file replaces the one at the destination in one step, also from another
    /// volume (a copy beside it, renamed over it: `rename` alone cannot cross volumes, EXDEV),
    /// and never replaces a directory.
    func testAFileIsReplacedInOneStepAlsoFromAnotherVolume() throws {
        let destination = directory.appendingPathComponent("export.ndjson")
        try Data("older".utf8).write(to: destination)
        let here = directory.appendingPathComponent("download-1")
        try Data("first".utf8).write(to: here)
        try FileSystem.replace(destination, withFileAt: here)
        XCTAssertEqual(try String(contentsOf: destination, encoding: .utf8), "first")

        let shm = URL(fileURLWithPath: "/dev/shm")
        var shmInfo = stat()
        var hereInfo = stat()
        guard stat(shm.path, &shmInfo) == 0, stat(directory.path, &hereInfo) == 0, shmInfo.st_dev != hereInfo.st_dev
        else { throw XCTSkip("no second volume (/dev/shm) here") }
        let elsewhere = shm.appendingPathComponent("trunk-sync-download-\(UUID().uuidString.prefix(8))")
        defer { try? FileManager.default.removeItem(at: elsewhere) }
        let body = (0..<(FileSystem.writeStep * 2 + 5)).map { UInt8(truncatingIfNeeded: $0) }
        try Data(body).write(to: elsewhere)
        try FileSystem.replace(destination, withFileAt: elsewhere)
        XCTAssertEqual(Array(try Data(contentsOf: destination)), body)
        XCTAssertEqual(
            try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted(), ["export.ndjson"],
            "nothing left beside it")

        let folder = directory.appendingPathComponent("Documents", isDirectory: true)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        try Data("mine".utf8).write(to: folder.appendingPathComponent("own.txt"))
        XCTAssertThrowsError(try FileSystem.replace(folder, withFileAt: elsewhere))
        XCTAssertEqual(try String(contentsOf: folder.appendingPathComponent("own.txt"), encoding: .utf8), "mine")
    }
}
