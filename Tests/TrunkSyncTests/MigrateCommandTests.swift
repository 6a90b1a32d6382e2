import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

/// `trunk-sync migrate` as operators run it: the real binary against a real database.
final class MigrateCommandTests: XCTestCase {
    var database: PostgresConfiguration!
    var environment: [String: String]!

    override func setUpWithError() throws {
        database = try TestDatabase.create(prefix: "cli")
        environment = Command.environment([
            "TRUNK_SYNC_DATABASE_URL": try TestDatabase.url(of: database),
            "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
        ])
    }

    override func tearDownWithError() throws { try TestDatabase.drop(database) }

    func migrate(_ arguments: [String] = []) throws -> Command.Result {
        try Command.run(Command.trunkSyncBinary(), ["migrate"] + arguments, environment: environment)
    }

    func testMigrateTwiceAppliesOnce() throws {
        let first = try migrate()
        XCTAssertEqual(first.status, 0, first.stderr)
        XCTAssertTrue(first.stdout.contains("applied 0001_initial_schema.sql"), first.stdout)
        // Named once, on stdout (a log line on stderr named each a second time).
        XCTAssertEqual(
            (first.stdout + first.stderr).components(separatedBy: "0001_initial_schema.sql").count, 2,
            first.stdout + first.stderr)
        let second = try migrate()
        XCTAssertEqual(second.status, 0, second.stderr)
        XCTAssertTrue(second.stdout.contains("database is up to date"), second.stdout)
        let status = try migrate(["status"])
        XCTAssertEqual(status.status, 0, status.stderr)
        XCTAssertTrue(status.stdout.contains("applied  0001_initial_schema.sql"), status.stdout)
        XCTAssertTrue(status.stdout.contains("0 pending"), status.stdout)
    }

    /// After a restore the database runs on another WAL timeline (simulated here by the
    /// recorded one differing): `migrate` moves every user's next seq past anything a device
    /// may have seen — to the time in microseconds, at least `SeqTimeline.gap` ahead — once,
    /// keeping the count of events stored; `--after-restore` does the same for a restore that
    /// keeps the timeline (`scripts/drill-restore.sh` restores and promotes for real).
    func testANewWALTimelineMovesEveryUsersNextSeqOnce() throws {
        XCTAssertEqual(try migrate().status, 0)
        let owner = try PostgresConnection.connect(database)
        let current = try owner.query("select timeline from wal_timeline")[0].decode(Int64.self, column: 0)
        XCTAssertGreaterThanOrEqual(current, 1)
        try owner.query(
            "insert into users (email, last_seq) values ('restored@example.com', 7), ('new@example.com', 0)")
        /// last_seq and the events stored (last_seq - seq_skipped), by email.
        func seqs() throws -> [[Int64]] {
            try owner.query("select last_seq, last_seq - seq_skipped from users order by email").map {
                [try $0.decode(Int64.self, column: 0), try $0.decode(Int64.self, column: 1)]
            }
        }
        func databaseMicroseconds() throws -> Int64 {
            try owner.query("select (extract(epoch from now()) * 1000000)::int8")[0].decode(Int64.self, column: 0)
        }
        let same = try migrate()
        XCTAssertEqual(same.status, 0, same.stderr)
        XCTAssertFalse(same.stdout.contains("timeline"), same.stdout)
        XCTAssertEqual(try seqs(), [[0, 0], [7, 7]])
        // None recorded (a database migrated before 0017) on the cluster's first timeline:
        // recorded, nothing moved.
        try owner.query("delete from wal_timeline")
        let first = try migrate()
        XCTAssertEqual(first.status, 0, first.stderr)
        XCTAssertFalse(first.stdout.contains("timeline"), first.stdout)
        XCTAssertEqual(try seqs(), [[0, 0], [7, 7]])
        XCTAssertEqual(try owner.query("select timeline from wal_timeline")[0].decode(Int64.self, column: 0), current)

        XCTAssertEqual(
            try owner.query("update wal_timeline set timeline = timeline + 1 returning timeline")[0].decode(
                Int64.self, column: 0), current + 1)
        let before = try databaseMicroseconds()
        let restored = try migrate()
        XCTAssertEqual(restored.status, 0, restored.stderr)
        XCTAssertTrue(restored.stdout.contains("on WAL timeline \(current), after \(current + 1)"), restored.stdout)
        XCTAssertTrue(restored.stdout.contains("the next seq of 2 user(s) moved past anything"), restored.stdout)
        let moved = try seqs()
        XCTAssertEqual(moved.map { $0[1] }, [0, 7], "the events stored are still counted")
        for row in moved { XCTAssertGreaterThanOrEqual(row[0], max(before, row[1] + SeqTimeline.gap)) }
        XCTAssertEqual(try owner.query("select timeline from wal_timeline")[0].decode(Int64.self, column: 0), current)
        let again = try migrate()
        XCTAssertFalse(again.stdout.contains("timeline"), "once: \(again.stdout)")
        XCTAssertEqual(try seqs(), moved)

        let told = try migrate(["--after-restore"])
        XCTAssertEqual(told.status, 0, told.stderr)
        XCTAssertTrue(told.stdout.contains("--after-restore; the next seq of 2 user(s)"), told.stdout)
        let movedAgain = try seqs()
        XCTAssertEqual(movedAgain.map { $0[1] }, [0, 7])
        for (row, earlier) in zip(movedAgain, moved) {
            XCTAssertGreaterThanOrEqual(row[0], earlier[0] + SeqTimeline.gap)
        }
    }

