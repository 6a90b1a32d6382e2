import Foundation
import Logging
import Synchronization

/// Sends sign-in codes off the request path.
///
/// `/otp` must answer the same way in the same time whether or not the address has an
/// account, and a mail is only sent for one that does (or will). Sending it while the
/// request waits would make a known address's answer as slow as the mail server, and a
/// failure would show. So the request only hands the code over (`submit`: a lock and an
/// append, no I/O) and answers; a fixed number of sender tasks deliver from a bounded
/// buffer.
///
/// When the buffer is full the mail is dropped — the request still answers the same, since
/// anything else would tell a known address from an unknown one. A drop is counted
/// (`trunk_sync_mail_dropped_total`) and logged (at most one line per `dropLogInterval`).
/// A failed delivery is counted (`trunk_sync_mail_failures_total`) and logged. Neither is
/// ever shown to the client, and in neither case is the code withdrawn: the address asks
/// again after the resend interval like any other (withdrawing it would let the next
/// `/otp` answer differently for an address that has an account). Log lines name the
/// address only by `addressTag`, never in clear, and never carry the code.
public final class SignInMailQueue: Sendable {
    /// One mail to send.
    struct Job: Sendable {
        /// What the code is for.
        enum Purpose: Sendable { case signIn, reauthentication }
        var purpose: Purpose = .signIn
        var code: String
        var email: String
        var expiresInMinutes: Int
        /// A keyed hash of the address, for log lines.
        var addressTag: String
        /// The request that asked for it, so the sender's log lines carry its id.
        var requestID: String?
    }

    private struct State {
        /// Jobs waiting, from `head` on (a ring would save the occasional compaction; the
        /// buffer is small).
        var buffer: [Job] = []
        var head = 0
        /// Senders waiting for a job.
        var idle: [CheckedContinuation<Job?, Never>] = []
        var closed = false
        var droppedSinceLog = 0
        var lastDropLog: UInt64 = 0

        var count: Int { buffer.count - head }

        mutating func popFirst() -> Job? {
            guard head < buffer.count else { return nil }
            let job = buffer[head]
            head += 1
            if head == buffer.count {
                buffer.removeAll(keepingCapacity: true)
                head = 0
            } else if head >= 64, head * 2 >= buffer.count {
                buffer.removeFirst(head)
                head = 0
            }
            return job
        }
    }

    /// Seconds between two log lines about dropped mails (a flood must not flood the log).
    static let dropLogInterval: UInt64 = 10

    private let sender: any SignInCodeSender
    private let capacity: Int
    private let logger: Logger
    private let metrics: Metrics
    private let state = Mutex(State())
    private let workers = Mutex<[Task<Void, Never>]>([])

    /// Starts `senders` sender tasks over a buffer of at most `capacity` mails.
    init(sender: any SignInCodeSender, senders: Int, capacity: Int, logger: Logger, metrics: Metrics) {
        self.sender = sender
        self.capacity = max(1, capacity)
        self.logger = logger
        self.metrics = metrics
        let tasks = (0..<max(1, senders)).map { _ in Task { [self] in await run() } }
        workers.withLock { $0 = tasks }
    }

    /// Mails waiting for a sender.
    var waiting: Int { state.withLock { $0.count } }

    /// Hands `job` to a sender, or drops it when the buffer is full (or the queue closed).
    /// Never waits.
    func submit(_ job: Job) {
        enum Decision { case handed(CheckedContinuation<Job?, Never>), queued, dropped(log: Int?) }
        let decision: Decision = state.withLock { state in
            if !state.closed {
                if let sender = state.idle.popLast() { return .handed(sender) }
                if state.count < capacity {
                    state.buffer.append(job)
                    return .queued
                }
            }
            state.droppedSinceLog += 1
            let now = monotonicNanoseconds() / 1_000_000_000
            guard state.lastDropLog == 0 || now >= state.lastDropLog + Self.dropLogInterval else {
                return .dropped(log: nil)
            }
            state.lastDropLog = max(now, 1)
            defer { state.droppedSinceLog = 0 }
            return .dropped(log: state.droppedSinceLog)
        }
        switch decision {
        case .handed(let sender): sender.resume(returning: job)
        case .queued: break
        case .dropped(let count):
            metrics.mailDropped.increment()
            if let count {
                logger.warning(
                    "sign-in mail dropped: the mail queue is full",
                    metadata: ["dropped": "\(count)", "address": "\(job.addressTag)"])
            }
        }
    }

