import Foundation
import HTTPServer
import Logging
import Postgres
import Synchronization
import TestSupport
import TrunkSync
import XCTest

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Keeps the codes the application "sends", for in-process tests of the auth flows (the
/// real SMTP path is covered by the mail and end-to-end tests). Mails go out after `/otp`
/// answered, so tests wait for them (`code(for:)`).
final class CapturingSender: SignInCodeSender, @unchecked Sendable {
    private let lock = NSLock()
    private var codes: [String: [String]] = [:]
    /// Codes whose mail failed (`setFailing`).
    private var failed: [String: [String]] = [:]
    private var failing = false
    private var delay: Duration = .zero
    private var holding = false
    private var held: [CheckedContinuation<Void, Never>] = []

    func sendSignInCode(_ code: String, to email: String, expiresInMinutes: Int) async throws {
        // As a server's reply may quote the message (a content filter's refusal).
        struct Unreachable: Error, CustomStringConvertible {
            let email: String
            let code: String
            var description: String { "mail server said: 550 <\(email)> unreachable; \"code \(code)\" refused" }
        }
        let (delay, holding) = lock.withLock { (self.delay, self.holding) }
        if holding {
            await withCheckedContinuation { continuation in
                let stillHolding = lock.withLock {
                    if self.holding { held.append(continuation) }
                    return self.holding
                }
                if !stillHolding { continuation.resume() }
            }
        }
        if delay > .zero { try? await Task.sleep(for: delay) }
        if lock.withLock({ failing }) {
            lock.withLock { failed[email, default: []].append(code) }
            throw Unreachable(email: email, code: code)
        }
        lock.withLock { codes[email, default: []].append(code) }
    }

    func last(for email: String) -> String? { lock.withLock { codes[email]?.last } }
    func lastFailed(for email: String) -> String? { lock.withLock { failed[email]?.last } }
    func count(for email: String) -> Int { lock.withLock { codes[email]?.count ?? 0 } }
    var total: Int { lock.withLock { codes.values.map(\.count).reduce(0, +) } }
    func setFailing(_ value: Bool) { lock.withLock { failing = value } }
    /// Every mail takes `delay` (a slow mail server).
    func setDelay(_ value: Duration) { lock.withLock { delay = value } }
    /// Mails wait until `release()` (a mail server that does not answer).
    func hold() { lock.withLock { holding = true } }
    func release() {
        let waiting = lock.withLock {
            holding = false
            defer { held.removeAll() }
            return held
        }
        waiting.forEach { $0.resume() }
    }

    /// The newest code sent to `email` once more than `previous` were, waiting up to 5 s.
    func code(for email: String, after previous: Int = 0) async throws -> String {
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline {
            if let code = lock.withLock({ (codes[email]?.count ?? 0) > previous ? codes[email]?.last : nil }) {
                return code
            }
            try await Task.sleep(for: .milliseconds(2))
        }
        throw TestEnvironmentError("no code sent to \(email)")
    }
}

/// The SQL of the statements the application runs while recording.
final class StatementRecorder: Sendable {
    private let state = Mutex<(recording: Bool, statements: [String])>((false, []))

    func record(_ sql: String) { state.withLock { if $0.recording { $0.statements.append(sql) } } }

    /// Records what `body` makes the application run.
    func during(_ body: () async throws -> Void) async rethrows -> [String] {
        state.withLock { $0 = (true, []) }
        defer { state.withLock { $0.recording = false } }
        try await body()
        return state.withLock { $0.statements }
    }
}

/// A migrated database, the application on it and its HTTP server on a free port, in this
/// process.
final class AppHarness: @unchecked Sendable {
    let database: PostgresConfiguration
    let application: Application
    let server: HTTPServer<RequestPipeline>
    /// The operator listener (`/metrics`), as `serve` runs it beside the public one.
    let admin: HTTPServer<RequestPipeline>
    let sender = CapturingSender()
    let statements = StatementRecorder()
    /// The application's log lines at `info` and above (not the access log).
    let logs = LogLines()
    let baseURL: String
    let adminURL: String
    /// Random, as operators make theirs; a second instance shares the first one's.
    let secret: String
    /// `TRUNK_SYNC_KEY_ENCRYPTION_KEY`, likewise.
    let keyEncryptionKey: String
    private let ownsDatabase: Bool

    /// Starts on a new migrated database, or on `sharing` another harness's database (a second
    /// server instance).
    init(
        environment extra: [String: String] = [:], sharing other: AppHarness? = nil,
        settings: ((inout AuthSettings) -> Void)? = nil
    ) async throws {
        secret = other?.secret ?? TestSecrets.random()
        keyEncryptionKey = other?.keyEncryptionKey ?? TestSecrets.random()
        if let other {
            database = other.database
            ownsDatabase = false
        } else {
            database = try TestDatabase.create(prefix: "app")
            ownsDatabase = true
            let migrations = try Migration.load(from: repositoryRoot() + "/migrations")
            _ = try Migrator(migrations: migrations, logger: TestDatabase.quietLogger)
                .migrate(on: try PostgresConnection.connect(database))
        }
        var environment = [
            "TRUNK_SYNC_DATABASE_URL": try TestDatabase.url(of: database), "TRUNK_SYNC_JWT_SECRET": secret,
            "TRUNK_SYNC_PORT": "0", "TRUNK_SYNC_ADMIN_PORT": "0",
            "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
            "TRUNK_SYNC_KEY_ENCRYPTION_KEY": keyEncryptionKey,
        ]
        environment.merge(extra) { $1 }
        var configuration = try Configuration.load(environment: environment)
        if let settings { configuration.adjustAuth(settings) }
        let logs = self.logs
        var logger = Logger(label: "trunk-sync", factory: { _ in CapturingLogHandler(lines: logs) })
        logger.logLevel = .info
        let statements = self.statements
        application = try Application(
            configuration: configuration, logger: logger, sender: sender,
            statementObserver: { statements.record($0) })
        try await application.reloadSigningKeys()  // as serve does before listening
        await application.loadRevokedSessions()
        server = HTTPServer(
            configuration: application.serverConfiguration,
            responder: application.pipeline(logger: TestDatabase.quietLogger), logger: TestDatabase.quietLogger)
        application.observe(server)
        admin = HTTPServer(
            configuration: application.adminServerConfiguration,
            responder: application.adminPipeline(logger: TestDatabase.quietLogger), logger: TestDatabase.quietLogger)
        let adminPort = try admin.start()
        adminURL = "http://127.0.0.1:\(adminPort)"
        let port = try server.start()
        baseURL = "http://127.0.0.1:\(port)"
    }

    func stop() async {
        server.shutdown()
        admin.shutdown()
        await server.waitUntilStopped()
        await admin.waitUntilStopped()
        await application.close()
        if ownsDatabase { try? TestDatabase.drop(database) }
    }

    /// A connection as the database owner, to inspect or age rows.
    func owner() throws -> PostgresConnection { try PostgresConnection.connect(database) }

    /// The database refusing new connections, its `LISTEN` connections cut: notifications
    /// sent meanwhile reach no instance. Open connections of the pools stay.
    struct ListenerOutage {
        let admin: PostgresConnection
        let name: String
        /// How many listeners were cut (one per instance on this database).
        let listenersCut: Int

        /// Lets connections in again (the listeners reconnect).
        func end() { try? admin.execute("alter database \(name) allow_connections true") }
    }

    func cutListeners() throws -> ListenerOutage {
        let admin = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        let name = try admin.quoteIdentifier(try XCTUnwrap(database["dbname"]))
        let owner = try self.owner()
        try admin.execute("alter database \(name) allow_connections false")
        let cut = try owner.query(
            """
            select count(pg_terminate_backend(pid)) from pg_stat_activity
            where datname = current_database() and query ilike 'LISTEN%'
            """)[0].decode(Int.self, column: 0)
        return ListenerOutage(admin: admin, name: name, listenersCut: cut)
    }

    struct Response {
        var status: Int
        var headers: [String: String]
        var body: Data
        var json: [String: Any] { (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] ?? [:] }
        var text: String { String(decoding: body, as: UTF8.self) }
    }

    /// A request to the public listener, or to the admin listener when `admin`.
    func request(
        _ method: String, _ path: String, json: Any? = nil, rawBody: String? = nil, bearer: String? = nil,
        headers: [String: String] = [:], admin: Bool = false
    ) async throws -> Response {
        guard let url = URL(string: (admin ? adminURL : baseURL) + path) else {
            throw TestEnvironmentError("bad path \(path)")
        }
        var request = URLRequest(url: url)
        request.httpMethod = method
        if let json { request.httpBody = try JSONSerialization.data(withJSONObject: json) }
        if let rawBody { request.httpBody = Data(rawBody.utf8) }
        if request.httpBody != nil { request.setValue("application/json", forHTTPHeaderField: "Content-Type") }
        if let bearer { request.setValue("Bearer \(bearer)", forHTTPHeaderField: "Authorization") }
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        let (data, response) = try await URLSession.shared.data(for: request)
        guard let http = response as? HTTPURLResponse else { throw TestEnvironmentError("not HTTP") }
        var fields: [String: String] = [:]
        for (name, value) in http.allHeaderFields {
            if let name = name as? String, let value = value as? String { fields[name.lowercased()] = value }
        }
        return Response(status: http.statusCode, headers: fields, body: data)
    }

    /// A session for `email` without the code dance (as `trunk-sync token` does).
    func token(_ email: String) async throws -> String {
        guard let address = Email(email) else { throw TestEnvironmentError("bad email \(email)") }
        return try await application.auth.issueSession(email: address).accessToken
    }

    /// Requests a code (with `data`, the sign-up metadata, when given), reads it from the
    /// sender, verifies it: the whole sign-in.
    func signIn(_ email: String, data: [String: Any]? = nil) async throws -> [String: Any] {
        let address = email.lowercased().trimmingCharacters(in: .whitespaces)
        let sent = sender.count(for: address)
        var body: [String: Any] = ["email": email]
        if let data { body["data"] = data }
        let otp = try await request("POST", "/auth/v1/otp", json: body)
        guard otp.status == 200 else { throw TestEnvironmentError("otp: \(otp.status) \(otp.text)") }
        let code = try await sender.code(for: address, after: sent)
        let verify = try await request(
            "POST", "/auth/v1/verify", json: ["email": email, "token": code, "type": "email"])
        guard verify.status == 200 else { throw TestEnvironmentError("verify: \(verify.status) \(verify.text)") }
        return verify.json
    }
}

extension AppHarness {
    /// The value of a series (`name`, or `name{label="value"}`) on the admin listener's `/metrics`.
    func metric(_ series: String) async throws -> Double? {
        let text = try await request("GET", "/metrics", admin: true).text
        return text.split(separator: "\n").first { $0.hasPrefix(series + " ") }
            .flatMap { Double($0.split(separator: " ")[1]) }
    }
}
