import Foundation
import TestSupport
import XCTest

/// `make drill` as part of `make test`: scripts/drill-restore.sh takes base backups with the
/// compose backup service's script (retention included: by segment name from the kept
/// backup's start segment; BackupRetentionTests has the cases), restores to a time T between two
/// batches of acknowledged pushes and a `delete from events` (with `backup.sh restore`, which
/// refuses a time before the base backup ended), and checks that exactly the
/// events acknowledged before T are back and pulled by the client (its own clusters and
/// the real binary; about ten seconds).
final class RestoreDrillTests: XCTestCase {
    func testPointInTimeRestoreDrill() throws {
        let result = try Command.run(
            "/bin/bash", [repositoryRoot() + "/scripts/drill-restore.sh"],
            environment: Command.environment(["TRUNK_SYNC_BIN": Command.trunkSyncBinary()]))
        let output = result.stdout + result.stderr
        XCTAssertEqual(result.status, 0, output)
        for step in [
            "drill: ok base backup", "(the older one and its WAL removed by retention, from 0000000",
            "drill: ok a restore to before the base backup is refused: backup: restore: no base backup had ended by",
            "drill: ok exactly the 20 events acknowledged before T are restored",
            "drill: ok the server starts on the restored cluster and the client pulls the 20 events", "drill: passed",
        ] {
            XCTAssertTrue(output.contains(step), "\(step) in \(output)")
        }
    }
}
