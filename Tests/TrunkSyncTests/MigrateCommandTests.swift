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
        let second = try migrate()
        XCTAssertEqual(second.status, 0, second.stderr)
        XCTAssertTrue(second.stdout.contains("database is up to date"), second.stdout)
        let status = try migrate(["status"])
        XCTAssertEqual(status.status, 0, status.stderr)
        XCTAssertTrue(status.stdout.contains("applied  0001_initial_schema.sql"), status.stdout)
        XCTAssertTrue(status.stdout.contains("0 pending"), status.stdout)
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

    func testEditedFileStopsMigrateWithOneClearLine() throws {
        let directory = NSTemporaryDirectory() + "edited-" + UUID().uuidString
        try FileManager.default.copyItem(atPath: repositoryRoot() + "/migrations", toPath: directory)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        environment["TRUNK_SYNC_MIGRATIONS_DIR"] = directory
        XCTAssertEqual(try migrate().status, 0)
        let file = directory + "/0001_initial_schema.sql"
        try (try String(contentsOfFile: file, encoding: .utf8) + "\n-- edited\n").write(toFile: file, atomically: true, encoding: .utf8)
        let refused = try migrate()
        XCTAssertEqual(refused.status, 1)
        XCTAssertEqual(refused.stderr.split(separator: "\n").count, 1, refused.stderr)
        XCTAssertTrue(refused.stderr.contains("0001_initial_schema.sql was edited after it was applied"), refused.stderr)
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
