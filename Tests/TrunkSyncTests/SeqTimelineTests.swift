import Foundation
import Logging
import Postgres
import Synchronization
import TestSupport
import XCTest

@testable import TrunkSync

/// The WAL timeline check as servers run it (migration 0018): on every connection a pool
/// opens, before the connection serves anything.
final class SeqTimelineTests: XCTestCase {
    final class Finished: Sendable { let value = Mutex(false) }

    func push(_ app: AppHarness, token: String) async throws -> Int {
        let pushed = try await app.request(
            "POST", "/sync/v1/events", json: ["events": [SyncTests.event()]], bearer: token)
        XCTAssertEqual(pushed.status, 200, pushed.text)
        let results = try XCTUnwrap(pushed.json["results"] as? [[String: Any]])
        return try XCTUnwrap(results.first?["seq"] as? Int)
    }

    func movedLines(_ app: AppHarness) -> [String] {
        app.logs.lines.filter { $0.contains("another WAL timeline") }
    }

    /// A failover the servers reconnect through, with no `migrate` in between (simulated by
    /// the recorded timeline differing): the first connection a server opens to the "new
    /// primary" moves every user's next seq past anything a device may have seen, before it
    /// numbers a push, so a device whose cursor is past the restored end still pulls the
    /// new event; the servers after it find the timeline recorded and move nothing.
    func testAServersNewConnectionMovesTheSeqsOnAnotherTimeline() async throws {
        let first = try await AppHarness()
        let token = try await first.token("device@example.com")
        let seq1 = try await push(first, token: token)
        let seq2 = try await push(first, token: token)
        XCTAssertEqual([seq1, seq2], [1, 2])
        let owner = try first.owner()
        let recorded = try owner.query("select timeline from wal_timeline")[0].decode(Int64.self, column: 0)
        XCTAssertTrue(movedLines(first).isEmpty, "the recorded timeline moves nothing")
        // The failover: devices had pulled past seq 2 (say to 5) on the old primary.
        try owner.query("update wal_timeline set timeline = timeline + 1")

        let second = try await AppHarness(sharing: first)
        let seq = try await push(second, token: token)
        XCTAssertGreaterThanOrEqual(seq, 2 + Int(SeqTimeline.gap))
        let pulled = try await second.request("GET", "/sync/v1/events?after=5", bearer: token)
        XCTAssertEqual((pulled.json["events"] as? [[String: Any]])?.compactMap { $0["seq"] as? Int }, [seq])
        XCTAssertEqual(movedLines(second).count, 1, second.logs.lines.joined(separator: "\n"))
        XCTAssertTrue(movedLines(second)[0].contains("users=1"), movedLines(second)[0])
        XCTAssertEqual(
            try owner.query("select timeline from wal_timeline")[0].decode(Int64.self, column: 0), recorded,
            "the timeline now is recorded")
        XCTAssertEqual(
            try owner.query("select last_seq - seq_skipped from users")[0].decode(Int64.self, column: 0), 3,
            "the events stored are still counted")

        let third = try await AppHarness(sharing: first)
        let next = try await push(third, token: token)
        XCTAssertEqual(next, seq + 1, "moved once")
        XCTAssertTrue(movedLines(third).isEmpty)
        for app in [third, second, first] { await app.stop() }
    }

    /// The server's role runs the check but cannot force a move (`migrate --after-restore`
    /// is the owner's), and reads nothing of `wal_timeline` itself.
    func testTheServersRoleCannotForceAMove() throws {
        let (database, owner) = try migratedDatabase(prefix: "timeline")
        defer { try? TestDatabase.drop(database) }
        try owner.execute("set role trunk_sync_app")
        XCTAssertEqual(
            try owner.query("select outcome from trunk_sync_seq_timeline_check()")[0].decode(String.self, column: 0),
            "recorded")
        XCTAssertEqual(
            try owner.query("select outcome from trunk_sync_seq_timeline_check()")[0].decode(String.self, column: 0),
            "unchanged")
        for sql in ["select * from trunk_sync_seq_timeline(true)", "select * from wal_timeline"] {
            XCTAssertThrowsError(try owner.query(sql), sql) {
                XCTAssertEqual(($0 as? PostgresError)?.sqlState, .insufficientPrivilege, "\($0)")
            }
        }
    }

    /// A pool opening connections as a server's does (the role, `setting`, the check).
    func serverPool(
        _ database: PostgresConfiguration, on loop: PostgresLoopThread, settings: [(name: String, value: String)] = []
    ) -> PostgresLoopPool {
        var configuration = PostgresLoopPool.Configuration()
        configuration.maxConnections = 1
        configuration.sessionSettings = [("role", Application.databaseRole)] + settings
        configuration.onOpen = { _ = try await SeqTimeline.check(on: $0) }
        return PostgresLoopPool(database, configuration: configuration, loop: loop, logger: TestDatabase.quietLogger)
    }

