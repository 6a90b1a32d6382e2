import Foundation
import TestSupport
import TrunkSyncClient
import XCTest

/// Records what a client reported (`Configuration.observer`), with the time of each.
final class EventLogBox: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var events: [(Date, ClientEvent)] = []
    private var hooks: [@Sendable (ClientEvent) -> Void] = []

    func record(_ event: ClientEvent) {
        let hooks = lock.withLock {
            events.append((Date(), event))
            return self.hooks
        }
        for hook in hooks { hook(event) }
    }

    /// Calls `hook` (on the client's actor) for every later event.
    func onEvent(_ hook: @escaping @Sendable (ClientEvent) -> Void) { lock.withLock { hooks.append(hook) } }

    var all: [(Date, ClientEvent)] { lock.withLock { events } }

    var retries: [(at: Date, status: Int?, retryAfter: TimeInterval?, delay: TimeInterval, path: String)] {
        all.compactMap { date, event in
            if case .retrying(_, let path, let status, let retryAfter, let delay, _, _) = event {
                return (date, status, retryAfter, delay, path)
            }
            return nil
        }
    }

    var refreshes: [Bool] {
        all.compactMap { _, event in
            if case .tokenRefreshed(let proactive) = event { return proactive }
            return nil
        }
    }

    func requests(_ method: String, _ path: String) -> [Date] {
        all.compactMap { date, event in
            if case .request(method, path) = event { return date }
            return nil
        }
    }
}

/// A clock a test can move forward (token expiry).
final class TestClock: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var offset: TimeInterval = 0
    func advance(by seconds: TimeInterval) { lock.withLock { offset += seconds } }
    func now() -> Date { Date().addingTimeInterval(lock.withLock { offset }) }
}

/// Starts real servers and clients with their own storage, and cleans all of it up.
class ClientTestCase: XCTestCase {
    private var servers: [SyncServer] = []
    private var clients: [TrunkSyncClient] = []
    private var directories: [URL] = []

    func startServer(_ overrides: [String: String] = [:]) throws -> SyncServer {
        let server = try SyncServer.start(overrides)
        servers.append(server)
        return server
    }

    /// A new, empty storage directory (a device).
    func makeStorage() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "trunk-sync-client-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        directories.append(directory)
        return directory
    }

    /// Retries quick enough for tests: many tries, short waits.
    static let quickRetry = TrunkSyncClient.RetryPolicy(maxAttempts: 60, baseDelay: 0.05, maxDelay: 0.4)

    /// A client of `server` on `storage`, reporting to `events`, closed after the test.
    func makeClient(
        _ server: SyncServer, storage: URL, events: EventLogBox? = nil,
        _ configure: (inout TrunkSyncClient.Configuration) -> Void = { _ in }
    ) throws -> TrunkSyncClient {
        try makeClient(url: server.url, storage: storage, events: events, configure)
    }

    /// A client of the server behind `proxy`, as `makeClient`.
    func makeClient(
        via proxy: HoldingProxy, storage: URL, events: EventLogBox? = nil,
        _ configure: (inout TrunkSyncClient.Configuration) -> Void = { _ in }
    ) throws -> TrunkSyncClient {
        try makeClient(url: proxy.url, storage: storage, events: events, configure)
    }

    private func makeClient(
        url: URL, storage: URL, events: EventLogBox?, _ configure: (inout TrunkSyncClient.Configuration) -> Void
    ) throws -> TrunkSyncClient {
        var configuration = TrunkSyncClient.Configuration()
        configuration.retry = Self.quickRetry
        if let events { configuration.observer = { events.record($0) } }
        configure(&configuration)
        let client = try TrunkSyncClient(url: url, storageDirectory: storage, configuration: configuration)
        clients.append(client)
        return client
    }

    /// Signs `client` in as `email` with the code the server's log mailer printed.
    func signIn(_ client: TrunkSyncClient, _ server: SyncServer, as email: String) async throws {
        let earlier = server.logs.components(separatedBy: "sign-in code for \(email): ").count - 1
        try await client.sendCode(to: email)
        let code = try server.code(for: email, number: earlier + 1)
        try await client.verify(email: email, code: code)
    }

    /// The user id of `email` on `server`.
    func userID(_ server: SyncServer, _ email: String) throws -> String {
        let rows = try server.rows("select id::text from users where email = '\(email)'")
        return try XCTUnwrap(rows.first?.first, "no user \(email)")
    }

    /// `(client_id, seq, type, payload)` of the user's events on the server, in seq order.
    func serverEvents(_ server: SyncServer, _ email: String) throws -> [(clientID: String, seq: Int, payload: String)] {
        try server.rows(
            """
            select e.client_id::text, e.seq::text, e.payload::text from events e join users u on u.id = e.user_id
            where u.email = '\(email)' order by e.seq
            """
        ).map { ($0[0], Int($0[1]) ?? -1, $0[2]) }
    }

    /// The example executable (built beside the server binary).
    func exampleBinary() -> String {
        URL(fileURLWithPath: Command.trunkSyncBinary()).deletingLastPathComponent()
            .appendingPathComponent("trunk-sync-example").path
    }

    override func tearDown() async throws {
        for client in clients { await client.close() }
        clients = []
        let failed = (testRun?.totalFailureCount ?? 0) > 0
        for server in servers {
            server.cleanUp()
            if failed { print("---- server log (\(name)) ----\n\(server.logs)---- end of server log ----") }
        }
        servers = []
        for directory in directories { try? FileManager.default.removeItem(at: directory) }
        directories = []
        try await super.tearDown()
    }
}

/// Collects what a live stream delivered, for a test to wait on.
actor Collected {
    private(set) var events: [SyncEvent] = []
    func add(_ more: [SyncEvent]) { events += more }
}

/// `XCTAssertEqual` for expressions that await (XCTest's autoclosures cannot).
func assertEqual<T: Equatable>(
    _ expression: @autoclosure () async throws -> T, _ expected: @autoclosure () async throws -> T,
    _ message: @autoclosure () -> String = "", file: StaticString = #filePath, line: UInt = #line
) async throws {
    let value = try await expression()
    let wanted = try await expected()
    XCTAssertEqual(value, wanted, message(), file: file, line: line)
}

/// `XCTAssertGreaterThanOrEqual` for expressions that await.
func assertGreaterThanOrEqual<T: Comparable>(
    _ expression: @autoclosure () async throws -> T, _ bound: T, _ message: @autoclosure () -> String = "",
    file: StaticString = #filePath, line: UInt = #line
) async throws {
    let value = try await expression()
    XCTAssertGreaterThanOrEqual(value, bound, message(), file: file, line: line)
}
