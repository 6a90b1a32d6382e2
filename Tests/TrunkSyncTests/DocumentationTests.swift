import Foundation
import TestSupport
import XCTest

@testable import TrunkSync

/// What the guides tell users to type, set or expect must exist: a command, option, setting
/// or error code renamed or removed in the code fails here, not in a user's terminal. (Every
/// setting is in config/README.md and every metric in docs/operations.md: ConfigurationFilesTests
/// and MetricsTests; this is the other direction.)
final class DocumentationTests: XCTestCase {
    /// README.md and the guides it links to, and the files operators copy and edit.
    static let guides = [
        "README.md", "docs/operations.md", "docs/moving-from-supabase.md", "config/README.md", "docs/api.md",
        "docs/realtime.md", "docs/ADMIN-API.md", "docs/clients.md", "docs/web-client.md", "docs/development.md",
        "docs/ARCHITECTURE.md", ".env.example", "docker-compose.yml", "Dockerfile",
    ]

    static func text(_ file: String) throws -> String {
        try String(contentsOfFile: repositoryRoot() + "/" + file, encoding: .utf8)
    }

    // MARK: - Settings

    /// `TRUNK_SYNC_*` variables that are not settings of the server, and the file that reads each.
    static let scriptVariables = [
        "TRUNK_SYNC_DEV_DATA": "scripts/run.sh", "TRUNK_SYNC_DEV_PG_PORT": "scripts/run.sh",
        "TRUNK_SYNC_BIN": "scripts/run.sh", "TRUNK_SYNC_PUBLISH": "docker-compose.yml",
        "TRUNK_SYNC_TEST_DATABASE_URL": "scripts/test.sh", "TRUNK_SYNC_TEST_PGDIR": "scripts/test.sh",
        "TRUNK_SYNC_TEST_PYTHON": "scripts/test.sh",
    ]

