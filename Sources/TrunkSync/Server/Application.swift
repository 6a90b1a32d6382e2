import Foundation
import HTTPServer
import Logging
import Mail
import Postgres
import Synchronization

/// The trunk-sync application: its routes over the database. Owns nothing that must
/// outlive a request; `serve` builds one and hands its router to the HTTP server.
public struct Application: Sendable {
    /// The effective configuration.
    public let configuration: Configuration
    /// The one door to the database every query goes through (as the restricted role
    /// `trunk_sync_app`): the HTTP loops' pools and the database's own loop.
    public let database: Database
    /// The migrations this binary ships with, for `/readyz`.
    public let migrator: Migrator
    /// Sign-in, sessions and tokens.
    public let auth: AuthService
    /// The event log.
    public let events: EventStore
    /// Wakes long-polls and event streams (LISTEN on its own connection).
    public let notifier: EventNotifier
    /// The live event streams (`GET /sync/v1/stream`).
    public let streams: EventStreams
    /// Supabase Realtime's `postgres_changes` (`GET /realtime/v1/websocket`).
    public let realtime: RealtimeFeed
    /// Counters, histograms and gauges for `/metrics`.
    public let metrics = Metrics()
    /// The ES256 signing keys in the database.
    public let signingKeys: SigningKeyStore
    /// Users' accounts as a whole: export and deletion (the self-service routes use it; so
    /// may operator tools running in the server).
    public let accounts: Accounts
    /// When the application started, Unix seconds (the console's uptime).
    let startedAt: Double
    /// Requests and `5xx` answers per minute over the last hour (the console's chart).
    let requestHistory: RequestHistory
    private let keyRefresh = BackgroundTask()
    private let historySampler = BackgroundTask()
    private let housekeeping = BackgroundTask()
    private let logger: Logger
    /// The last reason `/readyz` was not ready (logged once per change, not per probe).
    private let notReadyReason = LastValue()

    /// The role the server's queries run as (created by the first migration).
    public static let databaseRole = "trunk_sync_app"

