import Foundation
import JSON

/// A column's value as a Realtime filter compares it.
enum RealtimeValue: Sendable, Hashable, Comparable {
    case null
    case int(Int64)
    case text(String)
    /// Microseconds since the epoch.
    case time(Int64)

    static func < (left: RealtimeValue, right: RealtimeValue) -> Bool {
        switch (left, right) {
        case (.int(let a), .int(let b)): return a < b
        case (.text(let a), .text(let b)): return a < b
        case (.time(let a), .time(let b)): return a < b
        default: return false
        }
    }
}

/// A table Realtime serves and its columns (named and typed as `/rest/v1` returns them).
struct RealtimeTable: Sendable {
    var name: String
    var columns: [RESTColumn]
    /// Each column's type as the change messages' `columns` name it.
    var columnTypes: [String]
    /// The change it reports (`INSERT` for the append-only log, `UPDATE` for profiles).
    var change: String
    /// The column whose time is the change's `commit_timestamp`.
    var timeColumn: String

    static let events = RealtimeTable(
        name: "events", columns: RESTRoutes.eventColumns,
        columnTypes: EventRecord.columns.map(\.sqlType), change: "INSERT",
        timeColumn: "created_at")
    static let profiles = RealtimeTable(
        name: "profiles", columns: RESTRoutes.profileColumns, columnTypes: ["uuid", "text", "timestamptz"],
        change: "UPDATE", timeColumn: "updated_at")

    static func named(_ name: String) -> RealtimeTable? {
        switch name {
        case "events": return .events
        case "profiles": return .profiles
        default: return nil
        }
    }
}

/// One `postgres_changes` binding of a joined channel: what the client asked (echoed back as
/// it sent it) and the filter parsed from it.
struct RealtimeBinding: Sendable {
    enum Operator: String, Sendable {
        case eq, neq, lt, lte, gt, gte, `in`
    }

    struct Filter: Sendable {
        var column: String
        var op: Operator
        var values: [RealtimeValue] {
            didSet { members = Set(values) }
        }
        /// `values` as a set: `in.(…)` is one look-up per change, not up to 100 comparisons
        /// (every change is matched against every binding of the user's channels).
        private(set) var members: Set<RealtimeValue>

        init(column: String, op: Operator, values: [RealtimeValue]) {
            self.column = column
            self.op = op
            self.values = values
            members = Set(values)
        }

        func matches(_ value: RealtimeValue) -> Bool {
            switch op {
            case .eq: return value == values[0]
            case .neq: return value != values[0] && value != .null
            case .lt: return value < values[0]
            case .lte: return value < values[0] || value == values[0]
            case .gt: return values[0] < value
            case .gte: return values[0] < value || value == values[0]
            case .in: return members.contains(value)
            }
        }
    }

    /// The server's id for it: in the join's reply and in every change message it matches.
    var id: Int
    var event: String
    var schema: String
    /// The table it follows; nil for every table served (no `table`, or `*`: Supabase's
    /// "all tables of the schema").
    var table: RealtimeTable?
    /// `table` as the client sent it (nil: none), echoed in the reply.
    var tableText: String?
    /// The filter as the client sent it (nil: none), echoed in the reply.
    var filterText: String?
    var filter: Filter?

    /// Whether `table`'s changes (of the one kind it reports) may be for it, filter aside.
    func wants(_ table: RealtimeTable) -> Bool {
        (self.table.map { $0.name == table.name } ?? true) && (event == "*" || event == table.change)
    }

    /// Whether a change of `table` to a row with `values` (by column name) is for it.
    func matches(_ table: RealtimeTable, values: [String: RealtimeValue]) -> Bool {
        guard wants(table) else { return false }
        guard let filter else { return true }
        return filter.matches(values[filter.column] ?? .null)
    }

    /// Reads one entry of `config.postgres_changes`.
    static func parse(_ value: JSONValue, id: Int) throws(RealtimeError) -> RealtimeBinding {
        guard let members = value.objectValue else {
            throw RealtimeError("each postgres_changes entry must be an object")
        }
        guard let event = members["event"]?.stringValue else { throw RealtimeError("postgres_changes needs an event") }
        guard ["*", "INSERT", "UPDATE", "DELETE"].contains(event) else {
            throw RealtimeError("event must be INSERT, UPDATE, DELETE or *, not \(event)")
        }
        let schema: String
        switch members["schema"] {
        case nil, .null?: schema = "public"
        case .string(let name)?: schema = name
        default: throw RealtimeError("schema must be a string")
        }
        guard schema == "public" else { throw RealtimeError("only the public schema is served, not \(schema)") }
        var tableText: String? = nil
        switch members["table"] {
        case nil, .null?: break
        case .string(let name)?: tableText = name
        default: throw RealtimeError("table must be a string")
        }
        var table: RealtimeTable? = nil
        if let tableText, tableText != "*" {
            guard let named = RealtimeTable.named(tableText) else {
                throw RealtimeError("unknown table \(tableText): Realtime serves public.events and public.profiles")
            }
            table = named
        }
        var filterText: String? = nil
        switch members["filter"] {
        case nil, .null?: break
        case .string(let text)?: filterText = text
        default: throw RealtimeError("filter must be a string")
        }
        let filter = try filterText.flatMap { text throws(RealtimeError) -> Filter? in
            guard !text.isEmpty else { return nil }
            guard let table else { throw RealtimeError("a filter needs a table (events or profiles)") }
            return try parseFilter(text, table: table)
        }
        switch members["select"] {
        case nil, .null?: break
        case .array(let columns) where columns.isEmpty: break
        default:
            throw RealtimeError("select is not supported: a change's record has every column /rest/v1 returns")
        }
        return RealtimeBinding(
            id: id, event: event, schema: schema, table: table, tableText: tableText, filterText: filterText,
            filter: filter)
    }