    /// The next job, waiting for one; nil once the queue is closed and empty.
    private func next() async -> Job? {
        await withCheckedContinuation { (continuation: CheckedContinuation<Job?, Never>) in
            enum Decision { case job(Job), finished, wait }
            let decision: Decision = state.withLock { state in
                if let job = state.popFirst() { return .job(job) }
                if state.closed { return .finished }
                state.idle.append(continuation)
                return .wait
            }
            switch decision {
            case .job(let job): continuation.resume(returning: job)
            case .finished: continuation.resume(returning: nil)
            case .wait: break
            }
        }
    }

    private func run() async {
        while let job = await next() {
            await deliver(job)
        }
    }

    private func deliver(_ job: Job) async {
        await RequestContext.$requestID.withValue(job.requestID) {
            do {
                switch job.purpose {
                case .signIn:
                    try await sender.sendSignInCode(job.code, to: job.email, expiresInMinutes: job.expiresInMinutes)
                case .reauthentication:
                    try await sender.sendReauthenticationCode(
                        job.code, to: job.email, expiresInMinutes: job.expiresInMinutes)
                }
                metrics.signInCodesSent.increment()
            } catch {
                metrics.mailFailures.increment()
                // MailError's description never holds an address; other errors might (a
                // server's reply quoted by another sender), and a reply may quote the message
                // (a content filter's refusal), code and all: take both out.
                let reason = "\(error)".replacingOccurrences(
                    of: job.email, with: "<recipient>", options: .caseInsensitive
                ).replacingOccurrences(of: job.code, with: "<code>")
                logger.error("sign-in mail failed", metadata: ["error": "\(reason)", "address": "\(job.addressTag)"])
            }
        }
    }

    /// Stops taking mails, lets the senders finish what is queued for at most `timeout`,
    /// then cancels them; mails still queued then are dropped (counted).
    func close(within timeout: Duration) async {
        let idle = state.withLock { state -> [CheckedContinuation<Job?, Never>] in
            state.closed = true
            defer { state.idle.removeAll() }
            return state.idle
        }
        idle.forEach { $0.resume(returning: nil) }
        let tasks = workers.withLock { $0 }
        // Whichever comes first: every sender done, or the timeout. Neither waiter is a child
        // of this call, so a sender stuck in a mail server's slow answer cannot hold it up.
        let outcome = OneShot()
        let finished = await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            outcome.set(continuation)
            let sleeper = Task {
                try? await Task.sleep(for: timeout)
                outcome.resume(false)
            }
            Task {
                for task in tasks { await task.value }
                outcome.resume(true)
                sleeper.cancel()
            }
        }
        // The mailer's threads end once what they run is done (the process joins them).
        defer { sender.close() }
        guard !finished else { return }
        tasks.forEach { $0.cancel() }
        let left = state.withLock { state -> Int in
            defer {
                state.buffer.removeAll()
                state.head = 0
            }
            return state.count
        }
        if left > 0 {
            metrics.mailDropped.increment(by: left)
            logger.warning("sign-in mails dropped at shutdown", metadata: ["dropped": "\(left)"])
        }
    }
}

/// A continuation resumed by whichever caller comes first.
private final class OneShot: Sendable {
    private let continuation = Mutex<CheckedContinuation<Bool, Never>?>(nil)

    func set(_ new: CheckedContinuation<Bool, Never>) { continuation.withLock { $0 = new } }

    func resume(_ value: Bool) { continuation.withLock { $0.take() }?.resume(returning: value) }
}
