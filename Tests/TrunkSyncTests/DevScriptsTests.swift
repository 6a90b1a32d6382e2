import Foundation
import Postgres
import TestSupport
import XCTest

/// The scripts behind `make run` and `make test`, run as developers run them.
final class DevScriptsTests: XCTestCase {
    func freePort() throws -> Int { try serverPort() }

    /// The cluster's directory holds its Unix socket, and local connections through it are
    /// trusted as the superuser: only the developer (or `postgres` when run as root) may
    /// enter it. A directory left world-readable by an older pg.sh is tightened on start.
    func testPrivateClusterDirectoryAndSocketAreOwnerOnly() throws {
        let parent = NSTemporaryDirectory() + "pgdir-" + UUID().uuidString
        let directory = parent + "/pg"
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        defer { try? FileManager.default.removeItem(atPath: parent) }
        let script = repositoryRoot() + "/scripts/pg.sh"
        let port = try freePort()
        // spawnAndWait: the server pg.sh starts would keep a pipe of `Command.run` open.
        XCTAssertEqual(try Command.spawnAndWait(script, ["start", directory, String(port)]), 0)
        defer { _ = try? Command.spawnAndWait(script, ["stop", directory]) }

        let mode = try XCTUnwrap(try FileManager.default.attributesOfItem(atPath: directory)[.posixPermissions] as? Int)
        XCTAssertEqual(String(mode, radix: 8), "700", "the cluster directory (socket directory) is owner-only")
        let socket = directory + "/.s.PGSQL.\(port)"
        let socketMode = try XCTUnwrap(
            try FileManager.default.attributesOfItem(atPath: socket)[.posixPermissions] as? Int)
        XCTAssertEqual(String(socketMode, radix: 8), "700", "the socket itself is owner-only")

        // As root the test can try what another local user could do: connect through the
        // socket, which pg_hba trusts, as the superuser.
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/sbin/runuser") else { return }
        let stranger = try Command.run(
            "/usr/sbin/runuser",
            [
                "-u", "nobody", "--", "psql", "-h", directory, "-p", String(port), "-U", "trunk", "-d", "postgres",
                "-tAc", "select 1",
            ])
        XCTAssertNotEqual(stranger.status, 0, "another local user connected: \(stranger.stdout)")
        XCTAssertFalse(stranger.stdout.contains("1"), stranger.stdout)
    }

