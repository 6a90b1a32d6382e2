import Synchronization

/// A total of bytes a server holds over all its loops, and the most it may hold: one relaxed
/// atomic counter for every loop, not a share per loop (a loop's share, the total divided by
/// up to one loop per core, could be smaller than one large answer or body, and one loop would
/// refuse while another had room). The server keeps two: the output budget
/// (`HTTPServerConfiguration.maxBufferedOutput`) and the input budget
/// (`HTTPServerConfiguration.maxBufferedInput`), described below.
///
/// ## Output
///
/// The bytes a server holds in its connections' output buffers, waiting for clients to read
/// them, over all its loops, and the most it may hold
/// (`HTTPServerConfiguration.maxBufferedOutput`): whole answers, streamed bodies and
/// WebSocket messages alike.
///
/// Without it, every client that asks for a large answer and never reads it would keep that
/// answer in memory until the write timeout: connections × answer size in all. An answer to
/// a `GET` larger than `ByteBudget.smallAnswer` is queued only if it fits (`admit`), else the server
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
/// Only large answers and bytes a client is
/// slow to take touch it (one relaxed add when queued, one per write that moves them, one
/// when sent or closed; for a body, one when a write is queued and one per `take()` that
/// frees sent bytes); an answer the socket takes whole, and a fan-out's write the socket takes
/// whole, cost none.
///
/// ## Input
///
/// The bytes of request bodies a server holds while it reads them, over all its loops, and
/// the most it may hold (`HTTPServerConfiguration.maxBufferedInput`).
///
/// A body is read whole into memory before its handler runs (up to the route's limit, 10 MiB
/// for a push). Without a total, every open connection could announce a large body and send
/// it slowly: connections × body limit in all. A body whose `Content-Length` is over
/// `ByteBudget.smallBody` is counted whole from its head, before a byte of it is read, if it fits
/// (`admit`); else the server answers `HTTPResponder.refuseBody` (a `503`) from the head and
/// never reads it. A chunked body, whose size nobody knows in advance, is counted as its
/// buffer grows past `ByteBudget.smallBody` and cut off with the same answer when the growth does not
/// fit. A small body always passes and is not counted. What a request holds is given back
/// once the application has answered it (its handler's task gives it back, also when the
/// connection closed meanwhile: a handler waiting for the database still holds the body), when
/// a body is dropped unread, and when the connection closes while the body is being read.
///
/// Only bodies over `ByteBudget.smallBody` touch it (one relaxed
/// add when admitted, one when answered or closed; a chunked one, one per growth of its
/// buffer, which doubles): the usual small request costs a comparison.
public final class ByteBudget: Sendable {
    /// Answers (their bodies) of at most this many bytes are always queued (output).
    static let smallAnswer = 64 * 1024
    /// Bodies of at most this many bytes always pass (one socket read's worth; input).
    public static let smallBody = 64 * 1024

    /// The most bytes held before a large answer or body is refused.
    let limit: Int
    private let held = Atomic<Int>(0)

    init(limit: Int) {
        self.limit = max(0, limit)
    }

    /// Bytes held now over every loop.
    var heldBytes: Int { held.load(ordering: .relaxed) }

    /// Whether the bytes held have reached the limit: a body with bytes waiting for its client
    /// gets nothing more (`HTTPBodyWriter`). One relaxed load.
    var isFull: Bool { held.load(ordering: .relaxed) >= limit }

    /// Whether `bytes` more may be held; counted when admitted (`adjust` settles or gives
    /// them back).
    func admit(_ bytes: Int) -> Bool {
        if held.wrappingAdd(bytes, ordering: .relaxed).newValue <= limit { return true }
        held.wrappingSubtract(bytes, ordering: .relaxed)
        return false
    }

    /// Counts `delta` more bytes held (fewer when negative), whatever the limit.
    func adjust(by delta: Int) {
        if delta != 0 { held.wrappingAdd(delta, ordering: .relaxed) }
    }
}
