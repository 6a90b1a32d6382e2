import CSystem
import Synchronization

/// When a loop gives the allocator's free memory back to the system: after a burst of work
/// (connections accepted, requests answered), once the loop has been quiet for a while.
///
/// A burst — ten thousand event streams opened within a second — has many handlers in
/// flight at once; their memory is freed when they answer, but between the connections and
/// streams that stay, so the allocator keeps those pages (a third of what 10,000 idle
/// streams cost in RSS, bench/README.md). What the burst left running a little longer (the
/// streams' producers, on a loaded machine) is freed after the first release, so a second
/// one follows after five times as long without work. Steady work reuses its free memory
/// and is never quiet long enough to trigger this; a release costs a few milliseconds.
/// Pure: the loop reports work and asks with its clock.
struct MemoryRelease {
    /// Work since the last release that makes one worth it.
    let burst: Int
    /// Nanoseconds without work before releasing.
    let quiet: UInt64

    private var work = 0
    private var lastWork: UInt64 = 0
    /// A release was made for the last burst; the follow-up is still due.
    private var followUpDue = false

    /// After `burst` connections or answers (default 1,000) and `quiet` nanoseconds without
    /// any (default 1 s).
    init(burst: Int = 1000, quiet: UInt64 = 1_000_000_000) {
        self.burst = burst
        self.quiet = quiet
    }

    /// A connection was accepted or a request answered.
    mutating func worked(now: UInt64) {
        work &+= 1
        lastWork = now
    }

    /// Whether to release now (then the count starts again).
    mutating func shouldRelease(now: UInt64) -> Bool {
        let quietFor = now &- lastWork
        if work >= burst, quietFor >= quiet {
            work = 0
            followUpDue = true
            return true
        }
        if followUpDue, quietFor >= quiet &* 5 {
            followUpDue = false
            return true
        }
        return false
    }

    /// When a loop of this process last released: the release covers every loop's memory,
    /// so loops quiet after the same burst release once.
    private static let lastRelease = Atomic<UInt64>(0)

    /// Releases free memory unless another loop did within `quiet` (it covered this one's).
    func release(now: UInt64) {
        let last = Self.lastRelease.load(ordering: .relaxed)
        guard last == 0 || now &- last >= quiet,
            Self.lastRelease.compareExchange(expected: last, desired: now, ordering: .relaxed).exchanged
        else { return }
        _ = csystem_release_free_memory()
    }
}
