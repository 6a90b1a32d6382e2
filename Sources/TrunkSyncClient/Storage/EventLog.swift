import Foundation

/// Why the server refused an event (the quarantine keeps it with the event).
public struct Rejection: Codable, Sendable, Equatable {
    /// The HTTP status (`400` for a field the server refuses, `413` for an event too large
    /// to push at all).
    public var status: Int
    /// The server's error code (`validation_failed`, `body_too_large`, …).
    public var code: String
    /// The field the server named (`payload`, `type`, …); empty when it named none.
    public var field: String
    /// The server's reason for that field, or its message.
    public var reason: String
    /// When the client quarantined the event.
    public var rejectedAt: Date

    public init(status: Int, code: String, field: String, reason: String, rejectedAt: Date) {
        self.status = status
        self.code = code
        self.field = field
        self.reason = reason
        self.rejectedAt = rejectedAt
    }
}

/// An event as the outbox or the quarantine stores it.
struct StoredEvent: Equatable, Sendable {
    var clientID: UUID
    var type: String
    /// The payload's JSON text, exactly as it will be pushed.
    var payload: [UInt8]
    /// RFC 3339 with milliseconds, UTC, as pushed.
    var clientTimestamp: String
    var rejection: Rejection? = nil
    /// In the quarantine: this stay's id, made when the event moved there.
    var quarantineID: UUID? = nil
    /// In the outbox: the event came back from the quarantine stay whose `quarantineID`
    /// this is ("" for a stay without one, written before there were ids). See
    /// `UserStore.requeue`.
    var requeuedFrom: String? = nil
}

/// One record of a log file's body (one JSON object per frame).
struct LogRecord: Codable, Equatable {
    enum Operation: String, Codable {
        /// An event was recorded (or moved back from the quarantine).
        case event
        /// Events the server stored (created or duplicate): never sent again.
        case ack
        /// Events removed without being sent: moved to the quarantine, or discarded.
        case drop
    }

    var op: Operation
    var clientID: UUID? = nil
    var type: String? = nil
    /// The payload's JSON text as a string, so its bytes come back exactly.
    var payload: String? = nil
    var clientTimestamp: String? = nil
    var rejection: Rejection? = nil
    var ids: [UUID]? = nil
    /// See `StoredEvent.quarantineID` and `.requeuedFrom` (absent in records written before
    /// them: decoded as nil, and ignored by versions that do not know them).
    var quarantineID: UUID? = nil
    var requeuedFrom: String? = nil

    enum CodingKeys: String, CodingKey {
        case op, type, payload, rejection, ids
        case clientID = "client_id"
        case clientTimestamp = "client_timestamp"
        case quarantineID = "quarantine_id"
        case requeuedFrom = "requeued_from"
    }
}

/// What the client found wrong with a log file and repaired: when it opened the file, or
/// later, when a frame it had read whole at opening no longer reads back the same.
public struct LogRecovery: Sendable, Equatable {
    /// The log file.
    public var file: URL
    /// Bytes of a write torn by a crash, dropped (the call that wrote them never returned).
    public var tornBytesDropped: Int
    /// Damaged frames found and skipped (at opening, a run of damaged bytes whose frames
    /// cannot be told apart, such as frames zeroed, counts once): their bytes are in
    /// `damagedCopy`.
    public var damagedFrames: Int
    /// Where the damaged bytes were kept, for inspection (nil when there were none).
    public var damagedCopy: URL?
    /// The events whose frames were found damaged after the file was opened (the ids
    /// `record` returned): taken out of the log, never pushed from it; their bytes, as far as
    /// they are still in the file, are in `damagedCopy`. Empty for damage found at opening,
    /// where a damaged frame's id cannot be read.
    public var damagedEvents: [UUID] = []
    /// Whether the file's header was damaged (found at opening): its bytes are the first of
    /// `damagedCopy`, and the frames after it were read as usual (the header holds nothing
    /// but the format's version). A file damaged throughout, or not a log at all, is in
    /// `damagedCopy` whole, counted as a damaged header (and a damaged frame when there is
    /// more than a header's worth), and the log starts afresh.
    public var damagedHeader = false
}

