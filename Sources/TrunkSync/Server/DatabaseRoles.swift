import Foundation
import Logging
import Postgres

/// The database roles trunk-sync uses, and the checks that keep the database a second wall.
///
/// - The **owner** (`TRUNK_SYNC_MIGRATION_DATABASE_URL`, default `TRUNK_SYNC_DATABASE_URL`)
///   owns the tables: `migrate`, `keys` and `users` log in as it. It is a member of
///   `trunk_sync_admin`, whose policies show it every row.
/// - `trunk_sync_app` (no login) holds exactly the grants the server's queries need;
///   row-level security binds it. Every server connection switches to it (`SET ROLE`).
/// - The **server's login** (`TRUNK_SYNC_DATABASE_URL`): when it names another role than
///   the owner, `migrate` creates or updates it as a member of `trunk_sync_app` with no
///   other rights, so even a session that undoes `SET ROLE` holds nothing more. When it is
///   the owner itself (the setup before this split), `SET ROLE` is all that separates the
///   server from the owner's rights, which a compromised session can undo: `serve` and
///   `config check` warn.
public enum DatabaseRoles {
    /// The role every server query runs as (created by migration 0001).
    public static let app = "trunk_sync_app"
    /// The role whose policies show the owner's tools every row (migration 0003).
    public static let admin = "trunk_sync_admin"

    /// The login role named in `TRUNK_SYNC_DATABASE_URL`, and the password given there.
    public struct ServerLogin: Sendable, Equatable {
        public var name: String
        public var password: String?

        /// The user and password of `url`, or nil when it names no user (libpq would use the
        /// operating system's user name; `migrate` leaves such a role alone).
        public init?(url: String) throws {
            let parsed = try PostgresConfiguration(url)
            guard let name = parsed["user"], !name.isEmpty else { return nil }
            self.name = name
            password = parsed["password"].flatMap { $0.isEmpty ? nil : $0 }
        }
    }

    /// Why `migrate` will not create or update the server's login role. Nothing has been
    /// changed when it is thrown.
    public enum RoleError: Error, Equatable, CustomStringConvertible {
        /// The role has rights a server must not have.
        case privileged(role: String, attributes: [String])
        /// The role owns objects in this database or can become their owner.
        case owner(role: String)
        /// The role is one of trunk-sync's own group roles.
        case reserved(role: String)

        public var description: String {
            let advice =
                "name a role only the server uses in TRUNK_SYNC_DATABASE_URL (migrate creates it); nothing was changed"
            switch self {
            case .privileged(let role, let attributes):
                return
                    "TRUNK_SYNC_DATABASE_URL logs in as \(role), which has \(attributes.joined(separator: ", ")): \(advice)"
            case .owner(let role):
                return
                    "TRUNK_SYNC_DATABASE_URL logs in as \(role), which owns objects in this database or is a member of "
                    + "their owner: \(advice)"
            case .reserved(let role):
                return "TRUNK_SYNC_DATABASE_URL logs in as \(role), a group role of trunk-sync: \(advice)"
            }
        }
    }

    /// What `ensureServerLogin` did.
    public enum Outcome: Sendable, Equatable {
        /// TRUNK_SYNC_DATABASE_URL names the role `migrate` runs as: nothing to do.
        case sameAsOwner
        case created(String)
        case updated(String)
    }

    /// Whether `login` is the role `connection` is logged in as (no split).
    static func isSessionUser(_ login: ServerLogin, on connection: PostgresConnection) throws -> Bool {
        try connection.query("select session_user::text = $1", login.name)[0].decode(Bool.self, column: 0)
    }

    /// Before `migrate` applies anything: refuses a server login role that must not serve
    /// (a superuser, one with rights to create roles or databases, replicate or bypass
    /// row-level security, an owner of something here or a member of the tables' owner),
    /// rather than stripping rights from what may be an administrator's role.
    public static func checkServerLogin(_ login: ServerLogin, on connection: PostgresConnection) throws {
        if try isSessionUser(login, on: connection) { return }
        if login.name == admin { throw RoleError.reserved(role: login.name) }
        let rows = try connection.query(
            """
            select r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls,
                   exists (select 1 from pg_class where relowner = r.oid)
                   or exists (select 1 from pg_namespace where nspowner = r.oid)
                   or exists (select 1 from pg_proc where proowner = r.oid)
                   or exists (select 1 from pg_database where datname = current_database() and datdba = r.oid)
                   or coalesce((select pg_has_role(r.oid, c.relowner, 'MEMBER') from pg_class c
                                where c.oid = to_regclass('public.users')), false)
            from pg_roles r where r.rolname = $1
            """, login.name)
        guard let row = rows.first else { return }  // created after migrating
        let names = ["SUPERUSER", "CREATEROLE", "CREATEDB", "REPLICATION", "BYPASSRLS"]
        let attributes = try names.indices.filter { try row.decode(Bool.self, column: $0) }.map { names[$0] }
        if !attributes.isEmpty { throw RoleError.privileged(role: login.name, attributes: attributes) }
        if try row.decode(Bool.self, column: 5) { throw RoleError.owner(role: login.name) }
    }

