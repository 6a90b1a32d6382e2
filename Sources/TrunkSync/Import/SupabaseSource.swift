import Foundation
import JSON
import Postgres

/// What `trunk-sync import supabase` reads from a hosted Supabase project's database, and the
/// SQL that reads it (the one place for it). Everything is read in one read-only,
/// repeatable-read transaction, so every phase sees the same snapshot.
struct SupabaseSource {
    let connection: PostgresConnection
    /// Whether `public.profiles` exists with `id` and `full_name`.
    private(set) var hasProfiles = false
    /// Whether `auth.sessions` has the signed refresh tokens' columns.
    private(set) var hasSignedRefreshTokens = false
    /// Whether `auth.users` has `banned_until` and `deleted_at` (soft deletion), which every
    /// current Supabase Auth has.
    private(set) var hasBannedUntil = false
    private(set) var hasDeletedAt = false

    /// The columns read, per table; a source without one of them is refused naming it.
    static let required: [(table: String, columns: [String])] = [
        (
            "auth.users",
            ["id", "email", "created_at", "updated_at", "email_confirmed_at", "last_sign_in_at", "raw_user_meta_data"]
        ),
        ("auth.sessions", ["id", "user_id", "created_at", "not_after", "aal"]),
        ("auth.refresh_tokens", ["token", "session_id", "revoked", "parent"]),
        ("public.events", ["id", "user_id", "type", "payload", "client_id", "client_timestamp", "created_at"]),
    ]

    /// Opens the snapshot and checks the schema and the login's rights.
    init(url: String) throws {
        let configuration: PostgresConfiguration
        do {
            configuration = try PostgresConfiguration(url)
        } catch {
            throw ImportError.source("the --from URL is not a PostgreSQL URL or conninfo string: \(error)")
        }
        do {
            connection = try PostgresConnection.connect(configuration)
        } catch {
            throw ImportError.source("\(error)")
        }
        try connection.execute(
            // A hosted role may carry timeouts meant for API requests; the snapshot stays open
            // for the whole import, idle while batches are written.
            "set timezone = 'UTC'; set datestyle = 'ISO, YMD'; set intervalstyle = 'postgres'; set extra_float_digits = 3;"
                + " set statement_timeout = 0; set idle_in_transaction_session_timeout = 0;"
                + " begin isolation level repeatable read, read only")
        try checkSchema()
    }

    private mutating func checkSchema() throws {
        let rows = try connection.query(
            """
            select table_schema || '.' || table_name, column_name from information_schema.columns
            where (table_schema, table_name) in (('auth', 'users'), ('auth', 'sessions'), ('auth', 'refresh_tokens'),
                                                 ('public', 'events'), ('public', 'profiles'))
            """)
        var columns: [String: Set<String>] = [:]
        for row in rows {
            columns[try row.decode(String.self, column: 0), default: []].insert(try row.decode(String.self, column: 1))
        }
        guard columns["auth.users"] != nil else {
            throw ImportError.source(
                "the source has no table auth.users (or this login cannot read it): is --from a Supabase project's database?"
            )
        }
        for (table, needed) in Self.required {
            guard let present = columns[table] else {
                throw ImportError.source("the source has no table \(table) (or this login cannot read it)")
            }
            let missing = needed.filter { !present.contains($0) }
            if !missing.isEmpty {
                throw ImportError.source("the source's \(table) lacks column(s) \(missing.joined(separator: ", "))")
            }
        }
        hasProfiles = columns["public.profiles"].map { $0.contains("id") && $0.contains("full_name") } ?? false
        hasBannedUntil = columns["auth.users"]?.contains("banned_until") ?? false
        hasDeletedAt = columns["auth.users"]?.contains("deleted_at") ?? false
        hasSignedRefreshTokens =
            columns["auth.sessions"].map {
                $0.contains("refresh_token_hmac_key") && $0.contains("refresh_token_counter")
            } ?? false
        // auth.users has row-level security and no policy: a login that does not bypass it
        // reads no users at all, which would look like an empty project.
        let role = try connection.query(
            "select current_user::text, rolsuper or rolbypassrls from pg_roles where rolname = current_user")
        if let row = role.first, try !row.decode(Bool.self, column: 1) {
            throw ImportError.source(
                "the source login \(try row.decode(String.self, column: 0)) does not bypass row-level security, so auth.users would look empty: use the project's postgres role"
            )
        }
    }