    func testEveryDocumentedVariableIsASetting() throws {
        let settings = Set(Setting.all.map(\.environmentVariable))
        let pattern = try NSRegularExpression(pattern: "TRUNK_SYNC_[A-Z0-9_]*[A-Z0-9]")
        var named = 0
        for file in Self.guides {
            let text = try Self.text(file)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                guard let range = Range(match.range, in: text) else { continue }
                let name = String(text[range])
                named += 1
                if settings.contains(name) { continue }
                guard let reader = Self.scriptVariables[name] else {
                    XCTFail("\(file) names \(name), which is no setting (Setting.swift) nor a script's variable")
                    continue
                }
                XCTAssertTrue(
                    try Self.text(reader).contains(name), "\(file) names \(name), which \(reader) no longer reads")
            }
        }
        XCTAssertGreaterThan(named, 100)
    }

    // MARK: - Error codes

    /// Codes the guides name as answered by earlier versions only (operations.md, "Upgrade").
    static let retiredCodes: Set<String> = ["email_send_failed"]

    /// Every `STATUS code` the guides name (`409 export_in_progress`, `400 PGRST100`, `400 57014`)
    /// is a code the server writes.
    func testEveryDocumentedErrorCodeIsAnswered() throws {
        // What the sources (not the generated copies of the documents) write between quotes.
        var literals: Set<Substring> = []
        let root = repositoryRoot() + "/Sources/"
        for case let path as String in FileManager.default.enumerator(atPath: root) ?? .init()
        where path.hasSuffix(".swift") && !path.contains("Generated/") {
            literals.formUnion(try String(contentsOfFile: root + path, encoding: .utf8).split(separator: "\""))
        }
        let pattern = try NSRegularExpression(
            pattern: #"\b[1-5][0-9]{2} `?([a-z][a-z0-9]*_[a-z0-9_]+|PGRST[0-9]{3}|[0-9]{2}[0-9A-Z]{3})\b"#)
        var named: Set<String> = []
        for file in Self.guides {
            let text = try Self.text(file)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                guard let range = Range(match.range(at: 1), in: text) else { continue }
                let code = String(text[range])
                named.insert(code)
                if Self.retiredCodes.contains(code) {
                    XCTAssertFalse(
                        literals.contains(Substring(code)), "\(file) names \(code) as retired, but it is answered")
                    continue
                }
                XCTAssertTrue(
                    literals.contains(Substring(code)), "\(file) names the error code \(code), which no source writes")
            }
        }
        // docs/openapi.json: every error code an answer's schema lists is one the server writes,
        // and no retired one is described.
        var listed: Set<String> = []
        func collect(_ value: Any) {
            if let object = value as? [String: Any] {
                for (key, inner) in object {
                    if key == "code" || key == "error_code", let codes = (inner as? [String: Any])?["enum"] as? [String]
                    {
                        listed.formUnion(codes)
                    }
                    collect(inner)
                }
            } else if let array = value as? [Any] {
                array.forEach(collect)
            }
        }
        let openAPI = try Self.text("docs/openapi.json")
        collect(try JSONSerialization.jsonObject(with: Data(openAPI.utf8)))
        XCTAssertTrue(listed.isSuperset(of: ["otp_expired", "database_busy"]), "\(listed)")
        for code in listed.sorted() {
            XCTAssertTrue(
                literals.contains(Substring(code)),
                "docs/openapi.json lists the error code \(code), which no source writes")
        }
        for code in Self.retiredCodes {
            XCTAssertFalse(openAPI.contains(code), "docs/openapi.json describes \(code), which is no longer answered")
        }
        XCTAssertTrue(
            named.isSuperset(of: ["export_in_progress", "host_not_allowed", "PGRST100", "57014"]), "\(named)")
    }

    // MARK: - Commands

    /// The command tree as ArgumentParser describes it (`--experimental-dump-help`).
    struct CommandInfo: Decodable {
        struct Argument: Decodable {
            struct Name: Decodable {
                var kind: String
                var name: String
            }
            var kind: String
            var names: [Name]?
        }
        var commandName: String
        var defaultSubcommand: String?
        var subcommands: [CommandInfo]?
        var arguments: [Argument]?

        func subcommand(_ name: String) -> CommandInfo? { subcommands?.first { $0.commandName == name } }

        /// Whether `--name` is an option or flag of this command, or of its default subcommand.
        func takes(_ name: String) -> Bool {
            if arguments?.contains(where: { $0.names?.contains { $0.kind == "long" && $0.name == name } ?? false })
                ?? false
            {
                return true
            }
            return defaultSubcommand.flatMap(subcommand)?.takes(name) ?? false
        }
    }

    struct ToolInfo: Decodable { var command: CommandInfo }

    /// The `trunk-sync` command lines of `text`: code spans and code lines that start with
    /// `trunk-sync` (after any `VAR=value`), or run it in compose (`docker compose run … migrate
    /// …`, `docker compose exec trunk-sync trunk-sync …`); what follows `trunk-sync` in each.
    static func commandLines(_ text: String, markdown: Bool) throws -> [String] {
        let joined = text.replacingOccurrences(of: "\\\n", with: " ")
        var candidates: [String] = []
        var fenced = false
        // An indented code block starts after a blank line (a list item's wrapped text is
        // indented as deep, but follows its text).
        var previousBlank = true
        var indentedCode = false
        for line in joined.split(separator: "\n", omittingEmptySubsequences: false) {
            defer { previousBlank = line.allSatisfy(\.isWhitespace) }
            if line.hasPrefix("```") {
                fenced.toggle()
                continue
            }
            indentedCode = line.hasPrefix("    ") && (indentedCode || previousBlank)
            // Code lines: fenced or indented by four spaces; in a YAML or shell file, the
            // compose commands its comments show.
            if markdown, fenced || indentedCode { candidates.append(String(line)) }
            if !markdown, line.hasPrefix("#"), line.contains("docker compose ") { candidates.append(String(line)) }
            var rest = line[...]
            while let open = rest.firstIndex(of: "`") {
                let after = rest[rest.index(after: open)...]
                guard let close = after.firstIndex(of: "`") else { break }
                candidates.append(String(after[..<close]))
                rest = after[after.index(after: close)...]
            }
        }
        let word = #"(?:"[^"]*"|'[^']*'|\$\([^)]*\)|[^\s"'$])+"#
        let patterns = try [
            #"^\s*(?:[A-Z_][A-Z0-9_]*=\#(word)\s+)*(?:\S*/)?trunk-sync\s+(.*)$"#,
            #"docker compose run\s+(?:-\S*\s+(?:(?!migrate\b)\#(word)\s+)?)*migrate\s+(.*)$"#,
            #"docker compose exec\s+(?:-\S+\s+)*trunk-sync\s+trunk-sync\s+(.*)$"#,
        ].map { try NSRegularExpression(pattern: $0) }
        var lines: [String] = []
        for candidate in candidates {
            for pattern in patterns {
                let range = NSRange(candidate.startIndex..., in: candidate)
                guard let match = pattern.firstMatch(in: candidate, range: range),
                    let found = Range(match.range(at: match.numberOfRanges - 1), in: candidate)
                else { continue }
                lines.append(String(candidate[found]))
            }
        }
        return lines
    }

    /// Where `line` (what follows `trunk-sync`) does not match the command tree: a subcommand
    /// that does not exist, or an option the command does not take.
    static func problems(_ line: String, root: CommandInfo) -> [String] {
        // A comment, redirection, or the next shell command ends it; `a|b` and a table's `\|`
        // are alternatives.
        var command = line
        for end in [" #", " >", " <", " && ", " ; ", " | "] {
            if let range = command.range(of: end) { command = String(command[..<range.lowerBound]) }
        }
        command = command.replacingOccurrences(of: "\\|", with: " \u{1} ").replacingOccurrences(
            of: "|", with: " \u{1} ")
        var path = [root]
        var alternative = false
        var descending = true
        var problems: [String] = []
        for raw in command.split(separator: " ") {
            let token = raw.trimmingCharacters(in: CharacterSet(charactersIn: "[](),.:;…"))
            if token.isEmpty { continue }
            let current = path[path.count - 1]
            let name = path.dropFirst().map(\.commandName).joined(separator: " ")
            if token == "\u{1}" {
                alternative = true
            } else if token.hasPrefix("--") {
                let option = String(token.dropFirst(2).prefix { $0 != "=" })
                if !["help", "version"].contains(option), !current.takes(option) {
                    problems.append("trunk-sync \(name) takes no --\(option)")
                }
                alternative = false
            } else if token.hasPrefix("-") {
                alternative = false
            } else if alternative {
                let parent = path[max(0, path.count - 2)]
                if let sub = parent.subcommand(token), path.count > 1 {
                    path[path.count - 1] = sub
                } else if !current.takes(token) {
                    problems.append(
                        "trunk-sync \(path.dropFirst().dropLast().map(\.commandName).joined(separator: " ")) has no \(token)"
                    )
                }
                alternative = false
            } else if descending, let sub = current.subcommand(token) {
                path.append(sub)
            } else {
                if descending, current.subcommands?.isEmpty == false, current.defaultSubcommand == nil {
                    problems.append("trunk-sync \(name) has no subcommand \(token)")
                }
                descending = false
            }
        }
        return problems
    }

    func testEveryDocumentedCommandExists() throws {
        let dump = try Command.run(Command.trunkSyncBinary(), ["--experimental-dump-help"])
        XCTAssertEqual(dump.status, 0, dump.stderr)
        let root = try JSONDecoder().decode(ToolInfo.self, from: Data(dump.stdout.utf8)).command
        XCTAssertNotNil(root.subcommand("users")?.subcommand("delete")?.takes("yes"))
        var checked = 0
        for file in Self.guides {
            for line in try Self.commandLines(try Self.text(file), markdown: file.hasSuffix(".md")) {
                checked += 1
                for problem in Self.problems(line, root: root) {
                    XCTFail("\(file): `trunk-sync \(line)`: \(problem)")
                }
            }
        }
        XCTAssertGreaterThan(checked, 40)
        // The check can fail.
        XCTAssertEqual(Self.problems("users remove E", root: root), ["trunk-sync users has no subcommand remove"])
        XCTAssertEqual(
            Self.problems("migrate --after-restor", root: root), ["trunk-sync migrate takes no --after-restor"])
        XCTAssertEqual(Self.problems("keys list \\| add \\| rotate KID", root: root), ["trunk-sync keys has no rotate"])
        XCTAssertEqual(Self.problems("migrate --after-restore", root: root), [])
        XCTAssertEqual(Self.problems("users delete|export E", root: root), [])
    }
}

