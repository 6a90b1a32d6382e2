import Foundation
import JSON
import Logging
import Postgres

/// A user's account as a whole: taking a copy of it (export) and deleting it. The one
/// implementation behind `trunk-sync users export|delete`, the self-service routes
/// (`GET /sync/v1/export`, `DELETE /sync/v1/account`) and any operator tool.
///
/// Every transaction names the user (`app.user_id`, and `app.email` for their sign-in code),
/// so it works for the server's restricted role under row-level security and for the
/// tables' owner alike. All SQL of the feature is in this file.
///
///     let accounts = Accounts(database: database, logger: logger)
///     try await accounts.export(userID) { bytes in try await output.write(bytes) }
///     if let deleted = try await accounts.delete(userID) { print(deleted.events) }
public struct Accounts: Sendable {
    let database: Database
    let logger: Logger
    /// Told of the sessions a deletion ends before `delete` returns (this instance refuses
    /// their tokens at once; the others hear of it from the database within milliseconds).
    let revocations: SessionRevocations?

    /// Accounts in `database`. `revocations`: the running server's set, if any.
    public init(database: Database, logger: Logger, revocations: SessionRevocations? = nil) {
        self.database = database
        self.logger = logger
        self.revocations = revocations
    }

    // MARK: - Deletion

    /// What a deletion removed.
    public struct Deletion: Sendable, Equatable {
        /// The deleted user.
        public var userID: UUID
        /// Their events removed.
        public var events: Int64
        /// Their sessions ended (each session's tokens are refused from now on).
        public var sessions: Int
    }

    /// Deletes the user and everything of theirs in one transaction: events, profile,
    /// sessions, refresh tokens, sign-in and confirmation codes, a running export's lease.
    /// Every access token of theirs is refused from then on by every instance, and their
    /// waiting long-polls and exports end. Logged by user id only. Returns nil when there
    /// is no such user.
    public func delete(_ user: UUID) async throws -> Deletion? {
        switch try await delete(user, confirmedBy: nil) {
        case .deleted(let deletion): return deletion
        case .notFound, .notConfirmed: return nil
        }
    }

    /// How a confirmed deletion ended.
    enum DeletionOutcome: Sendable {
        case deleted(Deletion)
        case notFound
        /// `confirm` said no: nothing was deleted (what it counted was committed).
        case notConfirmed
    }

    /// `delete`, run only if `confirm` — called inside the same transaction, after the
    /// user's row is locked — returns true.
    func delete(_ user: UUID, confirmedBy confirm: (@Sendable (Transaction) async throws -> Bool)?) async throws
        -> DeletionOutcome
    {
        typealias Revoked = [(session: UUID, user: UUID, tokensExpireAt: Int64)]
        enum Result: Sendable { case deleted(Deletion, Revoked), notFound, notConfirmed }
        let result: Result = try await database.transaction(as: .user(user)) { tx in
            // The lock makes a push wait for the deletion (then find no user) instead of
            // adding events beside it.
            guard
                let row = try await tx.query(
                    "select email, last_seq - seq_skipped from users where id = $1 for update", user
                ).first
            else { return .notFound }
            let email = try row.decode(String.self, column: 0)
            let events = try row.decode(Int64.self, column: 1)
            if let confirm, try await !confirm(tx) { return .notConfirmed }
            try await tx.query("select set_config('app.email', $1, true)", email)
            try await tx.query("delete from otp_codes where email = $1", email)
            let sessions = try await tx.query(
                "select count(*) from sessions where user_id = $1 and revoked_at is null", user
            )[0].decode(Int.self, column: 0)
            // Events, sessions, refresh tokens, the confirmation code and an export's lease go
            // by cascade; the sessions' trigger records each ended session as revoked and
            // notifies every instance.
            try await tx.query("delete from users where id = $1", user)
            let revoked = try await tx.query(
                """
                select session_id, user_id, floor(extract(epoch from expires_at))::int8 from session_revocations
                where user_id = $1 and expires_at > now() - interval '1 minute'
                """, user
            ).map {
                (
                    try $0.decode(UUID.self, column: 0), try $0.decode(UUID.self, column: 1),
                    try $0.decode(Int64.self, column: 2)
                )
            }
            return .deleted(Deletion(userID: user, events: events, sessions: sessions), revoked)
        }
        switch result {
        case .notFound: return .notFound
        case .notConfirmed: return .notConfirmed
        case .deleted(let deletion, let revoked):
            revocations?.record(revoked)
            logger.notice(
                "account deleted",
                metadata: [
                    "user_id": "\(user.uuidString.lowercased())", "events": "\(deletion.events)",
                    "sessions": "\(deletion.sessions)",
                ])
            return .deleted(deletion)
        }
    }

    // MARK: - Export

