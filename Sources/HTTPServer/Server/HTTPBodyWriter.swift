import Synchronization

/// A response body produced over time (an export, a stream of events): the server sends the
/// head at once, then each piece the producer writes as it comes, chunked (close-delimited
/// to an HTTP/1.0 client), and ends the body when the producer calls `finish()`.
///
/// The producer runs as a task of its own, exactly once, with the `HTTPBodyWriter` of its
/// connection. When there is nobody to send to (the client went away before the head was
/// sent, a `HEAD` request, a status without a body), its writer is already closed and its
/// task cancelled, so it learns that at its first write and returns; whatever it holds is
/// released then.
///
/// A body that lives long and writes rarely (a stream of events) need not keep its task:
/// the producer calls `HTTPBodyWriter.detach(onClose:)` and may then return with the body
/// still open; whoever holds the writer writes to it and calls `finish()`, and is told
/// through `onClose` when the connection goes away or graceful shutdown begins.
public struct HTTPBodyStream: Sendable {
    /// What a producer does when graceful shutdown begins.
    public enum Shutdown: Sendable {
        /// Keep producing: the body is part of a request in flight and gets the shutdown
        /// drain (`HTTPServerConfiguration.shutdownTimeout`) to finish (an export).
        case finish
        /// The producer's task is cancelled at once (and a detached body's `onClose` is
        /// called with `.shutdown`): it writes nothing more and calls `finish()`, so its
        /// client reads a complete body and may come back to another instance (an endless
        /// stream of events).
        case cancel
    }

    /// Bytes written but not yet sent to the socket that `write` never goes past (it waits
    /// until the write fits, the write counted; one larger than this waits for an empty
    /// buffer), and past which `writeIfRoom` refuses (it may pass it by one write).
    public var bufferLimit: Int
    /// What graceful shutdown does to the producer.
    public var shutdown: Shutdown
    /// Writes the body; called once, as a task, when the response head is queued.
    public var produce: @Sendable (HTTPBodyWriter) async -> Void

    /// A body of `produce`'s writes, buffering at most `bufferLimit` bytes (default 64 KiB)
    /// beyond what the socket has taken.
    public init(
        bufferLimit: Int = 64 * 1024, shutdown: Shutdown = .finish,
        produce: @escaping @Sendable (HTTPBodyWriter) async -> Void
    ) {
        self.bufferLimit = max(1, bufferLimit)
        self.shutdown = shutdown
        self.produce = produce
    }
}

/// Where a streamed response's producer writes its body. Safe from any task; the event loop
/// takes what was written whenever the socket has sent what it took before, so at most
/// `bufferLimit` bytes wait in memory however slowly the client reads (with `writeIfRoom`,
/// plus one write).
///
/// Backpressure, two ways:
/// - `write(_:)` suspends until the buffer has room for the whole write (or is empty, for a
///   write larger than the limit) and resumes when the client has read enough: the body's
///   pace is the client's (an export of any size in flat memory). Producers write pieces of
///   at most `bufferLimit` (`write(_:inPiecesOf:)`), so the limit bounds the buffer.
/// - `writeIfRoom(_:)` never waits: it says `.full` and writes nothing, so the producer can
///   give up on a client that is not keeping up (a live stream that must not buffer for it).
///
/// What a writer holds also counts in the server's total for output held for clients
/// (the output `ByteBudget`, `HTTPServerConfiguration.maxBufferedOutput`). While that total is full, a
/// body with bytes still waiting for its client gets nothing more, however much room its own
/// buffer has: `write` waits until its buffer is empty, `writeIfRoom` says `.full`. A body
/// with nothing waiting (a client that keeps up) is not held back.
///
/// Either way a connection that is gone (the client closed it or did not read within the
/// write timeout, the server stopped) is reported as `.closed` / `HTTPBodyWriter.Closed`.
public final class HTTPBodyWriter: Sendable {
    /// What `writeIfRoom(_:)` did.
    public enum WriteResult: Sendable, Equatable {
        /// The bytes are queued.
        case written
        /// The buffer is full: nothing was queued.
        case full
        /// The connection is gone (or the body ended): nothing will be sent.
        case closed
    }

    /// The connection is gone, the body was finished, or the producer's task was cancelled.
    public struct Closed: Error, Sendable {}

