import CSystem
import Foundation
import Synchronization

/// The same bytes written to many streamed bodies of one loop, on that loop's thread (one
/// commit to the loop's share of a user's event streams), each as `writeIfRoom(_:)` writes
/// it, and sent the way a C server would: a body with nothing waiting to be sent queues
/// nothing and is not driven on its own; its socket is noted (from the loop's
/// `StreamTable`, not its connection), and once every body is written the loop sends one
/// framed copy of the bytes to each noted socket, back to back. A body with bytes waiting
/// (a client behind, a heartbeat not yet sent), or written off its loop's thread, is written
/// with `writeIfRoom(_:)` as usual.
///
/// What a socket does not take at once the loop keeps as that connection's output, counted
/// as the body's buffered bytes, and sends as the client reads (one write at most: a body
/// with anything buffered is queued through its writer, up to its limit).
public struct HTTPBodyFanOut {
    /// A socket the loop sends the bytes to once every body is written.
    struct Target {
        let fd: Int32
        let chunked: Bool
        let writer: HTTPBodyWriter
    }

    private let bytes: [UInt8]
    private let loop: LoopExecutor?
    private let table: StreamTable?
    private var targets: [Target] = []

    private init(bytes: [UInt8], loop: LoopExecutor?) {
        self.bytes = bytes
        self.loop = loop
        // Nothing to send (an empty write only says whether the body is open): as usual.
        table = bytes.isEmpty ? nil : loop?.streamTable
    }

    /// Writes `bytes` to each body that `body` writes to (`writeIfRoom(_:)`), then sends
    /// them to every socket that had nothing waiting, back to back.
    public static func write(_ bytes: [UInt8], _ body: (inout HTTPBodyFanOut) -> Void) {
        var fanOut = HTTPBodyFanOut(bytes: bytes, loop: LoopExecutor.current)
        body(&fanOut)
        guard let table = fanOut.table, !fanOut.targets.isEmpty else { return }
        table.send(fanOut.bytes, to: fanOut.targets)
    }

    /// Writes the bytes to `writer` as `HTTPBodyWriter.writeIfRoom(_:)` does: `.written` if
    /// they will be sent, `.full` (nothing written) if its buffer is full, `.closed` if the
    /// connection or the body has ended.
    public mutating func writeIfRoom(_ writer: HTTPBodyWriter) -> HTTPBodyWriter.WriteResult {
        guard let table, writer.loop === loop, let target = table.target(of: writer) else {
            return writer.writeIfRoom(bytes)
        }
        switch writer.writeIfRoomOrClaim(bytes) {
        case .claimed:
            targets.append(Target(fd: target.fd, chunked: target.chunked, writer: writer))
            return .written
        case .result(let result):
            return result
        }
    }
}

/// One loop's streamed bodies, side by side: what a fan-out needs of each (`HTTPBodyFanOut`)
/// — its socket, its framing, whether its head is sent — found from the writer's
/// `tableIndex`, without the connections' dictionary or the connection. A body is in it from
/// its head until it ends or its connection closes. The loop's thread only.
final class StreamTable {
    struct Slot {
        /// Its body's writer, whose `tableIndex` is this slot's: held by its connection for as
        /// long as the slot is in the table.
        unowned(unsafe) let writer: HTTPBodyWriter
        let fd: Int32
        let chunked: Bool
        /// The response head is sent. From then on only the writer's bytes are the
        /// connection's output, so a writer with nothing buffered has nothing waiting.
        var headSent = false
    }

    /// A send of a fan-out that did not go out whole: `sent` bytes of `frame` did (-1: none,
    /// `error`).
    struct ShortSend {
        let target: HTTPBodyFanOut.Target
        let frame: ArraySlice<UInt8>
        let sent: Int
        let error: Int32
    }

    private var slots: [Slot] = []
    private let counted = Atomic<Int>(0)
    /// The loop's handling of sends that did not go out whole (kept as the connection's
    /// output, or the connection closed); set while the loop runs.
    var finishShortSends: (([ShortSend]) -> Void)? = nil

    /// Bodies in the table now (any thread).
    var count: Int { counted.load(ordering: .relaxed) }

    func join(_ writer: HTTPBodyWriter, fd: Int32, chunked: Bool) {
        writer.tableIndex = slots.count
        slots.append(Slot(writer: writer, fd: fd, chunked: chunked))
        counted.store(slots.count, ordering: .relaxed)
    }

    /// Takes `writer`'s body out of the table (its place goes to the last one's).
    func leave(_ writer: HTTPBodyWriter) {
        guard let index = index(of: writer) else { return }
        writer.tableIndex = -1
        let last = slots.removeLast()
        if index < slots.count {
            slots[index] = last
            last.writer.tableIndex = index
        }
        counted.store(slots.count, ordering: .relaxed)
    }

    /// `writer`'s connection is past its head: only the writer's bytes are its output now.
    func headSent(_ writer: HTTPBodyWriter) {
        guard let index = index(of: writer), !slots[index].headSent else { return }
        slots[index].headSent = true
    }

    /// `writer`'s socket and framing, if it is in the table and its head is sent.
    func target(of writer: HTTPBodyWriter) -> (fd: Int32, chunked: Bool)? {
        guard let index = index(of: writer), slots[index].headSent else { return nil }
        return (slots[index].fd, slots[index].chunked)
    }

    private func index(of writer: HTTPBodyWriter) -> Int? {
        let index = writer.tableIndex
        guard index >= 0, index < slots.count, slots[index].writer === writer else { return nil }
        return index
    }

    /// Sends `bytes`, framed, to every target, back to back (nothing else between the sends:
    /// a client woken by one finds the next already there); then hands what did not go out
    /// whole to the loop.
    func send(_ bytes: [UInt8], to targets: [HTTPBodyFanOut.Target]) {
        let chunked = targets.contains { $0.chunked } ? chunkFrame(bytes) : []
        var short: [(target: Int, sent: Int, error: Int32)] = []
        chunked.withUnsafeBytes { chunked in
            bytes.withUnsafeBytes { plain in
                for index in targets.indices {
                    let frame = targets[index].chunked ? chunked : plain
                    guard let base = frame.baseAddress else { continue }
                    var sent = csystem_send(targets[index].fd, base, frame.count)
                    while sent < 0, errno == EINTR { sent = csystem_send(targets[index].fd, base, frame.count) }
                    if sent != frame.count { short.append((index, sent, sent < 0 ? errno : 0)) }
                }
            }
        }
        guard !short.isEmpty else { return }
        finishShortSends?(
            short.map { index, sent, error in
                let target = targets[index]
                let frame = target.chunked ? chunked : bytes
                return ShortSend(target: target, frame: frame[...], sent: sent, error: error)
            })
    }
}

/// The bytes of one chunk of `bytes`: its size in hexadecimal, CRLF, the bytes, CRLF.
func chunkFrame(_ bytes: [UInt8]) -> [UInt8] {
    var frame: [UInt8] = []
    frame.reserveCapacity(bytes.count + 20)
    appendHex(bytes.count, to: &frame)
    frame.append(13)
    frame.append(10)
    frame.append(contentsOf: bytes)
    frame.append(13)
    frame.append(10)
    return frame
}
