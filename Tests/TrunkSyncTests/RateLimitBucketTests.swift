import TrunkCrypto
import TrunkSync
import XCTest

/// What the per-client and per-address rate limits count by (pure: no database).
final class RateLimitBucketTests: XCTestCase {
    func testIPv6ClientsAreCountedByTheirSlash64() {
        XCTAssertEqual(RateLimiter.clientBucket("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::/64")
        XCTAssertEqual(RateLimiter.clientBucket("2001:db8:1:2::1"), "2001:db8:1:2::/64")
        XCTAssertEqual(RateLimiter.clientBucket("2001:DB8:1:2::ffff"), "2001:db8:1:2::/64")
        XCTAssertEqual(RateLimiter.clientBucket("2001:db8:1:3::1"), "2001:db8:1:3::/64")
        XCTAssertEqual(RateLimiter.clientBucket("::1"), "::/64")
    }

    func testIPv4ClientsAreCountedByTheirAddress() {
        XCTAssertEqual(RateLimiter.clientBucket("192.0.2.1"), "192.0.2.1")
        XCTAssertEqual(RateLimiter.clientBucket("::ffff:192.0.2.1"), "192.0.2.1")
        XCTAssertNotEqual(RateLimiter.clientBucket("192.0.2.1"), RateLimiter.clientBucket("192.0.2.2"))
    }

    func testTextThatIsNotAnAddressIsItsOwnBucket() {
        XCTAssertEqual(RateLimiter.clientBucket("cli"), "cli")
        XCTAssertEqual(RateLimiter.clientBucket(""), "")
    }

    func testEmailBucketsKeepNoAddress() {
        let bucket = RateLimiter.emailBucket("someone@example.com")
        XCTAssertEqual(bucket, Hex.encode(SHA256.hash("someone@example.com")))
        XCTAssertEqual(bucket.count, 64)
        XCTAssertFalse(bucket.contains("example"))
        XCTAssertNotEqual(bucket, RateLimiter.emailBucket("someone@example.org"))
    }
}
