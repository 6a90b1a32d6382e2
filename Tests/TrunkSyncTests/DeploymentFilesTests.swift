import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

/// docker-compose.yml and the Dockerfile cannot run here (no Docker engine), so the compose
/// file is validated against the Compose schema and its own commands run natively.
final class DeploymentFilesTests: XCTestCase {
    func python() throws -> String {
        guard let path = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"], !path.isEmpty else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_PYTHON is not set: run the tests with `make test`")
        }
        return path
    }

    /// check-jsonschema ships the Compose specification: nothing outside the repository
    /// (or the test's own Python environment) is read, and nothing is fetched.
    func testComposeFileMatchesTheComposeSpecification() throws {
        let checker = URL(fileURLWithPath: try python()).deletingLastPathComponent().appendingPathComponent(
            "check-jsonschema"
        ).path
        let result = try Command.run(
            checker, ["--builtin-schema", "vendor.compose-spec", repositoryRoot() + "/docker-compose.yml"])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        // The check can fail: a compose file with a misspelt key is refused.
        let broken = NSTemporaryDirectory() + "compose-\(UUID().uuidString).yml"
        try "services:\n  app:\n    imagee: x\n".write(toFile: broken, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: broken) }
        let refused = try Command.run(checker, ["--builtin-schema", "vendor.compose-spec", broken])
        XCTAssertNotEqual(refused.status, 0, refused.stdout)
    }

    /// `.env.example` as the README says to fill it in: every `change-me` value replaced by
    /// a fresh random one (hex for passwords, which go into URLs, base64 for the rest), and
    /// the SMTP URL set to a mail server's (serve refuses the example's).
    func filledInEnvFile() throws -> String {
        let example = try String(contentsOfFile: repositoryRoot() + "/.env.example", encoding: .utf8)
        let filled = example.split(separator: "\n", omittingEmptySubsequences: false).map { line -> String in
            if line.hasPrefix("TRUNK_SYNC_SMTP_URL=") {
                return "TRUNK_SYNC_SMTP_URL=smtp://mailer:\(TestSecrets.randomHex())@127.0.0.1:2525?tls=none"
            }
            guard !line.hasPrefix("#"), let equals = line.firstIndex(of: "="), line[equals...].contains("change-me")
            else {
                return String(line)
            }
            let key = line[..<equals]
            let value = key.hasSuffix("PASSWORD") ? TestSecrets.randomHex() : TestSecrets.random()
            return "\(key)=\(value)"
        }.joined(separator: "\n")
        let path = NSTemporaryDirectory() + "compose-env-\(UUID().uuidString)"
        try filled.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Runs scripts/compose-native.py with `envFile` against a fresh database; `inspect`
    /// looks at the database (as its superuser) before it is dropped.
    /// `options` go before the positional arguments (`--override FILE`, `--keys-add`, …);
    /// `prepare` may change the environment (the shell's, which wins over `envFile`) once the
    /// database exists.
    func runCompose(
        envFile: String, serverRole: String = "compose_\(UUID().uuidString.prefix(8).lowercased())",
        options: [String] = [], inspect: (PostgresConnection) throws -> Void = { _ in },
        prepare: (PostgresConfiguration, inout [String: String]) throws -> Void = { _, _ in }
    ) throws -> Command.Result {
        let database = try TestDatabase.create(prefix: "compose")
        let admin = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        defer {
            try? TestDatabase.drop(database)
            _ = try? admin.execute("drop role if exists \(serverRole)")
        }
        let port = try XCTUnwrap(database["port"])
        let password = try XCTUnwrap(database["password"])
        let free = try serverPort()
        var environment = [
            "POSTGRES_HOST": "127.0.0.1", "POSTGRES_PORT": port, "POSTGRES_USER": database["user"] ?? "trunk",
            "POSTGRES_PASSWORD": password, "POSTGRES_DB": try XCTUnwrap(database["dbname"]),
            "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
            // Roles are cluster-wide: one of its own per run.
            "SERVER_DB_USER": serverRole,
        ]
        try prepare(database, &environment)
        let result = try Command.run(
            try python(),
            [repositoryRoot() + "/scripts/compose-native.py"] + options + [
                repositoryRoot() + "/docker-compose.yml", envFile, Command.trunkSyncBinary(), String(free),
            ],
            environment: Command.environment(environment))
        try inspect(try PostgresConnection.connect(database))
        return result
    }

    /// Deployed as the README says: .env.example copied and its placeholders replaced.
    func testComposeCommandsAndEnvironmentRunNatively() throws {
        let envFile = try filledInEnvFile()
        defer { try? FileManager.default.removeItem(atPath: envFile) }
        var role = ""
        var result: Command.Result
        // The free port is picked before serve binds it; on a busy machine another process
        // may take it in between: then again on a new port (at most three times).
        var attempts = 0
        repeat {
            attempts += 1
            role = "compose_\(UUID().uuidString.prefix(8).lowercased())"
            result = try composeAsTheREADMESays(envFile: envFile, role: role)
        } while attempts < 3 && (result.stdout + result.stderr).contains("Address already in use")
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        XCTAssertTrue(result.stdout.contains("created the server's login role \(role)"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok serve's environment holds no owner password"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok serve's database role is neither superuser nor owner"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok config check in the migrate service"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok migrate"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok serve is healthy"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok serve stopped cleanly"), result.stdout)
    }

    func composeAsTheREADMESays(envFile: String, role: String) throws -> Command.Result {
        try runCompose(envFile: envFile, serverRole: role) { database in
            // The server's login as migrate made it: a member of trunk_sync_app and nothing more.
            let row = try database.query(
                """
                select rolcanlogin, rolsuper or rolcreaterole or rolcreatedb or rolbypassrls or rolreplication,
                       pg_has_role(oid, 'trunk_sync_app', 'MEMBER'), pg_has_role(oid, 'trunk_sync_admin', 'MEMBER'),
                       exists (select 1 from pg_class where relowner = r.oid)
                from pg_roles r where rolname = $1
                """, role)
            XCTAssertEqual(row.count, 1, "migrate created \(role)")
            guard let row = row.first else { return }
            XCTAssertEqual(
                try (0..<5).map { try row.decode(Bool.self, column: $0) }, [true, false, true, false, false])
        }
    }

    /// `runCompose`, again on a new port (at most three times) when another process took
    /// the free one before serve bound it.
    func runComposeOnAFreePort(envFile: String, options: [String] = []) throws -> Command.Result {
        var result: Command.Result
        var attempts = 0
        repeat {
            attempts += 1
            result = try runCompose(envFile: envFile, options: options)
        } while attempts < 3 && (result.stdout + result.stderr).contains("Address already in use")
        return result
    }

    /// The key encryption key as a compose secret, as docs/operations.md ("The key encryption
    /// key in a file") says: its line in .env emptied, the guide's override file, the key in
    /// the file that names. migrate, `keys add` and serve (which refuses to start with a
    /// signing key it cannot decrypt) all read it from there.
    func testKeyEncryptionKeyAsAComposeSecret() throws {
        let operations = try String(contentsOfFile: repositoryRoot() + "/docs/operations.md", encoding: .utf8)
        let section = try XCTUnwrap(
            operations.components(separatedBy: "\n### The key encryption key in a file\n").dropFirst().first)
        let override = try XCTUnwrap(
            section.components(separatedBy: "```yaml\n").dropFirst().first?.components(separatedBy: "```").first)
        let project = NSTemporaryDirectory() + "compose-secret-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: project + "/secrets", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: project) }
        try override.write(toFile: project + "/docker-compose.override.yml", atomically: true, encoding: .utf8)
        try (TestSecrets.random() + "\n").write(
            toFile: project + "/secrets/key_encryption_key", atomically: true, encoding: .utf8)
        let envFile = try filledInEnvFile()
        defer { try? FileManager.default.removeItem(atPath: envFile) }
        let lines = try String(contentsOfFile: envFile, encoding: .utf8).split(
            separator: "\n", omittingEmptySubsequences: false)
        let key = "TRUNK_SYNC_KEY_ENCRYPTION_KEY="
        XCTAssertEqual(lines.filter { $0.hasPrefix(key) }.count, 1)
        try lines.map { $0.hasPrefix(key) ? key : String($0) }.joined(separator: "\n").write(
            toFile: envFile, atomically: true, encoding: .utf8)
        let options = ["--override", project + "/docker-compose.override.yml", "--project-directory", project]
        let result = try runComposeOnAFreePort(envFile: envFile, options: options + ["--keys-add"])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        XCTAssertTrue(result.stdout.contains("ok keys add in the migrate service"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok serve is healthy"), result.stdout)
        // The line deleted instead of emptied: compose refuses, naming both settings.
        try lines.filter { !$0.hasPrefix(key) }.joined(separator: "\n").write(
            toFile: envFile, atomically: true, encoding: .utf8)
        let refused = try runCompose(envFile: envFile, options: options)
        XCTAssertNotEqual(refused.status, 0, refused.stdout)
        XCTAssertTrue(
            refused.stderr.contains(
                "set TRUNK_SYNC_KEY_ENCRYPTION_KEY in .env, or leave it empty there and set TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE"
            ), refused.stderr)
    }

    /// TRUNK_SYNC_MIGRATION_DATABASE_URL and TRUNK_SYNC_DATABASE_URL written in .env are used
    /// as written, not replaced by the URLs compose builds from POSTGRES_HOST and the others
    /// (a host that does not resolve here: only the written URLs reach the database, and the
    /// server's names a role of its own); the server gets neither the owner's URL nor its
    /// password (compose-native checks serve's environment).
    func testDatabaseURLsWrittenInTheEnvFileWin() throws {
        let envFile = try filledInEnvFile()
        defer { try? FileManager.default.removeItem(atPath: envFile) }
        let role = "compose_\(UUID().uuidString.prefix(8).lowercased())"
        let result = try runCompose(
            envFile: envFile, serverRole: role,
            prepare: { database, environment in
                environment["POSTGRES_HOST"] = "nowhere.invalid"
                environment["SERVER_DB_USER"] = "compose_unused"
                let urls = [
                    "TRUNK_SYNC_MIGRATION_DATABASE_URL=" + (try TestDatabase.url(of: database)),
                    "TRUNK_SYNC_DATABASE_URL="
                        + (try TestDatabase.url(of: database, user: role, password: TestSecrets.randomHex())),
                ]
                let text = try String(contentsOfFile: envFile, encoding: .utf8)
                try (text + "\n" + urls.joined(separator: "\n") + "\n").write(
                    toFile: envFile, atomically: true, encoding: .utf8)
            })
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        XCTAssertTrue(result.stdout.contains("created the server's login role \(role)"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok serve's environment holds no owner password"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok serve is healthy"), result.stdout)
    }

    /// Deployed without changing .env.example: refused with one line naming the setting, the
    /// example value never echoed.
    func testComposeWithTheExampleSecretsIsRefused() throws {
        let result = try runCompose(envFile: repositoryRoot() + "/.env.example")
        XCTAssertNotEqual(result.status, 0, result.stdout)
        let output = result.stdout + result.stderr
        XCTAssertFalse(output.contains("ok serve is healthy"), output)
        XCTAssertTrue(output.contains("trunk-sync: TRUNK_SYNC_"), output)
        XCTAssertTrue(output.contains("example"), output)
        // Its password comes from SERVER_DB_PASSWORD in .env: the line says so.
        XCTAssertTrue(output.contains("set SERVER_DB_PASSWORD in .env"), output)
        let example = try String(contentsOfFile: repositoryRoot() + "/.env.example", encoding: .utf8)
        for line in example.split(separator: "\n") where line.contains("=change-me") {
            let value = String(line.split(separator: "=", maxSplits: 1)[1])
            XCTAssertFalse(output.contains(value), "\(value) echoed: \(output)")
        }
    }

    /// The image pins each Swift package to the version this test run was built with
    /// (recorded in scripts/package-versions; Package.resolved stays out of git), and builds
    /// the binary as `make release` does.
    func testImageBuildPinsTheTestedPackageVersions() throws {
        let recorded = try String(contentsOfFile: repositoryRoot() + "/scripts/package-versions", encoding: .utf8)
            .split(separator: "\n").filter { !$0.hasPrefix("#") && !$0.isEmpty }
            .map { $0.split(separator: " ").map(String.init) }
        let state = try JSONSerialization.jsonObject(
            with: Data(contentsOf: URL(fileURLWithPath: repositoryRoot() + "/.build/workspace-state.json")))
        let dependencies = try XCTUnwrap(
            ((state as? [String: Any])?["object"] as? [String: Any])?["dependencies"] as? [[String: Any]])
        let tested = dependencies.compactMap { dependency -> [String]? in
            guard let name = (dependency["packageRef"] as? [String: Any])?["identity"] as? String,
                let version = ((dependency["state"] as? [String: Any])?["checkoutState"] as? [String: Any])?["version"]
                    as? String
            else { return nil }
            return [name, version]
        }
        XCTAssertEqual(recorded.sorted { $0[0] < $1[0] }, tested.sorted { $0[0] < $1[0] }, "scripts/package-versions")
        let dockerfile = try String(contentsOfFile: repositoryRoot() + "/Dockerfile", encoding: .utf8)
        XCTAssertTrue(dockerfile.contains("COPY scripts/package-versions ./scripts/package-versions"), dockerfile)
        XCTAssertTrue(dockerfile.contains(#"swift package resolve "$name" --version "$version""#), dockerfile)
        // The Dockerfile's resolve step, run here on Package.swift and the recorded versions
        // alone (as in the image's build stage): it pins what the tests built with.
        let step = try XCTUnwrap(
            dockerfile.components(separatedBy: "COPY scripts/package-versions ./scripts/package-versions\nRUN ")
                .dropFirst().first?
                .components(separatedBy: "\nCOPY Sources").first)
        let directory = NSTemporaryDirectory() + "image-resolve-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory + "/scripts", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for file in ["Package.swift", "scripts/package-versions"] {
            try FileManager.default.copyItem(atPath: repositoryRoot() + "/" + file, toPath: directory + "/" + file)
        }
        let resolved = try Command.run("/bin/bash", ["-c", "cd \"$1\" && " + step, "resolve", directory])
        XCTAssertEqual(resolved.status, 0, resolved.stdout + resolved.stderr)
        let pins = try String(contentsOfFile: directory + "/Package.resolved", encoding: .utf8)
        for entry in recorded {
            XCTAssertTrue(
                pins.range(
                    of: "\"identity\" : \"\(entry[0])\"[^}]*\"version\" : \"\(entry[1])\"", options: .regularExpression)
                    != nil,
                "\(entry) in \(pins)")
        }
        let makefile = try String(contentsOfFile: repositoryRoot() + "/Makefile", encoding: .utf8)
        let release = try XCTUnwrap(
            makefile.components(separatedBy: "release:\n\t").dropFirst().first?.split(separator: "\n").first)
        XCTAssertTrue(
            dockerfile.contains("RUN \(release) --product trunk-sync"), "the image builds as `make release`: \(release)"
        )
    }

    /// One trusted-proxy value for a reverse proxy on the host: the compose network's gateway,
    /// which .env.example and the operator's guide name.
    func testTrustedProxyIsTheComposeGateway() throws {
        let compose = try String(contentsOfFile: repositoryRoot() + "/docker-compose.yml", encoding: .utf8)
        XCTAssertTrue(compose.contains("gateway: ${COMPOSE_GATEWAY:-172.30.80.1}"), compose)
        XCTAssertTrue(compose.contains("subnet: ${COMPOSE_SUBNET:-172.30.80.0/24}"), compose)
        let example = try String(contentsOfFile: repositoryRoot() + "/.env.example", encoding: .utf8)
        XCTAssertTrue(example.contains("# TRUNK_SYNC_TRUSTED_PROXIES=172.30.80.1\n"), example)
        let configuration = try Configuration.load(environment: ["TRUNK_SYNC_TRUSTED_PROXIES": "172.30.80.1"])
        XCTAssertFalse(configuration.trustedProxies.isEmpty)
        // Published ports bind loopback unless TRUNK_SYNC_PUBLISH says otherwise; Compose 2.24+.
        XCTAssertTrue(compose.contains(#""127.0.0.1:9090:9090""#), compose)
        XCTAssertTrue(compose.contains("Docker Compose 2.24 or newer"), compose)
    }

    /// Every variable docker-compose.yml reads is in .env.example, set or commented out with
    /// its default, so an operator finds each one where the others are.
    func testEveryComposeVariableIsInTheExampleEnvironment() throws {
        let compose = try String(contentsOfFile: repositoryRoot() + "/docker-compose.yml", encoding: .utf8)
        let example = try String(contentsOfFile: repositoryRoot() + "/.env.example", encoding: .utf8)
        let listed = Set(
            example.split(separator: "\n").compactMap { line -> String? in
                let text = line.hasPrefix("# ") ? line.dropFirst(2) : line[...]
                guard let equals = text.firstIndex(of: "="),
                    text[..<equals].allSatisfy({ $0.isUppercase || $0.isNumber || $0 == "_" })
                else { return nil }
                return String(text[..<equals])
            })
        var used: Set<String> = []
        var rest = compose[...]
        while let start = rest.range(of: "${") {
            let name = rest[start.upperBound...].prefix { $0.isUppercase || $0.isNumber || $0 == "_" }
            used.insert(String(name))
            rest = rest[start.upperBound...]
        }
        XCTAssertTrue(used.isSuperset(of: ["POSTGRES_HOST", "POSTGRES_PASSWORD", "TRUNK_SYNC_PUBLISH"]), "\(used)")
        XCTAssertEqual(used.subtracting(listed), [], "used by docker-compose.yml, not in .env.example")
    }

    /// The compose file archives WAL and takes base backups as `make drill` rehearses: the
    /// same archive_command (another directory) and the same backup script.
    func testComposeBacksUpAsTheDrillRestores() throws {
        let compose = try String(contentsOfFile: repositoryRoot() + "/docker-compose.yml", encoding: .utf8)
        let drill = try String(contentsOfFile: repositoryRoot() + "/scripts/drill-restore.sh", encoding: .utf8)
        let command = try archiveCommand()
        XCTAssertTrue(
            drill.contains("archive_command = '\(command.replacingOccurrences(of: "/backup/", with: "$backup/"))'"),
            drill)
        XCTAssertTrue(compose.contains("- ./scripts/backup.sh:/usr/local/bin/trunk-sync-backup:ro"), compose)
        XCTAssertTrue(compose.contains("BACKUP_DIR: /backup"), compose)
        XCTAssertTrue(drill.contains("scripts/backup.sh once"), drill)
        // pg_basebackup connects for replication from the backup container: the database's
        // rules must allow it (the image's own match "all" databases, which excludes it).
        XCTAssertTrue(compose.contains("- hba_file=/etc/postgresql/trunk-sync-hba.conf"), compose)
        XCTAssertTrue(compose.contains("- ./scripts/pg_hba.conf:/etc/postgresql/trunk-sync-hba.conf:ro"), compose)
        let hba = try String(contentsOfFile: repositoryRoot() + "/scripts/pg_hba.conf", encoding: .utf8)
        let rules = hba.split(separator: "\n").filter { !$0.hasPrefix("#") }.map {
            $0.split(separator: " ").map(String.init)
        }
        XCTAssertTrue(rules.contains(["host", "replication", "all", "all", "scram-sha-256"]), hba)
        XCTAssertFalse(rules.contains { $0.first == "host" && $0.last == "trust" }, "no password-less network login")
        let makefile = try String(contentsOfFile: repositoryRoot() + "/Makefile", encoding: .utf8)
        XCTAssertTrue(makefile.contains("drill:\n\tscripts/drill-restore.sh"), makefile)
    }

    /// docker-compose.yml's archive_command, with /backup/ as it is written there.
    func archiveCommand() throws -> String {
        let compose = try String(contentsOfFile: repositoryRoot() + "/docker-compose.yml", encoding: .utf8)
        let line = compose.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            .first { $0.hasPrefix("- archive_command=") }
        return String(try XCTUnwrap(line).dropFirst("- archive_command=".count))
    }

    /// The compose file's archive_command, run as PostgreSQL runs it (`sh -c` in the data
    /// directory, %p and %f replaced): a segment archived again, as PostgreSQL does after a
    /// crash that came before it noted the segment done, succeeds when the copy holds the
    /// same bytes (else archiving would stop for good, the WAL piling up in pg_wal), fails
    /// when it holds others, which stay; no copy is left under a temporary name.
    func testTheArchiveCommandTakesASegmentArchivedAgainAfterACrash() throws {
        let directory = NSTemporaryDirectory() + "archive-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory + "/wal", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: directory + "/data/pg_wal", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let segment = "000000010000000000000003"
        let command = try archiveCommand().replacingOccurrences(of: "/backup/", with: directory + "/")
            .replacingOccurrences(of: "%p", with: "pg_wal/" + segment).replacingOccurrences(of: "%f", with: segment)
        func archive() throws -> Command.Result {
            try Command.run("/bin/sh", ["-c", command], currentDirectory: directory + "/data")
        }
        let bytes = Data((0..<65536).map { _ in UInt8.random(in: 0...255) })
        try bytes.write(to: URL(fileURLWithPath: "\(directory)/data/pg_wal/\(segment)"))
        let first = try archive()
        XCTAssertEqual(first.status, 0, first.stderr)
        XCTAssertEqual(FileManager.default.contents(atPath: "\(directory)/wal/\(segment)"), bytes)
        let again = try archive()
        XCTAssertEqual(again.status, 0, "the same segment archived again: \(again.stderr)")
        try Data(bytes.reversed()).write(to: URL(fileURLWithPath: "\(directory)/data/pg_wal/\(segment)"))
        let other = try archive()
        XCTAssertNotEqual(other.status, 0, "another segment of the same name must not replace the copy")
        XCTAssertEqual(FileManager.default.contents(atPath: "\(directory)/wal/\(segment)"), bytes)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: directory + "/wal"), [segment])
    }

    /// The compose file's archive_command makes the copy durable before PostgreSQL hears it
    /// is done (and recycles the segment): the copy flushed, and the archive's directory
    /// flushed once it holds the copy under its name, else a power cut could take the rename
    /// back. Also when the copy was there already (archived again after a crash). `sync` is a
    /// stand-in on PATH that notes what it was given and whether the copy was in place then.
    func testTheArchiveCommandFlushesTheRenameBeforeItSaysDone() throws {
        let directory = NSTemporaryDirectory() + "archive-sync-\(UUID().uuidString)"
        for path in ["/wal", "/data/pg_wal", "/bin"] {
            try FileManager.default.createDirectory(atPath: directory + path, withIntermediateDirectories: true)
        }
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let segment = "000000010000000000000003"
        try """
        #!/bin/sh
        for path; do
          if [ -f "\(directory)/wal/\(segment)" ]; then echo "$path in place"; else echo "$path"; fi
        done >>"\(directory)/synced"
        """.write(toFile: directory + "/bin/sync", atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: directory + "/bin/sync")
        let command = try archiveCommand().replacingOccurrences(of: "/backup/", with: directory + "/")
            .replacingOccurrences(of: "%p", with: "pg_wal/" + segment).replacingOccurrences(of: "%f", with: segment)
        try Data("segment".utf8).write(to: URL(fileURLWithPath: "\(directory)/data/pg_wal/\(segment)"))
        let environment = Command.environment([
            "PATH": directory + "/bin:" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        ])
        for _ in 0..<2 {
            let result = try Command.run(
                "/bin/sh", ["-c", command], environment: environment, currentDirectory: directory + "/data")
            XCTAssertEqual(result.status, 0, result.stderr)
        }
        XCTAssertEqual(
            try String(contentsOfFile: directory + "/synced", encoding: .utf8),
            "\(directory)/wal/\(segment).tmp\n\(directory)/wal in place\n\(directory)/wal in place\n")
    }

    /// The upgrade's `config check` runs the new version: `docker compose run` uses the image
    /// it finds, so the new one is built first (else the old binary checks, knowing nothing of
    /// the settings the new one refuses without).
    func testUpgradeChecksWithTheNewImage() throws {
        let operations = try String(contentsOfFile: repositoryRoot() + "/docs/operations.md", encoding: .utf8)
        let upgrade = try XCTUnwrap(operations.components(separatedBy: "\n## Upgrade\n").dropFirst().first)
        let compose = try String(contentsOfFile: repositoryRoot() + "/docker-compose.yml", encoding: .utf8)
        let upgrading = try XCTUnwrap(compose.components(separatedBy: "# Upgrading:").dropFirst().first)
        for (name, steps) in [("docs/operations.md", upgrade), ("docker-compose.yml", upgrading)] {
            let build = try XCTUnwrap(steps.range(of: "docker compose build"), name)
            let check = try XCTUnwrap(steps.range(of: "config check"), name)
            XCTAssertLessThan(build.lowerBound, check.lowerBound, "\(name): build, then config check")
        }
    }

    func testDockerfileShipsWhatTheBinaryLooksFor() throws {
        let dockerfile = try String(contentsOfFile: repositoryRoot() + "/Dockerfile", encoding: .utf8)
        XCTAssertTrue(dockerfile.contains("COPY migrations /usr/share/trunk-sync/migrations"))
        XCTAssertTrue(dockerfile.contains("libpq5 libssl3 ca-certificates"))
        XCTAssertTrue(dockerfile.contains("USER trunk"))
        // The owner's tools run in the image too: `import supabase` writes its reject file
        // into the working directory, which the image's user must be able to write.
        XCTAssertTrue(dockerfile.contains("install -d -o trunk -g trunk /var/lib/trunk-sync"))
        XCTAssertTrue(dockerfile.contains("WORKDIR /var/lib/trunk-sync"))
        // …and the migrations are the image's, named: never a ./migrations found there.
        XCTAssertTrue(dockerfile.contains("TRUNK_SYNC_MIGRATIONS_DIR=/usr/share/trunk-sync/migrations"))
        XCTAssertTrue(dockerfile.contains("-c release"))
        let example = try String(contentsOfFile: repositoryRoot() + "/.env.example", encoding: .utf8)
        let ignored = try String(contentsOfFile: repositoryRoot() + "/.gitignore", encoding: .utf8)
        XCTAssertTrue(ignored.split(separator: "\n").contains(".env"), ".env stays out of git")
        XCTAssertTrue(example.contains("TRUNK_SYNC_JWT_SECRET=change-me"))
    }
}
