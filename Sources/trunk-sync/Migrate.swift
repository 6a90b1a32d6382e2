import ArgumentParser
import Foundation
import Logging
import Postgres
import TrunkSync

struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Apply pending database migrations, or list them.",
        subcommands: [Apply.self, Status.self],
        defaultSubcommand: Apply.self
    )

    struct Apply: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "apply",
            abstract: "Apply every pending migration, each in its own transaction (the default)."
        )

        @OptionGroup var options: CommonOptions

        func run() async throws {
            try await reportingErrors {
                let configuration = try options.load()
                let logger = Logger(label: "trunk-sync.migrate")
                let migrator = Migrator(
                    migrations: try Migration.load(from: configuration.migrationsDirectory), logger: logger)
                let pool = try commandPool(configuration, logger: logger)
                onExit { await pool.close() }
                let encryption = configuration.keyEncryptionKey
                let (applied, encrypted) = try await pool.withConnection { connection in
                    var encrypted = 0
                    let applied = try migrator.migrate(
                        on: connection,
                        // Stored keys no server could use would be a broken upgrade: refuse first.
                        before: { try SigningKeyStore.checkBeforeMigrating(on: $0, encryption: encryption) },
                        after: { encrypted = try SigningKeyStore.encryptPlaintextKeys(on: $0, encryption: encryption) })
                    return (applied, encrypted)
                }
                if applied.isEmpty {
                    print("database is up to date (\(migrator.migrations.count) migrations applied)")
                } else {
                    for migration in applied { print("applied \(migration.name)") }
                }
                if encrypted > 0 { print("encrypted \(encrypted) signing key(s) with TRUNK_SYNC_KEY_ENCRYPTION_KEY") }
            }
        }
    }

    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List applied and pending migrations.")

        @OptionGroup var options: CommonOptions

        func run() async throws {
            try await reportingErrors {
                let configuration = try options.load()
                let logger = Logger(label: "trunk-sync.migrate")
                let migrator = Migrator(
                    migrations: try Migration.load(from: configuration.migrationsDirectory), logger: logger)
                let pool = try commandPool(configuration, logger: logger)
                onExit { await pool.close() }
                let status = try await pool.withConnection { try migrator.status(on: $0) }
                for applied in status.applied {
                    print("applied  \(applied.name)  \(formatTimestamp(applied.appliedAt))")
                }
                for pending in status.pending { print("pending  \(pending.name)") }
                print("\(status.applied.count) applied, \(status.pending.count) pending")
            }
        }
    }
}

func formatTimestamp(_ timestamp: PostgresTimestamp) -> String {
    let formatter = ISO8601DateFormatter()
    return formatter.string(from: timestamp.date)
}
