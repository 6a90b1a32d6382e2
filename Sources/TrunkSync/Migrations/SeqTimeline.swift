import Foundation
import Postgres

/// Devices after a point-in-time restore (migration 0017). A restore, or a failover that lost
/// commits, puts every user's `last_seq` back where it stood at the restore point, while
/// devices may already have pulled events committed after it: new events would reuse those
/// seqs, and a device whose cursor is past the restored end would skip them for good.
///
/// PostgreSQL promotes a restored or failed-over cluster onto a new WAL timeline. `migrate`
/// (which a deployment runs before its servers start) records the timeline it runs on; when
/// it finds another one, it moves every user's next seq `gap` past the restored one, so that
/// every new event lands after anything a device may have seen, and counts the skip in
/// `users.seq_skipped` (`last_seq - seq_skipped` is the number of events stored). A restore
/// that keeps the timeline (a logical dump, a copied data directory) is told with
/// `migrate --after-restore`.
public enum SeqTimeline {
    /// How far every user's next seq moves: more events than a user can have pushed between
    /// a restore point and the restore. Seqs stay far below 2^53 (JavaScript's exact
    /// integers) for millions of restores.
    public static let gap: Int64 = 1_000_000_000

    /// What `check` found.
    public enum Outcome: Sendable, Equatable {
        /// The first run on this database: its timeline recorded, nothing moved.
        case recorded(timeline: Int64)
        /// The same timeline as the last run.
        case unchanged
        /// Another timeline than the last run's (or `--after-restore`): `users` users' next
        /// seq moved by `gap`.
        case advanced(from: Int64?, to: Int64, users: Int64)
    }

    /// The timeline of the WAL being written now (its file name's first 8 hex digits; any
    /// role may ask, unlike `pg_control_checkpoint()`, and it is the new one as soon as the
    /// cluster is promoted).
    static let currentTimeline =
        "select ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8"

    /// Compares the timeline with the recorded one and moves the seqs when it changed, or
    /// when `force` (an operator's `--after-restore`), in one transaction on the owner's
    /// `connection`.
    /// Without migration 0017 (a migrations directory of an older release) there is nothing
    /// to compare: `.unchanged`.
    public static func check(on connection: PostgresConnection, force: Bool = false) throws -> Outcome {
        let migrated = try connection.query("select to_regclass('wal_timeline') is not null")[0].decode(
            Bool.self, column: 0)
        guard migrated else { return .unchanged }
        return try connection.transaction { connection in
            let current = try connection.query(currentTimeline)[0].decode(Int64.self, column: 0)
            let recorded = try connection.query("select timeline from wal_timeline for update").first.map {
                try $0.decode(Int64.self, column: 0)
            }
            try connection.query(
                """
                insert into wal_timeline (timeline) values ($1)
                on conflict (id) do update set timeline = excluded.timeline, recorded_at = now()
                """, current)
            guard force || (recorded != nil && recorded != current) else {
                return recorded == nil ? .recorded(timeline: current) : .unchanged
            }
            let users = try connection.query(
                """
                with moved as (
                  update users set last_seq = last_seq + $1, seq_skipped = seq_skipped + $1 returning 1
                )
                select count(*) from moved
                """, gap)[0].decode(Int64.self, column: 0)
            return .advanced(from: recorded, to: current, users: users)
        }
    }
}
