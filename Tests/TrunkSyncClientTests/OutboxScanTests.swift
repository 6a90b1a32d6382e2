import Foundation
import XCTest

@testable import TrunkSyncClient

/// Scans `bytes` as `EventLog` scans a file, collecting the frames and the size of every
/// read.
func scanBytes(_ bytes: [UInt8], chunkSize: Int = FramedLog.scanChunkSize) throws -> (
    scan: FramedLog.Scan, frames: [FramedLog.Frame], reads: [Int]
) {
    var frames: [FramedLog.Frame] = []
    var reads: [Int] = []
    let scan = try FramedLog.scan(size: bytes.count, chunkSize: chunkSize) { offset, count in
        reads.append(count)
        return Array(bytes[offset..<min(offset + count, bytes.count)])
    } visit: {
        frames.append($0)
    }
    return (scan, frames, reads)
}

/// Opening a log reads it in chunks (`FramedLog.scan`), so that a large outbox does not
/// have to fit in memory twice: whatever the chunk size, and wherever frames cross chunk
/// boundaries, the result is the one a scan of the whole file at once gives.
final class OutboxScanTests: XCTestCase {
    /// What a scan of the whole file held in memory finds: the scan as it was before it read
    /// in chunks, kept as the reference the chunked one must match.
    struct WholeFileScan: Equatable {
        var frames: [Piece] = []
        var validEnd: Int
        var tornBytes = 0
        var damaged: [Piece] = []
        var damagedHeader = false
        var repairedLengths = 0
        var laterFormat = false
    }

    /// A frame (its body) or damaged bytes, short enough to read in a failure message.
    struct Piece: Equatable, CustomStringConvertible {
        var range: Range<Int>
        var checksum: UInt32
        init(_ range: Range<Int>, _ bytes: [UInt8]) {
            self.range = range
            checksum = CRC32.checksum(bytes)
        }
        var description: String { "\(range) crc \(checksum)" }
    }

    static func wholeFileScan(_ bytes: [UInt8]) -> WholeFileScan {
        let header = FramedLog.header
        let text = String(decoding: bytes.prefix(32), as: UTF8.self)
        if let match = text.firstMatch(of: /^TRUNKSYNC-LOG-([1-9][0-9]{0,8})\n/), match.1 != "1" {
            return WholeFileScan(validEnd: 0, laterFormat: true)
        }
        if bytes.count < header.count {
            guard Array(header.prefix(bytes.count)) == bytes else {
                return WholeFileScan(validEnd: 0, damaged: [Piece(0..<bytes.count, bytes)], damagedHeader: true)
            }
            return WholeFileScan(validEnd: 0, tornBytes: bytes.count)
        }
        var scan = WholeFileScan(validEnd: header.count)
        if Array(bytes[0..<header.count]) != header {
            scan.damaged = [Piece(0..<header.count, Array(bytes[0..<header.count]))]
            scan.damagedHeader = true
        }
        /// Whether a whole frame starts at `offset`, and where it ends.
        func wholeFrame(at offset: Int) -> Int? {
            guard offset + FramedLog.frameHeaderSize <= bytes.count else { return nil }
            let length = Int(FramedLog.readBigEndian(bytes, at: offset))
            let end = offset + FramedLog.frameHeaderSize + length
            guard length > 0, length <= FramedLog.maxBodySize, end <= bytes.count,
                CRC32.checksum(Array(bytes[(offset + FramedLog.frameHeaderSize)..<end]))
                    == FramedLog.readBigEndian(bytes, at: offset + 4)
            else { return nil }
            return end
        }
        var position = header.count
        while position < bytes.count {
            let remaining = bytes.count - position
            if remaining < FramedLog.frameHeaderSize {
                scan.tornBytes = remaining
                break
            }
            let length = Int(FramedLog.readBigEndian(bytes, at: position))
            let checksum = FramedLog.readBigEndian(bytes, at: position + 4)
            let end = position + FramedLog.frameHeaderSize + length
            if let frameEnd = wholeFrame(at: position) {
                scan.frames.append(
                    Piece(position..<frameEnd, Array(bytes[(position + FramedLog.frameHeaderSize)..<frameEnd])))
                scan.validEnd = frameEnd
                position = frameEnd
                continue
            }
            // Not a whole frame: reading goes on at the next whole one (whose body starts with
            // `{`, as every record's), if any.
            let next = ((position + 1)..<bytes.count).first { offset in
                offset + FramedLog.frameHeaderSize < bytes.count
                    && bytes[offset + FramedLog.frameHeaderSize] == UInt8(ascii: "{") && wholeFrame(at: offset) != nil
            }
            if let next {
                let bodyStart = position + FramedLog.frameHeaderSize
                let body = next > bodyStart ? Array(bytes[bodyStart..<next]) : []
                if body.first == UInt8(ascii: "{"), body.count <= FramedLog.maxBodySize,
                    CRC32.checksum(body) == checksum
                {
                    scan.frames.append(Piece(position..<next, body))
                    scan.validEnd = next
                    scan.repairedLengths += 1
                    position = next
                } else if length > 0, length <= FramedLog.maxBodySize, end < next {
                    scan.damaged.append(Piece(position..<end, Array(bytes[position..<end])))
                    position = end
                } else {
                    scan.damaged.append(Piece(position..<next, Array(bytes[position..<next])))
                    position = next
                }
                continue
            }
            let rest = Array(bytes[(position + FramedLog.frameHeaderSize)...])
            if rest.first == UInt8(ascii: "{"), rest.count <= FramedLog.maxBodySize, CRC32.checksum(rest) == checksum {
                scan.frames.append(Piece(position..<bytes.count, rest))
                scan.validEnd = bytes.count
                scan.repairedLengths += 1
                break
            }
            if length == 0 || length > FramedLog.maxBodySize {
                let tail = Array(bytes[position...])
                if tail.allSatisfy({ $0 == 0 }) {
                    scan.tornBytes = tail.count
                } else {
                    scan.damaged.append(Piece(position..<bytes.count, tail))
                }
                break
            }
            if end >= bytes.count {
                scan.tornBytes = remaining
                break
            }
            scan.damaged.append(Piece(position..<end, Array(bytes[position..<end])))
            position = end
        }
        return scan
    }

