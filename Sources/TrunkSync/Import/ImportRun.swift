import Foundation
import Postgres
import TrunkCrypto

/// One run of `SupabaseImport`: the phases in order (users, sessions, events, verification),
/// each streaming the source in batches. The destination's SQL is here, in one place.
final class ImportRun {
    let options: SupabaseImport.Options
    let source: SupabaseSource
    let destination: PostgresConnection
    let rejects: RejectWriter
    var report = SupabaseImport.Report()
    /// Source users not imported this run (rejected, or an email conflict): their events and
    /// sessions are rejected too, and the verification leaves them out.
    var notImported = Set<String>()
    /// Of those, the users rejected for what the source holds (banned or deleted softly
    /// there, no email address…): the sessions an earlier run imported for them end here.
    var endedAtSource = Set<String>()
    /// Users the verification found events missing for: their counts are forgotten after
    /// it, so the next run reads them again (a source event that changed without changing
    /// its user's count — a refused one fixed, one deleted and another recorded — is found
    /// only there).
    private var incomplete: [String] = []
    /// Source events this run listed in the reject file as refused by trunk-sync's rules (by
    /// the events phase, or the verification): the verification lists the others it finds
    /// (earlier runs read them), so that no event is listed twice.
    private var refusedListed = Set<String>()
    /// Users the last batch numbered, with the last `seq` it gave them: their next batch
    /// continues from there unless somebody pushed meanwhile.
    private var continuing: [String: Int64] = [:]

    init(
        options: SupabaseImport.Options, source: SupabaseSource, destination: PostgresConnection, rejects: RejectWriter
    ) {
        self.options = options
        self.source = source
        self.destination = destination
        self.rejects = rejects
        report.dryRun = options.dryRun
        report.rejectFile = options.dryRun ? nil : options.rejectFile
    }

    func all() throws -> SupabaseImport.Report {
        // A dry run does everything in one transaction and rolls it back: the counts are
        // exactly what a real run would find, and nothing stays (no notification leaves an
        // aborted transaction).
        if options.dryRun { try destination.execute("begin") }
        func timed(_ phase: String, _ body: () throws -> Void) throws {
            let start = ContinuousClock.now
            try body()
            let elapsed = ContinuousClock.now - start
            report.seconds[phase] =
                ((Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18) * 1000).rounded()
                / 1000
        }
        try timed("users", users)
        try timed("sessions", sessions)
        try timed("events", events)
        // Fresh statistics for the servers' queries (and the visibility map, which lets the
        // verification read the keys from the index alone) after a bulk load.
        if !options.dryRun, report.events.imported > 0 {
            try timed("vacuum") {
                // One statement per call: several in one would run as a transaction block,
                // where VACUUM cannot.
                try destination.execute("vacuum (analyze) events")
                try destination.execute("analyze users")
            }
        }
        try timed("verification", verify)
        if !options.dryRun {
            var rest = incomplete[...]
            while !rest.isEmpty {
                try destination.query(Self.forgetProgress, "{" + rest.prefix(1000).joined(separator: ",") + "}")
                rest = rest.dropFirst(1000)
            }
        }
        if options.dryRun { try destination.execute("rollback") }
        return report
    }

    /// Runs `body` in a transaction of its own, or inside the dry run's.
    @discardableResult
    private func batch<T>(_ body: () throws -> T) throws -> T {
        if options.dryRun { return try body() }
        return try destination.transaction { _ in try body() }
    }

    private func reject(_ table: String, _ id: String, _ reason: String) {
        rejects.write(table: table, id: id, reason: reason)
    }

    // MARK: - Users

    private func users() throws {
        var copy = CopyText()
        try source.stream(source.usersQuery, batch: options.batchSize) { rows in
            copy.removeAll()
            var batchIDs: [String] = []
            for row in rows {
                report.users.read += 1
                let id = try row.decode(String.self, column: 0)
                if !row.isNull(column: 7) { report.profiles.read += 1 }
                if let reason = try row.decode(String?.self, column: 8) {
                    report.users.rejected += 1
                    notImported.insert(id)
                    endedAtSource.insert(id)
                    reject("auth.users", id, reason)
                    continue
                }
                let raw = try row.decode(String.self, column: 1)
                guard let email = Email(raw), email.value.utf8.count <= 320 else {
                    report.users.rejected += 1
                    notImported.insert(id)
                    endedAtSource.insert(id)
                    reject("auth.users", id, "email is not a valid address")
                    continue
                }
                batchIDs.append(id)
                copy.field(id)
                copy.field(email.value)
                for column in 2...7 { copy.field(row, column) }
                copy.endRow()
            }
            guard !copy.isEmpty else { return 0 }
            try batch {
                try destination.execute("truncate import_users")
                try destination.copyIn("copy import_users from stdin", data: copy.bytes)
                for row in try destination.query(Self.usersDeletedHere) {
                    let id = try row.decode(String.self, column: 0)
                    notImported.insert(id)
                    report.users.rejected += 1
                    reject("auth.users", id, "deleted on trunk-sync after an earlier import; not imported again")
                }
                for row in try destination.query(Self.usersWithUnusableMetadata) {
                    let id = try row.decode(String.self, column: 0)
                    notImported.insert(id)
                    report.users.rejected += 1
                    reject(
                        "auth.users", id,
                        try row.decode(String.self, column: 1)
                            + " (every access token carries it): change it on the hosted project and run the import "
                            + "again")
                }
                try carryChanges()
                func addressTaken(_ rows: PostgresResult) throws {
                    for row in rows {
                        let id = try row.decode(String.self, column: 0)
                        let email = try row.decode(String.self, column: 1)
                        notImported.insert(id)
                        report.conflicts.append(.init(sourceID: id, email: email, reason: .addressTaken))
                        reject("auth.users", id, "email \(email) belongs to another trunk-sync user")
                    }
                }
                try addressTaken(destination.query(Self.userConflicts))
                let counts = try destination.query(Self.insertUsers)[0]
                report.users.alreadyThere += Int(try counts.decode(Int64.self, column: 0))
                report.users.imported += Int(try counts.decode(Int64.self, column: 1))
                report.profiles.imported += Int(try counts.decode(Int64.self, column: 2))
                try addressTaken(destination.query(Self.addressesTakenMeanwhile))
            }
            return copy.bytes.count
        }
    }

    /// Takes out of the batch the users an earlier run imported (they have a count of
    /// events read) who are not here any more: deleted since, by their own request or an
    /// operator. Returns their ids.
    static let usersDeletedHere = """
        delete from import_users s
        where exists (select from supabase_import_progress p where p.user_id = s.id)
          and not exists (select from users u where u.id = s.id)
        returning s.id::text
        """

    /// Takes out of the batch the users not here yet whose metadata, as the import would
    /// write it, trunk-sync cannot take (`SupabaseSource.metadataRejectReason`: every access
    /// token carries it, so such a user could not use the server). Returns their ids and
    /// why. (An imported user's metadata that became such is not carried over:
    /// `compareUsers`' `unusable`.)
    static let usersWithUnusableMetadata = """
        with unusable as (
          select s.id, r.reason
          from import_users s
          cross join lateral (select \(SupabaseSource.metadataRejectReason(hostedMetadata)) reason) r
          where not exists (select from users u where u.id = s.id) and r.reason is not null
        )
        delete from import_users s using unusable x where s.id = x.id
        returning s.id::text, x.reason
        """

