import Foundation
import HTTPServer
import Postgres

/// A column a REST resource exposes, with how filter values are parsed and rows encoded.
struct RESTColumn: Sendable {
    enum Kind: Sendable { case uuid, int, text, json, timestamp }
    var name: String
    var kind: Kind
    /// The SQL expression selecting it (a column of the underlying table).
    var sql: String
}

/// A parsed PostgREST-style read: columns, filters, order, limit, offset. Everything is
/// checked against the resource's columns; values become parameters, never SQL text.
struct RESTQuery: Sendable {
    enum Operator: String, Sendable, CaseIterable {
        case eq, neq, gt, gte, lt, lte
        /// `in.(a,b,"c,d")`: one of the listed values (at most `maxListed`).
        case `in`
        /// `is.null`, `is.not_null`.
        case `is`
        /// `like.a*b`, `ilike.a*b` (case-insensitive): a pattern over a text column, `*` or
        /// `%` any characters, `_` one, `\` escaping the next.
        case like, ilike

        /// The comparison's SQL operator (not for `in` and `is`, written whole by `whereClause`).
        var sql: String {
            switch self {
            case .eq: return "="
            case .neq: return "<>"
            case .gt: return ">"
            case .gte: return ">="
            case .lt: return "<"
            case .lte: return "<="
            case .like: return "like"
            case .ilike: return "ilike"
            case .in, .is: return ""
            }
        }

        /// `eq, neq, gt, gte, lt, lte, in, is, like, ilike`, for messages.
        static let supported = allCases.map(\.rawValue).joined(separator: ", ")

        /// PostgREST's other operators (`match`, `fts` …): refused by name, not as unknown.
        /// `match` and `imatch` are regular expressions, whose cost PostgreSQL does not bound
        /// by the text's length.
        static let unsupported: Set<String> = [
            "match", "imatch", "isdistinct", "fts", "plfts", "phfts", "wfts", "cs", "cd",
            "ov", "sl", "sr", "nxr", "nxl", "adj",
        ]
    }

    /// Most values one `in.(…)` lists: the statement's work stays bounded whatever the query
    /// string (whose request line is at most 8 KiB anyway).
    static let maxListed = 1000

    /// PostgREST's logical operators, as parameter names: `or=(…)`, `and=(…)`, each also
    /// negated (`not.or=(…)`); `true` for `or`, with whether negated.
    static let logical: [String: (isOr: Bool, negated: Bool)] = [
        "or": (true, false), "and": (false, false), "not.or": (true, true), "not.and": (false, true),
    ]

    /// Most levels of `and(…)`/`or(…)` one inside another (the parameter's own counts one):
    /// PostgreSQL parses each as a level of its own stack.
    static let maxLogicDepth = 8

    struct Filter: Sendable {
        var column: RESTColumn
        var op: Operator
        /// The operand: one value, for `in` the list as a PostgreSQL array literal; nil for `is`.
        var value: PostgresBind?
        /// For `is`: `is.null` (false: `is.not_null`).
        var isNull = true
        /// `not.op.value`: rows for which the condition is false (as in SQL, not those where
        /// it is null: `not.eq.a` leaves out rows whose column is null, as `neq.a` does).
        var negated = false
    }

    /// `or=(…)`, `and=(…)` and what they nest: conditions combined with `or` or `and`.
    struct Group: Sendable {
        var isOr: Bool
        var negated: Bool
        var conditions: [Condition]
    }

    indirect enum Condition: Sendable {
        case filter(Filter)
        case group(Group)
    }

    struct Order: Sendable {
        var column: RESTColumn
        var descending: Bool
        var nullsFirst: Bool?
    }

    var columns: [RESTColumn]
    var filters: [Filter] = []
    /// `or=(…)`, `and=(…)`, `not.or=(…)`, `not.and=(…)`: each one condition beside `filters`.
    var groups: [Group] = []
    var order: [Order] = []
    var limit: Int?
    var offset = 0
    /// `columns=` of an insert: the body keys to use (nil: all).
    var insertColumns: [String]?

    /// Parameters handled elsewhere (upserts) and so not filters.
    static let reserved: Set<String> = ["select", "order", "limit", "offset", "columns", "on_conflict"]

