import JSON
import Postgres

/// Encodes the rows of the pull query straight from libpq's binary cells into the JSON array
/// of a pull response's `events`: one allocation per page, no `String`, `UUID` or
/// intermediate array per row (the hot path of `GET /sync/v1/events`).
///
/// The output is byte for byte what `JSONWriter` writes for the same values: strings escaped
/// as `JSONWriter.appendQuoted` does, UUIDs in lowercase, timestamps as `RFC3339.format`.
enum EventPageEncoder {
    /// The pull query's columns, in order: `seq, id, type, payload, client_id,
    /// client_timestamp, created_at`.
    static let columnTypes: [UInt32] = [
        PostgresType.int8, PostgresType.uuid, PostgresType.text, PostgresType.jsonb, PostgresType.uuid,
        PostgresType.timestamptz, PostgresType.timestamptz,
    ]

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
    /// Events), and the `seq` of the last one.
    /// - Throws: a decoding error for a column of another type, a `NULL`, an infinite
    ///   timestamp or a `jsonb` format other than version 1 (as the decoders it replaces).
    static func encode(_ rows: PostgresResult, count: Int, framing: Framing = .jsonArray) throws -> (
        json: [UInt8], lastSeq: Int64?
    ) {
        guard rows.columnCount == columnTypes.count else {
            throw UnexpectedRow(reason: "\(rows.columnCount) columns")
        }
        for (column, type) in columnTypes.enumerated() where rows.columnType(column) != type {
            throw UnexpectedRow(
                reason: "column \(rows.columnName(column)) has type \(rows.columnType(column)), not \(type)")
        }
        // Exact sizes are known but for escapes: reserve the worst case (6 bytes per byte of
        // `type`) and write with pointers.
        var capacity = 2
        for index in 0..<count {
            let row = rows[index]
            capacity += fixedBytesPerRow + (framing == .serverSentEvents ? sseBytesPerRow : 0)
            capacity += 6 * row.withRawBytes(column: 2) { $0?.count ?? 0 }
            capacity += row.withRawBytes(column: 3) { $0?.count ?? 0 }
        }
        var lastSeq: Int64? = nil
        let json = try [UInt8](unsafeUninitializedCapacity: capacity) { buffer, initialized in
            guard let start = buffer.baseAddress else { return }
            var out = start
            if framing == .jsonArray { put(UInt8(ascii: "["), &out) }
            for index in 0..<count {
                let row = rows[index]
                let seq = try row.withRawBytes(column: 0) { bytes in try int64(bytes) }
                lastSeq = seq
                switch framing {
                case .jsonArray:
                    if index > 0 { put(UInt8(ascii: ","), &out) }
                case .serverSentEvents:
                    put("id: ", &out)
                    putDecimal(seq, &out)
                    put("\nevent: event\ndata: ", &out)
                }
                put("{\"id\":\"", &out)
                try row.withRawBytes(column: 1) { bytes in try putUUID(bytes, &out) }
                put("\",\"seq\":", &out)
                putDecimal(seq, &out)
                put(",\"type\":\"", &out)
                try row.withRawBytes(column: 2) { bytes in
                    guard let bytes else { throw null(2) }
                    putEscaped(bytes, &out)
                }
                put("\",\"payload\":", &out)
                try row.withRawBytes(column: 3) { bytes in
                    guard let bytes, bytes.first == 1 else { throw UnexpectedJSONB() }
                    putRaw(UnsafeRawBufferPointer(rebasing: bytes.dropFirst()), &out)
                }
                put(",\"client_id\":\"", &out)
                try row.withRawBytes(column: 4) { bytes in try putUUID(bytes, &out) }
                put("\",\"client_timestamp\":\"", &out)
                try row.withRawBytes(column: 5) { bytes in
                    out += RFC3339.write(try timestamp(bytes), fractionDigits: 6, zulu: true, to: out)
                }
                put("\",\"created_at\":\"", &out)
                try row.withRawBytes(column: 6) { bytes in
                    out += RFC3339.write(try timestamp(bytes), fractionDigits: 3, zulu: true, to: out)
                }
                put("\"}", &out)
                if framing == .serverSentEvents { put("\n\n", &out) }
            }
            if framing == .jsonArray { put(UInt8(ascii: "]"), &out) }
            initialized = out - start
        }
        return (json, lastSeq)
    }

    /// Everything of a row but its `type` and `payload`, with room to spare: the keys and
    /// punctuation (~110 bytes), two UUIDs (72), a decimal `Int64` (≤ 20), two timestamps
    /// (≤ 32 each) and a comma.
    static let fixedBytesPerRow = 300
    /// A Server-Sent Events message's own lines: `id: ` and a decimal `Int64`, `event:`,
    /// `data: `, line breaks.
    static let sseBytesPerRow = 64

    /// A row the pull query cannot return (the schema guarantees the shape and `not null`).
    struct UnexpectedRow: Error {
        var reason: String
    }

    private static func null(_ column: Int) -> UnexpectedRow {
        UnexpectedRow(reason: "column \(column) is NULL or has the wrong size")
    }

    private static func int64(_ bytes: UnsafeRawBufferPointer?) throws -> Int64 {
        guard let bytes, bytes.count == 8 else { throw null(0) }
        return Int64(bigEndian: bytes.loadUnaligned(as: Int64.self))
    }

    private static func timestamp(_ bytes: UnsafeRawBufferPointer?) throws -> PostgresTimestamp {
        guard let bytes else { throw null(5) }
        return try PostgresTimestamp(postgresBytes: bytes, type: PostgresType.timestamptz)
    }

    @inline(__always)
    private static func put(_ byte: UInt8, _ out: inout UnsafeMutablePointer<UInt8>) {
        out.pointee = byte
        out += 1
    }

    @inline(__always)
    private static func put(_ text: StaticString, _ out: inout UnsafeMutablePointer<UInt8>) {
        out.update(from: text.utf8Start, count: text.utf8CodeUnitCount)
        out += text.utf8CodeUnitCount
    }

    @inline(__always)
    private static func putRaw(_ bytes: UnsafeRawBufferPointer, _ out: inout UnsafeMutablePointer<UInt8>) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        UnsafeMutableRawPointer(out).copyMemory(from: base, byteCount: bytes.count)
        out += bytes.count
    }

    private static let hexDigits: StaticString = "0123456789abcdef"

    /// A `uuid` cell as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase.
    private static func putUUID(_ bytes: UnsafeRawBufferPointer?, _ out: inout UnsafeMutablePointer<UInt8>) throws {
        guard let bytes, bytes.count == 16 else { throw null(1) }
        UUIDText.write(bytes, to: &out)
    }

    /// As `String(value)`.
    private static func putDecimal(_ value: Int64, _ out: inout UnsafeMutablePointer<UInt8>) {
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
    private static func putEscaped(_ bytes: UnsafeRawBufferPointer, _ out: inout UnsafeMutablePointer<UInt8>) {
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
