import CSystem
import Foundation
import Logging

/// An HTTP/1.1 server on plain POSIX sockets with one epoll event loop on a thread of its
/// own.
///
/// The loop accepts, reads, parses and writes; it never waits on anything but epoll. What
/// each request means is decided by the `HTTPResponder`: from the head (route, body limit,
/// early answers), then from the whole request, answering inline or from a task that hands
/// its response back through a mailbox, so a handler may wait (a long-poll) without holding
/// any thread.
public final class HTTPServer<Responder: HTTPResponder>: Sendable {
    /// The server's settings.
    public let configuration: HTTPServerConfiguration
    private let loop: EventLoop<Responder>

    /// A server answering with `responder`; call `start()` to listen.
    public init(configuration: HTTPServerConfiguration, responder: Responder, logger: Logger) {
        self.configuration = configuration
        self.loop = EventLoop(configuration: configuration, responder: responder, logger: logger)
    }

    /// Binds the socket and starts the event loop thread. Raises `RLIMIT_NOFILE` to its hard
    /// limit first.
    /// - Returns: the port listened on (useful with port 0).
    /// - Throws: `HTTPServerError` when the address cannot be bound.
    @discardableResult
    public func start() throws -> Int {
        try loop.start()
    }

    /// The port listened on (after `start`).
    public var port: Int { loop.boundPort }

    /// Begins graceful shutdown: stop accepting, close idle connections, let in-flight
    /// requests finish (at most `shutdownTimeout`), then stop the loop. Safe from any thread.
    /// Before `start()` (or after it failed): the server is stopped at once and will not
    /// start; its executor runs what it is given off the loop.
    public func shutdown() { loop.requestShutdown() }

    /// Suspends until the loop has stopped and every connection is closed.
    public func waitUntilStopped() async {
        await loop.waitUntilStopped()
    }

    /// The loop's thread as a task executor, and the watcher of other descriptors (database
    /// connections driven by the same loop).
    public var executor: LoopExecutor { loop.executor }

    /// Open connections and requests in flight, for metrics.
    public var statistics: (connections: Int, inFlight: Int) { loop.statistics }
}

/// The server could not start.
public struct HTTPServerError: Error, CustomStringConvertible, Equatable {
    /// One line for the operator.
    public let description: String

    /// `start()` after `shutdown()`: the server will not run.
    public static let shutDownBeforeStart = HTTPServerError(description: "the server was shut down before it started")
}
