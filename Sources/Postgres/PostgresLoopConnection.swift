import CLibPQ
import Foundation

/// A `PostgresConnection` driven without blocking by a `PostgresEventLoop`: libpq in
/// non-blocking pipeline mode, its socket watched by the loop. Confined to the loop's
/// thread; leased by `PostgresLoopPool` to one task at a time, which runs one pipeline at a
/// time (`pipeline` suspends the task; nothing blocks) — or to the pool's shared reads,
/// several of whose pipelines may be in flight at once (`sharedPipeline`), each ended by
/// its own sync and answered in order.
///
/// States: idle (nothing sent) → sending (libpq's buffer not yet on the socket: writable
/// is watched) → waiting (readable is watched; results gathered as they arrive, the oldest
/// pipeline's first) → idle at the last pipeline's sync. Any I/O failure (server restart,
/// terminated backend) makes it broken: every waiting task is resumed with
/// `.connectionClosed`, the socket is no longer watched, and the pool closes and replaces it.
public final class PostgresLoopConnection: @unchecked Sendable {
    let connection: PostgresConnection
    let loop: any PostgresEventLoop
    private let fd: Int32
    /// The pipelines sent and not yet answered, oldest first.
    private var pending: [Pending] = []
    private struct Pending {
        var collector: PostgresConnection.PipelineCollector
        let continuation: CheckedContinuation<[PostgresResult], any Error>
    }
    private var watchingWritable = false
    /// No further use: I/O failed or the connection was closed.
    private(set) var isBroken = false
    /// Told each notification that arrives (the listener's); nil: they are dropped.
    var notificationHandler: ((PostgresNotification) -> Void)?
    /// Told once when I/O fails (not when `close()` is called): the listener reconnects.
    var lossHandler: (() -> Void)?

    /// Takes over an open connection, on the loop's thread.
    init(_ connection: PostgresConnection, loop: any PostgresEventLoop) throws {
        self.connection = connection
        self.loop = loop
        self.fd = connection.socket
        guard fd >= 0, PQsetnonblocking(connection.handle, 1) == 0, PQenterPipelineMode(connection.handle) == 1 else {
            throw connection.connectionError()
        }
        loop.watch(fd, writable: false) { [unowned self] readiness in self.ready(readiness) }
    }

    /// Whether the connection can take the next pipeline.
    var isUsable: Bool { !isBroken && connection.isOpen && pending.isEmpty }

    /// Pipelines sent and not yet answered.
    var inFlight: Int { pending.count }

    /// Whether another shared pipeline may be sent behind those in flight: open, and, when
    /// none is in flight, no transaction left open (libpq reports a pipeline in flight as a
    /// transaction in progress; a shared pipeline opens none: it is its own implicit one).
    var canShare: Bool { !isBroken && connection.isOpen && (!pending.isEmpty || !connection.isInTransaction) }

    /// Whether a transaction is open (or failed).
    public var isInTransaction: Bool { connection.isInTransaction }

    /// Runs `statements` in one round trip and returns their results in order; the first
    /// that fails is thrown and the server skips the rest (as `PostgresConnection.pipeline`).
    /// On the loop's thread, one pipeline at a time.
    @discardableResult
    public func pipeline(_ statements: [PostgresStatement]) async throws -> [PostgresResult] {
        precondition(pending.isEmpty, "one pipeline at a time on a leased connection")
        return try await send(statements)
    }

    /// Sends `statements` behind the pipelines already in flight (the pool's shared reads:
    /// statements that open no transaction, so each pipeline is one implicit transaction,
    /// ended by its own sync) and returns their results once the server has answered them.
    func sharedPipeline(_ statements: [PostgresStatement]) async throws -> [PostgresResult] {
        try await send(statements)
    }

    private func send(_ statements: [PostgresStatement]) async throws -> [PostgresResult] {
        guard !statements.isEmpty else { return [] }
        guard !isBroken, connection.isOpen else { throw connection.connectionError() }
        if let observer = connection.statementObserver { statements.forEach { observer($0.sql) } }
        return try await withCheckedThrowingContinuation { continuation in
            do {
                let replies = try connection.sendPipeline(statements)
                pending.append(
                    Pending(
                        collector: PostgresConnection.PipelineCollector(replies: replies), continuation: continuation))
                flush()
            } catch {
                lose()
                continuation.resume(throwing: error)
            }
        }
    }

