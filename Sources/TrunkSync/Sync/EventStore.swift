import Foundation
import Postgres
import Synchronization

/// All SQL of the event log, one place. Every query runs in a transaction that first sets
/// `app.user_id`, as the restricted role, and also filters by user itself: row-level
/// security is the second wall.
public struct EventStore: Sendable {
    /// The notification channel pushes announce themselves on (payload: the user id).
    public static let channel = "trunk_sync_events"

    let pool: PostgresPool
    /// The HTTP loop's own connections, once the server exists (`drive(on:)`): pushes and
    /// pulls then run on the loop that read the request, without a thread hop. Until then,
    /// and for the CLI and in-process tests, the blocking `pool`.
    private let loopPool = LoopPoolSlot()
    /// Users' newest events as far as the notifications tell: empty pulls answered from
    /// memory. Trusted only while `listener` (the `EventNotifier`'s, which feeds it) listens.
    let lastSeqs: LastSeqCache

    /// A store on `pool`; with `listener` (the one its `EventNotifier` follows), pulls known
    /// to be empty are answered without a query.
    public init(pool: PostgresPool, listener: PostgresListener? = nil) {
        self.pool = pool
        lastSeqs = LastSeqCache(session: { listener?.session })
    }

    /// From now on, pushes and pulls use `loopPool` (set once, before requests arrive).
    public func drive(on loopPool: PostgresLoopPool) { self.loopPool.pool.withLock { $0 = loopPool } }

    /// The loop pool in use, if any.
    public var loopDriven: PostgresLoopPool? { loopPool.pool.withLock { $0 } }

    /// What happened to one pushed event.
    public struct PushResult: Sendable, Equatable {
        public var clientID: UUID
        public var created: Bool
        public var seq: Int64
    }

    /// Scopes the transaction to `user` (row-level security reads `app.user_id`).
    static func scope(_ connection: PostgresConnection, to user: UUID) throws {
        let statement = scope(to: user)
        try connection.query(statement.sql, binds: statement.binds)
    }

    /// The statement that scopes the transaction to `user`, for pipelines.
    static func scope(to user: UUID) -> PostgresStatement { RowScope.user(user) }

    /// Stores the events `user` has not pushed before, in one transaction under the user's row
    /// lock, numbering them after the user's last event; repeats (earlier pushes or earlier in
    /// this batch) are reported as duplicates with their existing `seq`. Returns nil when the
    /// user no longer exists.
    ///
    /// Every insert into `events` happens under this lock, so while it is held the user's
    /// stored `client_id`s cannot change. A push first assumes it repeats no earlier push
    /// (the common case) and lets the `(user_id, client_id)` unique index check that while
    /// inserting: three round trips (`begin`, scope and lock; insert, cursor update and
    /// notification; `commit`) and no look-up, whose plan would depend on statistics that
    /// lag behind a growing log. If the index finds an earlier push, the transaction is
    /// rolled back and the push runs again, looking its repeats up first.
    public func push(_ events: [IncomingEvent], for user: UUID) async throws -> [PushResult]? {
        let results = try await store(events, for: user)
        // This instance's next pull of the user asks the database, without waiting for the
        // notification of this commit.
        if results?.contains(where: \.created) == true { lastSeqs.invalidate(user) }
        return results
    }

    private func store(_ events: [IncomingEvent], for user: UUID) async throws -> [PushResult]? {
        // A return without `commit` (unknown user, nothing new, a repeat found) rolls back:
        // nothing was written.
        if let loopPool = loopDriven {
            return try await loopPool.withConnection { connection in
                for lookingUpRepeats in [false, true] {
                    let attempt = try await connection.pipelinedTransaction { connection in
                        try await PushSteps(events: events, user: user, lookingUpRepeats: lookingUpRepeats).run { statements in
                            try await connection.pipeline(statements)
                        }
                    }
                    if let outcome = attempt.outcome { return outcome }
                }
                throw UnexpectedRepeat()
            }
        }
        return try await pool.withConnection { connection in
            for lookingUpRepeats in [false, true] {
                let attempt = try connection.pipelinedTransaction { connection in
                    try PushSteps(events: events, user: user, lookingUpRepeats: lookingUpRepeats).run { statements in
                        try connection.pipeline(statements)
                    }
                }
                if let outcome = attempt.outcome { return outcome }
            }
            // With the look-up under the lock, every repeat is known before the insert.
            throw UnexpectedRepeat()
        }
    }

    /// How one attempt at a push ended.
    enum PushAttempt {
        case unknownUser
        case stored([PushResult])
        /// Without the look-up, an event turned out to repeat an earlier push.
        case repeatsEarlierPush

