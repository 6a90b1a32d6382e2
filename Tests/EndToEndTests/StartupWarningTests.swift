import Foundation
import TestSupport
import XCTest

/// `serve` started with `.env.example`'s hosts (RFC 2606 names): it starts, and says so
/// once, in one line, before it listens.
final class StartupWarningTests: EndToEndTestCase {
    func testExampleHostsAreWarnedAboutOnceAtStartUp() throws {
        let server = try startServer([
            "TRUNK_SYNC_PUBLIC_URL": "https://sync.example.com", "TRUNK_SYNC_CORS_ORIGINS": "https://app.example.com",
        ])
        let response = try send(server, "GET", "/readyz")
        XCTAssertEqual(response.status, 200)
        let lines = server.logs.split(separator: "\n").filter { $0.contains("RFC 2606") }
        XCTAssertEqual(lines.count, 1, server.logs)
        XCTAssertTrue(
            lines.first?.contains("TRUNK_SYNC_PUBLIC_URL, TRUNK_SYNC_CORS_ORIGINS name hosts under example.com")
                ?? false, server.logs)
    }
}
