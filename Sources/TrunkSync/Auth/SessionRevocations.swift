import Foundation
import Logging
import Postgres
import Synchronization

/// The sessions that were revoked while access tokens issued for them may still be valid,
/// in memory on every instance: the authentication stage refuses their tokens on every
/// route (`isRevoked`).
///
/// Why a set kept current by notifications, and not a check in each request's own
/// statement: the most frequent request is an empty pull, one pipelined round trip of a
/// prepared select. Folding a session look-up into it would cost PostgreSQL an index probe
/// on `sessions` for every request of every route — the hot path pays for something that
/// almost never happens — and routes without a statement of their own (or a long-poll
/// asleep on its ticket) would still need a check of their own. Revocations are rare (a
/// sign-out, a deleted user, a stolen refresh token), so telling every instance is cheap:
/// a trigger on `sessions` (migration 0004) writes `session_revocations` and sends
/// `NOTIFY trunk_sync_revocations` in the revoking transaction, whoever revokes (this
/// server, another instance, `trunk-sync users delete`, SQL). Each instance's listener
/// receives it within milliseconds of the commit; the instance that revoked records it
/// before it answers. The check costs a load of an atomic counter and, when anything is
/// revoked, one lock and one hash look-up.
///
/// Bounded: an entry is kept until the longest-lived access token issued for the session
/// before its revocation has expired (`sessions.access_expires_at`, plus the verifier's
/// clock leeway and a minute for instances' clocks), then dropped; after that the token
/// itself is refused. So the set holds the sessions revoked within one token lifetime.
///
/// Notifications sent while the listener is disconnected are lost: on every (re)connect
/// the set is reloaded from `session_revocations` (retrying until it succeeds), and
/// `/readyz` answers `503` until the first load. Between a lost connection and the reload
/// (the listener retries within 5 s) a revocation made elsewhere may not be known here.
public final class SessionRevocations: Sendable {
    /// The notification channel (payload `<session> <user> <expiry>`).
    public static let channel = "trunk_sync_revocations"
    /// Seconds an entry outlives its tokens' expiry: the verifier's leeway, and a minute for
    /// the clocks of the instance that signed and the one that verifies.
    static let margin = TokenIssuer.leeway + 60

    private struct State {
        /// Session → Unix second after which it need not be remembered.
        var entries: [UUID: Int64] = [:]
        var nextPrune: Int64 = 0
        var loaded = false
    }

    private let database: Database?
    private let logger: Logger
    private let state = Mutex(State())
    /// `entries.count`, read without the lock: nothing revoked, nothing to look up.
    private let entryCount = Atomic<Int>(0)
    /// Told the user of each revocation learnt of (wakes the user's long-polls).
    private let onRevoked = Mutex<(@Sendable (UUID) -> Void)?>(nil)
    private let following = BackgroundTask()
    private let reloading = BackgroundTask()

    /// Revocations read from `database` (nil: only what is recorded here; for tests of parts).
    init(database: Database?, logger: Logger) {
        self.database = database
        self.logger = logger
    }

    /// Whether the session was revoked (while its tokens may still be valid).
    public func isRevoked(_ session: UUID) -> Bool {
        guard entryCount.load(ordering: .acquiring) > 0 else { return false }
        return state.withLock { $0.entries[session] != nil }
    }

    /// Sessions in the set now.
    public var count: Int { entryCount.load(ordering: .relaxed) }

    /// Whether the set was loaded from the database at least once.
    public var isLoaded: Bool { state.withLock { $0.loaded } }

    /// Records revoked sessions with the expiry (Unix seconds) of their last access token,
    /// and tells `onRevoked` their users.
    func record(_ revoked: [(session: UUID, user: UUID, tokensExpireAt: Int64)], now: Int64 = AuthService.now()) {
        guard !revoked.isEmpty else { return }
        update(now: now) { entries in
            for entry in revoked {
                entries[entry.session] = max(entries[entry.session] ?? .min, entry.tokensExpireAt + Self.margin)
            }
        }
        if let wake = onRevoked.withLock({ $0 }) { revoked.forEach { wake($0.user) } }
    }

    private func update(now: Int64, loaded: Bool = false, _ change: (inout [UUID: Int64]) -> Void) {
        state.withLock { state in
            change(&state.entries)
            if loaded { state.loaded = true }
            if now >= state.nextPrune {
                state.entries = state.entries.filter { $0.value >= now }
                state.nextPrune = now + 60
            }
            entryCount.store(state.entries.count, ordering: .releasing)
        }
    }

    /// Reads every revocation whose tokens may still be valid and adds them to the set
    /// (added, not replaced: what notifications brought meanwhile stays), and tells
    /// `onRevoked` the users of the sessions it did not know: after a listener outage, their
    /// long-polls end now rather than when their wait runs out (the reconnect's wake-up of
    /// everyone came before this load).
    public func load() async throws {
        guard let database else { return }
        let margin = Self.margin
        let rows = try await database.read(as: .server) { tx in
            try await tx.query(
                """
                select session_id, user_id, floor(extract(epoch from expires_at))::int8 from session_revocations
                where expires_at > now() - make_interval(secs => $1)
                """, Int64(margin)
            ).map {
                (
                    try $0.decode(UUID.self, column: 0), try $0.decode(UUID.self, column: 1),
                    try $0.decode(Int64.self, column: 2)
                )
            }
        }
        var learnt = Set<UUID>()
        update(now: AuthService.now(), loaded: true) { entries in
            for (session, user, expiry) in rows {
                if entries[session] == nil { learnt.insert(user) }
                entries[session] = max(entries[session] ?? .min, expiry + margin)
            }
        }
        if let wake = onRevoked.withLock({ $0 }) { learnt.forEach { wake($0) } }
    }

    /// Follows the listener's `events`: records each revocation notified and wakes its
    /// user's long-polls through `wake`; reloads from the database on every (re)connect.
    func follow(_ events: AsyncStream<PostgresListenerEvent>, wake: @escaping @Sendable (UUID) -> Void) {
        onRevoked.withLock { $0 = wake }
        following.replace(
            with: Task.detached { [self] in
                for await event in events {
                    switch event {
                    case .notification(let notification):
                        guard notification.channel == Self.channel, let revoked = Self.parse(notification.payload)
                        else {
                            continue
                        }
                        record([revoked])
                    case .listening:
                        reloading.replace(with: Task { [self] in await reloadUntilLoaded() })
                    }
                }
            })
    }

    /// `<session> <user> <expiry>`, as the trigger sends it.
    static func parse(_ payload: String) -> (session: UUID, user: UUID, tokensExpireAt: Int64)? {
        let parts = payload.split(separator: " ")
        guard parts.count == 3, let session = UUIDText.parse(String(parts[0])),
            let user = UUIDText.parse(String(parts[1])),
            let expiry = Int64(parts[2])
        else { return nil }
        return (session, user, expiry)
    }

    private func reloadUntilLoaded() async {
        var delay = Duration.milliseconds(100)
        while !Task.isCancelled {
            do {
                try await load()
                return
            } catch {
                if Task.isCancelled { return }
                logger.warning(
                    "cannot load revoked sessions; retrying", metadata: ["error": "\(Migrator.explain(error))"])
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
    }

    /// Stops following and reloading.
    func stop() async {
        await following.stop()
        await reloading.stop()
    }
}