    /// Bytes of rows one fetch aims at: the next fetch takes fewer rows when they are large
    /// (payloads go up to 64 KiB), so memory stays bounded whatever the rows hold.
    static let fetchBytes = 8 << 20

    /// Runs `body` over the rows of `sql` (text columns only), at most `batch` rows at a time,
    /// through a cursor, so memory stays bounded whatever the table's size. `body` returns
    /// the bytes the rows made (0: unknown), which sizes the next fetch.
    func stream(
        _ sql: String, binds: [any PostgresEncodable] = [], batch: Int, _ body: (PostgresResult) throws -> Int
    ) throws {
        try connection.query("declare import_cursor no scroll cursor for " + sql, binds: binds.map { $0.postgresBind })
        defer { _ = try? connection.execute("close import_cursor") }
        var count = batch
        while true {
            let rows = try connection.query("fetch forward \(count) from import_cursor")
            if rows.isEmpty { break }
            let bytes = try body(rows)
            if rows.count < count { break }
            if bytes > 0 { count = max(100, min(batch, Self.fetchBytes / max(1, bytes / rows.count))) }
        }
    }

    // MARK: - The queries (every column as text, to be copied on as it came)

    /// Users, with the profile's `full_name` where there is one. Columns: id, email,
    /// created_at, updated_at, email_confirmed_at, last_sign_in_at, metadata (a JSON object,
    /// `{}` when the source's is not one), profile full_name, reject reason (a user the
    /// hosted project deleted softly or banned cannot sign in there: nor here, nor by the
    /// sessions Supabase keeps for them).
    var usersQuery: String {
        let profile = hasProfiles ? "(select p.full_name::text from public.profiles p where p.id = u.id)" : "null::text"
        let deleted = hasDeletedAt ? "when u.deleted_at is not null then 'deleted on the hosted project'" : ""
        let banned =
            hasBannedUntil
            ? "when u.banned_until > now() then 'banned on the hosted project until ' || u.banned_until::text" : ""
        return """
            select u.id::text, lower(u.email), u.created_at::text, coalesce(u.updated_at, u.created_at)::text,
                   u.email_confirmed_at::text, u.last_sign_in_at::text,
                   case when jsonb_typeof(u.raw_user_meta_data) = 'object' then u.raw_user_meta_data::text else '{}' end,
                   \(profile),
                   case \(deleted)
                        \(banned)
                        when u.email is null or u.email = '' then 'no email address'
                        when u.created_at is null or not isfinite(u.created_at) then 'created_at missing or not finite'
                   end
            from auth.users u order by u.id
            """
    }

    /// Per-user counts of events: user id, count.
    static let eventCountsQuery = "select user_id::text, count(*)::text from public.events group by user_id"

    /// Total number of events (for progress).
    static let eventTotalQuery = "select count(*) from public.events"

    /// A JSON path finding a number a push would refuse (`JSONScanner`: I-JSON) that `jsonb`
    /// keeps: one that rounds to an infinite double, or a non-zero one that rounds to zero.
    /// Pulled, it would stop a client whose decoder reads numbers as doubles (Swift's) at
    /// that page for good. Thresholds: the largest double plus half its ulp, half the
    /// smallest subnormal.
    static let outsideDoubles =
        "strict $.** ? (@.type() == \"number\" && (@ >= $max || @ <= -$max"
        + " || (@ != 0 && @ * $inverse <= 1 && @ * $inverse >= -1)))"