/// An append-only, crash-safe log of events (the format is `FramedLog`'s): the outbox,
/// and the quarantine beside it. It keeps only an index in memory (id, type, where the
/// frame is) and reads payloads back when a batch is pushed; opening reads the file in
/// chunks (`FramedLog.scan`) and rewriting copies it frame by frame, so no step holds the
/// whole file, however large an outbox grew offline.
///
/// Every change is one frame written and synced before the method returns: `append`
/// (events), `remove` (an `ack` or `drop` of ids). When no event is left the file is cut
/// back to its header; when most frames are dead it is rewritten with the live ones
/// (temporary file, sync, rename: a crash leaves the old or the new file).
final class EventLog {
    struct Entry {
        var type: String
        var frame: Range<Int>
        /// Where the id is in `order`, counting the ids `pruneOrder` dropped: an id removed
        /// and appended again lingers at its old place too, which is not live.
        var position: Int
    }

    let url: URL
    private var file: DurableFile
    private var end = 0
    /// Live ids in the order they were appended (ids removed since may linger until
    /// `pruneOrder`).
    private var order: [UUID] = []
    private var orderStart = 0
    /// Ids `pruneOrder` dropped from the front of `order`.
    private var orderDropped = 0
    private var entries: [UUID: Entry] = [:]
    /// Frames of the file that no longer carry a live event.
    private var deadFrames = 0
    /// What opening the file repaired (nil: nothing).
    private(set) var recovery: LogRecovery?
    /// Told of damage found after opening (`setAsideDamage`), once it was repaired; what was
    /// found before this is set is told when it is.
    var onRecovery: ((LogRecovery) -> Void)? {
        didSet {
            guard let onRecovery else { return }
            let waiting = untold
            untold = []
            for recovery in waiting { onRecovery(recovery) }
        }
    }
    private var untold: [LogRecovery] = []

    /// Rewrite when at least this many frames are dead and they outnumber the live ones.
    static let compactionThreshold = 1000

    /// Opens (or creates) the log at `url`, reading it `scanChunkSize` bytes at a time.
    init(url: URL, scanChunkSize: Int = FramedLog.scanChunkSize) throws {
        self.url = url
        let existed = FileManager.default.fileExists(atPath: url.path)
        file = try DurableFile(path: url.path)
        let scan = try FramedLog.scan(
            size: try file.size(), chunkSize: scanChunkSize, path: url.path, read: file.read(at:count:)
        ) { frame in
            let record: LogRecord
            do {
                record = try Self.decode(Data(frame.body))
            } catch {
                // A frame with a good checksum that is not a record: a later format. Refuse
                // rather than drop what we cannot read.
                throw StorageFailure(message: "\(url.path): unreadable record at byte \(frame.offset): \(error)")
            }
            apply(record, frame: frame.range)
        }
        // Kept aside (durably) before anything here changes the file.
        let copy = scan.damaged.isEmpty ? nil : try keepAside(scan.damaged)
        if scan.validEnd == 0 {
            // New (or its creation was torn, or what was there is set aside): write the header.
            try file.truncate(to: 0)
            try file.write(FramedLog.header, at: 0)
            try file.sync()
            if !existed { try FileSystem.syncDirectory(url.deletingLastPathComponent()) }
            end = FramedLog.header.count
        } else {
            end = scan.validEnd
        }
        if scan.needsRewrite {
            // Also for a length field put right (`FramedLog.Scan.repairedLengths`), which alone
            // is not told: the event is whole, as when it is found while the client runs.
            try rewrite()
            if !scan.damaged.isEmpty || scan.tornBytes > 0 {
                recovery = LogRecovery(
                    file: url, tornBytesDropped: scan.tornBytes,
                    damagedFrames: scan.damaged.count - (scan.damagedHeader ? 1 : 0), damagedCopy: copy,
                    damagedHeader: scan.damagedHeader)
            }
        } else if scan.tornBytes > 0 && scan.validEnd > 0 {
            try file.truncate(to: end)
            try file.sync()
            recovery = LogRecovery(file: url, tornBytesDropped: scan.tornBytes, damagedFrames: 0, damagedCopy: nil)
        }
    }

    deinit { file.close() }

    func close() { file.close() }

    /// Live events.
    var count: Int { entries.count }

    /// The file's size in bytes.
    var fileSize: Int { end }

    func contains(_ id: UUID) -> Bool { entries[id] != nil }

    /// Live ids, oldest first.
    var ids: [UUID] { liveOrder() }