    /// After `migrate` applied everything: creates the server's login role, or updates it —
    /// LOGIN, the password from the URL (sent as a verifier, never in clear), membership in
    /// `trunk_sync_app` and nothing of `trunk_sync_admin` — and lets `trunk_sync_app`
    /// connect to this database. Run `checkServerLogin` first.
    public static func ensureServerLogin(_ login: ServerLogin, on connection: PostgresConnection) throws -> Outcome {
        if try isSessionUser(login, on: connection) { return .sameAsOwner }
        let role = try connection.quoteIdentifier(login.name)
        let password =
            try login.password.map {
                " password " + (try connection.quoteLiteral(try connection.encryptedPassword($0, role: login.name)))
            } ?? ""
        let exists = try connection.query("select 1 from pg_roles where rolname = $1", login.name).count > 0
        // Attributes not named keep their defaults (NOSUPERUSER, NOCREATEDB, …) on create;
        // checkServerLogin refused an existing role that has any of them.
        try connection.execute((exists ? "alter role \(role) login" : "create role \(role) login") + password)
        if login.name != app,
            try !connection.query("select pg_has_role($1, $2, 'MEMBER')", login.name, app)[0].decode(
                Bool.self, column: 0)
        {
            try connection.execute("grant \(try connection.quoteIdentifier(app)) to \(role)")
        }
        let inAdmin = try connection.query(
            """
            select exists (select 1 from pg_auth_members m join pg_roles g on g.oid = m.roleid
                           join pg_roles u on u.oid = m.member where g.rolname = $2 and u.rolname = $1)
            """, login.name, admin)[0].decode(Bool.self, column: 0)
        if inAdmin { try connection.execute("revoke \(try connection.quoteIdentifier(admin)) from \(role)") }
        let canConnect = try connection.query(
            "select has_database_privilege($1, current_database(), 'CONNECT')", login.name)[0].decode(
                Bool.self, column: 0)
        if !canConnect {
            let database = try connection.query("select current_database()::text")[0].decode(String.self, column: 0)
            try connection.execute(
                "grant connect on database \(try connection.quoteIdentifier(database)) to \(try connection.quoteIdentifier(app))"
            )
        }
        return exists ? .updated(login.name) : .created(login.name)
    }

    /// What `serve` and `config check` say about the role `TRUNK_SYNC_DATABASE_URL` logs in
    /// with (on a connection opened with it): at most one warning about rights that make
    /// row-level security moot, and an error when it cannot switch to `trunk_sync_app`.
    public struct Findings: Sendable, Equatable {
        public var warning: String?
        public var error: String?
        public init(warning: String? = nil, error: String? = nil) {
            self.warning = warning
            self.error = error
        }
    }

    public static func check(on connection: PostgresConnection) throws -> Findings {
        let row = try connection.query(
            """
            select session_user::text, r.rolsuper, r.rolbypassrls,
                   exists (select 1 from pg_class c where c.oid in (to_regclass('public.users'), to_regclass('public.events'))
                           and pg_has_role(session_user, c.relowner, 'MEMBER')),
                   to_regrole($1) is not null and pg_has_role(session_user, $1, 'MEMBER'),
                   to_regrole($2) is not null and pg_has_role(session_user, $2, 'MEMBER')
            from pg_roles r where r.rolname = session_user
            """, admin, app)[0]
        let name = try row.decode(String.self, column: 0)
        let advice =
            "give the server a login role of its own: set TRUNK_SYNC_MIGRATION_DATABASE_URL to the owner's URL and "
            + "TRUNK_SYNC_DATABASE_URL to a new role, then run trunk-sync migrate (docs/operations.md: Database roles)"
        var findings = Findings()
        if try row.decode(Bool.self, column: 1) {
            findings.warning =
                "TRUNK_SYNC_DATABASE_URL logs in as \(name), a superuser: row-level security does not bind it and "
                + "a session can undo SET ROLE \(app); \(advice)"
        } else if try row.decode(Bool.self, column: 2) {
            findings.warning =
                "TRUNK_SYNC_DATABASE_URL logs in as \(name), which bypasses row-level security once a session undoes "
                + "SET ROLE \(app); \(advice)"
        } else if try row.decode(Bool.self, column: 3) {
            findings.warning =
                "TRUNK_SYNC_DATABASE_URL logs in as \(name), which owns the tables (or can become their owner): "
                + "a session can undo SET ROLE \(app) and read every user's rows; \(advice)"
        } else if try row.decode(Bool.self, column: 4) {
            findings.warning =
                "TRUNK_SYNC_DATABASE_URL logs in as \(name), a member of \(admin), which sees every user's rows once "
                + "a session undoes SET ROLE \(app); \(advice)"
        }
        if try !row.decode(Bool.self, column: 5) {
            findings.error =
                "TRUNK_SYNC_DATABASE_URL logs in as \(name), which cannot SET ROLE \(app), so every query fails: "
                + "run trunk-sync migrate with TRUNK_SYNC_MIGRATION_DATABASE_URL set to the owner's URL"
        }
        return findings
    }