    /// A migrated database with one user (`last_seq` 7) and the timeline recorded, its owner,
    /// and a loop for `serverPool`.
    func databaseWithAUser() throws -> (PostgresConfiguration, PostgresConnection, PostgresLoopThread) {
        let (database, owner) = try migratedDatabase(prefix: "timeline")
        try owner.execute("insert into users (email, last_seq) values ('device@example.com', 7)")
        _ = try owner.query("select * from trunk_sync_seq_timeline(false)")
        return (database, owner, try PostgresLoopThread(name: "pg-loop-timeline"))
    }

    /// The move waits for users' rows a push or an import batch holds, however long: a
    /// `lock_timeout` or `statement_timeout` of the server's sessions (its role's, its
    /// database's, its URL's `options`) would fail the opening, and every next opening would
    /// start the move over and fail the same way, leaving the server without connections.
    func testTheMoveOutlastsTheSessionsTimeouts() async throws {
        let (database, owner, loop) = try databaseWithAUser()
        defer { try? TestDatabase.drop(database) }
        for setting in ["lock_timeout", "statement_timeout"] {
            // A failover: the timeline recorded is not the one now.
            try owner.execute("update wal_timeline set timeline = timeline + 1")
            let before = try owner.query("select last_seq from users")[0].decode(Int64.self, column: 0)
            // A push in flight holds the user's row.
            let push = try PostgresConnection.connect(database)
            try push.execute("begin")
            try push.query("select 1 from users for update")
            let pool = serverPool(database, on: loop, settings: [(setting, "1ms")])
            let finished = Finished()
            let opened = Task {
                defer { finished.value.withLock { $0 = true } }
                try await pool.withConnection { _ in }
            }
            // Until the check has waited for the push's lock far past the timeout (or the
            // opening failed).
            nonisolated(unsafe) let watcher = owner
            _ = try await waitUntil(20) {
                try finished.value.withLock { $0 }
                    || watcher.query(
                        """
                        select count(*) from pg_stat_activity
                        where wait_event_type = 'Lock' and query like '%trunk_sync_seq_timeline_check%'
                          and clock_timestamp() - query_start > interval '100 milliseconds'
                        """)[0].decode(Int64.self, column: 0) > 0
            }
            try push.execute("commit")
            do {
                try await opened.value
            } catch {
                XCTFail("\(setting): the opening failed: \(String(reflecting: error))")
            }
            XCTAssertGreaterThanOrEqual(
                try owner.query("select last_seq from users")[0].decode(Int64.self, column: 0),
                before + SeqTimeline.gap, "\(setting): moved")
            await pool.close()
        }
        await loop.close()
    }

    /// With `default_transaction_isolation` at `repeatable read` or `serializable` (for the
    /// database, or the server's role), the openings that queued behind another's move read
    /// the timeline with a snapshot from before it and fail with a serialization failure;
    /// the check runs again (a new snapshot, which has the move) instead of failing the
    /// opening and the request waiting for it.
    func testOpeningsQueuedBehindAMoveUnderRepeatableReadFindItDone() async throws {
        let (database, owner, loop) = try databaseWithAUser()
        defer { try? TestDatabase.drop(database) }
        try owner.execute("update wal_timeline set timeline = timeline + 1")  // a failover
        // The openings queue on the move's advisory lock.
        let holder = try PostgresConnection.connect(database)
        try holder.execute("begin")
        try holder.query("select pg_advisory_xact_lock($1)", SeqTimeline.advisoryLockKey)
        let pools = (0..<3).map { _ in
            serverPool(database, on: loop, settings: [("default_transaction_isolation", "repeatable read")])
        }
        let openings = pools.map { pool in Task { try await pool.withConnection { _ in } } }
        nonisolated(unsafe) let watcher = owner
        let queued = try await waitUntil(20) {
            try watcher.query("select count(*) from pg_stat_activity where wait_event = 'advisory'")[0].decode(
                Int64.self, column: 0) == 3
        }
        XCTAssertTrue(queued, "the three openings never queued")
        try holder.execute("commit")
        for opening in openings {
            do {
                try await opening.value
            } catch {
                XCTFail("an opening failed: \(String(reflecting: error))")
            }
        }
        let row = try owner.query(
            "select last_seq, (extract(epoch from clock_timestamp()) * 1000000)::int8 from users")[0]
        let (lastSeq, now) = (try row.decode(Int64.self, column: 0), try row.decode(Int64.self, column: 1))
        XCTAssertGreaterThanOrEqual(lastSeq, 7 + SeqTimeline.gap, "moved")
        XCTAssertLessThan(lastSeq, now, "moved once (a second move would be a step past the clock)")
        for pool in pools { await pool.close() }
        await loop.close()
    }