    /// Why a detached body's `onClose` is called.
    public enum CloseReason: Sendable, Equatable {
        /// The connection is gone: the client closed it, did not read within the write
        /// timeout, or the server stopped. Nothing more will be sent.
        case connectionClosed
        /// Graceful shutdown began (a body whose `shutdown` is `.cancel`): end the body with
        /// `finish()`, and its client reads it complete.
        case shutdown
    }

    /// A detached body's close handler.
    public typealias CloseHandler = @Sendable (CloseReason) -> Void

    /// How the producer's part ended, as the loop sees it.
    enum End: Equatable {
        /// Still producing.
        case open
        /// `finish()`: the body is complete.
        case finished
        /// The producer returned without finishing: the body is incomplete.
        case abandoned
    }

    struct State {
        var chunks: [[UInt8]] = []
        /// Bytes in `chunks` plus those the loop took and has not sent yet.
        var buffered = 0
        /// Bytes the loop took with its last `take()`.
        var taken = 0
        var end = End.open
        /// The connection closed: writes fail.
        var closed = false
        /// The loop was told since its last `take()`.
        var notified = false
        /// The producer waiting in `write` for room.
        var waiter: CheckedContinuation<Void, Never>? = nil
        /// The size of the write it waits to fit.
        var waiting = 0
        /// The producer's task, until it returns: cancelled when the connection closes or
        /// (a `.cancel` body) when shutdown begins.
        var producer: Task<Void, Never>? = nil
        var producerReturned = false
        /// `detach(onClose:)` was called: the producer returning does not end the body.
        var detached = false
        /// Graceful shutdown began (a `.cancel` body).
        var stopping = false
        /// Called once when the connection closes or shutdown begins; dropped by `finish()`.
        var onClose: CloseHandler? = nil
        /// `buffered` counts in the server's output `ByteBudget`: from the start (a connected
        /// writer) until the loop has taken the body's end or the connection closed.
        var counted = false
    }

    /// The most bytes buffered before writers wait.
    public let bufferLimit: Int
    private let state: Mutex<State>
    /// The server's total for output held for clients (nil: not counted; a writer never
    /// connected, a test's). See `ByteBudget`.
    private let budget: ByteBudget?
    /// Tells the loop there is something to take (posts to its mailbox).
    private let wake: @Sendable () -> Void
    /// The loop of the writer's connection (nil for a writer never connected): who writes
    /// to many bodies at once (one commit to many streams) can do each loop's share on that
    /// loop, so N loops' threads copy and send in parallel.
    public let loop: LoopExecutor?
    /// Where this body is in its loop's table of streamed bodies (`StreamTable`), -1 when it
    /// is in none. Read and written on the loop's thread only.
    nonisolated(unsafe) var tableIndex = -1

    init(
        bufferLimit: Int, loop: LoopExecutor? = nil, budget: ByteBudget? = nil,
        wake: @escaping @Sendable () -> Void
    ) {
        self.bufferLimit = bufferLimit
        self.loop = loop
        self.budget = budget
        self.wake = wake
        var initial = State()
        initial.counted = budget != nil
        state = Mutex(initial)
    }

    /// A writer that was never connected (nobody to send to).
    static func closed() -> HTTPBodyWriter {
        let writer = HTTPBodyWriter(bufferLimit: 1, wake: {})
        writer.close()
        return writer
    }

    // MARK: - For producers

    /// Queues `bytes`, first waiting while the buffer is full.
    /// - Throws: `Closed` when the connection is gone, the body was finished, or the task is
    ///   cancelled (also while waiting).
    public func write(_ bytes: [UInt8]) async throws(Closed) {
        while true {
            if Task.isCancelled { throw Closed() }
            switch enqueue(bytes, fitting: true) {
            case .written: return
            case .closed: throw Closed()
            case .full: await waitForRoom(for: bytes.count)
            }
        }
    }

    /// Writes `bytes` as pieces of at most `size` bytes, each with `write(_:)`: the buffer
    /// never holds more than `bufferLimit` (when `size` is at most that).
    public func write(_ bytes: [UInt8], inPiecesOf size: Int) async throws(Closed) {
        guard bytes.count > size, size > 0 else { return try await write(bytes) }
        var start = 0
        while start < bytes.count {
            let end = min(start + size, bytes.count)
            try await write(Array(bytes[start..<end]))
            start = end
        }
    }

