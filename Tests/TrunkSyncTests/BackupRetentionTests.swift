import Foundation
import TestSupport
import XCTest

/// scripts/backup.sh's retention (the compose `backup` service's) on an archive laid out as
/// PostgreSQL and pg_basebackup write it, without a cluster: base backups whose
/// `base.tar.gz` starts with a `backup_label`, and archived WAL across two timelines whose
/// file times say nothing (a copy of the archive, as restored from off-host). What a restore
/// of the kept base backups needs stays: their start segments and every later one, by name,
/// and every timeline history file, however old. (`make drill` runs the same script
/// against real clusters.)
final class BackupRetentionTests: XCTestCase {
    private var directory = ""

    override func setUpWithError() throws {
        directory = NSTemporaryDirectory() + "backup-retention-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory + "/wal", withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A base backup named `name` whose backup_label starts in `segment`.
    private func addBaseBackup(_ name: String, startingIn segment: String) throws {
        let script = """
            set -euo pipefail
            mkdir -p "$1/base/$2" "$1/label"
            printf 'START WAL LOCATION: 0/%s (file %s)\\nCHECKPOINT LOCATION: 0/1\\nBACKUP METHOD: streamed\\n' 28 "$3" \
              >"$1/label/backup_label"
            head -c 4096 /dev/urandom >"$1/label/PG_VERSION"
            tar -czf "$1/base/$2/base.tar.gz" -C "$1/label" backup_label PG_VERSION
            : >"$1/base/$2/pg_wal.tar.gz"
            rm -rf "$1/label"
            """
        let result = try Command.run("/bin/bash", ["-c", script, "fixture", directory, name, segment])
        XCTAssertEqual(result.status, 0, result.stderr)
    }

    private func archive(_ names: [String], modified: String = "now") throws {
        for name in names {
            FileManager.default.createFile(atPath: "\(directory)/wal/\(name)", contents: Data("wal".utf8))
            let touched = try Command.run("/usr/bin/touch", ["-d", modified, "\(directory)/wal/\(name)"])
            XCTAssertEqual(touched.status, 0, touched.stderr)
        }
    }

    private func prune(keep: Int) throws -> Command.Result {
        try Command.run(
            "/bin/bash", [repositoryRoot() + "/scripts/backup.sh", "prune"],
            environment: Command.environment(["BACKUP_DIR": directory, "BACKUP_KEEP": String(keep)]))
    }

    private var archived: Set<String> {
        Set((try? FileManager.default.contentsOfDirectory(atPath: directory + "/wal")) ?? [])
    }

    func testRetentionKeepsWhatTheKeptBaseBackupsNeedByNameAndEveryHistoryFile() throws {
        try addBaseBackup("20261101T020000Z", startingIn: "000000010000000000000003")
        try addBaseBackup("20261102T020000Z", startingIn: "000000010000000000000008")
        try addBaseBackup("20261103T020000Z", startingIn: "000000020000000000000010")
        let removed = [
            "000000010000000000000002", "000000010000000000000003", "000000010000000000000003.00000028.backup",
            "000000010000000000000007", "000000010000000000000007.partial",
            // Left by the archive_command when the host went down before its rename.
            "000000010000000000000007.tmp",
        ]
        let kept = [
            "000000010000000000000008", "000000010000000000000008.00000028.backup", "000000010000000000000009",
            "00000001000000000000000A", "000000020000000000000009", "00000002000000000000000F",
            "000000020000000000000010", "000000020000000100000000", "00000002000000000000000F.tmp",
        ]
        // Every file written just now (the archive copied back from off-host): their times
        // order nothing.
        try archive(removed + kept)
        // The history of timeline 2, written long before any kept base backup: a restore
        // with recovery_target_timeline=latest reads it.
        try archive(["00000002.history"], modified: "2020-01-01")
        FileManager.default.createFile(atPath: directory + "/wal/notes.txt", contents: Data())

        let result = try prune(keep: 2)
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        let bases = try FileManager.default.contentsOfDirectory(atPath: directory + "/base").sorted()
        XCTAssertEqual(bases, ["20261102T020000Z", "20261103T020000Z"])
        XCTAssertEqual(archived, Set(kept + ["00000002.history", "notes.txt"]), result.stdout)
        for name in removed {
            XCTAssertTrue(result.stdout.contains("backup: removed \(directory)/wal/\(name)\n"), result.stdout)
        }
        // The start segment was read from the label once and kept beside the backup.
        XCTAssertEqual(
            try String(contentsOfFile: directory + "/base/20261102T020000Z/start-wal", encoding: .utf8),
            "000000010000000000000008\n")

        // Keeping one: the WAL up to the newest one's start goes, the history stays.
        let again = try prune(keep: 1)
        XCTAssertEqual(again.status, 0, again.stdout + again.stderr)
        XCTAssertEqual(
            archived, ["000000020000000000000010", "000000020000000100000000", "00000002.history", "notes.txt"],
            again.stdout)
    }

    /// `backup.sh loop` (the compose `backup` service) after a failed base backup tries again
    /// in BACKUP_RETRY seconds, not a whole BACKUP_INTERVAL later: until one succeeds, the
    /// archived WAL has nothing to replay onto. pg_basebackup and sleep are stand-ins on
    /// PATH: the first base backup fails, the second succeeds, the second sleep ends the loop.
    func testALoopTriesAFailedBaseBackupAgainSoon() throws {
        let bin = directory + "/bin"
        try FileManager.default.createDirectory(atPath: bin, withIntermediateDirectories: true)
        let fakes = [
            "pg_basebackup": """
            #!/bin/bash
            set -e
            echo attempt >>"\(directory)/attempts"
            if [ "$(wc -l <"\(directory)/attempts")" = 1 ]; then
              echo "pg_basebackup: error: connection to server failed" >&2
              exit 1
            fi
            for argument in "$@"; do case $argument in --pgdata=*) target=${argument#--pgdata=} ;; esac; done
            mkdir -p "$target" "\(directory)/label"
            printf 'START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\n' >"\(directory)/label/backup_label"
            tar -czf "$target/base.tar.gz" -C "\(directory)/label" backup_label
            tar -czf "$target/pg_wal.tar.gz" -C "\(directory)/label" backup_label
            """,
            "sleep": """
            #!/bin/bash
            echo "$1" >>"\(directory)/sleeps"
            [ "$(wc -l <"\(directory)/sleeps")" -lt 2 ] || kill -TERM "$PPID"
            """,
        ]
        for (name, script) in fakes {
            FileManager.default.createFile(
                atPath: "\(bin)/\(name)", contents: Data((script + "\n").utf8), attributes: [.posixPermissions: 0o755])
        }
        let path = bin + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        let result = try Command.run(
            "/bin/bash", [repositoryRoot() + "/scripts/backup.sh", "loop"],
            environment: Command.environment([
                "BACKUP_DIR": directory, "BACKUP_RETRY": "7", "BACKUP_INTERVAL": "86400", "PATH": path,
            ]))
        XCTAssertEqual(
            try String(contentsOfFile: directory + "/sleeps", encoding: .utf8), "7\n86400\n",
            result.stdout + result.stderr)
        XCTAssertTrue(result.stderr.contains("backup: pg_basebackup failed; the previous base backups are kept\n"))
        XCTAssertTrue(result.stderr.contains("backup: trying again in 7 s (BACKUP_RETRY)\n"), result.stderr)
        XCTAssertTrue(result.stdout.contains("backup: base backup \(directory)/base/"), result.stdout)
    }

    func testAnUnreadableLabelKeepsTheArchivedWAL() throws {
        try FileManager.default.createDirectory(
            atPath: directory + "/base/20261102T020000Z", withIntermediateDirectories: true)
        FileManager.default.createFile(
            atPath: directory + "/base/20261102T020000Z/base.tar.gz", contents: Data("not a tarball".utf8))
        try archive(["000000010000000000000001"], modified: "2020-01-01")
        let result = try prune(keep: 1)
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        XCTAssertTrue(result.stderr.contains("cannot read where"), result.stderr)
        XCTAssertEqual(archived, ["000000010000000000000001"])
    }
}
