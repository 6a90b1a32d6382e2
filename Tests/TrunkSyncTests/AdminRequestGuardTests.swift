import HTTPServer
import XCTest

@testable import TrunkSync

/// Which `Host` values the admin listener answers to, by the address it binds (the
/// end-to-end test covers loopback, the default, with `Origin` and media types).
final class AdminRequestGuardTests: XCTestCase {
    func head(host: String?) -> HTTPRequestHead {
        var headers: HTTPHeaders = [:]
        if let host { headers.append(name: "Host", value: host) }
        return HTTPRequestHead(
            method: .get, target: "/metrics", path: "/metrics", query: nil, version: .init(major: 1, minor: 1),
            headers: headers, keepAlive: true, expectsContinue: false, bodyFraming: .empty)
    }

    func allowed(_ guardian: AdminRequestGuard, _ host: String) -> Bool {
        guardian.check(head(host: host), endpoint: nil) == nil
    }

    func testAWildcardListenerTakesAnyAddressLocalhostAndItsNamesOnly() {
        for bind in ["0.0.0.0", "::"] {
            let guardian = AdminRequestGuard(bindHost: bind, hostnames: ["trunk-sync"])
            for host in [
                "10.1.2.3:9090", "192.0.2.1", "[2001:db8::1]:9090", "localhost:9090", "trunk-sync:9090", "TRUNK-SYNC",
            ] {
                XCTAssertTrue(allowed(guardian, host), "\(bind) \(host)")
            }
            for host in ["evil.example", "trunk-sync.evil.example", "10.1.2.3:x", "[::1", "a:b:c", ""] {
                XCTAssertFalse(allowed(guardian, host), "\(bind) \(host)")
            }
        }
    }

    func testAListenerOnOneAddressTakesThatAddressAndItsNames() {
        let guardian = AdminRequestGuard(bindHost: "10.0.0.5", hostnames: ["console.internal"])
        for host in ["10.0.0.5", "10.0.0.5:9090", "console.internal:443"] {
            XCTAssertTrue(allowed(guardian, host), host)
        }
        // Not loopback: localhost is someone else's name here, and other addresses are not this one.
        for host in ["localhost", "127.0.0.1", "10.0.0.6", "[::1]:9090", "evil.example"] {
            XCTAssertFalse(allowed(guardian, host), host)
        }
        let named = AdminRequestGuard(bindHost: "Metrics.Internal", hostnames: [])
        XCTAssertTrue(allowed(named, "metrics.internal:9090"))
        XCTAssertFalse(allowed(named, "localhost"))
    }

    func testARefusalIsA421JSONErrorAndNoHostIsATool() {
        let guardian = AdminRequestGuard(bindHost: "127.0.0.1", hostnames: [])
        let refusal = guardian.check(head(host: "rebind.example"), endpoint: nil)
        XCTAssertEqual(refusal?.status, 421)
        XCTAssertEqual(refusal?.code, "host_not_allowed")
        XCTAssertNil(guardian.check(head(host: nil), endpoint: nil), "HTTP/1.0 without Host")
    }
}