    /// A migrations directory older than the binary (without the check's migration, 0018,
    /// but with 0017's `wal_timeline`): `migrate` cannot check the timeline, and says so
    /// rather than let a failover or restore since the last run go unnoticed in silence.
    func testAMigrationsDirectoryWithoutTheCheckSaysNothingWasChecked() throws {
        let directory = NSTemporaryDirectory() + "before-0018-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for name in try FileManager.default.contentsOfDirectory(atPath: repositoryRoot() + "/migrations")
        where name < "0018_seq_timeline_function.sql" {
            try FileManager.default.copyItem(
                atPath: repositoryRoot() + "/migrations/" + name, toPath: directory + "/" + name)
        }
        environment["TRUNK_SYNC_MIGRATIONS_DIR"] = directory
        XCTAssertEqual(try migrate().status, 0)
        let owner = try PostgresConnection.connect(database)
        try owner.execute("insert into wal_timeline (timeline) values (99)")  // another timeline
        for arguments in [[], ["--after-restore"]] {
            let result = try migrate(arguments)
            XCTAssertEqual(result.status, 0, result.stderr)
            XCTAssertTrue(
                result.stdout.contains(
                    "migration 0018_seq_timeline_function.sql is not in this migrations directory (\(directory))"),
                "\(arguments): \(result.stdout)")
        }
    }

    /// A `lock_timeout` or `statement_timeout` set for the database (which the owner's
    /// sessions get too) does not cut the move short: it waits for the rows pushes hold and
    /// takes as long as updating every user takes (tens of seconds for 500,000 users), and
    /// `migrate` failing on it would keep a deployment that runs it before its servers (as
    /// docker-compose.yml does) from coming back after a restore.
    func testTheMoveOutlastsTheDatabasesTimeouts() throws {
        XCTAssertEqual(try migrate().status, 0)
        let owner = try PostgresConnection.connect(database)
        let name = try owner.quoteIdentifier(try XCTUnwrap(database["dbname"]))
        try owner.execute("insert into users (email, last_seq) values ('restored@example.com', 7)")
        try owner.execute("update wal_timeline set timeline = timeline + 1")  // a restore
        try owner.execute("alter database \(name) set lock_timeout = '1ms'")
        // A push in flight holds the user's row.
        let push = try PostgresConnection.connect(database)
        try push.execute("begin")
        try push.query("select 1 from users for update")
        let (process, stdout, stderr) = try Command.start(
            Command.trunkSyncBinary(), ["migrate"], environment: environment)
        // Until the move has waited far past the timeout (or migrate ended).
        let deadline = Date().addingTimeInterval(20)
        while process.isRunning, Date() < deadline {
            let waiting = try owner.query(
                """
                select count(*) from pg_stat_activity
                where wait_event_type = 'Lock' and query like '%trunk_sync_seq_timeline(%'
                  and clock_timestamp() - query_start > interval '100 milliseconds'
                """)[0].decode(Int64.self, column: 0)
            if waiting > 0 { break }
            usleep(10_000)
        }
        try push.execute("commit")
        let result = Command.finish(process, stdout, stderr)
        XCTAssertEqual(result.status, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("the next seq of 1 user(s) moved"), result.stdout)
        XCTAssertGreaterThanOrEqual(
            try owner.query("select last_seq from users")[0].decode(Int64.self, column: 0), 7 + SeqTimeline.gap)
    }

