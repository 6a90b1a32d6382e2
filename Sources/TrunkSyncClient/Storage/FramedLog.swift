import Foundation

/// The on-disk format of the outbox and the quarantine: an append-only file of framed
/// records.
///
///     file   = header frame*
///     header = "TRUNKSYNC-LOG-1\n"                        (16 bytes)
///     frame  = length:u32be  crc:u32be  body:length bytes
///     body   = one JSON object (UTF-8), see `LogRecord`
///
/// `crc` is the CRC-32 (IEEE 802.3, as zlib's `crc32`) of `body`; `length` is 1…16 MiB.
/// A frame is written with one `write` and made durable with `fsync` before the call that
/// wrote it returns.
///
/// Reading after a crash (`FramedLog.scan`):
/// - an incomplete last frame (short header or body), or a complete last frame whose
///   checksum does not match, is a write the crash tore: it is dropped, silently (its
///   `record` call never returned);
/// - a frame whose checksum does not match *before* other frames is damage (a bad sector,
///   a stray write): it is skipped, the frames after it are kept, and its bytes are kept
///   aside for inspection. Reading goes on at the next whole frame (a length that fits and
///   a body that starts with `{` and matches its checksum), not where a damaged length field
///   points, so damage to one frame's length, or bytes zeroed in the middle, never loses the
///   frames after it; a frame whose length field alone is wrong (its body up to the next
///   whole frame, or to the end of the file, matches the checksum) keeps its record, and the
///   file is written anew;
/// - with no whole frame after it, a frame length outside 1…16 MiB ends the readable part:
///   the rest of the file is dropped if it is all zero bytes (a file system that extended
///   the file but never wrote the data) and otherwise kept aside as damage;
/// - a header that is not this one is damage too (the header carries no data but the
///   format's version): its 16 bytes are kept aside and the frames after it read as
///   usual, so a file whose header alone was hit keeps every event, and one that is
///   damaged throughout (or not a log at all) is kept aside whole and starts afresh. Only
///   the header of a later version of the format (`TRUNKSYNC-LOG-<n>\n`, `n` > 1: written
///   by a newer version of the client) is refused: that version reads it, and setting it
///   aside here would take its events out of the outbox for good.
///
/// `scan` reads the file in chunks and hands each frame over as it is read, so opening a
/// log of any size holds at most about a chunk and the largest frame (≤ 16 MiB) in memory
/// (past damage, while it looks for the next whole frame, up to two frames' worth).
enum FramedLog {
    static let header: [UInt8] = Array("TRUNKSYNC-LOG-1\n".utf8)
    static let frameHeaderSize = 8
    static let maxBodySize = 16 * 1024 * 1024
    /// How much `scan` reads at a time (a frame larger than this is read whole).
    static let scanChunkSize = 1024 * 1024

    /// One frame read back: where it starts and its body.
    struct Frame: Equatable {
        var offset: Int
        var body: [UInt8]
        /// Offset and size of the whole frame (header included).
        var range: Range<Int> { offset..<(offset + FramedLog.frameHeaderSize + body.count) }
    }

    /// What `scan` found, besides the frames it handed over.
    struct Scan: Equatable {
        /// Where the readable part ends: the file should be cut here.
        var validEnd: Int
        /// Bytes of a torn last write, dropped.
        var tornBytes = 0
        /// Where the damaged frames and unreadable tails are, in file order (their bytes are
        /// to be kept aside).
        var damaged: [Range<Int>] = []
        /// Whether the header was not the format's (its bytes are the first of `damaged`).
        var damagedHeader = false
        /// Frames handed over whose length field alone was wrong: the file must be written
        /// anew with it right.
        var repairedLengths = 0
        /// Whether the file must be rewritten (damage in the middle, a length to put right)
        /// rather than cut.
        var needsRewrite: Bool { !damaged.isEmpty || repairedLengths > 0 }
    }

    enum FormatError: Error, CustomStringConvertible {
        /// A later version of the format (`TRUNKSYNC-LOG-<version>\n`), which this client
        /// cannot read and must not set aside.
        case laterFormat(String, version: String)
        var description: String {
            switch self {
            case .laterFormat(let path, let version):
                return "\(path) is in version \(version) of the log format, written by a newer version of the client"
            }
        }
    }