    /// A connection that reaches a standby (a URL without `target_session_attrs=read-write`,
    /// or a name or address moved to it before its promotion finished) cannot check the
    /// timeline there; kept in the pool, it would survive the promotion and number pushes on
    /// the new timeline without the move. It is refused until the standby is promoted; the
    /// first connection after that moves the seqs.
    func testAConnectionToAStandbyIsRefusedAndTheFirstAfterThePromotionMoves() async throws {
        let work = NSTemporaryDirectory() + "standby-" + UUID().uuidString
        let (primary, standby) = (work + "/primary", work + "/standby")
        let script = repositoryRoot() + "/scripts/pg.sh"
        defer {
            for cluster in [standby, primary] { _ = try? Command.spawnAndWait(script, ["stop", cluster]) }
            try? FileManager.default.removeItem(atPath: work)
        }
        XCTAssertEqual(try Command.spawnAndWait(script, ["start", primary, String(try serverPort())]), 0)
        let primaryURL = try Command.run(script, ["url", primary, "postgres"]).stdout
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let password = try String(contentsOfFile: primary + "/password", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let admin = try PostgresConnection.connect(try PostgresConfiguration(primaryURL))
        try admin.execute("create database timeline")
        let database = try PostgresConfiguration(primaryURL).withDatabase("timeline")
        let owner = try PostgresConnection.connect(database)
        _ = try Migrator(
            migrations: try Migration.load(from: repositoryRoot() + "/migrations"), logger: TestDatabase.quietLogger
        ).migrate(on: owner)
        XCTAssertEqual(try SeqTimeline.check(on: owner), .recorded(timeline: 1))
        try owner.execute("insert into users (email, last_seq) values ('device@example.com', 7)")

        // The standby: a base backup of the primary, streaming from it (as the tests run:
        // as root, the cluster's files belong to `postgres`).
        try FileManager.default.createDirectory(atPath: standby + "/pgdata", withIntermediateDirectories: true)
        try password.write(toFile: standby + "/password", atomically: true, encoding: .utf8)
        let port = try XCTUnwrap(database["port"])
        try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: standby + "/pgdata")
        let root = getuid() == 0
        if root { _ = try Command.run("/usr/bin/chown", ["-R", "postgres", standby]) }
        let backup = try Command.run(
            root ? "/usr/sbin/runuser" : "/usr/bin/env",
            (root ? ["-u", "postgres", "--"] : [])
                + [
                    postgresBinary("pg_basebackup"), "-D", standby + "/pgdata", "-X", "stream", "-c", "fast", "-R",
                    "-d", "host=127.0.0.1 port=\(port) user=trunk password=\(password)",
                ])
        XCTAssertEqual(backup.status, 0, backup.stderr)
        XCTAssertEqual(try Command.spawnAndWait(script, ["start", standby, String(try serverPort())]), 0)
        let standbyURL = try Command.run(script, ["url", standby, "timeline"]).stdout
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let standbyDatabase = try PostgresConfiguration(standbyURL)
        let standbyOwner = try PostgresConnection.connect(standbyDatabase)
        XCTAssertTrue(try standbyOwner.query("select pg_is_in_recovery()")[0].decode(Bool.self, column: 0))

        let loop = try PostgresLoopThread(name: "pg-loop-standby")
        let pool = serverPool(standbyDatabase, on: loop)
        do {
            try await pool.withConnection { _ in }
            XCTFail("a connection to a standby must be refused")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .connectionFailed, String(reflecting: error))
        }

        // The failover.
        XCTAssertTrue(try standbyOwner.query("select pg_promote()")[0].decode(Bool.self, column: 0))
        try await pool.withConnection { _ in }
        XCTAssertEqual(
            try standbyOwner.query("select timeline from wal_timeline")[0].decode(Int64.self, column: 0), 2,
            "the promoted standby's timeline is recorded")
        XCTAssertGreaterThanOrEqual(
            try standbyOwner.query("select last_seq from users")[0].decode(Int64.self, column: 0),
            7 + SeqTimeline.gap, "moved before the connection served")
        await pool.close()
        await loop.close()
    }

    /// A PostgreSQL program of the newest version installed (as scripts/pg.sh finds them).
    func postgresBinary(_ name: String) throws -> String {
        let versions = try FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")
            .compactMap(Int.init).sorted()
        guard let newest = versions.last else { throw TestEnvironmentError("no /usr/lib/postgresql/N") }
        return "/usr/lib/postgresql/\(newest)/bin/\(name)"
    }

    /// A timeline the server cannot read (a hosted PostgreSQL without WAL functions) is a
    /// warning once per process, so the operator learns restores go unnoticed there, then
    /// debug (it is said on every connection); a move is a warning each time.
    func testAnUnreadableTimelineIsAWarningOnce() {
        let lines = LogLines()
        let logger = Logger(label: "test", factory: { _ in CapturingLogHandler(lines: lines) })
        let log = SeqTimeline.ServerLog()
        log.log(.unavailable(reason: "no WAL here"), logger: logger)
        log.log(.unavailable(reason: "no WAL here"), logger: logger)
        log.log(.unchanged, logger: logger)
        log.log(.advanced(from: 1, to: 2, users: 3), logger: logger)
        XCTAssertEqual(
            lines.lines.map { $0.split(separator: " ").first.map(String.init) ?? "" }, ["warning", "debug", "warning"])
        XCTAssertTrue(
            lines.lines[0].contains("migrate --after-restore") && lines.lines[0].contains("no WAL here"), lines.lines[0]
        )
        XCTAssertTrue(lines.lines[2].contains("users=3"), lines.lines[2])
    }
}
