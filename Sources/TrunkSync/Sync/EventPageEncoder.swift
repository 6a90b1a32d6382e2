import JSON
import Postgres

/// Encodes the rows of a page query (`EventRecord.selectList`) straight from libpq's binary
/// cells into the JSON array of a pull response's `events`: one allocation per page, no
/// `String`, `UUID` or intermediate array per row (the hot path of `GET /sync/v1/events`).
/// Each event object is `EventRecord.write`'s, at the indexes `EventRecord.Indexes` checked
/// by name.
///
/// The output is byte for byte what `JSONWriter` writes for the same values: strings escaped
/// as `JSONWriter.appendQuoted` does, UUIDs in lowercase, timestamps as `RFC3339.format`.
enum EventPageEncoder {
    /// How the events of a page are written around each event object.
    enum Framing {
        /// `[{…},{…}]`: the pull response's `events`.
        case jsonArray
        /// One Server-Sent Events message per event: `id: <seq>\nevent: event\ndata: {…}\n\n`
        /// (an event object is one line: JSON strings escape line breaks, and PostgreSQL
        /// prints `jsonb` on one line).
        case serverSentEvents
    }

    /// The first `count` rows of `rows` as `[{"id":…,"seq":…,…},{…}]` (or as Server-Sent
    /// Events), and the `seq` of the last one. With `maxBytes`, fewer rows when they would
    /// take more: the rows up to the first at which the page's room reaches `maxBytes` (the
    /// first row always; `count` says how many were written).
    /// - Throws: for columns other than `EventRecord.fields`, a `NULL`, an infinite
    ///   timestamp or a `jsonb` format other than version 1 (as the decoders it replaces).
    static func encode(
        _ rows: PostgresResult, count: Int, framing: Framing = .jsonArray, maxBytes: Int = .max
    ) throws -> (json: [UInt8], lastSeq: Int64?, count: Int) {
        let at = try EventRecord.Indexes(rows)
        // Exact sizes are known but for escapes: reserve the worst case (6 bytes per byte of
        // `type`) and write with pointers.
        var capacity = 2
        var count = count
        for index in 0..<count {
            capacity += EventRecord.capacity(rows[index], at) + 1
            if framing == .serverSentEvents { capacity += sseBytesPerRow }
            if capacity >= maxBytes {
                count = index + 1
                break
            }
        }
        var lastSeq: Int64? = nil
        let json = try [UInt8](unsafeUninitializedCapacity: capacity) { buffer, initialized in
            guard let start = buffer.baseAddress else { return }
            var out = start
            if framing == .jsonArray { put(UInt8(ascii: "["), &out) }
            for index in 0..<count {
                let row = rows[index]
                let seq = try EventRecord.seq(row, at)
                lastSeq = seq
                switch framing {
                case .jsonArray:
                    if index > 0 { put(UInt8(ascii: ","), &out) }
                case .serverSentEvents:
                    put("id: ", &out)
                    putDecimal(seq, &out)
                    put("\nevent: event\ndata: ", &out)
                }
                try EventRecord.write(row, at, seq: seq, to: &out)
                if framing == .serverSentEvents { put("\n\n", &out) }
            }
            if framing == .jsonArray { put(UInt8(ascii: "]"), &out) }
            initialized = out - start
        }
        return (json, lastSeq, count)
    }

    /// A Server-Sent Events message's own lines: `id: ` and a decimal `Int64`, `event:`,
    /// `data: `, line breaks.
    static let sseBytesPerRow = 64

    @inline(__always)
    static func put(_ byte: UInt8, _ out: inout UnsafeMutablePointer<UInt8>) {
        out.pointee = byte
        out += 1
    }

    @inline(__always)
    static func put(_ text: StaticString, _ out: inout UnsafeMutablePointer<UInt8>) {
        out.update(from: text.utf8Start, count: text.utf8CodeUnitCount)
        out += text.utf8CodeUnitCount
    }

    @inline(__always)
    static func putRaw(_ bytes: UnsafeRawBufferPointer, _ out: inout UnsafeMutablePointer<UInt8>) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        UnsafeMutableRawPointer(out).copyMemory(from: base, byteCount: bytes.count)
        out += bytes.count
    }

    private static let hexDigits: StaticString = "0123456789abcdef"

    /// As `String(value)`.
    static func putDecimal(_ value: Int64, _ out: inout UnsafeMutablePointer<UInt8>) {
        if value < 0 { put(UInt8(ascii: "-"), &out) }
        var magnitude = value.magnitude
        var length = 1
        var rest = magnitude / 10
        while rest > 0 {
            length += 1
            rest /= 10
        }
        var position = out + length
        repeat {
            position -= 1
            position.pointee = UInt8(truncatingIfNeeded: 48 + magnitude % 10)
            magnitude /= 10
        } while magnitude > 0
        out += length
    }

    /// Text escaped exactly as `JSONWriter.appendQuoted` does (quotes not included).
    static func putEscaped(_ bytes: UnsafeRawBufferPointer, _ out: inout UnsafeMutablePointer<UInt8>) {
        let hex = hexDigits.utf8Start
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                put(UInt8(ascii: "\\"), &out)
                put(byte, &out)
            case 0x0A:
                put("\\n", &out)
            case 0x0D:
                put("\\r", &out)
            case 0x09:
                put("\\t", &out)
            case 0..<0x20:
                put("\\u00", &out)
                put(hex[Int(byte >> 4)], &out)
                put(hex[Int(byte & 0x0F)], &out)
            default:
                put(byte, &out)
            }
        }
    }
}