extension DocumentationTests {
    /// realtime.md shows the WebSocket location of operations.md's nginx example: the same
    /// directives (comments apart), so neither is changed alone.
    func testRealtimeProxyLocationIsTheOperatorsOne() throws {
        func location(_ file: String) throws -> [String] {
            let text = try Self.text(file)
            let start = try XCTUnwrap(text.range(of: "location /realtime/v1/websocket {"), file)
            let end = try XCTUnwrap(text[start.upperBound...].range(of: "}"), file)
            return text[start.lowerBound..<end.upperBound].split(separator: "\n").map {
                $0.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)[0]
                    .trimmingCharacters(in: .whitespaces)
            }.filter { !$0.isEmpty }
        }
        let operations = try location("docs/operations.md")
        XCTAssertTrue(operations.contains("proxy_set_header Upgrade $http_upgrade;"), "\(operations)")
        XCTAssertEqual(try location("docs/realtime.md"), operations)
    }
}

extension DocumentationTests {
    /// Every key of `import supabase --json`'s report is in moving-from-supabase.md's list.
    func testImportReportKeysAreDocumented() throws {
        var report = SupabaseImport.Report()
        report.conflicts = [
            .init(sourceID: "s", email: "e", field: "email", emailHere: "h", reason: .addressTaken)
        ]
        report.rejectFile = "rejects.jsonl"
        let json = try JSONSerialization.jsonObject(with: try JSONEncoder().encode(report))
        var keys: Set<String> = []
        func collect(_ value: Any) {
            if let object = value as? [String: Any] {
                for (key, inner) in object {
                    keys.insert(key)
                    collect(inner)
                }
            } else if let array = value as? [Any] {
                array.forEach(collect)
            }
        }
        collect(json)
        XCTAssertTrue(keys.isSuperset(of: ["dry_run", "source_id", "already_there", "incomplete_users"]), "\(keys)")
        let guide = try Self.text("docs/moving-from-supabase.md")
        for key in keys.sorted() {
            XCTAssertTrue(guide.contains("\"\(key)\""), "the report's \(key) is not in moving-from-supabase.md")
        }
    }
}