    /// Takes out of the batch the users not here yet whose email another user here has, or
    /// another user of the batch with a smaller id (two source users with one address: case
    /// apart, or an SSO user beside an email one, which Supabase's unique index allows).
    /// Returns their ids and addresses. A user an
    /// earlier run imported is `carryChanges`'s. The batch's own duplicates by a window, in
    /// one sort (a correlated look-up in the unindexed temporary table scanned it once per
    /// user: 5.5 s a batch of 10,000).
    static let userConflicts = """
        delete from import_users x
        using (select s.id, s.email, row_number() over (partition by s.email order by s.id) > 1 later
               from import_users s) s
        where x.id = s.id
          and not exists (select from users u where u.id = s.id)
          and (s.later or exists (select from users u where lower(u.email) = s.email and u.id <> s.id))
        returning s.id::text, s.email
        """

    /// The batch's users still not here after `insertUsers`, in its transaction: their
    /// address became another user's after `userConflicts` looked (somebody signed up here
    /// meanwhile: the server is live during an import), which the insert skipped. Conflicts,
    /// as `userConflicts`' are, not users missing from the counts. Returns their ids and
    /// addresses.
    static let addressesTakenMeanwhile = """
        select s.id::text, s.email from import_users s where not exists (select from users u where u.id = s.id)
        """

    /// A source user's name as the import writes it (`s`: an `import_users` row):
    /// `profiles.full_name` wins over the metadata's.
    static let hostedName = "coalesce(s.profile_name, s.metadata->>'full_name')"

    /// A source user's metadata as the import writes it: the profile's name as its `full_name`.
    static let hostedMetadata = """
        case when s.profile_name is null then s.metadata
             else s.metadata || jsonb_build_object('full_name', s.profile_name) end
        """

    /// Carries over to the batch's users an earlier run imported what changed on the hosted
    /// project since (address, name, metadata), where the value here is still the one the
    /// import wrote (`supabase_imported_users`), and reports the rest as conflicts.
    ///
    /// Somebody may sign up here with an address the run carries over after the comparison
    /// looked (the server is live during an import): the update then meets the address's
    /// unique index once their transaction commits. The comparison and the update run again
    /// from a savepoint, and see the address taken: a conflict, not a failed run.
    private func carryChanges() throws {
        var attempts = 0
        func compareAndApply() throws -> Int64 {
            try destination.execute("savepoint carry_changes")
            do {
                try destination.execute("truncate import_user_changes")
                try destination.query(Self.compareUsers)
                try destination.query(Self.lockChangedUsers)
                let updated = try destination.query(Self.applyChanges)[0].decode(Int64.self, column: 0)
                try destination.execute("release savepoint carry_changes")
                return updated
            } catch let error as PostgresError
                where error.isUniqueViolation && error.constraint == "users_email_key" && attempts < 3
            {
                attempts += 1
                try destination.execute("rollback to savepoint carry_changes")
                return try compareAndApply()
            }
        }
        report.usersUpdated += Int(try compareAndApply())
        for row in try destination.query(Self.changeConflicts) {
            let id = try row.decode(String.self, column: 0)
            let field = try row.decode(String.self, column: 3)
            guard let reason = SupabaseImport.Conflict.Reason(step: try row.decode(String.self, column: 4)) else {
                continue
            }
            let email = try row.decode(String.self, column: 1)
            let here = try row.decode(String.self, column: 2)
            report.conflicts.append(
                .init(
                    sourceID: id, email: email, field: field, emailHere: field == "email" ? here : nil, reason: reason)
            )
            reject("auth.users", id, "\(field) not carried over: \(reason.explanation)")
        }
    }

    /// The users `applyChanges` may update, locked in id order first, as pushes, the
    /// events' batches (`lockUsers`) and the WAL timeline's move lock them: an update in
    /// the join's order could deadlock with the move.
    static let lockChangedUsers = """
        select from users u where u.id in (select id from import_user_changes) order by u.id for no key update of u
        """

    /// Per batch user an earlier run imported (here by id): the hosted value (`there`, as
    /// the import writes it), the one here, the one the import last wrote (`then`, null:
    /// not recorded), and what to do with each field — `same` (both sides agree), `kept`
    /// (changed here only: left), `carry` (changed there only), `both` (changed on both
    /// sides: left, a conflict), `taken` (the new address is another user's here, or
    /// another source user's: a conflict), `not_recorded` (they differ and the import has
    /// no record: left, a conflict), `unusable` (metadata only: the merge, or the metadata
    /// here, is what trunk-sync cannot take, `SupabaseSource.metadataRejectReason`; left, a
    /// conflict, the record unchanged, and the name not carried either, so the name and the
    /// metadata's `full_name` stay one). Names are JSON (`null` for none). The metadata goes key
    /// by key (only where the two differ): the keys changed there only are carried, those
    /// changed on both sides are left; `meta_merged` is the result, `meta_record` what the
    /// import has then written.
    static let compareUsers = """
        insert into import_user_changes
        select c.id, c.there_email, c.here_email, c.then_email,
               case when c.there_email = c.here_email then 'same'
                    when c.then_email is null then 'not_recorded'
                    when c.there_email = c.then_email then 'kept'
                    when c.here_email <> c.then_email then 'both'
                    when exists (select from users o where lower(o.email) = c.there_email and o.id <> c.id)
                      or exists (select from import_users o where o.email = c.there_email and o.id <> c.id) then 'taken'
                    else 'carry' end,
               c.there_name, c.then_name,
               case when c.there_name = c.here_name then 'same'
                    when c.then_name is null then 'not_recorded'
                    when c.there_name = c.then_name then 'kept'
                    when c.here_name <> c.then_name then 'both'
                    else 'carry' end,
               c.here_meta, m.merged,
               case when c.there_meta = c.here_meta then c.there_meta
                    when c.then_meta is not null and not m.unusable then m.recorded
                    else c.then_meta end,
               case when m.unusable then 'unusable'
                    when c.there_meta = c.here_meta then 'same'
                    when c.then_meta is null then 'not_recorded'
                    when m.conflicts then 'both'
                    when m.carried then 'carry'
                    else 'kept' end
        from (
          select s.id, s.email there_email, u.email here_email, r.email then_email,
                 coalesce(to_jsonb(\(hostedName)), 'null') there_name,
                 coalesce(to_jsonb(u.full_name), 'null') here_name, r.full_name then_name,
                 \(hostedMetadata) there_meta, u.user_metadata here_meta, r.user_metadata then_meta
          from import_users s join users u on u.id = s.id
          left join supabase_imported_users r on r.user_id = s.id
        ) c
        cross join lateral (
          select m.*,
                 (\(SupabaseSource.metadataRejectReason(
                    "case when c.there_meta = c.here_meta then c.here_meta else m.merged end"))) is not null unusable
          from (
          select coalesce(bool_or(k.step = 'both'), false) conflicts, coalesce(bool_or(k.step = 'carry'), false) carried,
                 coalesce(jsonb_object_agg(k.key, k.merged) filter (where k.merged is not null), '{}') merged,
                 coalesce(jsonb_object_agg(k.key, k.recorded) filter (where k.recorded is not null), '{}') recorded
          from (
            select x.key, y.step, case when y.step = 'carry' then x.t else x.h end merged,
                   case when y.step in ('same', 'carry') then x.t else x.r end recorded
            from (
              select keys.key, c.there_meta->keys.key t, c.here_meta->keys.key h, c.then_meta->keys.key r
              from (select jsonb_object_keys(c.there_meta) union select jsonb_object_keys(c.here_meta)
                    union select jsonb_object_keys(coalesce(c.then_meta, '{}'))) keys(key)
              where c.there_meta <> c.here_meta  -- else nothing to merge (most users, most runs)
            ) x
            cross join lateral (
              select case when x.t is not distinct from x.h then 'same'
                          when x.t is not distinct from x.r then 'kept'
                          when x.h is not distinct from x.r then 'carry'
                          else 'both' end step
            ) y
          ) k
        ) m) m
        """

