import Foundation
import TestSupport

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// One plain HTTP exchange (not through the client library), for checks like "is this
/// token still accepted".
func rawRequest(
    _ method: String, _ url: URL, token: String? = nil, body: String? = nil, timeout: TimeInterval = 30
) async throws -> (status: Int, body: String) {
    var request = URLRequest(url: url)
    request.httpMethod = method
    request.timeoutInterval = timeout
    if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
    if let body {
        request.httpBody = Data(body.utf8)
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
    }
    return try await withCheckedThrowingContinuation { continuation in
        URLSession.shared.dataTask(with: request) { data, response, error in
            if let error {
                continuation.resume(throwing: error)
            } else {
                continuation.resume(
                    returning: (
                        (response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data ?? Data(), as: UTF8.self)
                    ))
            }
        }.resume()
    }
}

/// The example executable in a child process, with pipes on stdin, stdout and stderr.
final class ExampleProcess {
    let process = Process()
    let stdin = Pipe()
    let stdout: OutputCollector
    let stderr: OutputCollector

    init(_ executable: String, _ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = Command.environment([:])
        let out = Pipe()
        let err = Pipe()
        process.standardInput = stdin
        process.standardOutput = out
        process.standardError = err
        try process.run()
        stdout = OutputCollector(reading: out.fileHandleForReading)
        stderr = OutputCollector(reading: err.fileHandleForReading)
    }

    func write(_ text: String) { stdin.fileHandleForWriting.write(Data(text.utf8)) }

    /// Waits for the exit (at most `timeout`); its status, or nil if it still runs.
    func waitForExit(timeout: Double) -> Int32? {
        let deadline = Date(timeIntervalSinceNow: timeout)
        while process.isRunning {
            if Date() > deadline { return nil }
            Thread.sleep(forTimeInterval: 0.01)
        }
        _ = stdout.waitForEnd(timeout: 5)
        _ = stderr.waitForEnd(timeout: 5)
        return process.terminationStatus
    }

    func kill() {
        if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    var output: String { stdout.text + stderr.text }
}

/// A counter shared with callbacks.
final class Counter: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var value = 0
    func increment() -> Int {
        lock.withLock {
            value += 1
            return value
        }
    }
    var current: Int { lock.withLock { value } }
}

/// Something a background thread finishes and a test waits for.
final class Done: @unchecked Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    func signal() { semaphore.signal() }
    func wait(timeout: Double) -> Bool { semaphore.wait(timeout: .now() + timeout) == .success }
}

/// Opens once; every wait after that returns at once.
final class Latch: @unchecked Sendable {  // guarded by `condition`
    private let condition = NSCondition()
    private var isOpen = false

    func open() {
        condition.withLock {
            isOpen = true
            condition.broadcast()
        }
    }

    /// Whether it opened within `timeout` seconds.
    func wait(timeout: Double) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        return condition.withLock {
            while !isOpen { if !condition.wait(until: deadline) { return isOpen } }
            return true
        }
    }
}

/// An HTTP proxy in front of `upstream` (Debian's python3, standard library only) that can
/// hold one request back: `hold(path)` makes it keep the next request for `path` until
/// `release()`; `arrived(timeout:)` says when that request reached it. `limitBodies(to:)`
/// refuses larger request bodies with nginx's `413` (its `client_max_body_size`).
/// `loseAnswer(path, status:)` forwards the next request for `path` and answers it with
/// `status` instead of the server's answer (a gateway that lost it: `502`);
/// `answerInstead(path, status:)` answers it with `status` and an HTML page without
/// forwarding it (a proxy set up wrong, a captive portal; with `retryAfter:`, one in
/// maintenance; with `times:`, that many requests in a row). `answerHuge(path, announced:)`
/// answers it `200` with 64 MiB of blanks instead (with that `Content-Length`, or chunked; at
/// most ~64 MB/s, a network's pace: at the loopback's, FoundationNetworking's cancel lags),
/// and `hugeAnswer(timeout:)` says whether the client took it all (`"whole"`) or closed the
/// connection first (`"cut"`).
final class HoldingProxy {
    let process: ExampleProcess
    let port: Int
    private let directory: URL

