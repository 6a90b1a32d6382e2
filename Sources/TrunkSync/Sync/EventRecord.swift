import Postgres

/// One event of the log, in one place: the columns of `events` (name, SQL type, JSON field),
/// the select list every reader of pages uses (pull, stream, export, console), the columns the
/// push's inserts write (the native push's and REST's, which goes through it), the columns
/// REST and Realtime serve, and the event object those pages are written as — its fields, in
/// order, written straight from the row (`write`) at indexes checked by name once per result
/// (`Indexes`), so a select whose columns moved or changed cannot be encoded under the wrong
/// names.
///
/// Adding a field takes:
/// 1. a migration adding the column to `events` (Sources/TrunkSync/Migrations);
/// 2. here: its `Column` in `columns` (the select list, the insert list, REST's and Realtime's
///    columns follow), its index in `Indexes` and its line in `write` (and in `capacity` if it
///    is of variable length) — `EventRecordTests` fails until the three agree;
/// 3. docs/openapi.json (the `Event` schemas and REST's column patterns; then
///    scripts/openapi-embed.sh) and the clients (Sources/TrunkSyncClient, the web client).
///
/// A field the client sends (`Origin.client`) also needs its rule in `EventInput`, its
/// property in `IncomingEvent` and its array in the push's two `unnest(…)` inserts
/// (`EventStore.PushSteps.Batch`); one the server assigns needs only a default or a value there.
enum EventRecord {
    /// Who gives a column its value.
    enum Origin: Sendable {
        /// The table's default (`id`): not in the insert list.
        case database
        /// The signed-in user (`user_id`): not in pages (a page is one user's).
        case owner
        /// The push, under the user's row lock (`seq`, `created_at`).
        case server
        /// The client's event (`EventInput`).
        case client
    }

    /// One column of `events`; its name is also its JSON field's and REST's column name.
    struct Column: Sendable {
        var name: String
        /// As PostgreSQL names it (and Realtime's change messages).
        var sqlType: String
        /// The type's OID, checked in every page's result.
        var oid: UInt32
        /// How REST and Realtime write and filter it.
        var kind: RESTColumn.Kind
        var origin: Origin
    }

    /// The columns in the table's order, which is REST's and Realtime's order too.
    static let columns: [Column] = [
        Column(name: "id", sqlType: "uuid", oid: PostgresType.uuid, kind: .uuid, origin: .database),
        Column(name: "user_id", sqlType: "uuid", oid: PostgresType.uuid, kind: .uuid, origin: .owner),
        Column(name: "seq", sqlType: "int8", oid: PostgresType.int8, kind: .int, origin: .server),
        Column(name: "type", sqlType: "text", oid: PostgresType.text, kind: .text, origin: .client),
        Column(name: "payload", sqlType: "jsonb", oid: PostgresType.jsonb, kind: .json, origin: .client),
        Column(name: "client_id", sqlType: "uuid", oid: PostgresType.uuid, kind: .uuid, origin: .client),
        Column(
            name: "client_timestamp", sqlType: "timestamptz", oid: PostgresType.timestamptz, kind: .timestamp,
            origin: .client),
        Column(
            name: "created_at", sqlType: "timestamptz", oid: PostgresType.timestamptz, kind: .timestamp,
            origin: .server),
    ]

    /// The fields of an event object in a page (pull, stream, export, console), in the order
    /// `write` writes them: every column but the owner.
    static let fields: [Column] = columns.filter { $0.origin != .owner }

    /// What every reader of pages selects: `fields`, in order.
    static let selectList = fields.map(\.name).joined(separator: ", ")

    /// The columns the push's inserts write, in order: every column but the table's default.
    static let insertList = columns.filter { $0.origin != .database }.map(\.name).joined(separator: ", ")

    /// Keys a REST insert may send that the server assigns: ignored (`user_id`, when it names
    /// the caller, is checked by `EventInput`).
    static let assignedByServer: Set<String> = Set(columns.filter { $0.origin != .client }.map(\.name))

    /// REST's (and Realtime's) columns of `events`.
    static let restColumns: [RESTColumn] = columns.map { RESTColumn(name: $0.name, kind: $0.kind, sql: $0.name) }

    /// Where each field is in one result, found by name once per result.
    struct Indexes {
        let id: Int
        let seq: Int
        let type: Int
        let payload: Int
        let clientID: Int
        let clientTimestamp: Int
        let createdAt: Int

