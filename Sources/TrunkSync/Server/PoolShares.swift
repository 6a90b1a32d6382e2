import HTTPServer
import Postgres

/// The event loops' shares of the database's connections (`Database.drive(on:)`): one
/// `PostgresLoopPool` per loop of the public listener, each driven by its loop. A task takes
/// the pool of the loop it runs on (`LoopExecutor.current`), so a handler's queries are sent
/// and read on the thread that read its request; a task on another loop takes the first
/// loop's (its pool hops there itself). `Database.pool` gives a task on no loop, or on a loop
/// without a share (the admin listener's), the database's own loop's pool instead.
public final class PoolShares: Sendable {
    private let shares: [(executor: LoopExecutor, pool: PostgresLoopPool)]

    /// Shares in the loops' order; at least one.
    public init(_ shares: [(LoopExecutor, PostgresLoopPool)]) {
        precondition(!shares.isEmpty, "PoolShares needs at least one pool")
        self.shares = shares.map { (executor: $0.0, pool: $0.1) }
    }

    /// The pool of the loop this task runs on (else the first) — unless every connection of
    /// it is busy while another loop's share has one idle: then that one (the task's queries
    /// run on that loop), rather than wait while connections idle elsewhere. The kernel
    /// spreads clients over the loops unevenly, so one loop may have more clients than
    /// connections while another's sit idle.
    public var current: PostgresLoopPool {
        let own = home
        guard shares.count > 1, Self.isBusy(own.statistics) else { return own }
        return shares.lazy.map(\.pool).first { $0 !== own && !Self.isBusy($0.statistics) } ?? own
    }

    /// The pool of the loop this task runs on, else the first.
    private var home: PostgresLoopPool {
        guard let loop = LoopExecutor.current else { return shares[0].pool }
        if loop.index < shares.count, shares[loop.index].executor === loop { return shares[loop.index].pool }
        return shares.first { $0.executor === loop }?.pool ?? shares[0].pool
    }

    /// Every connection the pool may open is leased (or requests already wait).
    private static func isBusy(_ figures: PostgresLoopPool.Statistics) -> Bool {
        figures.waiting > 0 || figures.inUse >= figures.maxConnections
    }

    /// Whether `loop` has a share.
    public func includes(_ loop: LoopExecutor) -> Bool { shares.contains { $0.executor === loop } }

    /// Every share, in the loops' order.
    public var all: [PostgresLoopPool] { shares.map(\.pool) }

    /// Closes every share (each on its own loop).
    public func close() async {
        for share in shares { await share.pool.close() }
    }

    /// The shares' figures summed.
    public var statistics: PostgresLoopPool.Statistics {
        var sum = shares[0].pool.statistics
        for share in shares.dropFirst() {
            let figures = share.pool.statistics
            sum.open += figures.open
            sum.inUse += figures.inUse
            sum.waiting += figures.waiting
            sum.maxConnections += figures.maxConnections
        }
        return sum
    }

    /// `total` split over `parts`: as even as it goes, at least 1 each.
    public static func split(_ total: Int, over parts: Int) -> [Int] {
        let parts = max(1, parts)
        return (0..<parts).map { max(1, total / parts + ($0 < total % parts ? 1 : 0)) }
    }
}
