import Foundation
import HTTPServer
import JSON
import Logging
import Postgres

/// The Supabase REST (PostgREST) subset the apps use: `/rest/v1/events` and
/// `/rest/v1/profiles`. A strict parser in front of fixed, parametrised SQL — not a general
/// SQL gateway.
public struct RESTRoutes: Sendable {
    let database: Database
    let store: EventStore
    let metrics: Metrics
    /// The longest one statement of a request may run (`rest_statement_timeout`).
    let statementTimeout: Duration

    /// The largest insert (as hosted Supabase projects' request limit).
    public static let insertBodyLimit = 10 * 1024 * 1024
    /// A profile update: one small row.
    public static let profileBodyLimit = 64 * 1024

    /// Most rows one response carries (as hosted Supabase projects).
    static let maxRows = 1000

    /// The most bytes one event row takes in an answer: each column at most once
    /// (`RESTQuery` refuses repeats), a payload of at most 64 KiB as printed, a type of at
    /// most 128 characters (each up to 6 bytes escaped) and the fixed fields. So no answer
    /// is larger than `maxRows` of these (~66 MB), whatever the query (docs/api.md, "Limits
    /// and errors").
    public static let maxEventRowBytes = EventInput.maxPayloadBytes + 6 * EventInput.maxTypeLength + 512

    /// The columns of `events`, in the table's order (`EventRecord.columns`).
    static let eventColumns: [RESTColumn] = EventRecord.restColumns

    static let profileColumns: [RESTColumn] = [
        RESTColumn(name: "id", kind: .uuid, sql: "id"),
        RESTColumn(name: "full_name", kind: .text, sql: "full_name"),
        RESTColumn(name: "updated_at", kind: .timestamp, sql: "updated_at"),
    ]

    public init(
        database: Database, store: EventStore, metrics: Metrics = Metrics(), statementTimeout: Duration = .seconds(8)
    ) {
        self.metrics = metrics
        self.statementTimeout = statementTimeout
        self.database = database
        self.store = store
    }

    public func register(in routes: inout Routes) {
        routes.add(
            .get, "/rest/v1/events", family: .rest,
            .authenticated { request, claims in
                try Self.checkSchema(request)
                return try await selectEvents(request, user: claims.userID)
            })
        routes.add(
            .post, "/rest/v1/events", family: .rest, bodyLimit: Self.insertBodyLimit,
            .authenticated { request, claims in
                try Self.checkSchema(request)
                return try await insertEvents(request, user: claims.userID)
            })
        for method in [HTTPMethod.patch, .delete, .put] {
            routes.add(
                method, "/rest/v1/events", family: .rest, bodyLimit: Self.insertBodyLimit,
                .refused { _ in RESTError.append(only: method.rawValue) })
        }
        routes.add(
            .get, "/rest/v1/profiles", family: .rest,
            .authenticated { request, claims in
                try Self.checkSchema(request)
                return try await selectProfiles(request, user: claims.userID)
            })
        routes.add(
            .patch, "/rest/v1/profiles", family: .rest, bodyLimit: Self.profileBodyLimit,
            .authenticated { request, claims in
                try Self.checkSchema(request)
                return try await updateProfile(request, user: claims.userID, upsert: false)
            })
        routes.add(
            .post, "/rest/v1/profiles", family: .rest, bodyLimit: Self.profileBodyLimit,
            .authenticated { request, claims in
                try Self.checkSchema(request)
                return try await updateProfile(request, user: claims.userID, upsert: true)
            })
        // An insert into a table that is not here is told so whatever its size (as the
        // events' insert takes; read and dropped, never held); a read carries no body.
        for (method, limit) in [(HTTPMethod.get, Endpoint.BodyLimit.none), (.post, Self.insertBodyLimit)] {
            routes.add(
                method, "/rest/v1/:table", family: .rest, bodyLimit: limit,
                .refused { parameters in RESTError.unknownTable(parameters["table"] ?? "") })
        }
    }

    // MARK: - Shared stages

    struct Preferences {
        var representation = false
        var countExact = false
    }

    static func preferences(_ request: HTTPRequest) -> Preferences {
        var preferences = Preferences()
        for value in request.headers.values(for: "prefer") {
            for item in value.split(separator: ",") {
                switch item.trimmingCharacters(in: .whitespaces) {
                case "return=representation": preferences.representation = true
                case "return=minimal", "return=headers-only": preferences.representation = false
                case "count=exact", "count=planned", "count=estimated": preferences.countExact = true
                default: break  // resolution=…, missing=default: duplicates are always skipped
                }
            }
        }
        return preferences
    }