    /// Builds the application: the database from the configuration, migrations from its directory,
    /// and `sender` for sign-in codes (by default the one `TRUNK_SYNC_MAILER` names).
    /// `statementObserver` is told every statement the database runs (tests; see
    /// `PostgresLoopPool.Configuration.statementObserver`).
    public init(
        configuration: Configuration, logger: Logger, sender: (any SignInCodeSender)? = nil, listen: Bool = true,
        statementObserver: (@Sendable (String) -> Void)? = nil
    ) throws {
        self.configuration = configuration
        self.logger = logger
        startedAt = Date().timeIntervalSince1970
        requestHistory = RequestHistory(startedAt: startedAt)
        var settings = Database.Settings()
        settings.maxConnections = configuration.databasePoolSize
        settings.acquireTimeout = .milliseconds(Int64(configuration.databasePoolTimeout * 1000))
        settings.sharedPipelineDepth = configuration.databaseSharedReads
        settings.sessionSettings = [("role", Self.databaseRole)]
        // Before a connection serves anything: a failover this server reconnected through
        // moves every user's next seq before the first push reaches the new primary.
        settings.onOpen = SeqTimeline.serverCheck(logger: logger)
        settings.statementObserver = statementObserver
        let database = try configuration.serverDatabase()
        // Whatever can fail comes before the database, whose loop thread starts with it: a
        // refusal here leaves nothing running.
        let migrations = try Migration.load(from: configuration.migrationsDirectory)
        let codeSender = try sender ?? Self.defaultSender(configuration, logger: logger)
        self.database = try Database(database, settings: settings, logger: logger)
        let listener =
            listen
            ? PostgresListener(
                database, channels: [EventStore.channel, SessionRevocations.channel], logger: logger,
                loop: self.database.eventLoop) : nil
        events = EventStore(database: self.database, listener: listener)
        signingKeys = SigningKeyStore(database: self.database, encryption: configuration.keyEncryptionKey)
        notifier = EventNotifier(listener: listener, store: events)
        migrator = Migrator(migrations: migrations, logger: logger)
        let secret = configuration.jwtSecret ?? ""
        auth = AuthService(
            database: self.database,
            tokens: TokenIssuer(
                secret: secret, issuer: configuration.publicURL + "/auth/v1", lifetime: configuration.jwtExpiry,
                acceptedIssuers: configuration.acceptedIssuers),
            secret: secret, sender: codeSender,
            settings: configuration.auth, logger: logger, metrics: metrics)
        accounts = Accounts(database: self.database, logger: logger, revocations: auth.revocations)
        streams = EventStreams(
            settings: configuration.streams, store: events, notifier: notifier, revocations: auth.revocations,
            metrics: metrics, logger: logger)
        realtime = RealtimeFeed(
            settings: configuration.realtime, database: self.database, notifier: notifier,
            revocations: auth.revocations,
            tokens: auth.tokens, metrics: metrics, logger: logger)
        if let listener {
            // Both subscribe before the listener starts, so neither misses its first
            // `.listening` (which makes the revocations load).
            let notifier = self.notifier
            let revocations = listener.events(channels: [SessionRevocations.channel])
            auth.revocations.follow(revocations, wake: { notifier.wake($0) })
            listener.start()
        }
        let notifier = self.notifier
        let revocations = auth.revocations
        metrics.gauge("trunk_sync_revoked_sessions", help: "Revoked sessions whose access tokens may still be valid.") {
            Double(revocations.count)
        }
        // Every pool of the door: the HTTP loops' shares and the own loop's.
        let door = self.database
        @Sendable func both(_ figure: (PostgresLoopPool.Statistics) -> Int) -> Double {
            Double(figure(door.statistics))
        }
        metrics.gauge("trunk_sync_db_pool_connections_open", help: "Database connections open.") { both(\.open) }
        metrics.gauge("trunk_sync_db_pool_connections_in_use", help: "Database connections running a query.") {
            both(\.inUse)
        }
        metrics.gauge("trunk_sync_db_pool_waiting", help: "Requests waiting for a database connection.") {
            both(\.waiting)
        }
        metrics.gauge("trunk_sync_longpolls_waiting", help: "Pulls waiting for new events.") {
            Double(notifier.waiting)
        }
        let mail = auth.mail
        metrics.gauge("trunk_sync_mail_queue_length", help: "Sign-in mails waiting for a sender.") {
            Double(mail.waiting)
        }
    }

