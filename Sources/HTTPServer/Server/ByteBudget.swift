import Foundation
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
/// Within it, each owner (an account, else a client address: `ShareKey`) holds at most its
/// share of the large whole answers (`Shares`, `HTTPServerConfiguration.maxBufferedOutputPerClient`):
/// a large answer to a `GET` that fits the budget but not its owner's share is refused the
/// same way (`refuseAnswer(context:over:)` with `.perClient`); one to a request that may have
/// changed something is counted in the share but never refused. An answer holds its share
/// whole from when it is queued until it is sent or its connection closes. Streamed bodies
/// (capped per user by the application), exports and WebSockets have no share.
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
///
/// Within it, each owner (an account, else a client address: `ShareKey`) holds at most
/// its share (`Shares`, `HTTPServerConfiguration.maxBufferedInputPerClient`): a body
/// that fits the budget but not its owner's share is refused the same way, and given back
/// with it on the same paths.
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

/// Whose share of a budget a large request body or a large answer counts against
/// (`HTTPServerConfiguration.maxBufferedInputPerClient`, `maxBufferedOutputPerClient`): an
/// account the application named (`HTTPResponder.shareKey(context:)`), or else the request's
/// client address (an IPv4 address, an IPv6 /64; behind a trusted proxy the client it
/// forwarded). Opaque to the server: 128 bits and what kind they are, compared and hashed
/// without allocating.
public struct ShareKey: Hashable, Sendable {
    private enum Kind: UInt8 { case client, account }
    private let kind: Kind
    private let high: UInt64
    private let low: UInt64

    /// The share of an account of the application (all its sessions and devices together).
    public static func account(_ id: UUID) -> ShareKey {
        withUnsafeBytes(of: id.uuid) { bytes in
            ShareKey(
                kind: .account, high: bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self),
                low: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        }
    }

    /// The share of a client address (`IPAddress.client`: its /64 for IPv6).
    public static func client(_ address: IPAddress) -> ShareKey {
        let client = address.client
        return ShareKey(kind: .client, high: client.high, low: client.low)
    }
}

/// Which limit refused a request body (`HTTPResponder.refuseBody(context:over:)`) or a large
/// answer (`HTTPResponder.refuseAnswer(context:over:)`).
public enum BudgetLimit: Sendable {
    /// The server's budget (`HTTPServerConfiguration.maxBufferedInput` for bodies,
    /// `maxBufferedOutput` for answers): the bodies being read, or the answers waiting for
    /// their clients, over all connections hold as much as it allows.
    case total
    /// The owner's share of it (`HTTPServerConfiguration.maxBufferedInputPerClient`,
    /// `maxBufferedOutputPerClient`): those of that account, or of that client address, hold
    /// as much as one may.
    case perClient
}

/// The bytes each owner (`ShareKey`) holds in one budget, over all loops, and the most one may
/// hold: `HTTPServerConfiguration.maxBufferedInputPerClient` for large request bodies,
/// `maxBufferedOutputPerClient` for large whole answers (the server keeps one table for each).
/// Without it one account (or one address) with enough connections could announce large
/// bodies and trickle them, or ask for large answers and never read them, and hold the whole
/// budget, so that everyone else's large body or answer is refused until its connections end.
///
/// A dictionary behind one short lock, touched only by what its budget counts as large (over
/// `ByteBudget.smallBody`, `ByteBudget.smallAnswer`) and only after it fits in the budget: one
/// look-up when a body or answer is admitted (and per growth of a chunked body), one when it
/// is given back (an answer's share is held whole until the answer is sent or its connection
/// closes, not settled per write). An owner's entry goes when its last byte does, so the table
/// holds at most one entry per large body or answer in flight, which the budget bounds.
final class Shares: Sendable {
    /// The most bytes one owner may hold.
    let limit: Int
    private let held = Mutex<[ShareKey: Int]>([:])

    init(limit: Int) {
        self.limit = max(0, limit)
    }

    /// Shares of `share` bytes within a budget of `total`, or nil when they would limit
    /// nothing: 0 (off), or at least the total (the budget alone limits as much).
    static func within(_ total: Int, share: Int) -> Shares? {
        (1..<max(1, total)).contains(share) ? Shares(limit: share) : nil
    }

    /// Whether `owner` may hold `bytes` more; counted when it may.
    func admit(_ bytes: Int, for owner: ShareKey) -> Bool {
        held.withLock { table in
            let total = table[owner, default: 0] + bytes
            guard total <= limit else { return false }
            table[owner] = total
            return true
        }
    }

    /// Counts `bytes` more for `owner`, whatever the limit (an answer that is never refused
    /// still takes room from its owner's later ones until it is given back).
    func hold(_ bytes: Int, for owner: ShareKey) {
        held.withLock { table in table[owner, default: 0] += bytes }
    }

    /// Gives back `bytes` that `admit` or `hold` counted for `owner`.
    func release(_ bytes: Int, of owner: ShareKey) {
        held.withLock { table in
            guard let count = table[owner] else { return }
            if count <= bytes { table.removeValue(forKey: owner) } else { table[owner] = count - bytes }
        }
    }

    /// Bytes `owner` holds now.
    func heldBytes(of owner: ShareKey) -> Int { held.withLock { $0[owner] ?? 0 } }

    /// Owners holding bytes now (entries of the table).
    var owners: Int { held.withLock { $0.count } }
}
