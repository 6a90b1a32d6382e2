import Foundation
import TestSupport
import XCTest

/// The scripts behind `make run` and `make test`, run as developers run them.
final class DevScriptsTests: XCTestCase {
    func freePort() throws -> Int {
        let result = try Command.run(
            "/usr/bin/python3",
            ["-c", "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"])
        return try XCTUnwrap(Int(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
    }

    /// The cluster's directory holds its Unix socket, and local connections through it are
    /// trusted as the superuser: only the developer (or `postgres` when run as root) may
    /// enter it. A directory left world-readable by an older pg.sh is tightened on start.
    func testPrivateClusterDirectoryAndSocketAreOwnerOnly() throws {
        let parent = NSTemporaryDirectory() + "pgdir-" + UUID().uuidString
        let directory = parent + "/pg"
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        defer { try? FileManager.default.removeItem(atPath: parent) }
        let script = repositoryRoot() + "/scripts/pg.sh"
        let port = try freePort()
        // spawnAndWait: the server pg.sh starts would keep a pipe of `Command.run` open.
        XCTAssertEqual(try Command.spawnAndWait(script, ["start", directory, String(port)]), 0)
        defer { _ = try? Command.spawnAndWait(script, ["stop", directory]) }

        let mode = try XCTUnwrap(try FileManager.default.attributesOfItem(atPath: directory)[.posixPermissions] as? Int)
        XCTAssertEqual(String(mode, radix: 8), "700", "the cluster directory (socket directory) is owner-only")
        let socket = directory + "/.s.PGSQL.\(port)"
        let socketMode = try XCTUnwrap(try FileManager.default.attributesOfItem(atPath: socket)[.posixPermissions] as? Int)
        XCTAssertEqual(String(socketMode, radix: 8), "700", "the socket itself is owner-only")

        // As root the test can try what another local user could do: connect through the
        // socket, which pg_hba trusts, as the superuser.
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/sbin/runuser") else { return }
        let stranger = try Command.run(
            "/usr/sbin/runuser",
            ["-u", "nobody", "--", "psql", "-h", directory, "-p", String(port), "-U", "trunk", "-d", "postgres", "-tAc", "select 1"])
        XCTAssertNotEqual(stranger.status, 0, "another local user connected: \(stranger.stdout)")
        XCTAssertFalse(stranger.stdout.contains("1"), stranger.stdout)
    }
}
