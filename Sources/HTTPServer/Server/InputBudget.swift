import Synchronization

/// The bytes of request bodies a server holds while it reads them, over all its loops, and
/// the most it may hold (`HTTPServerConfiguration.maxBufferedInput`).
///
/// A body is read whole into memory before its handler runs (up to the route's limit, 10 MiB
/// for a push). Without a total, every open connection could announce a large body and send
/// it slowly: connections × body limit in all. A body whose `Content-Length` is over
/// `smallBody` is counted whole from its head, before a byte of it is read, if it fits
/// (`admit`); else the server answers `HTTPResponder.refuseBody` (a `503`) from the head and
/// never reads it. A chunked body, whose size nobody knows in advance, is counted as its
/// buffer grows past `smallBody` and cut off with the same answer when the growth does not
/// fit. A small body always passes and is not counted. What a request holds is given back
/// when its body is handed to the application, and when the connection closes, however it
/// closes.
///
/// One atomic counter for every loop of the server, like `OutputBudget`: a share per loop
/// could be smaller than one large body. Only bodies over `smallBody` touch it (one relaxed
/// add when admitted, one when handed over or closed; a chunked one, one per growth of its
/// buffer, which doubles): the usual small request costs a comparison.
final class InputBudget: Sendable {
    /// Bodies of at most this many bytes always pass (one socket read's worth).
    static let smallBody = 64 * 1024

    /// The most bytes held before a large body is refused.
    let limit: Int
    private let held = Atomic<Int>(0)

    init(limit: Int) {
        self.limit = max(0, limit)
    }

    /// Bytes held now over every loop.
    var heldBytes: Int { held.load(ordering: .relaxed) }

    /// Whether `bytes` more may be held; counted when admitted (`release` gives them back).
    func admit(_ bytes: Int) -> Bool {
        if held.wrappingAdd(bytes, ordering: .relaxed).newValue <= limit { return true }
        held.wrappingSubtract(bytes, ordering: .relaxed)
        return false
    }

    /// Gives back `bytes` admitted before.
    func release(_ bytes: Int) {
        if bytes != 0 { held.wrappingSubtract(bytes, ordering: .relaxed) }
    }
}
