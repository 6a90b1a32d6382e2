/// The errors of the `/rest/v1` routes, with PostgREST's codes. They are `APIError`s
/// rendered in PostgREST's shape (`APIFamily.rest`).
public enum RESTError {
    static func parse(_ message: String, details: String? = nil) -> APIError {
        APIError(status: 400, code: "PGRST100", message: message, details: details.map { .text($0) })
    }

    /// A PostgREST feature this subset does not have (`or=`, `not.`, `like.` …), named, so an
    /// app's `.or()` is not mistaken for a missing column.
    static func unsupported(_ feature: String) -> APIError {
        APIError(
            status: 400, code: "PGRST100", message: "The \(feature) is not supported by this server.",
            details: .text(
                "Filters are column=op.value or column=not.op.value with \(RESTQuery.Operator.supported); several are combined with and; or=(…) and and=(…) combine conditions."
            ))
    }

    static func unknownColumn(_ column: String, in table: String) -> APIError {
        APIError(status: 400, code: "42703", message: "column \(table).\(column) does not exist")
    }

    static func badValue(_ value: String, type: String) -> APIError {
        APIError(status: 400, code: "22P02", message: "invalid input syntax for type \(type): \"\(value.prefix(100))\"")
    }

    /// A statement ran longer than `rest_statement_timeout` and PostgreSQL cancelled it
    /// (PostgREST's code and message for the same).
    static func statementTimeout(_ limit: Duration) -> APIError {
        APIError(
            status: 400, code: "57014", message: "canceling statement due to statement timeout",
            details: .text("A statement of this request ran longer than \(limit) (rest_statement_timeout)."),
            hint: "Narrow the query: filters on indexed columns, a smaller offset (or a range on seq), no count=exact.")
    }

    static let jwt = APIError(status: 401, code: "PGRST301", message: "JWT could not be verified")
    static let apiKey = APIError(status: 401, code: "PGRST301", message: "Invalid API key")
    static let foreignUser = APIError(
        status: 403, code: "42501", message: "new row violates row-level security policy for table \"events\"")

    static func singular(_ count: Int) -> APIError {
        APIError(
            status: 406, code: "PGRST116", message: "JSON object requested, multiple (or no) rows returned",
            details: .text("The result contains \(count) rows"))
    }

    /// A schema other than `public` (PostgREST 13's code, status and wording).
    static func invalidSchema(_ schema: String) -> APIError {
        APIError(
            status: 406, code: "PGRST106", message: "Invalid schema: \(schema.prefix(100))",
            hint: "Only the following schemas are exposed: public")
    }

    static func append(only method: String) -> APIError {
        APIError(status: 405, code: "PGRST105", message: "events are append-only: \(method) is not allowed")
    }

    static func unknownTable(_ table: String) -> APIError {
        APIError(
            status: 404, code: "PGRST205", message: "Could not find the table 'public.\(table)' in the schema cache")
    }
}
