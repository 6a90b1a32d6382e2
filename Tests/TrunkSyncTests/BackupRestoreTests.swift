import Foundation
import TestSupport
import XCTest

/// `scripts/backup.sh restore TIME DATADIR` (docs/operations.md, "Restore to a point in
/// time") on an archive laid out as pg_basebackup and PostgreSQL write it, without a cluster:
/// it lays out the newest base backup that had ended by TIME, judged by the STOP TIME of the
/// archive's `.backup` file with its label (else the `end-time` beside it), and refuses in one
/// line, writing nothing, a TIME before every kept base backup ended: PostgreSQL itself would
/// not refuse it, but stop at the first commit after the backup's end, later than asked.
/// (`make drill` restores with it and starts the cluster.)
final class BackupRestoreTests: XCTestCase {
    private var directory = ""
    private var backups = 0

    override func setUpWithError() throws {
        directory = NSTemporaryDirectory() + "backup-restore-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory + "/wal", withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A base backup `name` (a data directory holding `marker`, and its pg_wal), which ended
    /// at `stop`: told by the archive's `.backup` file, or by its `end-time` alone.
    private func addBaseBackup(_ name: String, marker: String, stop: String, inArchive: Bool) throws {
        backups += 1
        let script = """
            set -euo pipefail
            mkdir -p "$1/base/$2" "$1/data/pg_wal" "$1/wal-files"
            echo "$3" >"$1/data/marker"
            echo 16 >"$1/data/PG_VERSION"
            tar -czf "$1/base/$2/base.tar.gz" -C "$1/data" marker PG_VERSION pg_wal
            echo segment >"$1/wal-files/$3-segment"
            tar -czf "$1/base/$2/pg_wal.tar.gz" -C "$1/wal-files" "$3-segment"
            rm -rf "$1/data" "$1/wal-files"
            if [ "$5" = archive ]; then
              printf 'START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\\nSTART TIME: %s\\nLABEL: trunk-sync %s\\nSTOP TIME: %s\\n' \\
                "$4" "$2" "$4" >"$1/wal/00000001000000000000000$6.00000028.backup"
            else
              echo "$4" >"$1/base/$2/end-time"
            fi
            """
        let result = try Command.run(
            "/bin/bash",
            ["-c", script, "fixture", directory, name, marker, stop, inArchive ? "archive" : "end-time", "\(backups)"])
        XCTAssertEqual(result.status, 0, result.stderr)
    }

    private func restore(_ time: String, into data: String) throws -> Command.Result {
        try Command.run(
            "/bin/bash", [repositoryRoot() + "/scripts/backup.sh", "restore", time, data],
            environment: Command.environment(["BACKUP_DIR": directory, "TZ": "UTC"]))
    }

    func testATimeBeforeEveryBaseBackupEndedIsRefusedInOneLineWritingNothing() throws {
        // Started at 02:00:00, ended at 02:00:41: 02:00:30 is before its end.
        try addBaseBackup("20261126T020000Z", marker: "first", stop: "2026-11-26 02:00:41 UTC", inArchive: true)
        let data = directory + "/restored"
        // 02:00:41.5 neither: STOP TIME is a whole second, the end came within it (at 41.8, say).
        for time in [
            "2026-11-26 01:00:00+00", "2026-11-26 02:00:30+00", "2026-11-26 04:00:30+02", "2026-11-26 02:00:41+00",
            "2026-11-26 02:00:41.5+00",
        ] {
            let result = try restore(time, into: data)
            XCTAssertEqual(result.status, 1, result.stdout + result.stderr)
            let lines = result.stderr.split(separator: "\n")
            XCTAssertEqual(lines.count, 1, result.stderr)
            XCTAssertTrue(
                result.stderr.hasPrefix("backup: restore: no base backup had ended by 2026-11-26 0"), result.stderr)
            XCTAssertTrue(
                result.stderr.contains("the oldest kept, 20261126T020000Z, ended at 2026-11-26 02:00:41+00"),
                result.stderr)
            XCTAssertTrue(result.stderr.contains("nothing was written"), result.stderr)
            XCTAssertFalse(FileManager.default.fileExists(atPath: data), "\(time) wrote \(data)")
        }
    }

    func testTheNewestBaseBackupThatHadEndedByTheTimeIsLaidOutWithTheRecoverySettings() throws {
        try addBaseBackup("20261125T020000Z", marker: "first", stop: "2026-11-25 02:00:40 UTC", inArchive: true)
        // Its archive's .backup file gone (a copy of the archive without it): its end-time says.
        try addBaseBackup("20261126T020000Z", marker: "second", stop: "2026-11-26 02:00:41 UTC", inArchive: false)
        // Taken after the mistake: never the one restored to a time before it ended.
        try addBaseBackup("20261126T140500Z", marker: "third", stop: "2026-11-26 14:05:30 UTC", inArchive: true)
        let data = directory + "/restored/pgdata"
        let result = try restore("2026-11-26 14:03:09.5+00", into: data)
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        XCTAssertEqual(
            result.stdout,
            "backup: restore: base backup 20261126T020000Z laid out in \(data); PostgreSQL replays \(directory)/wal up to 2026-11-26 14:03:09.500000+00 when it starts there, then promotes\n"
        )
        XCTAssertEqual(try String(contentsOfFile: data + "/marker", encoding: .utf8), "second\n")
        XCTAssertTrue(FileManager.default.fileExists(atPath: data + "/pg_wal/second-segment"))
        XCTAssertTrue(FileManager.default.fileExists(atPath: data + "/recovery.signal"))
        XCTAssertEqual(
            try String(contentsOfFile: data + "/postgresql.auto.conf", encoding: .utf8),
            """
            restore_command = 'cp \(directory)/wal/%f %p'
            recovery_target_time = '2026-11-26 14:03:09.500000+00'
            recovery_target_action = 'promote'

            """)
        let mode = try FileManager.default.attributesOfItem(atPath: data)[.posixPermissions] as? Int
        XCTAssertEqual(mode, 0o700)

        // Into a directory that holds something: refused, nothing changed.
        let again = try restore("2026-11-26 14:03:09+00", into: data)
        XCTAssertEqual(again.status, 1, again.stdout + again.stderr)
        XCTAssertEqual(
            again.stderr, "backup: restore: \(data) is not empty; restore into a new, empty data directory\n")
        XCTAssertEqual(try String(contentsOfFile: data + "/marker", encoding: .utf8), "second\n")
    }

    /// A BACKUP_DIR whose path has a space, a quote or a % in it: the restore_command
    /// PostgreSQL reads from postgresql.auto.conf, run as it runs it (the string's quotes
    /// undone, %f, %p and %% replaced, `sh -c` in the data directory), copies the segment.
    func testTheRestoreCommandReadsAnArchiveWhosePathHasASpaceOrAQuote() throws {
        let parent = directory
        defer { try? FileManager.default.removeItem(atPath: parent) }
        directory = parent + "/the backups of it's 100% \\ \"$HOME\""
        try FileManager.default.createDirectory(atPath: directory + "/wal", withIntermediateDirectories: true)
        try addBaseBackup("20261126T020000Z", marker: "first", stop: "2026-11-26 02:00:41 UTC", inArchive: true)
        let segment = "000000010000000000000003"
        try Data("segment 3".utf8).write(to: URL(fileURLWithPath: directory + "/wal/" + segment))
        let data = parent + "/restored"
        let result = try restore("2026-11-26 14:03:09+00", into: data)
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        let settings = try String(contentsOfFile: data + "/postgresql.auto.conf", encoding: .utf8)
        let line = try XCTUnwrap(settings.split(separator: "\n").first { $0.hasPrefix("restore_command = '") })
        // postgresql.conf's string: '' is ', a backslash escapes the next character.
        var value = ""
        var rest = line.dropFirst("restore_command = '".count).dropLast()[...]
        while let character = rest.popFirst() {
            if character == "'" || character == "\\" {
                value.append(rest.popFirst() ?? character)
            } else {
                value.append(character)
            }
        }
        // restore_command's own escapes.
        var command = ""
        var characters = value[...]
        while let character = characters.popFirst() {
            guard character == "%" else {
                command.append(character)
                continue
            }
            switch characters.popFirst() {
            case "f": command += segment
            case "p": command += "pg_wal/RECOVERYXLOG"
            default: command += "%"
            }
        }
        let copy = try Command.run("/bin/sh", ["-c", command], currentDirectory: data)
        XCTAssertEqual(copy.status, 0, command + ": " + copy.stderr)
        XCTAssertEqual(try String(contentsOfFile: data + "/pg_wal/RECOVERYXLOG", encoding: .utf8), "segment 3")
    }

    func testATimeThatIsNoTimeIsRefusedInOneLine() throws {
        try addBaseBackup("20261126T020000Z", marker: "first", stop: "2026-11-26 02:00:41 UTC", inArchive: true)
        let result = try restore("after lunch", into: directory + "/restored")
        XCTAssertEqual(result.status, 2, result.stdout + result.stderr)
        XCTAssertEqual(
            result.stderr, "backup: restore: cannot read the time \"after lunch\"; write it as 2026-11-26 14:03:09+00\n"
        )
    }
}