    /// The schema a request names: `Accept-Profile` for a read, `Content-Profile` for a
    /// write, as PostgREST reads them (supabase-js sends `public` on every request, and
    /// `.schema(name)` another). Only `public` is here: another is refused as PostgREST
    /// refuses a schema it does not expose, rather than answered from `public`'s tables.
    static func checkSchema(_ request: HTTPRequest) throws {
        let header = request.method == .get || request.method == .head ? "accept-profile" : "content-profile"
        guard let schema = request.headers[header], schema != "public" else { return }
        throw RESTError.invalidSchema(schema)
    }

    static func wantsObject(_ request: HTTPRequest) -> Bool {
        request.headers.values(for: "accept").contains { $0.contains("application/vnd.pgrst.object+json") }
    }

    /// Encodes one row's selected columns.
    static func write(_ row: PostgresRow, columns: [RESTColumn], to writer: inout JSONWriter) throws {
        writer.beginObject()
        for (index, column) in columns.enumerated() {
            if row.isNull(column: index) {
                writer.null(column.name)
                continue
            }
            switch column.kind {
            case .uuid: writer.string(column.name, UUIDText.lowercase(try row.decode(UUID.self, column: index)))
            case .int: writer.int(column.name, try row.decode(Int64.self, column: index))
            case .text: writer.string(column.name, try row.decode(String.self, column: index))
            case .json: writer.raw(column.name, try row.decode(PostgresJSON.self, column: index).bytes)
            case .timestamp:
                writer.string(
                    column.name, RFC3339.formatPostgREST(try row.decode(PostgresTimestamp.self, column: index)))
            }
        }
        writer.endObject()
    }

    /// The response for rows: a JSON array, or one object for `single()`.
    static func rowsResponse(
        _ rows: PostgresResult, columns: [RESTColumn], request: HTTPRequest, offset: Int, total: Int?,
        status: HTTPStatus = .ok
    ) throws -> HTTPResponse {
        if wantsObject(request) {
            guard rows.count == 1 else { throw RESTError.singular(rows.count) }
            var writer = JSONWriter()
            try write(rows[0], columns: columns, to: &writer)
            return .json(
                status, writer.bytes, headers: ["Content-Range": range(offset: offset, count: 1, total: total)])
        }
        var writer = JSONWriter(capacity: 256 * max(rows.count, 1))
        writer.beginArray()
        for row in rows { try write(row, columns: columns, to: &writer) }
        writer.endArray()
        return .json(
            status, writer.bytes, headers: ["Content-Range": range(offset: offset, count: rows.count, total: total)])
    }

    static func range(offset: Int, count: Int, total: Int?) -> String {
        let totalText = total.map(String.init) ?? "*"
        guard count > 0 else { return "*/\(total.map(String.init) ?? "0")" }
        return "\(offset)-\(offset + count - 1)/\(totalText)"
    }

    /// The queries of these routes run here (but an insert, which is a push, and its
    /// read-back): in a transaction scoped to the caller, each statement bounded by
    /// `statementTimeout`. A statement cancelled by it (`57014`) is the
    /// request's shape (an offset, a count, a filter without an index), not the server's
    /// failure: a `400` that says which limit it hit.
    private func transaction<T: Sendable>(
        for user: UUID, _ body: (Transaction) async throws -> T
    ) async throws -> T {
        do {
            return try await database.transaction(as: .user(user), statementTimeout: statementTimeout, body)
        } catch let error as PostgresError where error.sqlState == .queryCanceled {
            throw RESTError.statementTimeout(statementTimeout)
        }
    }

    // MARK: - events

    func selectEvents(_ request: HTTPRequest, user: UUID) async throws -> HTTPResponse {
        let query = try RESTQuery.parse(request, table: "events", columns: Self.eventColumns)
        let limit = min(query.limit ?? Self.maxRows, Self.maxRows)
        let countExact = Self.preferences(request).countExact
        let (rows, total) = try await transaction(for: user) { tx -> (PostgresResult, Int?) in
            let filters = query.whereClause(startingAt: 4)
            let sql =
                "select \(query.columns.map(\.sql).joined(separator: ", ")) from events where user_id = $1"
                + filters.sql + query.orderClause(default: "seq") + " limit $2 offset $3"
            let rows = try await tx.query(
                sql,
                binds: [user.postgresBind, Int64(limit).postgresBind, Int64(query.offset).postgresBind] + filters.binds)
            var total: Int? = nil
            if countExact {
                let counted = query.whereClause(startingAt: 2)
                total = try await tx.query(
                    "select count(*) from events where user_id = $1" + counted.sql,
                    binds: [user.postgresBind] + counted.binds
                )[0].decode(Int.self, column: 0)
            }
            return (rows, total)
        }
        metrics.eventsPulled.increment(by: rows.count)
        return try Self.rowsResponse(rows, columns: query.columns, request: request, offset: query.offset, total: total)
    }