    func testStatusListsPendingBeforeMigrating() throws {
        let status = try migrate(["status"])
        XCTAssertEqual(status.status, 0, status.stderr)
        XCTAssertTrue(status.stdout.contains("pending  0001_initial_schema.sql"), status.stdout)
    }

    func testTwoConcurrentMigratesApplyOnce() throws {
        // Hold the migration lock so both processes must queue behind it, then let go.
        let holder = try PostgresConnection.connect(database)
        try holder.query("select pg_advisory_lock($1)", Int64(0x7472_756e_6b73_796e))
        let processes = try (0..<2).map { _ in
            try Command.start(Command.trunkSyncBinary(), ["migrate"], environment: environment)
        }
        // Both are waiting for the lock (pg_locks shows them), not finished or failed.
        let deadline = Date().addingTimeInterval(20)
        var waiting = 0
        while Date() < deadline {
            waiting = try holder.query("select count(*) from pg_locks where locktype = 'advisory' and not granted")[0]
                .decode(Int.self, column: 0)
            if waiting == 2 { break }
            usleep(20_000)
        }
        XCTAssertEqual(waiting, 2)
        try holder.query("select pg_advisory_unlock($1)", Int64(0x7472_756e_6b73_796e))
        let results = processes.map { Command.finish($0.0, $0.1, $0.2) }
        XCTAssertEqual(results.map(\.status), [0, 0], results.map(\.stderr).joined())
        XCTAssertEqual(results.filter { $0.stdout.contains("applied 0001") }.count, 1)
        XCTAssertEqual(results.filter { $0.stdout.contains("up to date") }.count, 1)
        let rows = try holder.query("select count(*) from schema_migrations")[0].decode(Int.self, column: 0)
        XCTAssertEqual(rows, try Migration.load(from: repositoryRoot() + "/migrations").count)
    }

    /// A migration that fails leaves those before it in the run committed: the output names
    /// them, as each was applied (they were named only at the end, and a log line was all
    /// that said so when a later one failed).
    func testAFailedMigrationStillNamesTheOnesAppliedBeforeIt() throws {
        let directory = NSTemporaryDirectory() + "failing-" + UUID().uuidString
        try FileManager.default.copyItem(atPath: repositoryRoot() + "/migrations", toPath: directory)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "select no_such_function();\n".write(
            toFile: directory + "/9999_fails.sql", atomically: true, encoding: .utf8)
        environment["TRUNK_SYNC_MIGRATIONS_DIR"] = directory
        let failed = try migrate()
        XCTAssertEqual(failed.status, 1, failed.stdout)
        XCTAssertTrue(failed.stderr.contains("9999_fails.sql failed and was rolled back"), failed.stderr)
        XCTAssertTrue(failed.stdout.contains("applied 0001_initial_schema.sql\n"), failed.stdout)
        let applied = try PostgresConnection.connect(database).query("select count(*) from schema_migrations")[0]
            .decode(Int.self, column: 0)
        XCTAssertEqual(applied, try Migration.load(from: repositoryRoot() + "/migrations").count)
        XCTAssertEqual(failed.stdout.components(separatedBy: "applied ").count - 1, applied, failed.stdout)
    }

    func testEditedFileStopsMigrateWithOneClearLine() throws {
        let directory = NSTemporaryDirectory() + "edited-" + UUID().uuidString
        try FileManager.default.copyItem(atPath: repositoryRoot() + "/migrations", toPath: directory)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        environment["TRUNK_SYNC_MIGRATIONS_DIR"] = directory
        XCTAssertEqual(try migrate().status, 0)
        let file = directory + "/0001_initial_schema.sql"
        try (try String(contentsOfFile: file, encoding: .utf8) + "\n-- edited\n").write(
            toFile: file, atomically: true, encoding: .utf8)
        let refused = try migrate()
        XCTAssertEqual(refused.status, 1)
        XCTAssertEqual(refused.stderr.split(separator: "\n").count, 1, refused.stderr)
        XCTAssertTrue(
            refused.stderr.contains("0001_initial_schema.sql was edited after it was applied"), refused.stderr)
    }

    func testConnectionErrorsAreOneClearLineWithoutThePassword() throws {
        environment["TRUNK_SYNC_DATABASE_URL"] = try TestDatabase.url(of: database)
            .replacingOccurrences(of: "://trunk:", with: "://trunk:wrong-secret-")
        let result = try migrate()
        XCTAssertEqual(result.status, 1)
        XCTAssertTrue(result.stderr.contains("password authentication failed"), result.stderr)
        XCTAssertFalse(result.stderr.contains("wrong-secret"), result.stderr)
        XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, result.stderr)
    }

    func testMissingDatabaseURLNamesTheVariable() throws {
        environment.removeValue(forKey: "TRUNK_SYNC_DATABASE_URL")
        let result = try migrate()
        XCTAssertEqual(result.status, 1)
        XCTAssertTrue(result.stderr.contains("TRUNK_SYNC_DATABASE_URL is required"), result.stderr)
    }
}

