import Foundation
import Logging
import Postgres
import Synchronization

/// Devices after a point-in-time restore (migration 0017). A restore, or a failover that lost
/// commits, puts every user's `last_seq` back where it stood at the restore point, while
/// devices may already have pulled events committed after it: new events would reuse those
/// seqs, and a device whose cursor is past the restored end would skip them for good.
///
/// PostgreSQL promotes a restored or failed-over cluster onto a new WAL timeline. The
/// timeline is recorded, and compared (`trunk_sync_seq_timeline`, migration 0018) by
/// `migrate`, which a deployment runs before its servers start, and by every server on each
/// connection it opens, before the connection serves anything: so a failover the servers
/// reconnect through is caught before the first push reaches the new primary. Another
/// timeline moves every user's next seq past anything a device may have seen, and counts
/// the skip in `users.seq_skipped` (`last_seq - seq_skipped` is the number of events
/// stored). A restore that keeps the timeline (a logical dump, a copied data directory) is
/// told with `migrate --after-restore`.
///
/// Where to: the current time in microseconds since 1970, or `gap` past the restored seq if
/// that is further. The clock keeps growing across restores, so a second restore from the
/// same backup (to another point, after devices synced with the first) still lands past
/// what they saw, which a fixed step from the restored seq would not; and it stays below
/// 2^53 (JavaScript's exact integers) until the year 2255.
public enum SeqTimeline {
    /// The migration that brings the check (`trunk_sync_seq_timeline`).
    public static let migration = "0018_seq_timeline_function.sql"

    /// The transaction advisory lock a move holds (migration 0018's `pg_advisory_xact_lock`
    /// argument: "trunkseq").
    public static let advisoryLockKey: Int64 = 0x7472_756e_6b73_6571

    /// The least a user's next seq moves (the function's `1000000000`).
    public static let gap: Int64 = 1_000_000_000

    /// What `check` found.
    public enum Outcome: Sendable, Equatable {
        /// The first run on this database, on its first timeline: recorded, nothing moved.
        case recorded(timeline: Int64)
        /// The same timeline as the last run.
        case unchanged
        /// Another timeline than the last run's, a first run on a timeline after the first
        /// (a database restored from a backup older than migration 0017, or failed over
        /// before it), or `--after-restore`: `users` users' next seq moved.
        case advanced(from: Int64?, to: Int64, users: Int64)
        /// The timeline cannot be read here (PostgreSQL without WAL files of its own, as some
        /// hosted services): nothing recorded, nothing moved.
        case unavailable(reason: String)
        /// Migration 0018 is not applied (a migrations directory of an older release).
        case notMigrated
    }

    /// What `trunk_sync_seq_timeline` (migration 0018) answers, by the owner with `force`, by
    /// the server's role without (`trunk_sync_seq_timeline_check()`).
    static func statement(force: Bool, asServer: Bool) -> PostgresStatement {
        asServer
            ? PostgresStatement(
                "select outcome, previous_timeline, current_timeline, moved_users, reason from trunk_sync_seq_timeline_check()"
            )
            : PostgresStatement(
                "select outcome, previous_timeline, current_timeline, moved_users, reason from trunk_sync_seq_timeline($1)",
                force)
    }

    /// Compares the timeline with the recorded one and moves the seqs when it changed, or
    /// when `force` (an operator's `--after-restore`), on the owner's `connection`
    /// (`trunk-sync migrate`, after the migrations; `import supabase`, before it writes).
    public static func check(on connection: PostgresConnection, force: Bool = false) throws -> Outcome {
        let migrated = try connection.query(
            "select to_regprocedure('trunk_sync_seq_timeline(boolean)') is not null")[0].decode(Bool.self, column: 0)
        guard migrated else { return .notMigrated }
        let statement = statement(force: force, asServer: false)
        // A transaction of its own, for `noTimeouts`: the owner's sessions get the
        // database's settings too, and `migrate` failing on a timeout would keep a
        // deployment that runs it before its servers from coming back after a restore.
        return try connection.transaction { connection in
            try connection.query("select " + noTimeouts)
            return try outcome(try connection.query(statement.sql, binds: statement.binds)[0])
        }
    }

