import HTTPServer
import Postgres
import TrunkCrypto

/// Fixed-window counters kept in Postgres (table `rate_limits`), so every server instance
/// shares them.
public struct RateLimiter: Sendable {
    /// A limit: at most `limit` hits per `window` seconds.
    public struct Rule: Sendable, Equatable {
        public var limit: Int
        public var window: Int
        public init(limit: Int, window: Int) {
            self.limit = limit
            self.window = window
        }
    }

    /// The bucket part for a client address: an IPv4 address as it is, an IPv6 address as
    /// its /64 (`2001:db8:1:2::/64`), so every address a host can pick from its prefix counts
    /// as one client. Text that is not an address (`cli`) is used as it is.
    public static func clientBucket(_ address: String) -> String {
        IPAddress(address)?.clientText ?? address
    }

    /// The bucket part for an email address: its SHA-256 in hex, so the counters keep no
    /// list of the addresses people tried (accounts or not).
    public static func emailBucket(_ normalizedEmail: String) -> String {
        Hex.encode(SHA256.hash(normalizedEmail))
    }

    /// Counts one hit in `bucket` and returns nil when allowed, or the seconds until the
    /// window ends when the limit is exceeded. Runs inside the caller's transaction.
    public static func hit(_ bucket: String, rule: Rule, on tx: Transaction) async throws -> Int? {
        let row = try await tx.query(
            """
            with window_start as (
              select to_timestamp(floor(extract(epoch from now()) / $2) * $2) as at
            )
            insert into rate_limits (bucket, window_start, hits)
            select $1, at, 1 from window_start
            on conflict (bucket, window_start) do update set hits = rate_limits.hits + 1
            returning hits, ceil(extract(epoch from window_start + make_interval(secs => $2) - now()))::int8
            """, bucket, Int64(rule.window))[0]
        let hits = try row.decode(Int.self, column: 0)
        let remaining = try row.decode(Int.self, column: 1)
        if hits % 100 == 0 {
            // Old windows are useless; trim them now and then.
            try await tx.query("delete from rate_limits where window_start < now() - interval '1 day'")
        }
        return hits > rule.limit ? max(1, remaining) : nil
    }
}
