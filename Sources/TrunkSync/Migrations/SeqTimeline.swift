import Foundation
import Postgres

/// Devices after a point-in-time restore (migration 0017). A restore, or a failover that lost
/// commits, puts every user's `last_seq` back where it stood at the restore point, while
/// devices may already have pulled events committed after it: new events would reuse those
/// seqs, and a device whose cursor is past the restored end would skip them for good.
///
/// PostgreSQL promotes a restored or failed-over cluster onto a new WAL timeline. `migrate`
/// (which a deployment runs before its servers start) records the timeline it runs on; when
/// it finds another one, it moves every user's next seq past anything a device may have
/// seen, and counts the skip in `users.seq_skipped` (`last_seq - seq_skipped` is the number
/// of events stored). A restore that keeps the timeline (a logical dump, a copied data
/// directory) is told with `migrate --after-restore`.
///
/// Where to: the current time in microseconds since 1970, or `gap` past the restored seq if
/// that is further. The clock keeps growing across restores, so a second restore from the
/// same backup (to another point, after devices synced with the first) still lands past
/// what they saw, which a fixed step from the restored seq would not; and it stays below
/// 2^53 (JavaScript's exact integers) until the year 2255.
public enum SeqTimeline {
    /// The least a user's next seq moves.
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
        /// Migration 0017 is not applied (a migrations directory of an older release).
        case notMigrated
    }

    /// The timeline of the WAL being written now (its file name's first 8 hex digits; any
    /// role may ask, unlike `pg_control_checkpoint()`, and it is the new one as soon as the
    /// cluster is promoted).
    static let currentTimeline =
        "select ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8"

    /// Compares the timeline with the recorded one and moves the seqs when it changed, or
    /// when `force` (an operator's `--after-restore`), in one transaction on the owner's
    /// `connection`.
    public static func check(on connection: PostgresConnection, force: Bool = false) throws -> Outcome {
        let migrated = try connection.query("select to_regclass('wal_timeline') is not null")[0].decode(
            Bool.self, column: 0)
        guard migrated else { return .notMigrated }
        let current: Int64
        do {
            current = try connection.query(currentTimeline)[0].decode(Int64.self, column: 0)
        } catch let error as PostgresError {
            let reason = error.serverMessage ?? error.description
            // Told of a restore, the seqs move all the same; nothing can be recorded.
            guard force else { return .unavailable(reason: reason) }
            return .advanced(from: nil, to: 0, users: try connection.transaction { try move(on: $0) })
        }
        return try connection.transaction { connection in
            let recorded = try connection.query("select timeline from wal_timeline for update").first.map {
                try $0.decode(Int64.self, column: 0)
            }
            try connection.query(
                """
                insert into wal_timeline (timeline) values ($1)
                on conflict (id) do update set timeline = excluded.timeline, recorded_at = now()
                """, current)
            guard shouldMove(recorded: recorded, current: current, force: force) else {
                return recorded == nil ? .recorded(timeline: current) : .unchanged
            }
            return .advanced(from: recorded, to: current, users: try move(on: connection))
        }
    }

    /// Whether the seqs move: told so; on another timeline than the one recorded; or, with
    /// none recorded yet (the first run with migration 0017), on a timeline after the first —
    /// the database was restored or failed over at some point, maybe from a backup taken
    /// before 0017 (a needless move is harmless: one step, once).
    public static func shouldMove(recorded: Int64?, current: Int64, force: Bool) -> Bool {
        if force { return true }
        guard let recorded else { return current > 1 }
        return recorded != current
    }

    /// Moves every user's next seq; returns how many users.
    private static func move(on connection: PostgresConnection) throws -> Int64 {
        // `now()` is the transaction's start: the same in both expressions, so
        // `seq_skipped` grows by exactly the step (from the row as a push left it).
        try connection.query(
            """
            with moved as (
              update users set
                last_seq = greatest(last_seq + $1, (extract(epoch from now()) * 1000000)::int8),
                seq_skipped = seq_skipped + greatest($1, (extract(epoch from now()) * 1000000)::int8 - last_seq)
              returning 1
            )
            select count(*) from moved
            """, gap)[0].decode(Int64.self, column: 0)
    }
}