    /// Writes what `compareUsers` found to carry (metadata keys changed there only, also
    /// beside keys changed on both sides), each value only while the one here is still what
    /// it read (a change here meanwhile wins), and records what the import has written
    /// (rows that change only). Returns: users updated.
    static let applyChanges = """
        with updated as (
          update users u set
            email = case when c.email_step = 'carry' and u.email = c.then_email then c.there_email else u.email end,
            full_name = case when c.name_step = 'carry' and c.meta_step <> 'unusable'
                              and coalesce(to_jsonb(u.full_name), 'null') = c.then_name
                             then c.there_name #>> '{}' else u.full_name end,
            user_metadata = case when c.meta_step in ('carry', 'both') and u.user_metadata = c.here_meta
                                 then c.meta_merged else u.user_metadata end,
            updated_at = now()
          from import_user_changes c
          where u.id = c.id
            and (c.email_step = 'carry' or c.name_step = 'carry' and c.meta_step <> 'unusable' or c.meta_step = 'carry'
                 or c.meta_step = 'both' and c.meta_merged <> c.here_meta)
          returning u.id
        ),
        recorded as (
          insert into supabase_imported_users as r (user_id, email, full_name, user_metadata)
          select c.id,
                 case when c.email_step in ('same', 'carry') then c.there_email else c.then_email end,
                 case when c.name_step = 'same' or c.name_step = 'carry' and c.meta_step <> 'unusable' then c.there_name
                      else c.then_name end,
                 c.meta_record
          from import_user_changes c
          on conflict (user_id) do update
            set email = excluded.email, full_name = excluded.full_name, user_metadata = excluded.user_metadata,
                recorded_at = now()
            where (r.email, r.full_name, r.user_metadata)
                  is distinct from (excluded.email, excluded.full_name, excluded.user_metadata)
        )
        select count(*) from updated
        """

    /// The fields `compareUsers` left as conflicts: source id, hosted address, address
    /// here, field, step.
    static let changeConflicts = """
        select c.id::text, c.there_email, c.here_email, f.field, f.step
        from import_user_changes c
        cross join lateral (values ('email', c.email_step), ('full_name', c.name_step), ('user_metadata', c.meta_step))
          f(field, step)
        where f.step in ('both', 'taken', 'not_recorded', 'unusable')
        order by c.id, f.field
        """

    /// Inserts the users not there yet (by id; an email another user has is a conflict,
    /// `userConflicts`' or, taken since, `addressesTakenMeanwhile`'s). `profiles.full_name`
    /// wins over the metadata's. Each imported user
    /// gets a count of events read (0 until their events are), which marks them as
    /// imported once: deleted here later, they are not brought back; and a record of the
    /// address, name and metadata written (`supabase_imported_users`), for `compareUsers`.
    /// Returns: already there, imported, imported with a profile name.
    static let insertUsers = """
        with there as (select count(*) n from import_users s where exists (select from users u where u.id = s.id)),
        ins as (
          insert into users (id, email, created_at, updated_at, email_confirmed_at, last_sign_in_at, full_name, user_metadata)
          select s.id, s.email, s.created_at, s.updated_at, s.email_confirmed_at, s.last_sign_in_at,
                 \(hostedName), \(hostedMetadata)
          from import_users s
          where not exists (select from users u where u.id = s.id or lower(u.email) = s.email)
          on conflict do nothing
          returning id
        ),
        marked as (
          insert into supabase_import_progress (user_id, events_seen) select id, 0 from ins
          on conflict (user_id) do nothing
        ),
        recorded as (
          insert into supabase_imported_users (user_id, email, full_name, user_metadata)
          select s.id, s.email, coalesce(to_jsonb(\(hostedName)), 'null'), \(hostedMetadata)
          from import_users s join ins on ins.id = s.id
          on conflict (user_id) do nothing
        )
        select (select n from there), (select count(*) from ins),
               (select count(*) from ins join import_users s on s.id = ins.id where s.profile_name is not null)
        """

    // MARK: - Sessions

