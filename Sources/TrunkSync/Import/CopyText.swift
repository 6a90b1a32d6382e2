import Foundation
import Postgres
import TrunkCrypto

/// Rows in PostgreSQL's COPY text format (tab-separated, `\N` for null, backslash escapes),
/// built as bytes for `PostgresConnection.copyIn`.
struct CopyText {
    private(set) var bytes: [UInt8] = []
    private var fieldsInRow = 0

    init(capacity: Int = 1 << 20) { bytes.reserveCapacity(capacity) }

    var isEmpty: Bool { bytes.isEmpty }

    mutating func removeAll() {
        bytes.removeAll(keepingCapacity: true)
        fieldsInRow = 0
    }

    private mutating func separate() {
        if fieldsInRow > 0 { bytes.append(0x09) }
        fieldsInRow += 1
    }

    /// A field from raw text bytes (nil: SQL null), escaped.
    mutating func field(_ raw: UnsafeRawBufferPointer?) {
        separate()
        guard let raw else {
            bytes.append(contentsOf: [0x5c, 0x4e])  // \N
            return
        }
        for byte in raw {
            switch byte {
            case 0x5c: bytes.append(contentsOf: [0x5c, 0x5c])
            case 0x09: bytes.append(contentsOf: [0x5c, 0x74])
            case 0x0a: bytes.append(contentsOf: [0x5c, 0x6e])
            case 0x0d: bytes.append(contentsOf: [0x5c, 0x72])
            default: bytes.append(byte)
            }
        }
    }

    mutating func field(_ text: String?) {
        guard var utf8 = text else { return field(nil as UnsafeRawBufferPointer?) }
        utf8.withUTF8 { field(UnsafeRawBufferPointer($0)) }
    }

    mutating func field(_ value: Int64) { field(String(value)) }

    mutating func field(_ id: UUID) { field(UUIDText.lowercase(id)) }

    mutating func field(_ timestamp: PostgresTimestamp?) { field(timestamp.map { RFC3339.format($0) }) }

    /// `bytea` in hex form (`\x…`, its backslash escaped for COPY).
    mutating func field(bytea: [UInt8]) { field("\\x" + Hex.encode(bytea)) }

    /// The column `column` of `row` as it came (text-format results only).
    mutating func field(_ row: PostgresRow, _ column: Int) {
        row.withRawBytes(column: column) { field($0) }
    }

    /// Fields already encoded (tab-separated, the row's newline included) after the fields
    /// so far: the rest of the row.
    mutating func endRow(encoded: ArraySlice<UInt8>) {
        if fieldsInRow > 0 { bytes.append(0x09) }
        bytes.append(contentsOf: encoded)
        fieldsInRow = 0
    }

    mutating func endRow() {
        bytes.append(0x0a)
        fieldsInRow = 0
    }
}