        /// The indexes of `result`'s columns, which must be `fields` (any order), each once,
        /// each of its type.
        /// - Throws: `UnexpectedRow` for a result of other columns.
        init(_ result: PostgresResult) throws {
            guard result.columnCount == fields.count else {
                throw UnexpectedRow(reason: "\(result.columnCount) columns, not \(fields.count)")
            }
            var found = [Int](repeating: -1, count: fields.count)
            for column in 0..<result.columnCount {
                let name = result.columnName(column)
                guard let field = fields.firstIndex(where: { $0.name == name }), found[field] < 0 else {
                    throw UnexpectedRow(reason: "column \(column) is \(name), not one of \(selectList) (once each)")
                }
                guard result.columnType(column) == fields[field].oid else {
                    throw UnexpectedRow(
                        reason: "column \(name) has type \(result.columnType(column)), not \(fields[field].sqlType)")
                }
                found[field] = column
            }
            func index(_ name: String) -> Int {
                // Every field was found above: the count matches and no name repeats.
                found[fields.firstIndex { $0.name == name } ?? 0]
            }
            id = index("id")
            seq = index("seq")
            type = index("type")
            payload = index("payload")
            clientID = index("client_id")
            clientTimestamp = index("client_timestamp")
            createdAt = index("created_at")
        }
    }

    /// A result the page query cannot return (the schema guarantees the shape and `not null`).
    struct UnexpectedRow: Error {
        var reason: String
    }

    /// The most bytes `write` writes for `row`: the fixed fields (`fixedBytes`), `type` with
    /// every byte escaped to 6 and the payload as stored.
    @inline(__always)
    static func capacity(_ row: PostgresRow, _ at: Indexes) -> Int {
        fixedBytes + 6 * row.withRawBytes(column: at.type) { $0?.count ?? 0 }
            + row.withRawBytes(column: at.payload) { $0?.count ?? 0 }
    }

    /// Everything of an event object but its `type` and `payload`, with room to spare: the
    /// keys and punctuation (~110 bytes), two UUIDs (72), a decimal `Int64` (≤ 20), two
    /// timestamps (≤ 32 each).
    static let fixedBytes = 299

    /// The row's `seq` (for the page's cursor and the stream's `id:`).
    @inline(__always)
    static func seq(_ row: PostgresRow, _ at: Indexes) throws -> Int64 {
        try row.withRawBytes(column: at.seq) { bytes in
            guard let bytes, bytes.count == 8 else { throw null("seq") }
            return Int64(bigEndian: bytes.loadUnaligned(as: Int64.self))
        }
    }

    /// The event object of `row` — `{"id":…,"seq":…,"type":…,"payload":…,"client_id":…,
    /// "client_timestamp":…,"created_at":…}`, `fields` in order — at `out`, which has room
    /// for `capacity(row, at)` bytes. Byte for byte what `JSONWriter` writes for the same
    /// values: strings escaped as `JSONWriter.appendQuoted`, UUIDs in lowercase, timestamps as
    /// `RFC3339.format` (`client_timestamp` to the microsecond, `created_at` to the
    /// millisecond).
    /// - Throws: for a `NULL`, an infinite timestamp or a `jsonb` format other than version 1.
    @inline(__always)
    static func write(_ row: PostgresRow, _ at: Indexes, seq: Int64, to out: inout UnsafeMutablePointer<UInt8>) throws {
        typealias W = EventPageEncoder
        W.put("{\"id\":\"", &out)
        try row.withRawBytes(column: at.id) { bytes in try uuid(bytes, "id", &out) }
        W.put("\",\"seq\":", &out)
        W.putDecimal(seq, &out)
        W.put(",\"type\":\"", &out)
        try row.withRawBytes(column: at.type) { bytes in
            guard let bytes else { throw null("type") }
            W.putEscaped(bytes, &out)
        }
        W.put("\",\"payload\":", &out)
        try row.withRawBytes(column: at.payload) { bytes in
            guard let bytes, bytes.first == 1 else { throw UnexpectedJSONB() }
            W.putRaw(UnsafeRawBufferPointer(rebasing: bytes.dropFirst()), &out)
        }
        W.put(",\"client_id\":\"", &out)
        try row.withRawBytes(column: at.clientID) { bytes in try uuid(bytes, "client_id", &out) }
        W.put("\",\"client_timestamp\":\"", &out)
        try row.withRawBytes(column: at.clientTimestamp) { bytes in
            out += RFC3339.write(try timestamp(bytes, "client_timestamp"), fractionDigits: 6, zulu: true, to: out)
        }
        W.put("\",\"created_at\":\"", &out)
        try row.withRawBytes(column: at.createdAt) { bytes in
            out += RFC3339.write(try timestamp(bytes, "created_at"), fractionDigits: 3, zulu: true, to: out)
        }
        W.put("\"}", &out)
    }

    private static func null(_ field: String) -> UnexpectedRow {
        UnexpectedRow(reason: "column \(field) is NULL or has the wrong size")
    }

    @inline(__always)
    private static func uuid(
        _ bytes: UnsafeRawBufferPointer?, _ field: String, _ out: inout UnsafeMutablePointer<UInt8>
    ) throws {
        guard let bytes, bytes.count == 16 else { throw null(field) }
        UUIDText.write(bytes, to: &out)
    }

    @inline(__always)
    private static func timestamp(_ bytes: UnsafeRawBufferPointer?, _ field: String) throws -> PostgresTimestamp {
        guard let bytes else { throw null(field) }
        return try PostgresTimestamp(postgresBytes: bytes, type: PostgresType.timestamptz)
    }
}