    static func parse(_ request: HTTPRequest, table: String, columns available: [RESTColumn]) throws -> RESTQuery {
        func column(_ name: String) throws -> RESTColumn {
            guard let found = available.first(where: { $0.name == name }) else {
                throw RESTError.unknownColumn(name, in: table)
            }
            return found
        }
        var query = RESTQuery(columns: available)
        for (name, rawValue) in request.queryItems {
            let value = rawValue.trimmingCharacters(in: .whitespaces)
            switch name {
            case "select":
                if value.isEmpty || value == "*" { continue }
                let parts = value.split(separator: ",")
                // Each column at most once, so never more items than the table has columns:
                // refused before any is looked up, however long the list.
                guard parts.count <= available.count else {
                    throw RESTError.parse(
                        "failed to parse select parameter",
                        details: "at most \(available.count) columns, each selected once")
                }
                var seen = Set<String>()
                query.columns = try parts.map { part in
                    let name = part.trimmingCharacters(in: .whitespaces)
                    if name == "*" { throw RESTError.parse("\"*\" cannot be combined with columns") }
                    guard name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) else {
                        throw RESTError.parse(
                            "failed to parse select parameter (\(name))",
                            details: "only plain column names are supported")
                    }
                    guard seen.insert(name).inserted else {
                        throw RESTError.parse(
                            "failed to parse select parameter (\(name))",
                            details: "column \(name) is selected more than once")
                    }
                    return try column(name)
                }
            case "order":
                query.order = try value.split(separator: ",").map { term in
                    let parts = term.split(separator: ".").map { String($0).trimmingCharacters(in: .whitespaces) }
                    guard let first = parts.first, parts.count <= 3 else {
                        throw RESTError.parse("failed to parse order (\(term))")
                    }
                    if first.contains("->") { throw RESTError.unsupported("JSON path order (\(first.prefix(40)))") }
                    if first.contains("(") {
                        throw RESTError.unsupported("embedded resource order (\(first.prefix(40)))")
                    }
                    let target = try column(first)
                    // A sort by `jsonb` reads every payload of the user, whatever the limit.
                    guard target.kind != .json else {
                        throw RESTError.parse(
                            "failed to parse order (\(term))", details: "ordering by JSON columns is not supported")
                    }
                    var order = Order(column: target, descending: false, nullsFirst: nil)
                    for modifier in parts.dropFirst() {
                        switch modifier {
                        case "asc": order.descending = false
                        case "desc": order.descending = true
                        case "nullsfirst": order.nullsFirst = true
                        case "nullslast": order.nullsFirst = false
                        default:
                            throw RESTError.parse(
                                "failed to parse order (\(term))", details: "unexpected \"\(modifier)\"")
                        }
                    }
                    return order
                }
            case "limit":
                guard let number = Int(value), number >= 0 else {
                    throw RESTError.parse("failed to parse limit (\(value))")
                }
                query.limit = number
            case "offset":
                guard let number = Int(value), number >= 0 else {
                    throw RESTError.parse("failed to parse offset (\(value))")
                }
                query.offset = number
            case "columns":
                query.insertColumns = try value.split(separator: ",").map { part in
                    let name = part.trimmingCharacters(in: CharacterSet(charactersIn: "\" "))
                    _ = try column(name)
                    return name
                }
            case "on_conflict":
                for part in value.split(separator: ",") {
                    _ = try column(part.trimmingCharacters(in: .whitespaces))
                }
            case "or", "and", "not.or", "not.and":
                guard let (isOr, negated) = logical[name] else { continue }
                var parser = LogicTree(text: value, column: column)
                query.groups.append(try parser.parse(isOr: isOr, negated: negated))
            default:
                try refuseUnsupported(parameter: name)
                let target = try column(name)
                query.filters.append(try filter(value, on: target))
            }
        }
        return query
    }

    /// One filter's `op.value` (or `not.op.value`) on `target`.
    static func filter(_ text: String, on target: RESTColumn) throws -> Filter {
        var negated = false
        var rest = Substring(text)
        if rest.hasPrefix("not.") {
            negated = true
            rest = rest.dropFirst(4)
        }
        guard let dot = rest.firstIndex(of: ".") else {
            throw RESTError.parse("failed to parse filter (\(text.prefix(100)))", details: "expected operator.value")
        }
        let opName = String(rest[..<dot])
        guard let op = Operator(rawValue: opName) else {
            // `eq(any)`, `like(all)`, `fts(english)`: named by their operator.
            let base = opName.prefix { $0 != "(" }
            if Operator.unsupported.contains(String(base)) || Operator(rawValue: String(base)) != nil {
                throw RESTError.unsupported("\(opName.prefix(40)) operator")
            }
            throw RESTError.parse(
                "failed to parse filter (\(text.prefix(100)))",
                details:
                    "unknown operator \"\(opName.prefix(40))\"; supported: \(Operator.supported), each also after not.")
        }
        let operand = String(rest[rest.index(after: dot)...])
        var filter: Filter
        switch op {
        case .in:
            filter = Filter(column: target, op: op, value: try bindList(operand, for: target))
        case .is:
            filter = Filter(column: target, op: op, value: nil, isNull: try nullTest(operand, target))
        case .like, .ilike:
            filter = Filter(column: target, op: op, value: try bindPattern(operand, op: op, for: target))
        default:
            filter = Filter(column: target, op: op, value: try bind(operand, for: target))
        }
        filter.negated = negated
        return filter
    }

    /// `like`'s and `ilike`'s pattern: PostgREST's `*` is SQL's `%`. Text columns only
    /// (PostgreSQL has no `like` for the others).
    static func bindPattern(_ text: String, op: Operator, for column: RESTColumn) throws -> PostgresBind {
        guard column.kind == .text else {
            if column.kind == .json { throw noJSONFilters(on: column) }
            throw APIError(
                status: 400, code: "42883",
                message: "operator does not exist: \(sqlType(column.kind)) \(op == .like ? "~~" : "~~*") unknown",
                hint: "like and ilike apply to text columns only.")
        }
        // PostgreSQL refuses a pattern ending in its escape (`\`) only once a row's text
        // reaches that end, so it is refused here, whatever the rows.
        let trailingEscapes = text.unicodeScalars.reversed().prefix { $0 == "\\" }.count
        guard trailingEscapes % 2 == 0 else {
            throw APIError(status: 400, code: "22025", message: "LIKE pattern must not end with escape character")
        }
        return try bind(text.replacingOccurrences(of: "*", with: "%"), for: column)
    }

    /// A parameter naming a PostgREST feature the subset does not have, rather than a
    /// column: a filter on an embedded resource (`items.seq`, `items.or`), a JSON path
    /// (`payload->>kind`).
    static func refuseUnsupported(parameter name: String) throws {
        if name.contains("->") { throw RESTError.unsupported("JSON path filter (\(name.prefix(40)))") }
        if name.contains(".") {
            throw RESTError.unsupported("embedded resource parameter (\(name.prefix(40)))")
        }
    }

    /// A filter value parsed for its column's type: the one place each type's rules live,
    /// for `eq`'s value and each of `in`'s.
    enum Value {
        case uuid(UUID)
        case int(Int64)
        case text(String)
        case timestamp(PostgresTimestamp)

        /// As one parameter (binary where the type has a binary form).
        var bind: PostgresBind {
            switch self {
            case .uuid(let id): return id.postgresBind
            case .int(let number): return number.postgresBind
            case .text(let text): return PostgresBind(type: PostgresType.text, format: 0, bytes: Array(text.utf8))
            case .timestamp(let timestamp): return timestamp.postgresBind
            }
        }
    }

    static func value(_ text: String, for column: RESTColumn) throws -> Value {
        switch column.kind {
        case .uuid:
            guard let id = UUIDText.parse(text) else { throw RESTError.badValue(text, type: "uuid") }
            return .uuid(id)
        case .int:
            guard let number = Int64(text) else { throw RESTError.badValue(text, type: "bigint") }
            return .int(number)
        case .text:
            // PostgreSQL text cannot hold NUL (`%00` in the query string).
            guard !text.utf8.contains(0) else {
                throw RESTError.badValue(text.replacingOccurrences(of: "\u{0}", with: "\\u0000"), type: "text")
            }
            return .text(text)
        case .timestamp:
            guard let timestamp = RFC3339.parse(text) else {
                throw RESTError.badValue(text, type: "timestamp with time zone")
            }
            return .timestamp(timestamp)
        case .json:
            throw noJSONFilters(on: column)
        }
    }

    static func noJSONFilters(on column: RESTColumn) -> APIError {
        RESTError.parse(
            "failed to parse filter on \(column.name)", details: "filters on JSON columns are not supported")
    }

    /// Parses a filter value for a column's type, as one parameter.
    static func bind(_ text: String, for column: RESTColumn) throws -> PostgresBind {
        try value(text, for: column).bind
    }

    /// `in.(…)`'s operand: `(a,b,"c,d")`, items separated by commas, an item with a comma or
    /// parenthesis double-quoted (`\"` and `\\` inside), each parsed for the column's
    /// type like `eq`'s value. Bound as one array literal, so the statement's text does not
    /// depend on how many values there are.
    static func bindList(_ text: String, for column: RESTColumn) throws -> PostgresBind {
        guard column.kind != .json else { throw noJSONFilters(on: column) }
        guard text.hasPrefix("("), text.hasSuffix(")"), text.count >= 2 else {
            throw RESTError.parse(
                "failed to parse filter (in.\(text.prefix(100)))", details: "expected in.(value,value,…)")
        }
        var items: [String] = []
        // Scalars, not characters: a quote followed by a combining mark is still a quote.
        let inner = Array(text.unicodeScalars.dropFirst().dropLast())
        var index = 0
        while !inner.isEmpty {  // `in.()` lists nothing and matches no row
            var item = String.UnicodeScalarView()
            if index < inner.count, inner[index] == "\"" {
                guard let quoted = quotedValue(inner, at: &index), index == inner.count || inner[index] == "," else {
                    throw RESTError.parse(
                        "failed to parse filter (in.\(text.prefix(100)))", details: "unterminated or misplaced quote")
                }
                item = quoted.unicodeScalars
            } else {
                // Unquoted: up to the next comma. A quote inside is taken as it is, as
                // PostgREST does (supabase-js quotes only values with a comma or parenthesis,
                // and escapes nothing: `in.(say "hi")`); only a first quote opens a quoted value.
                while index < inner.count, inner[index] != "," {
                    guard inner[index] != "(", inner[index] != ")" else {
                        throw RESTError.parse(
                            "failed to parse filter (in.\(text.prefix(100)))",
                            details: "a value with a comma or parenthesis must be double-quoted")
                    }
                    item.append(inner[index])
                    index += 1
                }
            }
            items.append(String(item))
            guard items.count <= maxListed else {
                throw RESTError.parse(
                    "failed to parse filter (in.\(text.prefix(100)))", details: "at most \(maxListed) values")
            }
            if index == inner.count { break }
            index += 1  // the comma; a last one is followed by an empty value
        }
        // Each as PostgreSQL's text input reads it back (timestamps in UTC).
        let canonical = try items.map { item -> String in
            switch try value(item, for: column) {
            case .uuid(let id): return id.uuidString.lowercased()
            case .int(let number): return String(number)
            case .text(let text): return text
            case .timestamp(let timestamp):
                // PostgreSQL has no year 0 (1 BC), which a value early in year 1 with a
                // positive offset prints in UTC.
                let utc = RFC3339.format(timestamp)
                guard !utc.hasPrefix("0000") else { throw RESTError.badValue(item, type: "timestamp with time zone") }
                return utc
            }
        }
        // Every element quoted, `\` and `"` escaped: PostgreSQL's array input reads it back
        // exactly, whatever the text holds.
        var literal = "{"
        for (position, item) in canonical.enumerated() {
            if position > 0 { literal += "," }
            literal += "\""
            for scalar in item.unicodeScalars {
                if scalar == "\\" || scalar == "\"" { literal.unicodeScalars.append("\\") }
                literal.unicodeScalars.append(scalar)
            }
            literal += "\""
        }
        literal += "}"
        return PostgresBind(type: PostgresType.text, format: 0, bytes: Array(literal.utf8))
    }

    /// The double-quoted value whose opening quote is at `index`, without its quotes, `\"`
    /// and `\\` read as `"` and `\`; `index` ends after the closing quote. Nil when no quote
    /// closes it.
    static func quotedValue(_ scalars: [Unicode.Scalar], at index: inout Int) -> String? {
        index += 1
        var text = String.UnicodeScalarView()
        while index < scalars.count {
            let scalar = scalars[index]
            index += 1
            if scalar == "\\", index < scalars.count {
                text.append(scalars[index])
                index += 1
            } else if scalar == "\"" {
                return String(text)
            } else {
                text.append(scalar)
            }
        }
        return nil
    }

    /// `is.`'s operand, in any case as PostgREST reads it: `null` → true, `not_null` →
    /// false. `true`, `false` and `unknown` test booleans, which no column here is.
    static func nullTest(_ text: String, _ column: RESTColumn) throws -> Bool {
        switch text.lowercased() {
        case "null": return true
        case "not_null": return false
        case "true", "false", "unknown":
            throw APIError(
                status: 400, code: "42804",
                message: "argument of IS \(text.uppercased()) must be type boolean, not type of column \(column.name)")
        default:
            throw RESTError.parse(
                "failed to parse filter (is.\(text.prefix(100)))", details: "expected is.null or is.not_null")
        }
    }

    /// PostgreSQL's name of a column's type, for the cast of an `in` list.
    static func sqlType(_ kind: RESTColumn.Kind) -> String {
        switch kind {
        case .uuid: return "uuid"
        case .int: return "int8"
        case .text: return "text"
        case .timestamp: return "timestamptz"
        case .json: return "jsonb"
        }
    }

    /// `where` conditions after `firstParameter - 1` parameters already used.
    func whereClause(startingAt firstParameter: Int) -> (sql: String, binds: [PostgresBind]) {
        var clauses: [String] = []
        var binds: [PostgresBind] = []
        for filter in filters {
            if let clause = Self.clause(filter, binds: &binds, firstParameter: firstParameter) {
                clauses.append(clause)
            }
        }
        for group in groups {
            if let clause = Self.clause(group, binds: &binds, firstParameter: firstParameter) { clauses.append(clause) }
        }
        return (clauses.map { " and " + $0 }.joined(), binds)
    }

    /// One filter's condition, its value appended to `binds`.
    static func clause(_ filter: Filter, binds: inout [PostgresBind], firstParameter: Int) -> String? {
        var clause: String
        switch filter.op {
        case .is:
            clause = "\(filter.column.sql) is \(filter.isNull ? "" : "not ")null"
        case .in:
            guard let value = filter.value else { return nil }
            binds.append(value)
            clause =
                "\(filter.column.sql) = any($\(firstParameter + binds.count - 1)::\(sqlType(filter.column.kind))[])"
        default:
            guard let value = filter.value else { return nil }
            binds.append(value)
            clause = "\(filter.column.sql) \(filter.op.sql) $\(firstParameter + binds.count - 1)"
        }
        return filter.negated ? "not (\(clause))" : clause
    }

    /// A group's conditions in parentheses, joined by `or` or `and`.
    static func clause(_ group: Group, binds: inout [PostgresBind], firstParameter: Int) -> String? {
        let parts = group.conditions.compactMap { condition -> String? in
            switch condition {
            case .filter(let filter): return clause(filter, binds: &binds, firstParameter: firstParameter)
            case .group(let inner): return clause(inner, binds: &binds, firstParameter: firstParameter)
            }
        }
        guard !parts.isEmpty else { return nil }
        let joined = "(" + parts.joined(separator: group.isOr ? " or " : " and ") + ")"
        return group.negated ? "not " + joined : joined
    }

    func orderClause(default fallback: String) -> String {
        guard !order.isEmpty else { return " order by \(fallback)" }
        return " order by "
            + order.map { term in
                var sql = term.column.sql + (term.descending ? " desc" : " asc")
                if let nullsFirst = term.nullsFirst { sql += nullsFirst ? " nulls first" : " nulls last" }
                return sql
            }.joined(separator: ", ")
    }
}

