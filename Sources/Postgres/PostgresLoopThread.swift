import CSystem
import Foundation
import Synchronization

/// A small event loop of the module's own: one thread waiting in `epoll_wait` on the sockets
/// of the connections it drives, and running the tasks that prefer it as their executor. For
/// work that has no HTTP loop to run on: the command line, migrations, tests, the `LISTEN`
/// connection and the server's background jobs (key refresh, revocation loads).
///
/// The only thread `Sources/Postgres` starts: started by `init` through `csystem_thread_start`
/// (joinable, registered, so the process joins it before exiting) and ended by `close()`,
/// which returns once the thread has left its loop. Jobs given to it after that run one at a
/// time off the loop (a continuation resumed late still finishes), but no socket is watched.
public final class PostgresLoopThread: PostgresEventLoop, @unchecked Sendable {
    private struct Queue {
        var jobs: [UnownedJob] = []
        /// The loop was woken (or is awake and will look): no further wake-up is needed.
        var wakePending = false
        /// `close()` was called: the loop ends at its next turn.
        var stopRequested = false
        /// The loop has ended: jobs go to `afterStop`.
        var stopped = false
        /// Resumed when the loop has ended.
        var closeWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let queue = Mutex(Queue())
    private let epoll: Int32
    private let eventFD: Int32
    /// Runs jobs once the loop has ended: serial, so loop confinement holds.
    private let afterStop: DispatchQueue
    private let afterStopKey = DispatchSpecificKey<Bool>()
    /// The loop thread's identity, set before it runs any job.
    private let loopThread = Mutex<pthread_t?>(nil)
    /// Watched descriptors and their owners; loop-confined.
    private var sources: [Int32: (PostgresIOReadiness) -> Void] = [:]

    private static let wakeToken = UInt64.max

    /// Starts the loop's thread, named `name` (at most 15 characters are shown by the system).
    /// - Throws: `PostgresError` when epoll, the wake-up descriptor or the thread cannot be had.
    public init(name: String = "pg-loop") throws {
        epoll = csystem_epoll_create()
        eventFD = csystem_eventfd()
        afterStop = DispatchQueue(label: "trunk-sync.\(name)-after-stop")
        afterStop.setSpecific(key: afterStopKey, value: true)
        guard epoll >= 0, eventFD >= 0, csystem_epoll_add(epoll, eventFD, csystem_epollin(), Self.wakeToken) == 0 else {
            let error = errno
            if epoll >= 0 { Foundation.close(epoll) }
            if eventFD >= 0 { Foundation.close(eventFD) }
            throw PostgresError(
                kind: .connectionFailed, message: "cannot set up the database event loop: errno \(error)")
        }
        let started = DispatchSemaphore(value: 0)
        let body: @Sendable () -> Void = { [self] in
            loopThread.withLock { $0 = pthread_self() }
            started.signal()
            run()
        }
        guard startThreadIfPossible(name: name, body) else {
            Foundation.close(epoll)
            Foundation.close(eventFD)
            throw PostgresError(kind: .connectionFailed, message: "cannot start the database event loop's thread")
        }
        started.wait()
    }

    deinit { Foundation.close(eventFD) }

    public var isOnLoopThread: Bool {
        if let thread = loopThread.withLock({ $0 }), pthread_equal(thread, pthread_self()) != 0 { return true }
        return DispatchQueue.getSpecific(key: afterStopKey) == true
    }

    public var isRunning: Bool { !queue.withLock { $0.stopped } }

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
        if !accepted { afterStop.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) } }
        if mustWake { wake() }
    }

    public func watch(_ fd: Int32, writable: Bool, handler: @escaping (PostgresIOReadiness) -> Void) {
        precondition(isOnLoopThread, "watch(_:) off the loop's thread")
        guard isRunning else {
            handler(PostgresIOReadiness(readable: true, writable: false))  // the owner finds it unusable
            return
        }
        let events = csystem_epollin() | csystem_epollrdhup() | (writable ? csystem_epollout() : 0)
        let token = UInt64(UInt32(bitPattern: fd))
        if sources.updateValue(handler, forKey: fd) == nil {
            if csystem_epoll_add(epoll, fd, events, token) != 0 {
                sources[fd] = nil
                handler(PostgresIOReadiness(readable: true, writable: false))
            }
        } else {
            _ = csystem_epoll_modify(epoll, fd, events, token)
        }
    }

    public func unwatch(_ fd: Int32) {
        precondition(isOnLoopThread, "unwatch(_:) off the loop's thread")
        guard sources.removeValue(forKey: fd) != nil, isRunning else { return }
        _ = csystem_epoll_delete(epoll, fd)
    }

    /// Ends the loop and waits until its thread has left it. Close what runs on the loop (its
    /// pools, its listener) first: a socket still watched is no longer reported. Not on the
    /// loop's own thread.
    public func close() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let alreadyStopped = queue.withLock { queue -> Bool in
                if queue.stopped { return true }
                queue.stopRequested = true
                queue.closeWaiters.append(continuation)
                return false
            }
            if alreadyStopped { continuation.resume() } else { wake() }
        }
    }

    // MARK: - On the loop's thread

    private func run() {
        var events = [csystem_event](repeating: csystem_event(), count: 64)
        var jobsLeft = false
        while true {
            let count = csystem_epoll_wait(epoll, &events, Int32(events.count), jobsLeft ? 0 : -1)
            if count < 0 {
                if errno == EINTR { continue }
                preconditionFailure("epoll_wait failed with errno \(errno)")  // EBADF/EFAULT/EINVAL: a bug
            }
            for index in 0..<Int(count) {
                let event = events[index]
                if event.data == Self.wakeToken {
                    var counter: UInt64 = 0
                    _ = read(eventFD, &counter, 8)
                    continue
                }
                let fd = Int32(truncatingIfNeeded: event.data & 0xFFFF_FFFF)
                guard let handler = sources[fd] else { continue }
                let flags = event.events
                let readable =
                    flags & (csystem_epollin() | csystem_epollrdhup() | csystem_epollhup() | csystem_epollerr()) != 0
                handler(PostgresIOReadiness(readable: readable, writable: flags & csystem_epollout() != 0))
            }
            jobsLeft = runQueuedJobs()
            if !jobsLeft, queue.withLock({ $0.stopRequested }) { break }
        }
        let (left, waiters) = queue.withLock { queue -> ([UnownedJob], [CheckedContinuation<Void, Never>]) in
            queue.stopped = true
            defer { (queue.jobs, queue.closeWaiters) = ([], []) }
            return (queue.jobs, queue.closeWaiters)
        }
        sources = [:]
        Foundation.close(epoll)  // the wake-up descriptor stays open until deinit: `enqueue` may still write to it
        for job in left { afterStop.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) } }
        for waiter in waiters { waiter.resume() }
    }

    /// Runs queued jobs, at most 512 before looking at the sockets again; true when more
    /// are left.
    private func runQueuedJobs() -> Bool {
        var ran = 0
        while ran < 512 {
            let taken = queue.withLock { queue -> [UnownedJob] in
                queue.wakePending = false
                defer { queue.jobs.removeAll(keepingCapacity: true) }
                return queue.jobs
            }
            if taken.isEmpty { return false }
            for job in taken { job.runSynchronously(on: asUnownedTaskExecutor()) }
            ran += taken.count
        }
        return queue.withLock { !$0.jobs.isEmpty }
    }

    private func wake() {
        var one: UInt64 = 1
        while write(eventFD, &one, 8) < 0, errno == EINTR {}
    }
}
