import Foundation
import TrunkCrypto

/// One versioned SQL file from the migrations directory (`0001_initial_schema.sql`).
public struct Migration: Sendable, Equatable {
    /// The number the file name starts with; migrations apply in this order.
    public let version: Int64
    /// The file name, e.g. `0001_initial_schema.sql`.
    public let name: String
    /// The file's SQL.
    public let sql: String
    /// Hex SHA-256 of the file's bytes, recorded when applied and verified on every run.
    public let checksum: String

    /// A migration from its file name and contents.
    /// - Throws: `MigrationError.badFileName` unless the name is `<digits>_<words>.sql`.
    public init(name: String, contents: [UInt8]) throws {
        let stem = name.hasSuffix(".sql") ? String(name.dropLast(4)) : ""
        let parts = stem.split(separator: "_", maxSplits: 1)
        guard parts.count == 2, parts[0].allSatisfy(\.isASCII), let version = Int64(parts[0]), version > 0,
            !parts[1].isEmpty
        else {
            throw MigrationError.badFileName(name)
        }
        self.version = version
        self.name = name
        self.sql = String(decoding: contents, as: UTF8.self)
        self.checksum = SHA256.hash(contents).map { String(format: "%02x", $0) }.joined()
    }

    /// Loads every `*.sql` file of `directory`, sorted by version.
    /// - Throws: `MigrationError` for an unreadable directory, a bad name or a repeated version.
    public static func load(from directory: String) throws -> [Migration] {
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory)
        } catch {
            throw MigrationError.directoryUnreadable(directory)
        }
        var migrations: [Migration] = []
        for name in names where name.hasSuffix(".sql") {
            guard let data = FileManager.default.contents(atPath: directory + "/" + name) else {
                throw MigrationError.directoryUnreadable(directory + "/" + name)
            }
            migrations.append(try Migration(name: name, contents: Array(data)))
        }
        migrations.sort { ($0.version, $0.name) < ($1.version, $1.name) }
        for (previous, next) in zip(migrations, migrations.dropFirst()) where previous.version == next.version {
            throw MigrationError.duplicateVersion(previous.name, next.name)
        }
        return migrations
    }

    /// Where the migrations are: `TRUNK_SYNC_MIGRATIONS_DIR` when set (or the explicit
    /// directory), else `./migrations`, else `share/trunk-sync/migrations` beside the binary's
    /// `bin/`, else `/usr/share/trunk-sync/migrations`.
    public static func defaultDirectory(explicit: String?) -> String {
        if let explicit, !explicit.isEmpty { return explicit }
        let executable = URL(fileURLWithPath: CommandLine.arguments.first ?? "").resolvingSymlinksInPath()
        let candidates = [
            FileManager.default.currentDirectoryPath + "/migrations",
            executable.deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("share/trunk-sync/migrations").path,
            "/usr/share/trunk-sync/migrations",
        ]
        var isDirectory: ObjCBool = false
        for candidate in candidates
        where FileManager.default.fileExists(atPath: candidate, isDirectory: &isDirectory) && isDirectory.boolValue {
            return candidate
        }
        return candidates[0]
    }
}

/// Why migrations could not be loaded or applied. Each message is one line for operators.
public enum MigrationError: Error, Equatable, CustomStringConvertible {
    case directoryUnreadable(String)
    case badFileName(String)
    case duplicateVersion(String, String)
    case appliedFileMissing(String)
    case appliedFileChanged(String)
    case outOfOrder(pending: String, newestApplied: String)
    case failed(name: String, reason: String)

    /// One line for the operator.
    public var description: String {
        switch self {
        case .directoryUnreadable(let path):
            return "cannot read migrations at \(path) (set TRUNK_SYNC_MIGRATIONS_DIR or --migrations)"
        case .badFileName(let name):
            return "migration file \(name) must be named <number>_<description>.sql, e.g. 0002_add_index.sql"
        case .duplicateVersion(let first, let second):
            return "migrations \(first) and \(second) have the same version number"
        case .appliedFileMissing(let name):
            return "migration \(name) was applied to this database but its file is missing; restore it"
        case .appliedFileChanged(let name):
            return
                "migration \(name) was edited after it was applied (checksum differs); restore the applied version and put changes in a new migration"
        case .outOfOrder(let pending, let newest):
            return "migration \(pending) is older than \(newest), which is already applied; give it a higher number"
        case .failed(let name, let reason):
            return "migration \(name) failed and was rolled back: \(reason)"
        }
    }
}
