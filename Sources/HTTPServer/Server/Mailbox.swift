import CSystem
import Foundation

/// Hands work back to the event loop from other threads: finished responses, streamed
/// bodies with something to send, and the shutdown request. Writing to an eventfd wakes the loop from `epoll_wait`.
/// A streamed body written on the loop's own thread (one commit fanned out to that loop's
/// streams) takes a loop-local list instead: no lock, no eventfd.
final class Mailbox<Context: Sendable>: @unchecked Sendable {
    struct Completion {
        let fd: Int32
        let connectionID: UInt64
        let response: HTTPResponse
        let context: Context
    }

    let eventFD: Int32
    private let lock = NSLock()
    private var completions: [Completion] = []
    /// Connections (fd, id) whose streamed body has something new to take.
    private var streamsReady: [(fd: Int32, connectionID: UInt64)] = []
    private var shutdownRequested = false
    private var signalled = false
    /// Connections whose streamed body was written on the loop's own thread. Loop-confined:
    /// the loop takes them after the jobs it runs (`takeLocalStreamsReady`).
    private var localStreamsReady: [(fd: Int32, connectionID: UInt64)] = []

    init() {
        eventFD = csystem_eventfd()
    }

    func post(_ completion: Completion) {
        lock.lock()
        completions.append(completion)
        let wake = !signalled
        signalled = true
        lock.unlock()
        if wake { wakeLoop() }
    }

    /// A streamed body of connection `fd` / `connectionID` has something to take.
    func postStreamReady(fd: Int32, connectionID: UInt64) {
        lock.lock()
        streamsReady.append((fd, connectionID))
        let wake = !signalled
        signalled = true
        lock.unlock()
        if wake { wakeLoop() }
    }

    /// A streamed body of connection `fd` / `connectionID` has something to take, posted on
    /// the loop's own thread (only there: the list has no lock).
    func postStreamReadyOnLoop(fd: Int32, connectionID: UInt64) {
        localStreamsReady.append((fd, connectionID))
    }

    /// Takes what `postStreamReadyOnLoop` posted (on the loop's thread); keeps the list's room.
    func takeLocalStreamsReady() -> [(fd: Int32, connectionID: UInt64)] {
        guard !localStreamsReady.isEmpty else { return [] }
        defer { localStreamsReady.removeAll(keepingCapacity: true) }
        return localStreamsReady
    }

    func requestShutdown() {
        lock.lock()
        shutdownRequested = true
        signalled = true
        lock.unlock()
        wakeLoop()
    }

    /// Takes everything posted so far (called by the loop after the eventfd fired).
    func drain() -> (
        completions: [Completion], streamsReady: [(fd: Int32, connectionID: UInt64)], shutdown: Bool
    ) {
        var counter: UInt64 = 0
        _ = read(eventFD, &counter, 8)
        lock.lock()
        defer { lock.unlock() }
        let taken = completions
        completions = []
        let ready = streamsReady
        streamsReady = []
        signalled = false
        return (taken, ready, shutdownRequested)
    }

    /// Wakes the loop without posting anything (the loop's executor has jobs).
    func wake() { wakeLoop() }

    private func wakeLoop() {
        var one: UInt64 = 1
        while write(eventFD, &one, 8) < 0, errno == EINTR {}
    }
}