/// The value of `or=`, `and=` (and their `not.`): `(condition,condition,…)`, each condition
/// `column.op.value` (`op` as in a filter, `not.` before it allowed) or a nested
/// `and(…)`, `or(…)`, `not.and(…)`, `not.or(…)`. A value holding `,` or `)` is
/// double-quoted (`\"` and `\\` inside), as supabase-js's `.or()` expects it written;
/// `in.(…)` keeps its own parentheses and quotes. Spaces around conditions are ignored.
struct LogicTree {
    let text: String
    let column: (String) throws -> RESTColumn
    private let scalars: [Unicode.Scalar]
    private var index = 0

    init(text: String, column: @escaping (String) throws -> RESTColumn) {
        self.text = text
        self.column = column
        scalars = Array(text.unicodeScalars)
    }

    /// The whole value: one group, nothing after it.
    mutating func parse(isOr: Bool, negated: Bool) throws -> RESTQuery.Group {
        let group = try self.group(isOr: isOr, negated: negated, depth: 1)
        guard index == scalars.count else { throw failure("unexpected text after the closing parenthesis") }
        return group
    }

    private func failure(_ details: String) -> APIError {
        RESTError.parse("failed to parse logic tree (\(text.prefix(100)))", details: details)
    }

    private mutating func group(isOr: Bool, negated: Bool, depth: Int) throws -> RESTQuery.Group {
        guard depth <= RESTQuery.maxLogicDepth else {
            throw failure("and(…) and or(…) nested more than \(RESTQuery.maxLogicDepth) levels")
        }
        guard consume("(") else { throw failure("expected (condition,condition,…)") }
        var conditions: [RESTQuery.Condition] = []
        repeat {
            skipSpaces()
            conditions.append(try condition(depth: depth))
            skipSpaces()
        } while consume(",")
        guard consume(")") else { throw failure("expected , or ) after a condition") }
        return RESTQuery.Group(isOr: isOr, negated: negated, conditions: conditions)
    }