    static func defaultSender(_ configuration: Configuration, logger: Logger) throws -> any SignInCodeSender {
        switch configuration.mailer {
        case .log:
            return MailCodeSender(mailer: LogMailer(logger: logger), from: configuration.mailFrom)
        case .smtp:
            let smtp = try SMTPConfiguration(url: configuration.smtpURL ?? "")
            // As many SMTP sessions as the mail queue has senders: no sender waits on another.
            let mailer = try SMTPMailer(
                configuration: smtp, logger: logger, maximumConnections: configuration.auth.mailSenders)
            return MailCodeSender(mailer: mailer, from: configuration.mailFrom)
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

    /// Loads the revoked sessions now, as `serve` does before accepting requests (the
    /// listener's connection reloads them too, and retries); a failure is logged.
    public func loadRevokedSessions() async {
        do {
            try await auth.revocations.load()
        } catch {
            if Task.isCancelled { return }  // `serve` stopping during its start-up
            logger.error("cannot load revoked sessions; retrying", metadata: ["error": "\(Migrator.explain(error))"])
        }
    }

    /// Loads the signing keys, then reloads them every `interval` in a background task until
    /// `close()`, so `trunk-sync keys add|retire` reach every instance without a restart. A
    /// failed load is logged and retried after 5 seconds (`/readyz` answers 503 until the
    /// first load succeeds). Returns what the first load found, nil when it failed (or the
    /// task was cancelled during it: then nothing is logged and no refresh starts).
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
            if Task.isCancelled { return nil }  // `serve` stopping during its start-up: no refresh
            logger.error("cannot load signing keys; retrying", metadata: ["error": "\(Migrator.explain(error))"])
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
                        logger.error(
                            "cannot reload signing keys; retrying", metadata: ["error": "\(Migrator.explain(error))"])
                        delay = retry
                    }
                }
            })
        return first
    }

    /// Removes the sign-in and confirmation codes that carry nothing any more (expired over a
    /// day ago, no refused attempt within a day, no lock running: migration 0021), at most
    /// `maxRows` of each table. Returns how many of each went.
    @discardableResult
    public func trimStaleCodes(maxRows: Int = staleCodesBatch) async throws -> (signIn: Int, confirmation: Int) {
        try await database.transaction(as: .server) { tx in
            let row = try await tx.query("select * from trunk_sync_trim_stale_codes($1::integer)", Int64(maxRows))[0]
            return (Int(try row.decode(Int64.self, column: 0)), Int(try row.decode(Int64.self, column: 1)))
        }
    }

    /// Rows of each table one `trimStaleCodes` removes at most.
    public static let staleCodesBatch = 10_000

    /// Runs `trimStaleCodes` a minute after the start and then every `interval` until
    /// `close()` (a task that sleeps in between: no thread, no connection held). A batch that
    /// came back full goes on at once; a failure is logged and tried again next time.
    public func startHousekeeping(every interval: Duration = .seconds(600), first: Duration = .seconds(60)) {
        let logger = self.logger
        housekeeping.replace(
            with: Task { [self] in
                var delay = first
                while true {
                    do { try await Task.sleep(for: delay) } catch { return }  // cancelled by close()
                    delay = interval
                    do {
                        let removed = try await trimStaleCodes()
                        if removed.signIn + removed.confirmation > 0 {
                            logger.info(
                                "removed stale codes",
                                metadata: ["sign_in": "\(removed.signIn)", "confirmation": "\(removed.confirmation)"])
                        }
                        if max(removed.signIn, removed.confirmation) >= Self.staleCodesBatch { delay = .seconds(1) }
                    } catch {
                        if Task.isCancelled { return }
                        logger.warning("cannot remove stale codes", metadata: ["error": "\(error)"])
                    }
                }
            })
    }

    /// The HTTP server's settings taken from the configuration.
    public var serverConfiguration: HTTPServerConfiguration { Self.serverConfiguration(of: configuration) }

    /// The public HTTP server's settings taken from `configuration`.
    public static func serverConfiguration(of configuration: Configuration) -> HTTPServerConfiguration {
        var server = HTTPServerConfiguration()
        server.host = configuration.host
        server.port = configuration.port
        server.headerTimeout = .seconds(configuration.httpHeaderTimeout)
        server.bodyTimeout = .seconds(configuration.httpBodyTimeout)
        server.keepAliveTimeout = .seconds(configuration.httpIdleTimeout)
        server.writeTimeout = .seconds(configuration.httpWriteTimeout)
        server.maxConnections = configuration.httpMaxConnections
        server.maxConnectionsPerClient = configuration.httpMaxConnectionsPerClient
        server.maxBufferedOutput = configuration.httpMaxBufferedOutput
        server.maxBufferedOutputPerClient = configuration.httpMaxBufferedOutputPerClient
        server.maxBufferedInput = configuration.httpMaxBufferedInput
        server.maxBufferedInputPerClient = configuration.httpMaxBufferedInputPerClient
        server.loops = configuration.eventLoopCount
        server.loopScheduling = configuration.eventLoopScheduling
        server.trustedProxies = configuration.trustedProxies
        return server
    }

    /// The operator listener's settings: `TRUNK_SYNC_ADMIN_HOST` / `_PORT`, the same
    /// timeouts and trusted proxies (a TLS proxy may serve the console: its
    /// `X-Forwarded-Proto` makes the console's cookie `Secure`), few connections (a scraper or
    /// two, an operator's curl).
    public var adminServerConfiguration: HTTPServerConfiguration { Self.adminServerConfiguration(of: configuration) }

    /// The admin listener's settings taken from `configuration`.
    public static func adminServerConfiguration(of configuration: Configuration) -> HTTPServerConfiguration {
        var server = serverConfiguration(of: configuration)
        server.host = configuration.adminHost
        server.port = configuration.adminPort
        server.maxConnections = 64
        server.maxConnectionsPerClient = 0
        server.loops = 1  // a scraper or an operator: one loop is plenty
        return server
    }

    /// Every public route of the application with its declarations. Operator endpoints are
    /// not among them: they are on the admin listener (`adminRoutes`).
    public func routes() -> Routes {
        var routes = Routes(metrics: metrics)
        let healthy = Array(#"{"status":"ok"}"#.utf8)
        // Whoever opens the server's address in a browser learns what it is and where its API
        // is described (no version: nothing an attacker could use).
        let pointer = Array(
            #"{"service":"trunk-sync","message":"A trunk-sync sync server. Its HTTP API is described at /openapi.json (OpenAPI 3.1); the guides are in the docs/ directory of its source.","openapi":"/openapi.json"}"#
                .utf8)
        routes.add(.get, "/", family: .native, .inline { _ in .json(.ok, pointer) })
        routes.add(.get, "/healthz", family: .native, .inline { _ in .json(.ok, healthy) })
        routes.add(.get, "/readyz", family: .native, .open { _ in await publicReadiness() })
        let document = OpenAPIDocument.bytes
        routes.add(.get, "/openapi.json", family: .native, .inline { _ in .json(.ok, document) })
        WebClientRoute.register(in: &routes)
        AuthRoutes(service: auth).register(in: &routes)
        SyncRoutes(store: events, notifier: notifier, metrics: metrics, revocations: auth.revocations)
            .register(in: &routes)
        StreamRoutes(streams: streams).register(in: &routes)
        RealtimeRoutes(feed: realtime, apiKey: configuration.apiKey).register(in: &routes)
        RESTRoutes(
            database: database, store: events, metrics: metrics,
            statementTimeout: .microseconds(Int64(configuration.restStatementTimeout * 1_000_000))
        ).register(in: &routes)
        AccountRoutes(accounts: accounts, auth: auth, notifier: notifier).register(in: &routes)
        return routes
    }

    /// The operator endpoints, served only on the admin listener: `/metrics`, `/readyz` with
    /// its reason, `/healthz`, and the console (`/console/`, `/admin/v1/…`). Their requests
    /// are observed apart (a `Metrics` of their own that nobody renders), so scrapes and the
    /// console do not mix into the public routes' series.
    public func adminRoutes() -> Routes {
        var routes = Routes(metrics: Metrics())
        let healthy = Array(#"{"status":"ok"}"#.utf8)
        // Whoever opens the admin address learns what is here (the API, and its description
        // at /openapi.json, are on the public listener only).
        let pointer = Array(
            #"{"service":"trunk-sync","message":"The admin listener of a trunk-sync sync server: /healthz, /readyz, /metrics and the operator console at /console/. The HTTP API, described at /openapi.json, is served on the public listener.","console":"/console/"}"#
                .utf8)
        routes.add(.get, "/", family: .native, .inline { _ in .json(.ok, pointer) })
        routes.add(.get, "/healthz", family: .native, .inline { _ in .json(.ok, healthy) })
        routes.add(.get, "/readyz", family: .native, .open { _ in await readiness() })
        let metrics = self.metrics
        routes.add(
            .get, "/metrics", family: .native,
            .inline { _ in
                HTTPResponse(
                    status: .ok, headers: ["Content-Type": "text/plain; version=0.0.4; charset=utf-8"],
                    body: Array(metrics.render().utf8))
            })
        console().register(in: &routes)
        return routes
    }

    /// The console's routes over this application's database, sessions and figures.
    func console() -> ConsoleRoutes {
        let (metrics, notifier, migrator, startedAt) = (self.metrics, self.notifier, migrator, startedAt)
        return ConsoleRoutes(
            auth: ConsoleAuth(
                auth: auth, database: database, operators: configuration.adminEmails,
                logger: Logger(label: "trunk-sync.console")),
            store: ConsoleStore(database: database), accounts: ConsoleAccounts(accounts: accounts),
            sessions: auth,
            overview: { [requestHistory, database] in
                let totals = metrics.requestTotals()
                let now = Date().timeIntervalSince1970
                requestHistory.record(now: now, requests: totals.requests, errors: totals.serverErrors)
                let status = try await database.read(as: .server) {
                    try await migrator.status(on: $0, allowNewer: true)
                }
                return ConsoleRoutes.OverviewFigures(
                    requests: totals.requests, serverErrors: totals.serverErrors, pool: database.statistics,
                    longPollsWaiting: notifier.waiting,
                    schemaVersion: status.applied.map(\.name).max().map {
                        $0.replacingOccurrences(of: ".sql", with: "")
                    }, pendingMigrations: status.pending.count,
                    startedAt: startedAt, history: requestHistory.minutes(now: now))
            }, logger: Logger(label: "trunk-sync.console"))
    }

    /// Connects the application to the public HTTP server: requests get database
    /// connections driven by the server's event loops (one `PostgresLoopPool` per loop,
    /// `TRUNK_SYNC_DB_POOL_SIZE` split across them, at least 1 each: `Database.drive`), and the
    /// metrics the server's gauges (open connections, requests in flight, over all loops).
    public func observe(_ server: HTTPServer<RequestPipeline>) {
        database.drive(on: server.executors, connections: configuration.databasePoolSize)
        metrics.gauge("trunk_sync_http_connections", help: "Open client connections on the public listener.") {
            Double(server.statistics.connections)
        }
        metrics.gauge(
            "trunk_sync_http_requests_in_flight", help: "Requests whose handler is running (public listener)."
        ) {
            Double(server.statistics.inFlight)
        }
        metrics.gauge(
            "trunk_sync_http_output_buffered_bytes",
            help:
                "Bytes waiting in output buffers for their clients to read them: answers, event streams, exports, Realtime messages (public listener; TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT bounds it)."
        ) {
            Double(server.bufferedOutputBytes)
        }
        metrics.gauge(
            "trunk_sync_http_input_buffered_bytes",
            help:
                "Bytes of request bodies being read (public listener; TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT bounds them)."
        ) {
            Double(server.bufferedInputBytes)
        }
        for index in server.executors.indices {
            metrics.gauge(
                "trunk_sync_http_loop_connections",
                help: "Open client connections of each event loop (public listener).",
                labels: "loop=\"\(index)\""
            ) { Double(server.loopStatistics[index].connections) }
        }
        startRequestHistory()
    }

    /// Samples the request totals every 5 seconds into `requestHistory` until `close()`: a
    /// task that sleeps between samples (no thread, no connection held).
    func startRequestHistory(every interval: Duration = .seconds(5)) {
        let (metrics, history) = (self.metrics, requestHistory)
        historySampler.replace(
            with: Task {
                while true {
                    let totals = metrics.requestTotals()
                    history.record(
                        now: Date().timeIntervalSince1970, requests: totals.requests, errors: totals.serverErrors)
                    do { try await Task.sleep(for: interval) } catch { return }  // cancelled by close()
                }
            })
    }

    /// The request pipeline over every public route: what the HTTP server answers with. The
    /// access log is on when `logger` writes `info` lines, in the configured format.
    public func pipeline(logger: Logger = Logger(label: "trunk-sync.http")) -> RequestPipeline {
        let accessLog = logger.logLevel <= .info ? AccessLog(format: configuration.logFormat, label: logger.label) : nil
        return RequestPipeline(
            routes: routes(), corsOrigins: configuration.corsOrigins,
            authenticator: Authenticator(
                tokens: auth.tokens, apiKey: configuration.apiKey, revocations: auth.revocations),
            accessLog: accessLog,
            logger: logger)
    }

    /// The request pipeline of the admin listener: its own routes, no CORS, its own access log,
    /// and the checks that keep other sites out (`AdminRequestGuard`).
    public func adminPipeline(logger: Logger = Logger(label: "trunk-sync.admin")) -> RequestPipeline {
        let accessLog = logger.logLevel <= .info ? AccessLog(format: configuration.logFormat, label: logger.label) : nil
        return RequestPipeline(
            routes: adminRoutes(), corsOrigins: [],
            authenticator: Authenticator(tokens: auth.tokens, apiKey: configuration.apiKey), accessLog: accessLog,
            requestGuard: AdminRequestGuard(bindHost: configuration.adminHost, hostnames: configuration.adminHostnames),
            logger: logger)
    }

    /// Answers waiting long-polls at once, takes no new event streams and stops listening
    /// (graceful shutdown; the HTTP server's shutdown ends the open streams).
    public func beginShutdown() {
        streams.close()
        realtime.close()
        notifier.shutdown()
    }

    /// Stops everything the application started: the key refresh, the listener (its
    /// connection closed on the database's loop, before that loop ends), the mail queue (mails
    /// already queued get up to 5 seconds) and the database (every connection closed, its
    /// loop's thread ended). Also after a start-up that failed half-way:
    /// the loop-driven pool of a server that never ran closes off the loop.
    public func close() async {
        streams.close()
        realtime.close()
        await notifier.close()
        await keyRefresh.stop()
        await historySampler.stop()
        await housekeeping.stop()
        await auth.revocations.stop()
        await auth.mail.close(within: .seconds(5))
        await database.close()
    }

    /// The public `/readyz`: `200 {"status":"ready"}` or `503 not_ready`, nothing more.
    /// Anyone can ask it, so it does not say how many migrations are pending or what failed:
    /// the reason is logged (once per change, not once per probe) and served on the admin
    /// listener.
    func publicReadiness() async -> HTTPResponse {
        guard case .notReady = await checkReadiness() else { return .json(.ok, #"{"status":"ready"}"#) }
        return APIError(status: 503, code: "not_ready", message: "The server is not ready.", retryAfter: 5)
            .response(for: .native)
    }

    /// `200` when the database answers, no migration is pending and the signing keys have
    /// been loaded (and the revoked sessions), else `503` with the reason: the admin listener's `/readyz`.
    func readiness() async -> HTTPResponse {
        switch await checkReadiness() {
        case .ready:
            return .json(.ok, #"{"status":"ready"}"#)
        case .notReady(let code, let message, _):
            return APIError(status: 503, code: code, message: message).response(for: .native)
        }
    }

    enum Readiness: Sendable {
        case ready
        /// `detail`: what only the log gets (an error's text).
        case notReady(code: String, message: String, detail: String?)
    }

    /// Checks readiness and logs when the answer changed (the reason, with an error's text).
    func checkReadiness() async -> Readiness {
        let state = await readinessState()
        let reason: String? =
            switch state {
            case .ready: nil
            case .notReady(_, let message, let detail): detail.map { "\(message) \($0)" } ?? message
            }
        if notReadyReason.replace(with: reason) {
            if let reason {
                logger.warning("not ready", metadata: ["reason": "\(reason)"])
            } else {
                logger.notice("ready")
            }
        }
        return state
    }

    private func readinessState() async -> Readiness {
        do {
            let pending = try await database.read(as: .server) { [migrator] in try await migrator.pendingCount(on: $0) }
            if pending > 0 {
                return .notReady(
                    code: "migrations_pending", message: "\(pending) migration(s) pending: run trunk-sync migrate.",
                    detail: nil)
            }
            guard tokens.hasLoadedKeys else {
                return .notReady(
                    code: "signing_keys_not_loaded", message: "The signing keys have not been loaded yet.", detail: nil)
            }
            guard auth.revocations.isLoaded else {
                return .notReady(
                    code: "revocations_not_loaded", message: "The revoked sessions have not been loaded yet.",
                    detail: nil)
            }
            return .ready
        } catch let error as MigrationError {
            return .notReady(
                code: "migrations_invalid", message: "Applied migrations do not match this server's files.",
                detail: "\(error)")
        } catch {
            return .notReady(
                code: "database_unavailable", message: "The database is not reachable.", detail: "\(error)")
        }
    }
}

/// The last value seen, to log a state once when it changes rather than on every check.
final class LastValue: Sendable {
    private let value = Mutex<String?>(nil)

    /// Stores `new`; whether it differs from the value before.
    func replace(with new: String?) -> Bool {
        value.withLock { value in
            defer { value = new }
            return value != new
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
