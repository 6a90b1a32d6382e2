import CSystem
import Foundation

/// Monotonic time in nanoseconds (`CLOCK_MONOTONIC`, the clock the conditions wait on).
func monotonicNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

/// Starts a named thread (visible in gdb, top and crash reports) that runs `body` once. It
/// is joinable and registered: the command line joins every such thread before the process
/// exits (`csystem_threads_join_all`), so none is inside libpq or OpenSSL while their
/// clean-up runs. Code outside the module that runs libpq on a thread of its own (the
/// import's readers) starts it here for the same reason.
public func startThread(name: String, stackSize: Int = 1 << 20, _ body: @escaping @Sendable () -> Void) {
    guard startThreadIfPossible(name: name, stackSize: stackSize, body) else {
        preconditionFailure("cannot start thread \(name)")  // out of threads or memory
    }
}

/// `startThread`, reporting failure (out of threads or memory) instead of stopping the process.
public func startThreadIfPossible(name: String, stackSize: Int = 1 << 20, _ body: @escaping @Sendable () -> Void)
    -> Bool
{
    let context = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    let entry: @convention(c) (UnsafeMutableRawPointer?) -> Void = { context in
        guard let context else { return }
        Unmanaged<ThreadBody>.fromOpaque(context).takeRetainedValue().body()
    }
    guard csystem_thread_start(name, stackSize, entry, context) == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(context).release()
        return false
    }
    return true
}

/// A thread's work, carried through C.
private final class ThreadBody: Sendable {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}