    static let chunkSizes = [1, 7, 64, 4096]

    /// A log of frames of many sizes (some far larger than the small chunks), events and
    /// acknowledgements.
    static func log() -> (bytes: [UInt8], frames: [Range<Int>]) {
        var bytes = FramedLog.header
        var frames: [Range<Int>] = []
        for (index, size) in [1, 30, 700, 5, 3000, 64, 63, 65, 200].enumerated() {
            let body =
                index == 5
                ? Array(#"{"op":"ack","ids":[]}"#.utf8)
                : Array(#"{"op":"event","n":"\#(String(repeating: "x", count: size))"}"#.utf8)
            let frame = FramedLog.frame(body)
            frames.append(bytes.count..<(bytes.count + frame.count))
            bytes += frame
        }
        return (bytes, frames)
    }

    /// Every file the format's recovery rules distinguish, built from `log()`.
    static func damagedFiles() -> [(String, [UInt8])] {
        let (full, frames) = log()
        var files: [(String, [UInt8])] = [
            ("empty", []), ("clean", full), ("not a log", Array("hello, not a log".utf8)),
            ("short, not a log", Array("hello".utf8)), ("long, not a log", Array(repeating: 0x41, count: 5000)),
            ("a later format", Array("TRUNKSYNC-LOG-2\n".utf8) + full.dropFirst(FramedLog.header.count)),
            ("a later format, long version", Array("TRUNKSYNC-LOG-123456789\nxyz".utf8)),
            ("version 0", Array("TRUNKSYNC-LOG-0\n".utf8) + full.dropFirst(FramedLog.header.count)),
            (
                "zeroed header",
                [UInt8](repeating: 0, count: FramedLog.header.count) + full.dropFirst(FramedLog.header.count)
            ),
            ("zeros", [UInt8](repeating: 0, count: 300)),
        ]
        for index in 0..<FramedLog.header.count {
            var header = full
            header[index] ^= 0x04
            files.append(("header byte \(index) damaged", header))
        }
        for cut in 0..<FramedLog.header.count { files.append(("header cut at \(cut)", Array(full.prefix(cut)))) }
        for cut in stride(from: FramedLog.header.count, to: full.count, by: 3) {
            files.append(("cut at \(cut)", Array(full.prefix(cut))))
        }
        for (index, frame) in frames.enumerated() {
            var body = full
            body[frame.upperBound - 1] ^= 0x5A
            files.append(("body of frame \(index) damaged", body))
            var checksum = full
            checksum[frame.lowerBound + 5] ^= 0x01
            files.append(("checksum of frame \(index) damaged", checksum))
            var zeroLength = full
            for offset in frame.lowerBound..<(frame.lowerBound + 4) { zeroLength[offset] = 0 }
            files.append(("length of frame \(index) zero", zeroLength))
            var huge = full
            huge[frame.lowerBound] = 0x7F
            files.append(("length of frame \(index) too large", huge))
            var longer = full
            longer[frame.lowerBound + 3] &+= 1
            files.append(("length of frame \(index) one longer", longer))
            var shorter = full
            shorter[frame.lowerBound + 3] &-= 1
            files.append(("length of frame \(index) one shorter", shorter))
            var farther = full
            farther[frame.lowerBound + 1] ^= 0x01
            files.append(("length of frame \(index) 64 KiB longer", farther))
            var zeroed = full
            for offset in frame { zeroed[offset] = 0 }
            files.append(("frame \(index) zeroed", zeroed))
        }
        var two = full
        two[frames[1].upperBound - 1] ^= 0xFF
        two[frames[4].upperBound - 1] ^= 0xFF
        files.append(("two frames damaged", two))
        files.append(("zero tail", full + [UInt8](repeating: 0, count: 5000)))
        files.append(("short zero tail", full + [0, 0, 0]))
        files.append(("garbage tail", full + [0xFF, 0xFF, 0xFF, 0xFF] + Array("not a frame".utf8)))
        files.append(("zero tail ending in garbage", full + [UInt8](repeating: 0, count: 300) + [1]))
        var zeroedMiddle = full
        for offset in frames[2].lowerBound..<frames[4].upperBound { zeroedMiddle[offset] = 0 }
        files.append(("zeros before frames", zeroedMiddle))
        return files
    }

    func testTheChunkedScanFindsWhatAWholeFileScanFinds() throws {
        for (name, bytes) in Self.damagedFiles() {
            let expected = Self.wholeFileScan(bytes)
            for chunkSize in Self.chunkSizes + [bytes.count + 1] {
                let context = "\(name), chunks of \(chunkSize)"
                do {
                    let (scan, frames, _) = try scanBytes(bytes, chunkSize: chunkSize)
                    XCTAssertFalse(expected.laterFormat, context)
                    let found = WholeFileScan(
                        frames: frames.map { Piece($0.range, $0.body) }, validEnd: scan.validEnd,
                        tornBytes: scan.tornBytes, damaged: scan.damaged.map { Piece($0, Array(bytes[$0])) },
                        damagedHeader: scan.damagedHeader, repairedLengths: scan.repairedLengths)
                    XCTAssertEqual(found, expected, context)
                } catch FramedLog.FormatError.laterFormat {
                    XCTAssertTrue(expected.laterFormat, context)
                }
            }
        }
    }

    /// The bound on memory: no read is larger than a chunk or the frame being read, and no
    /// byte is read twice.
    func testTheScanReadsAChunkOrAFrameAtATime() throws {
        let (full, frames) = Self.log()
        let largestFrame = try XCTUnwrap(frames.map(\.count).max())
        for (name, bytes) in Self.damagedFiles()
        where bytes.count > FramedLog.header.count && !Self.wholeFileScan(bytes).laterFormat {
            for chunkSize in Self.chunkSizes {
                let (_, _, reads) = try scanBytes(bytes, chunkSize: chunkSize)
                let context = "\(name), chunks of \(chunkSize)"
                XCTAssertLessThanOrEqual(reads.max() ?? 0, max(chunkSize, largestFrame), context)
                XCTAssertLessThanOrEqual(reads.reduce(0, +), bytes.count, context)
            }
        }
        let (_, _, reads) = try scanBytes(full, chunkSize: 64)
        XCTAssertEqual(reads.reduce(0, +), full.count)
    }
}
