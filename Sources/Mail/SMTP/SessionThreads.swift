import CSystem
import Foundation

/// The threads `SMTPMailer` runs its blocking sessions on, so no SMTP call ever holds a
/// thread of Swift's cooperative pool. At most `maximumThreads` run at once, started on
/// demand and kept; at most `queueLimit` jobs wait for a free thread, and `submit`
/// refuses more at once.
final class SessionThreads: @unchecked Sendable {
    typealias Job = @Sendable () -> Void

    private let condition = NSCondition()
    private let name: String
    private let maximumThreads: Int
    private let queueLimit: Int
    // Guarded by `condition`.
    private var jobs: [Job] = []
    private var nextJob = 0
    private var threads = 0
    /// Threads running a job (the others are idle or about to take one).
    private var busyThreads = 0
    private var stopped = false

    init(name: String, maximumThreads: Int, queueLimit: Int) {
        self.name = name
        self.maximumThreads = max(1, maximumThreads)
        self.queueLimit = max(0, queueLimit)
    }

    /// Queues `job`; false (and `job` never runs) when `queueLimit` jobs already wait for a thread.
    func submit(_ job: @escaping Job) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        let waiting = jobs.count - nextJob
        // Every thread that may exist takes one job; `queueLimit` more may wait.
        guard !stopped, waiting + busyThreads < maximumThreads + queueLimit else { return false }
        jobs.append(job)
        let freeThreads = threads - busyThreads
        if waiting + 1 > freeThreads && threads < maximumThreads {
            threads += 1
            // Joinable and registered: the process joins it before exiting.
            let context = Unmanaged.passRetained(self).toOpaque()
            let entry: @convention(c) (UnsafeMutableRawPointer?) -> Void = { context in
                guard let context else { return }
                Unmanaged<SessionThreads>.fromOpaque(context).takeRetainedValue().run()
            }
            let started = csystem_thread_start("\(name)-\(threads)", 1 << 20, entry, context)
            if started != 0 {
                Unmanaged<SessionThreads>.fromOpaque(context).release()
                threads -= 1
                if threads == 0 {  // nobody would ever run it
                    jobs.removeLast()
                    return false
                }
            }
        }
        condition.signal()
        return true
    }

    /// Lets the threads end once the queue is empty.
    func stop() {
        condition.lock()
        stopped = true
        condition.broadcast()
        condition.unlock()
    }

    private func run() {
        while let job = take() {
            job()
            condition.lock()
            busyThreads -= 1
            condition.unlock()
        }
    }

    private func take() -> Job? {
        condition.lock()
        defer { condition.unlock() }
        while nextJob == jobs.count {
            if stopped {
                threads -= 1
                return nil
            }
            condition.wait()
        }
        let job = jobs[nextJob]
        nextJob += 1
        busyThreads += 1
        if nextJob == jobs.count {
            jobs.removeAll(keepingCapacity: true)
            nextJob = 0
        } else if nextJob >= 64 && nextJob * 2 >= jobs.count {
            jobs.removeFirst(nextJob)
            nextJob = 0
        }
        return job
    }
}
