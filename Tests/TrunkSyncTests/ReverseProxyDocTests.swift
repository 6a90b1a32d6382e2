import Foundation
import TestSupport
import XCTest

/// The nginx configuration of docs/operations.md ("TLS through a reverse proxy"), run as
/// written (only its ports, certificate and log paths moved here) in front of a trunk-sync
/// that is not running, as while it restarts: an event stream's `?access_token=` must reach
/// none of nginx's logs. Its access log format leaves the query out; its error log, which has
/// no format, writes the whole request line of a request it could not pass on, so the
/// configuration keeps that log to `crit`.
final class ReverseProxyDocTests: XCTestCase {
    private var directory = ""
    private var nginx: Process?

    override func setUpWithError() throws {
        directory = NSTemporaryDirectory() + "proxy-doc-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory + "/logs", withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        if let nginx, nginx.isRunning {
            nginx.terminate()
            nginx.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    func testTheDocumentedProxyLogsNoAccessTokenWhileTrunkSyncIsDown() throws {
        guard let binary = ["/usr/sbin/nginx", "/usr/bin/nginx"].first(where: FileManager.default.isExecutableFile)
        else { throw XCTSkip("needs nginx (apt-get install nginx-light)") }
        let document = try String(contentsOfFile: repositoryRoot() + "/docs/operations.md", encoding: .utf8)
        let block = try XCTUnwrap(document.components(separatedBy: "```nginx\n").dropFirst().first)
        var site = try XCTUnwrap(block.components(separatedBy: "```").first)
        let (upstream, listen) = (try serverPort(), try serverPort())
        for (from, to) in [
            ("server 127.0.0.1:8080;", "server 127.0.0.1:\(upstream);"),
            ("listen 443 ssl http2;", "listen 127.0.0.1:\(listen) ssl http2;"),
            ("/etc/letsencrypt/live/sync.example.com/fullchain.pem", directory + "/cert.pem"),
            ("/etc/letsencrypt/live/sync.example.com/privkey.pem", directory + "/key.pem"),
            ("/var/log/nginx/", directory + "/logs/"),
        ] {
            XCTAssertTrue(site.contains(from), "the documented configuration has \(from)")
            site = site.replacingOccurrences(of: from, with: to)
        }
        let certificate = try Command.run(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=sync.example.com",
                "-keyout", directory + "/key.pem", "-out", directory + "/cert.pem",
            ])
        XCTAssertEqual(certificate.status, 0, certificate.stderr)
        try site.write(toFile: directory + "/site.conf", atomically: true, encoding: .utf8)
        let temporary = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"].map {
            "\($0)_temp_path \(directory)/\($0);"
        }
        let main = """
            daemon off;
            worker_processes 1;
            pid \(directory)/nginx.pid;
            error_log \(directory)/logs/main-error.log info;
            events { worker_connections 64; }
            http {
                \(temporary.joined(separator: "\n    "))
                access_log \(directory)/logs/main-access.log;
                include \(directory)/site.conf;
            }

            """
        try main.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["-c", directory + "/nginx.conf", "-p", directory + "/"]
        process.standardError = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
        nginx = process

        let token = "eyJhbGciOiJIUzI1NiJ9.proxy-doc-\(UUID().uuidString).signature"
        var status = ""
        for _ in 0..<200 where process.isRunning {
            let answer = try Command.run(
                "/usr/bin/curl",
                [
                    "-sk", "-o", "/dev/null", "-w", "%{http_code}", "--resolve",
                    "sync.example.com:\(listen):127.0.0.1", "-H", "Accept: text/event-stream",
                    "https://sync.example.com:\(listen)/sync/v1/stream?access_token=\(token)",
                ])
            status = answer.stdout
            if status != "000" { break }  // nginx not listening yet
            usleep(50_000)
        }
        XCTAssertEqual(status, "502", "the stream through the proxy, trunk-sync down")
        process.terminate()  // SIGTERM: nginx writes and closes its logs, then exits
        process.waitUntilExit()

        let logs = try FileManager.default.contentsOfDirectory(atPath: directory + "/logs")
        var everything = ""
        for name in logs {
            let text = try String(contentsOfFile: "\(directory)/logs/\(name)", encoding: .utf8)
            XCTAssertFalse(text.contains(token), "\(name) holds the access token:\n\(text)")
            everything += text
        }
        // The request was logged, without its query.
        XCTAssertTrue(everything.contains("\"GET /sync/v1/stream HTTP/2.0\" 502"), everything)
    }
}
