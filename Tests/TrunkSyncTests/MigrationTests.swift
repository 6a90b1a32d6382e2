import Foundation
import Postgres
import TestSupport
import TrunkSync
import XCTest

final class MigrationTests: XCTestCase {
    var database: PostgresConfiguration!
    var directory: String!

    override func setUpWithError() throws {
        database = try TestDatabase.create(prefix: "migrations")
        directory = NSTemporaryDirectory() + "migrations-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try write("0001_first.sql", "create table one (id int);")
        try write("0002_second.sql", "create table two (id int);")
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(atPath: directory)
        try TestDatabase.drop(database)
    }

    func write(_ name: String, _ sql: String) throws {
        try sql.write(toFile: directory + "/" + name, atomically: true, encoding: .utf8)
    }

    func migrator() throws -> Migrator {
        Migrator(migrations: try Migration.load(from: directory), logger: TestDatabase.quietLogger)
    }

    func testFreshApplyThenRerunIsANoOp() throws {
        let connection = try PostgresConnection.connect(database)
        let applied = try migrator().migrate(on: connection)
        XCTAssertEqual(applied.map(\.name), ["0001_first.sql", "0002_second.sql"])
        let status = try migrator().status(on: connection)
        XCTAssertEqual(status.applied.map(\.version), [1, 2])
        XCTAssertTrue(status.pending.isEmpty)
        XCTAssertEqual(try migrator().migrate(on: connection), [])
        let rows = try connection.query("select name, checksum from schema_migrations order by version")
        XCTAssertEqual(rows.count, 2)
        XCTAssertEqual(try rows[0].decode(String.self, column: 1), try migrator().migrations[0].checksum)
        XCTAssertEqual(try migrator().migrations[0].checksum.count, 64)
    }

    func testNewFileIsAppliedLater() throws {
        let connection = try PostgresConnection.connect(database)
        _ = try migrator().migrate(on: connection)
        try write("0003_third.sql", "create table three (id int);")
        XCTAssertEqual(try migrator().status(on: connection).pending.map(\.name), ["0003_third.sql"])
        XCTAssertEqual(try migrator().migrate(on: connection).map(\.name), ["0003_third.sql"])
    }

    func testEditedAppliedFileIsRefused() throws {
        let connection = try PostgresConnection.connect(database)
        _ = try migrator().migrate(on: connection)
        try write("0001_first.sql", "create table one (id bigint);")
        try write("0003_third.sql", "create table three (id int);")
        XCTAssertThrowsError(try migrator().migrate(on: connection)) { error in
            XCTAssertEqual(error as? MigrationError, .appliedFileChanged("0001_first.sql"))
            XCTAssertTrue("\(error)".contains("0001_first.sql was edited"))
        }
        // Nothing else was applied.
        XCTAssertEqual(
            try connection.query("select to_regclass('three') is null")[0].decode(Bool.self, column: 0), true)
        XCTAssertThrowsError(try migrator().status(on: connection))
    }

    func testRemovedAppliedFileIsRefused() throws {
        let connection = try PostgresConnection.connect(database)
        _ = try migrator().migrate(on: connection)
        try FileManager.default.removeItem(atPath: directory + "/0002_second.sql")
        XCTAssertThrowsError(try migrator().migrate(on: connection)) { error in
            XCTAssertEqual(error as? MigrationError, .appliedFileMissing("0002_second.sql"))
        }
    }

    func testAnOlderBinaryStaysReadyAgainstANewerSchemaButWillNotMigrateIt() throws {
        try write("0003_third.sql", "create table three (id int);")
        let connection = try PostgresConnection.connect(database)
        _ = try migrator().migrate(on: connection)
        try FileManager.default.removeItem(atPath: directory + "/0003_third.sql")
        XCTAssertEqual(try migrator().pendingCount(on: connection), 0)
        XCTAssertThrowsError(try migrator().migrate(on: connection)) {
            XCTAssertEqual($0 as? MigrationError, .appliedFileMissing("0003_third.sql"))
        }
        // Its own files are still checked.
        try write("0002_second.sql", "create table two (id bigint);")
        XCTAssertThrowsError(try migrator().pendingCount(on: connection))
    }

