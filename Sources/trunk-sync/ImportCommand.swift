import ArgumentParser
import Foundation
import Glibc
import Logging
import Postgres
import TrunkSync

struct ImportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Import data from another backend.",
        subcommands: [Supabase.self]
    )

    struct Supabase: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Move a hosted Supabase project's users, profiles, events and live sessions here.",
            discussion: """
                Reads the project's database (the connection string Supabase shows, as its postgres \
                role; sslmode=require works) in one read-only snapshot and writes trunk-sync's tables \
                as their owner (TRUNK_SYNC_MIGRATION_DATABASE_URL, default TRUNK_SYNC_DATABASE_URL), \
                in batches that each commit. Run it again at any time: it imports only what is new \
                (users by id, events by (user_id, client_id), sessions by id) and finishes a run that \
                was stopped. See docs/moving-from-supabase.md.

                Exit codes: 0 done and verified; 1 error (one line on stderr, nothing half-written); \
                3 done, but rows were rejected or emails conflicted, or events an earlier run \
                rejected are still not here (see --reject-file and the report); 4 the verification \
                found source events missing here. ArgumentParser's \
                usage errors exit 64.
                """)

        @OptionGroup var options: CommonOptions
        @Option(name: .customLong("from"), help: "The Supabase project's PostgreSQL URL or conninfo.") var source:
            String
        @Option(help: "Where rejected rows go, as JSON lines {table, id, reason}.")
        var rejectFile = "trunk-sync-import-rejects.jsonl"
        @Flag(help: "Read and check everything, write nothing, and report what would happen.") var dryRun = false
        @Flag(
            help: """
                Revoke the imported sessions the project no longer has live even when they are most of them \
                (more than 10 and more than half: without it such a run stops before revoking any, as --from \
                then more likely names another database than the project they came from).
                """)
        var revokeEndedSessions = false
        @Flag(help: "Print the report as JSON.") var json = false
        @Option(help: "Rows per batch (each batch commits on its own).") var batchSize = 10_000

        func validate() throws {
            guard (100...50_000).contains(batchSize) else { throw ValidationError("--batch-size must be 100 to 50000") }
        }

        func run() async throws {
            var outcome: SupabaseImport.Report? = nil
            try await reportingErrors {
                let configuration = try options.load()
                var settings = SupabaseImport.Options(
                    source: source,
                    destination: try configuration.ownerDatabase(),
                    migrations: try Migration.load(from: configuration.migrationsDirectory), rejectFile: rejectFile)
                settings.dryRun = dryRun
                settings.revokeEndedSessions = revokeEndedSessions
                settings.batchSize = batchSize
                if isatty(STDERR_FILENO) == 1 { settings.progress = ProgressLine().update }
                let work = SupabaseImport(settings)
                let report = try await onOwnThread(name: "import") { try work.run() }
                if isatty(STDERR_FILENO) == 1 { FileHandle.standardError.write(Data("\n".utf8)) }
                if json {
                    let encoder = JSONEncoder()
                    encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
                    print(String(decoding: try encoder.encode(report), as: UTF8.self))
                } else {
                    print(Self.text(report))
                }
                outcome = report
            }
            guard let outcome else { return }
            if outcome.hasRejects { throw ExitCode(3) }
            if !outcome.verification.passed { throw ExitCode(4) }
        }

        static func text(_ report: SupabaseImport.Report) -> String {
            func row(_ name: String, _ counts: SupabaseImport.TableCounts) -> [String] {
                [name, "\(counts.read)", "\(counts.imported)", "\(counts.alreadyThere)", "\(counts.rejected)"]
            }
            var lines: [String] = []
            if report.dryRun { lines.append("DRY RUN: nothing was written; a real run would do this:") }
            lines.append(
                table(
                    header: [
                        "TABLE", "READ", report.dryRun ? "WOULD IMPORT" : "IMPORTED", "ALREADY THERE", "REJECTED",
                    ],
                    rows: [
                        row("auth.users", report.users), row("public.profiles", report.profiles),
                        row("public.events", report.events), row("auth.sessions", report.sessions),
                    ]))
            if report.usersSeqMoved > 0 {
                lines.append(
                    "the database is on another WAL timeline than migrate last saw (restored or failed over): the next seq of \(report.usersSeqMoved) user(s) moved past anything a device may have seen, before anything was imported"
                )
            }
            if report.eventsRetimed > 0 {
                lines.append(
                    "\(report.eventsRetimed) event(s) older than their user's newest trunk-sync event got a created_at just after it"
                )
            }
            if report.sessionsUndecryptable > 0 {
                lines.append(
                    "\(report.sessionsUndecryptable) session(s) not imported: their refresh-token key is stored encrypted; those users sign in again"
                )
            }
            if report.sessionsWithoutToken > 0 {
                lines.append("\(report.sessionsWithoutToken) session(s) not imported: no live refresh token")
            }
            if report.sessionsRevoked > 0 {
                let verb = report.dryRun ? "would be revoked" : "revoked"
                lines.append("\(report.sessionsRevoked) imported session(s) \(verb): ended on the hosted project")
            }
            if report.usersUpdated > 0 {
                let verb = report.dryRun ? "would be updated" : "updated"
                lines.append(
                    "\(report.usersUpdated) imported user(s) \(verb): address, name or metadata changed on the hosted project"
                )
            }
            for conflict in report.conflicts {
                if let field = conflict.field {
                    let here = conflict.emailHere.map { ", here \($0)" } ?? ""
                    lines.append(
                        "conflict: \(field) of \(conflict.email) (source user \(conflict.sourceID)\(here)) not carried over: \(conflict.reason.explanation)"
                    )
                } else {
                    lines.append(
                        "conflict: \(conflict.email) (source user \(conflict.sourceID)) belongs to another trunk-sync user; not merged"
                    )
                }
            }
            let v = report.verification
            lines.append(
                "verification: \(v.usersComplete)/\(v.users) users complete, \(v.eventsFound)/\(v.eventsExpected) events, "
                    + "digest \(v.sourceDigest.prefix(16)) vs \(v.destinationDigest.prefix(16)): \(v.passed ? "OK" : "MISMATCH")"
            )
            for (user, missing) in v.incompleteUsers.sorted(by: { $0.key < $1.key }) {
                lines.append("  user \(user): \(missing) event(s) missing")
            }
            if v.eventsRejected > 0 {
                lines.append(
                    "  \(v.eventsRejected) source event(s) that trunk-sync's rules refuse are not here "
                        + "(each is in the reject file; fixed in the source, they come with the run after next)")
            }
            if let file = report.rejectFile, report.hasRejects { lines.append("rejected rows: \(file)") }
            return lines.joined(separator: "\n")
        }
    }
}

/// `events 123,456/1,000,000  52,000/s  ETA 17s` on stderr, redrawn at most twice a second.
final class ProgressLine: @unchecked Sendable {
    private let lock = NSLock()
    private let started = ContinuousClock.now
    private var shown = ContinuousClock.now - .seconds(1)
    private var first: Int? = nil

    func update(_ done: Int, _ total: Int) {
        lock.withLock {
            let now = ContinuousClock.now
            guard now - shown >= .milliseconds(500) || done == total else { return }
            shown = now
            if first == nil { first = done }
            let seconds =
                Double((now - started).components.seconds) + Double((now - started).components.attoseconds) / 1e18
            let rate = seconds > 0 ? Double(done - (first ?? 0)) / seconds : 0
            let eta = rate > 0 ? "ETA \(Int(Double(total - done) / rate))s" : ""
            FileHandle.standardError.write(Data("\r\u{1b}[Kevents \(done)/\(total)  \(Int(rate))/s  \(eta)".utf8))
        }
    }
}
