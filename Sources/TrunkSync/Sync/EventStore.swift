import Foundation
import Postgres

/// All SQL of the event log, one place. Every query runs scoped to the user (`Scope.user`:
/// `app.user_id`), as the restricted role, and also filters by user itself: row-level
/// security is the second wall.
public struct EventStore: Sendable {
    /// The notification channel pushes announce themselves on (payload: the user id).
    public static let channel = "trunk_sync_events"

    /// Pushes and pulls run on the pool of the loop that read the request (no thread hop);
    /// the stream's reads on the database's own loop (`Database.offHTTPLoops`).
    let database: Database
    /// Users' newest events as far as the notifications tell: empty pulls answered from
    /// memory. Trusted only while `listener` (the `EventNotifier`'s, which feeds it) listens.
    let lastSeqs: LastSeqCache

    /// A store in `database`; with `listener` (the one its `EventNotifier` follows), pulls
    /// known to be empty are answered without a query.
    public init(database: Database, listener: PostgresListener? = nil) {
        self.database = database
        lastSeqs = LastSeqCache(session: { listener?.session })
    }

    /// What happened to one pushed event.
    public struct PushResult: Sendable, Equatable {
        public var clientID: UUID
        public var created: Bool
        public var seq: Int64
    }

    /// Stores the events `user` has not pushed before, in one transaction under the user's row
    /// lock, numbering them after the user's last event; repeats (earlier pushes or earlier in
    /// this batch) are reported as duplicates with their existing `seq`. Returns nil when the
    /// user no longer exists.
    ///
    /// Every insert into `events` happens under this lock, so while it is held the user's
    /// stored `client_id`s cannot change. A push first assumes it repeats no earlier push
    /// (the common case): one round trip whose one statement moves the user's cursor (taking
    /// the lock) and inserts, the `(user_id, client_id)` unique index checking for repeats
    /// while inserting, and no look-up, whose plan would depend on statistics that lag behind
    /// a growing log. If the index finds an earlier push, the transaction is rolled back and
    /// the push runs again, looking its repeats up under the lock first.
    ///
    /// The notification goes out right after the commit, in the same round trip but its own
    /// transaction: a `NOTIFY` inside the transaction would hold PostgreSQL's notification
    /// lock through the commit's WAL flush and so serialise every push's commit (no group
    /// commit). A failure between the two must not hide committed events:
    /// - the commit is known and only the notification failed: the notification is sent
    ///   again on another connection, and the push answers its results;
    /// - the connection was lost after `commit` was sent, outcome unknown: the push runs
    ///   again in a transaction of its own on another connection (pushes are idempotent; its
    ///   look-up waits on the user's row lock for the lost transaction to end), which stores
    ///   or finds the events and announces them; if that fails too, `503
    ///   database_unavailable`, which the client retries;
    /// - a push whose events were all stored before (such a retry) still commits and
    ///   announces them, and clears this instance's empty-pull cache.
    public func push(_ events: [IncomingEvent], for user: UUID) async throws -> [PushResult]? {
        var outcome: PushOutcome?
        do {
            outcome = try await store(events, for: user, lookingUpRepeats: [false, true])
        } catch is CommitOutcomeUnknown {
            // Pushes are idempotent: the same push again, on another connection, settles it.
            // Its look-up waits for the user's row lock, so for the lost transaction to end;
            // then the events are stored (by it or by this) and announced. It fails only if
            // the database is unreachable or loses this connection too.
            lastSeqs.invalidate(user)
            do {
                outcome = try await store(events, for: user, lookingUpRepeats: [true])
            } catch is CommitOutcomeUnknown {
                throw APIError.databaseUnavailable
            }
        }
        guard let outcome else { return nil }
        // This instance's next pull of the user asks the database, without waiting for the
        // notification of this commit (or of the events a retry found already stored).
        lastSeqs.invalidate(user)
        if !outcome.announced { await announce(user) }
        return outcome.results
    }

    /// Tells every instance that `user`'s rows changed, outside any transaction (the
    /// statement's own, implicit: one round trip): after a push whose own notification was
    /// lost, or a profile update (which Realtime subscribers follow). A failure is left to
    /// the listeners' reconnect, which wakes everything.
    func announce(_ user: UUID) async {
        _ = try? await database.read(as: .server) { tx in
            try await tx.query("select pg_notify($1, $2)", Self.channel, UUIDText.lowercase(user))
        }
    }

    /// What a push stored, and whether its notification went out with it.
    struct PushOutcome {
        var results: [PushResult]
        var announced = true
    }

