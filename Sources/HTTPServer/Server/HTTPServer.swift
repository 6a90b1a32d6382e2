import CSystem
import Foundation
import Logging

/// An HTTP/1.1 server on plain POSIX sockets with `configuration.loops` epoll event loops,
/// each on a thread of its own.
///
/// Each loop has its own listening socket (all bound to one port with `SO_REUSEPORT`, so the
/// kernel spreads new connections over the loops), its own connections, mailbox and
/// `LoopExecutor`; a connection stays on the loop that accepted it. The connection caps
/// hold across loops. A loop accepts, reads, parses and writes; it never waits on anything
/// but epoll. What each request means is decided by the `HTTPResponder`: from the head
/// (route, body limit, early answers), then from the whole request, answering inline or
/// from a task that hands its response back through a mailbox, so a handler may wait (a
/// long-poll) without holding any thread.
public final class HTTPServer<Responder: HTTPResponder>: Sendable {
    /// The server's settings.
    public let configuration: HTTPServerConfiguration
    private let loops: [EventLoop<Responder>]
    private let outputBudget: ByteBudget
    private let inputBudget: ByteBudget
    /// Each owner's share of the input budget (nil: no per-client share).
    private let inputShares: Shares?
    /// Each owner's share of the output budget's large answers (nil: no per-client share).
    private let outputShares: Shares?

    /// A server answering with `responder`; call `start()` to listen.
    public init(configuration: HTTPServerConfiguration, responder: Responder, logger: Logger) {
        self.configuration = configuration
        let caps = ConnectionCaps(
            maxConnections: configuration.maxConnections, maxPerClient: configuration.maxConnectionsPerClient)
        let budget = ByteBudget(limit: configuration.maxBufferedOutput)
        outputBudget = budget
        let input = ByteBudget(limit: configuration.maxBufferedInput)
        inputBudget = input
        let shares = Shares.within(configuration.maxBufferedInput, share: configuration.maxBufferedInputPerClient)
        inputShares = shares
        let answerShares = Shares.within(
            configuration.maxBufferedOutput, share: configuration.maxBufferedOutputPerClient)
        outputShares = answerShares
        loops = (0..<max(1, configuration.loops)).map { index in
            EventLoop(
                configuration: configuration, responder: responder, logger: logger, index: index, caps: caps,
                outputBudget: budget, inputBudget: input, inputShares: shares, outputShares: answerShares)
        }
    }

    /// Binds the sockets and starts the event loops' threads: the first loop's socket on
    /// the configured port (0: a free one), which must be free of every other socket (a
    /// second server on the same port fails with "in use" rather than sharing it), the
    /// others on the port it got (`SO_REUSEPORT`). Raises
    /// `RLIMIT_NOFILE` to its hard limit first. A loop that fails to start stops the ones
    /// started before it (as `shutdown()` would).
    /// - Returns: the port listened on (useful with port 0).
    /// - Throws: `HTTPServerError` when the address cannot be bound.
    @discardableResult
    public func start() throws -> Int {
        var port = configuration.port
        for (index, loop) in loops.enumerated() {
            do {
                port = try loop.start(port: port, sharing: loops.count == 1 ? .exclusive : index == 0 ? .first : .join)
            } catch {
                for started in loops[..<index] { started.requestShutdown() }
                throw error
            }
        }
        return port
    }

    /// The port listened on (after `start`).
    public var port: Int { loops[0].boundPort }

    /// Begins graceful shutdown on every loop: stop accepting, close idle connections, let
    /// in-flight requests finish (at most `shutdownTimeout`), then stop the loop. Safe from
    /// any thread. Before `start()` (or after it failed): the server is stopped at once and
    /// will not start; its executors run what they are given off the loops.
    public func shutdown() {
        for loop in loops { loop.requestShutdown() }
    }

    /// Suspends until every loop has stopped and every connection is closed.
    public func waitUntilStopped() async {
        for loop in loops { await loop.waitUntilStopped() }
    }

    /// The first loop's thread as a task executor, and the watcher of other descriptors
    /// (database connections driven by the same loop). See `executors` for all of them.
    public var executor: LoopExecutor { loops[0].executor }

    /// Every loop's executor, in order (`LoopExecutor.index`).
    public var executors: [LoopExecutor] { loops.map(\.executor) }

    /// Open connections and requests in flight over all loops, for metrics.
    public var statistics: (connections: Int, inFlight: Int) {
        loops.reduce(into: (connections: 0, inFlight: 0)) { sum, loop in
            let figures = loop.statistics
            sum.connections += figures.connections
            sum.inFlight += figures.inFlight
        }
    }

    /// Bytes waiting in output buffers for their clients to read them (answers, streamed
    /// bodies, WebSocket messages), over all loops: what
    /// `HTTPServerConfiguration.maxBufferedOutput` bounds (for metrics).
    public var bufferedOutputBytes: Int { outputBudget.heldBytes }

    /// Bytes of request bodies being read, over all loops: what
    /// `HTTPServerConfiguration.maxBufferedInput` bounds (for metrics).
    public var bufferedInputBytes: Int { inputBudget.heldBytes }

    /// Bytes of request bodies `owner` holds, over all loops: what
    /// `HTTPServerConfiguration.maxBufferedInputPerClient` bounds (0 without per-client
    /// shares). Takes the shares' lock: for tests and diagnostics, not per request.
    public func bufferedInputBytes(of owner: ShareKey) -> Int { inputShares?.heldBytes(of: owner) ?? 0 }

    /// Owners holding a share of the input budget now (entries of its table; for tests).
    var inputShareOwners: Int { inputShares?.owners ?? 0 }

    /// Bytes of large whole answers `owner` holds, over all loops: what
    /// `HTTPServerConfiguration.maxBufferedOutputPerClient` bounds (0 without per-client
    /// shares). Takes the shares' lock: for tests and diagnostics, not per request.
    public func bufferedOutputBytes(of owner: ShareKey) -> Int { outputShares?.heldBytes(of: owner) ?? 0 }

    /// Owners holding a share of the output budget now (entries of its table; for tests).
    var outputShareOwners: Int { outputShares?.owners ?? 0 }

    /// Open connections and requests in flight of each loop, in order.
    public var loopStatistics: [(connections: Int, inFlight: Int)] { loops.map(\.statistics) }

    /// Streamed bodies in the loops' tables (open streamed responses; for tests).
    var streamedBodyCount: Int { loops.reduce(0) { $0 + $1.streamedBodyCount } }

    /// Bytes of output buffer the connections of every loop keep now, each loop's read on its
    /// own thread (for tests).
    func outputCapacity() async -> Int {
        var total = 0
        for loop in loops { total += await Task(executorPreference: loop.executor) { loop.outputCapacity }.value }
        return total
    }
}

/// The server could not start.
public struct HTTPServerError: Error, CustomStringConvertible, Equatable {
    /// One line for the operator.
    public let description: String

    /// `start()` after `shutdown()`: the server will not run.
    public static let shutDownBeforeStart = HTTPServerError(description: "the server was shut down before it started")
}