    private mutating func condition(depth: Int) throws -> RESTQuery.Condition {
        for (prefix, isOr, negated) in [
            ("and(", false, false), ("or(", true, false), ("not.and(", false, true), ("not.or(", true, true),
        ] where starts(with: prefix) {
            index += prefix.unicodeScalars.count - 1  // the group reads its "("
            return .group(try group(isOr: isOr, negated: negated, depth: depth + 1))
        }
        let name = read { $0 != "." && $0 != "," && $0 != ")" && $0 != "(" }
        guard !name.isEmpty, consume(".") else { throw failure("expected column.operator.value, and(…) or or(…)") }
        let target = try column(name)
        var spec = ""
        if starts(with: "not.") {
            spec = "not."
            index += 4
        }
        let op = read { $0 != "." && $0 != "," && $0 != ")" }
        guard !op.isEmpty, consume(".") else { throw failure("expected an operator and a value after \(name)") }
        spec += op + "."
        if op == "in" {
            spec += try parenthesized()
        } else if index < scalars.count, scalars[index] == "\"" {
            guard let value = RESTQuery.quotedValue(scalars, at: &index) else {
                throw failure("unterminated quoted value")
            }
            spec += value
        } else {
            var value = read { $0 != "," && $0 != ")" }
            while value.hasSuffix(" ") { value.removeLast() }  // the space before a , or )
            spec += value
        }
        return .filter(try RESTQuery.filter(spec, on: target))
    }