    private func sessions() throws {
        var copy = CopyText()
        // Every source session (id, user, whether it lives on there), kept in
        // `import_source_sessions` for the end of the phase.
        var sourceRows = CopyText()
        let batchSize = min(options.batchSize, 1000)
        var analyzedAt = 0  // sessions imported at the last ANALYZE
        try source.stream(source.sessionsQuery, batch: batchSize) { rows in
            copy.removeAll()
            sourceRows.removeAll()
            var live: [String: Bool] = [:]  // session id → whether it lives on at the source
            var meta: [String: (user: String, createdAt: String, aal: String)] = [:]
            for row in rows {
                let id = try row.decode(String.self, column: 0)
                let user = try row.decode(String.self, column: 1)
                guard try row.decode(Bool.self, column: 6) else {
                    live[id] = false  // past its not_after
                    continue
                }
                report.sessions.read += 1
                if notImported.contains(user) {
                    report.sessions.rejected += 1
                    reject("auth.sessions", id, "its user was not imported")
                    // A conflict, or a user deleted here, is nothing the source ended.
                    live[id] = !endedAtSource.contains(user)
                    continue
                }
                live[id] = true
                meta[id] = (user, try row.decode(String.self, column: 2), try row.decode(String.self, column: 3))
                if let stored = try row.decode(String?.self, column: 4), let sessionID = UUIDText.parse(id) {
                    switch SupabaseRefreshToken.key(stored: stored) {
                    case .success(let key):
                        let counter = UInt64(try row.decode(String?.self, column: 5) ?? "0") ?? 0
                        let token = SupabaseRefreshToken.encode(session: sessionID, counter: counter, key: key)
                        // The token one counter behind, which Supabase Auth accepts (its
                        // client lost the answer to that refresh); a session at 0 has none.
                        let parent =
                            counter >= 1
                            ? SupabaseRefreshToken.encode(session: sessionID, counter: counter - 1, key: key) : nil
                        append(&copy, id, meta[id], token: token, parent: parent)
                    case .failure:
                        report.sessionsUndecryptable += 1
                        meta[id] = nil
                    }
                } else if let tokens = try row.decode(String?.self, column: 7) {
                    for (token, parent) in try SupabaseSource.tokens(tokens) {
                        append(&copy, id, meta[id], token: token, parent: parent)
                    }
                } else {
                    report.sessionsWithoutToken += 1
                    live[id] = false  // every refresh token revoked there
                }
            }
            for row in rows {
                let id = try row.decode(String.self, column: 0)
                sourceRows.field(id)
                sourceRows.field(try row.decode(String.self, column: 1))
                sourceRows.field(live[id] == true ? "t" : "f")
                sourceRows.endRow()
            }
            try batch {
                try destination.copyIn("copy import_source_sessions from stdin", data: sourceRows.bytes)
                guard !copy.isEmpty else { return }
                try destination.execute("truncate import_sessions")
                try destination.copyIn("copy import_sessions from stdin", data: copy.bytes)
                for row in try destination.query(Self.sessionsOfMissingUsers) {
                    report.sessions.rejected += 1
                    reject("auth.sessions", try row.decode(String.self, column: 0), "its user is not in trunk-sync")
                }
                let counts = try destination.query(Self.insertSessions)[0]
                report.sessions.alreadyThere += Int(try counts.decode(Int64.self, column: 0))
                report.sessions.imported += Int(try counts.decode(Int64.self, column: 1))
            }
            // Fresh statistics each time the sessions imported double (and at 1000): the
            // next batches' statements join `refresh_tokens` and `sessions`, which without
            // them looked empty to the planner after a bulk load (nested loops over the whole
            // table: a second a batch of 1000 at 10,000 sessions, and growing).
            if report.sessions.imported >= max(1000, 2 * analyzedAt) {
                try destination.execute("analyze sessions")
                try destination.execute("analyze refresh_tokens")
                analyzedAt = report.sessions.imported
            }
            return 0
        }
        try batch {
            let preview = try destination.query(Self.sessionsEnding)[0]
            let ending = Int(try preview.decode(Int64.self, column: 0))
            let live = Int(try preview.decode(Int64.self, column: 1))
            if !options.dryRun, !options.revokeEndedSessions, Self.mostSessionsEnded(ending, of: live) {
                throw ImportError.source(
                    "\(ending) of the \(live) sessions imported earlier are not live in this project any more: "
                        + "is --from the project they were imported from? Nothing was revoked (users and sessions "
                        + "read so far are kept; a re-run goes on). If the hosted project did end them, run again "
                        + "with --revoke-ended-sessions")
            }
            let ended = try destination.query(Self.endSessions)[0]
            report.sessionsRevoked += Int(try ended.decode(Int64.self, column: 0))
        }
    }

    private func append(
        _ copy: inout CopyText, _ id: String, _ meta: (user: String, createdAt: String, aal: String)?, token: String,
        parent: String?
    ) {
        guard let meta else { return }
        copy.field(id)
        copy.field(meta.user)
        copy.field(meta.createdAt)
        copy.field(meta.aal == "aal2" ? "aal2" : "aal1")
        copy.field(bytea: SHA256.hash(token))
        if let parent, !parent.isEmpty, parent != token {
            copy.field(bytea: SHA256.hash(parent))
        } else {
            copy.field(nil as String?)
        }
        copy.endRow()
    }

    static let sessionsOfMissingUsers = """
        select distinct s.id::text from import_sessions s where not exists (select from users u where u.id = s.user_id)
        """

    /// When an imported parent counts as rotated: longer ago than any reuse interval
    /// (`refresh_reuse_interval`, at most 300 s), so that presenting it is always a lost
    /// answer (the live token superseded), as Supabase Auth accepts it at any time, and never
    /// the reuse interval's second token beside a live one.
    static let parentRotatedAt = "now() - interval '1 day'"

    /// Inserts the sessions not there yet with their live refresh tokens (stored hashed, as
    /// trunk-sync stores its own). Their access tokens' revocation outlives the hosted
    /// project's longest token lifetime (`access_expires_at`, a week). A session already
    /// here (an earlier run) that is not revoked here gets the live tokens it has now: the
    /// hosted project went on rotating them for clients still on the old app, whose next
    /// refresh against trunk-sync must work. Each session inserted is recorded as imported
    /// (`supabase_imported_sessions`), for `endSessions`. Returns: already there, imported.
    ///
    /// A live token's parent (the token it was rotated from, which Supabase Auth still
    /// accepts from a client that lost the answer to that refresh) comes too: a row of the
    /// session rotated long ago (`parentRotatedAt`), and the live token's row its successor, so
    /// that presenting the parent here takes `AuthService.refresh`'s lost-answer path (the
    /// live token superseded, a new one issued). A parent an earlier run brought as the live
    /// token (the hosted project rotated it since) is marked rotated (unless it was rotated
    /// or revoked here already), and the new live token is linked to it; a live token an
    /// earlier run brought without a parent gets it. Every token inserted or linked is
    /// recorded as imported (`supabase_imported_tokens`, migration 0020).
    ///
    /// The imported tokens (recorded, or with no parent: imported before the record) that
    /// are neither live at the source nor a live token's parent any more (the hosted project
    /// has rotated them away since) are revoked here, as they are there: refused, not
    /// rotated, so presenting one does not end the session. Tokens trunk-sync issued (a
    /// device that already refreshed here: neither recorded nor without a parent) and the
    /// imported ones it rotated (they have such a successor) are left as they are.
    static let insertSessions = """
        with there as (select count(distinct s.id) n from import_sessions s where exists (select from sessions x where x.id = s.id)),
        ins as (
          insert into sessions (id, user_id, created_at, updated_at, aal, access_expires_at)
          select distinct on (s.id) s.id, s.user_id, s.created_at, now(), s.aal, now() + interval '7 days'
          from import_sessions s
          where exists (select from users u where u.id = s.user_id) and not exists (select from sessions x where x.id = s.id)
          on conflict (id) do nothing
          returning id
        ),
        recorded as (
          insert into supabase_imported_sessions (session_id) select id from ins on conflict (session_id) do nothing
        ),
        here as (
          select s.* from import_sessions s
          where exists (select from ins where ins.id = s.id)
             or (s.id, s.user_id) in (select x.id, x.user_id from sessions x
                                      where x.id = any (array(select i.id from import_sessions i)) and x.revoked_at is null)
        ),
        parents as (
          insert into refresh_tokens (session_id, user_id, token_hash, rotated_at)
          select distinct on (s.parent_hash) s.id, s.user_id, s.parent_hash, \(parentRotatedAt)
          from here s where s.parent_hash is not null
          on conflict (token_hash) do nothing
          returning id, session_id, token_hash
        ),
        linked_to as (
          select s.*,
                 coalesce(p.id, (select e.id from refresh_tokens e where e.token_hash = s.parent_hash and e.session_id = s.id))
                   parent_id
          from here s
          left join parents p on p.token_hash = s.parent_hash and p.session_id = s.id
        ),
        rotated as (
          update refresh_tokens t set rotated_at = \(parentRotatedAt)
          where t.token_hash = any (array(select s.parent_hash from here s where s.parent_hash is not null))
            and exists (select from here s where s.parent_hash = t.token_hash and s.id = t.session_id)
            and t.rotated_at is null and t.revoked_at is null
        ),
        tokens as (
          insert into refresh_tokens (session_id, user_id, token_hash, parent_id)
          select s.id, s.user_id, s.token_hash, s.parent_id from linked_to s
          on conflict (token_hash) do nothing
          returning id
        ),
        linked as (
          update refresh_tokens t set parent_id = s.parent_id
          from linked_to s
          where t.token_hash = any (array(select l.token_hash from linked_to l where l.parent_id is not null))
            and t.token_hash = s.token_hash and t.session_id = s.id and t.parent_id is null and s.parent_id <> t.id
            and t.rotated_at is null and t.revoked_at is null
          returning t.id
        ),
        marked as (
          insert into supabase_imported_tokens (token_id)
          select id from parents union all select id from tokens union all select id from linked
          on conflict (token_id) do nothing
        ),
        stale as (
          update refresh_tokens t set revoked_at = now(), rotated_at = null
          where t.session_id = any (array(select s.id from import_sessions s)) and t.revoked_at is null
            and (t.parent_id is null or exists (select from supabase_imported_tokens i where i.token_id = t.id))
            and not exists (select from import_sessions s
                            where s.id = t.session_id and t.token_hash in (s.token_hash, s.parent_hash))
            and not exists (select from refresh_tokens c
                            where c.session_id = t.session_id and c.parent_id = t.id
                              and not exists (select from supabase_imported_tokens i where i.token_id = c.id))
        )
        select (select n from there), (select count(*) from ins), (select count(*) from tokens)
        """

