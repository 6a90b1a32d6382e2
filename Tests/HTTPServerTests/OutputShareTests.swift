import Foundation
import Logging
import Synchronization
import XCTest

@testable import HTTPServer

/// Each owner's share of the output budget's large whole answers (`Shares`,
/// `HTTPServerConfiguration.maxBufferedOutputPerClient`), through a real server on loopback
/// sockets: one owner's second large unread answer is refused while another owner's is
/// queued, an answer holds its share whole until it is sent, and the share comes back to zero
/// however the answer ends (sent, reset, write timeout, shutdown).
final class OutputShareTests: XCTestCase {
    /// 12 MiB: more than the kernel takes into a loopback socket whose client reads nothing.
    static let largeSize = OutputBudgetTests.largeSize
    /// Room for three large answers over all owners …
    static let limit = 40 * 1024 * 1024
    /// … and for one per owner.
    static let perClient = 16 * 1024 * 1024

    final class Probe: Sendable {
        let refusedOver = Mutex<[BudgetLimit]>([])
    }

    struct Responder: HTTPResponder {
        let probe: Probe

        /// The context is the account the request names in `X-Account` (0: none).
        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> {
            .readBody(bodyLimit: 1024, head.headers["x-account"].flatMap { Int($0) } ?? 0)
        }

        func shareKey(context: Int) -> ShareKey? {
            context == 0 ? nil : .account(InputBudgetTests.account(context))
        }

        func respond(to request: HTTPRequest, context: Int) -> Reply<Int> {
            switch request.path {
            case "/large": return .now(HTTPResponse(status: .ok, body: OutputBudgetTests.large), context)
            case "/large-later": return .later { (HTTPResponse(status: .ok, body: OutputBudgetTests.large), context) }
            case "/200k":
                return .now(HTTPResponse(status: .ok, body: [UInt8](repeating: 0x7A, count: 200 * 1024)), context)
            default: return .now(HTTPResponse(status: .ok, body: Array("ok".utf8)), context)
            }
        }

        func complete(_ response: inout HTTPResponse, context: Int) {}
        func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse {
            HTTPResponse(status: HTTPStatus(error.status))
        }
        func refuseConnection() -> HTTPResponse { HTTPResponse(status: .serviceUnavailable) }
        func refuseAnswer(context: Int, over limit: BudgetLimit) -> HTTPResponse {
            probe.refusedOver.withLock { $0.append(limit) }
            return HTTPResponse(status: .serviceUnavailable, headers: ["Retry-After": "1"], body: Array("busy".utf8))
        }
    }

    private var server: HTTPServer<Responder>?
    private let probe = Probe()
    /// The loop's warnings.
    private let log = OutputBudgetTests.Probe()

    private func start(
        writeTimeout: Duration = .seconds(30), shutdownTimeout: Duration = .seconds(5), limit: Int = limit,
        perClient: Int = perClient
    ) throws -> HTTPServer<Responder> {
        var configuration = HTTPServerConfiguration.budgetTest(
            limit: limit, writeTimeout: writeTimeout, shutdownTimeout: shutdownTimeout)
        configuration.maxBufferedOutputPerClient = perClient
        let started = try HTTPServer.started(configuration, Responder(probe: probe), warningsTo: log)
        server = started
        return started
    }

    override func tearDown() async throws {
        server?.shutdown()
        await server?.waitUntilStopped()
    }

    private static func owner(_ account: Int) -> ShareKey { .account(InputBudgetTests.account(account)) }

    /// A client of `account` (0: none) that asks for `path` and reads nothing, once the server
    /// holds its answer's share.
    private func nonReader(
        _ server: HTTPServer<Responder>, account: Int, _ path: String = "/large", method: String = "GET"
    ) throws -> TestClient {
        let client = try TestClient(port: server.port, receiveBuffer: 4096)
        let before = server.bufferedOutputBytes
        try client.send(request(path, account: account, method: method))
        try eventually { server.bufferedOutputBytes > before }
        return client
    }

    private func request(_ path: String, account: Int, method: String = "GET") -> String {
        "\(method) \(path) HTTP/1.1\r\nHost: x\r\nX-Account: \(account)\r\nContent-Length: 0\r\n\r\n"
    }

    func testOneOwnersSecondLargeUnreadAnswerIsRefusedWhileAnothersIsQueued() throws {
        let server = try start()
        let first = Self.owner(1)
        let held = try nonReader(server, account: 1)
        XCTAssertEqual(
            server.bufferedOutputBytes(of: first), Self.largeSize,
            "the share holds the whole answer, whatever the socket took")
        XCTAssertEqual(server.outputShareOwners, 1)

        let client = try TestClient(port: server.port)
        for path in ["/large", "/large-later"] {
            try client.send(request(path, account: 1))
            let refused = try client.readResponse()
            XCTAssertEqual(refused.status, 503, path)
            XCTAssertEqual(refused.body, "busy", path)
        }
        XCTAssertEqual(probe.refusedOver.withLock { $0 }, [.perClient, .perClient])
        XCTAssertEqual(server.bufferedOutputBytes(of: first), Self.largeSize, "a refused answer holds no share")
        try client.send(request("/200k", account: 1))
        XCTAssertEqual(try client.readResponse().status, 200, "a large answer that fits what is left of the share")
        try eventually { server.bufferedOutputBytes(of: first) == Self.largeSize }
        try client.send(request("/small", account: 1))
        XCTAssertEqual(try client.readResponse().status, 200, "small answers always go")

        // Another account's large answer fits the total: queued, and sent.
        let other = try TestClient(port: server.port)
        try other.send(request("/large", account: 2))
        let answer = try other.readResponse()
        XCTAssertEqual(answer.status, 200)
        XCTAssertEqual(answer.body.utf8.count, Self.largeSize)
        try eventually { server.bufferedOutputBytes(of: Self.owner(2)) == 0 && server.outputShareOwners == 1 }

        // An answer to a request that may have changed something: counted (past the share),
        // never refused, and given back.
        let changer = try nonReader(server, account: 1, method: "POST")
        XCTAssertEqual(server.bufferedOutputBytes(of: first), 2 * Self.largeSize)
        let changed = try changer.readResponse()
        XCTAssertEqual(changed.status, 200)
        XCTAssertEqual(changed.body.utf8.count, Self.largeSize)
        try eventually { server.bufferedOutputBytes(of: first) == Self.largeSize }
        XCTAssertEqual(probe.refusedOver.withLock { $0.count }, 2)
        try eventually {
            log.warnings.withLock { $0.contains { $0.contains("holds its share of the unread answers") } }
        }
        let warning = log.warnings.withLock { $0.first { $0.contains("its share") } } ?? ""
        XCTAssertTrue(warning.contains("limit_bytes=\(Self.perClient)"), warning)

        held.close()  // unread bytes in its buffer: the kernel resets the connection
        try eventually { server.bufferedOutputBytes == 0 && server.outputShareOwners == 0 }
        try client.send(request("/large", account: 1))
        XCTAssertEqual(try client.readResponse().status, 200, "its share is back")
    }

