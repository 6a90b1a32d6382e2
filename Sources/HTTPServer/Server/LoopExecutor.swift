import Foundation
import Synchronization

/// The event loop's thread as a `TaskExecutor`: request handlers run on the thread that read
/// the request, and so does whatever they resume after an `await`, so a request that waits
/// for the database costs no hop to Swift's cooperative pool and back.
///
/// Jobs enqueued from the loop's own thread (a handler's continuation resumed by the loop)
/// cost an array append; from any other thread, an append under a lock and, when the loop
/// may be asleep, one `eventfd` write. The loop runs the queue after each batch of I/O
/// events, a bounded number of jobs at a time, so handlers never starve the sockets.
///
/// Handlers on this executor must not block: the rule for every handler already (nothing
/// blocks Swift's cooperative pool), and here a blocking call stalls every connection of
/// the loop.
public final class LoopExecutor: TaskExecutor, @unchecked Sendable {
    private struct Queue {
        var jobs: [UnownedJob] = []
        /// The loop was told (or is awake and will look): no further wake-up is needed.
        var wakePending = false
        /// The loop has ended: jobs go to the global executor (a handler cancelled at
        /// shutdown still runs to its end).
        var stopped = false
    }

    private let queue = Mutex(Queue())
    private let wake: @Sendable () -> Void
    /// The loop thread's identity, set once before any job is enqueued.
    private nonisolated(unsafe) var loopThread: pthread_t? = nil

    /// Most jobs run per loop iteration before the loop looks at its sockets again.
    static let jobsPerIteration = 512

    init(wake: @escaping @Sendable () -> Void) {
        self.wake = wake
    }

    /// Called on the loop's thread when it starts.
    func attachToCurrentThread() {
        loopThread = pthread_self()
    }

    /// True on the loop's thread.
    public var isOnLoopThread: Bool {
        guard let loopThread else { return false }
        return pthread_equal(loopThread, pthread_self()) != 0
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let onLoop = isOnLoopThread
        let (accepted, mustWake) = queue.withLock { queue -> (Bool, Bool) in
            guard !queue.stopped else { return (false, false) }
            queue.jobs.append(job)
            guard !onLoop, !queue.wakePending else { return (true, false) }
            queue.wakePending = true
            return (true, true)
        }
        if !accepted { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
        if mustWake { wake() }
    }

    /// The loop has ended: what is queued and whatever comes later runs on the global
    /// executor.
    func stop() {
        let left = queue.withLock { queue -> [UnownedJob] in
            queue.stopped = true
            defer { queue.jobs = [] }
            return queue.jobs
        }
        for job in left { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
    }

    /// Runs queued jobs on the loop's thread, at most `jobsPerIteration`; true when more
    /// are left (the loop then polls without sleeping).
    func runQueuedJobs() -> Bool {
        var ran = 0
        while ran < Self.jobsPerIteration {
            let taken = queue.withLock { queue -> [UnownedJob] in
                queue.wakePending = false
                let taken = queue.jobs
                queue.jobs.removeAll(keepingCapacity: true)
                return taken
            }
            if taken.isEmpty { return false }
            for job in taken { job.runSynchronously(on: asUnownedTaskExecutor()) }
            ran += taken.count
        }
        return queue.withLock { !$0.jobs.isEmpty }
    }
}
