import Foundation
import HTTPServer
import Logging
import Mail
import Postgres
import Synchronization

/// The trunk-sync application: its routes over the database pool. Owns nothing that must
/// outlive a request; `serve` builds one and hands its router to the HTTP server.
public struct Application: Sendable {
    /// The effective configuration.
    public let configuration: Configuration
    /// The database pool every request uses (as the restricted role `trunk_sync_app`).
    public let pool: PostgresPool
    /// The migrations this binary ships with, for `/readyz`.
    public let migrator: Migrator
    /// Sign-in, sessions and tokens.
    public let auth: AuthService
    /// The event log.
    public let events: EventStore
    /// Wakes long-polls (LISTEN on its own connection).
    public let notifier: EventNotifier
    /// Counters, histograms and gauges for `/metrics`.
    public let metrics = Metrics()
    /// The ES256 signing keys in the database.
    public let signingKeys: SigningKeyStore
    private let keyRefresh = BackgroundTask()
    private let logger: Logger

    /// The role the server's queries run as (created by the first migration).
    public static let databaseRole = "trunk_sync_app"

    /// Builds the application: a pool from the configuration, migrations from its directory,
    /// and `sender` for sign-in codes (by default the one `TRUNK_SYNC_MAILER` names).
    public init(
        configuration: Configuration, logger: Logger, sender: (any SignInCodeSender)? = nil, listen: Bool = true
    ) throws {
        self.configuration = configuration
        self.logger = logger
        var settings = PostgresPool.Configuration()
        settings.maxConnections = configuration.databasePoolSize
        settings.acquireTimeout = .milliseconds(Int64(configuration.databasePoolTimeout * 1000))
        settings.sessionSettings = [("role", Self.databaseRole)]
        let database = try PostgresConfiguration(try configuration.requireDatabaseURL())
        pool = PostgresPool(database, configuration: settings, logger: logger)
        events = EventStore(pool: pool)
        signingKeys = SigningKeyStore(pool: pool, encryption: configuration.keyEncryptionKey)
        notifier = EventNotifier(
            listener: listen ? PostgresListener(database, channels: [EventStore.channel], logger: logger) : nil)
        migrator = Migrator(migrations: try Migration.load(from: configuration.migrationsDirectory), logger: logger)
        let secret = configuration.jwtSecret ?? ""
        auth = AuthService(
            pool: pool,
            tokens: TokenIssuer(secret: secret, issuer: configuration.publicURL + "/auth/v1", lifetime: configuration.jwtExpiry),
            secret: secret, sender: try sender ?? Self.defaultSender(configuration, logger: logger),
            settings: configuration.auth, logger: logger, metrics: metrics)
        let pool = self.pool
        let notifier = self.notifier
        metrics.gauge("trunk_sync_db_pool_connections_open", help: "Database connections open.") { Double(pool.statistics.open) }
        metrics.gauge("trunk_sync_db_pool_connections_in_use", help: "Database connections running a query.") {
            Double(pool.statistics.inUse)
        }
        metrics.gauge("trunk_sync_db_pool_waiting", help: "Requests waiting for a database connection.") {
            Double(pool.statistics.waiting)
        }
        metrics.gauge("trunk_sync_longpolls_waiting", help: "Pulls waiting for new events.") { Double(notifier.waiting) }
    }

    static func defaultSender(_ configuration: Configuration, logger: Logger) throws -> any SignInCodeSender {
        switch configuration.mailer {
        case .log:
            return MailCodeSender(mailer: LogMailer(logger: logger), from: configuration.mailFrom)
        case .smtp:
            let smtp = try SMTPConfiguration(url: configuration.smtpURL ?? "")
            return MailCodeSender(mailer: try SMTPMailer(configuration: smtp, logger: logger), from: configuration.mailFrom)
        }
    }

    /// The access token issuer and its current keys.
    public var tokens: TokenIssuer { auth.tokens }

    /// Reads the signing keys from the database now and makes them the key set (what the
    /// refresh does every minute); logs when the set changes and any key it cannot read.
    @discardableResult
    public func reloadSigningKeys() async throws -> TokenIssuer.ReloadResult {
        let signer = { tokens.signingKey(at: Int64(Date().timeIntervalSince1970))?.keyID ?? "HS256 secret" }
        let before = (tokens.keys.map(\.key.keyID), signer())
        let result = try await tokens.reload(from: signingKeys)
        for (keyID, reason) in result.unreadable {
            logger.error("signing key ignored: \(reason)", metadata: ["kid": "\(keyID)"])
        }
        // Also logged when only the signer changed: a pending key came of age.
        let after = (result.keys.map(\.key.keyID), signer())
        if after != before {
            logger.notice(
                "signing keys loaded",
                metadata: ["kids": "\(after.0.compactMap { $0 }.joined(separator: ","))", "signing": "\(after.1)"])
        }
        return result
    }

