import Foundation
import TestSupport
import TrunkSync
import XCTest

/// The documentation in config/ must not drift from the settings the code reads.
final class ConfigurationFilesTests: XCTestCase {
    func testDefaultsFileListsEverySettingWithItsDefault() throws {
        let path = repositoryRoot() + "/config/defaults.json"
        let object = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any]
        let keys = Set((object ?? [:]).keys.filter { !$0.hasPrefix("_") })
        XCTAssertEqual(keys, Set(Setting.all.map(\.key)))
        let loaded = try Configuration.load(file: path, environment: [:])
        let builtIn = try Configuration.load(environment: [:])
        XCTAssertEqual(loaded.redactedDescription.replacingOccurrences(of: "[config file \(path)]", with: "[default]"),
                       builtIn.redactedDescription)
    }

    func testProductionExampleLoadsAndHoldsNoSecret() throws {
        let path = repositoryRoot() + "/config/production.example.json"
        let configuration = try Configuration.load(
            file: path, environment: ["TRUNK_SYNC_SMTP_URL": "smtp://mail.example.com:587"])
        XCTAssertEqual(configuration.mailer, .smtp)
        let text = try String(contentsOfFile: path, encoding: .utf8)
        for secret in Setting.all where secret.isSecret { XCTAssertFalse(text.contains("\"\(secret.key)\""), secret.key) }
    }

    func testReadmeDocumentsEveryVariable() throws {
        let readme = try String(contentsOfFile: repositoryRoot() + "/config/README.md", encoding: .utf8)
        for setting in Setting.all {
            XCTAssertTrue(readme.contains("`\(setting.environmentVariable)`"), setting.environmentVariable)
        }
    }
}