    /// After the sessions phase, with every source session in `import_source_sessions`:
    /// records as imported the sessions here that have a source session's id and user (an
    /// earlier run's, from before the record existed: a session trunk-sync opened has an id
    /// of its own), then revokes the imported sessions the source no longer has live
    /// (deleted there, every refresh token revoked, past `not_after`, or their user
    /// rejected: banned, deleted softly), with their refresh tokens, as a sign-out does:
    /// the revocation trigger (migration 0004) announces each one, so their access tokens
    /// stop on every server. Sessions opened here are never touched. Returns: revoked.
    /// Whether `ending` of the `live` imported sessions is so many that `--from` more
    /// likely names another database (a staging copy, an old backup, another project) than
    /// the project they came from: more than 10 and more than half. An ordinary re-run
    /// finds a few users signed out since; revoking most sessions at once signs most users
    /// out, which the import never does without being told (`--revoke-ended-sessions`).
    static func mostSessionsEnded(_ ending: Int, of live: Int) -> Bool { ending > 10 && ending * 2 > live }

    /// The imported sessions `endSessions` would revoke, and all imported sessions live
    /// here (the same `imported` set as there).
    static let sessionsEnding = """
        with imported as (
          select session_id as id from supabase_imported_sessions
          union
          select s.id from import_source_sessions s join sessions x on x.id = s.id and x.user_id = s.user_id
        )
        select count(*) filter (where not exists (select from import_source_sessions s where s.id = x.id and s.live)),
               count(*)
        from sessions x join imported using (id) where x.revoked_at is null
        """

    static let endSessions = """
        with here as (
          select s.id from import_source_sessions s join sessions x on x.id = s.id and x.user_id = s.user_id
        ),
        recorded as (
          insert into supabase_imported_sessions (session_id) select id from here on conflict (session_id) do nothing
        ),
        ended as (
          update sessions x set revoked_at = now()
          from (select session_id as id from supabase_imported_sessions union select id from here) imported
          where x.id = imported.id and x.revoked_at is null
            and not exists (select from import_source_sessions s where s.id = x.id and s.live)
          returning x.id
        ),
        tokens as (
          update refresh_tokens t set revoked_at = now()
          where t.session_id in (select id from ended) and t.revoked_at is null
        )
        select count(*) from ended
        """

    // MARK: - Events

    private func events() throws {
        let total = Int(try source.connection.query(SupabaseSource.eventTotalQuery)[0].decode(Int64.self, column: 0))
        // The users whose source count differs from what earlier runs read (all of them, the
        // first time), by keyset pages so memory stays bounded.
        var copy = CopyText()
        try batch { try destination.execute("truncate import_counts") }
        try source.stream(SupabaseSource.eventCountsQuery, batch: 10_000) { rows in
            copy.removeAll()
            for row in rows {
                copy.field(row, 0)
                copy.field(row, 1)
                copy.endRow()
            }
            try batch { try destination.copyIn("copy import_counts from stdin", data: copy.bytes) }
            return 0
        }
        var done = try Int(destination.query(Self.eventsAlreadyRead)[0].decode(Int64.self, column: 0))
        report.events.read = done
        options.progress?(done, total)
        var after = "00000000-0000-0000-0000-000000000000"
        var writing = Duration.zero
        // The next batch is read and encoded on a thread of its own while this one is
        // written: the source and the destination work at the same time. The reader is
        // handed the next page of users before it needs it, so it sorts that page's events
        // while the writer still writes the last batches of this one.
        let reader = BatchReader(source: source, batchSize: options.batchSize, notImported: notImported)
        defer { reader.finish() }
        func queueNextPage() throws {
            let page = try destination.query(Self.usersToRead, after)
            guard let last = page.last else { return reader.close() }
            after = try last.decode(String.self, column: 0)
            let users = try page.map { try $0.decode(String.self, column: 0) }
            if !options.dryRun {
                // Counted again from zero as their batches commit.
                try destination.query(Self.forgetProgress, "{" + users.joined(separator: ",") + "}")
            }
            reader.add(users)
        }
        reading: while true {
            let prepared: PreparedBatch
            switch try reader.next() {
            case .needsPage:
                try queueNextPage()
                continue
            case .end: break reading
            case .batch(let batch): prepared = batch
            }
            let start = ContinuousClock.now
            try write(prepared)
            writing += ContinuousClock.now - start
            done += prepared.rows
            options.progress?(done, total)
        }
        report.events.read = done
        report.seconds["events_writing"] =
            ((Double(writing.components.seconds) + Double(writing.components.attoseconds) / 1e18) * 1000).rounded()
            / 1000
    }

    /// Forgets the counts of the users in `$1` (uuid[]): read again from zero.
    static let forgetProgress = "delete from supabase_import_progress where user_id = any($1::uuid[])"

    /// Events of users whose count already matches (read by earlier runs).
    static let eventsAlreadyRead = """
        select coalesce(sum(c.n), 0)::int8 from import_counts c join supabase_import_progress p using (user_id)
        where p.events_seen = c.n
        """

    /// The next page of users to read (`$1`: after this id).
    static let usersToRead = """
        select c.user_id::text from import_counts c left join supabase_import_progress p using (user_id)
        where c.user_id > $1::uuid and p.events_seen is distinct from c.n
        order by c.user_id limit 1000
        """

