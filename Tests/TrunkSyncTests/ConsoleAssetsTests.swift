import Foundation
import TestSupport
import XCTest

@testable import TrunkSync

/// The console's files: the binary serves exactly console/ (scripts/console-embed.sh), and
/// nothing in them needs more than the page's policy (`default-src 'self'`) allows.
final class ConsoleAssetsTests: XCTestCase {
    static let directory = repositoryRoot() + "/console"

    func sources() throws -> [String: [UInt8]] {
        let names = try FileManager.default.contentsOfDirectory(atPath: Self.directory).filter {
            !$0.hasPrefix("README")
        }
        return try Dictionary(
            uniqueKeysWithValues: names.map { name in
                (name, Array(try Data(contentsOf: URL(fileURLWithPath: Self.directory + "/" + name))))
            })
    }

    func testEmbeddedFilesAreConsoleDirectoryByteForByte() throws {
        let sources = try sources()
        XCTAssertEqual(Set(ConsoleAssets.files.keys), Set(sources.keys), "run scripts/console-embed.sh")
        for (name, bytes) in sources {
            XCTAssertTrue(ConsoleAssets.files[name]?.bytes == bytes, "\(name) differs: run scripts/console-embed.sh")
        }
        XCTAssertEqual(ConsoleAssets.files["index.html"]?.contentType, "text/html; charset=utf-8")
        XCTAssertEqual(ConsoleAssets.files["app.js"]?.contentType, "text/javascript; charset=utf-8")
    }

    /// No inline script or style (the policy refuses both), no file from another host, no
    /// HTML built from strings (`innerHTML`: data reaches the page as text only), no eval.
    func testNothingNeedsMoreThanTheContentSecurityPolicyAllows() throws {
        for (name, bytes) in try sources() {
            let text = String(decoding: bytes, as: UTF8.self)
            // The SVG namespace (the icon's attribute, chart.js's createElementNS) names no host
            // anything is loaded from.
            let withoutNamespace = text.replacingOccurrences(of: #"xmlns="http://www.w3.org/2000/svg""#, with: "")
                .replacingOccurrences(of: "'http://www.w3.org/2000/svg'", with: "")
            XCTAssertFalse(
                withoutNamespace.contains("http://") || withoutNamespace.contains("https://"),
                "\(name) names another host")
            XCTAssertNil(text.firstMatch(of: /\sstyle\s*=/), "\(name) has an inline style attribute")
            XCTAssertNil(text.firstMatch(of: /<style/), "\(name) has an inline stylesheet")
            XCTAssertNil(text.firstMatch(of: /\son[a-z]+\s*=\s*"/), "\(name) has an inline event handler")
            for forbidden in [
                "innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
            ] {
                XCTAssertFalse(text.contains(forbidden), "\(name) uses \(forbidden)")
            }
            if name.hasSuffix(".html") {
                for script in text.matches(of: /<script([^>]*)>/) {
                    XCTAssertTrue(
                        script.1.contains("src=\"/console/"), "\(name): every script is a file of the console")
                }
            }
        }
    }
}
