/// One Realtime socket's allowance of messages of a kind: `perSecond` on average, up to
/// `burst` at once (a token bucket, kept as the time its next message is due: GCRA, exact in
/// `Duration`s). Each socket has its own (`RealtimeSession`): one for its messages of any kind
/// and one for its joins. Pure: the caller says what time it is.
struct RealtimeRateLimit: Sendable {
    let perSecond: Int
    let burst: Int
    /// The time one message takes back from the allowance.
    private let interval: Duration
    /// How far ahead of now `due` may run: `burst - 1` intervals.
    private let tolerance: Duration
    /// When the allowance would be whole again but for the messages taken: a message is
    /// taken while this is at most `tolerance` ahead of now.
    private var due: ContinuousClock.Instant?

    init(perSecond: Int, burst: Int) {
        self.perSecond = max(1, perSecond)
        self.burst = max(1, burst)
        interval = .seconds(1) / self.perSecond
        tolerance = interval * (self.burst - 1)
    }

    /// Takes one message at `now`; false (and nothing taken) when the allowance is spent.
    mutating func take(at now: ContinuousClock.Instant) -> Bool {
        let due = self.due ?? now
        guard due - now <= tolerance else { return false }
        self.due = max(due, now) + interval
        return true
    }
}