extension DocumentationTests {
    /// A heading's anchor as GitHub makes it: lower case, spaces as hyphens, other
    /// punctuation dropped.
    static func anchor(_ heading: String) -> String {
        String(
            heading.lowercased().compactMap { character -> Character? in
                if character == " " { return "-" }
                return character.isLetter || character.isNumber || character == "_" || character == "-"
                    ? character : nil
            })
    }

    /// Every relative link of the guides (`[text](file#anchor)`) names a file that exists and,
    /// in a Markdown file, a heading it has: a section renamed or a file moved fails here.
    func testEveryLinkOfTheGuidesResolves() throws {
        let pattern = try NSRegularExpression(pattern: #"\]\(([^)\s]+)\)"#)
        var checked = 0
        for file in Self.guides where file.hasSuffix(".md") {
            let text = try Self.text(file)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                guard let range = Range(match.range(at: 1), in: text), !text[range].hasPrefix("http") else { continue }
                let parts = text[range].split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)
                let directory = (file as NSString).deletingLastPathComponent
                let target =
                    parts[0].isEmpty
                    ? file
                    : ((directory as NSString).appendingPathComponent(String(parts[0])) as NSString).standardizingPath
                checked += 1
                guard FileManager.default.fileExists(atPath: repositoryRoot() + "/" + target) else {
                    XCTFail("\(file) links to \(text[range]): no such file")
                    continue
                }
                guard parts.count == 2, target.hasSuffix(".md") else { continue }
                var fenced = false
                let headings = try Self.text(target).split(separator: "\n").compactMap { line -> String? in
                    if line.hasPrefix("```") { fenced.toggle() }
                    guard !fenced, line.hasPrefix("#") else { return nil }
                    return Self.anchor(line.drop { $0 == "#" }.trimmingCharacters(in: .whitespaces))
                }
                XCTAssertTrue(headings.contains(String(parts[1])), "\(file) links to \(text[range]): no such heading")
            }
        }
        XCTAssertGreaterThan(checked, 30)
        XCTAssertEqual(Self.anchor("Back up and restore"), "back-up-and-restore")
        XCTAssertEqual(
            Self.anchor("Address, name and metadata changed on the hosted project"),
            "address-name-and-metadata-changed-on-the-hosted-project")
    }
}