    /// `outsideDoubles`' bounds (its `vars`), exact as `numeric`: 2^1024 − 2^970, the largest
    /// double plus half its ulp (at or above, strtod rounds to infinity), and 2^1075, one
    /// over half the smallest subnormal (a non-zero number at most that small rounds to 0).
    static let doubleBounds =
        "jsonb_build_object('max', 2::numeric ^ 1024 - 2::numeric ^ 970, 'inverse', 2::numeric ^ 1075)"

    /// A JSON path finding an object or array nested `levels` deep or deeper (the value
    /// itself is level 0): a value nested more than `levels` levels.
    static func nestedDeeper(than levels: Int) -> String {
        "strict $.**{\(levels) to last} ? (@.type() == \"object\" || @.type() == \"array\")"
    }

    /// Why trunk-sync cannot take `metadata` (a `jsonb` SQL expression) as a user's
    /// `user_metadata`, as SQL text (null: it can): every access token carries it, and a
    /// token must fit in a request's headers (`UserRecord.maxMetadataBytes`) and verify
    /// (`Tokens.Claims` reads it at most `JSONLimits` 64 levels deep, the claims object one
    /// of them, and refuses a number no double holds).
    static func metadataRejectReason(_ metadata: String) -> String {
        """
        case when octet_length((\(metadata))::text) > \(UserRecord.maxMetadataBytes)
               then 'user_metadata takes ' || octet_length((\(metadata))::text) || ' bytes; trunk-sync takes at most \(UserRecord.maxMetadataBytes)'
             when jsonb_path_exists(\(metadata), '\(nestedDeeper(than: UserRecord.maxMetadataDepth))')
               then 'user_metadata is nested more than \(UserRecord.maxMetadataDepth) levels deep'
             when jsonb_path_exists(\(metadata), '\(outsideDoubles)', \(doubleBounds))
               then 'user_metadata holds a number no IEEE double holds (I-JSON)'
        end
        """
    }

    /// Why trunk-sync's own rules would refuse an event (nil: they accept it), as SQL.
    static func eventRejectReason(_ e: String) -> String {
        """
        case when \(e).client_id is null then 'client_id is null'
             when \(e).type is null or char_length(\(e).type) not between 1 and \(EventInput.maxTypeLength) then 'type is not 1 to \(EventInput.maxTypeLength) characters'
             when jsonb_typeof(\(e).payload) is distinct from 'object' then 'payload is not a JSON object'
             when octet_length(\(e).payload::text) > \(EventInput.maxPayloadBytes) then 'payload is over \(EventInput.maxPayloadBytes) bytes'
             when jsonb_path_exists(\(e).payload, '\(nestedDeeper(than: EventInput.maxPayloadDepth))')
               then 'payload is nested more than \(EventInput.maxPayloadDepth) levels deep'
             when jsonb_path_exists(\(e).payload, '\(outsideDoubles)', \(doubleBounds)) then 'payload has a number no IEEE double holds (I-JSON)'
             when \(e).client_timestamp is null or not isfinite(\(e).client_timestamp)
                  or \(e).client_timestamp < '0001-01-01T00:00:00Z' or \(e).client_timestamp >= '10000-01-01T00:00:00Z'
               then 'client_timestamp is out of range'
             when \(e).created_at is null or not isfinite(\(e).created_at)
                  or \(e).created_at < '0001-01-01T00:00:00Z' or \(e).created_at >= '10000-01-01T00:00:00Z'
               then 'created_at is out of range'
        end
        """
    }

    /// The events of the users in `$1` (uuid[]), each user's in the source's order (time,
    /// then id). Columns: user_id, id, type, payload (null when rejected: an oversized one
    /// is not transferred), client_id, client_timestamp, created_at, reject reason.
    static let eventsQuery = """
        select user_id, id, type, case when reason is null then payload end, client_id, client_timestamp, created_at, reason
        from (select e.user_id::text, e.id::text, e.type, e.payload::text, e.client_id::text,
                     e.client_timestamp::text, e.created_at::text, \(eventRejectReason("e")) as reason, e.created_at as t, e.id as i
              from public.events e where e.user_id = any($1::uuid[])) e
        order by e.user_id, e.t, e.i
        """