    /// Swift is the one prerequisite scripts/deps.sh cannot install: without it, `make run` and
    /// `make test` stop at once saying where to get it, not later in `swift build`.
    func testDepsSaysWhereToGetSwift() throws {
        let empty = NSTemporaryDirectory() + "no-swift-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: empty) }
        let result = try Command.run(
            "/bin/bash", [repositoryRoot() + "/scripts/deps.sh"], environment: ["PATH": empty, "HOME": empty])
        XCTAssertEqual(result.status, 1, result.stdout + result.stderr)
        XCTAssertTrue(result.stderr.hasPrefix("swift is not on PATH"), result.stderr)
        XCTAssertTrue(result.stderr.contains("https://www.swift.org/install/linux/"), result.stderr)
        XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, result.stderr)
    }

    /// Starts `make run`'s script in `data` with the test build's binary, its output going to
    /// `log`. Foundation starts it in a process group of its own, which gets the stop signal as
    /// a terminal's Ctrl-C would reach the whole group; output goes to a file, which the
    /// database the script starts may keep open.
    func startRun(data: String, pgPort: Int, httpPort: Int, log: String) throws -> Process {
        if !FileManager.default.fileExists(atPath: log) {
            XCTAssertTrue(FileManager.default.createFile(atPath: log, contents: nil))
        }
        let output = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        output.seekToEndOfFile()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: repositoryRoot() + "/scripts/run.sh")
        process.environment = Command.environment([
            "TRUNK_SYNC_DEV_DATA": data, "TRUNK_SYNC_DEV_PG_PORT": String(pgPort), "TRUNK_SYNC_PORT": String(httpPort),
            "TRUNK_SYNC_ADMIN_PORT": String(try freePort()), "TRUNK_SYNC_BIN": Command.trunkSyncBinary(),
        ])
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        try process.run()
        return process
    }

    /// Whether the server `make run` started answers `/readyz` before the script ends or two
    /// minutes pass.
    func waitUntilReady(_ process: Process, httpPort: Int) -> Bool {
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline, process.isRunning {
            if (try? Command.run("/usr/bin/curl", ["-fsS", "http://127.0.0.1:\(httpPort)/readyz"]).status) == 0 {
                return true
            }
            usleep(200_000)
        }
        return false
    }

    /// `make run`'s script as developers run it (in a data directory of its own, with the
    /// test build's binary): the server logs in as its own role, made by migrate, not as
    /// the cluster's superuser; its secrets and socket directory are private; Ctrl-C stops
    /// the server and the database (stopping the process group).
    func testMakeRunServesAsItsOwnLoginRole() throws {
        let data = NSTemporaryDirectory() + "make-run-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: data) }
        let pgPort = try freePort()
        let httpPort = try freePort()
        let log = data + "/run.log"
        let process = try startRun(data: data, pgPort: pgPort, httpPort: httpPort, log: log)
        let group = process.processIdentifier
        defer {
            if process.isRunning { kill(-group, SIGKILL) }
            _ = try? Command.spawnAndWait(repositoryRoot() + "/scripts/pg.sh", ["stop", data + "/postgres"])
        }
        func text() -> String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }
        let ready = waitUntilReady(process, httpPort: httpPort)
        XCTAssertTrue(ready, text())
        guard ready else { return }

        let ownerURL = try Command.run(repositoryRoot() + "/scripts/pg.sh", ["url", data + "/postgres", "trunk_sync"])
        let owner = try PostgresConnection.connect(
            try PostgresConfiguration(ownerURL.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
        let logins = try owner.query(
            "select distinct usename::text from pg_stat_activity where datname = 'trunk_sync' and pid <> pg_backend_pid() and usename is not null"
        ).map { try $0.decode(String.self, column: 0) }
        XCTAssertEqual(logins, ["trunk_sync_server"], text())
        let privileged = try owner.query(
            "select rolsuper or rolcreaterole or rolbypassrls from pg_roles where rolname = 'trunk_sync_server'")[0]
            .decode(Bool.self, column: 0)
        XCTAssertFalse(privileged)
        XCTAssertTrue(text().contains("created the server's login role trunk_sync_server"), text())
        // Where things are, once; each migration applied is named once.
        XCTAssertTrue(
            text().contains("API           http://127.0.0.1:\(httpPort)/  (described at /openapi.json"), text())
        XCTAssertTrue(text().contains("console       http://127.0.0.1:"), text())
        XCTAssertTrue(text().contains("enable it with TRUNK_SYNC_ADMIN_EMAILS="), text())
        XCTAssertEqual(text().components(separatedBy: "0001_initial_schema.sql").count, 2, text())
        XCTAssertFalse(
            text().contains("TRUNK_SYNC_DATABASE_URL logs in as"), "no warning about the server's role: \(text())")
        // The owner's tools as printed, pasted into a shell in the checkout (trunk-sync is
        // not on PATH: the line names the binary).
        let tools = try XCTUnwrap(
            text().split(separator: "\n").first { $0.contains("owner's tools ") }?
                .components(separatedBy: "owner's tools ").last, text())
        let listed = try Command.run(
            "/bin/bash", ["-c", tools], environment: Command.environment([:]), currentDirectory: repositoryRoot())
        XCTAssertEqual(listed.status, 0, tools + "\n" + listed.stdout + listed.stderr)
        XCTAssertTrue(listed.stdout.contains("0 user(s)"), listed.stdout)
        for file in ["jwt_secret", "key_encryption_key", "server_db_password"] {
            let mode = try XCTUnwrap(
                try FileManager.default.attributesOfItem(atPath: data + "/" + file)[.posixPermissions] as? Int)
            XCTAssertEqual(String(mode, radix: 8), "600", file)
        }
        let mode = try XCTUnwrap(
            try FileManager.default.attributesOfItem(atPath: data + "/postgres")[.posixPermissions] as? Int)
        XCTAssertEqual(String(mode, radix: 8), "700")

        // Stopping: the server stops, then the script stops the database. A terminal's Ctrl-C
        // sends SIGINT to the whole group; a test may run as a background job, whose children
        // ignore SIGINT, so SIGTERM, which the script and the server handle alike.
        kill(-group, SIGTERM)
        let stopped = Date().addingTimeInterval(60)
        while process.isRunning, Date() < stopped { usleep(100_000) }
        XCTAssertFalse(process.isRunning, text())
        XCTAssertFalse(FileManager.default.fileExists(atPath: data + "/postgres/pgdata/postmaster.pid"), text())
    }

    /// A second `make run` in the same checkout (another terminal) is refused at once with one
    /// line, and leaves the first running: before, it found the database up, served beside
    /// the first and, ending (here at once, its port being the first's), stopped the
    /// database under the first server.
    func testASecondMakeRunInTheSameDataDirectoryLeavesTheFirstRunning() throws {
        let data = NSTemporaryDirectory() + "make-run-twice-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: data) }
        let pgPort = try freePort()
        let httpPort = try freePort()
        let first = try startRun(data: data, pgPort: pgPort, httpPort: httpPort, log: data + "/first.log")
        defer {
            if first.isRunning { kill(-first.processIdentifier, SIGKILL) }
            _ = try? Command.spawnAndWait(repositoryRoot() + "/scripts/pg.sh", ["stop", data + "/postgres"])
        }
        func text(_ name: String) -> String { (try? String(contentsOfFile: data + "/" + name, encoding: .utf8)) ?? "" }
        let ready = waitUntilReady(first, httpPort: httpPort)
        XCTAssertTrue(ready, text("first.log"))
        guard ready else { return }

        let second = try startRun(data: data, pgPort: pgPort, httpPort: httpPort, log: data + "/second.log")
        second.waitUntilExit()
        XCTAssertEqual(second.terminationStatus, 1, text("second.log"))
        XCTAssertTrue(text("second.log").contains("make run: another make run is using"), text("second.log"))
        XCTAssertTrue(first.isRunning, text("first.log"))
        XCTAssertEqual(
            try Command.run("/usr/bin/curl", ["-fsS", "http://127.0.0.1:\(httpPort)/readyz"]).status, 0,
            "the first server still has its database: " + text("first.log"))
        XCTAssertTrue(FileManager.default.fileExists(atPath: data + "/postgres/pgdata/postmaster.pid"))

        // Stopped, the first frees the data directory: a new make run starts on it.
        kill(-first.processIdentifier, SIGTERM)
        first.waitUntilExit()
        let third = try startRun(data: data, pgPort: pgPort, httpPort: httpPort, log: data + "/third.log")
        defer { if third.isRunning { kill(-third.processIdentifier, SIGKILL) } }
        XCTAssertTrue(waitUntilReady(third, httpPort: httpPort), text("third.log"))
        kill(-third.processIdentifier, SIGTERM)
        third.waitUntilExit()
    }
}
