import Synchronization

/// Requests and `5xx` answers per minute over the last hour, for the console's overview chart.
///
/// A sampler (`Application`'s, every few seconds) hands it the running totals of
/// `Metrics.requestTotals()`; what arrived since the previous sample is added to the minute
/// the sample falls in. Sixty one-minute buckets in a fixed ring: the memory is the same after
/// a minute or a year, and requests pay nothing for it (the counters are the ones `/metrics`
/// already keeps).
final class RequestHistory: Sendable {
    static let minutes = 60

    private struct State {
        /// The minute (Unix seconds / 60) each slot counts, or -1 for none.
        var minute = [Int64](repeating: -1, count: RequestHistory.minutes)
        var requests = [UInt64](repeating: 0, count: RequestHistory.minutes)
        var errors = [UInt64](repeating: 0, count: RequestHistory.minutes)
        var last: (requests: UInt64, errors: UInt64)?
    }

    private let state = Mutex(State())
    /// When counting began, Unix seconds: minutes before it are not part of the history.
    let startedAt: Double

    init(startedAt: Double) { self.startedAt = startedAt }

    /// Adds what the totals grew by since the previous sample to the minute of `now`.
    func record(now: Double, requests: UInt64, errors: UInt64) {
        let minute = Int64((now / 60).rounded(.down))
        state.withLock { state in
            let slot = Int(minute % Int64(Self.minutes))
            if state.minute[slot] != minute {
                state.minute[slot] = minute
                state.requests[slot] = 0
                state.errors[slot] = 0
            }
            // The first sample counts from zero: requests answered before the sampler started.
            // Totals read before an earlier-recorded sample (the overview and the sampler race)
            // are behind it: they add nothing and are not kept, so nothing counts twice.
            let last = state.last ?? (0, 0)
            state.requests[slot] &+= requests > last.requests ? requests - last.requests : 0
            state.errors[slot] &+= errors > last.errors ? errors - last.errors : 0
            state.last = (max(requests, last.requests), max(errors, last.errors))
        }
    }

    /// One minute of the history: its start (Unix seconds) and the mean rates over the part
    /// of it the server was counting (the current minute: up to `now`).
    struct Minute: Sendable, Equatable {
        var start: Int64
        var requestsPerSecond: Double
        var errorsPerSecond: Double
    }

    /// The minutes from the later of an hour ago and the start up to the one `now` falls in,
    /// oldest first; minutes without requests are zeros.
    func minutes(now: Double) -> [Minute] {
        let current = Int64((now / 60).rounded(.down))
        let first = max(current - Int64(Self.minutes) + 1, Int64((startedAt / 60).rounded(.down)))
        guard first <= current else { return [] }
        return state.withLock { state in
            (first...current).map { minute in
                let slot = Int(minute % Int64(Self.minutes))
                let counted = state.minute[slot] == minute
                let from = max(Double(minute * 60), startedAt)
                let to = min(Double(minute * 60 + 60), max(now, from))
                let seconds = max(to - from, 1)
                func rate(_ count: UInt64) -> Double { counted ? (Double(count) / seconds * 1000).rounded() / 1000 : 0 }
                return Minute(
                    start: minute * 60, requestsPerSecond: rate(state.requests[slot]),
                    errorsPerSecond: rate(state.errors[slot]))
            }
        }
    }
}