    /// `(…)` as written, quotes and all (up to the `)` outside quotes), for `in`'s parser.
    private mutating func parenthesized() throws -> String {
        guard index < scalars.count, scalars[index] == "(" else { throw failure("expected in.(value,value,…)") }
        let start = index
        index += 1
        while index < scalars.count {
            if scalars[index] == "\"" {
                guard RESTQuery.quotedValue(scalars, at: &index) != nil else { break }
            } else {
                index += 1
                if scalars[index - 1] == ")" { return String(String.UnicodeScalarView(scalars[start..<index])) }
            }
        }
        throw failure("unterminated in.(…)")
    }

    private mutating func read(while accepted: (Unicode.Scalar) -> Bool) -> String {
        var text = String.UnicodeScalarView()
        while index < scalars.count, accepted(scalars[index]) {
            text.append(scalars[index])
            index += 1
        }
        return String(text)
    }

    private func starts(with prefix: String) -> Bool {
        var position = index
        for scalar in prefix.unicodeScalars {
            guard position < scalars.count, scalars[position] == scalar else { return false }
            position += 1
        }
        return true
    }

    private mutating func consume(_ scalar: Unicode.Scalar) -> Bool {
        guard index < scalars.count, scalars[index] == scalar else { return false }
        index += 1
        return true
    }

    private mutating func skipSpaces() {
        while index < scalars.count, scalars[index] == " " { index += 1 }
    }
}
