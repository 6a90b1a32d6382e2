import CSystem
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
        /// The loop has ended: jobs go to `afterStop`, one at a time (a handler cancelled at
        /// shutdown still runs to its end; the database pool still closes in order).
        var stopped = false
    }

    private let queue = Mutex(Queue())
    /// Runs jobs once the loop has ended: serial, so what was confined to the loop stays
    /// confined (one job at a time), and counted as the loop's thread.
    private let afterStop = DispatchQueue(label: "trunk-sync.loop-after-stop")
    private static let afterStopKey = DispatchSpecificKey<Bool>()
    private let wake: @Sendable () -> Void
    /// The loop thread's identity, set once before any job is enqueued.
    private nonisolated(unsafe) var loopThread: pthread_t? = nil

    /// Other descriptors the loop watches for their owners (database connections), by
    /// descriptor; loop-confined.
    private nonisolated(unsafe) var sources: [Int32: (_ readable: Bool, _ writable: Bool) -> Void] = [:]
    /// The loop's epoll instance, set before any job runs.
    nonisolated(unsafe) var epoll: Int32 = -1
    /// The loop's table of streamed bodies, while the loop runs (`HTTPBodyFanOut`); read on
    /// the loop's thread only.
    nonisolated(unsafe) var streamTable: StreamTable? = nil

    /// The epoll token of a watched descriptor: above every connection's (its descriptor).
    static let sourceTokenBit: UInt64 = 1 << 40

    /// Most jobs run per loop iteration before the loop looks at its sockets again.
    static let jobsPerIteration = 512

    /// This loop's place among its server's loops (0 for the first).
    public let index: Int

    init(index: Int = 0, wake: @escaping @Sendable () -> Void) {
        self.index = index
        self.wake = wake
        afterStop.setSpecific(key: Self.afterStopKey, value: true)
    }

    /// Called on the loop's thread when it starts.
    func attachToCurrentThread() {
        loopThread = pthread_self()
        pthread_setspecific(Self.currentKey, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Called on the loop's thread when it ends (before `stop()`).
    func detachFromCurrentThread() {
        pthread_setspecific(Self.currentKey, nil)
    }

    /// The executor of the loop whose thread this is (nil on any other thread, and once that
    /// loop has ended): where a task that wants to stay on its loop — a database pool share
    /// of that loop, a fan-out's share of streams — finds it.
    public static var current: LoopExecutor? {
        guard let pointer = pthread_getspecific(currentKey) else { return nil }
        // Set only by the loop's own thread while the loop runs, which keeps it alive.
        return Unmanaged<LoopExecutor>.fromOpaque(pointer).takeUnretainedValue()
    }

    private static let currentKey: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    /// False once the loop has ended (its sockets are no longer watched).
    public var isRunning: Bool { !queue.withLock { $0.stopped } }

    /// True on the loop's thread.
    public var isOnLoopThread: Bool {
        if let loopThread, pthread_equal(loopThread, pthread_self()) != 0 { return true }
        return DispatchQueue.getSpecific(key: Self.afterStopKey) == true
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
        if !accepted { runAfterStop(job) }
        if mustWake { wake() }
    }

    /// The loop has ended (its epoll instance is closed): what is queued and whatever comes
    /// later runs on `afterStop`, in order.
    func stop() {
        let left = queue.withLock { queue -> [UnownedJob] in
            queue.stopped = true
            defer { queue.jobs = [] }
            return queue.jobs
        }
        epoll = -1
        for job in left { runAfterStop(job) }
    }

    private func runAfterStop(_ job: UnownedJob) {
        afterStop.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }

    /// Reports readiness of `fd` to `handler` on the loop's thread (level-triggered): readable
    /// or hung up always, writable while `writable`. Called again, it changes `writable`.
    /// On the loop's thread only.
    public func watch(_ fd: Int32, writable: Bool, handler: @escaping (_ readable: Bool, _ writable: Bool) -> Void) {
        precondition(isOnLoopThread, "watch(_:) off the loop's thread")
        let events = csystem_epollin() | csystem_epollrdhup() | (writable ? csystem_epollout() : 0)
        let token = UInt64(UInt32(bitPattern: fd)) | Self.sourceTokenBit
        if sources.updateValue(handler, forKey: fd) == nil {
            if csystem_epoll_add(epoll, fd, events, token) != 0 {
                sources[fd] = nil
                handler(true, false)  // the owner finds the descriptor unusable when it reads
            }
        } else {
            _ = csystem_epoll_modify(epoll, fd, events, token)
        }
    }

    /// Stops watching `fd` (before it is closed). On the loop's thread only.
    public func unwatch(_ fd: Int32) {
        precondition(isOnLoopThread, "unwatch(_:) off the loop's thread")
        guard sources.removeValue(forKey: fd) != nil else { return }
        _ = csystem_epoll_delete(epoll, fd)
    }

    /// Hands an epoll event for a watched descriptor to its owner.
    func dispatch(token: UInt64, flags: UInt32) {
        let fd = Int32(truncatingIfNeeded: token & 0xFFFF_FFFF)
        guard let handler = sources[fd] else { return }
        let readable = flags & (csystem_epollin() | csystem_epollrdhup() | csystem_epollhup() | csystem_epollerr()) != 0
        handler(readable, flags & csystem_epollout() != 0)
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
