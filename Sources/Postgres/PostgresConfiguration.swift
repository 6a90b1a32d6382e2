import CLibPQ

/// Where and how to connect to PostgreSQL: a `postgres://` URL or a libpq conninfo string,
/// parsed by libpq itself (`PQconninfoParse`) into keyword/value pairs.
///
/// The pairs are handed to `PQconnectdbParams` (or `PQconnectStartParams`) as they are, so
/// no connection string is ever built by interpolating values. `description` never shows
/// the password.
public struct PostgresConfiguration: Sendable, CustomStringConvertible {
    /// The connection parameters in libpq's keywords (`host`, `port`, `dbname`, `user`, …).
    public private(set) var parameters: [(keyword: String, value: String)]

    /// The setting this configuration came from (`TRUNK_SYNC_DATABASE_URL`), which a
    /// connection error names first, so an operator with two URLs knows which to fix.
    /// Default nil: not named.
    public var setting: String? = nil

    /// Parses a URL (`postgres://user:pass@host:port/db?sslmode=…`) or a conninfo string
    /// (`host=… dbname=…`).
    ///
    /// Adds `connect_timeout=10` unless one is given, and identifies the client as
    /// `trunk-sync` unless `application_name` is given.
    /// - Throws: `PostgresError` of kind `.invalidConfiguration` with libpq's reason, every
    ///   fragment of the input it quotes (which may be the password, or the whole URL)
    ///   replaced by `"…"`.
    public init(_ urlOrConninfo: String) throws {
        var errorMessage: UnsafeMutablePointer<CChar>? = nil
        guard let options = PQconninfoParse(urlOrConninfo, &errorMessage) else {
            let reason = errorMessage.map { String(cString: $0) } ?? "unparseable connection string"
            if let errorMessage { PQfreemem(errorMessage) }
            throw PostgresError(
                kind: .invalidConfiguration,
                message: "invalid database URL: \(Self.withoutQuotedInput(Self.oneLine(reason)))"
            )
        }
        defer { PQconninfoFree(options) }
        var parsed: [(keyword: String, value: String)] = []
        var option = options
        while let keyword = option.pointee.keyword {
            if let value = option.pointee.val {
                parsed.append((String(cString: keyword), String(cString: value)))
            }
            option += 1
        }
        self.parameters = parsed
        if self["connect_timeout"] == nil { setParameter("connect_timeout", "10") }
        if self["application_name"] == nil { setParameter("fallback_application_name", "trunk-sync") }
    }

    /// The value of one libpq keyword, if set.
    public subscript(keyword: String) -> String? {
        parameters.last(where: { $0.keyword == keyword })?.value
    }

    /// Sets (or replaces) one libpq keyword, e.g. `dbname` to point the same server at
    /// another database.
    public mutating func setParameter(_ keyword: String, _ value: String) {
        parameters.removeAll { $0.keyword == keyword }
        parameters.append((keyword, value))
    }

    /// The same configuration pointing at another database.
    public func withDatabase(_ name: String) -> PostgresConfiguration {
        var copy = self
        copy.setParameter("dbname", name)
        return copy
    }

    /// `host:port/database`, for messages. Falls back to libpq's defaults when unset.
    public var endpoint: String {
        let host = self["host"] ?? self["hostaddr"] ?? "localhost"
        let port = self["port"] ?? "5432"
        let database = self["dbname"] ?? self["user"] ?? "(default)"
        return withoutPassword("\(host):\(port)/\(database)")
    }

    /// The parameters with secrets replaced by `***`, for logs and `config check`.
    public var description: String {
        parameters.map { pair in
            let secret = pair.keyword == "password" || pair.keyword == "sslpassword"
            return "\(pair.keyword)=\(secret ? "***" : pair.value)"
        }.joined(separator: " ")
    }

    /// libpq's own keywords (`host`, `port`, `password`, …): the quoted words in its messages
    /// that come from libpq, not from the input.
    static let keywords: Set<String> = {
        guard let defaults = PQconndefaults() else { return [] }
        defer { PQconninfoFree(defaults) }
        var names: Set<String> = []
        var option = defaults
        while let keyword = option.pointee.keyword {
            names.insert(String(cString: keyword))
            option += 1
        }
        return names
    }()

    /// `message` with every double-quoted fragment that is not a libpq keyword replaced by
    /// `"…"`. libpq quotes pieces of the connection string it could not parse, such as
    /// `invalid percent-encoded token: "p%zzword"` or the whole URL, password included.
    static func withoutQuotedInput(_ message: String) -> String {
        var result = ""
        var rest = message[...]
        while let open = rest.firstIndex(of: "\"") {
            result += rest[..<open]
            let afterOpen = rest.index(after: open)
            guard let close = rest[afterOpen...].firstIndex(of: "\"") else {
                // An unmatched quote: the rest may be input.
                return result + "\"…"
            }
            let quoted = String(rest[afterOpen..<close])
            result += keywords.contains(quoted) ? "\"\(quoted)\"" : "\"…\""
            rest = rest[rest.index(after: close)...]
        }
        return result + rest
    }

    /// `message` with the password (when it is long enough to mean something) replaced by
    /// `***`: libpq echoes values such as an out-of-range port, and a password with an
    /// unescaped `/` or `@` spills into those.
    func withoutPassword(_ message: String) -> String {
        guard let password = self["password"], password.count >= 4 else { return message }
        return message.replacingOccurrences(of: password, with: "***")
    }

    static func oneLine(_ text: String) -> String {
        text.split(whereSeparator: { $0 == "\n" || $0 == "\r" })
            .map { $0.trimmingWhitespace() }
            .filter { !$0.isEmpty }
            .joined(separator: "; ")
    }
}

extension Substring {
    func trimmingWhitespace() -> String {
        var slice = self[...]
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return String(slice)
    }
}
