import Foundation
import TestSupport
import TrunkSync
import XCTest

/// URL settings left on a host under example.com, example.net or example.org (RFC 2606), as
/// .env.example ships them, are accepted with one warning line: a deployment left so would
/// mail sign-in links to sync.example.com.
final class DocumentationHostWarningTests: XCTestCase {
    func testExampleHostsAreNamedInOneLine() throws {
        let example = try Configuration.load(environment: [
            "TRUNK_SYNC_PUBLIC_URL": "https://sync.example.com", "TRUNK_SYNC_CORS_ORIGINS": "https://app.example.com",
            "TRUNK_SYNC_MAIL_FROM": "Trunk <no-reply@example.com>",
        ])
        let warning = try XCTUnwrap(example.documentationHostWarning)
        XCTAssertTrue(
            warning.hasPrefix(
                "TRUNK_SYNC_PUBLIC_URL, TRUNK_SYNC_CORS_ORIGINS, TRUNK_SYNC_MAIL_FROM name hosts under example.com, example.net or example.org"
            ), warning)
        XCTAssertFalse(warning.contains("\n"))
        // The names themselves and any name under them, in any case; nothing else.
        for (url, named) in [
            ("https://example.org", true), ("https://a.b.EXAMPLE.net:8443", true), ("http://sync.example.com.", true),
            ("https://example.community", false), ("https://notexample.com", false), ("https://example.com.au", false),
            ("https://sync.trunk.example", false), ("http://127.0.0.1:8080", false),
        ] {
            let configuration = try Configuration.load(environment: ["TRUNK_SYNC_PUBLIC_URL": url])
            XCTAssertEqual(configuration.documentationHostWarning != nil, named, url)
        }
        let issuers = try Configuration.load(environment: [
            "TRUNK_SYNC_ACCEPTED_ISSUERS": "https://abc.supabase.co/auth/v1, https://old.example.org/auth/v1",
            "TRUNK_SYNC_CORS_ORIGINS": "*",
        ])
        XCTAssertTrue(
            issuers.documentationHostWarning?.hasPrefix("TRUNK_SYNC_ACCEPTED_ISSUERS names a host under") ?? false,
            "\(issuers.documentationHostWarning ?? "none")")
        XCTAssertNil(try Configuration.load(environment: [:]).documentationHostWarning, "the defaults")
        // A warning, not a refusal.
        XCTAssertNoThrow(
            try Configuration.load(environment: [
                "TRUNK_SYNC_PUBLIC_URL": "https://sync.example.com", "TRUNK_SYNC_DATABASE_URL": "postgres://u:pw@h/d",
                "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
            ]).validateForServe())
    }

    /// `config check` logs it once, on stderr, and still says the configuration is OK.
    func testConfigCheckWarnsOnceAndPasses() throws {
        let environment = [
            "TRUNK_SYNC_DATABASE_URL": "postgres://u:pw@127.0.0.1:1/d", "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
            "TRUNK_SYNC_PUBLIC_URL": "https://sync.example.com", "TRUNK_SYNC_CORS_ORIGINS": "https://app.example.com",
        ]
        let result = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"], environment: Command.environment(environment))
        XCTAssertEqual(result.status, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("configuration OK"), result.stdout)
        let lines = result.stderr.split(separator: "\n").filter { $0.contains("RFC 2606") }
        XCTAssertEqual(lines.count, 1, result.stderr)
        XCTAssertTrue(lines.first?.contains("TRUNK_SYNC_PUBLIC_URL, TRUNK_SYNC_CORS_ORIGINS name hosts") ?? false)
        // Real names: no warning.
        var own = environment
        own["TRUNK_SYNC_PUBLIC_URL"] = "https://sync.trunk.dev"
        own["TRUNK_SYNC_CORS_ORIGINS"] = "https://app.trunk.dev"
        let quiet = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"], environment: Command.environment(own))
        XCTAssertEqual(quiet.status, 0, quiet.stderr)
        XCTAssertFalse(quiet.stderr.contains("RFC 2606"), quiet.stderr)
    }
}
