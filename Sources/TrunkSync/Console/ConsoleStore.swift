import Foundation
import JSON
import Postgres

/// The console's SQL, all of it: the overview's counts, the user list, one user, their
/// sessions and their events.
///
/// Reads across users run with `Scope.console` (the operator's token hash), which
/// migration 0008's policies honour only while that console session is live; reads and
/// changes of one user run scoped to that user (`Scope.user`), as the app's own do.
struct ConsoleStore: Sendable {
    let database: Database

    /// A transaction that may read every user's rows while `signedIn`'s session is live.
    private func acrossUsers<T: Sendable>(
        _ signedIn: ConsoleAuth.Operator, _ body: (Transaction) async throws -> T
    ) async throws -> T {
        try await database.transaction(as: .console(tokenHash: signedIn.tokenHash), body)
    }

    /// Users, and events stored in the last 24 hours (counted per user who pushed in that
    /// time, through the `(user_id, created_at)` index: no scan of the whole log).
    func counts(_ signedIn: ConsoleAuth.Operator) async throws -> (users: Int64, eventsLastDay: Int64) {
        try await acrossUsers(signedIn) { tx in
            let row = try await tx.query(
                """
                select (select count(*) from users),
                       coalesce((select sum((select count(*) from events e
                                             where e.user_id = u.id and e.created_at > now() - interval '24 hours'))
                                 from users u where u.last_event_at > now() - interval '24 hours'), 0)::int8
                """)[0]
            return (try row.decode(Int64.self, column: 0), try row.decode(Int64.self, column: 1))
        }
    }

    /// Events stored on each of the last 30 days (UTC; today so far last), oldest first, days
    /// without events included as zeros. Counted per user who pushed in that time, through the
    /// `(user_id, created_at)` index, like `counts`: no scan of the whole log, and no second
    /// index for pushes to maintain. The per-user `group by` inside the lateral keeps the
    /// planner from flattening it into a hash join over a sequential scan of `events` (which it
    /// chose, measured on 356k events, when the subquery was a plain select).
    func eventsPerDay(_ signedIn: ConsoleAuth.Operator) async throws -> [(day: String, events: Int64)] {
        try await acrossUsers(signedIn) { tx in
            let rows = try await tx.query(
                """
                with since as (select (date_trunc('day', now() at time zone 'UTC') - interval '29 days') at time zone 'UTC' as t)
                select d.day::date::text, coalesce(n.events, 0)::int8
                from generate_series(date_trunc('day', now() at time zone 'UTC') - interval '29 days',
                                     date_trunc('day', now() at time zone 'UTC'), interval '1 day') as d(day)
                left join (select e.day, sum(e.events) as events
                           from users u, since
                           cross join lateral (select (created_at at time zone 'UTC')::date as day, count(*) as events
                                               from events e where e.user_id = u.id and e.created_at >= since.t
                                               group by 1) e
                           where u.last_event_at >= since.t
                           group by 1) n on n.day = d.day::date
                order by d.day
                """)
            return try rows.map { (try $0.decode(String.self, column: 0), try $0.decode(Int64.self, column: 1)) }
        }
    }

    /// One user as the console lists them.
    struct UserRow: Sendable {
        var id: UUID
        var email: String
        var fullName: String?
        var createdAt: PostgresTimestamp
        var lastSignInAt: PostgresTimestamp?
        var events: Int64
        var activeSessions: Int64
        var lastEventAt: PostgresTimestamp?

        static let columns = """
            u.id, u.email, u.full_name, u.created_at, u.last_sign_in_at, u.last_seq - u.seq_skipped,
            (select count(*) from sessions s where s.user_id = u.id and s.revoked_at is null), u.last_event_at
            """

        init(_ row: PostgresRow) throws {
            id = try row.decode(UUID.self, column: 0)
            email = try row.decode(String.self, column: 1)
            fullName = try row.decode(String?.self, column: 2)
            createdAt = try row.decode(PostgresTimestamp.self, column: 3)
            lastSignInAt = try row.decode(PostgresTimestamp?.self, column: 4)
            events = try row.decode(Int64.self, column: 5)
            activeSessions = try row.decode(Int64.self, column: 6)
            lastEventAt = try row.decode(PostgresTimestamp?.self, column: 7)
        }

        /// The summary the CLI's tools (`UserAdmin`) take.
        var summary: UserAdmin.Summary {
            UserAdmin.Summary(
                id: id, email: email, fullName: fullName, createdAt: createdAt, lastSignInAt: lastSignInAt,
                events: events, activeSessions: activeSessions)
        }
    }

