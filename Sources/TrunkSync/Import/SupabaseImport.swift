import Foundation
import Logging
import Postgres
import TrunkCrypto

/// An error that stops an import, one line an operator can act on; nothing half-written
/// that a re-run cannot finish (every batch commits whole or not at all).
public enum ImportError: Error, CustomStringConvertible {
    /// The source cannot be read as a Supabase project's database.
    case source(String)
    /// The destination cannot take the import.
    case destination(String)

    public var description: String {
        switch self {
        case .source(let message): return "source: \(message)"
        case .destination(let message): return "destination: \(message)"
        }
    }
}

/// `trunk-sync import supabase`: moves a hosted Supabase project's users (with their
/// profiles' `full_name`), events and live sessions into trunk-sync's tables.
///
/// - Source: read in one read-only repeatable-read snapshot (`SupabaseSource`).
/// - Destination: written as the tables' owner, in batches that each commit on their own
///   (COPY into a temporary table, then one set-based statement), so a run killed at any
///   moment loses at most the batch in flight and a re-run finishes the job: users are
///   matched by id, events by `(user_id, client_id)`, sessions by id, and each user's count
///   of source events read is committed with the batch (`supabase_import_progress`), so a
///   re-run reads only the users whose count changed. Sessions it inserts are recorded
///   (`supabase_imported_sessions`); each run revokes those the source has ended since. Each
///   session comes with its live refresh token and that token's parent (recorded in
///   `supabase_imported_tokens`), so a client that lost its last refresh's answer goes on. The
///   address, name and metadata it writes are recorded (`supabase_imported_users`); each run
///   carries over what changed at the source since, unless it changed here too (a conflict).
/// - Events get `seq` after the user's `last_seq` (after what they pushed meanwhile), in the
///   source's order (time, then id), under the user's row lock as a push takes it; each
///   committed batch is announced on `trunk_sync_events` as a push is. A user with no event
///   here yet (a first import) has nothing to look up: the import numbers their events
///   itself and inserts them as they come; the others' are looked up and placed in SQL.
public struct SupabaseImport: Sendable {
    /// What to do.
    public struct Options: Sendable {
        /// The source's URL or conninfo (`--from`).
        public var source: String
        /// The destination (the owner's login).
        public var destination: PostgresConfiguration
        /// Migrations this binary ships, to check the destination is current.
        public var migrations: [Migration]
        /// Where rejected rows go (JSON lines), unless a dry run.
        public var rejectFile: String
        /// Check and count everything in one transaction rolled back at the end.
        public var dryRun = false
        /// Revoke the imported sessions the source no longer has live even when they are
        /// most of them (`--revoke-ended-sessions`; see `ImportRun.mostSessionsEnded`).
        public var revokeEndedSessions = false
        /// Rows per batch.
        public var batchSize = 10_000
        /// Called with progress now and then (events read, events in total).
        public var progress: (@Sendable (_ done: Int, _ total: Int) -> Void)? = nil

        public init(source: String, destination: PostgresConfiguration, migrations: [Migration], rejectFile: String) {
            self.source = source
            self.destination = destination
            self.migrations = migrations
            self.rejectFile = rejectFile
        }
    }

    /// Counts for one table.
    public struct TableCounts: Codable, Sendable, Equatable {
        public var read = 0
        public var imported = 0
        public var alreadyThere = 0
        public var rejected = 0

        enum CodingKeys: String, CodingKey {
            case read, imported
            case alreadyThere = "already_there"
            case rejected
        }
    }

    /// The verification pass: every event the source holds for an imported user, and that
    /// trunk-sync's rules accept, is in the destination under the same user and `client_id`.
    public struct Verification: Codable, Sendable, Equatable {
        public var users = 0
        public var usersComplete = 0
        public var eventsExpected = 0
        public var eventsFound = 0
        /// XOR of the SHA-256 of each expected `"user_id,client_id"` pair, and of each pair
        /// found in the destination: equal when nothing is missing.
        public var sourceDigest = ""
        public var destinationDigest = ""
        /// Up to 10 users with events missing, and how many.
        public var incompleteUsers: [String: Int] = [:]
        /// Source events of imported users that trunk-sync's rules refuse and that are not
        /// here, whichever run rejected them. Each is in this run's reject file: a later run
        /// does not read them again, so the verification counts them, and lists those this
        /// run's events phase did not.
        public var eventsRejected = 0

