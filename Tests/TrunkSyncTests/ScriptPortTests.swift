import Foundation
import TestSupport
import XCTest

/// The scripts pick the ports of the servers they start as `serverPort()` does: below the
/// kernel's ephemeral range, where no outgoing connection can take one before the server
/// binds it.
final class ScriptPortTests: XCTestCase {
    func testServerPortIsFreeAndBelowTheEphemeralRange() throws {
        let range = try String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)
        let low = try XCTUnwrap(range.split(whereSeparator: \.isWhitespace).first.flatMap { Int($0) })
        let script = """
            import sys
            sys.dont_write_bytecode = True
            sys.path.insert(0, sys.argv[1])
            from server_port import server_port
            print(" ".join(str(server_port()) for _ in range(50)))
            """
        let result = try Command.run("/usr/bin/python3", ["-c", script, repositoryRoot() + "/scripts"])
        XCTAssertEqual(result.status, 0, result.stderr)
        let ports = result.stdout.split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        XCTAssertEqual(ports.count, 50, result.stdout)
        for port in ports { XCTAssert(port >= 1024 && port < low, "\(port) not in 1024..<\(low)") }
        let printed = try Command.run("/usr/bin/python3", [repositoryRoot() + "/scripts/server_port.py"])
        XCTAssertEqual(printed.status, 0, printed.stderr)
        XCTAssertNotNil(Int(printed.stdout.trimmingCharacters(in: .whitespacesAndNewlines)), printed.stdout)
    }

    /// No script picks a port by binding port 0 and releasing it for a server to bind later.
    func testNoScriptPicksAServersPortByBindingPortZero() throws {
        let root = repositoryRoot()
        let enumerator = try XCTUnwrap(FileManager.default.enumerator(atPath: root + "/scripts"))
        var files = enumerator.compactMap { $0 as? String }.map { "scripts/" + $0 }
        let bench = try XCTUnwrap(FileManager.default.enumerator(atPath: root + "/bench"))
        files += bench.compactMap { $0 as? String }.map { "bench/" + $0 }
        files.append("Makefile")
        var checked = 0
        for file in files where file == "Makefile" || file.hasSuffix(".sh") || file.hasSuffix(".py") {
            let text = try String(contentsOfFile: root + "/" + file, encoding: .utf8)
            checked += 1
            XCTAssertFalse(text.contains(/bind\(\(\s*["'][^"']*["']\s*,\s*0\s*\)\)/), "\(file) binds port 0")
        }
        XCTAssertGreaterThan(checked, 10)
    }
}