/// `migrate` with the two logins: the owner's (TRUNK_SYNC_MIGRATION_DATABASE_URL) and the
/// server's (TRUNK_SYNC_DATABASE_URL), which it creates and keeps to what the server needs.
final class ServerLoginRoleTests: XCTestCase {
    var database: PostgresConfiguration!
    var role: String!
    var password: String!
    var environment: [String: String]!

    override func setUpWithError() throws {
        database = try TestDatabase.create(prefix: "roles")
        role = TestDatabase.roleName("server")
        password = TestSecrets.randomHex()
        environment = Command.environment([
            "TRUNK_SYNC_MIGRATION_DATABASE_URL": try TestDatabase.url(of: database),
            "TRUNK_SYNC_DATABASE_URL": try TestDatabase.url(of: database, user: role, password: password),
            "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
            "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(), "TRUNK_SYNC_KEY_ENCRYPTION_KEY": TestSecrets.random(),
        ])
    }

    override func tearDownWithError() throws {
        try TestDatabase.drop(database)
        TestDatabase.dropRole(role)
    }

    func run(_ arguments: [String]) throws -> Command.Result {
        try Command.run(Command.trunkSyncBinary(), arguments, environment: environment)
    }

    /// The role's attributes: login, any right a server must not have, member of
    /// trunk_sync_app, member of trunk_sync_admin, owner of anything.
    func attributes(_ name: String) throws -> [Bool] {
        let row = try PostgresConnection.connect(database).query(
            """
            select rolcanlogin, rolsuper or rolcreaterole or rolcreatedb or rolbypassrls or rolreplication,
                   pg_has_role(oid, 'trunk_sync_app', 'MEMBER'), pg_has_role(oid, 'trunk_sync_admin', 'MEMBER'),
                   exists (select 1 from pg_class where relowner = r.oid)
            from pg_roles r where rolname = $1
            """, name)[0]
        return try (0..<5).map { try row.decode(Bool.self, column: $0) }
    }

    func connectsAsServer(password: String) -> Bool {
        guard let url = try? TestDatabase.url(of: database, user: role, password: password),
            let configuration = try? PostgresConfiguration(url)
        else { return false }
        return (try? PostgresConnection.connect(configuration)) != nil
    }

    func testMigrateCreatesTheServersLoginAndKeepsItToWhatTheServerNeeds() throws {
        let first = try run(["migrate"])
        XCTAssertEqual(first.status, 0, first.stderr)
        XCTAssertTrue(
            first.stdout.contains("created the server's login role \(role!) (member of trunk_sync_app)"), first.stdout)
        XCTAssertEqual(try attributes(role), [true, false, true, false, false])
        XCTAssertTrue(connectsAsServer(password: password), "the password from TRUNK_SYNC_DATABASE_URL")
        // Stored as a verifier, not in clear.
        let stored = try PostgresConnection.connect(try TestDatabase.adminConfiguration()).query(
            "select rolpassword from pg_authid where rolname = $1", role)[0].decode(String.self, column: 0)
        XCTAssertTrue(stored.hasPrefix("SCRAM-SHA-256$"), stored)

        // Run again: updated, nothing else; a changed password in the URL replaces the old one.
        let again = try run(["migrate"])
        XCTAssertEqual(again.status, 0, again.stderr)
        XCTAssertTrue(again.stdout.contains("updated the server's login role \(role!)"), again.stdout)
        let rotated = TestSecrets.randomHex()
        environment["TRUNK_SYNC_DATABASE_URL"] = try TestDatabase.url(of: database, user: role, password: rotated)
        XCTAssertEqual(try run(["migrate"]).status, 0)
        XCTAssertFalse(connectsAsServer(password: password))
        XCTAssertTrue(connectsAsServer(password: rotated))
        // A membership in trunk_sync_admin given by hand is taken away again.
        try PostgresConnection.connect(database).execute("grant trunk_sync_admin to \(role!)")
        XCTAssertEqual(try run(["migrate"]).status, 0)
        XCTAssertEqual(try attributes(role), [true, false, true, false, false])
    }