    /// Runs `prefix` then `statements` in one round trip and returns the results of
    /// `statements` only: the row scope a transaction starts with travels with its first
    /// statements. A failure's `pipelineIndex` counts among `statements` (nil when a
    /// statement of `prefix` failed: nothing of `statements` ran, as when the connection
    /// is lost).
    @discardableResult
    public func pipeline(_ statements: [PostgresStatement], prefix: [PostgresStatement]) async throws
        -> [PostgresResult]
    {
        try await Self.run(statements, prefix: prefix) { try await pipeline($0) }
    }

    /// `run(prefix + statements)`, with the results and a failure's `pipelineIndex` of
    /// `statements` only.
    static func run(
        _ statements: [PostgresStatement], prefix: [PostgresStatement],
        _ run: ([PostgresStatement]) async throws -> [PostgresResult]
    ) async throws -> [PostgresResult] {
        guard !prefix.isEmpty else { return try await run(statements) }
        do {
            return Array(try await run(prefix + statements).dropFirst(prefix.count))
        } catch var error as PostgresError {
            if let index = error.pipelineIndex {
                error.pipelineIndex = index >= prefix.count ? index - prefix.count : nil
            }
            throw error
        }
    }

    /// The process id of the server's backend for this connection.
    public var backendPID: Int32 { connection.backendPID }

    /// As `PostgresConnection.pipelinedTransaction`: whatever transaction `body` leaves open,
    /// by throwing or by returning early, is rolled back.
    public func pipelinedTransaction<T>(_ body: (PostgresLoopConnection) async throws -> T) async throws -> T {
        do {
            let value = try await body(self)
            if !isBroken, connection.isOpen, isInTransaction { try await pipeline([.rollback]) }
            return value
        } catch {
            if !isBroken, connection.isOpen, isInTransaction { _ = try? await pipeline([.rollback]) }
            throw error
        }
    }

    private func flush() {
        switch PQflush(connection.handle) {
        case 0: setWritable(false)
        case 1: setWritable(true)
        default: lose()
        }
    }

    private func setWritable(_ writable: Bool) {
        guard writable != watchingWritable, !isBroken else { return }
        watchingWritable = writable
        loop.watch(fd, writable: writable) { [unowned self] readiness in self.ready(readiness) }
    }

    private func ready(_ readiness: PostgresIOReadiness) {
        guard !isBroken else { return }
        if readiness.writable { flush() }
        guard readiness.readable, !isBroken else { return }
        guard PQconsumeInput(connection.handle) == 1 else { return lose() }
        // What an idle session may receive: notifications (for the listener) and notices.
        drainNotifications()
        var separators = 0
        while !pending.isEmpty, PQisBusy(connection.handle) == 0 {
            guard let result = PQgetResult(connection.handle) else {
                // NULL ends each statement's results; two in a row: nothing more has arrived.
                separators += 1
                if separators > 1 { break }
                continue
            }
            separators = 0
            if PQresultStatus(result) == PGRES_PIPELINE_SYNC {
                PQclear(result)
                complete()
                continue
            }
            do {
                try pending[0].collector.accept(result, on: connection)
            } catch {
                return lose(error)
            }
        }
        if notificationHandler != nil { drainNotifications() }  // those parsed with a pipeline's results
        // A backend that is ending the session sends FATAL before its end of file: an idle
        // connection counts as broken from then on, so the next lease takes another.
        if PQstatus(connection.handle) != CONNECTION_OK || (pending.isEmpty && connection.announcedTermination) {
            lose()
        }
    }

    private func drainNotifications() {
        while let notify = PQnotifies(connection.handle) {
            let notification = PostgresNotification(
                channel: String(cString: notify.pointee.relname), payload: String(cString: notify.pointee.extra))
            PQfreemem(notify)
            notificationHandler?(notification)
        }
    }

    private func complete() {
        guard !pending.isEmpty else { return }
        let answered = pending.removeFirst()
        answered.continuation.resume(with: Result { try answered.collector.finish() })
    }

    /// The connection is unusable: fail the waiting pipelines, stop watching.
    private func lose(_ error: (any Error)? = nil) {
        guard !isBroken else { return }
        isBroken = true
        connection.lostTrack = true
        loop.unwatch(fd)
        let waiting = pending
        pending = []
        for entry in waiting { entry.continuation.resume(throwing: error ?? connection.connectionError()) }
        lossHandler?()
    }

    /// Stops watching the socket (before the connection is closed). On the loop's thread.
    func close() {
        if !isBroken {
            isBroken = true
            loop.unwatch(fd)
        }
        let waiting = pending
        pending = []
        for entry in waiting {
            entry.continuation.resume(
                throwing: PostgresError(kind: .poolClosed, message: "the database pool is closed"))
        }
    }
}