    /// Writes one prepared batch in its own transaction, then announces it.
    private func write(_ prepared: PreparedBatch) throws {
        for (id, reason, byRules) in prepared.rejects {
            report.events.rejected += 1
            reject("public.events", id, reason)
            if byRules { refusedListed.insert(id) }
        }
        let written: WrittenBatch
        do {
            written = try writeBatch(prepared, fresh: !options.dryRun)
        } catch is FreshClash {
            // An event of a user with none here clashed with one here after all (its id is
            // another user's event's, or the source holds a key twice): the batch again, with
            // every event looked up.
            written = try writeBatch(prepared, fresh: false)
        }
        report.events.imported += written.imported
        report.eventsRetimed += written.retimed
        report.events.alreadyThere += written.alreadyThere
        continuing = written.continuing
        // Announced after the commit, as a push does: running servers serve them at once.
        if !options.dryRun, !written.users.isEmpty {
            try destination.query(
                "select pg_notify($1, u) from regexp_split_to_table($2, ',') u", EventStore.channel,
                written.users.joined(separator: ","))
        }
    }

    /// What a committed batch did.
    private struct WrittenBatch {
        var imported = 0
        var retimed = 0
        var alreadyThere = 0
        /// Users whose events it inserted.
        var users: [String] = []
        /// Users it numbered in the import (`fresh`), with the last `seq` it gave them.
        var continuing: [String: Int64] = [:]
    }

    /// A fresh user's event met a unique index: the batch is rolled back and written again
    /// without numbering.
    private struct FreshClash: Error {}

    /// Per user of the batch (`$1`, uuid[]), each row locked in id order as a push locks it,
    /// so `seq` and `created_at` continue after what the user pushed, whoever commits first:
    /// id, `last_seq`, whether the user has no event here at all.
    static let lockUsers = """
        select u.id::text, u.last_seq, u.last_event_at is null and not exists (select from events e where e.user_id = u.id)
        from users u where u.id = any($1::uuid[]) order by u.id for update of u
        """

    /// Writes one batch in its own transaction. With `fresh`, the events of users that have
    /// none here yet (a first import), or whose earlier events this run numbered and nobody
    /// pushed since, get their `seq` numbered here, in source order, and go straight into
    /// `events`: nothing of theirs can be here already, and their `created_at` never goes
    /// back (the source is read in time order). The other users' events are looked up and
    /// placed by `insertEvents`.
    private func writeBatch(_ prepared: PreparedBatch, fresh: Bool) throws -> WrittenBatch {
        var written = WrittenBatch()
        try batch {
            try destination.execute("truncate import_events, import_seen")
            try destination.copyIn("copy import_seen from stdin", data: prepared.seen.bytes)
            var base: [String: Int64] = [:]  // users numbered here: their last seq
            if !prepared.users.isEmpty {
                for row in try destination.query(
                    Self.lockUsers, "{" + prepared.users.map(\.id).joined(separator: ",") + "}")
                {
                    let id = try row.decode(String.self, column: 0)
                    let lastSeq = try row.decode(Int64.self, column: 1)
                    let untouched = try row.decode(Bool.self, column: 2)
                    if fresh, (untouched && lastSeq == 0) || (lastSeq > 0 && continuing[id] == lastSeq) {
                        base[id] = lastSeq
                    }
                }
            }
            var copy = CopyText(capacity: prepared.events.bytes.count + prepared.rowEnds.count * 16)
            var row = 0
            var start = 0
            var freshRows = 0
            for (user, rows) in prepared.users {
                let first = base[user]
                for index in 0..<rows {
                    let end = prepared.rowEnds[row]
                    row += 1
                    copy.field(Int64(row))
                    if let first {
                        copy.field(first + Int64(index) + 1)
                    } else {
                        copy.field(nil as String?)
                    }
                    copy.endRow(encoded: prepared.events.bytes[start..<end])
                    start = end
                }
                if let first {
                    freshRows += rows
                    written.continuing[user] = first + Int64(rows)
                }
            }
            if !copy.isEmpty { try destination.copyIn("copy import_events from stdin", data: copy.bytes) }
            if freshRows > 0 {
                do {
                    try destination.execute(Self.insertFreshEvents)
                } catch let error as PostgresError where error.isUniqueViolation {
                    throw FreshClash()
                }
                for row in try destination.query(Self.moveFreshCursors) {
                    written.users.append(try row.decode(String.self, column: 0))
                }
                written.imported += freshRows
            }
            if freshRows < prepared.rowEnds.count {
                for row in try destination.query(Self.eventsOfMissingUsers) {
                    report.events.rejected += 1
                    reject("public.events", try row.decode(String.self, column: 0), "its user is not in trunk-sync")
                }
                // The events already here leave the batch first, found through the (user_id,
                // client_id) index one by one: a hash join would read all of `events` once
                // per batch, which grows with the import (statistics of a table being loaded
                // lag, so the planner is told, for this statement only).
                try destination.execute("set local enable_hashjoin = off; set local enable_mergejoin = off")
                written.alreadyThere += Int(
                    try destination.query(Self.dropEventsAlreadyHere)[0].decode(Int64.self, column: 0))
                try destination.execute("set local enable_hashjoin = on; set local enable_mergejoin = on")
                for row in try destination.query(Self.insertEvents) {
                    written.imported += Int(try row.decode(Int64.self, column: 1))
                    written.retimed += Int(try row.decode(Int64.self, column: 2))
                    written.users.append(try row.decode(String.self, column: 0))
                }
            }
            try destination.execute(Self.recordProgress)
        }
        return written
    }

    /// Inserts the events numbered by `writeBatch` (users with nothing here to look up).
    static let insertFreshEvents = """
        insert into events (id, user_id, seq, type, payload, client_id, client_timestamp, created_at)
        select id, user_id, seq, type, payload, client_id, client_timestamp, created_at from import_events
        where seq is not null order by ord
        """

    /// Moves the cursors of the users `insertFreshEvents` wrote to; returns their ids.
    static let moveFreshCursors = """
        update users u set last_seq = greatest(u.last_seq, f.max_seq), last_event_at = greatest(u.last_event_at, f.max_at)
        from (select user_id, max(seq) max_seq, max(created_at) max_at from import_events where seq is not null group by user_id) f
        where u.id = f.user_id
        returning u.id::text
        """

    static let eventsOfMissingUsers = """
        select s.id::text from import_events s where not exists (select from users u where u.id = s.user_id)
        """

    /// Removes from the batch the events already here (by `(user_id, client_id)`); returns
    /// how many.
    static let dropEventsAlreadyHere = """
        with gone as (
          delete from import_events s
          where s.seq is null and exists (select from events e where e.user_id = s.user_id and e.client_id = s.client_id)
          returning 1
        )
        select count(*) from gone
        """

