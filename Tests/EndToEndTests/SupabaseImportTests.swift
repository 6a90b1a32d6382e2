import Foundation
import Postgres
import TestSupport
import TrunkCrypto
import XCTest

#if canImport(Glibc)
    import Glibc
#endif

/// `trunk-sync import supabase` end to end: a Supabase-shaped source database in the test
/// cluster (Supabase Auth's tables as its migrations define the columns read, the cloud-sync
/// plan's `events` with its row-level security, a `profiles` table), read by a login that is
/// not a superuser but bypasses row-level security, as a hosted project's `postgres` role;
/// the real binary imports into a running server's database; sessions issued "by Supabase"
/// then continue against trunk-sync.
final class SupabaseImportTests: EndToEndTestCase {
    static let hostedIssuer = "https://abcdefghijklmnop.supabase.co/auth/v1"

    var sources: [PostgresConfiguration] = []
    var roles: [String] = []
    var files: [String] = []

    override func tearDown() {
        super.tearDown()
        for source in sources { try? TestDatabase.drop(source) }
        for role in roles { TestDatabase.dropRole(role) }
        for file in files { try? FileManager.default.removeItem(atPath: file) }
    }

    // MARK: - The source

    struct Source {
        let admin: PostgresConnection
        let url: String
        let configuration: PostgresConfiguration
    }

    /// The schema a hosted project has for what the import reads (Supabase Auth's migrations,
    /// reduced to these tables; the cloud-sync plan's `events` and `profiles`).
    static let schema = """
        create schema auth;
        create type auth.aal_level as enum ('aal1', 'aal2', 'aal3');
        create function auth.uid() returns uuid language sql stable
          as $$ select nullif(current_setting('request.jwt.claim.sub', true), '')::uuid $$;
        create table auth.users (
          instance_id uuid, id uuid not null primary key, aud varchar(255), role varchar(255), email varchar(255),
          encrypted_password varchar(255), email_confirmed_at timestamptz, invited_at timestamptz,
          confirmation_token varchar(255), recovery_token varchar(255), last_sign_in_at timestamptz,
          raw_app_meta_data jsonb, raw_user_meta_data jsonb, is_super_admin bool, created_at timestamptz,
          updated_at timestamptz, phone text unique default null, phone_confirmed_at timestamptz,
          banned_until timestamptz, deleted_at timestamptz, is_sso_user boolean not null default false,
          is_anonymous boolean not null default false);
        alter table auth.users enable row level security;
        create table auth.identities (
          provider_id text not null, user_id uuid not null references auth.users (id) on delete cascade,
          identity_data jsonb not null, provider text not null, last_sign_in_at timestamptz, created_at timestamptz,
          updated_at timestamptz, email text generated always as (lower(identity_data->>'email')) stored,
          id uuid not null default gen_random_uuid() primary key, unique (provider_id, provider));
        create table auth.sessions (
          id uuid not null primary key, user_id uuid not null references auth.users (id) on delete cascade,
          created_at timestamptz, updated_at timestamptz, factor_id uuid, aal auth.aal_level, not_after timestamptz,
          refreshed_at timestamp, user_agent text, ip inet, tag text, oauth_client_id uuid,
          refresh_token_hmac_key text, refresh_token_counter bigint, scopes text);
        create table auth.refresh_tokens (
          instance_id uuid, id bigserial primary key, token varchar(255) unique, user_id varchar(255), revoked bool,
          created_at timestamptz, updated_at timestamptz, parent varchar(255),
          session_id uuid references auth.sessions (id) on delete cascade);
        create table public.profiles (
          id uuid primary key references auth.users (id) on delete cascade, full_name text, updated_at timestamptz);
        alter table public.profiles enable row level security;
        create policy "own profile" on public.profiles for all using (auth.uid() = id);
        create table public.events (
          id uuid primary key default gen_random_uuid(),
          user_id uuid not null references auth.users (id) on delete cascade,
          type text not null, payload jsonb not null default '{}', client_id uuid not null,
          client_timestamp timestamptz not null, created_at timestamptz not null default now(),
          unique (user_id, client_id));
        create index events_user_created on public.events (user_id, created_at);
        alter table public.events enable row level security;
        create policy "own events" on public.events for all using (auth.uid() = user_id) with check (auth.uid() = user_id);
        """

    /// A fresh source database with the schema, and a login like a hosted project's
    /// `postgres`: not a superuser, BYPASSRLS (or not, to test the refusal).
    func makeSource(bypassRLS: Bool = true, schema: String = SupabaseImportTests.schema) throws -> Source {
        let configuration = try TestDatabase.create(prefix: "supa")
        sources.append(configuration)
        let admin = try PostgresConnection.connect(configuration)
        try admin.execute(schema)
        let role = TestDatabase.roleName("supa")
        roles.append(role)
        let password = "pw-\(UUID().uuidString.prefix(8))"
        try admin.execute(
            """
            create role \(role) login password '\(password)' \(bypassRLS ? "bypassrls" : "nobypassrls");
            grant usage on schema public to \(role);
            grant select on all tables in schema public to \(role);
            do $$ begin
              if exists (select from pg_namespace where nspname = 'auth') then
                grant usage on schema auth to \(role);
                grant select on all tables in schema auth to \(role);
              end if;
            end $$;
            """)
        return Source(
            admin: admin,
            url: try TestDatabase.url(of: configuration, user: role, password: password) + "?sslmode=prefer",
            configuration: configuration)
    }

    @discardableResult
    func addUser(
        _ source: Source, email: String, metadata: String = "{}", created: String = "2026-01-02 03:04:05.123456+00"
    )
        throws -> UUID
    {
        let id = UUID()
        try source.admin.query(
            """
            insert into auth.users (instance_id, id, aud, role, email, email_confirmed_at, last_sign_in_at,
                                    raw_app_meta_data, raw_user_meta_data, created_at, updated_at)
            values ('00000000-0000-0000-0000-000000000000', $1, 'authenticated', 'authenticated', $2, $3::timestamptz,
                    $3::timestamptz, '{"provider":"email","providers":["email"]}', $4::jsonb, $3::timestamptz, $3::timestamptz)
            """, id, email, created, metadata)
        try source.admin.query(
            """
            insert into auth.identities (provider_id, user_id, identity_data, provider, created_at)
            values ($1::text, $1, jsonb_build_object('sub', $1::text, 'email', $2::text), 'email', now())
            """, id, email)
        return id
    }

    /// Adds events: (type, payload JSON, created_at text).
    func addEvents(_ source: Source, user: UUID, _ events: [(String, String, String)]) throws -> [UUID] {
        var clients: [UUID] = []
        for (type, payload, created) in events {
            let client = UUID()
            clients.append(client)
            try source.admin.query(
                """
                insert into public.events (user_id, type, payload, client_id, client_timestamp, created_at)
                values ($1, $2, $3::jsonb, $4, $5::timestamptz, $5::timestamptz)
                """, user, type, payload, client, created)
        }
        return clients
    }

    /// A live session with opaque refresh tokens (`tokens` in order, all but the last revoked).
    func addOpaqueSession(_ source: Source, user: UUID, tokens: [String], notAfter: String? = nil) throws -> UUID {
        let session = UUID()
        try source.admin.query(
            "insert into auth.sessions (id, user_id, created_at, updated_at, aal, not_after) values ($1, $2, now(), now(), 'aal1', $3::timestamptz)",
            session, user, notAfter)
        for (index, token) in tokens.enumerated() {
            try source.admin.query(
                """
                insert into auth.refresh_tokens (instance_id, token, user_id, revoked, created_at, updated_at, parent, session_id)
                values ('00000000-0000-0000-0000-000000000000', $1, $2::text, $3, now(), now(), $4, $5)
                """, token, user, index < tokens.count - 1, index > 0 ? tokens[index - 1] : nil, session)
        }
        return session
    }

    /// A live session with signed refresh tokens; returns it and the token its client holds.
    func addSignedSession(_ source: Source, user: UUID, counter: UInt64, storedKey: String? = nil) throws -> (
        UUID, String
    ) {
        let session = UUID()
        let key = (0..<32).map { _ in UInt8.random(in: 0...255) }
        try source.admin.query(
            """
            insert into auth.sessions (id, user_id, created_at, updated_at, aal, refresh_token_hmac_key, refresh_token_counter)
            values ($1, $2, now(), now(), 'aal1', $3, $4)
            """, session, user, storedKey ?? Base64URL.encode(key), Int64(counter))
        return (session, Self.signedToken(session: session, counter: counter, key: key))
    }

    /// The signed form, written from the format's description (supabase/auth
    /// internal/crypto/refresh_tokens.go), independently of the product's encoder.
    static func signedToken(session: UUID, counter: UInt64, key: [UInt8]) -> String {
        var message: [UInt8] = [0x00]
        let u = session.uuid
        message += [u.0, u.1, u.2, u.3, u.4, u.5, u.6, u.7, u.8, u.9, u.10, u.11, u.12, u.13, u.14, u.15]
        var value = counter
        repeat {
            let low = UInt8(value & 0x7f)
            value >>= 7
            message.append(value == 0 ? low : low | 0x80)
        } while value != 0
        let signature = Array(HMAC.sha256(key: key, message: message)[0..<16])
        let checksum = Array(SHA256.hash(message + signature)[0..<4])
        return Base64URL.encode(message + signature + checksum)
    }

    /// An access token as the hosted project signs it: HS256 with its JWT secret and a `kid`.
    static func hostedAccessToken(user: UUID, session: UUID, email: String) -> String {
        let now = Int64(Date().timeIntervalSince1970)
        let sub = user.uuidString.lowercased()
        let claims = """
            {"iss":"\(hostedIssuer)","sub":"\(sub)","aud":"authenticated","exp":\(now + 3600),"iat":\(now),\
            "email":"\(email)","phone":"","app_metadata":{"provider":"email","providers":["email"]},\
            "user_metadata":{"email":"\(email)","email_verified":true,"phone_verified":false,"sub":"\(sub)"},\
            "role":"authenticated","aal":"aal1","amr":[{"method":"otp","timestamp":\(now)}],\
            "session_id":"\(session.uuidString.lowercased())","is_anonymous":false}
            """
        return JWT.sign(
            payload: Array(claims.utf8), with: JWT.HS256Key(secret: ServerProcess.jwtSecret, keyID: "hostedKid1"))
    }

    // MARK: - Running the command

