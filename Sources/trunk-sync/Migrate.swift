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

        @Flag(
            help: ArgumentHelp(
                "The database was restored from a logical dump or a copied data directory (a restore to a point in time is noticed by itself): move every user's next seq past anything a device may have seen.",
                valueName: "after-restore"))
        var afterRestore = false

        func run() async throws {
            try await reportingErrors {
                let configuration = try options.load()
                let logger = Logger(label: "trunk-sync.migrate")
                let migrator = Migrator(
                    migrations: try Migration.load(from: configuration.migrationsDirectory), logger: logger)
                let encryption = configuration.keyEncryptionKey
                let afterRestore = afterRestore
                // The URL migrate logs in with, named in its refusals.
                let setting = try configuration.ownerDatabase().setting ?? "TRUNK_SYNC_DATABASE_URL"
                // The server's login, when TRUNK_SYNC_DATABASE_URL is set (it may name the owner).
                let server = try configuration.databaseURL.flatMap { try DatabaseRoles.ServerLogin(url: $0) }
                let (applied, encrypted, role, timeline) = try await withOwnerConnection(configuration) {
                    connection in
                    var encrypted = 0
                    var role = DatabaseRoles.Outcome.sameAsOwner
                    var timeline = SeqTimeline.Outcome.unchanged
                    let applied = try migrator.migrate(
                        on: connection,
                        // What would leave the deployment broken or exposed is refused first,
                        // before anything changes: keys no server could use, a server login
                        // with rights it must not have.
                        before: { connection in
                            try DatabaseRoles.requireSchemaOwner(on: connection, setting: setting)
                            try SigningKeyStore.checkBeforeMigrating(on: connection, encryption: encryption)
                            if let server { try DatabaseRoles.checkServerLogin(server, on: connection) }
                        },
                        after: { connection in
                            encrypted = try SigningKeyStore.encryptPlaintextKeys(on: connection, encryption: encryption)
                            if let server { role = try DatabaseRoles.ensureServerLogin(server, on: connection) }
                            timeline = try SeqTimeline.check(on: connection, force: afterRestore)
                        },
                        // Each as it is committed: a later failure leaves it applied, and the
                        // operator told so.
                        applied: { print("applied \($0.name)") })
                    return (applied, encrypted, role, timeline)
                }
                if applied.isEmpty {
                    print("database is up to date (\(migrator.migrations.count) migrations applied)")
                }
                if encrypted > 0 { print("encrypted \(encrypted) signing key(s) with TRUNK_SYNC_KEY_ENCRYPTION_KEY") }
                switch timeline {
                case .advanced(let from, let to, let users):
                    let cause =
                        afterRestore
                        ? "--after-restore"
                        : from.map { "the database is on WAL timeline \(to), after \($0): restored or failed over" }
                            ?? "the database is on WAL timeline \(to), first recorded now: restored or failed over before"
                    print(
                        "\(cause); the next seq of \(users) user(s) moved past anything a device may have seen (to the time in microseconds, at least \(SeqTimeline.gap) ahead), so devices that pulled events the restore took back still receive every new one"
                    )
                case .unavailable(let reason):
                    print(
                        "warning: the WAL timeline cannot be read here (\(reason)): after a restore, run trunk-sync migrate --after-restore"
                    )
                case .notMigrated:
                    // Every migration of the directory is applied by now: it has none of 0018
                    // (a directory older than this binary), where the check is.
                    print(
                        "warning: \(afterRestore ? "--after-restore: nothing moved" : "the WAL timeline was not checked (a restore or failover since the last migrate goes unnoticed)"): migration \(SeqTimeline.migration) is not in this migrations directory (\(configuration.migrationsDirectory))"
                    )
                case .recorded, .unchanged: break
                }
                switch role {
                case .sameAsOwner: break
                case .created(let name):
                    print("created the server's login role \(name) (member of \(DatabaseRoles.app))")
                case .updated(let name):
                    print("updated the server's login role \(name) (member of \(DatabaseRoles.app))")
                }
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
                let database = try commandDatabase(configuration, logger: logger)
                let status = try await database.read(as: .server) { try await migrator.status(on: $0) }
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