    /// The door's forms (the server's readiness and console, `migrate status`) answer as
    /// the blocking connection's do: no table yet, applied, a newer schema, an edited file.
    func testStatusThroughTheDoorMatchesTheBlockingConnections() async throws {
        var settings = Database.Settings()
        settings.maxConnections = 1
        let door = try Database(database, settings: settings, logger: TestDatabase.quietLogger)
        do {
            let migrator = try self.migrator()
            let fresh = try await door.read(as: .server) { try await migrator.status(on: $0) }
            XCTAssertEqual(fresh.applied, [])
            XCTAssertEqual(fresh.pending.map(\.name), ["0001_first.sql", "0002_second.sql"])
            let pending = try await door.read(as: .server) { try await migrator.pendingCount(on: $0) }
            XCTAssertEqual(pending, 2)

            let connection = try PostgresConnection.connect(database)
            try write("0003_third.sql", "create table three (id int);")
            _ = try self.migrator().migrate(on: connection)
            // 0003 was applied by a newer binary: ready, but not a status `migrate` accepts.
            let applied = try await door.read(as: .server) { try await migrator.status(on: $0, allowNewer: true) }
            XCTAssertEqual(applied.applied, try migrator.status(on: connection, allowNewer: true).applied)
            XCTAssertEqual(applied.applied.map(\.version), [1, 2, 3])
            XCTAssertTrue(applied.pending.isEmpty)
            let ready = try await door.read(as: .server) { try await migrator.pendingCount(on: $0) }
            XCTAssertEqual(ready, 0)
            do {
                _ = try await door.read(as: .server) { try await migrator.status(on: $0) }
                XCTFail("an applied file this binary lacks is refused")
            } catch let error as MigrationError {
                XCTAssertEqual(error, .appliedFileMissing("0003_third.sql"))
            }
            try write("0002_second.sql", "create table two (id bigint);")
            let edited = try self.migrator()
            do {
                _ = try await door.read(as: .server) { try await edited.pendingCount(on: $0) }
                XCTFail("an edited applied file is refused")
            } catch let error as MigrationError {
                XCTAssertEqual(error, .appliedFileChanged("0002_second.sql"))
            }
        } catch {
            await door.close()
            throw error
        }
        await door.close()
    }

    func testFailingMigrationRollsBackAndStopsTheRun() throws {
        try write("0003_broken.sql", "create table three (id int); select * from nowhere;")
        try write("0004_after.sql", "create table four (id int);")
        let connection = try PostgresConnection.connect(database)
        XCTAssertThrowsError(try migrator().migrate(on: connection)) { error in
            guard case .failed(let name, let reason)? = error as? MigrationError else { return XCTFail("\(error)") }
            XCTAssertEqual(name, "0003_broken.sql")
            XCTAssertTrue(reason.contains("42P01"), reason)
        }
        let state = try connection.query(
            "select to_regclass('two') is not null, to_regclass('three') is null, to_regclass('four') is null, (select count(*) from schema_migrations)"
        )[0]
        XCTAssertTrue(try state.decode(Bool.self, column: 0), "earlier migrations stay applied")
        XCTAssertTrue(try state.decode(Bool.self, column: 1), "the failed one is rolled back")
        XCTAssertTrue(try state.decode(Bool.self, column: 2), "later ones are not applied")
        XCTAssertEqual(try state.decode(Int.self, column: 3), 2)
    }

    func testOutOfOrderFileIsRefused() throws {
        try FileManager.default.removeItem(atPath: directory + "/0001_first.sql")
        let connection = try PostgresConnection.connect(database)
        _ = try migrator().migrate(on: connection)
        try write("0001_first.sql", "create table one (id int);")
        XCTAssertThrowsError(try migrator().migrate(on: connection)) { error in
            XCTAssertEqual(
                error as? MigrationError, .outOfOrder(pending: "0001_first.sql", newestApplied: "0002_second.sql"))
        }
    }

    func testBadFileNamesAndDuplicateVersionsAreRefused() throws {
        try write("first.sql", "select 1;")
        XCTAssertThrowsError(try Migration.load(from: directory)) {
            XCTAssertEqual($0 as? MigrationError, .badFileName("first.sql"))
        }
        try FileManager.default.removeItem(atPath: directory + "/first.sql")
        try write("002_again.sql", "select 1;")
        XCTAssertThrowsError(try Migration.load(from: directory)) {
            XCTAssertEqual($0 as? MigrationError, .duplicateVersion("0002_second.sql", "002_again.sql"))
        }
        XCTAssertThrowsError(try Migration.load(from: directory + "/missing")) {
            XCTAssertEqual($0 as? MigrationError, .directoryUnreadable(directory + "/missing"))
        }
    }

    func testTheRepositoryMigrationsApplyCleanlyTwice() throws {
        let migrations = try Migration.load(from: repositoryRoot() + "/migrations")
        XCTAssertFalse(migrations.isEmpty)
        let connection = try PostgresConnection.connect(database)
        let migrator = Migrator(migrations: migrations, logger: TestDatabase.quietLogger)
        XCTAssertEqual(try migrator.migrate(on: connection).count, migrations.count)
        XCTAssertEqual(try migrator.migrate(on: connection).count, 0)
        // A second database in the same cluster (the role already exists) migrates too.
        let other = try TestDatabase.create(prefix: "migrations")
        defer { try? TestDatabase.drop(other) }
        XCTAssertEqual(try migrator.migrate(on: try PostgresConnection.connect(other)).count, migrations.count)
    }
}