    /// Inserts the batch's events not numbered by `writeBatch` of users that are here (the
    /// ones already here were dropped before): `seq` after the user's `last_seq` in source order; `created_at`
    /// kept, unless it is before the user's newest event here (a delta import after the
    /// user pushed to trunk-sync), then moved just after it, so `created_at > lastSync`
    /// finds it. Moves each user's cursor. Returns per user: events inserted, retimed.
    static let insertEvents = """
        with placed as (
          select s.id, s.user_id, s.type, s.payload, s.client_id, s.client_timestamp, u.last_seq + rn seq,
                 case when u.last_event_at is not null and s.created_at < u.last_event_at
                      then date_trunc('milliseconds', u.last_event_at) + rn * interval '1 millisecond'
                      else s.created_at end placed_at,
                 u.last_event_at is not null and s.created_at < u.last_event_at retimed
          from (select *, row_number() over (partition by user_id order by ord) rn from import_events where seq is null) s
          join users u on u.id = s.user_id
        ),
        ins as (
          insert into events (id, user_id, seq, type, payload, client_id, client_timestamp, created_at)
          select id, user_id, seq, type, payload, client_id, client_timestamp, placed_at from placed
          on conflict (id) do nothing
          returning user_id, seq, created_at
        ),
        per_user as (select user_id, count(*) n, max(seq) max_seq, max(created_at) max_at from ins group by user_id),
        retimed as (select user_id, count(*) filter (where retimed) n from placed group by user_id),
        moved as (
          update users u set last_seq = greatest(u.last_seq, p.max_seq), last_event_at = greatest(u.last_event_at, p.max_at)
          from per_user p where u.id = p.user_id
          returning u.id
        )
        select p.user_id::text, p.n, r.n
        from per_user p join moved on moved.id = p.user_id join retimed r on r.user_id = p.user_id
        """

    /// Counts the batch's source rows per user (imported users only: a user not imported is
    /// read again next time).
    static let recordProgress = """
        insert into supabase_import_progress (user_id, events_seen)
        select s.user_id, s.n from import_seen s where exists (select from users u where u.id = s.user_id)
        on conflict (user_id) do update
          set events_seen = supabase_import_progress.events_seen + excluded.events_seen, updated_at = now()
        """

    // MARK: - Verification

    /// Merges the source's event keys with the destination's, both in `(user_id,
    /// client_id)` order through cursors (index-only scans on both sides): constant memory
    /// whatever the size. A source key missing here is looked up again, a thousand at a
    /// time, to tell a rejected event (trunk-sync's rules refuse it) from a missing one, with
    /// the rule's reason: a rejected event this run's events phase did not read (its user's
    /// count unchanged) is listed in the reject file then, so each run's file names every
    /// event its `eventsRejected` counts. The digests are order-independent (XOR of each
    /// pair's SHA-256), so a rejected pair leaves the source's again.
    private func verify() throws {
        if !options.dryRun { try destination.execute("begin isolation level repeatable read, read only") }
        defer { if !options.dryRun { _ = try? destination.execute("commit") } }
        // The destination's keys are fetched a page ahead on a thread of their own (nothing
        // else uses that connection meanwhile), so both servers work at the same time.
        let theirs = try KeyCursor(
            destination, name: "verify_destination",
            sql: "select user_id::text, client_id::text from events order by user_id, client_id",
            ahead: true)
        defer { theirs.finish() }
        let ours = try KeyCursor(source.connection, name: "verify_source", sql: SupabaseSource.eventKeysQuery)
        var verification = SupabaseImport.Verification()
        var sourceDigest = [UInt8](repeating: 0, count: 32)
        var destinationDigest = sourceDigest
        var pending: [(user: String, client: String, hash: [UInt8])] = []
        var incompleteUsers = 0
        var lastIncomplete: String? = nil
        func xor(_ digest: inout [UInt8], _ hash: [UInt8]) { for index in 0..<32 { digest[index] ^= hash[index] } }
        func classifyPending() throws {
            guard !pending.isEmpty else { return }
            var accepted = Set<String>()
            var refused: [String: [(id: String, reason: String)]] = [:]
            let rows = try source.connection.query(
                SupabaseSource.keysRejectReasonQuery, "{" + pending.map(\.user).joined(separator: ",") + "}",
                "{" + pending.map(\.client).joined(separator: ",") + "}")
            for row in rows {
                let key = try row.decode(String.self, column: 0) + "," + row.decode(String.self, column: 1)
                if let reason = try row.decode(String?.self, column: 3) {
                    refused[key, default: []].append((try row.decode(String.self, column: 2), reason))
                } else {
                    accepted.insert(key)
                }
            }
            for key in pending {
                if accepted.contains(key.user + "," + key.client) {
                    if key.user != lastIncomplete {
                        incompleteUsers += 1
                        lastIncomplete = key.user
                        incomplete.append(key.user)
                    }
                    if verification.incompleteUsers.count < 10 || verification.incompleteUsers[key.user] != nil {
                        verification.incompleteUsers[key.user, default: 0] += 1
                    }
                } else {
                    // Refused by trunk-sync's rules: not expected, but counted and listed, so
                    // that a re-run that does not read it again still reports which it is.
                    verification.eventsExpected -= 1
                    verification.eventsRejected += 1
                    xor(&sourceDigest, key.hash)
                    for event in refused[key.user + "," + key.client] ?? []
                    where refusedListed.insert(event.id).inserted {
                        reject("public.events", event.id, event.reason + " (found by the verification)")
                    }
                }
            }
            pending.removeAll(keepingCapacity: true)
        }
        var currentUser: String? = nil
        var other = try theirs.next()
        while let (user, client) = try ours.next() {
            guard !notImported.contains(user) else { continue }
            if user != currentUser {
                currentUser = user
                verification.users += 1
            }
            verification.eventsExpected += 1
            let hash = SHA256.hash(user + "," + client)
            xor(&sourceDigest, hash)
            while let candidate = other, (candidate.0, candidate.1) < (user, client) { other = try theirs.next() }
            if let candidate = other, candidate.0 == user, candidate.1 == client {
                verification.eventsFound += 1
                xor(&destinationDigest, hash)
            } else {
                pending.append((user, client, hash))
                if pending.count >= 1000 { try classifyPending() }
            }
        }
        try classifyPending()
        verification.usersComplete = verification.users - incompleteUsers
        verification.sourceDigest = Hex.encode(sourceDigest)
        verification.destinationDigest = Hex.encode(destinationDigest)
        report.verification = verification
    }
}

/// Rows `(user_id, client_id)` from a cursor, fetched in pages; with `ahead`, the next page
/// is fetched on a thread of its own while this one is read (at most one page waits), and
/// `finish` stops that thread and waits for it to end.
private final class KeyCursor: @unchecked Sendable {  // the fetcher's state guarded by `condition`
    let connection: PostgresConnection
    let name: String
    var page: PostgresResult? = nil
    var index = 0
    var exhausted = false
    private static let pageSize = 10_000
    // The fetching thread's hand-over.
    private let condition = NSCondition()
    private var fetched: [PostgresResult] = []
    private var fetchFailure: Error? = nil
    private var fetchEnded = true
    private var stopping = false
    private let ahead: Bool