    private func apply(_ record: LogRecord, frame: Range<Int>) {
        switch record.op {
        case .event:
            guard let id = record.clientID else {
                deadFrames += 1
                return
            }
            let position: Int
            if let entry = entries[id] {
                deadFrames += 1
                position = entry.position
            } else {
                position = orderDropped + order.count
                order.append(id)
            }
            entries[id] = Entry(type: record.type ?? "", frame: frame, position: position)
        case .ack, .drop:
            deadFrames += 1
            for id in record.ids ?? [] where entries.removeValue(forKey: id) != nil { deadFrames += 1 }
        }
    }

    /// Appends events and makes them durable (one write, one sync).
    func append(_ events: [StoredEvent]) throws {
        guard !events.isEmpty else { return }
        try ensureWhole()
        var bytes: [UInt8] = []
        var records: [(LogRecord, Range<Int>)] = []
        for event in events {
            let record = LogRecord(
                op: .event, clientID: event.clientID, type: event.type,
                payload: String(decoding: event.payload, as: UTF8.self), clientTimestamp: event.clientTimestamp,
                rejection: event.rejection, quarantineID: event.quarantineID, requeuedFrom: event.requeuedFrom)
            let frame = FramedLog.frame(try Self.encode(record))
            let start = end + bytes.count
            records.append((record, start..<(start + frame.count)))
            bytes += frame
        }
        try writeAtEnd(bytes)
        end += bytes.count
        for (record, range) in records { apply(record, frame: range) }
    }

    /// Before a write at the end: when the file is shorter than what was written to it (cut
    /// short by something else, a torn write found only now), the frame would go after a
    /// hole, where opening the file again takes it for damage and leaves it out. The damage
    /// is set aside first (`setAsideDamage`) and the file rewritten to end where its last
    /// live frame does.
    private func ensureWhole() throws {
        guard try file.size() < end else { return }
        if try !setAsideDamage() { try rewrite() }
    }

    /// Writes `bytes` at the end of the file and syncs them. When either fails the file is
    /// cut back to where it ended: a frame whose call threw must not come back when the file
    /// is next read (an event `record` said it could not keep, kept after all, and recorded
    /// again by the app: twice on the server).
    private func writeAtEnd(_ bytes: [UInt8]) throws {
        do {
            try file.write(bytes, at: end)
            try syncFile(file)
        } catch {
            try? file.truncate(to: end)
            try? file.sync()
            throw error
        }
    }

    /// The clock that names damaged copies; tests stop it.
    var now: () -> Date = { Date() }

    /// How a write is made durable (`DurableFile.sync`); tests make it fail.
    var syncFile: (DurableFile) throws -> Void = { try $0.sync() }

    /// Removes events (`ack`: the server has them; `drop`: moved or discarded), durably.
    /// Ids not in the log are ignored.
    func remove(_ ids: [UUID], as operation: LogRecord.Operation) throws {
        guard ids.contains(where: { entries[$0] != nil }) else { return }
        try ensureWhole()
        let present = ids.filter { entries[$0] != nil }
        guard !present.isEmpty else { return }
        precondition(operation != .event)
        let frame = FramedLog.frame(try Self.encode(LogRecord(op: operation, ids: present)))
        try writeAtEnd(frame)
        apply(LogRecord(op: operation, ids: present), frame: end..<(end + frame.count))
        end += frame.count
        try compactIfUseful()
    }

    /// The oldest live events, at most `maxEvents` and — but for the first — at most
    /// `maxBytes` of payload and type together. A frame found damaged on the way is set
    /// aside (`setAsideDamage`) and the events after it are read on.
    func oldest(maxEvents: Int, maxBytes: Int = .max) throws -> [StoredEvent] {
        while true {
            do {
                return try readOldest(maxEvents: maxEvents, maxBytes: maxBytes)
            } catch let damage as DamagedFrame {
                // Each round takes at least one event out of the log, so this ends.
                guard try setAsideDamage() else { throw StorageFailure(message: damage.description) }
            }
        }
    }

    private func readOldest(maxEvents: Int, maxBytes: Int) throws -> [StoredEvent] {
        var events: [StoredEvent] = []
        var bytes = 0
        pruneOrder()
        for index in orderStart..<order.count where isLive(index) {
            if events.count >= maxEvents { break }
            let event = try readIntact(order[index])
            let size = event.payload.count + event.type.utf8.count
            if !events.isEmpty && bytes + size > maxBytes { break }
            bytes += size
            events.append(event)
        }
        return events
    }