    /// Whether `count` more bytes fit: the buffer is empty, or they fit under the limit and
    /// the server's total has room (`totalIsFull`).
    private func fits(_ count: Int, _ state: State) -> Bool {
        state.buffered == 0 || (state.buffered + count <= bufferLimit && !totalIsFull)
    }

    /// Whether the server's total (the output `ByteBudget`) is full: a body with bytes waiting for its
    /// client then gets nothing more (callers ask only for such a body, so a body with
    /// nothing waiting never pays for it: one relaxed load).
    @inline(__always)
    private var totalIsFull: Bool { budget?.isFull == true }

    /// Counts `count` more bytes buffered, in the budget too while the body counts there.
    @inline(__always)
    private func buffer(_ count: Int, _ state: inout State) {
        state.buffered += count
        if state.counted { budget?.adjust(by: count) }
    }

    /// Queues `bytes` if the buffer has room, else writes nothing and says `.full`.
    public func writeIfRoom(_ bytes: [UInt8]) -> WriteResult { enqueue(bytes, fitting: false) }

    /// Queues `bytes` if there is room: `fitting`, if they fit whole (`write`); else if the
    /// buffer is under its limit (`writeIfRoom`).
    private func enqueue(_ bytes: [UInt8], fitting: Bool) -> WriteResult {
        if bytes.isEmpty { return state.withLock { $0.closed || $0.end != .open ? .closed : .written } }
        let (result, notify) = state.withLock { state -> (WriteResult, Bool) in
            guard !state.closed, state.end == .open else { return (.closed, false) }
            let room =
                fitting
                ? fits(bytes.count, state)
                : state.buffered == 0 || (state.buffered < bufferLimit && !totalIsFull)
            guard room else { return (.full, false) }
            state.chunks.append(bytes)
            buffer(bytes.count, &state)
            defer { state.notified = true }
            return (.written, !state.notified)
        }
        if notify { wake() }
        return result
    }

    /// What `writeIfRoomOrClaim(_:)` did.
    enum Claim {
        /// Nothing of the body waits to be sent: the caller (the loop) sends the bytes
        /// itself, now, and they count as written; none of them was queued.
        case claimed
        /// As `writeIfRoom(_:)` said (`.written`: queued).
        case result(WriteResult)
    }

    /// `writeIfRoom(_:)`, except that a body with nothing waiting to be sent (nothing queued,
    /// nothing the loop took and has not sent) queues nothing: the loop sends the bytes
    /// itself at once (`HTTPBodyFanOut`), and what the socket does not take it holds
    /// (`holdUnsent(_:)`). One lock either way.
    func writeIfRoomOrClaim(_ bytes: [UInt8]) -> Claim {
        let (result, notify) = state.withLock { state -> (Claim, Bool) in
            guard !state.closed, state.end == .open else { return (.result(.closed), false) }
            if state.buffered == 0 { return (.claimed, false) }
            guard state.buffered < bufferLimit, !totalIsFull else { return (.result(.full), false) }
            state.chunks.append(bytes)
            buffer(bytes.count, &state)
            defer { state.notified = true }
            return (.result(.written), !state.notified)
        }
        if notify { wake() }
        return result
    }

    /// The loop holds `count` bytes of this body that the socket did not take (of a claimed
    /// write): they count as buffered, and as taken, until the loop's next `take()`.
    func holdUnsent(_ count: Int) {
        state.withLock { state in
            buffer(count, &state)
            state.taken += count
        }
    }

    /// Ends the body: what was written is sent, then the end of the body. Later writes fail
    /// (a waiting one at once), and a detached body's `onClose` is not called any more.
    public func finish() {
        let (notify, waiter, handler) = state.withLock {
            state -> (Bool, CheckedContinuation<Void, Never>?, CloseHandler?) in
            // Whoever ends the body needs no word of its end: the handler, and what it holds
            // (often this writer), is released here, outside the lock.
            defer { state.onClose = nil }
            guard !state.closed, state.end == .open else { return (false, nil, state.onClose) }
            state.end = .finished
            defer {
                state.notified = true
                state.waiter = nil
            }
            return (!state.notified, state.waiter, state.onClose)
        }
        withExtendedLifetime(handler) {}
        waiter?.resume()
        if notify { wake() }
    }