    /// Users whose address contains `search` (case-insensitive; nil: all), newest first, and
    /// how many match.
    func users(_ signedIn: ConsoleAuth.Operator, search: String?, limit: Int, offset: Int) async throws
        -> (total: Int64, users: [UserRow])
    {
        try await acrossUsers(signedIn) { tx in
            // strpos, not like: the search is text, never a pattern.
            let filter = "($1::text is null or strpos(u.email, lower($1)) > 0)"
            let total = try await tx.query("select count(*) from users u where \(filter)", search)[0]
                .decode(Int64.self, column: 0)
            let rows = try await tx.query(
                """
                select \(UserRow.columns) from users u where \(filter)
                order by u.created_at desc, u.id desc limit $2 offset $3
                """, search, Int64(limit), Int64(offset)
            ).map(UserRow.init)
            return (total, rows)
        }
    }

    /// One user, with their user metadata and the event types they used (at most 100).
    func user(_ id: UUID) async throws -> (UserRow, metadata: [UInt8], types: [String])? {
        try await database.transaction(as: .user(id)) { tx in
            guard
                let row = try await tx.query(
                    "select \(UserRow.columns), u.user_metadata from users u where u.id = $1", id
                ).first
            else { return nil }
            let types = try await tx.query(
                "select distinct type from events where user_id = $1 order by type limit 100", id
            ).map { try $0.decode(String.self, column: 0) }
            return (try UserRow(row), try row.decode(PostgresJSON.self, column: 8).bytes, types)
        }
    }

    /// One session of a user.
    struct SessionRow: Sendable {
        var id: UUID
        var createdAt: PostgresTimestamp
        var refreshedAt: PostgresTimestamp?
        var revokedAt: PostgresTimestamp?
        var accessExpiresAt: PostgresTimestamp?
        var ip: String?
        var userAgent: String?
    }

    /// The user's sessions, newest first: the live ones, and those ended in the last 7 days
    /// (at most 200 in all).
    func sessions(of user: UUID) async throws -> [SessionRow] {
        try await database.transaction(as: .user(user)) { tx in
            return try await tx.query(
                """
                select id, created_at, refreshed_at, revoked_at, access_expires_at, ip, user_agent from sessions
                where user_id = $1 and (revoked_at is null or revoked_at > now() - interval '7 days')
                order by revoked_at is not null, created_at desc limit 200
                """, user
            ).map { row in
                SessionRow(
                    id: try row.decode(UUID.self, column: 0),
                    createdAt: try row.decode(PostgresTimestamp.self, column: 1),
                    refreshedAt: try row.decode(PostgresTimestamp?.self, column: 2),
                    revokedAt: try row.decode(PostgresTimestamp?.self, column: 3),
                    accessExpiresAt: try row.decode(PostgresTimestamp?.self, column: 4),
                    ip: try row.decode(String?.self, column: 5), userAgent: try row.decode(String?.self, column: 6))
            }
        }
    }

    /// The ids of the user's live sessions.
    func liveSessions(of user: UUID) async throws -> [UUID] {
        try await database.transaction(as: .user(user)) { tx in
            return try await tx.query("select id from sessions where user_id = $1 and revoked_at is null", user)
                .map { try $0.decode(UUID.self, column: 0) }
        }
    }

    /// What a page of events is filtered by.
    struct EventFilter: Sendable {
        /// Only events with `seq` below this (the cursor of the page before); nil: the newest.
        var before: Int64?
        var type: String?
        /// Stored at or after.
        var from: PostgresTimestamp?
        /// Stored before.
        var to: PostgresTimestamp?
    }

    /// The user's events matching `filter`, newest first (`seq` descending), at most
    /// `limit`: the page as the pull API writes events, how many, the `seq` of its last
    /// event and whether more follow.
    func events(of user: UUID, _ filter: EventFilter, limit: Int) async throws -> EventStore.Page {
        try await database.transaction(as: .user(user)) { tx in
            let rows = try await tx.query(
                """
                select \(EventRecord.selectList) from events
                where user_id = $1 and ($2::int8 is null or seq < $2) and ($3::text is null or type = $3)
                  and ($4::timestamptz is null or created_at >= $4) and ($5::timestamptz is null or created_at < $5)
                order by seq desc limit $6
                """, user, filter.before, filter.type, filter.from, filter.to, Int64(limit + 1))
            let count = min(rows.count, limit)
            let (json, lastSeq, _) = try EventPageEncoder.encode(rows, count: count)
            return EventStore.Page(eventsJSON: json, count: count, lastSeq: lastSeq, hasMore: rows.count > limit)
        }
    }
}