    /// A new reject file's path, removed after the test.
    func rejectPath() -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("rejects-\(UUID().uuidString).jsonl")
            .path
        files.append(path)
        return path
    }

    func importCommand(_ server: ServerProcess, from url: String, _ extra: [String] = []) throws -> (
        Command.Result, [String: Any]?, String
    ) {
        let rejectFile = rejectPath()
        let result = try Command.run(
            Command.trunkSyncBinary(),
            ["import", "supabase", "--from", url, "--json", "--reject-file", rejectFile] + extra,
            environment: server.environment)
        let report = (try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8))) as? [String: Any]
        return (result, report, rejectFile)
    }

    /// The reject file's lines, each `{"table", "id", "reason"}`.
    func rejectLines(_ path: String) throws -> [[String: String]] {
        try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: String]
        }
    }

    func counts(_ report: [String: Any]?, _ table: String) -> [String: Int] {
        (report?[table] as? [String: Any])?.compactMapValues { $0 as? Int } ?? [:]
    }

    func destination(_ server: ServerProcess) throws -> PostgresConnection {
        try PostgresConnection.connect(server.database)
    }

    func startServer() throws -> ServerProcess {
        try startServer(["TRUNK_SYNC_ACCEPTED_ISSUERS": "https://other.example/auth/v1, \(Self.hostedIssuer)"])
    }

    // MARK: - Tests

    func testImportKeepsUsersEventsAndSessionsAndRejectsWhatTrunkSyncRefuses() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "Ada@Example.com", metadata: #"{"full_name":"Ada Meta","theme":"dark"}"#)
        try source.admin.query("insert into public.profiles (id, full_name) values ($1, 'Ada Lovelace')", ada)
        let bob = try addUser(source, email: "bob@example.com", metadata: #"{"full_name":"Bob"}"#)
        let carol = try addUser(source, email: "carol@example.com")
        let dup = try addUser(source, email: "dup@example.com")
        // Two events share a created_at: the tie goes by id.
        let adaClients = try addEvents(
            source, user: ada,
            [
                ("sprout_planted", #"{"n":1}"#, "2026-03-01 10:00:00.123456+00"),
                ("sprout_watered", #"{"n":2}"#, "2026-03-01 10:00:01.654321+00"),
                ("sprout_watered", #"{"n":3}"#, "2026-03-01 10:00:01.654321+00"),
                ("leaf_grown", #"{"n":4,"text":"tab\tand\\backslash\nnewline"}"#, "2026-03-02 08:00:00.000001+00"),
            ])
        _ = try addEvents(source, user: bob, [("sprout_planted", "{}", "2026-03-01 11:00:00.5+00")])
        let rejected = try addEvents(
            source, user: bob,
            [
                ("array_payload", "[1,2]", "2026-03-01 12:00:00+00"),
                ("big_payload", #"{"s":"\#(String(repeating: "x", count: 70_000))"}"#, "2026-03-01 12:00:01+00"),
                (String(repeating: "t", count: 129), "{}", "2026-03-01 12:00:02+00"),
                // Numbers no IEEE double holds (jsonb keeps them): a client could not read them.
                ("huge_number", #"{"n":1e400}"#, "2026-03-01 12:00:04+00"),
                ("vanishing_number", #"{"a":[{"x":-1e-400}]}"#, "2026-03-01 12:00:05+00"),
            ])
        // The extremes a double holds are kept, as a push keeps them.
        _ = try addEvents(
            source, user: bob, [("extreme_numbers", #"{"n":1e308,"m":-5e-324,"z":0.000}"#, "2026-03-01 12:00:06+00")])
        let infinite = UUID()
        try source.admin.query(
            """
            insert into public.events (user_id, type, payload, client_id, client_timestamp, created_at)
            values ($1, 'far_future', '{}', $2, 'infinity', '2026-03-01 12:00:03+00')
            """, bob, infinite)
        _ = try addEvents(source, user: dup, [("x", "{}", "2026-03-01 13:00:00+00")])
        let adaSession = try addOpaqueSession(source, user: ada, tokens: ["adaToken00", "adaToken01"])
        _ = try addOpaqueSession(source, user: ada, tokens: ["adaExpired"], notAfter: "2026-01-01 00:00:00+00")
        let (bobSession, bobToken) = try addSignedSession(source, user: bob, counter: 300)
        _ = try addSignedSession(
            source, user: carol, counter: 1,
            storedKey: #"{"key_id":"k1","alg":"aes-gcm-hkdf","nonce":"bm9uY2U","data":"c2VhbGVk"}"#)

        let server = try startServer()
        let other = UUID()
        try destination(server).query("insert into users (id, email) values ($1, 'dup@example.com')", other)

        let (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, "rejects and a conflict exit 3; stderr: \(result.stderr)\n\(result.stdout)")
        XCTAssertEqual(counts(report, "users"), ["read": 4, "imported": 3, "already_there": 0, "rejected": 0])
        XCTAssertEqual(counts(report, "profiles")["imported"], 1)
        XCTAssertEqual(counts(report, "events"), ["read": 13, "imported": 6, "already_there": 0, "rejected": 7])
        XCTAssertEqual(counts(report, "sessions")["imported"], 2)
        XCTAssertEqual(report?["sessions_undecryptable"] as? Int, 1)
        let conflicts = report?["conflicts"] as? [[String: Any]]
        XCTAssertEqual(conflicts?.first?["email"] as? String, "dup@example.com")
        let verification = report?["verification"] as? [String: Any]
        XCTAssertEqual(verification?["passed"] as? Bool, true, "\(String(describing: verification))")
        XCTAssertEqual(verification?["events_expected"] as? Int, 6)
        // Bob's six refused events (Dup was not imported: its event is left out of the check).
        XCTAssertEqual(verification?["events_rejected"] as? Int, 6)

        let lines = try rejectLines(rejectFile)
        XCTAssertEqual(
            Set(lines.map { $0["id"] ?? "" }).count, lines.count, "each row once (the verification lists none again)")
        let reasons = Dictionary(lines.map { ($0["id"] ?? "", $0["reason"] ?? "") }, uniquingKeysWith: { $1 })
        let ids = try Dictionary(
            uniqueKeysWithValues: source.admin.query("select client_id::text, id::text from public.events").map {
                (try $0.decode(String.self, column: 0), try $0.decode(String.self, column: 1))
            })
        func reason(_ client: UUID) -> String? { ids[client.uuidString.lowercased()].flatMap { reasons[$0] } }
        XCTAssertEqual(reason(rejected[0]), "payload is not a JSON object")
        XCTAssertEqual(reason(rejected[1]), "payload is over 65536 bytes")
        XCTAssertEqual(reason(rejected[2]), "type is not 1 to 128 characters")
        XCTAssertEqual(reason(infinite), "client_timestamp is out of range")
        XCTAssertEqual(reason(rejected[3]), "payload has a number no IEEE double holds (I-JSON)")
        XCTAssertEqual(reason(rejected[4]), "payload has a number no IEEE double holds (I-JSON)")
        XCTAssertTrue(
            reasons[dup.uuidString.lowercased()]?.contains("belongs to another trunk-sync user") ?? false, "\(reasons)")
        XCTAssertTrue(
            lines.allSatisfy { ["auth.users", "public.events", "auth.sessions"].contains($0["table"] ?? "") })

        // The hosted access token (HS256 with a kid, the hosted issuer) pulls Ada's events in
        // source order, ties by id, created_at to the microsecond.
        let access = Self.hostedAccessToken(user: ada, session: adaSession, email: "ada@example.com")
        let pulled = try send(server, "GET", "/sync/v1/events?after=0", token: access)
        XCTAssertEqual(pulled.status, 200, pulled.bodyText)
        let events = try XCTUnwrap(pulled.jsonObject?["events"] as? [[String: Any]])
        XCTAssertEqual(events.map { $0["seq"] as? Int }, [1, 2, 3, 4])
        let tieOrder = try source.admin.query(
            "select client_id::text from public.events where user_id = $1 order by created_at, id", ada
        ).map { try $0.decode(String.self, column: 0) }
        XCTAssertEqual(events.map { $0["client_id"] as? String }, tieOrder)
        XCTAssertEqual(Set(tieOrder), Set(adaClients.map { $0.uuidString.lowercased() }))
        XCTAssertEqual((events.last?["payload"] as? [String: Any])?["text"] as? String, "tab\tand\\backslash\nnewline")

        // Continuing the hosted client's query: created_at > lastSync.
        let lastSync = "2026-03-01T10:00:00.123456%2B00:00"
        let rest = try send(
            server, "GET", "/rest/v1/events?select=client_id,created_at&created_at=gt.\(lastSync)&order=created_at.asc",
            token: access)
        XCTAssertEqual(rest.status, 200, rest.bodyText)
        let rows = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(rest.body)) as? [[String: Any]])
        XCTAssertEqual(rows.count, 3)
        XCTAssertEqual(rows.map { $0["created_at"] as? String }.last, "2026-03-02T08:00:00.000001+00:00")
        XCTAssertEqual(rows.first?["created_at"] as? String, "2026-03-01T10:00:01.654321+00:00")

        // The profile's name won over the metadata's.
        let profile = try send(server, "GET", "/rest/v1/profiles?select=full_name", token: access)
        XCTAssertTrue(profile.bodyText.contains("Ada Lovelace"), profile.bodyText)

        // Both refresh-token forms work once against trunk-sync, and rotate.
        for (token, user) in [("adaToken01", ada), (bobToken, bob)] {
            let refreshed = try send(
                server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"\#(token)"}"#)
            XCTAssertEqual(refreshed.status, 200, refreshed.bodyText)
            let session = try XCTUnwrap(refreshed.jsonObject)
            XCTAssertNotEqual(session["refresh_token"] as? String, token)
            XCTAssertEqual((session["user"] as? [String: Any])?["id"] as? String, user.uuidString.lowercased())
            let own = try XCTUnwrap(session["access_token"] as? String)
            let page = try send(server, "GET", "/sync/v1/events?after=0", token: own)
            XCTAssertEqual(page.status, 200)
            let pulled = page.jsonObject?["events"] as? [[String: Any]]
            XCTAssertEqual(pulled?.count, user == ada ? 4 : 2)
            if user == bob {  // as PostgreSQL prints it (309 digits), still the double a client reads
                XCTAssertEqual((pulled?.last?["payload"] as? [String: Any])?["n"] as? Double, 1e308)
            }
        }
        XCTAssertNotEqual(bobSession, adaSession)
        // The parent of a token used since is a replay (the session ends, as on the hosted
        // project), and the expired session did not come along.
        for token in ["adaToken00", "adaExpired"] {
            let refused = try send(
                server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"\#(token)"}"#)
            XCTAssertGreaterThanOrEqual(refused.status, 400, token)
        }
    }

    func testDeltaImportAfterPushesAndAKillNineRerunDoubleNothing() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        _ = try addEvents(
            source, user: ada,
            [("a", "{}", "2026-03-01 10:00:00.000001+00"), ("b", "{}", "2026-03-01 10:00:02.000002+00")])
        let session = try addOpaqueSession(source, user: ada, tokens: ["adaLive"])
        // Enough rows that a small batch size gives the kill many commits to land between, and
        // users over more than one page of them (1,000).
        try source.admin.execute(
            """
            insert into auth.users (id, email, created_at, updated_at, raw_user_meta_data)
            select ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'bulk' || g || '@example.com',
                   '2026-01-01', '2026-01-01', '{}'
            from generate_series(1, 1200) g;
            insert into public.events (user_id, type, payload, client_id, client_timestamp, created_at)
            select ('00000000-0000-4000-8000-' || lpad(to_hex(1 + g % 1200), 12, '0'))::uuid, 'bulk', jsonb_build_object('g', g),
                   gen_random_uuid(), '2026-02-01'::timestamptz + g * interval '1 second', '2026-02-01'::timestamptz + g * interval '1 second'
            from generate_series(1, 40000) g;
            """)
        let server = try startServer()

        // kill -9 once some batches committed, then run again to the end.
        let rejectFile = rejectPath()
        let (process, stdout, stderr) = try Command.start(
            Command.trunkSyncBinary(),
            ["import", "supabase", "--from", source.url, "--batch-size", "100", "--reject-file", rejectFile],
            environment: server.environment)
        let db = try destination(server)
        XCTAssertTrue(
            try eventually(within: 120) {
                try db.query("select count(*) from events")[0].decode(Int64.self, column: 0) > 0
            })
        kill(process.processIdentifier, SIGKILL)
        _ = Command.finish(process, stdout, stderr)
        XCTAssertEqual(process.terminationReason, .uncaughtSignal)
        let partial = try db.query("select count(*) from events")[0].decode(Int64.self, column: 0)
        XCTAssertLessThan(partial, 40_002, "killed before the end")

        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(try db.query("select count(*) from events")[0].decode(Int64.self, column: 0), 40_002)
        // Nothing doubled, and every user's seq is 1…n without a hole.
        XCTAssertEqual(
            try db.query(
                "select count(*) from (select user_id from events group by user_id having max(seq) <> count(*)) x")[0]
                .decode(Int64.self, column: 0), 0)
        XCTAssertEqual((report?["verification"] as? [String: Any])?["passed"] as? Bool, true)

        // Ada pushes to trunk-sync; meanwhile the hosted project took one more of her events.
        let access = Self.hostedAccessToken(user: ada, session: session, email: "ada@example.com")
        let pushed = UUID().uuidString.lowercased()
        let push = try send(
            server, "POST", "/sync/v1/events",
            body:
                #"{"events":[{"client_id":"\#(pushed)","type":"p","payload":{},"client_timestamp":"2026-03-05T00:00:00Z"}]}"#,
            token: access)
        XCTAssertEqual(push.status, 200, push.bodyText)
        let late = try addEvents(source, user: ada, [("c", "{}", "2026-03-01 10:00:03.000003+00")])[0]

        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr)
        XCTAssertEqual(counts(report, "events")["imported"], 1)
        XCTAssertEqual(counts(report, "events")["already_there"], 2, "only Ada's events were read again")
        XCTAssertEqual(counts(report, "users")["already_there"], 1201)
        XCTAssertEqual(counts(report, "sessions")["already_there"], 1)
        XCTAssertEqual(report?["events_retimed"] as? Int, 1)

        // Numbered after her push, and found by a client continuing from the hosted lastSync.
        let page = try XCTUnwrap(
            try send(server, "GET", "/sync/v1/events?after=2", token: access).jsonObject?["events"] as? [[String: Any]])
        XCTAssertEqual(page.map { $0["client_id"] as? String }, [pushed, late.uuidString.lowercased()])
        XCTAssertEqual(page.map { $0["seq"] as? Int }, [3, 4])
        let rest = try send(
            server, "GET",
            "/rest/v1/events?select=client_id&created_at=gt.2026-03-01T10:00:02.000002%2B00:00&order=created_at.asc",
            token: access)
        let unseen = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(rest.body)) as? [[String: Any]])
        XCTAssertEqual(Set(unseen.compactMap { $0["client_id"] as? String }), [pushed, late.uuidString.lowercased()])

        // A third run finds nothing new.
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0)
        XCTAssertEqual(counts(report, "events")["imported"], 0)
        XCTAssertEqual(counts(report, "events")["read"], 40_003)

        // The verification does look: an event lost here (its user's count still matches,
        // so no re-read) is reported, and the command exits 4.
        try db.query("delete from events where user_id = '00000000-0000-4000-8000-000000000007' and seq = 5")
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 4, result.stderr)
        let verification = report?["verification"] as? [String: Any]
        XCTAssertEqual(verification?["passed"] as? Bool, false)
        XCTAssertEqual((verification?["events_expected"] as? Int).map { $0 - 1 }, verification?["events_found"] as? Int)
        XCTAssertEqual(verification?["incomplete_users"] as? [String: Int], ["00000000-0000-4000-8000-000000000007": 1])
        XCTAssertNotEqual(verification?["source_digest"] as? String, verification?["destination_digest"] as? String)
    }

    /// Between the first import and the app's switch, the hosted project keeps rotating the
    /// refresh tokens of clients still on the old version (supabase-js refreshes hourly). The
    /// next import carries each session's newest token over, or those users would be signed
    /// out when their app switches; a session revoked here meanwhile stays revoked.
    func testTokensRotatedOnTheHostedProjectAfterAnImportStillRefresh() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        let bob = try addUser(source, email: "bob@example.com")
        let carol = try addUser(source, email: "carol@example.com")
        let adaSession = try addOpaqueSession(source, user: ada, tokens: ["adaFirst"])
        let key = (0..<32).map { _ in UInt8.random(in: 0...255) }
        let bobSession = UUID()
        try source.admin.query(
            """
            insert into auth.sessions (id, user_id, created_at, updated_at, aal, refresh_token_hmac_key, refresh_token_counter)
            values ($1, $2, now(), now(), 'aal1', $3, 7)
            """, bobSession, bob, Base64URL.encode(key))
        let carolSession = try addOpaqueSession(source, user: carol, tokens: ["carolFirst"])
        let server = try startServer()
        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "sessions")["imported"], 3)
        // Carol signs out on trunk-sync (a device already switched).
        try destination(server).query("update sessions set revoked_at = now() where id = $1", carolSession)

        // The hosted project rotates all three, twice.
        for (session, user, old, new) in [
            (adaSession, ada, "adaFirst", "adaSecond"), (carolSession, carol, "carolFirst", "carolSecond"),
            (adaSession, ada, "adaSecond", "adaThird"), (carolSession, carol, "carolSecond", "carolThird"),
        ] {
            try source.admin.query("update auth.refresh_tokens set revoked = true where token = $1", old)
            try source.admin.query(
                """
                insert into auth.refresh_tokens (instance_id, token, user_id, revoked, created_at, updated_at, parent, session_id)
                values ('00000000-0000-0000-0000-000000000000', $1, $2::text, false, now(), now(), $3, $4)
                """, new, user, old, session)
        }
        try source.admin.query("update auth.sessions set refresh_token_counter = 9 where id = $1", bobSession)

        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "sessions")["already_there"], 3)
        // The tokens the hosted project rotated away, and not to the live token's parent, no
        // longer refresh here (first, so their refusal is seen to leave the sessions alive).
        for stale in ["adaFirst", Self.signedToken(session: bobSession, counter: 7, key: key)] {
            let refused = try send(
                server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"\#(stale)"}"#)
            XCTAssertGreaterThanOrEqual(refused.status, 400, stale)
        }
        for (token, user) in [
            ("adaThird", ada), (Self.signedToken(session: bobSession, counter: 9, key: key), bob),
        ] {
            let refreshed = try send(
                server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"\#(token)"}"#)
            XCTAssertEqual(refreshed.status, 200, "\(user): " + refreshed.bodyText)
            XCTAssertEqual(
                ((refreshed.jsonObject?["user"] as? [String: Any])?["id"] as? String), user.uuidString.lowercased())
        }
        let revoked = try send(
            server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"carolThird"}"#)
        XCTAssertGreaterThanOrEqual(revoked.status, 400, "a session revoked here is not revived by an import")
    }

    /// The sessions' live tokens are read from `auth.refresh_tokens` in one pass, with their
    /// sessions, not looked up for each batch of sessions: on a source without an index on
    /// `session_id` (as this schema, and bench/import's, has none) each look-up read the whole
    /// table, once per batch, and the sessions phase grew with the square of the sessions.
    /// Every live token still comes, with its parent, a session's two live tokens both.
    func testTheLiveTokensAreReadInOnePassNotOncePerBatchOfSessions() throws {
        let source = try makeSource()
        try source.admin.execute(
            """
            insert into auth.users (id, aud, role, email, email_confirmed_at, raw_app_meta_data, raw_user_meta_data,
                                    created_at, updated_at)
            select gen_random_uuid(), 'authenticated', 'authenticated', 'batch' || g || '@example.com', now(), '{}', '{}',
                   now(), now()
            from generate_series(1, 250) g;
            insert into auth.sessions (id, user_id, created_at, updated_at, aal)
            select gen_random_uuid(), id, now(), now(), 'aal1' from auth.users;
            insert into auth.refresh_tokens (token, user_id, revoked, created_at, updated_at, parent, session_id)
            select 'p-' || s.id, s.user_id::text, true, now(), now(), null, s.id from auth.sessions s;
            insert into auth.refresh_tokens (token, user_id, revoked, created_at, updated_at, parent, session_id)
            select 'l-' || s.id, s.user_id::text, false, now(), now(), 'p-' || s.id, s.id from auth.sessions s;
            """)
        let twoLive = try source.admin.query("select id from auth.sessions order by id desc limit 1")[0]
            .decode(UUID.self, column: 0)
        try source.admin.query(
            """
            insert into auth.refresh_tokens (token, user_id, revoked, created_at, updated_at, parent, session_id)
            select 'm-' || s.id, s.user_id::text, false, now(), now(), 'p-' || s.id, s.id from auth.sessions s where s.id = $1
            """, twoLive)
        // The setup's own reads (its statistics written before the count is taken).
        try source.admin.execute("select pg_stat_force_next_flush()")
        let before = try scans(source, of: "auth.refresh_tokens")
        let server = try startServer()
        let (result, report, _) = try importCommand(server, from: source.url, ["--batch-size", "100"])
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "sessions")["imported"], 250)
        XCTAssertEqual(report?["sessions_without_token"] as? Int, 0)
        let here = try destination(server).query(
            """
            select count(*) filter (where rotated_at is null), count(*) filter (where rotated_at is not null)
            from refresh_tokens
            """)[0]
        XCTAssertEqual(try here.decode(Int64.self, column: 0), 251, "every live token, the second of one session too")
        XCTAssertEqual(try here.decode(Int64.self, column: 1), 250, "every live token's parent")
        // The run's source backend writes its statistics as it exits.
        XCTAssertTrue(
            try eventually(within: 10) {
                try source.admin.query("select count(*) from pg_stat_activity where usename = $1", roles.last!)[0]
                    .decode(Int64.self, column: 0) == 0
            })
        XCTAssertLessThanOrEqual(
            try scans(source, of: "auth.refresh_tokens") - before, 1,
            "auth.refresh_tokens read once, not once per batch of 100 sessions")
    }

    /// How many scans of `table` (sequential or by an index) the source's statistics count.
    func scans(_ source: Source, of table: String) throws -> Int64 {
        try source.admin.execute("select pg_stat_clear_snapshot()")
        return try source.admin.query(
            "select seq_scan + coalesce(idx_scan, 0) from pg_stat_user_tables where relid = $1::regclass", table)[0]
            .decode(Int64.self, column: 0)
    }

    /// A refresh whose answer the client never stored: it still holds the live token's parent,
    /// which Supabase Auth accepts. Presented here after the switch, the parent refreshes
    /// (trunk-sync's lost-answer rule): the live token it was rotated to is superseded, and
    /// the new token works. Opaque tokens (`parent`) and signed ones (the counter one behind).
    func testTheParentOfTheLiveTokenRefreshesOnceItsAnswerWasLost() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        let bob = try addUser(source, email: "bob@example.com")
        _ = try addOpaqueSession(source, user: ada, tokens: ["adaParent", "adaLive"])
        let key = (0..<32).map { _ in UInt8.random(in: 0...255) }
        let bobSession = try addSignedSession(source, user: bob, counter: 5, storedKey: Base64URL.encode(key)).0
        let server = try startServer()
        let (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "sessions")["imported"], 2)
        try expectLostAnswer(server, parent: "adaParent", live: "adaLive", user: ada)
        try expectLostAnswer(
            server, parent: Self.signedToken(session: bobSession, counter: 4, key: key),
            live: Self.signedToken(session: bobSession, counter: 5, key: key), user: bob)
    }

    /// A session imported before parents came along (its live token without one, nothing
    /// recorded in `supabase_imported_tokens`): the next run brings the parent and links the
    /// live token to it.
    func testALiveTokenImportedWithoutItsParentGetsItOnTheNextRun() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        _ = try addOpaqueSession(source, user: ada, tokens: ["adaParent", "adaLive"])
        let server = try startServer()
        var (result, _, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        try destination(server).execute(
            """
            delete from supabase_imported_tokens;
            update refresh_tokens set parent_id = null;
            delete from refresh_tokens where rotated_at is not null;
            """)
        XCTAssertEqual(try refreshStatus(server, "adaParent"), 400, "as an older import left it")
        (result, _, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        try expectLostAnswer(server, parent: "adaParent", live: "adaLive", user: ada)
    }

    /// Refreshes with `token`, expecting a session of `user`; returns its new refresh token.
    func expectRefresh(_ server: ServerProcess, _ token: String, user: UUID) throws -> String {
        let refreshed = try send(
            server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"\#(token)"}"#)
        XCTAssertEqual(refreshed.status, 200, "\(user): " + refreshed.bodyText)
        let session = try XCTUnwrap(refreshed.jsonObject)
        XCTAssertEqual((session["user"] as? [String: Any])?["id"] as? String, user.uuidString.lowercased())
        let new = try XCTUnwrap(session["refresh_token"] as? String)
        XCTAssertNotEqual(new, token)
        return new
    }

    /// Refreshes with `parent`, the parent of the live token `live` (a client that lost the
    /// answer carrying `live`): a new token, `live` superseded (not presented before the new
    /// token is used, or it would end the session), the new token working, then `live` refused.
    func expectLostAnswer(_ server: ServerProcess, parent: String, live: String, user: UUID) throws {
        let new = try expectRefresh(server, parent, user: user)
        XCTAssertEqual(try liveRows(server, live), 0, "superseded: \(user)")
        _ = try expectRefresh(server, new, user: user)
        XCTAssertEqual(try refreshStatus(server, live), 400, "\(user)")
    }

    /// How many rows here hold `token`, not revoked.
    func liveRows(_ server: ServerProcess, _ token: String) throws -> Int64 {
        try destination(server).query(
            "select count(*) from refresh_tokens where token_hash = sha256(convert_to($1, 'UTF8')) and revoked_at is null",
            token
        )[0].decode(Int64.self, column: 0)
    }

    /// A re-run after the hosted project rotated again: the token an earlier run brought as
    /// live is now the parent (it refreshes once, as a lost answer), the one before it is
    /// refused (and the session lives on), the new live token works. Devices that refreshed
    /// here before the re-run (with the live token, or with its parent) keep trunk-sync's
    /// tokens, which the re-run neither revokes nor alters.
    func testARerunAfterTheHostedProjectRotatedKeepsTheParentAndTheDevicesThatRefreshedHere() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        let bob = try addUser(source, email: "bob@example.com")
        let carol = try addUser(source, email: "carol@example.com")
        let dan = try addUser(source, email: "dan@example.com")
        let adaSession = try addOpaqueSession(source, user: ada, tokens: ["adaFirst", "adaSecond"])
        let key = (0..<32).map { _ in UInt8.random(in: 0...255) }
        let bobSession = try addSignedSession(source, user: bob, counter: 3, storedKey: Base64URL.encode(key)).0
        _ = try addOpaqueSession(source, user: carol, tokens: ["carolParent", "carolLive"])
        _ = try addOpaqueSession(source, user: dan, tokens: ["danParent", "danLive"])
        let server = try startServer()
        var (result, _, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        // Carol's device refreshes here with the live token, Dan's with the parent (its
        // answer from the hosted project lost).
        let carolHere = try expectRefresh(server, "carolLive", user: carol)
        let danHere = try expectRefresh(server, "danParent", user: dan)
        let db = try destination(server)
        func rows() throws -> [String] {
            try db.query(
                "select t.id::text || coalesce(t.parent_id::text, '-') || (t.rotated_at is null)::text"
                    + " || (t.revoked_at is null)::text from refresh_tokens t join users u on u.id = t.user_id"
                    + " where u.email in ('carol@example.com', 'dan@example.com') order by t.id"
            ).map { try $0.decode(String.self, column: 0) }
        }
        let before = try rows()

        // The hosted project rotates Ada's and Bob's tokens again.
        try source.admin.query("update auth.refresh_tokens set revoked = true where token = 'adaSecond'")
        try source.admin.query(
            """
            insert into auth.refresh_tokens (instance_id, token, user_id, revoked, created_at, updated_at, parent, session_id)
            values ('00000000-0000-0000-0000-000000000000', 'adaThird', $1::text, false, now(), now(), 'adaSecond', $2)
            """, ada, adaSession)
        try source.admin.query("update auth.sessions set refresh_token_counter = 4 where id = $1", bobSession)
        var report: [String: Any]?
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "sessions")["already_there"], 4)
        XCTAssertEqual(try rows(), before, "trunk-sync's tokens and the imported ones it rotated are left as they are")

        // Two rotations back: refused, and the session lives on.
        for stale in ["adaFirst", Self.signedToken(session: bobSession, counter: 2, key: key)] {
            XCTAssertEqual(try refreshStatus(server, stale), 400, stale)
        }
        try expectLostAnswer(server, parent: "adaSecond", live: "adaThird", user: ada)
        try expectLostAnswer(
            server, parent: Self.signedToken(session: bobSession, counter: 3, key: key),
            live: Self.signedToken(session: bobSession, counter: 4, key: key), user: bob)
        _ = try expectRefresh(server, carolHere, user: carol)
        _ = try expectRefresh(server, danHere, user: dan)
    }

    /// A session opened on trunk-sync itself (`trunk-sync token`): its access and refresh tokens.
    func nativeSession(_ server: ServerProcess, _ email: String) throws -> (access: String, refresh: String) {
        let result = try Command.run(
            Command.trunkSyncBinary(), ["token", "--email", email], environment: server.environment)
        XCTAssertEqual(result.status, 0, result.stderr)
        let object = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        return (try XCTUnwrap(object["access_token"] as? String), try XCTUnwrap(object["refresh_token"] as? String))
    }

    func refreshStatus(_ server: ServerProcess, _ token: String) throws -> Int {
        try send(server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"\#(token)"}"#)
            .status
    }

    /// After a first import, old-app users go on signing out on the hosted project (which
    /// deletes the session there; "everywhere" deletes them all), a session has every
    /// refresh token revoked there, users get banned or deleted softly. The next run ends
    /// the sessions it imported for them here as a sign-out here does — refresh tokens
    /// refused, access tokens stopped — and leaves alone the sessions the hosted project
    /// keeps and those users opened on trunk-sync. A dry run counts them and changes nothing.
    func testSessionsEndedOnTheHostedProjectAfterAnImportAreRevokedHere() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        let bob = try addUser(source, email: "bob@example.com")
        let carol = try addUser(source, email: "carol@example.com")
        let signedOut = try addOpaqueSession(source, user: ada, tokens: ["adaSignedOut"])
        let tokensRevoked = try addOpaqueSession(source, user: ada, tokens: ["adaRevokedThere"])
        let kept = try addOpaqueSession(source, user: ada, tokens: ["adaKept"])
        let expiring = try addOpaqueSession(
            source, user: ada, tokens: ["adaExpiring"], notAfter: "2999-01-01 00:00:00+00")
        let (signedSession, signedToken) = try addSignedSession(source, user: ada, counter: 3)
        _ = try addOpaqueSession(source, user: bob, tokens: ["bobLive"])
        _ = try addOpaqueSession(source, user: carol, tokens: ["carolLive"])
        let server = try startServer()
        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "sessions")["imported"], 7)
        XCTAssertEqual(report?["sessions_revoked"] as? Int, 0)

        // Ada's new-app device signs in on trunk-sync; her old-app devices still use the
        // hosted project's tokens.
        let native = try nativeSession(server, "ada@example.com")
        let hostedAccess = Self.hostedAccessToken(user: ada, session: signedOut, email: "ada@example.com")
        let keptAccess = Self.hostedAccessToken(user: ada, session: kept, email: "ada@example.com")
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: hostedAccess).status, 200)

        for session in [signedOut, signedSession] {
            try source.admin.query("delete from auth.sessions where id = $1", session)
        }
        try source.admin.query("update auth.refresh_tokens set revoked = true where session_id = $1", tokensRevoked)
        try source.admin.query(
            "update auth.sessions set not_after = now() - interval '1 minute' where id = $1", expiring)
        try source.admin.query("update auth.users set banned_until = now() + interval '1 day' where id = $1", bob)
        try source.admin.query("update auth.users set deleted_at = now() where id = $1", carol)

        let db = try destination(server)
        func count(_ sql: String) throws -> Int64 { try db.query(sql)[0].decode(Int64.self, column: 0) }
        (result, report, _) = try importCommand(server, from: source.url, ["--dry-run"])
        XCTAssertEqual(result.status, 3, "Bob and Carol are rejected now: " + result.stderr + result.stdout)
        XCTAssertEqual(report?["sessions_revoked"] as? Int, 6)
        XCTAssertEqual(try count("select count(*) from sessions where revoked_at is not null"), 0)
        XCTAssertEqual(try count("select count(*) from refresh_tokens where revoked_at is not null"), 0)
        XCTAssertEqual(try count("select count(*) from session_revocations"), 0)

        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(report?["sessions_revoked"] as? Int, 6)
        XCTAssertEqual(counts(report, "sessions")["imported"], 0)
        // Announced as any revocation: the signed-out session's access token stops.
        XCTAssertTrue(
            try eventually(within: 10) {
                try send(server, "GET", "/sync/v1/events?after=0", token: hostedAccess).status == 401
            })
        for token in ["adaSignedOut", "adaRevokedThere", "adaExpiring", signedToken, "bobLive", "carolLive"] {
            XCTAssertEqual(try refreshStatus(server, token), 400, token)
        }
        XCTAssertEqual(try count("select count(*) from sessions where revoked_at is not null"), 6)
        XCTAssertEqual(
            try count(
                "select count(*) from refresh_tokens t join sessions s on s.id = t.session_id"
                    + " where s.revoked_at is not null and t.revoked_at is null"), 0)
        // The session the hosted project keeps, and the one opened here, go on.
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: keptAccess).status, 200)
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: native.access).status, 200)
        XCTAssertEqual(try refreshStatus(server, "adaKept"), 200)
        XCTAssertEqual(try refreshStatus(server, native.refresh), 200)

        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(report?["sessions_revoked"] as? Int, 0, "nothing more ended")
    }

    /// `--from` naming another database (here: another project) would end every imported
    /// session at once: the run stops before revoking any, unless told to.
    func testMostImportedSessionsEndingAtOnceStopsTheRunUnlessTold() throws {
        let source = try makeSource()
        var tokens: [String] = []
        for index in 0..<12 {
            let user = try addUser(source, email: "user\(index)@example.com")
            tokens.append("live\(index)")
            _ = try addOpaqueSession(source, user: user, tokens: [tokens[index]])
        }
        let server = try startServer()
        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "sessions")["imported"], 12)

        let other = try makeSource()
        _ = try addUser(other, email: "someone@example.com")
        let db = try destination(server)
        func revoked() throws -> Int64 {
            try db.query("select count(*) from sessions where revoked_at is not null")[0].decode(Int64.self, column: 0)
        }
        (result, report, _) = try importCommand(server, from: other.url, ["--dry-run"])
        XCTAssertEqual(report?["sessions_revoked"] as? Int, 12, "a dry run shows it: " + result.stderr)
        (result, _, _) = try importCommand(server, from: other.url)
        XCTAssertEqual(result.status, 1, result.stdout)
        XCTAssertTrue(result.stderr.contains("12 of the 12 sessions imported earlier"), result.stderr)
        XCTAssertTrue(result.stderr.contains("--revoke-ended-sessions"), result.stderr)
        XCTAssertEqual(try revoked(), 0, "nothing revoked")
        XCTAssertEqual(try refreshStatus(server, tokens[0]), 200)

        (result, report, _) = try importCommand(server, from: other.url, ["--revoke-ended-sessions"])
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(report?["sessions_revoked"] as? Int, 12)
        XCTAssertEqual(try revoked(), 12)
        XCTAssertEqual(try refreshStatus(server, tokens[1]), 400)
    }

    /// A database an import filled before the import recorded its sessions: a re-run
    /// recognises that run's sessions by the ids the source still has (ended there or not),
    /// records them and ends those the source ended. One whose source row is gone cannot be
    /// told from a session opened here, and is neither recorded nor touched.
    func testSessionsImportedBeforeTheRecordAreRecognisedByTheSourceIDs() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        let revoked = try addOpaqueSession(source, user: ada, tokens: ["adaRevoked"])
        let deleted = try addOpaqueSession(source, user: ada, tokens: ["adaDeleted"])
        let kept = try addOpaqueSession(source, user: ada, tokens: ["adaKept"])
        let server = try startServer()
        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        let db = try destination(server)
        try db.execute("delete from supabase_imported_sessions")  // as before migration 0015
        let native = try nativeSession(server, "ada@example.com")

        try source.admin.query("update auth.refresh_tokens set revoked = true where session_id = $1", revoked)
        try source.admin.query("delete from auth.sessions where id = $1", deleted)
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(report?["sessions_revoked"] as? Int, 1)
        XCTAssertEqual(try refreshStatus(server, "adaRevoked"), 400)
        XCTAssertEqual(try refreshStatus(server, "adaKept"), 200)
        XCTAssertEqual(try refreshStatus(server, native.refresh), 200)
        let recorded = Set(
            try db.query("select session_id from supabase_imported_sessions").map {
                try $0.decode(UUID.self, column: 0)
            })
        XCTAssertEqual(recorded, [revoked, kept])
        XCTAssertEqual(
            try db.query("select revoked_at is null from sessions where id = $1", deleted)[0].decode(
                Bool.self, column: 0),
            true)

        // The server's role cannot read the record; an account deleted as the server does it
        // (its role, the user's scope) takes the user's rows in it along.
        try db.execute("begin; set local role trunk_sync_app")
        try db.query("select set_config('app.user_id', $1, true)", ada.uuidString)
        XCTAssertEqual(try db.query("delete from users where id = $1", ada).affectedRows, 1)
        try db.execute("commit")
        XCTAssertEqual(
            try db.query("select count(*) from supabase_imported_sessions")[0].decode(Int64.self, column: 0), 0)
        try db.execute("begin; set local role trunk_sync_app")
        XCTAssertThrowsError(try db.query("select count(*) from supabase_imported_sessions")) {
            XCTAssertEqual(($0 as? PostgresError)?.sqlState, .insufficientPrivilege)
        }
        try db.execute("rollback")
    }

    /// A re-run reads again only the users whose count of source events changed. A source
    /// event that changed without changing the count (a refused payload fixed by the
    /// operator; an event deleted and another recorded) is found by the verification: that
    /// run exits 4 and forgets those users' counts, so the next run reads them again. Every
    /// run's reject file names the refused events its verification counts, each once, the
    /// ones it did not read too (a re-run listed none: which they were was only in the reject
    /// file of the run that read them, which the next run overwrote).
    func testEventsTheCountsMissArriveOnTheRunAfterTheVerificationFoundThem() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        let refused = try addEvents(
            source, user: ada, [("a", "[1]", "2026-03-01 10:00:00+00"), ("b", "{}", "2026-03-01 10:00:01+00")])[0]
        let bob = try addUser(source, email: "bob@example.com")
        let deleted = try addEvents(source, user: bob, [("a", "{}", "2026-03-01 11:00:00+00")])[0]
        let server = try startServer()
        let refusedID = try source.admin.query("select id::text from public.events where client_id = $1", refused)[0]
            .decode(String.self, column: 0)
        var (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "events")["rejected"], 1)
        XCTAssertEqual(
            try rejectLines(rejectFile),
            [["table": "public.events", "id": refusedID, "reason": "payload is not a JSON object"]],
            "listed by the events phase, and not again by the verification")

        // Nothing new: the refused event is not read again, and still reported, exit 3 (it
        // said 0 rejected and exited 0, as if nothing were missing), and listed once.
        (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, "the refused event is still not here: " + result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "events")["rejected"], 0, "not read again")
        XCTAssertEqual((report?["verification"] as? [String: Any])?["events_rejected"] as? Int, 1)
        XCTAssertEqual((report?["verification"] as? [String: Any])?["passed"] as? Bool, true)
        XCTAssertEqual(
            try rejectLines(rejectFile),
            [
                [
                    "table": "public.events", "id": refusedID,
                    "reason": "payload is not a JSON object (found by the verification)",
                ]
            ])
        let summary = try Command.run(
            Command.trunkSyncBinary(), ["import", "supabase", "--from", source.url, "--reject-file", rejectPath()],
            environment: server.environment)
        XCTAssertEqual(summary.status, 3)
        XCTAssertTrue(
            (summary.stdout + summary.stderr).contains("1 source event(s) that trunk-sync's rules refuse are not here"),
            summary.stdout + summary.stderr)

        try source.admin.query(#"update public.events set payload = '{"fixed":true}' where client_id = $1"#, refused)
        try source.admin.query("delete from public.events where client_id = $1", deleted)
        let added = try addEvents(source, user: bob, [("b", "{}", "2026-03-01 12:00:00+00")])[0]

        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 4, "the counts match, the keys do not: " + result.stderr + result.stdout)
        let incomplete = (report?["verification"] as? [String: Any])?["incomplete_users"] as? [String: Int]
        XCTAssertEqual(incomplete, [ada.uuidString.lowercased(): 1, bob.uuidString.lowercased(): 1])

        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, "the next run finishes: " + result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "events")["imported"], 2)
        XCTAssertEqual((report?["verification"] as? [String: Any])?["passed"] as? Bool, true)
        let here = try destination(server).query("select client_id from events").map {
            try $0.decode(UUID.self, column: 0)
        }
        XCTAssertEqual(Set(here).intersection([refused, added]), [refused, added])
    }

    /// A user deleted here after an import (their own request, or `users delete`) is still in
    /// the hosted project while old app versions run: the next import must not bring them
    /// back, with their events and live sessions. It reports them instead.
    func testAUserDeletedHereAfterAnImportIsNotBroughtBack() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        _ = try addEvents(source, user: ada, [("a", "{}", "2026-03-01 10:00:00+00")])
        let bob = try addUser(source, email: "bob@example.com")  // no events
        _ = try addOpaqueSession(source, user: ada, tokens: ["adaLive"])
        _ = try addOpaqueSession(source, user: bob, tokens: ["bobLive"])
        let server = try startServer()
        var (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        for email in ["ada@example.com", "bob@example.com"] {
            let deleted = try Command.run(
                Command.trunkSyncBinary(), ["users", "delete", email, "--yes"], environment: server.environment)
            XCTAssertEqual(deleted.status, 0, deleted.stderr)
        }
        _ = try addEvents(source, user: ada, [("b", "{}", "2026-03-01 11:00:00+00")])

        (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, "reported as not imported: " + result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "users")["imported"], 0)
        XCTAssertEqual(counts(report, "users")["rejected"], 2)
        XCTAssertEqual(counts(report, "sessions")["imported"], 0)
        let db = try destination(server)
        for table in ["users", "events", "sessions", "refresh_tokens"] {
            XCTAssertEqual(try db.query("select count(*) from \(table)")[0].decode(Int64.self, column: 0), 0, table)
        }
        let refused = try send(
            server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"adaLive"}"#)
        XCTAssertGreaterThanOrEqual(refused.status, 400)
        let rejects = try String(contentsOfFile: rejectFile, encoding: .utf8)
        XCTAssertTrue(rejects.contains("deleted"), rejects)
    }

    /// A user the hosted project banned (`banned_until` ahead) or deleted softly
    /// (`deleted_at` set, their rows kept) cannot sign in there: the import must not let
    /// them in here, by a mailed code or by their sessions, which Supabase keeps.
    func testBannedAndSoftDeletedUsersAreNotImported() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        let banned = try addUser(source, email: "banned@example.com")
        let gone = try addUser(source, email: "gone@example.com")
        let pardoned = try addUser(source, email: "pardoned@example.com")
        try source.admin.query("update auth.users set banned_until = now() + interval '1 year' where id = $1", banned)
        try source.admin.query("update auth.users set deleted_at = now() where id = $1", gone)
        try source.admin.query("update auth.users set banned_until = now() - interval '1 day' where id = $1", pardoned)
        for user in [ada, banned, gone, pardoned] {
            _ = try addEvents(source, user: user, [("a", "{}", "2026-03-01 10:00:00+00")])
        }
        _ = try addOpaqueSession(source, user: banned, tokens: ["bannedLive"])
        let server = try startServer()
        let (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "users"), ["read": 4, "imported": 2, "already_there": 0, "rejected": 2])
        XCTAssertEqual(counts(report, "events")["imported"], 2)
        XCTAssertEqual((report?["verification"] as? [String: Any])?["passed"] as? Bool, true)
        let here = Set(
            try destination(server).query("select id from users").map { try $0.decode(UUID.self, column: 0) })
        XCTAssertEqual(here, [ada, pardoned])
        let refused = try send(
            server, "POST", "/auth/v1/token?grant_type=refresh_token", body: #"{"refresh_token":"bannedLive"}"#)
        XCTAssertGreaterThanOrEqual(refused.status, 400)
        let rejects = try String(contentsOfFile: rejectFile, encoding: .utf8)
        XCTAssertTrue(rejects.contains("banned on the hosted project"), rejects)
        XCTAssertTrue(rejects.contains("deleted on the hosted project"), rejects)
    }

    /// A user whose metadata is larger than trunk-sync takes (every access token carries it,
    /// so their tokens would not fit in a request's headers) is not imported, with a reason
    /// that says what to do; made smaller on the hosted project, the next run imports them
    /// with their events and sessions. Metadata that grows past the limit after an import is
    /// not carried over (a conflict, the value here kept) and holds back nothing else.
    func testMetadataLargerThanTokensCarryIsNotImportedButReportedUntilItFits() throws {
        let source = try makeSource()
        let big = #"{"notes":"\#(String(repeating: "n", count: 20_000))"}"#
        let ada = try addUser(source, email: "ada@example.com", metadata: big)
        let bob = try addUser(source, email: "bob@example.com", metadata: #"{"theme":"dark"}"#)
        for user in [ada, bob] { _ = try addEvents(source, user: user, [("a", "{}", "2026-03-01 10:00:00+00")]) }
        _ = try addOpaqueSession(source, user: ada, tokens: ["adaLive"])
        let server = try startServer()
        var (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "users"), ["read": 2, "imported": 1, "already_there": 0, "rejected": 1])
        XCTAssertEqual(counts(report, "events")["imported"], 1)
        let rejects = try String(contentsOfFile: rejectFile, encoding: .utf8)
        XCTAssertTrue(rejects.contains("user_metadata takes 20"), rejects)
        XCTAssertTrue(rejects.contains("at most 16384"), rejects)
        let db = try destination(server)
        XCTAssertEqual(try db.query("select id from users").map { try $0.decode(UUID.self, column: 0) }, [bob])

        // Made smaller on the hosted project: the next run brings Ada, her events and session.
        try source.admin.query(
            #"update auth.users set raw_user_meta_data = '{"notes":"short"}' where id = $1"#, ada)
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "users")["imported"], 1)
        XCTAssertEqual(
            try db.query("select count(*) from events where user_id = $1", ada)[0].decode(Int64.self, column: 0), 1)
        XCTAssertEqual(try refreshStatus(server, "adaLive"), 200)

        // Bob's metadata grows past the limit on the hosted project: kept here, reported,
        // and his new events still arrive.
        try source.admin.query("update auth.users set raw_user_meta_data = $2::jsonb where id = $1", bob, big)
        _ = try addEvents(source, user: bob, [("b", "{}", "2026-03-02 10:00:00+00")])
        let recordBefore = try recorded(db, bob)
        (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(
            conflicts(report),
            [
                [
                    "source_id": bob.uuidString.lowercased(), "email": "bob@example.com", "field": "user_metadata",
                    "reason": "metadata_unusable",
                ]
            ])
        XCTAssertEqual(try userHere(db, bob).metadata, #"{"theme": "dark"}"#)
        XCTAssertEqual(try recorded(db, bob), recordBefore, "the record still says what the import wrote")
        XCTAssertEqual(
            try db.query("select count(*) from events where user_id = $1", bob)[0].decode(Int64.self, column: 0), 2)
        XCTAssertTrue(
            try String(contentsOfFile: rejectFile, encoding: .utf8).contains("user_metadata not carried over"))
    }

    /// What jsonb keeps but trunk-sync's readers cannot read is not imported: metadata nested
    /// deeper than a token's verification reads (64 levels, as request bodies; such a user's
    /// every token is `401`), and a payload nested deeper than a push takes (a Swift client's
    /// decoder stops at 512 levels: its sync would stop at that page for good).
    func testMetadataAndPayloadsNestedDeeperThanTrunkSyncReadsAreNotImported() throws {
        let source = try makeSource()
        func nested(_ levels: Int) -> String {  // `levels` levels in all
            #"{"a":"# + String(repeating: "[", count: levels - 1) + String(repeating: "]", count: levels - 1) + "}"
        }
        let deepest = try addUser(source, email: "deepest@example.com", metadata: nested(63))
        let tooDeep = try addUser(source, email: "toodeep@example.com", metadata: nested(64))
        let huge = try addUser(source, email: "huge@example.com", metadata: #"{"n":[1, {"m": 1e400}]}"#)
        let bob = try addUser(source, email: "bob@example.com")
        let events = try addEvents(
            source, user: bob,
            [
                ("deepest", nested(64), "2026-03-01 10:00:00+00"), ("too_deep", nested(65), "2026-03-01 10:00:01+00"),
                ("very_deep", nested(600), "2026-03-01 10:00:02+00"),
            ])
        let server = try startServer()
        let (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        let rejects = try String(contentsOfFile: rejectFile, encoding: .utf8)
        XCTAssertEqual(counts(report, "users")["rejected"], 2, rejects)
        XCTAssertEqual(counts(report, "events")["rejected"], 2)
        XCTAssertEqual(counts(report, "events")["imported"], 1)
        XCTAssertTrue(rejects.contains("user_metadata is nested more than 63 levels deep"), rejects)
        XCTAssertTrue(rejects.contains("user_metadata holds a number no IEEE double holds"), rejects)
        XCTAssertTrue(rejects.contains("payload is nested more than 64 levels deep"), rejects)
        let here = Set(
            try destination(server).query("select id from users").map { try $0.decode(UUID.self, column: 0) })
        XCTAssertEqual(here, [deepest, bob])
        XCTAssertFalse(here.contains(tooDeep) || here.contains(huge))
        // The deepest metadata taken still verifies in every token; the deepest payload pulls.
        let session = try nativeSession(server, "deepest@example.com")
        XCTAssertEqual(try send(server, "GET", "/auth/v1/user", token: session.access).status, 200)
        XCTAssertEqual(try send(server, "GET", "/rest/v1/events", token: session.access).status, 200)
        let pulled = try send(
            server, "GET", "/sync/v1/events?after=0", token: try nativeSession(server, "bob@example.com").access)
        XCTAssertEqual(
            (pulled.jsonObject?["events"] as? [[String: Any]])?.map { $0["client_id"] as? String },
            [events[0].uuidString.lowercased()])
    }

    /// A user imported while their metadata was already what trunk-sync cannot take (before
    /// the import checked it) is reported every run until it is fixed, and a hosted name
    /// change is then not carried either, so the name and the metadata's `full_name` agree.
    func testAnImportedUserWithUnusableMetadataIsReportedAndTheNameWaitsWithIt() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com", metadata: #"{"full_name":"Ada"}"#)
        let server = try startServer()
        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        // As an older trunk-sync imported it: too large, on both sides and in the record.
        let big = #"{"full_name":"Ada","notes":"\#(String(repeating: "n", count: 20_000))"}"#
        let db = try destination(server)
        try source.admin.query("update auth.users set raw_user_meta_data = $2::jsonb where id = $1", ada, big)
        try db.query("update users set user_metadata = $2::jsonb where id = $1", ada, big)
        try db.query("update supabase_imported_users set user_metadata = $2::jsonb where user_id = $1", ada, big)
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(conflicts(report).map { $0["reason"] }, ["metadata_unusable"])
        // A name change on the hosted project waits with the metadata.
        try source.admin.query(
            "update auth.users set raw_user_meta_data = raw_user_meta_data || '{\"full_name\":\"Ada L\"}' where id = $1",
            ada)
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(conflicts(report).map { $0["field"] }, ["user_metadata"])
        XCTAssertEqual(try userHere(db, ada).name, "Ada")
        XCTAssertEqual(try recorded(db, ada)[1], #""Ada""#, "the record says the name was not written")
    }

    /// Two source users with one address (case apart, or an SSO user beside an email one:
    /// Supabase's unique index leaves SSO users out) cannot both be users here: the second
    /// (by id) is a conflict, reported, not a user silently missing from the counts.
    func testTwoSourceUsersWithOneAddressAreAConflict() throws {
        let source = try makeSource()
        let first = try addUser(source, email: "sam@example.com")
        let second = try addUser(source, email: "Sam@Example.com")
        let (kept, dropped) =
            first.uuidString.lowercased() < second.uuidString.lowercased() ? (first, second) : (second, first)
        _ = try addEvents(source, user: dropped, [("a", "{}", "2026-03-01 10:00:00+00")])
        let server = try startServer()
        let (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "users"), ["read": 2, "imported": 1, "already_there": 0, "rejected": 0])
        let conflicts = report?["conflicts"] as? [[String: Any]]
        XCTAssertEqual(conflicts?.compactMap { $0["source_id"] as? String }, [dropped.uuidString.lowercased()])
        XCTAssertEqual(counts(report, "events")["rejected"], 1)
        XCTAssertEqual((report?["verification"] as? [String: Any])?["passed"] as? Bool, true)
        XCTAssertEqual(
            try destination(server).query("select id from users").map { try $0.decode(UUID.self, column: 0) }, [kept])
    }

    /// Somebody signs up here with a source user's address after the run looked for
    /// conflicts, before it inserts that user (the server is live during an import): the
    /// insert skips them, and the run reports the conflict rather than losing the user from
    /// every count. A trigger signs the native user up at that very moment.
    func testAnAddressTakenBySomebodySigningUpDuringTheRunIsAConflict() throws {
        let source = try makeSource()
        let late = try addUser(source, email: "Late@Example.com")
        let onTime = try addUser(source, email: "ontime@example.com")
        _ = try addEvents(source, user: late, [("a", "{}", "2026-03-01 10:00:00+00")])
        let server = try startServer()
        let db = try destination(server)
        let native = UUID()
        try db.execute(
            """
            create function sign_up_meanwhile() returns trigger language plpgsql as $$
            begin
              if new.id = '\(late.uuidString.lowercased())' then
                insert into users (id, email) values ('\(native.uuidString.lowercased())', 'late@example.com');
              end if;
              return new;
            end $$;
            create trigger sign_up_meanwhile before insert on users
              for each row execute function sign_up_meanwhile();
            """)
        let (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "users"), ["read": 2, "imported": 1, "already_there": 0, "rejected": 0])
        XCTAssertEqual(
            conflicts(report),
            [["source_id": late.uuidString.lowercased(), "email": "late@example.com", "reason": "address_taken"]])
        XCTAssertEqual(counts(report, "events")["rejected"], 1)
        XCTAssertEqual((report?["verification"] as? [String: Any])?["passed"] as? Bool, true)
        XCTAssertTrue(try String(contentsOfFile: rejectFile, encoding: .utf8).contains(late.uuidString.lowercased()))
        XCTAssertEqual(
            Set(try db.query("select id from users").map { try $0.decode(UUID.self, column: 0) }), [onTime, native])
    }

    /// A user changed their address on the hosted project, and somebody signs up here with
    /// that address while the run carries it over: their transaction commits after the run
    /// compared (so the run saw the address free) and before its update of the user could
    /// take it. The run compares again and reports the conflict instead of failing; the
    /// user keeps the address they had here.
    func testAnAddressTakenWhileTheRunCarriesItOverIsAConflict() async throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        let server = try startServer()
        let first = try importCommand(server, from: source.url).0
        XCTAssertEqual(first.status, 0, first.stderr + first.stdout)
        try source.admin.query("update auth.users set email = 'ada.new@example.com' where id = $1", ada)
        let db = try destination(server)
        let signUp = try destination(server)
        let native = UUID()
        try signUp.execute("begin")
        try signUp.query("insert into users (id, email) values ($1, 'ada.new@example.com')", native)
        final class Outcome: @unchecked Sendable {
            var result: Command.Result?
            let done = DispatchSemaphore(value: 0)
        }
        let outcome = Outcome()
        let (binary, environment) = (Command.trunkSyncBinary(), server.environment)
        let rejectFile = rejectPath()
        let arguments = ["import", "supabase", "--from", source.url, "--json", "--reject-file", rejectFile]
        let thread = Thread {
            outcome.result = try? Command.run(binary, arguments, environment: environment)
            outcome.done.signal()
        }
        thread.start()
        // The run's update of Ada waits for the sign-up's transaction (the address's index).
        var waiting = false
        for _ in 0..<6000 where !waiting {
            waiting =
                try db.query(
                    """
                    select count(*) from pg_locks l join pg_stat_activity a using (pid)
                    where not l.granted and l.locktype = 'transactionid' and a.datname = current_database()
                    """)[0].decode(Int.self, column: 0) > 0
            if !waiting { try await Task.sleep(for: .milliseconds(10)) }
        }
        try signUp.execute("commit")
        outcome.done.wait()
        XCTAssertTrue(waiting, "the run never waited for the sign-up")
        let result = try XCTUnwrap(outcome.result)
        let report = (try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8))) as? [String: Any]
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(
            conflicts(report),
            [
                [
                    "source_id": ada.uuidString.lowercased(), "email": "ada.new@example.com", "field": "email",
                    "email_here": "ada@example.com", "reason": "address_taken",
                ]
            ])
        XCTAssertEqual(try userHere(db, ada).email, "ada@example.com")
        XCTAssertEqual(
            try db.query("select email from users where id = $1", native)[0].decode(String.self, column: 0),
            "ada.new@example.com")
    }

    /// The destination restored or failed over since `migrate` ran (simulated by the
    /// recorded WAL timeline differing), with no server connected since: the run moves every
    /// user's next seq before it numbers an event, as a server's first connection would, and
    /// says so; a device whose cursor is past the restored end still pulls what it imports.
    func testARunOnAnotherWALTimelineMovesTheSeqsFirst() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        _ = try addEvents(source, user: ada, [("a", "{}", "2026-03-01 10:00:00+00")])
        let server = try startServer()
        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(report?["users_seq_moved"] as? Int, 0)
        let db = try destination(server)
        try db.execute("update wal_timeline set timeline = timeline + 1")
        _ = try addEvents(source, user: ada, [("b", "{}", "2026-03-02 10:00:00+00")])
        let text = try Command.run(
            Command.trunkSyncBinary(), ["import", "supabase", "--from", source.url, "--reject-file", rejectPath()],
            environment: server.environment)
        XCTAssertEqual(text.status, 0, text.stderr + text.stdout)
        XCTAssertTrue(text.stdout.contains("the next seq of 1 user(s) moved past anything"), text.stdout)
        let seqs = try db.query("select seq from events order by seq").map { try $0.decode(Int64.self, column: 0) }
        XCTAssertEqual(seqs.count, 2)
        XCTAssertEqual(seqs.first, 1)
        XCTAssertGreaterThanOrEqual(seqs.last ?? 0, 2 + 1_000_000_000, "at least SeqTimeline.gap ahead")
        XCTAssertEqual(
            seqs.last, try db.query("select last_seq from users")[0].decode(Int64.self, column: 0))
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(report?["users_seq_moved"] as? Int, 0, "moved once")
    }

    /// The reject file is written in place, as a shell's `>` writes: a symbolic link stays a
    /// link to the file it names (before, the run replaced the path with a new file: as
    /// root, `--reject-file /dev/null` replaced the device); a new file is the owner's only,
    /// since rejected rows carry addresses.
    func testTheRejectFileIsWrittenInPlace() throws {
        let source = try makeSource()
        let bad = try addUser(source, email: "not an address")
        let server = try startServer()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rejects-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let target = directory.appendingPathComponent("target.jsonl").path
        let link = directory.appendingPathComponent("link.jsonl").path
        try "an earlier run's line\n".write(toFile: target, atomically: false, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
        let linked = try Command.run(
            Command.trunkSyncBinary(), ["import", "supabase", "--from", source.url, "--json", "--reject-file", link],
            environment: server.environment)
        XCTAssertEqual(linked.status, 3, linked.stderr + linked.stdout)
        XCTAssertEqual(try FileManager.default.destinationOfSymbolicLink(atPath: link), target, "still a link")
        let written = try String(contentsOfFile: target, encoding: .utf8)
        XCTAssertTrue(written.contains(bad.uuidString.lowercased()), written)
        XCTAssertFalse(written.contains("an earlier run's line"), "emptied first: \(written)")

        let new = directory.appendingPathComponent("new.jsonl").path
        let fresh = try Command.run(
            Command.trunkSyncBinary(), ["import", "supabase", "--from", source.url, "--json", "--reject-file", new],
            environment: server.environment)
        XCTAssertEqual(fresh.status, 3, fresh.stderr + fresh.stdout)
        let mode = try XCTUnwrap(try FileManager.default.attributesOfItem(atPath: new)[.posixPermissions] as? Int)
        XCTAssertEqual(mode & 0o777, 0o600)
    }

    /// A reject file that cannot be written (its directory missing) stops the run before
    /// it writes anything, in one line naming the path and why.
    func testAnUnwritableRejectFileStopsTheRunBeforeAnything() throws {
        let source = try makeSource()
        _ = try addUser(source, email: "ada@example.com")
        let server = try startServer()
        let path = "/nonexistent-\(UUID().uuidString)/rejects.jsonl"
        let result = try Command.run(
            Command.trunkSyncBinary(), ["import", "supabase", "--from", source.url, "--reject-file", path],
            environment: server.environment)
        XCTAssertEqual(result.status, 1, result.stderr + result.stdout)
        XCTAssertTrue(
            result.stderr.contains("cannot write the reject file \(path): No such file or directory"), result.stderr)
        XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, result.stderr)
        XCTAssertEqual(try destination(server).query("select count(*) from users")[0].decode(Int.self, column: 0), 0)
    }

    // MARK: - Changes on the hosted project after an import

    /// The address, name and metadata a user has here (the owner's view).
    func userHere(_ db: PostgresConnection, _ id: UUID) throws -> (email: String, name: String?, metadata: String) {
        let row = try db.query("select email, full_name, user_metadata::text from users where id = $1", id)[0]
        return (
            try row.decode(String.self, column: 0), try row.decode(String?.self, column: 1),
            try row.decode(String.self, column: 2)
        )
    }

    /// What the import recorded it wrote for a user: address, name (JSON), metadata; nil
    /// columns not recorded.
    func recorded(_ db: PostgresConnection, _ id: UUID) throws -> [String?] {
        let rows = try db.query(
            "select email, full_name::text, user_metadata::text, recorded_at::text from supabase_imported_users where user_id = $1",
            id)
        guard let row = rows.first else { return [] }
        return try (0..<4).map { try row.decode(String?.self, column: $0) }
    }

    /// Signs in with a mailed code (the log mailer's) and returns the user's id.
    func signInWithCode(_ server: ServerProcess, _ email: String) throws -> String? {
        XCTAssertEqual(try send(server, "POST", "/auth/v1/otp", body: #"{"email":"\#(email)"}"#).status, 200)
        let line = try XCTUnwrap(
            server.stderr.waitForLine(containing: "sign-in code for \(email)", timeout: 10), "no code logged")
        let code = String(try XCTUnwrap(line.firstMatch(of: /: (\d{6})/)).output.1)
        let verified = try send(
            server, "POST", "/auth/v1/verify", body: #"{"email":"\#(email)","token":"\#(code)","type":"email"}"#)
        XCTAssertEqual(verified.status, 200, String(decoding: verified.body, as: UTF8.self))
        return (verified.jsonObject?["user"] as? [String: Any])?["id"] as? String
    }

    func conflicts(_ report: [String: Any]?) -> [[String: String]] {
        (report?["conflicts"] as? [[String: Any]] ?? []).map { $0.compactMapValues { $0 as? String } }
    }

    /// A user changes their address (and their profile's name, and a metadata key) on the
    /// hosted project after the first import. The next run carries it over to the same
    /// account — same id, events and sessions — so a code mailed to the new address signs
    /// them into their account, not a new empty one. A dry run shows it and changes
    /// nothing; a run after changes nothing more.
    func testAnAddressAndNameChangedOnTheHostedProjectAreCarriedOver() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com", metadata: #"{"full_name":"Ada","theme":"dark"}"#)
        try source.admin.query("insert into public.profiles (id, full_name) values ($1, 'Ada L')", ada)
        _ = try addEvents(source, user: ada, [("a", "{}", "2026-03-01 10:00:00+00")])
        _ = try addOpaqueSession(source, user: ada, tokens: ["adaLive"])
        let bob = try addUser(source, email: "bob@example.com")
        let server = try startServer()
        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        let db = try destination(server)
        XCTAssertEqual(
            try recorded(db, ada).prefix(3),
            ["ada@example.com", #""Ada L""#, #"{"theme": "dark", "full_name": "Ada L"}"#])

        try source.admin.query(
            """
            update auth.users set email = 'Ada.New@Example.com', updated_at = now(),
              raw_user_meta_data = raw_user_meta_data || '{"theme":"light"}' where id = $1
            """, ada)
        try source.admin.query("update public.profiles set full_name = 'Ada Lovelace' where id = $1", ada)

        (result, report, _) = try importCommand(server, from: source.url, ["--dry-run"])
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(report?["users_updated"] as? Int, 1)
        XCTAssertEqual(try userHere(db, ada).email, "ada@example.com", "a dry run changes nothing")

        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(report?["users_updated"] as? Int, 1)
        XCTAssertEqual(conflicts(report), [])
        let here = try userHere(db, ada)
        XCTAssertEqual(here.email, "ada.new@example.com")
        XCTAssertEqual(here.name, "Ada Lovelace")
        XCTAssertEqual(here.metadata, #"{"theme": "light", "full_name": "Ada Lovelace"}"#)
        XCTAssertEqual(try userHere(db, bob).email, "bob@example.com")
        // The same account: its session goes on, its events are there, and the new address
        // signs into it.
        XCTAssertEqual(try refreshStatus(server, "adaLive"), 200)
        XCTAssertEqual(try signInWithCode(server, "ada.new@example.com"), ada.uuidString.lowercased())
        XCTAssertEqual(
            try db.query("select count(*) from events where user_id = $1", ada)[0].decode(Int64.self, column: 0), 1)
        XCTAssertEqual(try db.query("select count(*) from users")[0].decode(Int64.self, column: 0), 2)

        let before = try recorded(db, ada)
        XCTAssertEqual(before.first, "ada.new@example.com")
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(report?["users_updated"] as? Int, 0)
        XCTAssertEqual(try recorded(db, ada), before, "a run with nothing new writes no record")
    }

    /// What changed here since the import is never overwritten: an address changed on both
    /// sides, a name changed on both sides, a metadata key changed on both sides, and a new
    /// hosted address another user here already has (one who signed up here with it) are
    /// conflicts — reported, exit 3, the values here kept, run after run. Metadata keys
    /// changed on one side only are merged; the users' events still arrive.
    func testChangesOnBothSidesAndATakenAddressAreConflictsAndNothingHereIsOverwritten() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com", metadata: #"{"full_name":"Ada"}"#)
        let bob = try addUser(source, email: "bob@example.com")
        let carol = try addUser(
            source, email: "carol@example.com", metadata: #"{"theme":"dark","lang":"en","color":"red"}"#)
        let server = try startServer()
        var (result, report, rejectFile) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        let db = try destination(server)

        // Here: Ada's address changes (no route does that yet: as the owner), and her name
        // and Carol's metadata as the apps change them; Bob's new address signs up here.
        try db.query("update users set email = 'ada.here@example.com' where id = $1", ada)
        let adaSession = try nativeSession(server, "ada.here@example.com")
        XCTAssertEqual(
            try send(
                server, "PUT", "/auth/v1/user", body: #"{"data":{"full_name":"Ada Here"}}"#, token: adaSession.access
            )
            .status, 200)
        let carolSession = try nativeSession(server, "carol@example.com")
        XCTAssertEqual(
            try send(
                server, "PUT", "/auth/v1/user", body: #"{"data":{"lang":"fr","color":"blue"}}"#,
                token: carolSession.access
            ).status, 200)
        _ = try nativeSession(server, "bob.new@example.com")
        // There: the same fields change.
        try source.admin.query(
            """
            update auth.users set email = 'ada.there@example.com', raw_user_meta_data = '{"full_name":"Ada There"}'
            where id = $1
            """, ada)
        try source.admin.query("update auth.users set email = 'bob.new@example.com' where id = $1", bob)
        try source.admin.query(
            #"update auth.users set raw_user_meta_data = '{"theme":"light","lang":"en","color":"green"}' where id = $1"#,
            carol)
        _ = try addEvents(source, user: bob, [("a", "{}", "2026-03-01 10:00:00+00")])

        for run in 1...2 {
            (result, report, rejectFile) = try importCommand(server, from: source.url)
            XCTAssertEqual(result.status, 3, "run \(run): " + result.stderr + result.stdout)
            XCTAssertEqual(
                conflicts(report),
                [
                    [
                        "source_id": ada.uuidString.lowercased(), "email": "ada.there@example.com", "field": "email",
                        "email_here": "ada.here@example.com", "reason": "changed_on_both_sides",
                    ],
                    [
                        "source_id": ada.uuidString.lowercased(), "email": "ada.there@example.com",
                        "field": "full_name",
                        "reason": "changed_on_both_sides",
                    ],
                    [
                        "source_id": ada.uuidString.lowercased(), "email": "ada.there@example.com",
                        "field": "user_metadata", "reason": "changed_on_both_sides",
                    ],
                    [
                        "source_id": bob.uuidString.lowercased(), "email": "bob.new@example.com", "field": "email",
                        "email_here": "bob@example.com", "reason": "address_taken",
                    ],
                    [
                        "source_id": carol.uuidString.lowercased(), "email": "carol@example.com",
                        "field": "user_metadata", "reason": "changed_on_both_sides",
                    ],
                ].sorted { ($0["source_id"] ?? "", $0["field"] ?? "") < ($1["source_id"] ?? "", $1["field"] ?? "") },
                "run \(run)")
            XCTAssertEqual(report?["users_updated"] as? Int, run == 1 ? 1 : 0, "Carol's theme, once")
            let adaHere = try userHere(db, ada)
            XCTAssertEqual(adaHere.email, "ada.here@example.com")
            XCTAssertEqual(adaHere.name, "Ada Here")
            XCTAssertEqual(adaHere.metadata, #"{"full_name": "Ada Here"}"#)
            XCTAssertEqual(try userHere(db, bob).email, "bob@example.com")
            XCTAssertEqual(
                try userHere(db, carol).metadata, #"{"lang": "fr", "color": "blue", "theme": "light"}"#,
                "the theme changed there only is carried; the rest changed here is kept")
        }
        XCTAssertEqual(
            try db.query("select count(*) from events where user_id = $1", bob)[0].decode(Int64.self, column: 0), 1,
            "a conflict over an address does not hold back the user's events")
        let rejects = try String(contentsOfFile: rejectFile, encoding: .utf8)
        XCTAssertTrue(rejects.contains("email not carried over"), rejects)
        XCTAssertFalse(rejects.contains("Ada Here") || rejects.contains("Ada There"), "no values in the reject file")

        // Resolved by making the two sides agree: no conflict left for that field.
        try source.admin.query("update auth.users set email = 'ada.here@example.com' where id = $1", ada)
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertFalse(
            conflicts(report).contains { $0["source_id"] == ada.uuidString.lowercased() && $0["field"] == "email" })
        XCTAssertEqual(try recorded(db, ada).first, "ada.here@example.com")
    }

    /// A database imported before the import recorded what it wrote (migration 0016):
    /// the migration records each imported user's address (nothing here could change an
    /// address until then), so an address changed on the hosted project since is carried
    /// over. Names and metadata are not recorded: where both sides agree the next run
    /// records them; where they differ it cannot tell which side changed, keeps the value
    /// here and reports `not_recorded` until they agree.
    func testADatabaseImportedBeforeTheRecordCarriesAddressesAndReportsUnknownNames() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com", metadata: #"{"full_name":"Ada"}"#)
        let bob = try addUser(source, email: "bob@example.com", metadata: #"{"full_name":"Bob"}"#)
        let server = try startServer()
        var (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        let db = try destination(server)
        // Back to before migration 0016 (and the ones after it), then migrated again as an
        // upgrade does.
        try db.execute(
            """
            drop table supabase_imported_users;
            drop function trunk_sync_seq_timeline_check();
            drop function trunk_sync_seq_timeline(boolean);
            drop table wal_timeline;
            alter table users drop column seq_skipped;
            alter table otp_codes drop column signup_data;
            drop table supabase_imported_tokens;
            drop function trunk_sync_trim_stale_codes(integer);
            delete from schema_migrations where version >= 16;
            """)
        let migrated = try Command.run(Command.trunkSyncBinary(), ["migrate"], environment: server.environment)
        XCTAssertEqual(migrated.status, 0, migrated.stderr)
        XCTAssertEqual(try recorded(db, ada).prefix(3), ["ada@example.com", nil, nil])

        try source.admin.query(
            #"update auth.users set email = 'ada.new@example.com', raw_user_meta_data = '{"full_name":"Ada New"}' where id = $1"#,
            ada)
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 3, result.stderr + result.stdout)
        XCTAssertEqual(report?["users_updated"] as? Int, 1)
        XCTAssertEqual(
            Set(conflicts(report).map { [$0["source_id"] ?? "", $0["field"] ?? "", $0["reason"] ?? ""] }),
            [
                [ada.uuidString.lowercased(), "full_name", "not_recorded"],
                [ada.uuidString.lowercased(), "user_metadata", "not_recorded"],
            ])
        let adaHere = try userHere(db, ada)
        XCTAssertEqual(adaHere.email, "ada.new@example.com")
        XCTAssertEqual(adaHere.name, "Ada")
        XCTAssertEqual(try recorded(db, bob).prefix(3), ["bob@example.com", #""Bob""#, #"{"full_name": "Bob"}"#])

        // Ada sets the same name here: both sides agree, recorded, no conflict left.
        let session = try nativeSession(server, "ada.new@example.com")
        XCTAssertEqual(
            try send(server, "PUT", "/auth/v1/user", body: #"{"data":{"full_name":"Ada New"}}"#, token: session.access)
                .status, 200)
        (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(result.status, 0, result.stderr + result.stdout)
        XCTAssertEqual(
            try recorded(db, ada).prefix(3), ["ada.new@example.com", #""Ada New""#, #"{"full_name": "Ada New"}"#])
    }

    func testAClashOfAFirstImportedEventFallsBackToTheLookUpAndTheRestArrives() throws {
        // Users with no event here get their events numbered by the import and inserted
        // without a look-up. An event whose id another user's event here already has makes
        // that insert fail: the batch is rolled back and written the careful way.
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        _ = try addEvents(
            source, user: ada,
            [
                ("a", "{}", "2026-03-01 10:00:00+00"), ("b", "{}", "2026-03-01 10:00:01+00"),
                ("c", "{}", "2026-03-01 10:00:02+00"),
            ])
        let bob = try addUser(source, email: "bob@example.com")
        _ = try addEvents(
            source, user: bob, [("a", "{}", "2026-03-01 11:00:00+00"), ("b", "{}", "2026-03-01 11:00:01+00")])
        let taken = try source.admin.query(
            "select id::text from public.events where user_id = $1 order by created_at limit 1", bob)[0].decode(
                String.self, column: 0)
        let server = try startServer()
        let db = try destination(server)
        let zed = UUID()
        try db.query("insert into users (id, email, last_seq) values ($1, 'zed@example.com', 1)", zed)
        try db.query(
            """
            insert into events (id, user_id, seq, type, payload, client_id, client_timestamp, created_at)
            values ($1::uuid, $2, 1, 'z', '{}', gen_random_uuid(), now(), now())
            """, taken, zed)

        let (result, report, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(
            result.status, 4, "the verification names the event that could not come: " + result.stderr + result.stdout)
        XCTAssertEqual(counts(report, "events")["imported"], 4)
        XCTAssertEqual(
            (report?["verification"] as? [String: Any])?["incomplete_users"] as? [String: Int],
            [bob.uuidString.lowercased(): 1])
        let seqs = try db.query("select seq from events where user_id = $1 order by seq", ada).map {
            try $0.decode(Int64.self, column: 0)
        }
        XCTAssertEqual(seqs, [1, 2, 3])
        XCTAssertEqual(
            try db.query("select count(*) from events where user_id = $1", bob)[0].decode(Int64.self, column: 0), 1)
        XCTAssertEqual(
            try db.query("select user_id from events where id = $1::uuid", taken)[0].decode(UUID.self, column: 0), zed)
    }

    func testDryRunWritesNothing() throws {
        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        _ = try addEvents(
            source, user: ada, [("a", "[]", "2026-03-01 10:00:00+00"), ("b", "{}", "2026-03-01 10:00:01+00")])
        _ = try addOpaqueSession(source, user: ada, tokens: ["t1"])
        let server = try startServer()
        let (result, report, rejectFile) = try importCommand(server, from: source.url, ["--dry-run"])
        XCTAssertEqual(result.status, 3, result.stderr)
        XCTAssertEqual(report?["dry_run"] as? Bool, true)
        XCTAssertEqual(counts(report, "users")["imported"], 1)
        XCTAssertEqual(counts(report, "events")["imported"], 1)
        XCTAssertEqual(counts(report, "events")["rejected"], 1)
        XCTAssertEqual(counts(report, "sessions")["imported"], 1)
        let db = try destination(server)
        for table in [
            "users", "events", "sessions", "refresh_tokens", "supabase_import_progress", "supabase_imported_sessions",
            "supabase_imported_tokens", "supabase_imported_users",
        ] {
            XCTAssertEqual(try db.query("select count(*) from \(table)")[0].decode(Int64.self, column: 0), 0, table)
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: rejectFile), "a dry run writes no reject file")
    }

    /// Supabase shows a connection string with `sslmode=require`: the import reads a source
    /// over TLS. The test cluster takes TLS (`TestCluster.enableTLS`) for the length of the
    /// test.
    func testASourceReachedWithSslmodeRequireIsReadOverTLS() throws {
        let tls = try TestCluster.enableTLS()
        defer { tls.disable() }

        let source = try makeSource()
        let ada = try addUser(source, email: "ada@example.com")
        _ = try addEvents(source, user: ada, [("a", "{}", "2026-03-01 10:00:00+00")])
        let server = try startServer()
        let url = source.url.replacingOccurrences(of: "sslmode=prefer", with: "sslmode=require")
        XCTAssertTrue(url.hasSuffix("sslmode=require"))
        let (result, report, _) = try importCommand(server, from: url)
        XCTAssertEqual(result.status, 0, result.stderr)
        XCTAssertEqual(counts(report, "events")["imported"], 1)
        XCTAssertEqual(
            try destination(server).query("select count(*) from events")[0].decode(Int64.self, column: 0), 1)
    }

    func testClearOneLineErrors() throws {
        let server = try startServer()
        func failure(_ url: String, environment: [String: String]? = nil) throws -> String {
            let result = try Command.run(
                Command.trunkSyncBinary(), ["import", "supabase", "--from", url, "--reject-file", "/dev/null"],
                environment: environment ?? server.environment)
            XCTAssertEqual(result.status, 1, result.stdout + result.stderr)
            XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, result.stderr)
            return result.stderr
        }
        // Unreachable, wrong password.
        XCTAssertTrue(try failure("postgres://nobody@127.0.0.1:1/x?connect_timeout=2").contains("could not connect"))
        let source = try makeSource()
        let wrong = source.url.replacingOccurrences(of: ":pw-", with: ":wrong-")
        let refused = try failure(wrong)
        XCTAssertTrue(refused.contains("password authentication failed"), refused)
        XCTAssertFalse(refused.contains("wrong-"), "no password in the message")
        // A login that does not bypass row-level security would see no users.
        XCTAssertTrue(try failure(try makeSource(bypassRLS: false).url).contains("does not bypass row-level security"))
        // A database that is not a Supabase project's, and one missing a column.
        XCTAssertTrue(try failure(try makeSource(schema: "select 1").url).contains("no table auth.users"))
        let missing = try makeSource(schema: Self.schema + "alter table public.events drop column client_timestamp;")
        XCTAssertTrue(try failure(missing.url).contains("public.events lacks column(s) client_timestamp"))
        // A destination not migrated.
        let empty = try TestDatabase.create(prefix: "supadst")
        sources.append(empty)
        var environment = server.environment
        environment["TRUNK_SYNC_DATABASE_URL"] = try TestDatabase.url(of: empty)
        XCTAssertTrue(try failure(source.url, environment: environment).contains("not migrated"))
        // Another import running against the destination (its session holds the import's
        // advisory lock, `SupabaseImport.advisoryLockKey`): refused at once, nothing written.
        _ = try addUser(source, email: "ada@example.com")
        let other = try destination(server)
        let importLock: Int64 = 0x7472_756e_6b69_6d70
        XCTAssertTrue(try other.query("select pg_try_advisory_lock($1)", importLock)[0].decode(Bool.self, column: 0))
        let concurrent = try failure(source.url)
        XCTAssertTrue(concurrent.contains("another trunk-sync import supabase is running"), concurrent)
        XCTAssertEqual(try other.query("select count(*) from users")[0].decode(Int64.self, column: 0), 0)
        _ = try other.query("select pg_advisory_unlock($1)", importLock)
        let (after, _, _) = try importCommand(server, from: source.url)
        XCTAssertEqual(after.status, 0, after.stderr)
        XCTAssertEqual(try other.query("select count(*) from users")[0].decode(Int64.self, column: 0), 1)
    }

    func testImportedJWKSVerifiesTheHostedProjectsES256Tokens() throws {
        let database = try TestDatabase.create(prefix: "jwks")
        sources.append(database)
        let environment = ServerProcess.serveEnvironment(
            databaseURL: try TestDatabase.url(of: database), overrides: [:])
        XCTAssertEqual(try Command.run(Command.trunkSyncBinary(), ["migrate"], environment: environment).status, 0)
        let hostedKey = try JWT.ES256Key.generate(keyID: "hosted-es256")
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("jwks-\(UUID().uuidString).json").path
        files.append(file)
        try Data(#"{"keys":[\#(hostedKey.publicJWK)]}"#.utf8).write(to: URL(fileURLWithPath: file))
        let imported = try Command.run(
            Command.trunkSyncBinary(), ["keys", "import-jwks", file], environment: environment)
        XCTAssertEqual(imported.status, 0, imported.stderr)
        XCTAssertTrue(imported.stdout.contains("imported ES256 key hosted-es256"), imported.stdout)
        let listed = try Command.run(Command.trunkSyncBinary(), ["keys", "list"], environment: environment)
        XCTAssertTrue(listed.stdout.contains("imported (verifies only)"), listed.stdout)
        // A file with a private key is refused, with one line, and stores nothing.
        let privateFile = file + ".private"
        files.append(privateFile)
        try Data((hostedKey.publicJWK.dropLast() + #","d":"AAAA"}"#).utf8).write(to: URL(fileURLWithPath: privateFile))
        let refused = try Command.run(
            Command.trunkSyncBinary(), ["keys", "import-jwks", privateFile], environment: environment)
        XCTAssertEqual(refused.status, 1)
        XCTAssertTrue(refused.stderr.contains("private member"), refused.stderr)

        let user = UUID()
        let session = UUID()
        let admin = try PostgresConnection.connect(database)
        try admin.query("insert into users (id, email) values ($1, 'es@example.com')", user)
        let server = try launchServer(on: database, ["TRUNK_SYNC_ACCEPTED_ISSUERS": Self.hostedIssuer])
        try server.waitUntilListening(timeout: 15)
        let now = Int64(Date().timeIntervalSince1970)
        let claims = """
            {"iss":"\(Self.hostedIssuer)","sub":"\(user.uuidString.lowercased())","aud":"authenticated","exp":\(now + 600),\
            "iat":\(now),"role":"authenticated","aal":"aal1","session_id":"\(session.uuidString.lowercased())","is_anonymous":false}
            """
        let token = try JWT.sign(payload: Array(claims.utf8), with: hostedKey)
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: token).status, 200)
        // jwks.json lists the imported key, so a JWKS consumer (supabase-js `getClaims()`, an
        // app's backend) verifies the hosted tokens too: PyJWT, an independent verifier.
        let jwks = try send(server, "GET", "/auth/v1/.well-known/jwks.json").bodyText
        XCTAssertTrue(jwks.contains(#""kid":"hosted-es256""#), jwks)
        let verify = """
            import jwt, sys
            token, jwks = sys.argv[1:3]
            key = jwt.PyJWKSet.from_json(jwks)[jwt.get_unverified_header(token)["kid"]]
            print(jwt.decode(token, key.key, algorithms=["ES256"], audience="authenticated")["sub"])
            """
        let verified = try Command.run("/usr/bin/python3", ["-c", verify, token, jwks])
        XCTAssertEqual(verified.status, 0, verified.stderr)
        XCTAssertEqual(verified.stdout.trimmingCharacters(in: .whitespacesAndNewlines), user.uuidString.lowercased())
        let other = try JWT.sign(payload: Array(claims.utf8), with: try JWT.ES256Key.generate(keyID: "hosted-es256"))
        XCTAssertEqual(try send(server, "GET", "/sync/v1/events?after=0", token: other).status, 401)
    }
}
