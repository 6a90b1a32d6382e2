import Foundation

/// The files in `config/` that are generated from `Setting.all`: `defaults.json` whole, and
/// the settings table of `README.md` between its two marker lines (the prose around it is
/// written by hand). `scripts/config-generate.sh` writes them (`trunk-sync config defaults
/// --json|--markdown`); ConfigurationFilesTests fails while the committed files differ.
public enum SettingsDocument {
    /// The line before the generated table in config/README.md.
    public static let tableStart =
        "<!-- settings table: generated from Sources/TrunkSync/Configuration/Setting.swift by scripts/config-generate.sh; do not edit -->"
    /// The line after it.
    public static let tableEnd = "<!-- end of generated settings table -->"

    /// `config/defaults.json`: every setting with its default (`null`: none), in order.
    public static var defaultsJSON: String {
        var lines = [
            "{",
            "  \"_comment\": \"trunk-sync's defaults, documented. Every key is optional; each has an environment variable TRUNK_SYNC_<KEY in upper case> that overrides the file, and flags override both. See config/README.md. Generated from Setting.swift by scripts/config-generate.sh.\",",
        ]
        for (index, setting) in Setting.all.enumerated() {
            let comma = index == Setting.all.count - 1 ? "" : ","
            lines.append("  \(jsonString(setting.key)): \(jsonDefault(setting))\(comma)")
        }
        lines.append("}")
        return lines.joined(separator: "\n") + "\n"
    }

    /// The settings table of `config/README.md` (without the marker lines).
    public static var markdownTable: String {
        var lines = ["| variable | file key | default | values | secret | meaning |", "|---|---|---|---|---|---|"]
        for setting in Setting.all {
            let shown: String
            switch setting.defaultValue {
            case nil: shown = "—"
            case ""?: shown = "none"
            case let value?: shown = "`\(value)`"
            }
            let meaning = setting.summary.replacingOccurrences(of: "|", with: "\\|")
            let secret = setting.isSecret ? "yes" : ""
            let columns = [
                "`\(setting.environmentVariable)`", "`\(setting.key)`", shown, values(setting), secret, meaning,
            ]
            lines.append("| " + columns.joined(separator: " | ") + " |")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// `readme` with the lines between its marker lines replaced by `markdownTable` (a blank
    /// line either side), or `nil` when it lacks either marker line.
    public static func readme(replacingTableIn readme: String) -> String? {
        guard let start = readme.range(of: tableStart + "\n"),
            let end = readme.range(of: tableEnd, range: start.upperBound..<readme.endIndex)
        else { return nil }
        return String(readme[..<start.upperBound]) + "\n" + markdownTable + "\n" + String(readme[end.lowerBound...])
    }

    /// What a setting accepts, for the table's values column (empty for free text).
    private static func values(_ setting: Setting) -> String {
        switch setting.kind {
        case .integer(let range): return "\(range.lowerBound) to \(range.upperBound)"
        case .seconds(let maximum): return "seconds, over 0 to \(Int(maximum))"
        case .rule: return "COUNT/SECONDS, SECONDS ≤ \(Setting.longestRuleWindow)"
        case .list: return "list"
        case .text: return ""
        }
    }

    private static func jsonDefault(_ setting: Setting) -> String {
        guard let value = setting.defaultValue else { return "null" }
        switch setting.kind {
        case .integer, .seconds:
            return value
        case .list:
            let items = value.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
                .filter { !$0.isEmpty }
            return "[" + items.map(jsonString).joined(separator: ", ") + "]"
        case .text, .rule:
            return jsonString(value)
        }
    }

    /// A JSON string literal (the defaults hold no control characters; quotes and backslashes
    /// are escaped).
    private static func jsonString(_ text: String) -> String {
        "\"" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }
}
