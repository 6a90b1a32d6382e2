import HTTPServer
import Postgres

/// The HTTP loop drives the database connections of the hot routes (`PostgresLoopPool`).
extension LoopExecutor: PostgresEventLoop {
    public func watch(_ fd: Int32, writable: Bool, handler: @escaping (PostgresIOReadiness) -> Void) {
        watch(fd, writable: writable) { readable, writable in
            handler(PostgresIOReadiness(readable: readable, writable: writable))
        }
    }
}
