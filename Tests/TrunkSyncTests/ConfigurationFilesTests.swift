import Foundation
import TestSupport
import TrunkSync
import XCTest

/// The documentation in config/ must not drift from the settings the code reads.
final class ConfigurationFilesTests: XCTestCase {
    func testDefaultsFileListsEverySettingWithItsDefault() throws {
        let path = repositoryRoot() + "/config/defaults.json"
        let object =
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any]
        let keys = Set((object ?? [:]).keys.filter { !$0.hasPrefix("_") })
        XCTAssertEqual(keys, Set(Setting.all.map(\.key)))
        let loaded = try Configuration.load(file: path, environment: [:])
        let builtIn = try Configuration.load(environment: [:])
        XCTAssertEqual(
            loaded.redactedDescription.replacingOccurrences(of: "[config file \(path)]", with: "[default]"),
            builtIn.redactedDescription)
    }

    func testProductionExampleLoadsAndHoldsNoSecret() throws {
        let path = repositoryRoot() + "/config/production.example.json"
        let configuration = try Configuration.load(
            file: path, environment: ["TRUNK_SYNC_SMTP_URL": "smtp://mail.example.com:587"])
        XCTAssertEqual(configuration.mailer, .smtp)
        let text = try String(contentsOfFile: path, encoding: .utf8)
        for secret in Setting.all where secret.isSecret {
            XCTAssertFalse(text.contains("\"\(secret.key)\""), secret.key)
        }
    }

    func testReadmeDocumentsEveryVariable() throws {
        let readme = try String(contentsOfFile: repositoryRoot() + "/config/README.md", encoding: .utf8)
        for setting in Setting.all {
            XCTAssertTrue(readme.contains("`\(setting.environmentVariable)`"), setting.environmentVariable)
        }
    }

    /// config/defaults.json and the settings table of config/README.md are generated from
    /// `Setting.all`: a setting changed in one place only fails here.
    func testGeneratedFilesMatchTheSettings() throws {
        let regenerate = "run scripts/config-generate.sh (make config-generate) and commit the result"
        let defaultsPath = repositoryRoot() + "/config/defaults.json"
        let defaults = try String(contentsOfFile: defaultsPath, encoding: .utf8)
        XCTAssertTrue(
            defaults == SettingsDocument.defaultsJSON,
            "config/defaults.json differs from what Setting.swift generates ("
                + "\(firstDifference(defaults, SettingsDocument.defaultsJSON))): \(regenerate)")

        let readmePath = repositoryRoot() + "/config/README.md"
        let readme = try String(contentsOfFile: readmePath, encoding: .utf8)
        let regenerated = try XCTUnwrap(
            SettingsDocument.readme(replacingTableIn: readme),
            "config/README.md lacks the marker lines around its settings table (\(SettingsDocument.tableStart))")
        XCTAssertTrue(
            readme == regenerated,
            "config/README.md's settings table differs from what Setting.swift generates ("
                + "\(firstDifference(readme, regenerated))): \(regenerate)")
    }

    /// The generator keeps the prose around the table and replaces only what is between the
    /// markers; a README without them is reported, not rewritten.
    func testReadmeTableIsReplacedBetweenItsMarkersOnly() throws {
        let stale = "intro\n\n\(SettingsDocument.tableStart)\n\n| old |\n\n\(SettingsDocument.tableEnd)\n\nafter\n"
        let regenerated = try XCTUnwrap(SettingsDocument.readme(replacingTableIn: stale))
        let table = SettingsDocument.markdownTable
        XCTAssertEqual(
            regenerated, "intro\n\n\(SettingsDocument.tableStart)\n\n\(table)\n\(SettingsDocument.tableEnd)\n\nafter\n")
        XCTAssertEqual(SettingsDocument.readme(replacingTableIn: regenerated), regenerated)
        XCTAssertNil(SettingsDocument.readme(replacingTableIn: "no markers here\n"))
        XCTAssertNil(SettingsDocument.readme(replacingTableIn: SettingsDocument.tableStart + "\nno end marker\n"))
    }

    /// The typed defaults (`Configuration`'s properties before loading, and the settings
    /// structs) are read from `Setting`: loading with nothing set gives exactly them.
    func testTypedDefaultsAreTheSettingsDefaults() throws {
        for setting in Setting.all {
            guard let value = setting.defaultValue else { continue }
            switch setting.kind {
            case .integer(let range): XCTAssertTrue(Int(value).map(range.contains) ?? false, setting.key)
            case .seconds(let maximum):
                XCTAssertTrue(Double(value).map { $0 > 0 && $0 <= maximum } ?? false, setting.key)
            case .rule: XCTAssertEqual(value.split(separator: "/").compactMap { Int($0) }.count, 2, setting.key)
            case .text, .list: break
            }
        }
        let loaded = try Configuration.load(environment: [:])
        let auth = AuthSettings()
        XCTAssertEqual(loaded.auth.otpLifetime, auth.otpLifetime)
        XCTAssertEqual(loaded.auth.otpFailureRule, auth.otpFailureRule)
        XCTAssertEqual(loaded.auth.mailRule, auth.mailRule)
        XCTAssertEqual(auth.tokenRule, RateLimiter.Rule(limit: 150, window: 300))
        XCTAssertEqual(loaded.streams.bufferBytes, EventStreams.Settings().bufferBytes)
        XCTAssertEqual(loaded.realtime.idleTimeout, RealtimeFeed.Settings().idleTimeout)
        XCTAssertEqual(loaded.port, 8080)
        XCTAssertEqual(loaded.httpHeaderTimeout, 10)
        XCTAssertEqual(loaded.mailer, .log)
    }

    /// Where two texts first differ, as "line N: committed … generated …".
    private func firstDifference(_ committed: String, _ generated: String) -> String {
        let old = committed.components(separatedBy: "\n")
        let new = generated.components(separatedBy: "\n")
        for index in 0..<max(old.count, new.count) {
            let left = index < old.count ? old[index] : "(end of file)"
            let right = index < new.count ? new[index] : "(end of file)"
            if left != right {
                return "line \(index + 1): committed \(left.prefix(100)), generated \(right.prefix(100))"
            }
        }
        return "same lines"
    }
}