    /// Hands the body over from the producer's task to whoever holds this writer: the
    /// producer may then return with the body open (it is not abandoned), and the holder
    /// writes and calls `finish()`. `onClose` is called once, on the loop's thread, when the
    /// connection closes or (a `.cancel` body) graceful shutdown begins — at once, on the
    /// caller's thread, if either happened already — unless `finish()` came first. Call it
    /// once; later calls are ignored.
    public func detach(onClose: @escaping CloseHandler) {
        let now = state.withLock { state -> CloseReason? in
            guard !state.detached else { return nil }
            state.detached = true
            guard state.end == .open else { return nil }
            if state.closed { return .connectionClosed }
            if state.stopping { return .shutdown }
            state.onClose = onClose
            return nil
        }
        if let now { onClose(now) }
    }

    /// Whether the connection is gone (or the body ended): nothing more will be sent.
    public var isClosed: Bool { state.withLock { $0.closed || $0.end != .open } }

    /// Bytes written and not yet sent to the socket.
    public var bufferedByteCount: Int { state.withLock { $0.buffered } }

    /// Whether a write is waiting for room (tests wait for it instead of sleeping).
    var hasWaitingWrite: Bool { state.withLock { $0.waiter != nil } }

    private func waitForRoom(for count: Int) async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.closed || state.end != .open || fits(count, state) || Task.isCancelled { return true }
                    state.waiter = continuation
                    state.waiting = count
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            state.withLock { state in
                defer { state.waiter = nil }
                return state.waiter
            }?.resume()
        }
    }

    // MARK: - For the loop

    /// The producer's task (kept for cancelling it until it returns).
    func started(_ producer: Task<Void, Never>) {
        state.withLock { state in
            if !state.producerReturned { state.producer = producer }
        }
    }

    /// The producer returned: without `finish()` (or `detach`) the body is incomplete.
    func producerReturned() {
        let notify = state.withLock { state -> Bool in
            state.producerReturned = true
            state.producer = nil
            guard state.end == .open, !state.detached else { return false }
            state.end = .abandoned
            defer { state.notified = true }
            return !state.closed && !state.notified
        }
        if notify { wake() }
    }

    /// Everything written since the last call, and how the producer's part stands. Called
    /// when the bytes taken last time have all been sent: their room is freed (a waiting
    /// `write` resumes), and given back to the budget. Once the body's end is taken, what the
    /// body still holds is the connection's last output, counted as an answer's by the loop:
    /// the writer counts nothing more.
    func take() -> (bytes: [[UInt8]], end: End) {
        let (bytes, end, waiter) = state.withLock { state -> ([[UInt8]], End, CheckedContinuation<Void, Never>?) in
            let buffered = state.buffered
            state.buffered -= state.taken
            if state.counted {
                let ended = state.end != .open
                budget?.adjust(by: ended ? -buffered : -state.taken)
                if ended { state.counted = false }
            }
            let chunks = state.chunks
            state.chunks = []
            state.taken = state.buffered
            state.notified = false
            var waiter: CheckedContinuation<Void, Never>? = nil
            if fits(state.waiting, state) {
                waiter = state.waiter
                state.waiter = nil
            }
            return (chunks, state.end, waiter)
        }
        waiter?.resume()
        return (bytes, end)
    }

    /// The connection is gone: writes fail from now on, a waiting one at once; the
    /// producer's task is cancelled and a detached body's holder told.
    func close() {
        let (waiter, producer, handler) = state.withLock {
            state -> (CheckedContinuation<Void, Never>?, Task<Void, Never>?, CloseHandler?) in
            state.closed = true
            state.chunks = []
            if state.counted {
                budget?.adjust(by: -state.buffered)
                state.counted = false
            }
            defer {
                state.waiter = nil
                state.producer = nil
                state.onClose = nil
            }
            return (state.waiter, state.producer, state.end == .open ? state.onClose : nil)
        }
        // The holder first, so that a producer woken by the rest finds the stream ended.
        handler?(.connectionClosed)
        waiter?.resume()
        producer?.cancel()
    }

    /// Graceful shutdown began (a `.cancel` body): the producer's task is cancelled and a
    /// detached body's holder told, which then ends the body.
    func shutdownBegan() {
        let (producer, handler) = state.withLock { state -> (Task<Void, Never>?, CloseHandler?) in
            state.stopping = true
            defer { state.onClose = nil }
            return (state.producer, state.closed || state.end != .open ? nil : state.onClose)
        }
        handler?(.shutdown)
        producer?.cancel()
    }
}
