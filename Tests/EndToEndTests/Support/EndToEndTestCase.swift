import Foundation
import Postgres
import TestSupport
import XCTest

/// A test case that starts real `trunk-sync serve` processes and always cleans them up
/// (process killed if still running, database dropped), printing their logs when the test
/// failed.
class EndToEndTestCase: XCTestCase {
    private var servers: [ServerProcess] = []

    /// Starts a server (see `ServerProcess.start`) that is cleaned up after the test.
    func startServer(_ environment: [String: String] = [:], launcher: [String] = []) throws -> ServerProcess {
        let server = try ServerProcess.start(environment, launcher: launcher)
        servers.append(server)
        return server
    }

    /// Launches a server without waiting for it to listen; cleaned up after the test.
    func launchServer(_ environment: [String: String] = [:]) throws -> ServerProcess {
        let server = try ServerProcess.launch(environment)
        servers.append(server)
        return server
    }

    /// Launches a server on a database the test prepared (see `ServerProcess.launch(on:_:)`);
    /// the process is cleaned up after the test, the database is not dropped.
    func launchServer(on database: PostgresConfiguration, _ overrides: [String: String?] = [:]) throws -> ServerProcess
    {
        let server = try ServerProcess.launch(on: database, overrides)
        servers.append(server)
        return server
    }

    override func tearDown() {
        let failed = (testRun?.totalFailureCount ?? 0) > 0
        for server in servers {
            server.cleanUp()
            if failed { print("---- server log (\(name)) ----\n\(server.logs)---- end of server log ----") }
        }
        servers = []
        super.tearDown()
    }

    /// Sends a request to the public listener on a new connection (with a JSON `body` and a
    /// bearer `token` when given) and reads the answer.
    func send(_ server: ServerProcess, _ method: String, _ path: String, body: String? = nil, token: String? = nil)
        throws -> RawResponse
    {
        var headers: [(String, String)] = []
        if body != nil { headers.append(("Content-Type", "application/json")) }
        if let token { headers.append(("Authorization", "Bearer \(token)")) }
        let (response, client) = try server.exchange(request(method, path, headers: headers, body: body), timeout: 10)
        client.close()
        return response
    }

    /// The test venv's Python (with Selenium) for the scripts that drive headless Chromium,
    /// after checking Debian's `chromium` and `chromium-driver` are there.
    func browserTestPython() throws -> String {
        guard let python = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"], !python.isEmpty else {
            throw TestEnvironmentError("TRUNK_SYNC_TEST_PYTHON is not set: run the tests with `make test`")
        }
        for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"]
        where !FileManager.default.isExecutableFile(atPath: tool) {
            throw TestEnvironmentError(
                "\(tool) is missing: run the tests with `make test` (it installs chromium-driver)")
        }
        return python
    }

    /// A TCP port nothing listens on now.
    func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else { throw ClientError("cannot find a free port: errno \(errno)") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    // MARK: - Assertions

    /// The response is `status` with a JSON error body `{"code": code, "message": …}`.
    func assertJSONError(
        _ response: RawResponse, status: Int, code: String? = nil, file: StaticString = #filePath, line: UInt = #line
    ) {
        XCTAssertEqual(response.status, status, "status; body: \(response.bodyText)", file: file, line: line)
        XCTAssertTrue(
            response.header("content-type")?.hasPrefix("application/json") ?? false,
            "Content-Type \(response.header("content-type") ?? "none")", file: file, line: line)
        guard let object = response.jsonObject else {
            XCTFail("body is not a JSON object: \(response.bodyText.debugDescription)", file: file, line: line)
            return
        }
        guard let actualCode = object["code"] as? String, !actualCode.isEmpty else {
            XCTFail("no \"code\" in \(response.bodyText)", file: file, line: line)
            return
        }
        if let code { XCTAssertEqual(actualCode, code, file: file, line: line) }
        XCTAssertFalse(
            (object["message"] as? String ?? "").isEmpty, "no \"message\" in \(response.bodyText)", file: file,
            line: line)
    }

    /// The response says `Connection: close` and the server then closes the connection.
    func assertClosesConnection(
        _ response: RawResponse, on client: RawClient, file: StaticString = #filePath, line: UInt = #line
    ) {
        XCTAssertTrue(
            response.closesConnection, "Connection: \(response.header("connection") ?? "none")", file: file, line: line)
        XCTAssertTrue(
            (try? client.waitForClose(timeout: 5)) ?? false, "server kept the connection open", file: file, line: line)
    }

    /// The connection is still usable: another request on it gets `200` from `/healthz`.
    func assertConnectionUsable(_ client: RawClient, file: StaticString = #filePath, line: UInt = #line) {
        do {
            try client.send(request("GET", "/healthz"))
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 200, file: file, line: line)
        } catch {
            XCTFail("connection not usable: \(error)", file: file, line: line)
        }
    }

    /// The server answers `/healthz` on a new connection.
    func assertServerHealthy(_ server: ServerProcess, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertTrue(server.isRunning, "server process exited", file: file, line: line)
        do {
            let (response, _) = try server.exchange(request("GET", "/healthz"))
            XCTAssertEqual(response.status, 200, file: file, line: line)
            XCTAssertEqual(response.bodyText, #"{"status":"ok"}"#, file: file, line: line)
        } catch {
            XCTFail("server does not answer /healthz: \(error)", file: file, line: line)
        }
    }
}