    func testWithoutAnAccountAnAnswerCountsForItsClientAddress() throws {
        let server = try start()
        let peer = ShareKey.client(IPAddress("127.0.0.1")!)
        let held = try nonReader(server, account: 0)
        XCTAssertEqual(server.bufferedOutputBytes(of: peer), Self.largeSize)
        let client = try TestClient(port: server.port)
        try client.send(request("/large", account: 0))
        XCTAssertEqual(try client.readResponse().status, 503)
        XCTAssertEqual(probe.refusedOver.withLock { $0 }, [.perClient])
        held.close()
        try eventually { server.bufferedOutputBytes == 0 && server.outputShareOwners == 0 }
    }

    func testOverTheTotalTheRefusalSaysSo() throws {
        // Room for one unread answer, not two (the kernel takes a few MiB of it at most), and
        // no share: only the total refuses.
        let server = try start(limit: OutputBudgetTests.limit, perClient: 0)
        let held = try nonReader(server, account: 1)
        XCTAssertEqual(server.bufferedOutputBytes(of: Self.owner(1)), 0, "no share, no table")
        XCTAssertEqual(server.outputShareOwners, 0)
        let client = try TestClient(port: server.port)
        try client.send(request("/large", account: 2))
        XCTAssertEqual(try client.readResponse().status, 503)
        XCTAssertEqual(probe.refusedOver.withLock { $0 }, [.total])
        held.close()
        try eventually { server.bufferedOutputBytes == 0 }
    }

    func testTheShareComesBackHoweverTheAnswerEnds() async throws {
        let owner = Self.owner(1)
        do {
            let server = try start(writeTimeout: .seconds(1))
            func released(_ what: String) throws {
                try eventually { server.bufferedOutputBytes == 0 && server.outputShareOwners == 0 }
                XCTAssertEqual(server.bufferedOutputBytes(of: owner), 0, what)
            }
            // Sent whole: the client reads it (and the connection stays open).
            let reader = try nonReader(server, account: 1)
            XCTAssertEqual(server.bufferedOutputBytes(of: owner), Self.largeSize)
            XCTAssertEqual(try reader.readResponse().body.utf8.count, Self.largeSize)
            try released("sent whole")
            try reader.send(request("/large-later", account: 1))
            XCTAssertEqual(try reader.readResponse().body.utf8.count, Self.largeSize)
            try released("sent whole, after a handler's task")
            // Reset by the client.
            try nonReader(server, account: 1).close()
            try released("reset")
            // The write timeout.
            let slow = try nonReader(server, account: 1)
            try released("write timeout")
            XCTAssertTrue(try slow.waitForClose())
            // Small answers never touch it.
            try reader.send(request("/small", account: 1))
            XCTAssertEqual(try reader.readResponse().status, 200)
            XCTAssertEqual(server.outputShareOwners, 0)
            server.shutdown()
            await server.waitUntilStopped()
            self.server = nil
        }
        // Shutdown: it waits for the answer until its deadline, then resets the connection.
        let server = try start(shutdownTimeout: .milliseconds(500))
        let client = try nonReader(server, account: 1)
        XCTAssertEqual(server.bufferedOutputBytes(of: owner), Self.largeSize)
        server.shutdown()
        await server.waitUntilStopped()
        self.server = nil
        XCTAssertEqual(server.bufferedOutputBytes(of: owner), 0, "shutdown")
        XCTAssertEqual(server.outputShareOwners, 0)
        XCTAssertEqual(server.bufferedOutputBytes, 0)
        client.close()
    }

    func testASharePassesUpToItsLimitAndCountsWhatIsNeverRefused() {
        let shares = Shares(limit: 100)
        let owner = Self.owner(1)
        XCTAssertTrue(shares.admit(60, for: owner))
        XCTAssertFalse(shares.admit(41, for: owner))
        shares.hold(50, for: owner)  // never refused, but counted
        XCTAssertEqual(shares.heldBytes(of: owner), 110)
        XCTAssertFalse(shares.admit(1, for: owner))
        shares.release(50, of: owner)
        shares.release(60, of: owner)
        XCTAssertEqual(shares.owners, 0)
        XCTAssertNil(Shares.within(100, share: 0), "0: off")
        XCTAssertNil(Shares.within(100, share: 100), "as large as the total: off")
        XCTAssertEqual(Shares.within(100, share: 99)?.limit, 99)
    }
}