        /// What `push` returns, or nil to try again with the look-up.
        var outcome: [PushResult]?? {
            switch self {
            case .unknownUser: return .some(nil)
            case .stored(let results): return .some(results)
            case .repeatsEarlierPush: return nil
            }
        }
    }

    /// One attempt at a push as three round trips with decisions between them, the same
    /// statements whichever driver carries them (blocking or loop-driven): `begin`, scope and lock (and the look-up); insert, cursor
    /// update and notification; `commit`.
    struct PushSteps {
        let events: [IncomingEvent]
        let user: UUID
        let lookingUpRepeats: Bool
        var results: [PushResult] = []

        init(events: [IncomingEvent], user: UUID, lookingUpRepeats: Bool) {
            self.events = events
            self.user = user
            self.lookingUpRepeats = lookingUpRepeats
        }

        enum Next {
            case send([PostgresStatement])
            case done(PushAttempt)
        }

        func run(_ pipeline: ([PostgresStatement]) throws -> [PostgresResult]) throws -> PushAttempt {
            var steps = self
            switch try steps.afterHead(try pipeline(steps.head())) {
            case .done(let attempt): return attempt
            case .send(let write):
                guard steps.afterWrite(try pipeline(write)) else { return .repeatsEarlierPush }
                _ = try pipeline([.commit])
                return .stored(steps.results)
            }
        }

        func run(_ pipeline: ([PostgresStatement]) async throws -> [PostgresResult]) async throws -> PushAttempt {
            var steps = self
            switch try steps.afterHead(try await pipeline(steps.head())) {
            case .done(let attempt): return attempt
            case .send(let write):
                guard steps.afterWrite(try await pipeline(write)) else { return .repeatsEarlierPush }
                _ = try await pipeline([.commit])
                return .stored(steps.results)
            }
        }

        func head() -> [PostgresStatement] {
            var head: [PostgresStatement] = [
                .begin,
                scope(to: user),
                // The lock serialises this user's pushes, so seq and created_at follow commit order.
                .prepared(
                    """
                    select last_seq,
                           greatest(date_trunc('milliseconds', clock_timestamp()),
                                    coalesce(last_event_at + interval '1 millisecond', '-infinity'::timestamptz))
                    from users where id = $1 for update
                    """, user),
            ]
            if lookingUpRepeats {
                // Runs after the lock is granted, so it sees every earlier push. Not prepared:
                // planned for this array and this user's statistics each time.
                head.append(
                    PostgresStatement(
                        "select client_id, seq from events where user_id = $1 and client_id = any($2)", user,
                        events.map(\.clientID)))
            }
            return head
        }

        /// After the lock: numbers the new events, and what to write (or the outcome).
        mutating func afterHead(_ replies: [PostgresResult]) throws -> Next {
            guard replies.count > 2, let state = replies[2].first else { return .done(.unknownUser) }
            let lastSeq = try state.decode(Int64.self, column: 0)
            let base = try state.decode(PostgresTimestamp.self, column: 1)

            var existing: [UUID: Int64] = [:]
            if lookingUpRepeats {
                for row in replies[3] {
                    existing[try row.decode(UUID.self, column: 0)] = try row.decode(Int64.self, column: 1)
                }
            }

            results.reserveCapacity(events.count)
            var fresh: [IncomingEvent] = []
            var assigned: [UUID: Int64] = [:]
            assigned.reserveCapacity(events.count)
            for event in events {
                if let seq = existing[event.clientID] ?? assigned[event.clientID] {
                    results.append(PushResult(clientID: event.clientID, created: false, seq: seq))
                } else {
                    let seq = lastSeq + Int64(fresh.count) + 1
                    assigned[event.clientID] = seq
                    fresh.append(event)
                    results.append(PushResult(clientID: event.clientID, created: true, seq: seq))
                }
            }
            guard !fresh.isEmpty else { return .done(.stored(results)) }
            freshCount = fresh.count
            let lastCreated = PostgresTimestamp(
                microsecondsSinceEpoch: base.microsecondsSinceEpoch + Int64(fresh.count - 1) * 1000)
            return .send([
                // `on conflict do nothing` leaves out an event stored by an earlier push (only
                // possible without the look-up); `returning` tells, and the caller then rolls
                // this transaction back, update and notification included.
                .prepared(
                    """
                    insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
                    select $1, $2 + n, t, p, c, ts, $3 + (n - 1) * interval '1 millisecond'
                    from unnest($4::uuid[], $5::text[], $6::jsonb[], $7::timestamptz[]) with ordinality as x(c, t, p, ts, n)
                    on conflict (user_id, client_id) do nothing
                    returning 1
                    """, user, lastSeq, base, fresh.map(\.clientID), fresh.map(\.type), fresh.map(\.payload),
                    fresh.map(\.clientTimestamp)),
                .prepared(
                    "update users set last_seq = $2, last_event_at = $3 where id = $1", user,
                    lastSeq + Int64(fresh.count), lastCreated),
                .prepared("select pg_notify($1, $2)", channel, UUIDText.lowercase(user)),
            ])
        }

