import Postgres
import TestSupport
import TrunkSync

/// A fresh database with the repository's migrations applied, and the owner's connection
/// to it (drop it with `TestDatabase.drop`).
func migratedDatabase(prefix: String) throws -> (PostgresConfiguration, PostgresConnection) {
    let database = try TestDatabase.create(prefix: prefix)
    let owner = try PostgresConnection.connect(database)
    _ = try Migrator(
        migrations: try Migration.load(from: repositoryRoot() + "/migrations"), logger: TestDatabase.quietLogger
    ).migrate(on: owner)
    return (database, owner)
}