    /// Why an export did not start or did not finish.
    public enum ExportError: Error, Sendable, Equatable, CustomStringConvertible {
        /// No such user.
        case notFound
        /// Another export of this user is running (on any instance).
        case inProgress
        /// The user was deleted, or their export lease taken over, while exporting: what was
        /// written is incomplete.
        case interrupted

        /// One line for an operator.
        public var description: String {
            switch self {
            case .notFound: "no such user"
            case .inProgress: "an export of this user is already running"
            case .interrupted:
                "the export was interrupted (the user was deleted meanwhile); what was written is incomplete"
            }
        }
    }

    /// What an export wrote.
    public struct ExportSummary: Sendable, Equatable {
        /// Event lines written.
        public var events: Int64
        /// The `seq` of the last event line written; 0 when there was none.
        public var lastSeq: Int64
    }

    /// Events read per page, at most: a page is in memory while it is written, so it is
    /// also cut at `EventStore.streamedPageBytes` of payloads (an event's payload may be
    /// 64 KiB): ~1.1 MiB at worst, a few dozen KiB usually.
    public static let exportPageSize = 256

    /// Writes the user's data as JSON lines (NDJSON) through `write`, page by page, as it is
    /// read: first `{"kind":"account","id","email","created_at","full_name","user_metadata"}`,
    /// then one `{"kind":"event",…}` per event with the pull API's fields, in `seq` order —
    /// the events stored when the export started (later pushes are not included) — and last
    /// `{"kind":"end","events":N,"last_seq":S}` (`endLine`): how many event lines came before
    /// it and the last one's `seq` (0 when none). The end line is written only once every
    /// page has been: an export that fails or is interrupted has none, which is how a reader
    /// tells a whole copy from one cut short even where the HTTP framing was lost (a proxy
    /// that closes the connection instead, a file copied while it was written). Only one
    /// page is held at a time, and `write` is awaited before the next is read, so a slow
    /// consumer slows the export instead of growing memory.
    ///
    /// At most one export per user runs at a time across instances (`ExportError.inProgress`);
    /// a deletion meanwhile ends it with `ExportError.interrupted`. `progress` gets (events
    /// written, events in the export) after each page. Same as `beginExport` then `run`.
    @discardableResult
    public func export(
        _ user: UUID, pageSize: Int = Accounts.exportPageSize,
        progress: (@Sendable (Int64, Int64) -> Void)? = nil,
        write: @Sendable ([UInt8]) async throws -> Void
    ) async throws -> ExportSummary {
        try await run(try await beginExport(user), pageSize: pageSize, progress: progress, write: write)
    }

    /// An export that has started: its user's lease is held until `run` returns.
    public struct Export: Sendable {
        /// Whose data it is.
        public let user: UUID
        let lease: UUID
        let accountLine: [UInt8]
        /// The last `seq` it includes (the user's events when it started).
        public let through: Int64
    }

    /// Writes `export` (see `export(_:pageSize:progress:write:)`) and releases its lease,
    /// however it ends. `proceed` is asked before each page: false ends the export with
    /// `ExportError.interrupted` (a session revoked meanwhile).
    @discardableResult
    public func run(
        _ export: Export, pageSize: Int = Accounts.exportPageSize, progress: (@Sendable (Int64, Int64) -> Void)? = nil,
        proceed: (@Sendable () -> Bool)? = nil, write: @Sendable ([UInt8]) async throws -> Void
    ) async throws -> ExportSummary {
        let user = export.user
        do {
            try await write(export.accountLine)
            var cursor: Int64 = 0
            var written: Int64 = 0
            while cursor < export.through {
                if let proceed, !proceed() { throw ExportError.interrupted }
                guard
                    let page = try await exportPage(
                        user, lease: export.lease, after: cursor, through: export.through, limit: max(1, pageSize))
                else { throw ExportError.interrupted }
                guard page.count > 0, let last = page.lastSeq else { break }
                try await write(Self.lines(kind: "event", fromArray: page.eventsJSON))
                written += Int64(page.count)
                cursor = last
                progress?(written, export.through)
            }
            // Every page is written: only now may the copy say it is whole.
            try await write(Self.endLine(events: written, lastSeq: cursor))
            try await endExport(user, lease: export.lease)
            return ExportSummary(events: written, lastSeq: cursor)
        } catch {
            // Released in a task of its own: a cancelled producer must still let go.
            let lease = export.lease
            await Task.detached { [self] in try? await endExport(user, lease: lease) }.value
            throw error
        }
    }