    init(upstream: Int) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "trunk-sync-proxy-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        process = try ExampleProcess("/usr/bin/python3", ["-c", Self.script, String(upstream), directory.path])
        guard let line = process.stdout.waitForLine(containing: "port ", timeout: 30),
            let port = Int(line.split(separator: " ").last ?? "")
        else { throw CocoaError(.fileReadUnknown) }
        self.port = port
    }

    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }

    func hold(_ path: String) throws {
        try Data(path.utf8).write(to: directory.appendingPathComponent("hold"))
    }

    func arrived(timeout: Double) -> Bool {
        process.stdout.waitForLine(containing: "arrived", timeout: timeout) != nil
    }

    func release() throws {
        try Data().write(to: directory.appendingPathComponent("release"))
    }

    func loseAnswer(_ path: String, status: Int) throws {
        try Data("\(status) \(path)".utf8).write(to: directory.appendingPathComponent("lose"))
    }

    /// `retryAfter`: sent as its `Retry-After`; `times`: the requests in a row so answered.
    func answerInstead(_ path: String, status: Int, retryAfter: Int? = nil, times: Int = 1) throws {
        let plan = "\(status) \(path) \(retryAfter.map(String.init) ?? "-") \(times)"
        try Data(plan.utf8).write(to: directory.appendingPathComponent("instead"))
    }

    /// Changes the server's next answer to `path` before it goes on, and sends it as a proxy
    /// that lost the HTTP framing does: without a length, ended by closing the connection,
    /// so a cut looks like the body's end. `how`: `drop-last` (the last line), `drop-second`
    /// (the second line), `repeat-last` (the last line once more, after itself).
    func rewriteAnswer(_ path: String, _ how: String) throws {
        try Data("\(how) \(path)".utf8).write(to: directory.appendingPathComponent("rewrite"))
    }

    func answerHuge(_ path: String, announced: Bool) throws {
        let plan = "\(announced ? "announced" : "chunked") \(path)"
        try Data(plan.utf8).write(to: directory.appendingPathComponent("huge"))
    }

    /// How the `number`th huge answer ended: `"whole"` (all of it sent) or `"cut"` (the client
    /// closed the connection first); nil when it did not end within `timeout`.
    func hugeAnswer(_ number: Int = 1, timeout: Double) -> String? {
        process.stdout.waitForLines(containing: "huge ", count: number, timeout: timeout).map {
            String($0[number - 1].split(separator: " ").last ?? "")
        }
    }

    func limitBodies(to bytes: Int) throws {
        try Data(String(bytes).utf8).write(to: directory.appendingPathComponent("max-body"))
    }

    func stop() {
        process.kill()
        try? FileManager.default.removeItem(at: directory)
    }

    private static let script = #"""
        import http.client, http.server, os, sys, threading, time
        upstream, directory = int(sys.argv[1]), sys.argv[2]
        released = threading.Event()

        def watch():  # the test writes `release`: the held request goes on
            while not os.path.exists(os.path.join(directory, "release")):
                time.sleep(0.02)
            released.set()

        threading.Thread(target=watch, daemon=True).start()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def html(self, status, title, retry_after=None):  # an answer of something in the way
                page = b"<html><head><title>" + title + b"</title></head></html>\n"
                self.send_response(status)
                if retry_after:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def planned(self, name):  # (status, Retry-After) the test wrote to `name` for this path, `times` times
                plan = os.path.join(directory, name)
                if not os.path.exists(plan):
                    return None
                status, path, *rest = open(plan).read().split(" ")
                if path != self.path.split("?")[0]:
                    return None
                retry_after = rest[0] if rest and rest[0] != "-" else None
                times = int(rest[1]) if len(rest) > 1 else 1
                if times > 1:
                    with open(plan, "w") as file:
                        file.write(" ".join([status, path, rest[0], str(times - 1)]))
                else:
                    os.remove(plan)
                return int(status), retry_after

            def huge(self, announced):  # 64 MiB of blanks, or until the client closes the connection
                total, piece = 64 * 1024 * 1024, b" " * 65536
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if announced:
                    self.send_header("Content-Length", str(total))
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    for _ in range(total // len(piece)):
                        time.sleep(0.001)  # at most ~64 MB/s: a network's pace, not the loopback's
                        self.wfile.write(piece if announced else b"%x\r\n%s\r\n" % (len(piece), piece))
                    if not announced:
                        self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    print("huge whole", flush=True)
                except OSError:
                    print("huge cut", flush=True)

            def rewritten(self, data):  # the body as the test's `rewrite` plan for this path says, once; or None
                plan = os.path.join(directory, "rewrite")
                if not os.path.exists(plan):
                    return None
                how, path = open(plan).read().split(" ")
                if path != self.path.split("?")[0]:
                    return None
                os.remove(plan)
                lines = data.split(b"\n")[:-1]  # each line ends with a newline
                if how == "drop-last":
                    lines = lines[:-1]
                elif how == "drop-second":
                    lines = lines[:1] + lines[2:]
                elif how == "repeat-last":
                    lines = lines + lines[-1:]
                return b"".join(line + b"\n" for line in lines)

            def forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                limit = os.path.join(directory, "max-body")
                if os.path.exists(limit) and length > int(open(limit).read()):
                    return self.html(413, b"413 Request Entity Too Large")
                instead = self.planned("instead")
                if instead:
                    return self.html(instead[0], b"Not here", instead[1])
                huge = os.path.join(directory, "huge")
                if os.path.exists(huge):
                    kind, path = open(huge).read().split(" ")
                    if path == self.path.split("?")[0]:
                        os.remove(huge)
                        return self.huge(kind == "announced")
                hold = os.path.join(directory, "hold")
                if os.path.exists(hold) and open(hold).read() == self.path.split("?")[0]:
                    os.remove(hold)
                    print("arrived", flush=True)
                    released.wait(120)
                connection = http.client.HTTPConnection("127.0.0.1", upstream, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
                lost = self.planned("lose")
                if lost:
                    connection.close()
                    return self.html(lost[0], b"Bad Gateway")
                changed = self.rewritten(data)
                if changed is not None:  # close-delimited: the end of the body is the connection's
                    self.send_response(answer.status)
                    for k, v in answer.getheaders():
                        if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                            self.send_header(k, v)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(changed)
                    self.close_connection = True
                    connection.close()
                    return
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                connection.close()

            do_GET = do_POST = do_PUT = do_DELETE = forward

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        print("port", server.server_address[1], flush=True)
        server.serve_forever()
        """#
}
