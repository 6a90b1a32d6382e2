import Foundation
import HTTPServer
import Logging
import Postgres
import TestSupport
import TrunkSync

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Keeps the codes the application "sends", for in-process tests of the auth flows (the
/// real SMTP path is covered by the mail and end-to-end tests).
final class CapturingSender: SignInCodeSender, @unchecked Sendable {
    private let lock = NSLock()
    private var codes: [String: [String]] = [:]
    var failing = false

    func sendSignInCode(_ code: String, to email: String, expiresInMinutes: Int) async throws {
        struct Unreachable: Error {}
        if lock.withLock({ failing }) { throw Unreachable() }
        lock.withLock { codes[email, default: []].append(code) }
    }

    func last(for email: String) -> String? { lock.withLock { codes[email]?.last } }
    func count(for email: String) -> Int { lock.withLock { codes[email]?.count ?? 0 } }
    func setFailing(_ value: Bool) { lock.withLock { failing = value } }
}

/// A migrated database, the application on it and its HTTP server on a free port, in this
/// process.
final class AppHarness: @unchecked Sendable {
    let database: PostgresConfiguration
    let application: Application
    let server: HTTPServer<RequestPipeline>
    let sender = CapturingSender()
    let baseURL: String
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
            "TRUNK_SYNC_PORT": "0", "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
            "TRUNK_SYNC_KEY_ENCRYPTION_KEY": keyEncryptionKey,
        ]
        environment.merge(extra) { $1 }
        var configuration = try Configuration.load(environment: environment)
        if let settings { configuration.adjustAuth(settings) }
        application = try Application(configuration: configuration, logger: TestDatabase.quietLogger, sender: sender)
        try await application.reloadSigningKeys()  // as serve does before listening
        server = HTTPServer(
            configuration: application.serverConfiguration, responder: application.pipeline(logger: TestDatabase.quietLogger), logger: TestDatabase.quietLogger)
        let port = try server.start()
        baseURL = "http://127.0.0.1:\(port)"
    }

    func stop() async {
        server.shutdown()
        await server.waitUntilStopped()
        await application.close()
        if ownsDatabase { try? TestDatabase.drop(database) }
    }

    /// A connection as the database owner, to inspect or age rows.
    func owner() throws -> PostgresConnection { try PostgresConnection.connect(database) }

    struct Response {
        var status: Int
        var headers: [String: String]
        var body: Data
        var json: [String: Any] { (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] ?? [:] }
        var text: String { String(decoding: body, as: UTF8.self) }
    }

    func request(
        _ method: String, _ path: String, json: Any? = nil, rawBody: String? = nil, bearer: String? = nil,
        headers: [String: String] = [:]
    ) async throws -> Response {
        guard let url = URL(string: baseURL + path) else { throw TestEnvironmentError("bad path \(path)") }
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

    /// Requests a code, reads it from the sender, verifies it: the whole sign-in.
    func signIn(_ email: String) async throws -> [String: Any] {
        let otp = try await request("POST", "/auth/v1/otp", json: ["email": email])
        guard otp.status == 200 else { throw TestEnvironmentError("otp: \(otp.status) \(otp.text)") }
        guard let code = sender.last(for: email.lowercased().trimmingCharacters(in: .whitespaces)) else { throw TestEnvironmentError("no code sent") }
        let verify = try await request(
            "POST", "/auth/v1/verify", json: ["email": email, "token": code, "type": "email"])
        guard verify.status == 200 else { throw TestEnvironmentError("verify: \(verify.status) \(verify.text)") }
        return verify.json
    }
}