    /// Every live event, oldest first.
    func all() throws -> [StoredEvent] { try oldest(maxEvents: .max) }

    /// One live event; nil when there is none with that id, or its frame was found damaged
    /// (and set aside: `setAsideDamage`).
    func read(_ id: UUID) throws -> StoredEvent? {
        guard entries[id] != nil else { return nil }
        do {
            return try readIntact(id)
        } catch let damage as DamagedFrame {
            guard try setAsideDamage() else { throw StorageFailure(message: damage.description) }
            guard entries[id] != nil else { return nil }
            return try readIntact(id)
        }
    }

    /// A live event's frame no longer reads back as it was written: its bytes changed on
    /// disk, or the file is shorter (a torn write found only now, something else writing).
    struct DamagedFrame: Error, CustomStringConvertible {
        var url: URL
        var id: UUID
        var description: String { "\(url.path): the frame of event \(id) changed on disk" }
    }

    /// One live event, read back from its frame; `DamagedFrame` when the frame is not the
    /// one that was written (or only its length field is not: see `setAsideDamage`).
    private func readIntact(_ id: UUID) throws -> StoredEvent {
        guard let entry = entries[id] else { throw StorageFailure(message: "\(url.path): no event \(id)") }
        guard case .intact(let record) = try check(entry.frame, of: id), let payload = record.payload,
            let type = record.type, let timestamp = record.clientTimestamp
        else { throw DamagedFrame(url: url, id: id) }
        return StoredEvent(
            clientID: id, type: type, payload: Array(payload.utf8), clientTimestamp: timestamp,
            rejection: record.rejection, quarantineID: record.quarantineID, requeuedFrom: record.requeuedFrom)
    }

    /// What reading a live event's frame back finds.
    private enum FrameCheck {
        /// As written.
        case intact(LogRecord)
        /// The body as written (its checksum matches, it is the event's record) but the length
        /// in the frame's header is not: the event is whole, the file must be rewritten before
        /// it is read from the start again (`FramedLog.scan` follows the length).
        case wrongLength
        /// Not the frame written: the body's checksum does not match, it is cut off, or it is
        /// another record.
        case damaged
    }

    private func check(_ range: Range<Int>, of id: UUID) throws -> FrameCheck {
        guard case let (body, lengthRight)? = try frameBody(range),
            let record = try? Self.decode(Data(body)), record.op == .event, record.clientID == id
        else { return .damaged }
        return lengthRight ? .intact(record) : .wrongLength
    }

    /// The body of the frame at `range` when it is whole and its checksum matches (nil when
    /// not), and whether the frame's length field is right. (The index knows where the frame
    /// ends; the length field matters to `FramedLog.scan`.)
    private func frameBody(_ range: Range<Int>) throws -> (body: [UInt8], lengthRight: Bool)? {
        let bytes = try file.read(at: range.lowerBound, count: range.count)
        guard bytes.count == range.count, bytes.count > FramedLog.frameHeaderSize else { return nil }
        let body = Array(bytes[FramedLog.frameHeaderSize...])
        guard FramedLog.readBigEndian(bytes, at: 4) == CRC32.checksum(body) else { return nil }
        return (body, Int(FramedLog.readBigEndian(bytes, at: 0)) == body.count)
    }

    /// Damage found after opening (a live event's frame changed on disk, or is cut off): checks
    /// every live frame, keeps the bytes of the damaged ones beside the file (as opening does:
    /// `outbox.log.damaged-…`), takes their events out of the log and rewrites it without them
    /// (temporary file, sync, rename: every frame written anew), then tells `onRecovery`. The
    /// other events stay, in their order; one whose only damage is its frame's length field
    /// stays too (its body and checksum prove it whole). Returns whether anything was wrong.
    @discardableResult
    func setAsideDamage() throws -> Bool {
        var damaged: [(id: UUID, frame: Range<Int>)] = []
        var wrongLength = false
        for id in liveOrder() {
            guard let entry = entries[id] else { continue }
            switch try check(entry.frame, of: id) {
            case .intact: continue
            case .wrongLength: wrongLength = true
            case .damaged: damaged.append((id, entry.frame))
            }
        }
        guard !damaged.isEmpty || wrongLength else { return false }
        let size = try file.size()
        let kept = damaged.map { $0.frame.clamped(to: 0..<max(0, size)) }.filter { !$0.isEmpty }
        // Kept aside (durably) before the rewrite drops them from the log.
        let copy = kept.isEmpty ? nil : try keepAside(kept)
        for (id, _) in damaged { entries.removeValue(forKey: id) }
        try rewrite()
        if !damaged.isEmpty {
            let recovery = LogRecovery(
                file: url, tornBytesDropped: 0, damagedFrames: damaged.count, damagedCopy: copy,
                damagedEvents: damaged.map(\.id))
            if let onRecovery { onRecovery(recovery) } else { untold.append(recovery) }
        }
        return true
    }