    /// The version of a later format whose header `bytes` (the file's first bytes) begin
    /// with: `TRUNKSYNC-LOG-`, a number over 1 without leading zeros, a line feed.
    static func laterVersion(_ bytes: ArraySlice<UInt8>) -> String? {
        let prefix = Array("TRUNKSYNC-LOG-".utf8)
        guard bytes.starts(with: prefix) else { return nil }
        let digits = bytes.dropFirst(prefix.count).prefix { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
        guard let first = digits.first, first != UInt8(ascii: "0"), digits.count <= 9,
            bytes.dropFirst(prefix.count + digits.count).first == UInt8(ascii: "\n")
        else { return nil }
        let version = String(decoding: digits, as: UTF8.self)
        return version == "1" ? nil : version
    }

    /// One frame's bytes.
    static func frame(_ body: [UInt8]) -> [UInt8] {
        precondition(!body.isEmpty && body.count <= maxBodySize, "frame body of \(body.count) bytes")
        var bytes = [UInt8]()
        bytes.reserveCapacity(frameHeaderSize + body.count)
        appendBigEndian(UInt32(body.count), to: &bytes)
        appendBigEndian(CRC32.checksum(body), to: &bytes)
        bytes.append(contentsOf: body)
        return bytes
    }

    /// Reads a log of `size` bytes through `read` (`count` bytes at `offset`, all of them:
    /// the caller holds the file still), at most about `chunkSize` bytes at a time besides
    /// a frame larger than that, and calls `visit` with each good frame, in file order. An
    /// empty file, or one holding only a prefix of the header (a creation the crash tore),
    /// is an empty log with `validEnd` 0.
    static func scan(
        size: Int, chunkSize: Int = scanChunkSize, path: String = "log",
        read: (_ offset: Int, _ count: Int) throws -> [UInt8], visit: (Frame) throws -> Void
    ) throws -> Scan {
        precondition(chunkSize > 0)
        var window = ScanWindow(size: size, chunkSize: chunkSize)
        func bytes(_ range: Range<Int>) throws -> ArraySlice<UInt8> {
            try window.bytes(range, path: path, read: read)
        }
        let start = try bytes(0..<min(size, 32))
        if let version = laterVersion(start) { throw FormatError.laterFormat(path, version: version) }
        if size < header.count {
            // A creation the crash tore; anything else there is damage.
            guard header.prefix(size).elementsEqual(start) else {
                return Scan(validEnd: 0, damaged: [0..<size], damagedHeader: true)
            }
            return Scan(validEnd: 0, tornBytes: size)
        }
        var scan = Scan(validEnd: header.count)
        if !header.elementsEqual(start.prefix(header.count)) {
            scan.damaged = [0..<header.count]
            scan.damagedHeader = true
        }
        // What the last search past a place that is not a whole frame found (`wholeFrame`):
        // reused until reading passes it.
        var found: Found? = nil
        var position = header.count
        while position < size {
            let remaining = size - position
            if remaining < frameHeaderSize {
                scan.tornBytes = remaining
                break
            }
            let frameHeader = Array(try bytes(position..<(position + frameHeaderSize)))
            let length = Int(readBigEndian(frameHeader, at: 0))
            let checksum = readBigEndian(frameHeader, at: 4)
            let end = position + frameHeaderSize + length
            let plausible = length > 0 && length <= maxBodySize && end <= size
            if plausible {
                let body = Array(try bytes(position..<end).dropFirst(frameHeaderSize))
                if CRC32.checksum(body) == checksum {
                    try visit(Frame(offset: position, body: body))
                    scan.validEnd = end
                    position = end
                    continue
                }
            }
            // Not a whole frame: damage, or the write a crash tore (only ever the last thing in
            // the file). Whether a whole frame follows tells them apart, and reading goes on
            // there: following a damaged length field would lose every frame after it.
            let bodyStart = position + frameHeaderSize
            if found.map({ $0.next.map { $0 <= position } ?? false }) ?? true {
                found = try wholeFrame(after: position, keepingFrom: bodyStart, size: size, bytes: bytes)
            }
            if let next = found?.next {
                var whole: [UInt8]? = nil
                if next - bodyStart > 0, next - bodyStart <= maxBodySize {
                    let body = Array(try bytes(bodyStart..<next))
                    if body.first == UInt8(ascii: "{"), CRC32.checksum(body) == checksum { whole = body }
                }
                if let body = whole {
                    // Only the length field is wrong: the body up to the next whole frame matches
                    // the checksum, so the frame is whole (the file is written anew, length right).
                    try visit(Frame(offset: position, body: body))
                    scan.validEnd = next
                    scan.repairedLengths += 1
                    position = next
                } else if plausible, end < next {
                    // A damaged body whose length may still be right: what follows it is looked
                    // at in turn (each damaged frame is counted).
                    scan.damaged.append(position..<end)
                    position = end
                } else {
                    scan.damaged.append(position..<next)
                    position = next
                }
                continue
            }
            // No whole frame after it: the end of the file, as a crash leaves it or damaged. The
            // last frame whose length field alone is wrong matches its checksum up to the end.
            if size - bodyStart > 0, size - bodyStart <= maxBodySize {
                let body = Array(try bytes(bodyStart..<size))
                if body.first == UInt8(ascii: "{"), CRC32.checksum(body) == checksum {
                    try visit(Frame(offset: position, body: body))
                    scan.validEnd = size
                    scan.repairedLengths += 1
                    break
                }
            }
            if length == 0 || length > maxBodySize {
                let zero = frameHeader[0] == 0 && (found?.lastNonZero ?? -1) <= position
                if zero { scan.tornBytes = remaining } else { scan.damaged.append(position..<size) }
                break
            }
            if end >= size {
                scan.tornBytes = remaining
                break
            }
            scan.damaged.append(position..<end)
            position = end
        }
        return scan
    }

    /// What `wholeFrame` found past a place that is not a whole frame.
    private struct Found {
        /// Where the first whole frame after it starts (nil: none up to the end of the file).
        var next: Int?
        /// With no whole frame after it: the last byte after it that is not zero (nil: none).
        var lastNonZero: Int?
    }

    /// Looks for the first whole frame after `position` (which is not one): a length of
    /// 1…16 MiB that fits in the file, a body that starts as every record does (`{`: a JSON
    /// object) and matches the checksum. A record is JSON text, which holds no byte below
    /// 0x20, so no frame seems to start inside one (a length's first byte is 0x00 or 0x01).
    /// Reads go forward and keep what lies from `keep` on while it is within a frame's size
    /// of the place looked at, for the caller to read again (a body whose length field alone
    /// is wrong): no byte is read twice.
    private static func wholeFrame(
        after position: Int, keepingFrom keep: Int, size: Int, bytes: (Range<Int>) throws -> ArraySlice<UInt8>
    ) throws -> Found {
        var lastNonZero: Int? = nil
        var candidate = position + 1
        while candidate + frameHeaderSize < size {
            let lower = candidate - keep <= maxBodySize ? min(candidate, keep) : candidate
            let head = try bytes(lower..<(candidate + frameHeaderSize + 1)).suffix(frameHeaderSize + 1)
            let first = head.startIndex
            if head[first] != 0 { lastNonZero = candidate }
            if head[first] <= 0x01, head[first + frameHeaderSize] == UInt8(ascii: "{") {
                let length =
                    Int(head[first]) << 24 | Int(head[first + 1]) << 16 | Int(head[first + 2]) << 8
                    | Int(head[first + 3])
                let end = candidate + frameHeaderSize + length
                if length > 0, length <= maxBodySize, end <= size {
                    let checksum =
                        UInt32(head[first + 4]) << 24 | UInt32(head[first + 5]) << 16
                        | UInt32(head[first + 6]) << 8 | UInt32(head[first + 7])
                    let body = try bytes(lower..<end).suffix(length)
                    if CRC32.checksum(Array(body)) == checksum { return Found(next: candidate) }
                }
            }
            candidate += 1
        }
        if candidate < size {
            let lower = candidate - keep <= maxBodySize ? min(candidate, keep) : candidate
            let tail = try bytes(lower..<size).suffix(size - candidate)
            if let last = tail.lastIndex(where: { $0 != 0 }) { lastNonZero = candidate + (last - tail.startIndex) }
        }
        return Found(next: nil, lastNonZero: lastNonZero)
    }

    /// The bytes `scan` has read and not yet passed: reads go forward, at least a chunk at
    /// a time, and drop what lies before the range asked for.
    private struct ScanWindow {
        let size: Int
        let chunkSize: Int
        var start = 0
        var bytes: [UInt8] = []

        init(size: Int, chunkSize: Int) {
            self.size = size
            self.chunkSize = chunkSize
        }

        mutating func bytes(
            _ range: Range<Int>, path: String, read: (_ offset: Int, _ count: Int) throws -> [UInt8]
        ) throws -> ArraySlice<UInt8> {
            let end = start + bytes.count
            if range.lowerBound < start || range.upperBound > end {
                var kept =
                    range.lowerBound >= start && range.lowerBound < end
                    ? Array(bytes[(range.lowerBound - start)...]) : []
                bytes = []
                let from = range.lowerBound + kept.count
                let count = min(max(range.upperBound - from, chunkSize), size - from)
                let more = try read(from, count)
                guard more.count == count else {
                    throw StorageFailure(
                        message: "\(path): \(count) bytes expected at byte \(from), \(more.count) read")
                }
                kept += more
                bytes = kept
                start = range.lowerBound
            }
            return bytes[(range.lowerBound - start)..<(range.upperBound - start)]
        }
    }

    static func appendBigEndian(_ value: UInt32, to bytes: inout [UInt8]) {
        bytes.append(UInt8(truncatingIfNeeded: value >> 24))
        bytes.append(UInt8(truncatingIfNeeded: value >> 16))
        bytes.append(UInt8(truncatingIfNeeded: value >> 8))
        bytes.append(UInt8(truncatingIfNeeded: value))
    }

    static func readBigEndian(_ bytes: [UInt8], at offset: Int) -> UInt32 {
        UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8
            | UInt32(bytes[offset + 3])
    }
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), as zlib and PNG use it.
enum CRC32 {
    private static let table: [UInt32] = (0..<256).map { index -> UInt32 in
        var value = UInt32(index)
        for _ in 0..<8 { value = value & 1 == 1 ? 0xEDB8_8320 ^ (value >> 1) : value >> 1 }
        return value
    }

    static func checksum(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        table.withUnsafeBufferPointer { table in
            for byte in bytes { crc = table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8) }
        }
        return crc ^ 0xFFFF_FFFF
    }
}
