import Foundation

/// A window length, in seconds, for a `TRUNK_SYNC_RATE_LIMIT_*` rule that a test counts up
/// to: the rate limiter's windows are fixed and start at multiples of their length (since the
/// epoch), so a window that ends while the test counts starts the count over, and a request
/// the test expects refused is allowed. The first length from `base` up whose current window
/// has `margin` seconds or more left (of a hundred lengths, each ending in another second,
/// one fits whenever the test starts).
public func rateWindow(_ base: Int = 300, margin: Int = 120) -> Int {
    let now = Int(Date().timeIntervalSince1970)
    return (base..<(base + 100)).first { now % $0 <= $0 - margin } ?? base
}