    /// Writes the bytes of `ranges` of the file, in order, to a new file beside it
    /// (`<name>.damaged-<ms>`, never one already there), durably; its URL.
    private func keepAside(_ ranges: [Range<Int>]) throws -> URL {
        let directory = url.deletingLastPathComponent()
        let stem = "\(url.lastPathComponent).damaged-\(Int(now().timeIntervalSince1970 * 1000))"
        var copy = directory.appendingPathComponent(stem)
        // Two in the same millisecond, or a clock set back: the earlier copy stays.
        var suffix = 1
        while FileManager.default.fileExists(atPath: copy.path) {
            suffix += 1
            copy = directory.appendingPathComponent("\(stem)-\(suffix)")
        }
        try FileSystem.writeAtomically(to: copy) { append in
            for range in ranges {
                for start in stride(from: range.lowerBound, to: range.upperBound, by: FileSystem.writeStep) {
                    try append(try file.read(at: start, count: min(FileSystem.writeStep, range.upperBound - start)))
                }
            }
        }
        return copy
    }

    /// Cuts the file back to its header when nothing is live; rewrites it when dead frames
    /// dominate.
    func compactIfUseful() throws {
        if entries.isEmpty {
            guard end > FramedLog.header.count else { return }
            try file.truncate(to: FramedLog.header.count)
            try file.sync()
            end = FramedLog.header.count
            order = []
            orderStart = 0
            orderDropped = 0
            deadFrames = 0
        } else if deadFrames >= Self.compactionThreshold && deadFrames > entries.count {
            do {
                try rewrite()
            } catch is DamagedFrame {
                // Kept aside and left out; the rest is rewritten.
                guard try setAsideDamage() else { throw StorageFailure(message: "\(url.path): cannot compact") }
            }
        }
    }

    /// Writes the live frames to a new file and renames it over this one (a frame at a
    /// time: the log is never held in memory whole). Each is checked as it is copied: one
    /// that changed on disk is never copied into the new file (where, last, it would read as
    /// a torn write and be dropped unseen), the rewrite throws `DamagedFrame` instead.
    func rewrite() throws {
        pruneOrder()
        let live = liveOrder()
        var size = FramedLog.header.count
        var moved: [UUID: Entry] = [:]
        try FileSystem.writeAtomically(to: url) { append in
            try append(FramedLog.header)
            for id in live {
                guard var entry = entries[id] else { continue }
                // Framed anew: a length field that alone was damaged is right again.
                guard case let (body, _)? = try frameBody(entry.frame) else { throw DamagedFrame(url: url, id: id) }
                let frame = FramedLog.frame(body)
                entry.frame = size..<(size + frame.count)
                entry.position = moved.count
                try append(frame)
                size += frame.count
                moved[id] = entry
            }
        }
        file.close()
        file = try DurableFile(path: url.path, create: false)
        end = size
        entries = moved
        order = live
        orderStart = 0
        orderDropped = 0
        deadFrames = 0
    }

    /// Whether the id at `index` of `order` is a live event's place.
    private func isLive(_ index: Int) -> Bool { entries[order[index]]?.position == orderDropped + index }

    /// Live ids, oldest first.
    private func liveOrder() -> [UUID] {
        (orderStart..<order.count).filter(isLive).map { order[$0] }
    }

    /// Forgets removed ids at the front of `order` (acks come oldest first).
    private func pruneOrder() {
        while orderStart < order.count && !isLive(orderStart) { orderStart += 1 }
        if orderStart > 4096 && orderStart * 2 > order.count {
            order.removeFirst(orderStart)
            orderDropped += orderStart
            orderStart = 0
        }
    }

    private static func decode(_ data: Data) throws -> LogRecord {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .millisecondsSince1970
        return try decoder.decode(LogRecord.self, from: data)
    }

    private static func encode(_ record: LogRecord) throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .millisecondsSince1970
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array(try encoder.encode(record))
    }
}