extension DocumentationTests {
    /// The names a module declares with `export function|class|const …` (`export async
    /// function` too).
    static func exportedNames(_ text: String, kinds: String) throws -> Set<String> {
        let pattern = try NSRegularExpression(
            pattern: #"^export (?:declare )?(?:async )?(?:\#(kinds))\*? ?([A-Za-z_$][A-Za-z0-9_$]*)"#,
            options: .anchorsMatchLines)
        return Set(
            pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap {
                Range($0.range(at: 1), in: text).map { String(text[$0]) }
            })
    }

    /// Every function, class and constant clients/web/trunk-sync.js exports has its type in
    /// trunk-sync.d.ts (the web client's documented API), and the types name nothing the
    /// module does not export: a helper added, renamed or removed on one side only fails here.
    func testEveryWebClientExportIsTyped() throws {
        let kinds = "function|class|const|let"
        let module = try Self.exportedNames(Self.text("clients/web/trunk-sync.js"), kinds: kinds)
        let types = try Self.exportedNames(Self.text("clients/web/trunk-sync.d.ts"), kinds: kinds)
        XCTAssertTrue(
            module.isSuperset(of: ["TrunkSyncClient", "TrunkSyncError", "ExportCheck", "readAnswer"]), "\(module)")
        for name in module.subtracting(types).sorted() {
            XCTFail("clients/web/trunk-sync.js exports \(name), which trunk-sync.d.ts does not declare")
        }
        for name in types.subtracting(module).sorted() {
            XCTFail("clients/web/trunk-sync.d.ts declares \(name), which trunk-sync.js does not export")
        }
    }
}