        private var freshCount = 0

        /// Whether every new event was written (else one repeats an earlier push).
        func afterWrite(_ written: [PostgresResult]) -> Bool { written.first?.count == freshCount }
    }

    /// One page of a user's events after `cursor`, already encoded as the pull response's
    /// `events` array (or as Server-Sent Events, for the stream).
    public struct Page: Sendable {
        public var eventsJSON: [UInt8]
        public var count: Int
        public var lastSeq: Int64?
        public var hasMore: Bool

        /// No events.
        public static let empty = Page(eventsJSON: Array("[]".utf8), count: 0, lastSeq: nil, hasMore: false)
    }

    /// The user's events with `seq > after`, in `seq` order, at most `limit`. Reads
    /// `limit + 1` rows to know whether more follow; the `(user_id, seq)` index delivers
    /// them in order.
    ///
    /// One round trip of two statements: the scope and the select, pipelined without
    /// `begin`/`commit`, so they share one implicit transaction (everything before the
    /// pipeline's sync) and the scope (`set_config(…, true)`) ends with it. Gap-free: a
    /// user's pushes commit in `seq` order under the user's row lock, so one snapshot never
    /// sees `seq` N + 1 without N.
    ///
    /// A pull this instance knows to be empty (`LastSeqCache`: the user's newest event is at
    /// or before `after`, as of the newest notification) is answered without a query; any
    /// other answer that holds the user's newest event teaches it that.
    public func pull(for user: UUID, after: Int64, limit: Int) async throws -> Page {
        if lastSeqs.isKnownEmpty(user, after: after) { return .empty }
        let ticket = lastSeqs.ticket()
        let page = try await pull(for: user, after: after, limit: limit, framing: .jsonArray)
        if let ticket, !page.hasMore { lastSeqs.record(user, newest: page.lastSeq ?? after, since: ticket) }
        return page
    }

    /// A pull whose events are written with `framing` (the stream's Server-Sent Events).
    /// The stream's reads (`framing: .serverSentEvents`) use the blocking pool: they are not
    /// requests the HTTP server drains before it stops, and a query left waiting on a loop
    /// that has stopped would never finish (nor would closing the loop's pool).
    func pull(for user: UUID, after: Int64, limit: Int, framing: EventPageEncoder.Framing) async throws -> Page {
        let statements = Self.pullStatements(for: user, after: after, limit: limit)
        if framing == .jsonArray, let loopPool = loopDriven {
            return try await loopPool.withConnection { connection in
                try Self.page(try await connection.pipeline(statements)[1], limit: limit, framing: framing)
            }
        }
        return try await pool.withConnection { connection in
            try Self.page(try connection.pipeline(statements)[1], limit: limit, framing: framing)
        }
    }

    /// The pull's scope and select (prepared once per connection: whatever the values, the
    /// `(user_id, seq)` index is the plan).
    static func pullStatements(for user: UUID, after: Int64, limit: Int) -> [PostgresStatement] {
        [
            scope(to: user),
            .prepared(
                """
                select seq, id, type, payload, client_id, client_timestamp, created_at
                from events where user_id = $1 and seq > $2 order by seq limit $3
                """, user, after, Int64(limit + 1)),
        ]
    }

    /// The page from the statement's `limit + 1` rows, encoded.
    private static func page(_ rows: PostgresResult, limit: Int, framing: EventPageEncoder.Framing) throws -> Page {
        let count = min(rows.count, limit)
        let (json, lastSeq) = try EventPageEncoder.encode(rows, count: count, framing: framing)
        return Page(eventsJSON: json, count: count, lastSeq: lastSeq, hasMore: rows.count > limit)
    }
}

/// Where `EventStore` keeps its loop pool: set once when the server starts, shared by every
/// copy of the store.
final class LoopPoolSlot: Sendable {
    let pool = Mutex<PostgresLoopPool?>(nil)
}

/// An insert skipped an event the look-up under the user's lock did not find (never expected:
/// every insert into `events` takes that lock).
struct UnexpectedRepeat: Error {}

/// A `jsonb` value in a format this server does not know (never expected from PostgreSQL 15).
struct UnexpectedJSONB: Error {}
