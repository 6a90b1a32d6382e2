/// One client connection's state. Touched only by the event loop thread.
final class Connection {
    enum Deadline {
        /// Waiting for the first byte of a request (new or keep-alive connection): close quietly.
        case idle
        /// A request head is arriving: `408`.
        case header
        /// A body is arriving: `408`.
        case body
        /// A response is waiting for the client to read it: close.
        case write
        /// A handler is running: no deadline (it bounds itself).
        case none
    }

    let fd: Int32
    let id: UInt64
    let remoteAddress: String
    var parser: HTTPRequestParser

    /// Bytes to send and how many of them went out already.
    var output: [UInt8] = []
    var outputOffset = 0
    /// Edge-triggered epoll: remember readiness until a call says EAGAIN.
    var readable = false
    var writable = true
    /// A handler is running for the current request; parsing waits (responses stay in order).
    var inFlight = false
    var handlerTask: Task<Void, Never>? = nil
    /// Close once `output` is written.
    var closeAfterWrite = false
    /// The peer closed its sending side: no more requests will come.
    var peerClosedInput = false

    var deadline: UInt64 = 0
    var deadlineKind: Deadline = .idle
    /// The request being answered, for the access log and `HEAD`.
    var current: RequestInfo? = nil

    struct RequestInfo {
        var method: HTTPMethod
        var path: String
        var requestID: String
        /// The route pattern answering (`/sync/v1/events`), for metrics without unbounded labels.
        var route: String
        var origin: String?
        var keepAlive: Bool
        var started: UInt64
    }

    init(fd: Int32, id: UInt64, remoteAddress: String, limits: HTTPParserLimits) {
        self.fd = fd
        self.id = id
        self.remoteAddress = remoteAddress
        self.parser = HTTPRequestParser(limits: limits, bodyMode: .collect)
    }

    var hasPendingOutput: Bool { outputOffset < output.count }
}
