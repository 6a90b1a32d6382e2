/// An event loop that drives non-blocking connections (`PostgresLoopPool`): a task executor
/// whose thread also waits on sockets. The HTTP server's loop is one (its `LoopExecutor`).
///
/// Everything a loop-driven connection does happens on the loop's thread: queries are
/// sent from the task that runs there, replies are read when the socket is readable, and
/// the waiting task is resumed there too — a query costs no thread hop.
public protocol PostgresEventLoop: TaskExecutor {
    /// True on the loop's thread.
    var isOnLoopThread: Bool { get }

    /// False once the loop has stopped waiting on sockets: nothing watched is reported any
    /// more (jobs still run, one at a time).
    var isRunning: Bool { get }

    /// Reports readiness of `fd` to `handler`, on the loop's thread (level-triggered):
    /// readable (or hung up) always, writable while `writable` is true. Called again for
    /// the same descriptor, it changes `writable`. Only on the loop's thread.
    func watch(_ fd: Int32, writable: Bool, handler: @escaping (PostgresIOReadiness) -> Void)

    /// Stops reporting `fd`; before the descriptor is closed. Only on the loop's thread.
    func unwatch(_ fd: Int32)
}

/// What a watched descriptor is ready for.
public struct PostgresIOReadiness: Sendable {
    /// Data (or end of file, or an error) to read.
    public var readable: Bool
    /// Room to write.
    public var writable: Bool

    /// Readiness as reported by the loop.
    public init(readable: Bool, writable: Bool) {
        self.readable = readable
        self.writable = writable
    }
}
