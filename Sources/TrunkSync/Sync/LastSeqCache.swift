import Foundation
import Synchronization

/// What this instance knows, without asking PostgreSQL, about the newest event of users who
/// pulled recently: "user U's newest `seq` is at most B". A pull after B or later is then
/// known to be empty and is answered from memory: the empty pull is what every app sends
/// on launch, on foreground and at the start of every long-poll.
///
/// **Why an answer from here is never staler than a notification's delay.** Every commit of
/// events sends `NOTIFY trunk_sync_events, '<user>'` (on any instance); this instance's
/// listener hands it to `invalidate`, which forgets what was known about that user. An entry
/// is written only by `record`, after a pull that read the user's newest event from the
/// database, and only if nothing was invalidated for that user (nor everything cleared)
/// since the pull's `ticket` was taken, before its query was sent. So a commit either is in
/// the query's snapshot, or its notification comes after the ticket and removes the entry
/// — if it came before the `record`, the record is refused. Entries are used and written
/// only while the listener is connected on the same session as when they were written
/// (`session`): notifications sent while it was away are lost, so a reconnect (or a
/// subscriber falling behind its buffer, which the listener reports the same way) clears
/// everything, and until then nothing is answered from here.
///
/// A notification can still be lost — the pushing connection cut between its commit and the
/// `NOTIFY` that follows it — so an entry is trusted for `maxAge` (60 s, the longest a
/// long-poll waits) at most, then the database is asked again.
///
/// Bounded: at most `capacity` users (entries and the markers of recent invalidations);
/// when full, everything is cleared (and pulls in flight may not record), never evicted one
/// by one, which could forget a marker a pull in flight still needs.
final class LastSeqCache: Sendable {
    /// Most users remembered: about 5 MiB at most.
    static let defaultCapacity = 65_536
    /// How long an entry is trusted without a fresh look at the database.
    static let defaultMaxAge: Duration = .seconds(60)

    /// Taken before a pull's query; `record` accepts the pull's result only if nothing the
    /// query might have missed happened since.
    struct Ticket: Sendable {
        fileprivate let epoch: UInt64
    }

    private struct Entry {
        /// The user's newest `seq` is at most this; nil: invalidated, nothing known.
        var bound: Int64?
        /// The epoch of the user's last invalidation (0: none while remembered).
        var invalidated: UInt64
        /// When `bound` was learnt (the oldest of the records it combines).
        var learnt: ContinuousClock.Instant
    }

    private struct State {
        var entries: [UUID: Entry] = [:]
        /// Counts invalidations and clears.
        var epoch: UInt64 = 0
        /// Tickets older than this are refused (the entries were cleared since).
        var clearedAt: UInt64 = 0
        /// The listener session the entries are valid for; nil: none yet.
        var session: UInt64? = nil
    }

    private let state = Mutex(State())
    private let capacity: Int
    private let maxAge: Duration
    /// The listener's current session (nil while it is not listening).
    private let currentSession: @Sendable () -> UInt64?

    /// A cache trusted while `session()` equals the session passed to `listening(session:)`.
    init(
        capacity: Int = LastSeqCache.defaultCapacity, maxAge: Duration = LastSeqCache.defaultMaxAge,
        session: @escaping @Sendable () -> UInt64?
    ) {
        self.capacity = max(1, capacity)
        self.maxAge = maxAge
        self.currentSession = session
    }

    /// Whether `user` has no event after `after` (as of the newest notification received).
    func isKnownEmpty(_ user: UUID, after: Int64) -> Bool {
        guard let session = currentSession() else { return false }
        let now = ContinuousClock.now
        return state.withLock { state in
            guard state.session == session, let entry = state.entries[user], let bound = entry.bound else {
                return false
            }
            return after >= bound && entry.learnt.duration(to: now) < maxAge
        }
    }

    /// A ticket for a pull about to query the database; nil while the listener is not
    /// listening (the result is then not recorded).
    func ticket() -> Ticket? {
        guard let session = currentSession() else { return nil }
        return state.withLock { state in
            state.session == session ? Ticket(epoch: state.epoch) : nil
        }
    }

    /// After a pull that read `user`'s newest event: that event's `seq`, or the pull's
    /// `after` when it found nothing.
    func record(_ user: UUID, newest bound: Int64, since ticket: Ticket) {
        let now = ContinuousClock.now
        state.withLock { state in
            guard ticket.epoch >= state.clearedAt else { return }
            if var entry = state.entries[user] {
                guard entry.invalidated <= ticket.epoch else { return }
                // Two records without an invalidation between them: the smaller bound is the
                // safe one (an `after` beyond the newest event records more than it knows).
                if let known = entry.bound, entry.learnt.duration(to: now) < maxAge {
                    entry.bound = min(known, bound)
                } else {
                    entry.bound = bound
                    entry.learnt = now
                }
                state.entries[user] = entry
            } else if state.entries.count < capacity {
                state.entries[user] = Entry(bound: bound, invalidated: 0, learnt: now)
            } else {
                Self.clear(&state)
            }
        }
    }

    /// A commit of `user`'s events was announced: forget what was known, and refuse records
    /// of pulls that started before now.
    func invalidate(_ user: UUID) {
        state.withLock { state in
            state.epoch += 1
            if state.entries[user] == nil, state.entries.count >= capacity {
                Self.clear(&state)
            } else {
                state.entries[user] = Entry(bound: nil, invalidated: state.epoch, learnt: .now)
            }
        }
    }

    /// The listener is listening on `session` (nil: not listening) after a (re)connect, or
    /// some notifications were lost: forget everything.
    func listening(session: UInt64?) {
        state.withLock { state in
            Self.clear(&state)
            state.session = session
        }
    }

    /// Users remembered (entries and invalidation markers).
    var count: Int { state.withLock { $0.entries.count } }

    private static func clear(_ state: inout State) {
        state.entries.removeAll(keepingCapacity: true)
        state.epoch += 1
        state.clearedAt = state.epoch
    }
}
