import Synchronization

/// The bytes of whole answers a server holds in its connections' output buffers, waiting for
/// clients to read them, over all its loops, and the most it may hold
/// (`HTTPServerConfiguration.maxBufferedOutput`).
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
/// One atomic counter for every loop of the server, not a share per loop: a loop's share
/// (the budget divided by up to one loop per core) could be smaller than one large answer,
/// and one loop would refuse while another had room. Only large answers and answers a
/// client is slow to take touch it (one relaxed add when queued, one per write that moves
/// them, one when sent or closed); an answer the socket takes whole costs a comparison.
/// Streamed bodies and WebSocket messages are not counted: each is bounded by its writer's
/// buffer (`HTTPBodyStream.bufferLimit`, `WebSocketSettings.outputBufferLimit`), which the
/// producer waits on or gives up at.
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

    /// Counts `delta` more bytes held (fewer when negative), whatever the limit.
    func adjust(by delta: Int) {
        if delta != 0 { held.wrappingAdd(delta, ordering: .relaxed) }
    }
}