        public var passed: Bool { eventsExpected == eventsFound && sourceDigest == destinationDigest }

        enum CodingKeys: String, CodingKey {
            case users
            case usersComplete = "users_complete"
            case eventsExpected = "events_expected"
            case eventsFound = "events_found"
            case sourceDigest = "source_digest"
            case destinationDigest = "destination_digest"
            case incompleteUsers = "incomplete_users"
            case eventsRejected = "events_rejected"
            case passed
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(users, forKey: .users)
            try container.encode(usersComplete, forKey: .usersComplete)
            try container.encode(eventsExpected, forKey: .eventsExpected)
            try container.encode(eventsFound, forKey: .eventsFound)
            try container.encode(sourceDigest, forKey: .sourceDigest)
            try container.encode(destinationDigest, forKey: .destinationDigest)
            try container.encode(incompleteUsers, forKey: .incompleteUsers)
            try container.encode(eventsRejected, forKey: .eventsRejected)
            try container.encode(passed, forKey: .passed)
        }

        public init() {}

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            users = try container.decode(Int.self, forKey: .users)
            usersComplete = try container.decode(Int.self, forKey: .usersComplete)
            eventsExpected = try container.decode(Int.self, forKey: .eventsExpected)
            eventsFound = try container.decode(Int.self, forKey: .eventsFound)
            sourceDigest = try container.decode(String.self, forKey: .sourceDigest)
            destinationDigest = try container.decode(String.self, forKey: .destinationDigest)
            incompleteUsers = try container.decode([String: Int].self, forKey: .incompleteUsers)
            eventsRejected = try container.decodeIfPresent(Int.self, forKey: .eventsRejected) ?? 0
        }
    }

    /// What a run left for the operator: a source user not imported because another
    /// trunk-sync user has their address (never merged), or, for a user an earlier run
    /// imported, a change on the hosted project not carried over (`field`), so that nothing
    /// changed here is overwritten.
    public struct Conflict: Codable, Sendable, Equatable {
        public var sourceID: String
        /// The user's address on the hosted project.
        public var email: String
        /// What was not carried over (`email`, `full_name`, `user_metadata`); nil: the user
        /// was not imported.
        public var field: String? = nil
        /// The user's address here, when the address was not carried over.
        public var emailHere: String? = nil
        public var reason: Reason

        public enum Reason: String, Codable, Sendable {
            /// The (new) address belongs to another trunk-sync user, or to another source user.
            case addressTaken = "address_taken"
            /// Changed on the hosted project and here since the import wrote it.
            case changedOnBothSides = "changed_on_both_sides"
            /// The two differ, and the import has no record of what it wrote (a user imported
            /// before that record): which side changed cannot be told.
            case notRecorded = "not_recorded"
            /// The hosted metadata merged with the one here (or the one here) is what
            /// trunk-sync cannot take: over 16 KiB, nested too deep, or holding a number no
            /// double holds (`SupabaseSource.metadataRejectReason`; every access token carries
            /// it). The name is not carried either.
            case metadataUnusable = "metadata_unusable"

            /// From `ImportRun.compareUsers`'s step; nil for a step that is no conflict.
            init?(step: String) {
                switch step {
                case "taken": self = .addressTaken
                case "both": self = .changedOnBothSides
                case "not_recorded": self = .notRecorded
                case "unusable": self = .metadataUnusable
                default: return nil
                }
            }

            /// Why the value here was kept, for the reject file and the text report.
            public var explanation: String {
                switch self {
                case .addressTaken: return "the hosted address belongs to another user here"
                case .changedOnBothSides: return "changed on the hosted project and here since the import; kept here"
                case .notRecorded:
                    return "differs from the hosted project's, and this database has no record of what an earlier "
                        + "import wrote; kept here"
                case .metadataUnusable:
                    return "the hosted user_metadata merged with the one here would be over "
                        + "\(UserRecord.maxMetadataBytes) bytes, nested more than \(UserRecord.maxMetadataDepth) levels "
                        + "or hold a number no IEEE double holds, and every access token carries it; kept here, "
                        + "with the name"
                }
            }
        }

        enum CodingKeys: String, CodingKey {
            case sourceID = "source_id"
            case email, field
            case emailHere = "email_here"
            case reason
        }
    }

    /// What a run did (or, dry, would do).
    public struct Report: Codable, Sendable {
        public var dryRun = false
        public var users = TableCounts()
        public var profiles = TableCounts()
        public var events = TableCounts()
        public var sessions = TableCounts()
        /// Events whose `created_at` was moved after the user's newest trunk-sync event (a
        /// delta import of events the hosted project took after the user's first pushes
        /// here), so `created_at > lastSync` still finds them.
        public var eventsRetimed = 0
        /// Sessions whose refresh-token key is stored encrypted: not imported, those users
        /// sign in again.
        public var sessionsUndecryptable = 0
        /// Sessions with no live refresh token (every one revoked): nothing to continue.
        public var sessionsWithoutToken = 0
        /// Sessions an import brought over that the hosted project ended since (signed out,
        /// every refresh token revoked, expired, or the user banned, deleted softly or
        /// deleted), revoked here as a sign-out revokes them.
        public var sessionsRevoked = 0
        /// Users an earlier run imported whose address, name or metadata changed on the
        /// hosted project since, carried over here (where nothing changed here).
        public var usersUpdated = 0
        /// Users whose next seq the run moved before numbering anything, the database being
        /// on another WAL timeline than `migrate` last saw (restored or failed over since:
        /// `SeqTimeline`); 0 almost always.
        public var usersSeqMoved = 0
        public var conflicts: [Conflict] = []
        public var verification = Verification()
        public var rejectFile: String?
        /// Seconds each phase took (users, sessions, events, verification).
        public var seconds: [String: Double] = [:]

        /// Whether anything was rejected or conflicted (the command then exits 3): by this
        /// run, or source events an earlier run rejected that are still not here.
        public var hasRejects: Bool {
            users.rejected + events.rejected + sessions.rejected > 0 || !conflicts.isEmpty
                || verification.eventsRejected > 0
        }

        enum CodingKeys: String, CodingKey {
            case dryRun = "dry_run"
            case users, profiles, events, sessions
            case eventsRetimed = "events_retimed"
            case sessionsUndecryptable = "sessions_undecryptable"
            case sessionsWithoutToken = "sessions_without_token"
            case sessionsRevoked = "sessions_revoked"
            case usersUpdated = "users_updated"
            case usersSeqMoved = "users_seq_moved"
            case conflicts, verification
            case rejectFile = "reject_file"
            case seconds
        }
    }

    let options: Options

    public init(_ options: Options) { self.options = options }

    /// Runs the import (blocking: call it from a thread of its own, not the cooperative pool).
    public func run() throws -> Report {
        let source = try SupabaseSource(url: options.source)
        let destination = try Self.openDestination(options)
        // Numbered after what devices may have seen: a database failed over or restored
        // since `migrate` ran moves its seqs first, as a server's first connection would.
        var moved = 0
        if !options.dryRun {
            do {
                if case .advanced(_, _, let users) = try SeqTimeline.check(on: destination) { moved = Int(users) }
            } catch {
                throw ImportError.destination("\(error)")
            }
        }
        let rejects = try RejectWriter(path: options.dryRun ? nil : options.rejectFile)
        defer { rejects.close() }
        var report = try ImportRun(options: options, source: source, destination: destination, rejects: rejects).all()
        report.usersSeqMoved = moved
        return report
    }

    /// The session-level advisory lock a run holds on the destination (`migrate` has its own).
    static let advisoryLockKey: Int64 = 0x7472_756e_6b69_6d70

    static func openDestination(_ options: Options) throws -> PostgresConnection {
        let connection: PostgresConnection
        do {
            connection = try PostgresConnection.connect(options.destination)
        } catch {
            throw ImportError.destination("\(error)")
        }
        do {
            try DatabaseRoles.requireOwner(on: connection)
        } catch {
            throw ImportError.destination("\(error)")
        }
        let status: Migrator.Status
        do {
            status = try Migrator(migrations: options.migrations, logger: .init(label: "trunk-sync.import")).status(
                on: connection)
        } catch {
            throw ImportError.destination("not migrated (\(error)): run trunk-sync migrate first")
        }
        if !status.pending.isEmpty {
            throw ImportError.destination(
                "not migrated: \(status.pending.count) migration(s) pending (\(status.pending.map(\.name).joined(separator: ", "))); run trunk-sync migrate first"
            )
        }
        // One import at a time: two runs would each count the other's users and sessions as
        // theirs or skip them. Held by this session until the run ends (or its connection does).
        let locked: Bool
        do {
            locked = try connection.query("select pg_try_advisory_lock($1)", Self.advisoryLockKey)[0]
                .decode(Bool.self, column: 0)
        } catch {
            throw ImportError.destination("\(error)")
        }
        if !locked {
            throw ImportError.destination(
                "another trunk-sync import supabase is running against this database; run again once it has finished")
        }
        try connection.execute(sessionSetup)
        return connection
    }

    /// The run's settings and temporary tables (its session's own: each batch is copied into
    /// one, then written by one statement). No JIT: each batch's statements run once over a
    /// temporary table without statistics, whose cost estimates set off compilations that
    /// took longer (0.8 s a batch of users) than the statements themselves.
    static let sessionSetup = """
        set timezone = 'UTC';
        set work_mem = '32MB';
        set jit = off;
        create temp table import_users (id uuid, email text, created_at timestamptz, updated_at timestamptz,
          email_confirmed_at timestamptz, last_sign_in_at timestamptz, metadata jsonb, profile_name text);
        create temp table import_events (ord int, seq bigint, user_id uuid, id uuid, type text, payload jsonb, client_id uuid,
          client_timestamp timestamptz, created_at timestamptz);
        create temp table import_seen (user_id uuid, n bigint);
        create temp table import_counts (user_id uuid primary key, n bigint);
        create temp table import_sessions (id uuid, user_id uuid, created_at timestamptz, aal text, token_hash bytea,
          parent_hash bytea);
        create temp table import_source_sessions (id uuid primary key, user_id uuid, live bool);
        create temp table import_user_changes (id uuid, there_email text, here_email text, then_email text,
          email_step text, there_name jsonb, then_name jsonb, name_step text, here_meta jsonb, meta_merged jsonb,
          meta_record jsonb, meta_step text);
        """
}

/// Rejected rows, as JSON lines: `{"table", "id", "reason"}`.
final class RejectWriter {
    private var handle: FileHandle?
    let path: String?

    /// Opens `path` for writing, emptied, as a shell's `>` does: written in place, so a
    /// symbolic link, `/dev/null` or a pipe stays what it is (Foundation's `createFile`
    /// writes a new file and renames it over the path: as root, `--reject-file /dev/null`
    /// replaced the device with a file). A new file is the owner's only (`0600`): rejected
    /// rows carry addresses.
    init(path: String?) throws {
        self.path = path
        guard let path else { return }
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw ImportError.destination(
                "cannot write the reject file \(path): \(String(cString: strerror(errno)))")
        }
        handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
    }

    func write(table: String, id: String, reason: String) {
        guard let handle else { return }
        let line = try? JSONSerialization.data(
            withJSONObject: ["table": table, "id": id, "reason": reason], options: [.sortedKeys])
        handle.write((line ?? Data()) + Data([0x0a]))
    }

    func close() {
        try? handle?.close()
        handle = nil
    }
}