    /// Stores the push in one transaction scoped to the user, with the attempts
    /// `lookingUpRepeats` lists (each rolled back unless it committed). PostgreSQL's plan
    /// choice stands (`Plans.chosenByPostgres`): the look-up must be planned for its values,
    /// and a generic plan for the first attempt's statement saved nothing measurable (its
    /// `Bind` is the 100 `jsonb` parameters' parsing, not planning; bench/README.md).
    private func store(_ events: [IncomingEvent], for user: UUID, lookingUpRepeats attempts: [Bool]) async throws
        -> PushOutcome?
    {
        try await database.transaction(as: .user(user)) { tx in
            for lookingUpRepeats in attempts {
                let attempt = try await PushSteps(events: events, user: user, lookingUpRepeats: lookingUpRepeats).run {
                    statements in try await tx.pipeline(statements)
                }
                // An attempt that returns without `commit` (unknown user, nothing new, a
                // repeat found) wrote nothing: rolled back, and the next one starts afresh.
                try await tx.rollback()
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
        /// Committed, but the notification after the commit failed.
        case storedUnannounced([PushResult])
        /// Without the look-up, an event turned out to repeat an earlier push.
        case repeatsEarlierPush

        /// What `store` returns, or nil to try again with the look-up.
        var outcome: PushOutcome?? {
            switch self {
            case .unknownUser: return .some(nil)
            case .stored(let results): return .some(PushOutcome(results: results))
            case .storedUnannounced(let results): return .some(PushOutcome(results: results, announced: false))
            case .repeatsEarlierPush: return nil
            }
        }
    }

    /// The connection was lost after the push's `commit` was sent and before its answer
    /// came: the events may or may not be stored.
    struct CommitOutcomeUnknown: Error {}

    /// One attempt at a push, inside `Database.transaction(as: .user(…))`, whose `begin` and
    /// scope travel with the attempt's first pipeline. Without the look-up: one round trip
    /// (cursor and insert in one statement, `commit`, notification). With it: lock and
    /// look-up; insert and cursor update; `commit` and notification.
    struct PushSteps {
        let events: [IncomingEvent]
        let user: UUID
        let lookingUpRepeats: Bool

        init(events: [IncomingEvent], user: UUID, lookingUpRepeats: Bool) {
            self.events = events
            self.user = user
            self.lookingUpRepeats = lookingUpRepeats
        }

        func run(_ pipeline: ([PostgresStatement]) async throws -> [PostgresResult]) async throws -> PushAttempt {
            if !lookingUpRepeats {
                let batch = Batch(events, existing: [:])
                let replies: [PostgresResult]
                do {
                    replies = try await pipeline(batch.oneRoundTrip(for: user))
                } catch let error as PostgresError where Self.repeatsEarlierPush(error) {
                    return .repeatsEarlierPush
                } catch {
                    // Committed, only the notification failed: the attempt with the look-up
                    // finds the events stored and announces them.
                    guard try Self.committed(despite: error, commitAt: Batch.commitIndex) else { throw error }
                    return .repeatsEarlierPush
                }
                return try batch.stored(afterCursor: replies)
            }
            guard let head = try Self.lockedState(try await pipeline(lockAndLookUp())) else { return .unknownUser }
            let batch = Batch(events, existing: head.existing)
            let results = batch.results(base: head.lastSeq)
            if !batch.fresh.isEmpty {
                guard try await pipeline(batch.write(for: user, after: head)).first?.count == batch.fresh.count else {
                    return .repeatsEarlierPush
                }
            }
            // Also when every event was stored before: announced again, for the case that
            // the earlier push's notification was lost.
            do {
                _ = try await pipeline(commitAndNotify)
            } catch {
                guard try Self.committed(despite: error, commitAt: 0) else { throw error }
                return .storedUnannounced(results)
            }
            return .stored(results)
        }

        /// Whether the pipeline that failed with `error` had committed: its `commit` (at
        /// `commitAt` among its statements) succeeded and a later statement (the
        /// notification) failed. False when a statement before the commit failed (nothing was
        /// stored: `error` stands). Throws `CommitOutcomeUnknown` when the connection was lost
        /// with the commit sent and its answer not received.
        static func committed(despite error: any Error, commitAt: Int) throws -> Bool {
            guard let error = error as? PostgresError, let index = error.pipelineIndex else {
                throw CommitOutcomeUnknown()
            }
            return index > commitAt
        }

        /// The insert met an event this user pushed before (the `(user_id, client_id)` index).
        static func repeatsEarlierPush(_ error: PostgresError) -> Bool {
            error.isUniqueViolation && error.constraint == "events_user_id_client_id_key"
        }

        /// `commit`, then the notification in a transaction of its own that need not wait
        /// for a WAL flush (it writes nothing durable).
        var commitAndNotify: [PostgresStatement] {
            [
                .commit,
                .prepared(
                    "select set_config('synchronous_commit', 'off', true), pg_notify($1, $2)", channel,
                    UUIDText.lowercase(user)),
            ]
        }

        /// The batch's events split into the new ones (first of their `client_id`, not stored
        /// before) and the repeats, in order.
        struct Batch {
            let events: [IncomingEvent]
            /// The events to insert, in order: the `n`-th gets `seq` base + `n`.
            var fresh: [IncomingEvent] = []
            /// For each event: its rank among `fresh` (1-based) or its stored `seq` (negated
            /// rank is never needed: a stored `seq` is known only with the look-up).
            private var assigned: [Assignment] = []
            private enum Assignment {
                case fresh(Int64)
                case stored(Int64)
            }

            init(_ events: [IncomingEvent], existing: [UUID: Int64]) {
                self.events = events
                var ranks: [UUID: Int64] = [:]
                ranks.reserveCapacity(events.count)
                assigned.reserveCapacity(events.count)
                // By index: `events[index].clientID` reads the one field, where a loop over
                // the events would copy (retain and release) each.
                for index in events.indices {
                    let clientID = events[index].clientID
                    if let seq = existing[clientID] {
                        assigned.append(.stored(seq))
                    } else if let rank = ranks.updateValue(Int64(ranks.count + 1), forKey: clientID) {
                        ranks[clientID] = rank  // a repeat within the batch keeps the first rank
                        assigned.append(.fresh(rank))
                    } else {
                        fresh.append(events[index])
                        assigned.append(.fresh(Int64(fresh.count)))
                    }
                }
                // Most batches are all new: then `fresh` shares the events' storage.
                if fresh.count == events.count { fresh = events }
            }

            /// Each event's outcome once the new ones are numbered after `base`.
            func results(base: Int64) -> [PushResult] {
                // Whether each fresh rank was answered `created` already (1-based).
                var answered = [Bool](repeating: false, count: fresh.count + 1)
                var results: [PushResult] = []
                results.reserveCapacity(events.count)
                for index in events.indices {
                    let clientID = events[index].clientID
                    switch assigned[index] {
                    case .stored(let seq): results.append(PushResult(clientID: clientID, created: false, seq: seq))
                    case .fresh(let rank):
                        let created = !answered[Int(rank)]
                        answered[Int(rank)] = true
                        results.append(PushResult(clientID: clientID, created: created, seq: base + rank))
                    }
                }
                return results
            }

            /// The common case in one round trip: the cursor moves by the number of new events
            /// (the update takes the user's row lock, held to the commit, so `seq` and
            /// `created_at` follow commit order) and the events are inserted after it, in one
            /// statement; no row when the user does not exist. A repeat of an earlier push
            /// fails the insert on the unique index, and everything after it is skipped, so an
            /// insert that returns stored every event: it has no `returning`, which would
            /// check each new row against the events policy's `USING` as well (migration 0014).
            func oneRoundTrip(for user: UUID) -> [PostgresStatement] {
                [
                    .prepared(
                        Self.oneRoundTripSQL, user, Int64(fresh.count), fresh.map(\.clientID), fresh.map(\.type),
                        fresh.map(\.payload), fresh.map(\.clientTimestamp))
                ] + PushSteps(events: [], user: user, lookingUpRepeats: false).commitAndNotify
            }

            /// `oneRoundTrip`'s statement, built once.
            static let oneRoundTripSQL = """
                with cursor as (
                  update users
                     set last_seq = last_seq + $2,
                         last_event_at = greatest(date_trunc('milliseconds', clock_timestamp()),
                                                  coalesce(last_event_at + interval '1 millisecond', '-infinity'::timestamptz))
                                         + ($2 - 1) * interval '1 millisecond'
                   where id = $1
                  returning last_seq - $2 as base_seq
                          , last_event_at - ($2 - 1) * interval '1 millisecond' as base_at
                ), stored as (
                  insert into events (\(EventRecord.insertList))
                  select $1, cursor.base_seq + x.n, x.t, x.p, x.c, x.ts, cursor.base_at + (x.n - 1) * interval '1 millisecond'
                  from cursor, unnest($3::uuid[], $4::text[], $5::jsonb[], $6::timestamptz[]) with ordinality as x(c, t, p, ts, n)
                )
                select base_seq from cursor
                """

            /// Where `oneRoundTrip` has its `commit` (the door's `begin` and scope not counted).
            static let commitIndex = 1

            /// The outcome of `oneRoundTrip`.
            func stored(afterCursor replies: [PostgresResult]) throws -> PushAttempt {
                guard replies.count > 0, let row = replies[0].first else { return .unknownUser }
                return .stored(results(base: try row.decode(Int64.self, column: 0)))
            }

            /// With the look-up, under the lock: the insert and the cursor update.
            func write(for user: UUID, after head: LockedState) -> [PostgresStatement] {
                let lastCreated = PostgresTimestamp(
                    microsecondsSinceEpoch: head.base.microsecondsSinceEpoch + Int64(fresh.count - 1) * 1000)
                return [
                    // `on conflict do nothing` leaves out an event stored meanwhile (never
                    // expected under the lock); `returning` tells, and the caller then rolls back.
                    .prepared(
                        Self.writeSQL, user, head.lastSeq, head.base, fresh.map(\.clientID), fresh.map(\.type),
                        fresh.map(\.payload), fresh.map(\.clientTimestamp)),
                    .prepared(
                        "update users set last_seq = $2, last_event_at = $3 where id = $1", user,
                        head.lastSeq + Int64(fresh.count), lastCreated),
                ]
            }

            /// `write`'s insert, built once.
            static let writeSQL = """
                insert into events (\(EventRecord.insertList))
                select $1, $2 + n, t, p, c, ts, $3 + (n - 1) * interval '1 millisecond'
                from unnest($4::uuid[], $5::text[], $6::jsonb[], $7::timestamptz[]) with ordinality as x(c, t, p, ts, n)
                on conflict (user_id, client_id) do nothing
                returning 1
                """
        }

        /// What the look-up path learns under the lock.
        struct LockedState {
            var lastSeq: Int64
            /// The first new event's `created_at`.
            var base: PostgresTimestamp
            /// The batch's `client_id`s stored before, with their `seq`.
            var existing: [UUID: Int64]
        }

        /// The user's row lock and the look-up of the batch's `client_id`s.
        func lockAndLookUp() -> [PostgresStatement] {
            [
                .prepared(
                    """
                    select last_seq,
                           greatest(date_trunc('milliseconds', clock_timestamp()),
                                    coalesce(last_event_at + interval '1 millisecond', '-infinity'::timestamptz))
                    from users where id = $1 for update
                    """, user),
                // Runs after the lock is granted, so it sees every earlier push. Not prepared:
                // planned for this array and this user's statistics each time.
                PostgresStatement(
                    "select client_id, seq from events where user_id = $1 and client_id = any($2)", user,
                    events.map(\.clientID)),
            ]
        }

        /// The state under the lock; nil when the user does not exist.
        static func lockedState(_ replies: [PostgresResult]) throws -> LockedState? {
            guard replies.count > 1, let state = replies[0].first else { return nil }
            var existing: [UUID: Int64] = [:]
            for row in replies[1] {
                existing[try row.decode(UUID.self, column: 0)] = try row.decode(Int64.self, column: 1)
            }
            return LockedState(
                lastSeq: try state.decode(Int64.self, column: 0),
                base: try state.decode(PostgresTimestamp.self, column: 1),
                existing: existing)
        }
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
    /// sees `seq` N + 1 without N. Sent with `Database.readPipeline` (with `db_shared_reads`
    /// above 1, behind other reads on a connection they share; each pipeline its own
    /// implicit transaction).
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
    /// The stream's reads (`framing: .serverSentEvents`) run on the database's own loop
    /// (`Database.offHTTPLoops`): they are not requests the HTTP server drains before it
    /// stops, and a query left waiting on an HTTP loop that has stopped would never finish;
    /// the own loop runs until `Database.close()`, the last step of `Application.close()`.
    ///
    /// The stream's pages are also bounded in bytes (`streamedPageBytes`): a stream holds
    /// its page while a slow client reads it.
    func pull(for user: UUID, after: Int64, limit: Int, framing: EventPageEncoder.Framing) async throws -> Page {
        guard framing == .serverSentEvents else {
            let select = Self.pullStatement(for: user, after: after, limit: limit)
            guard let rows = try await database.readPipeline(as: .user(user), plans: .generic, [select]).first else {
                throw PostgresError.unexpected("a statement returned no result")
            }
            return try Self.page(rows, limit: limit, framing: framing, pageBytes: Self.pullPageBytes)
        }
        let select = Self.pullStatement(for: user, after: after, limit: limit, maxBytes: Self.streamedPageBytes)
        return try await database.offHTTPLoops {
            try await database.read(as: .user(user), plans: .generic) { tx in
                try Self.page(
                    try await tx.query(select), limit: limit, framing: framing, maxBytes: Self.streamedPageBytes)
            }
        }
    }

    /// Payload bytes (as printed) a page of a streamed body — the stream's, the export's —
    /// holds before its last event: with that event's 64 KiB at most, such a page stays
    /// under ~1.1 MiB whatever its events, so a slow reader holds no more than that plus its
    /// writer's buffer.
    public static let streamedPageBytes = 1024 * 1024

    /// `select` (the columns of a page, `EventRecord.selectList`, in `seq` order) cut after
    /// the first event at which its payloads as printed reach parameter `$bytesParameter`
    /// bytes (the first event is always kept).
    static func boundedInBytes(_ select: String, bytesParameter: Int) -> String {
        """
        select \(EventRecord.selectList) from (
          select page.*, sum(octet_length(page.payload::text)) over (order by page.seq)
                         - octet_length(page.payload::text) as bytes_before
          from (\(select)) page
        ) sized where bytes_before < $\(bytesParameter) order by seq
        """
    }

    /// The pull's select (prepared once per connection, and planned once: whatever the
    /// values, the `(user_id, seq)` index is the plan, so the read asks for `Plans.generic`;
    /// planned for each execution's values, as PostgreSQL otherwise does with a `limit $3`,
    /// it cost three times the read itself), bounded in bytes when `maxBytes` is given. The
    /// door sends the scope with it, in one round trip.
    static func pullStatement(for user: UUID, after: Int64, limit: Int, maxBytes: Int? = nil) -> PostgresStatement {
        guard let maxBytes else { return .prepared(pullSQL, user, after, Int64(limit + 1)) }
        return .prepared(boundedPullSQL, user, after, Int64(limit + 1), Int64(maxBytes))
    }

    /// The pull's select, built once.
    static let pullSQL = """
        select \(EventRecord.selectList)
        from events where user_id = $1 and seq > $2 order by seq limit $3
        """
    /// The stream's: the pull's, bounded in bytes by `$4`.
    static let boundedPullSQL = boundedInBytes(pullSQL, bytesParameter: 4)

    /// Room a pull's page may take (`EventRecord.capacity`: payloads and types as stored,
    /// the fixed fields) before its last event: with that event's 64 KiB at most, a pull
    /// answer stays under ~1.1 MiB however many events `limit` asks for. Without it a page
    /// of 1,000 events of 64 KiB was a 64 MB answer, held while its client did not read it
    /// (up to the write timeout): a few hundred such requests from one account held
    /// gigabytes. The rows are read whole (`limit + 1`, freed once encoded; at most one
    /// result per database connection at a time); only the answer is cut.
    public static let pullPageBytes = 1024 * 1024

    /// The page from the statement's `limit + 1` rows, encoded. A page cut at `maxBytes` (its
    /// encoding is at least that long) may have more after it, and so may one the encoder
    /// cut at `pageBytes`.
    private static func page(
        _ rows: PostgresResult, limit: Int, framing: EventPageEncoder.Framing, maxBytes: Int? = nil,
        pageBytes: Int = .max
    )
        throws -> Page
    {
        let (json, lastSeq, count) = try EventPageEncoder.encode(
            rows, count: min(rows.count, limit), framing: framing, maxBytes: pageBytes)
        let cut = maxBytes.map { json.count >= $0 } ?? false
        return Page(
            eventsJSON: json, count: count, lastSeq: lastSeq, hasMore: rows.count > count || cut)
    }
}

extension Database {
    /// Runs `body` on the database's own loop, whose pool its queries then use, not an HTTP
    /// loop's: for work the HTTP server does not drain before its loops stop (a stream's
    /// reads, an export's pages). The own loop runs until `close()`.
    func offHTTPLoops<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        try await withTaskExecutorPreference(eventLoop, operation: body)
    }
}

/// An insert skipped an event the look-up under the user's lock did not find (never expected:
/// every insert into `events` takes that lock).
struct UnexpectedRepeat: Error {}

/// A `jsonb` value in a format this server does not know (never expected from PostgreSQL 15).
struct UnexpectedJSONB: Error {}
