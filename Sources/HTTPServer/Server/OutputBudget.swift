import Synchronization

/// The bytes a server holds in its connections' output buffers, waiting for clients to read
/// them, over all its loops, and the most it may hold
/// (`HTTPServerConfiguration.maxBufferedOutput`): whole answers, streamed bodies and
/// WebSocket messages alike.
///
/// Without it, every client that asks for a large answer and never reads it would keep that
/// answer in memory until the write timeout: connections × answer size in all. An answer to
/// a `GET` larger than `smallAnswer` is queued only if it fits (`admit`), else the server
/// answers `503` instead (`HTTPResponder.refuseAnswer`); a small one always goes (errors,
/// health checks, ordinary sync answers), and is counted only if the socket does not take it
/// at once. An answer to a request that may have changed something is counted but never
/// refused (`EventLoop.queueAnswer` says why). What a connection holds is given back as
/// the socket takes it and when the connection closes, however it closes.
///
/// Streamed bodies and WebSockets count what their writers hold (`HTTPBodyWriter`: written,
/// not yet sent), from the write that queues it to the loop's `take()` after it is sent (or
/// the connection's end). Each is still bounded by its own buffer (`HTTPBodyStream.bufferLimit`,
/// `WebSocketSettings.outputBufferLimit`); over the total (`isFull`), nothing more is queued for
/// one with bytes still waiting for its client: `writeIfRoom` says `.full` (a live stream
/// ends, Realtime closes with `1013`) and `write` waits until its buffer is empty (an export
/// goes on at its client's pace, one piece at a time). A body with nothing waiting is never
/// refused: its write goes (a fan-out sends it at once, uncounted unless the socket leaves
/// some of it), so the total may pass the limit by one write per body.
///
/// One atomic counter for every loop of the server, not a share per loop: a loop's share
/// (the budget divided by up to one loop per core) could be smaller than one large answer,
/// and one loop would refuse while another had room. Only large answers and bytes a client is
/// slow to take touch it (one relaxed add when queued, one per write that moves them, one
/// when sent or closed; for a body, one when a write is queued and one per `take()` that
/// frees sent bytes); an answer the socket takes whole, and a fan-out's write the socket takes
/// whole, cost none.
final class OutputBudget: Sendable {
    /// Answers (their bodies) of at most this many bytes are always queued.
    static let smallAnswer = 64 * 1024

    /// The most bytes held before a large answer is refused.
    let limit: Int
    private let held = Atomic<Int>(0)

    init(limit: Int) {
        self.limit = max(0, limit)
    }

    /// Bytes held now over every loop.
    var heldBytes: Int { held.load(ordering: .relaxed) }

    /// Whether an answer whose body is `bytes` long may be queued. A large one is counted
    /// (`bytes`) when admitted: the caller settles the count to what it queued (`adjust`).
    /// A small one is always admitted and not counted here.
    func admit(_ bytes: Int) -> Bool {
        guard bytes > Self.smallAnswer else { return true }
        if held.wrappingAdd(bytes, ordering: .relaxed).newValue <= limit { return true }
        held.wrappingSubtract(bytes, ordering: .relaxed)
        return false
    }

    /// Whether the bytes held have reached the limit: a body with bytes waiting for its client
    /// gets nothing more (`HTTPBodyWriter`). One relaxed load.
    var isFull: Bool { held.load(ordering: .relaxed) >= limit }

    /// Counts `delta` more bytes held (fewer when negative), whatever the limit.
    func adjust(by delta: Int) {
        if delta != 0 { held.wrappingAdd(delta, ordering: .relaxed) }
    }
}