    /// The server's check, on each connection its pools open, before the connection serves
    /// anything (`PostgresLoopPool.Configuration.onOpen`): after a failover the servers
    /// reconnect through, the first connection to the new primary moves the seqs before any
    /// push is numbered there, whether or not `migrate` ran. `.notMigrated` while migration
    /// 0018 is pending (`/readyz` says so).
    ///
    /// A connection to a server in recovery (a standby: a URL without
    /// `target_session_attrs=read-write`, or a name or address moved to it before its
    /// promotion finished) is refused (`PostgresError.refused`): the timeline cannot be read
    /// there, and the connection would outlive the promotion and serve pushes on the new
    /// timeline without this check. Recovery is asked before the check, in the same
    /// pipeline: ended by then, the check reads the new timeline.
    ///
    /// Under `default_transaction_isolation` `repeatable read` or `serializable`, a check that
    /// queued behind another's move read with a snapshot from before it and fails with a
    /// serialization failure (a deadlock likewise ends one of two): it runs again, in a new
    /// implicit transaction whose snapshot has the move, rather than fail the opening.
    public static func check(on connection: PostgresLoopConnection) async throws -> Outcome {
        var retries = 3
        while true {
            do {
                return try await checkOnce(on: connection)
            } catch let error as PostgresError
                where retries > 0 && [.serializationFailure, .deadlockDetected].contains(error.sqlState)
            {
                retries -= 1
            }
        }
    }

    /// The servers' pools' `onOpen`: `check(on:)`, and the outcome logged by `log`.
    public static func serverCheck(logger: Logger) -> @Sendable (PostgresLoopConnection) async throws -> Void {
        let warned = ServerLog()
        return { connection in warned.log(try await check(on: connection), logger: logger) }
    }

    /// What a server logs of its checks: a move, as a warning; a timeline it cannot read, as
    /// a warning the first time (an operator must learn that restores and failovers go
    /// unnoticed there: `migrate --after-restore`), then at debug level (every connection).
    final class ServerLog: Sendable {
        private let warnedUnavailable = Atomic<Bool>(false)

        func log(_ outcome: Outcome, logger: Logger) {
            switch outcome {
            case .advanced(let from, let to, let users):
                logger.warning(
                    "the database is on another WAL timeline: failed over or restored; moved the next seq of every user past anything a device may have seen",
                    metadata: [
                        "timeline": "\(to)", "previous_timeline": "\(from.map(String.init) ?? "none")",
                        "users": "\(users)",
                    ])
            case .unavailable(let reason):
                if !warnedUnavailable.exchange(true, ordering: .relaxed) {
                    logger.warning(
                        "the WAL timeline cannot be read here: a restore or failover goes unnoticed; after one, run trunk-sync migrate --after-restore before the servers",
                        metadata: ["reason": "\(reason)"])
                } else {
                    logger.debug("WAL timeline unavailable", metadata: ["reason": "\(reason)"])
                }
            case .recorded, .unchanged, .notMigrated: break
            }
        }
    }

    private static func checkOnce(on connection: PostgresLoopConnection) async throws -> Outcome {
        let results: [PostgresResult]
        do {
            results = try await connection.pipeline([beforeCheck, statement(force: false, asServer: true)])
        } catch let error as PostgresError where error.sqlState == .undefinedFunction {
            return .notMigrated
        }
        if try results[0][0].decode(Bool.self, column: 2) {
            throw PostgresError.refused(
                "the database is in recovery (a standby, not promoted yet): it takes no writes and its WAL timeline cannot be checked; give the servers the primary (target_session_attrs=read-write)"
            )
        }
        return try outcome(results[1][0])
    }

    /// Run before the check in its transaction (`set_config(…, true)` ends with it): no
    /// `statement_timeout` or `lock_timeout` of the session (set for its login role, its
    /// database, or in the URL's `options`) applies to the check. A move waits for the pushes
    /// and import batches holding users' rows and takes as long as updating every user's row
    /// takes (17–19 s for 500,000 users on 2 cores, durable); cut short, a server's opening fails,
    /// and each next opening would start the move over and be cut short again: no
    /// connection, for good.
    static let noTimeouts = "set_config('statement_timeout', '0', true), set_config('lock_timeout', '0', true)"

    /// Before the server's check, in the same implicit transaction: `noTimeouts`, then
    /// whether the server is in recovery.
    static let beforeCheck = PostgresStatement("select \(noTimeouts), pg_is_in_recovery()")

    private static func outcome(_ row: PostgresRow) throws -> Outcome {
        let previous = try row.decode(Int64?.self, column: 1)
        let current = try row.decode(Int64?.self, column: 2)
        switch try row.decode(String.self, column: 0) {
        case "recorded": return .recorded(timeline: current ?? 0)
        case "unchanged": return .unchanged
        case "advanced":
            return .advanced(from: previous, to: current ?? 0, users: try row.decode(Int64.self, column: 3))
        default: return .unavailable(reason: try row.decode(String?.self, column: 4) ?? "unknown")
        }
    }
}