    /// Reads the account and takes the user's export lease; throws `ExportError.notFound`
    /// or `.inProgress`. Hand the result to `run`, which releases the lease.
    public func beginExport(_ user: UUID) async throws -> Export {
        let lease = UUID()
        let start: Export? = try await database.transaction(as: .user(user)) { tx in
            guard
                let row = try await tx.query(
                    "select id, email, created_at, full_name, user_metadata, last_seq from users where id = $1", user
                ).first
            else { return nil }
            let taken = try await tx.query(
                """
                insert into account_exports (user_id, lease) values ($1, $2)
                on conflict (user_id) do update set lease = excluded.lease, renewed_at = now()
                where account_exports.renewed_at < now() - interval '60 seconds'
                returning 1
                """, user, lease)
            guard !taken.isEmpty else { throw ExportError.inProgress }
            var writer = JSONWriter(capacity: 256)
            writer.beginObject()
            writer.string("kind", "account")
            writer.string("id", try row.decode(UUID.self, column: 0).uuidString.lowercased())
            writer.string("email", try row.decode(String.self, column: 1))
            writer.string("created_at", RFC3339.format(try row.decode(PostgresTimestamp.self, column: 2)))
            writer.string("full_name", try row.decode(String?.self, column: 3))
            writer.raw("user_metadata", try row.decode(PostgresJSON.self, column: 4).bytes)
            writer.endObject()
            return Export(
                user: user, lease: lease, accountLine: writer.bytes + [UInt8(ascii: "\n")],
                through: try row.decode(Int64.self, column: 5))
        }
        guard let start else { throw ExportError.notFound }
        return start
    }

    /// One page of the export, renewing its lease in the same transaction (one round trip);
    /// nil when the lease is gone (the user deleted, or the export taken over after a
    /// stall). On the database's own loop, as `endExport`: the producer of a streamed body
    /// is not a request the HTTP server drains before its loops stop.
    func exportPage(_ user: UUID, lease: UUID, after: Int64, through: Int64, limit: Int) async throws -> EventStore
        .Page?
    {
        try await database.offHTTPLoops {
            try await database.transaction(as: .user(user)) { tx in
                let replies = try await tx.pipeline([
                    .prepared(
                        "update account_exports set renewed_at = now() where user_id = $1 and lease = $2 returning 1",
                        user,
                        lease),
                    .prepared(
                        EventStore.boundedInBytes(
                            """
                            select \(EventRecord.selectList)
                            from events where user_id = $1 and seq > $2 and seq <= $3 order by seq limit $4
                            """, bytesParameter: 5), user, after, through, Int64(limit),
                        Int64(EventStore.streamedPageBytes)),
                    .commit,
                ])
                guard !replies[0].isEmpty else { return nil }
                let rows = replies[1]
                let (json, lastSeq, _) = try EventPageEncoder.encode(rows, count: rows.count)
                return EventStore.Page(eventsJSON: json, count: rows.count, lastSeq: lastSeq, hasMore: false)
            }
        }
    }

    /// Releases the export's lease.
    func endExport(_ user: UUID, lease: UUID) async throws {
        try await database.offHTTPLoops {
            try await database.transaction(as: .user(user)) { tx in
                _ = try await tx.query("delete from account_exports where user_id = $1 and lease = $2", user, lease)
            }
        }
    }

    /// The export's last line, `{"kind":"end","events":N,"last_seq":S}` and a newline: `events`
    /// event lines came before it, the last of them with `seq` `lastSeq` (0 when none).
    static func endLine(events: Int64, lastSeq: Int64) -> [UInt8] {
        var writer = JSONWriter(capacity: 64)
        writer.beginObject()
        writer.string("kind", "end")
        writer.int("events", events)
        writer.int("last_seq", lastSeq)
        writer.endObject()
        return writer.bytes + [UInt8(ascii: "\n")]
    }

    /// Turns a page's `[{…},{…}]` into `{"kind":KIND,…}\n{"kind":KIND,…}\n` (the objects are
    /// at nesting depth 1; strings are skipped over, escapes included).
    static func lines(kind: String, fromArray array: [UInt8]) -> [UInt8] {
        let prefix = Array(#"{"kind":""#.utf8) + Array(kind.utf8) + Array(#"","#.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(array.count + 32 * 16)
        var depth = 0
        var inString = false
        var escaped = false
        for byte in array {
            if inString {
                out.append(byte)
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""):
                inString = true
                out.append(byte)
            case UInt8(ascii: "["), UInt8(ascii: "{"):
                depth += 1
                if depth == 2, byte == UInt8(ascii: "{") {
                    out.append(contentsOf: prefix)
                } else if depth > 1 {
                    out.append(byte)
                }
            case UInt8(ascii: "]"), UInt8(ascii: "}"):
                depth -= 1
                if depth >= 1 { out.append(byte) }
                if depth == 1, byte == UInt8(ascii: "}") { out.append(UInt8(ascii: "\n")) }
            case UInt8(ascii: ","):
                if depth > 1 { out.append(byte) }
            default:
                out.append(byte)
            }
        }
        return out
    }
}

extension APIError {
    /// `409`: the user's export lease is held by another export (`Accounts.ExportError.inProgress`).
    static let exportInProgress = APIError(
        status: 409, code: "export_in_progress",
        message: "An export of this account is already running; try again when it has finished.")
}
