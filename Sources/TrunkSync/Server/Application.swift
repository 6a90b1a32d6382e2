import Foundation
import HTTPServer
import Logging
import Postgres

/// The trunk-sync application: its routes over the database pool. Owns nothing that must
/// outlive a request; `serve` builds one and hands its router to the HTTP server.
public struct Application: Sendable {
    /// The effective configuration.
    public let configuration: Configuration
    /// The database pool every request uses (as the restricted role `trunk_sync_app`).
    public let pool: PostgresPool
    /// The migrations this binary ships with, for `/readyz`.
    public let migrator: Migrator
    private let logger: Logger

    /// The role the server's queries run as (created by the first migration).
    public static let databaseRole = "trunk_sync_app"

    /// Builds the application: a pool from the configuration, migrations from its directory.
    public init(configuration: Configuration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        var settings = PostgresPool.Configuration()
        settings.maxConnections = configuration.databasePoolSize
        settings.acquireTimeout = .milliseconds(Int64(configuration.databasePoolTimeout * 1000))
        settings.sessionSettings = [("role", Self.databaseRole)]
        pool = PostgresPool(
            try PostgresConfiguration(try configuration.requireDatabaseURL()), configuration: settings, logger: logger)
        migrator = Migrator(migrations: try Migration.load(from: configuration.migrationsDirectory), logger: logger)
    }

    /// The HTTP server's settings taken from the configuration.
    public var serverConfiguration: HTTPServerConfiguration {
        var server = HTTPServerConfiguration()
        server.host = configuration.host
        server.port = configuration.port
        server.corsOrigins = configuration.corsOrigins
        server.headerTimeout = .seconds(configuration.httpHeaderTimeout)
        server.bodyIdleTimeout = .seconds(configuration.httpBodyTimeout)
        server.keepAliveTimeout = .seconds(configuration.httpIdleTimeout)
        server.writeTimeout = .seconds(configuration.httpWriteTimeout)
        server.maxConnections = configuration.httpMaxConnections
        return server
    }

    /// Every route of the application.
    public func router() -> Router {
        var router = Router()
        router.addInline(.get, "/healthz") { _ in .json(.ok, #"{"status":"ok"}"#) }
        router.add(.get, "/readyz") { _ in await readiness() }
        return router
    }

    /// `200` when the database answers and no migration is pending, else `503` with the reason.
    func readiness() async -> HTTPResponse {
        do {
            let pending = try await pool.withConnection { [migrator] in try migrator.pendingCount(on: $0) }
            if pending > 0 {
                return .error(
                    .serviceUnavailable, code: "migrations_pending",
                    message: "\(pending) migration(s) pending: run trunk-sync migrate.")
            }
            return .json(.ok, #"{"status":"ready"}"#)
        } catch let error as MigrationError {
            logger.error("not ready", metadata: ["reason": "\(error)"])
            return .error(.serviceUnavailable, code: "migrations_invalid", message: "Applied migrations do not match this server's files.")
        } catch {
            logger.error("not ready: database unavailable", metadata: ["error": "\(error)"])
            return .error(.serviceUnavailable, code: "database_unavailable", message: "The database is not reachable.")
        }
    }
}