    /// A role with rights a server must not have is refused before anything changes, not
    /// stripped of them (it may be an administrator's).
    func testMigrateRefusesAPrivilegedServerLoginAndChangesNothing() throws {
        let admin = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        for attributes in ["superuser", "createrole", "bypassrls"] {
            let privileged = TestDatabase.roleName("privileged")
            defer { TestDatabase.dropRole(privileged) }
            try admin.execute("create role \(privileged) login \(attributes) password '\(password!)'")
            environment["TRUNK_SYNC_DATABASE_URL"] = try TestDatabase.url(
                of: database, user: privileged, password: password)
            let refused = try run(["migrate"])
            XCTAssertEqual(refused.status, 1, refused.stdout)
            XCTAssertEqual(
                refused.stderr,
                "trunk-sync: TRUNK_SYNC_DATABASE_URL logs in as \(privileged), which has \(attributes.uppercased()): name a role only the server uses in TRUNK_SYNC_DATABASE_URL (migrate creates it); nothing was changed\n"
            )
            XCTAssertFalse(refused.stderr.contains(password))
            let migrated = try PostgresConnection.connect(database).query(
                "select to_regclass('schema_migrations') is null")[0]
                .decode(Bool.self, column: 0)
            XCTAssertTrue(migrated, "nothing applied")
            let still = try admin.query(
                "select rolsuper or rolcreaterole or rolbypassrls from pg_roles where rolname = $1", privileged)[0]
                .decode(Bool.self, column: 0)
            XCTAssertTrue(still, "its rights are left alone")
        }
    }

    /// The owner check through the door (what `ownerDatabase` runs before the owner's
    /// tools): the owner passes, the server's login is refused with its name.
    func testTheOwnerCheckThroughTheDoorRefusesTheServersLogin() async throws {
        XCTAssertEqual(try run(["migrate"]).status, 0)
        var settings = Database.Settings()
        settings.maxConnections = 1
        let owner = try Database(database, settings: settings, logger: TestDatabase.quietLogger)
        let server = try Database(
            try PostgresConfiguration(try TestDatabase.url(of: database, user: role, password: password)),
            settings: settings,
            logger: TestDatabase.quietLogger)
        var outcome: (owner: Error?, server: Error?) = (nil, nil)
        do { try await owner.read(as: .server) { try await DatabaseRoles.requireOwner(on: $0) } } catch {
            outcome.owner = error
        }
        do { try await server.read(as: .server) { try await DatabaseRoles.requireOwner(on: $0) } } catch {
            outcome.server = error
        }
        await owner.close()
        await server.close()
        XCTAssertNil(outcome.owner)
        XCTAssertEqual(
            (outcome.server as? DatabaseRoles.OwnerRequired)?.role, role, "\(String(describing: outcome.server))")
    }

    /// The owner's tools logged in as the server's login see nothing through row-level
    /// security: they say so instead of printing an empty list.
    func testOwnerToolsRefuseTheServersLogin() throws {
        XCTAssertEqual(try run(["migrate"]).status, 0)
        XCTAssertEqual(try run(["token", "--email", "a@example.com"]).status, 0, "token runs as the server")
        let list = try run(["users", "list"])
        XCTAssertEqual(list.status, 0, list.stderr)
        XCTAssertTrue(list.stdout.contains("a@example.com"), "as the owner: \(list.stdout)")
        environment.removeValue(forKey: "TRUNK_SYNC_MIGRATION_DATABASE_URL")
        for command in [["users", "list"], ["keys", "add"], ["keys", "retire", "x"]] {
            let refused = try run(command)
            XCTAssertEqual(refused.status, 1, refused.stdout)
            XCTAssertEqual(
                refused.stderr,
                "trunk-sync: this command needs the tables' owner, but the database URL logs in as \(role!): set TRUNK_SYNC_MIGRATION_DATABASE_URL to the URL trunk-sync migrate uses\n",
                command.joined(separator: " "))
        }
        // migrate too (given the server's URL alone, as in the server's container): one line
        // saying which URL to set, not a bare "PostgreSQL error 42501".
        let migrate = try run(["migrate"])
        XCTAssertEqual(migrate.status, 1, migrate.stdout)
        XCTAssertEqual(
            migrate.stderr,
            "trunk-sync: TRUNK_SYNC_DATABASE_URL logs in as \(role!), but the tables belong to \(database["user"]!): migrate runs as their owner; set TRUNK_SYNC_MIGRATION_DATABASE_URL to the owner's URL (with docker compose: docker compose run --rm migrate); nothing was changed\n"
        )
    }
}