    /// Every event's key in key order (the verification pass; the source's unique index on
    /// them serves it). Columns: user_id, client_id.
    static let eventKeysQuery = """
        select e.user_id::text, e.client_id::text from public.events e where e.client_id is not null
        order by e.user_id, e.client_id
        """

    /// The events of the keys `($1[i], $2[i])` (uuid[]s), with why trunk-sync's rules refuse
    /// each (`eventRejectReason`, the events phase's words; null: they accept it). Columns:
    /// user_id, client_id, id, reject reason.
    static let keysRejectReasonQuery = """
        select e.user_id::text, e.client_id::text, e.id::text, \(eventRejectReason("e"))
        from unnest($1::uuid[], $2::uuid[]) k(user_id, client_id)
        join public.events e on e.user_id = k.user_id and e.client_id = k.client_id
        """

    /// Every session with whether it has not ended (not past `not_after`: the import takes
    /// those, and ends here the sessions it imported that are missing or ended) and its live
    /// opaque refresh tokens. Columns: id, user_id, created_at, aal, HMAC key (signed
    /// tokens), counter, not ended, the live opaque tokens (`tokensJSON`'s JSON array of
    /// `[token, parent]`, null when there is none).
    ///
    /// The tokens come with their session, grouped once over `auth.refresh_tokens` (one
    /// pass, by `refresh_tokens_session_id_revoked_idx` where it exists, by a scan and a
    /// sort or hash otherwise), not looked up per batch of sessions: a look-up by
    /// `session_id` is a scan of the whole table on a source without that index, once per
    /// batch — the sessions phase grew with the square of the sessions (bench/README.md,
    /// session 16).
    var sessionsQuery: String {
        let signed =
            hasSignedRefreshTokens
            ? "s.refresh_token_hmac_key::text, s.refresh_token_counter::text" : "null::text, null::text"
        return """
            select s.id::text, s.user_id::text, coalesce(s.created_at, now())::text, coalesce(s.aal::text, 'aal1'), \(signed),
                   s.not_after is null or s.not_after > now(), t.tokens
            from auth.sessions s
            left join (\(Self.tokensJSON)) t on t.session_id = s.id
            order by s.id
            """
    }

    /// Each session's live opaque refresh tokens, as a JSON array of `[token, parent]` (the
    /// token it was rotated from: null, or empty, for a session's first). Columns:
    /// session_id, tokens.
    static let tokensJSON = """
        select t.session_id, json_agg(json_build_array(t.token::text, nullif(t.parent::text, '')))::text tokens
        from auth.refresh_tokens t
        where t.session_id is not null and not coalesce(t.revoked, false) and t.token is not null
        group by t.session_id
        """

    /// The `[token, parent]` pairs of `sessionsQuery`'s tokens column.
    static func tokens(_ json: String) throws -> [(token: String, parent: String?)] {
        let value: JSONValue
        do {
            value = try JSONValue.parse(Array(json.utf8))
        } catch {
            throw ImportError.source("auth.refresh_tokens: a session's live tokens did not read as JSON (\(error))")
        }
        guard case .array(let pairs) = value else {
            throw ImportError.source("auth.refresh_tokens: a session's live tokens did not read as a JSON array")
        }
        return try pairs.map { pair in
            guard case .array(let parts) = pair, parts.count == 2, case .string(let token) = parts[0] else {
                throw ImportError.source("auth.refresh_tokens: a session's live token did not read as [token, parent]")
            }
            if case .string(let parent) = parts[1] { return (token, parent) }
            return (token, nil)
        }
    }
}
