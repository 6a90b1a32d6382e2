import Foundation

/// Waits (polling every 10 ms, at most `seconds`) until `condition` holds, and returns whether
/// it did: how tests wait for something to happen, instead of sleeping a fixed time and hoping.
/// Give a generous `seconds` (the machine may be loaded); a condition that holds returns at once.
public func waitUntil(_ seconds: Double, _ condition: @Sendable () async throws -> Bool) async rethrows -> Bool {
    let deadline = Date(timeIntervalSinceNow: seconds)
    while true {
        if try await condition() { return true }
        if Date() > deadline { return false }
        try? await Task.sleep(nanoseconds: 10_000_000)
    }
}