extension DocumentationTests {
    /// Where `text` gives a setting's default that is not Setting.swift's: a number after a
    /// variable, `TRUNK_SYNC_X` (N unit) or `TRUNK_SYNC_X`, N unit (a unit of bytes or time,
    /// or none), for settings that are numbers; and the tables whose first column names
    /// variables and whose last column gives a code span each (`A`, `B` | … | `a`, `b`).
    static func defaultProblems(_ text: String) throws -> [String] {
        var problems: [String] = []
        let units: [String: Double] = [
            "": 1, "KiB": 1024, "MiB": 1024 * 1024, "s": 1, "seconds": 1, "hour": 3600, "hours": 3600,
        ]
        let joined = text.replacingOccurrences(of: "\n", with: " ")
        let prose = try NSRegularExpression(
            pattern: #"TRUNK_SYNC_([A-Z0-9_]*[A-Z0-9])`?(?:,| \()\s*([0-9][0-9,]*(?:\.[0-9]+)?)"#
                + #"(?:\s*(KiB|MiB|seconds|s|hours?))?(?=[),;:]|\s+by default)"#)
        for match in prose.matches(in: joined, range: NSRange(joined.startIndex..., in: joined)) {
            func group(_ index: Int) -> String {
                Range(match.range(at: index), in: joined).map { String(joined[$0]) } ?? ""
            }
            guard let setting = Setting.named(group(1).lowercased()), let defaultValue = setting.defaultValue,
                let stated = Double(group(2).replacingOccurrences(of: ",", with: "")),
                let factor = units[group(3)]
            else { continue }
            switch setting.kind {
            case .integer, .seconds:
                if Double(defaultValue) != stated * factor {
                    let given = group(3).isEmpty ? group(2) : "\(group(2)) \(group(3))"
                    problems.append("\(setting.environmentVariable): \(given), but its default is \(defaultValue)")
                }
            default: continue
            }
        }
        let code = #"`([^`]+)`"#
        let names = try NSRegularExpression(pattern: #"^`TRUNK_SYNC_[A-Z0-9_]+`(?:, `TRUNK_SYNC_[A-Z0-9_]+`)*$"#)
        let values = try NSRegularExpression(pattern: #"^`[^`]+`(?:, `[^`]+`)*$"#)
        let spans = try NSRegularExpression(pattern: code)
        for line in text.split(separator: "\n") where line.hasPrefix("| `TRUNK_SYNC_") {
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map {
                $0.trimmingCharacters(in: .whitespaces)
            }.filter { !$0.isEmpty }
            guard cells.count >= 2, let first = cells.first, let last = cells.last else { continue }
            func whole(_ pattern: NSRegularExpression, _ cell: String) -> Bool {
                pattern.firstMatch(in: cell, range: NSRange(cell.startIndex..., in: cell)) != nil
            }
            func codes(_ cell: String) -> [String] {
                spans.matches(in: cell, range: NSRange(cell.startIndex..., in: cell)).compactMap {
                    Range($0.range(at: 1), in: cell).map { String(cell[$0]) }
                }
            }
            guard whole(names, first), whole(values, last), codes(first).count == codes(last).count else { continue }
            for (name, value) in zip(codes(first), codes(last)) {
                // A setting without a default of its own (`http://HOST:PORT`, another
                // setting's value) is described, not compared.
                let setting = Setting.all.first { $0.environmentVariable == name }
                if let defaultValue = setting?.defaultValue, defaultValue != value {
                    problems.append("\(name): `\(value)`, but its default is \(defaultValue)")
                }
            }
        }
        return problems
    }

    /// The defaults the guides state are Setting.swift's: a default changed there and not in
    /// the prose (or a number mistyped) fails here, not in an operator's capacity plan.
    func testEveryDocumentedDefaultIsTheSettingsDefault() throws {
        for file in Self.guides where file.hasSuffix(".md") {
            for problem in try Self.defaultProblems(Self.text(file)) { XCTFail("\(file): \(problem)") }
        }
        // The check can fail, and reads both forms.
        XCTAssertEqual(
            try Self.defaultProblems("at most `TRUNK_SYNC_STREAM_MAX` (4,000) per instance"),
            ["TRUNK_SYNC_STREAM_MAX: 4,000, but its default is 5000"])
        XCTAssertEqual(
            try Self.defaultProblems("(`TRUNK_SYNC_JWT_EXPIRY`, 2 hours by default)"),
            ["TRUNK_SYNC_JWT_EXPIRY: 2 hours, but its default is 3600"])
        XCTAssertEqual(
            try Self.defaultProblems("| `TRUNK_SYNC_LOG_LEVEL`, `TRUNK_SYNC_LOG_FORMAT` | … | `info`, `json` |"),
            ["TRUNK_SYNC_LOG_FORMAT: `json`, but its default is text"])
        XCTAssertEqual(
            try Self.defaultProblems("`TRUNK_SYNC_REALTIME_BUFFER` (256 KiB); `TRUNK_SYNC_DB_POOL_TIMEOUT` (5 s)"), [])
    }
}