    func insertEvents(_ request: HTTPRequest, user: UUID) async throws -> HTTPResponse {
        let query = try RESTQuery.parse(request, table: "events", columns: Self.eventColumns)
        let preferences = Self.preferences(request)
        let events = try RESTInsert.parseEvents(request.body, caller: user, columns: query.insertColumns)
        if preferences.representation {
            // Refused before anything is stored. An answer holds at most `maxRows` rows, as a
            // select's: a 10 MiB body of small events whose payloads print large (`1e308`
            // is 309 digits) would otherwise be answered with hundreds of megabytes.
            guard events.count <= Self.maxRows else {
                throw APIError(
                    status: 400, code: "validation_failed",
                    message:
                        "Prefer: return=representation answers at most \(Self.maxRows) rows: insert at most "
                        + "\(Self.maxRows) rows per request, or use return=minimal",
                    details: .text("\(events.count) rows"))
            }
            // PostgREST rolls such an insert back; here nothing is stored in the first place.
            if Self.wantsObject(request), events.count != 1 { throw RESTError.singular(events.count) }
        }
        guard !events.isEmpty else {
            return preferences.representation ? .json(.created, "[]") : HTTPResponse(status: .created)
        }
        guard let results = try await store.push(events, for: user) else { throw RESTError.jwt }
        let stored = results.filter(\.created).count
        metrics.eventsPushed.increment(by: stored)
        metrics.eventsDuplicate.increment(by: results.count - stored)
        guard preferences.representation else { return HTTPResponse(status: .created) }
        let created = results.filter(\.created).map(\.seq)
        let columns = query.columns
        // Not bounded by `statementTimeout`: the events are stored by now, so a `57014` would
        // tell the client that nothing changed. The read is by key, at most `maxRows` rows.
        let rows = try await database.transaction(as: .user(user)) { tx in
            try await tx.query(
                "select \(columns.map(\.sql).joined(separator: ", ")) from events where user_id = $1 and seq = any($2) order by seq",
                user, created)
        }
        return try Self.rowsResponse(rows, columns: columns, request: request, offset: 0, total: nil, status: .created)
    }

    // MARK: - profiles

    func selectProfiles(_ request: HTTPRequest, user: UUID) async throws -> HTTPResponse {
        let query = try RESTQuery.parse(request, table: "profiles", columns: Self.profileColumns)
        let limit = min(query.limit ?? Self.maxRows, Self.maxRows)
        let rows = try await transaction(for: user) { tx in
            let filters = query.whereClause(startingAt: 4)
            return try await tx.query(
                "select \(query.columns.map(\.sql).joined(separator: ", ")) from users where id = $1" + filters.sql
                    + query.orderClause(default: "id") + " limit $2 offset $3",
                binds: [user.postgresBind, Int64(limit).postgresBind, Int64(query.offset).postgresBind] + filters.binds)
        }
        return try Self.rowsResponse(rows, columns: query.columns, request: request, offset: query.offset, total: nil)
    }

    func updateProfile(_ request: HTTPRequest, user: UUID, upsert: Bool) async throws -> HTTPResponse {
        let query = try RESTQuery.parse(request, table: "profiles", columns: Self.profileColumns)
        let preferences = Self.preferences(request)
        let change = try RESTInsert.parseProfile(request.body, caller: user, allowArray: upsert)
        let rows = try await transaction(for: user) { tx in
            let filters = query.whereClause(startingAt: 3)
            // The metadata's size comes last, after the columns the answer writes.
            let rows = try await tx.query(
                """
                update users set full_name = $2, updated_at = now(),
                  user_metadata = case when $2::text is null then user_metadata - 'full_name'
                                  else user_metadata || jsonb_build_object('full_name', $2::text) end
                where id = $1\(filters.sql)
                returning \((query.columns.map(\.sql) + [UserRecord.metadataSize]).joined(separator: ", "))
                """, binds: [user.postgresBind, (change.fullName ?? nil).postgresBind] + filters.binds)
            for row in rows {
                try UserRecord.checkMetadataSize(try row.decode(Int.self, column: query.columns.count))
            }
            return rows
        }
        // Realtime's `profiles` subscribers (on any instance) hear of it as of an event.
        if rows.count > 0 { await store.announce(user) }
        let status: HTTPStatus = upsert ? .created : .ok
        guard preferences.representation else { return HTTPResponse(status: upsert ? .created : .noContent) }
        return try Self.rowsResponse(
            rows, columns: query.columns, request: request, offset: 0, total: nil, status: status)
    }
}
