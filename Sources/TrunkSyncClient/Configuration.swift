import Foundation

extension TrunkSyncClient {
    /// Tuning of a client. The defaults fit the server's limits (docs/api.md, "Limits and errors").
    public struct Configuration: Sendable {
        /// Most events per push; the server takes at most 1000.
        public var maxBatchEvents = 500
        /// Most payload bytes per push; the server takes bodies of at most 10 MiB.
        public var maxBatchBytes = 4 * 1024 * 1024
        /// Events per pulled page (1…1000).
        public var pullLimit = 500
        /// Seconds a long-poll of `liveEvents()` waits for new events (1…60).
        public var longPollWait = 30
        /// Retries of failed requests.
        public var retry = RetryPolicy()
        /// Whether `liveEvents()` keeps retrying failures that are worth retrying (network,
        /// 429, 503, an answer that is not the server's) forever, with backoff, instead of
        /// ending after `retry.maxAttempts`.
        public var liveRetriesForever = true
        /// Refresh the access token when it expires within this many seconds (at most half
        /// of the token's lifetime is used).
        public var refreshMargin: TimeInterval = 60
        /// Most bytes of an answer's body the client reads (all but the export's, which goes
        /// to a file as it comes): the server's are far smaller (a pulled page ~1.1 MiB at
        /// most, a push answer a few hundred KiB), so one past it is not the server's (a
        /// misbehaving proxy's endless `200`, say). The request is cancelled there, nothing of
        /// the body is kept, and the call fails as for any answer it cannot read
        /// (`.invalidResponse`; the live loop retries it with backoff).
        public var maxAnswerBytes = 32 * 1024 * 1024
        /// Seconds a request (other than a long-poll) may take.
        public var requestTimeout: TimeInterval = 30
        /// Sent as `apikey` when the server requires `TRUNK_SYNC_API_KEY`.
        public var apiKey: String? = nil
        /// Told of requests, retries, refreshes, pushed batches and applied pages; called on
        /// the client's actor, so it must return quickly.
        public var observer: (@Sendable (ClientEvent) -> Void)? = nil
        /// The clock that decides when a token expires (tests move it).
        public var now: @Sendable () -> Date = { Date() }

        public init() {}
    }

    /// When and how often a failed request is tried again.
    ///
    /// Worth retrying: network failures (the server down, a connection lost), `408`, `429`,
    /// `500`, `502`, `503`, `504`. A `429` or `503` with `Retry-After` waits exactly that
    /// long (plus up to 10 % jitter, so devices do not return in step); anything else waits
    /// `random(0…min(maxDelay, baseDelay · 2^attempt))` ("full jitter"). A `Retry-After`
    /// longer than `maxRetryAfter` is not waited out: the call throws
    /// `TrunkSyncError.rateLimited` and the app decides when to come back.
    public struct RetryPolicy: Sendable {
        /// Tries in all (the first one included).
        public var maxAttempts = 6
        public var baseDelay: TimeInterval = 0.5
        public var maxDelay: TimeInterval = 30
        public var maxRetryAfter: TimeInterval = 120

        public init(
            maxAttempts: Int = 6, baseDelay: TimeInterval = 0.5, maxDelay: TimeInterval = 30,
            maxRetryAfter: TimeInterval = 120
        ) {
            self.maxAttempts = maxAttempts
            self.baseDelay = baseDelay
            self.maxDelay = maxDelay
            self.maxRetryAfter = maxRetryAfter
        }

        /// The wait before try `attempt + 1` (`attempt` counts from 0) without `Retry-After`.
        public func backoff(attempt: Int) -> TimeInterval {
            let ceiling = min(maxDelay, baseDelay * pow(2, Double(min(attempt, 30))))
            return Double.random(in: 0...max(0, ceiling))
        }

        /// The wait a `Retry-After` of `seconds` asks for, with up to 10 % jitter.
        public func delay(retryAfter seconds: TimeInterval) -> TimeInterval {
            seconds + Double.random(in: 0...(max(seconds, 0.1) * 0.1))
        }
    }
}