    /// `trunk-sync users`, `keys add` and `keys retire` logged in as a role that cannot see
    /// or change every row (the server's own login).
    public struct OwnerRequired: Error, CustomStringConvertible {
        public var role: String
        public var description: String {
            "this command needs the tables' owner, but the database URL logs in as \(role): set "
                + "TRUNK_SYNC_MIGRATION_DATABASE_URL to the URL trunk-sync migrate uses"
        }
    }

    /// `migrate` given a login that does not own the tables (the server's own, say): it
    /// would fail on the first thing it reads or changes with a bare `42501`.
    public struct SchemaOwnerRequired: Error, CustomStringConvertible {
        public var setting: String
        public var role: String
        public var owner: String
        public var description: String {
            "\(setting) logs in as \(role), but the tables belong to \(owner): migrate runs as their owner; set "
                + "TRUNK_SYNC_MIGRATION_DATABASE_URL to the owner's URL (with docker compose: docker compose run "
                + "--rm migrate); nothing was changed"
        }
    }

    /// Before `migrate` changes anything: once the schema exists (`schema_migrations`), the
    /// login must be its owner or act as it (a member, or a superuser). `setting` names the URL.
    public static func requireSchemaOwner(on connection: PostgresConnection, setting: String) throws {
        let rows = try connection.query(
            """
            select current_user::text, pg_get_userbyid(c.relowner)::text, pg_has_role(current_user, c.relowner, 'USAGE')
            from pg_class c where c.oid = to_regclass('schema_migrations')
            """)
        guard let row = rows.first, try !row.decode(Bool.self, column: 2) else { return }
        throw SchemaOwnerRequired(
            setting: setting, role: try row.decode(String.self, column: 0),
            owner: try row.decode(String.self, column: 1))
    }

    /// Refuses, before the owner's tools run, a login that row-level security would show
    /// nothing (so `users list` would print an empty table instead of an error).
    /// On a blocking connection (the import).
    public static func requireOwner(on connection: PostgresConnection) throws {
        try requireOwner(try connection.query(ownerCheck, admin)[0])
    }

    /// `requireOwner(on:)` through the door: the owner's command-line tools
    /// (`ownerDatabase`).
    public static func requireOwner(on tx: Transaction) async throws {
        try requireOwner(try await tx.query(ownerCheck, admin)[0])
    }

    /// The login's name, and whether it sees every row.
    private static let ownerCheck = """
        select current_user::text, r.rolsuper or r.rolbypassrls
               or (to_regrole($1) is not null and pg_has_role(current_user, $1, 'USAGE'))
        from pg_roles r where r.rolname = current_user
        """

    private static func requireOwner(_ row: PostgresRow) throws {
        if try !row.decode(Bool.self, column: 1) { throw OwnerRequired(role: try row.decode(String.self, column: 0)) }
    }
}

extension DatabaseRoles {
    /// Logs in once with `url` (the server's `TRUNK_SYNC_DATABASE_URL`) on a blocking
    /// connection on a thread of its own (one login, one query: no pool, no loop; the thread
    /// ends once it answered, and the command joins it at exit) and logs what `check` finds: a warning line for rights
    /// that make row-level security moot, an error line when the role cannot switch to
    /// `trunk_sync_app`, a warning when the database cannot be reached to tell. Never fails:
    /// `serve` and `config check` go on either way. Cancelling the task ends a connection
    /// attempt under way, quietly.
    @discardableResult
    public static func report(url: String, logger: Logger) async -> Findings? {
        do {
            var database = try PostgresConfiguration(url)
            database.setParameter("connect_timeout", "5")
            let findings = try await withBlockingConnection(database, thread: "pg-role-check") { try check(on: $0) }
            if let warning = findings.warning { logger.warning("\(warning)") }
            if let error = findings.error { logger.error("\(error)") }
            return findings
        } catch is CancellationError {
            return nil  // `serve` stopping during its start-up: nothing to say
        } catch {
            logger.warning(
                "cannot check the database role TRUNK_SYNC_DATABASE_URL logs in as", metadata: ["error": "\(error)"])
            return nil
        }
    }
}
