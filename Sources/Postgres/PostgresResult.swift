import CLibPQ

/// The rows a query returned, in binary format. Immutable, so it may be shared across
/// threads (libpq's `PGresult` is read-only once complete).
public final class PostgresResult: @unchecked Sendable, RandomAccessCollection {
    private let handle: OpaquePointer
    /// Number of rows.
    public let rowCount: Int
    /// Number of columns.
    public let columnCount: Int
    /// Rows affected by an `INSERT`/`UPDATE`/`DELETE` (0 for other commands).
    public let affectedRows: Int

    init(handle: OpaquePointer) {
        self.handle = handle
        rowCount = Int(PQntuples(handle))
        columnCount = Int(PQnfields(handle))
        affectedRows = Int(String(cString: PQcmdTuples(handle))) ?? 0
    }

    deinit { PQclear(handle) }

    /// The index of the first row.
    public var startIndex: Int { 0 }
    /// One past the last row.
    public var endIndex: Int { rowCount }
    /// The row at `index`.
    public subscript(index: Int) -> PostgresRow { PostgresRow(result: self, row: Int32(index)) }

    /// The name of a column.
    public func columnName(_ column: Int) -> String { String(cString: PQfname(handle, Int32(column))) }

    /// The type OID of a column.
    public func columnType(_ column: Int) -> UInt32 { PQftype(handle, Int32(column)) }

    fileprivate func isNull(_ row: Int32, _ column: Int32) -> Bool { PQgetisnull(handle, row, column) == 1 }

    fileprivate func withCell<T>(
        _ row: Int32, _ column: Int32, _ body: (UnsafeRawBufferPointer) throws -> T
    ) rethrows -> T {
        let length = Int(PQgetlength(handle, row, column))
        guard let pointer = PQgetvalue(handle, row, column) else {
            return try body(UnsafeRawBufferPointer(start: nil, count: 0))
        }
        return try body(UnsafeRawBufferPointer(start: pointer, count: length))
    }
}

/// One row of a `PostgresResult`.
public struct PostgresRow: @unchecked Sendable {
    let result: PostgresResult
    let row: Int32

    private func checkColumn(_ column: Int) throws {
        guard column >= 0, column < result.columnCount else {
            throw PostgresError(
                kind: .decoding, message: "column \(column) out of range (\(result.columnCount) columns)")
        }
    }

    /// Decodes a non-`NULL` column; a `NULL` throws a decoding error.
    public func decode<T: PostgresDecodable>(_ type: T.Type = T.self, column: Int) throws -> T {
        try checkColumn(column)
        guard !result.isNull(row, Int32(column)) else {
            throw PostgresError(
                kind: .decoding, message: "column \(result.columnName(column)) is NULL, expected \(T.self)")
        }
        let oid = result.columnType(column)
        return try result.withCell(row, Int32(column)) { try T(postgresBytes: $0, type: oid) }
    }

    /// Decodes a column that may be `NULL`.
    public func decode<T: PostgresDecodable>(_ type: T?.Type, column: Int) throws -> T? {
        try checkColumn(column)
        if result.isNull(row, Int32(column)) { return nil }
        return try decode(T.self, column: column)
    }

    /// Whether a column is `NULL`.
    public func isNull(column: Int) -> Bool { result.isNull(row, Int32(column)) }

    /// Calls `body` with the raw binary bytes of a column (`nil` for `NULL`) without copying;
    /// the bytes are valid only inside `body`. For hot paths that encode rows directly.
    public func withRawBytes<T>(column: Int, _ body: (UnsafeRawBufferPointer?) throws -> T) rethrows -> T {
        if result.isNull(row, Int32(column)) { return try body(nil) }
        return try result.withCell(row, Int32(column)) { try body($0) }
    }
}