    /// `column=op.value` (`in.(a,b,…)` for `in`).
    static func parseFilter(_ text: String, table: RealtimeTable) throws(RealtimeError) -> Filter {
        guard let equals = text.firstIndex(of: "=") else {
            throw RealtimeError("filter must be column=operator.value, not \(text)")
        }
        let columnName = String(text[..<equals])
        let rest = text[text.index(after: equals)...]
        guard let dot = rest.firstIndex(of: ".") else {
            throw RealtimeError("filter must be column=operator.value, not \(text)")
        }
        guard let op = Operator(rawValue: String(rest[..<dot])) else {
            throw RealtimeError("unsupported filter operator \(rest[..<dot]): use eq, neq, lt, lte, gt, gte or in")
        }
        guard let column = table.columns.first(where: { $0.name == columnName }) else {
            throw RealtimeError("unknown column \(columnName) of \(table.name)")
        }
        let valueText = String(rest[rest.index(after: dot)...])
        var values: [RealtimeValue] = []
        if op == .in {
            guard valueText.hasPrefix("("), valueText.hasSuffix(")"), valueText.count >= 2 else {
                throw RealtimeError("in takes a list: \(columnName)=in.(a,b)")
            }
            let list = valueText.dropFirst().dropLast()
            let items = list.split(separator: ",", omittingEmptySubsequences: false)
            guard items.count <= 100 else { throw RealtimeError("in takes at most 100 values") }
            for item in items {
                var piece = item.trimmingCharacters(in: .whitespaces)
                if piece.count >= 2, piece.hasPrefix("\""), piece.hasSuffix("\"") {
                    piece = String(piece.dropFirst().dropLast())
                }
                values.append(try value(piece, for: column))
            }
        } else {
            guard !continuesWithACondition(valueText) else {
                throw RealtimeError(
                    "one condition per filter: several joined by commas (\(text)) are not supported; filter in the app")
            }
            values.append(try value(valueText, for: column))
        }
        return Filter(column: column.name, op: op, values: values)
    }

    /// Whether a value goes on with `,column=…`: conditions joined by commas, which newer
    /// Supabase Realtime ANDs. Read as one value, the filter would match nothing, silently.
    static func continuesWithACondition(_ value: String) -> Bool {
        value.split(separator: ",", omittingEmptySubsequences: false).dropFirst().contains { piece in
            guard let equals = piece.firstIndex(of: "="), equals > piece.startIndex else { return false }
            return piece[..<equals].allSatisfy { $0.isLetter || $0.isNumber || $0 == "_" }
        }
    }

    static func value(_ text: String, for column: RESTColumn) throws(RealtimeError) -> RealtimeValue {
        switch column.kind {
        case .uuid:
            guard let id = UUIDText.parse(text) else { throw RealtimeError("\(column.name) is a uuid, not \(text)") }
            return .text(UUIDText.lowercase(id))
        case .int:
            guard let number = Int64(text) else { throw RealtimeError("\(column.name) is an integer, not \(text)") }
            return .int(number)
        case .text:
            return .text(text)
        case .timestamp:
            guard let time = RFC3339.parse(text) else {
                throw RealtimeError("\(column.name) is a timestamp, not \(text)")
            }
            return .time(time.microsecondsSinceEpoch)
        case .json:
            throw RealtimeError("filters on JSON columns (\(column.name)) are not supported")
        }
    }

    /// `{id, event, schema, table?, filter?}`: as the client sent it, so it matches by position.
    func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.int("id", Int64(id))
        writer.string("event", event)
        writer.string("schema", schema)
        if let tableText { writer.string("table", tableText) }
        if let filterText { writer.string("filter", filterText) }
        writer.endObject()
    }
}

/// A refusal sent to the client as an error reply's `reason`.
struct RealtimeError: Error, Sendable {
    var reason: String
    init(_ reason: String) { self.reason = reason }
}
