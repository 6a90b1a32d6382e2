import CSystem
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A pthread mutex with condition variables, for the module's own threads (never awaited
/// from the cooperative pool while held for long).
final class ConditionLock: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let conditions: [UnsafeMutablePointer<pthread_cond_t>]

    init(conditions count: Int) {
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        conditions = (0..<count).map { _ in
            let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
            var attributes = pthread_condattr_t()
            pthread_condattr_init(&attributes)
            #if canImport(Glibc)
                pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
            #endif
            pthread_cond_init(condition, &attributes)
            pthread_condattr_destroy(&attributes)
            return condition
        }
    }

    deinit {
        for condition in conditions {
            pthread_cond_destroy(condition)
            condition.deallocate()
        }
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    /// Waits on condition `index`; the lock must be held.
    func wait(_ index: Int) {
        pthread_cond_wait(conditions[index], mutex)
    }

    /// Waits on condition `index` until `deadline` (monotonic nanoseconds); the lock must be held.
    func wait(_ index: Int, untilUptimeNanoseconds deadline: UInt64) {
        var time = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        pthread_cond_timedwait(conditions[index], mutex, &time)
    }

    func signal(_ index: Int) { pthread_cond_signal(conditions[index]) }
    func broadcast(_ index: Int) { pthread_cond_broadcast(conditions[index]) }
}