    init(_ connection: PostgresConnection, name: String, sql: String, ahead: Bool = false) throws {
        self.connection = connection
        self.name = name
        self.ahead = ahead
        try connection.execute("declare \(name) no scroll cursor for \(sql)")
        guard ahead else { return }
        fetchEnded = false
        startThread(name: "import-fetch", stackSize: 1 << 20) { [self] in
            do {
                while true {
                    let result = try self.connection.query("fetch forward \(Self.pageSize) from \(self.name)")
                    condition.lock()
                    while !fetched.isEmpty && !stopping { condition.wait() }
                    let stop = stopping
                    if !stop { fetched.append(result) }
                    condition.broadcast()
                    condition.unlock()
                    if stop || result.count < Self.pageSize { break }
                }
            } catch {
                condition.lock()
                fetchFailure = error
                condition.unlock()
            }
            condition.lock()
            fetchEnded = true
            condition.broadcast()
            condition.unlock()
        }
    }

    /// Stops the fetching thread, if there is one, and waits until it ended.
    func finish() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while !fetchEnded { condition.wait() }
        condition.unlock()
    }

    private func fetchPage() throws -> PostgresResult {
        guard ahead else { return try connection.query("fetch forward \(Self.pageSize) from \(name)") }
        condition.lock()
        defer { condition.unlock() }
        while fetched.isEmpty && !fetchEnded { condition.wait() }
        if let fetchFailure { throw fetchFailure }
        guard !fetched.isEmpty else { throw CancellationError() }  // finished: nothing more comes
        condition.broadcast()
        return fetched.removeFirst()
    }

    func next() throws -> (String, String)? {
        if page == nil || index >= page?.count ?? 0 {
            guard !exhausted else { return nil }
            let fetched = try fetchPage()
            if fetched.count < Self.pageSize { exhausted = true }
            page = fetched
            index = 0
            if fetched.isEmpty { return nil }
        }
        guard let page else { return nil }
        let row = page[index]
        index += 1
        return (try row.decode(String.self, column: 0), try row.decode(String.self, column: 1))
    }
}

/// One batch of source events, encoded for COPY, with its rejects.
struct PreparedBatch: Sendable {
    /// Source rows the batch holds (rejected ones included).
    var rows = 0
    /// The rows to import, their columns user_id … created_at encoded for COPY, each row
    /// with its newline (`writeBatch` puts `ord` and `seq` before them).
    var events = CopyText()
    /// Where each of those rows ends in `events.bytes`.
    var rowEnds: [Int] = []
    /// The users of those rows in order, with how many rows (consecutive) each has.
    var users: [(id: String, rows: Int)] = []
    /// `import_seen` rows: source rows per user.
    var seen = CopyText(capacity: 4096)
    /// Rejected rows: source id, reason, whether trunk-sync's rules refuse it (else its
    /// user was not imported).
    var rejects: [(id: String, reason: String, byRules: Bool)] = []
}

/// Reads the events of the pages of users it is given (`add`, until `close`) from the
/// source on a thread of its own and hands over encoded batches, at most two ahead of the
/// writer (bounded memory), and at most one page waiting. `finish` stops it and waits for
/// its thread to end.
final class BatchReader: @unchecked Sendable {  // state guarded by `condition`
    private let condition = NSCondition()
    private var ready: [PreparedBatch] = []
    private var pages: [[String]] = []
    private var closed = false
    private var ended = false
    private var failure: Error? = nil
    private var stopping = false
    private var threadEnded = false
    private static let ahead = 2

    init(source: SupabaseSource, batchSize: Int, notImported: Set<String>) {
        let source = UncheckedBox(source)
        startThread(name: "import-read", stackSize: 1 << 22) { [self] in
            do {
                while let users = nextPage() {
                    try source.value.stream(
                        SupabaseSource.eventsQuery, binds: ["{" + users.joined(separator: ",") + "}"], batch: batchSize
                    ) { rows in
                        let prepared = try Self.prepare(rows, notImported: notImported)
                        let bytes = prepared.events.bytes.count
                        condition.lock()
                        defer { condition.unlock() }
                        while ready.count >= Self.ahead && !stopping { condition.wait() }
                        if stopping { throw CancellationError() }
                        ready.append(prepared)
                        condition.broadcast()
                        return bytes
                    }
                }
            } catch {
                condition.lock()
                if !(error is CancellationError) { failure = error }
                condition.unlock()
            }
            condition.lock()
            ended = true
            threadEnded = true
            condition.broadcast()
            condition.unlock()
        }
    }

    /// The next page to read, waiting for one; nil once closed (or stopping) and none is left.
    private func nextPage() -> [String]? {
        condition.lock()
        defer { condition.unlock() }
        while pages.isEmpty && !closed && !stopping { condition.wait() }
        if stopping || pages.isEmpty { return nil }
        let page = pages.removeFirst()
        condition.broadcast()
        return page
    }

    /// Queues a page of users to read after the ones before.
    func add(_ users: [String]) {
        condition.lock()
        pages.append(users)
        condition.broadcast()
        condition.unlock()
    }

    /// No more pages: the reader ends after the queued ones.
    func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        condition.unlock()
    }

    enum Next {
        /// An encoded batch to write.
        case batch(PreparedBatch)
        /// No page is waiting: `add` one (or `close`), then ask again.
        case needsPage
        /// Every page was read.
        case end
    }

    /// What the writer does next; rethrows the reader's error. It waits only while a page
    /// is queued or the reader was closed, so the two never wait for each other.
    func next() throws -> Next {
        condition.lock()
        defer { condition.unlock() }
        while ready.isEmpty && !ended && (!pages.isEmpty || closed) { condition.wait() }
        if let failure { throw failure }
        if pages.isEmpty && !closed && !ended { return .needsPage }
        if ready.isEmpty { return .end }
        let batch = ready.removeFirst()
        condition.broadcast()
        return .batch(batch)
    }

    /// Stops the reader (if it still runs) and waits until its thread ended.
    func finish() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while !threadEnded { condition.wait() }
        condition.unlock()
    }

    private static func prepare(_ rows: PostgresResult, notImported: Set<String>) throws -> PreparedBatch {
        var prepared = PreparedBatch()
        prepared.rows = rows.count
        var seen: [String: Int] = [:]
        for row in rows {
            let user = try row.decode(String.self, column: 0)
            seen[user, default: 0] += 1
            if let reason = try row.decode(String?.self, column: 7) {
                prepared.rejects.append((try row.decode(String.self, column: 1), reason, true))
                continue
            }
            if notImported.contains(user) {
                prepared.rejects.append((try row.decode(String.self, column: 1), "its user was not imported", false))
                continue
            }
            for column in 0...6 { prepared.events.field(row, column) }
            prepared.events.endRow()
            prepared.rowEnds.append(prepared.events.bytes.count)
            if prepared.users.last?.id == user {
                prepared.users[prepared.users.count - 1].rows += 1
            } else {
                prepared.users.append((user, 1))
            }
        }
        for (user, count) in seen {
            prepared.seen.field(user)
            prepared.seen.field(Int64(count))
            prepared.seen.endRow()
        }
        return prepared
    }
}

/// Hands a value that is used by one thread at a time to another thread.
private struct UncheckedBox<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}