    /// Loads the signing keys, then reloads them every `interval` in a background task until
    /// `close()`, so `trunk-sync keys add|retire` reach every instance without a restart. A
    /// failed load is logged and retried after 5 seconds (`/readyz` answers 503 until the
    /// first load succeeds). Returns what the first load found, nil when it failed.
    @discardableResult
    public func startSigningKeyRefresh(every interval: Duration = SigningKeyStore.reloadInterval) async
        -> TokenIssuer.ReloadResult?
    {
        let retry = min(interval, .seconds(5))
        var delay = interval
        var first: TokenIssuer.ReloadResult? = nil
        do {
            first = try await reloadSigningKeys()
        } catch {
            logger.error("cannot load signing keys; retrying", metadata: ["error": "\(error)"])
            delay = retry
        }
        keyRefresh.replace(
            with: Task { [self, delay] in
                var delay = delay
                while true {
                    do { try await Task.sleep(for: delay) } catch { return }  // cancelled by close()
                    do {
                        try await reloadSigningKeys()
                        delay = interval
                    } catch {
                        if Task.isCancelled { return }
                        logger.error("cannot reload signing keys; retrying", metadata: ["error": "\(error)"])
                        delay = retry
                    }
                }
            })
        return first
    }

    /// The HTTP server's settings taken from the configuration.
    public var serverConfiguration: HTTPServerConfiguration {
        var server = HTTPServerConfiguration()
        server.host = configuration.host
        server.port = configuration.port
        server.headerTimeout = .seconds(configuration.httpHeaderTimeout)
        server.bodyIdleTimeout = .seconds(configuration.httpBodyTimeout)
        server.keepAliveTimeout = .seconds(configuration.httpIdleTimeout)
        server.writeTimeout = .seconds(configuration.httpWriteTimeout)
        server.maxConnections = configuration.httpMaxConnections
        return server
    }

    /// Every route of the application with its declarations.
    public func routes() -> Routes {
        var routes = Routes(metrics: metrics)
        let healthy = Array(#"{"status":"ok"}"#.utf8)
        routes.add(.get, "/healthz", family: .native, .inline { _ in .json(.ok, healthy) })
        routes.add(.get, "/readyz", family: .native, .open { _ in await readiness() })
        AuthRoutes(service: auth).register(in: &routes)
        SyncRoutes(store: events, notifier: notifier, metrics: metrics).register(in: &routes)
        RESTRoutes(pool: pool, store: events, metrics: metrics).register(in: &routes)
        let metrics = self.metrics
        routes.add(
            .get, "/metrics", family: .native,
            .inline { _ in
                HTTPResponse(
                    status: .ok, headers: ["Content-Type": "text/plain; version=0.0.4; charset=utf-8"],
                    body: Array(metrics.render().utf8))
            })
        return routes
    }

    /// The request pipeline over every route: what the HTTP server answers with. The access
    /// log is on when `logger` writes `info` lines, in the configured format.
    public func pipeline(logger: Logger = Logger(label: "trunk-sync.http")) -> RequestPipeline {
        let accessLog = logger.logLevel <= .info ? AccessLog(format: configuration.logFormat, label: logger.label) : nil
        return RequestPipeline(
            routes: routes(), corsOrigins: configuration.corsOrigins,
            authenticator: Authenticator(tokens: auth.tokens, apiKey: configuration.apiKey), accessLog: accessLog,
            logger: logger)
    }

    /// Answers waiting long-polls at once and stops listening (graceful shutdown).
    public func beginShutdown() { notifier.shutdown() }

    /// Stops everything the application started: the key refresh, the listener and the pool.
    public func close() async {
        notifier.shutdown()
        await keyRefresh.stop()
        await pool.close()
    }

    /// `200` when the database answers, no migration is pending and the signing keys have
    /// been loaded, else `503` with the reason.
    func readiness() async -> HTTPResponse {
        do {
            let pending = try await pool.withConnection { [migrator] in try migrator.pendingCount(on: $0) }
            if pending > 0 {
                return APIError(status: 503, code: "migrations_pending", message: "\(pending) migration(s) pending: run trunk-sync migrate.").response(for: .native)
            }
            guard tokens.hasLoadedKeys else {
                return APIError(status: 503, code: "signing_keys_not_loaded", message: "The signing keys have not been loaded yet.").response(for: .native)
            }
            return .json(.ok, #"{"status":"ready"}"#)
        } catch let error as MigrationError {
            logger.error("not ready", metadata: ["reason": "\(error)"])
            return APIError(status: 503, code: "migrations_invalid", message: "Applied migrations do not match this server's files.").response(for: .native)
        } catch {
            logger.error("not ready: database unavailable", metadata: ["error": "\(error)"])
            return APIError(status: 503, code: "database_unavailable", message: "The database is not reachable.").response(for: .native)
        }
    }
}

/// One background task at a time, cancelled and awaited on `stop()`.
final class BackgroundTask: Sendable {
    private let task = Mutex<Task<Void, Never>?>(nil)

    /// Runs `task` instead of the current one (which is cancelled).
    func replace(with new: Task<Void, Never>) {
        task.withLock { current in
            current?.cancel()
            current = new
        }
    }

    /// Cancels the task and waits until it has finished.
    func stop() async {
        let current = task.withLock { current in
            defer { current = nil }
            return current
        }
        current?.cancel()
        await current?.value
    }
}
