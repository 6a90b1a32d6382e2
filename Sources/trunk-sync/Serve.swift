import ArgumentParser
import CSystem
import Dispatch
import Foundation
import HTTPServer
import Logging
import Synchronization
import TrunkSync

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the HTTP server.")

    @OptionGroup var options: CommonOptions

    @Option(help: "Address to listen on; overrides TRUNK_SYNC_HOST.")
    var host: String?

    @Option(help: "Port to listen on (0: any free port); overrides TRUNK_SYNC_PORT.")
    var port: String?

    func run() async throws {
        try await reportingErrors {
            var flags: [String: String] = [:]
            flags["host"] = host
            flags["port"] = port
            let configuration = try options.load(extraFlags: flags)
            let logger = Logger(label: "trunk-sync")
            // Signals first, before anything waits (a listen address's name looked up, the
            // database): a SIGTERM (docker compose stop, systemd) while start-up waits for a
            // database that does not answer must end it cleanly, not kill the process
            // half-way; and one right after "listening" must still shut down cleanly.
            // A write to a peer that went away (a socket libpq or OpenSSL writes to while
            // closing, a log pipe whose reader left) must be an EPIPE error, never the end of
            // the process: one compose-native run died of SIGPIPE while shutting down.
            signal(SIGPIPE, SIG_IGN)
            let stop = StopRequest()
            let signals = ShutdownSignals {
                logger.notice("signal received, shutting down")
                stop.request()
            }
            await signals.waitUntilInstalled()
            let application: Application
            do {
                try configuration.validateForServe()
                application = try Application(configuration: configuration, logger: logger)
            } catch {
                signals.cancel()
                throw error
            }
            // The checks before accepting requests wait on the database (each connection
            // attempt up to its connect_timeout); a signal cancels them.
            let startUp = Task { try await Self.prepare(application, configuration: configuration, logger: logger) }
            stop.onRequest { startUp.cancel() }
            do {
                try await startUp.value
            } catch {
                // Close what start-up opened (the application's database, its loop, the
                // listener; `reportingErrors` then joins every thread) before the one line.
                application.beginShutdown()
                signals.cancel()
                await application.close()
                if startUp.isCancelled {  // a signal: a requested stop, exit 0
                    logger.notice("stopped during start-up")
                    return
                }
                throw error
            }
            // Sign-in codes nobody can use any more, removed now and then (migration 0021).
            application.startHousekeeping()
            let server = HTTPServer(
                configuration: application.serverConfiguration, responder: application.pipeline(),
                logger: Logger(label: "trunk-sync.http"))
            application.observe(server)
            // Operator endpoints (/metrics) on a listener of their own, private by default.
            let admin = HTTPServer(
                configuration: application.adminServerConfiguration, responder: application.adminPipeline(),
                logger: Logger(label: "trunk-sync.admin"))
            // From now on a signal stops the listeners (at once, if one came meanwhile: then
            // `start` throws `.shutDownBeforeStart`).
            stop.onRequest {
                application.beginShutdown()
                server.shutdown()
                admin.shutdown()
            }
            let adminPort: Int
            let port: Int
            do {
                do {
                    adminPort = try admin.start()
                } catch let error as HTTPServerError where error != .shutDownBeforeStart {
                    throw StartupError(
                        description: "admin listener (TRUNK_SYNC_ADMIN_HOST, TRUNK_SYNC_ADMIN_PORT): \(error)")
                }
                do {
                    port = try server.start()
                } catch let error as HTTPServerError where error != .shutDownBeforeStart {
                    throw StartupError(description: "listener (TRUNK_SYNC_HOST, TRUNK_SYNC_PORT): \(error)")
                }
            } catch {
                // Close everything opened so far before the one line (the application closes
                // its pools and its database, whose own loop's thread ends; `reportingErrors`
                // then joins every thread): a process that exits with a thread still connecting
                // crashes in OpenSSL's clean-up. A server that never ran stops at once (the
                // pools of its loop close off that loop).
                application.beginShutdown()
                server.shutdown()
                admin.shutdown()
                await server.waitUntilStopped()
                await admin.waitUntilStopped()
                signals.cancel()
                await application.close()
                if (error as? HTTPServerError) == .shutDownBeforeStart {  // a signal came first
                    logger.notice("stopped")
                    return
                }
                throw error
            }
            if configuration.mailer == .log {
                logger.warning("TRUNK_SYNC_MAILER=log: sign-in codes are printed to this log, not mailed")
            }
            if let warning = configuration.documentationHostWarning { logger.warning("\(warning)") }
            if !configuration.trustedProxies.isEmpty {
                logger.notice(
                    "trusting X-Forwarded-For from proxies",
                    metadata: [
                        "proxies": "\(configuration.trustedProxies.networks.map(\.description).joined(separator: ","))"
                    ])
            }
            // The public line first: scripts read the first `listening` line's port.
            logger.notice(
                "listening",
                metadata: ["address": "\(configuration.host)", "port": "\(port)", "url": "\(configuration.publicURL)"])
            logger.notice(
                "admin listening", metadata: ["address": "\(configuration.adminHost)", "port": "\(adminPort)"])

            await server.waitUntilStopped()
            admin.shutdown()
            await admin.waitUntilStopped()
            signals.cancel()
            await application.close()
            logger.notice("stopped")
        }
    }
}

extension Serve {
    /// What `serve` does before it accepts requests, all of it waiting on the database:
    /// the role check, the signing keys, the revoked sessions. Cancelling the task ends the
    /// wait under way (a connection attempt included) and throws `CancellationError`.
    static func prepare(_ application: Application, configuration: Configuration, logger: Logger) async throws {
        try Task.checkCancellation()
        let url = try configuration.requireDatabaseURL()
        let endpoint = try configuration.serverDatabase().endpoint
        logger.info("connecting to the database", metadata: ["database": "\(endpoint)"])
        // Loudly, but not a refusal: deployments that log in as the owner keep working.
        await DatabaseRoles.report(url: url, logger: logger)
        try Task.checkCancellation()
        // Before accepting requests, so tokens signed with ES256 keys verify from the start.
        // A key the key encryption key cannot open is a configuration error: serving
        // without it would answer its tokens 401, so refuse to start instead.
        if let loaded = await application.startSigningKeyRefresh(), let (kid, reason) = loaded.undecryptable.first {
            throw CommandError("signing key \(kid) cannot be used: \(reason)")
        }
        try Task.checkCancellation()
        // Likewise, so that no token of a session revoked before the start is accepted.
        await application.loadRevokedSessions()
        try Task.checkCancellation()
    }
}

/// What a SIGTERM or SIGINT does now: cancel the start-up while it runs, stop the listeners
/// once they exist. An action set after a signal came runs at once.
final class StopRequest: Sendable {
    private let state = Mutex<(requested: Bool, action: (@Sendable () -> Void)?)>((false, nil))

    /// A signal came: runs the current action (each time: every action may run twice).
    func request() {
        let action = state.withLock { state in
            state.requested = true
            return state.action
        }
        action?()
    }

    /// Makes `action` what a signal does from now on; runs it at once if one came already.
    func onRequest(_ action: @escaping @Sendable () -> Void) {
        let requested = state.withLock { state in
            state.action = action
            return state.requested
        }
        if requested { action() }
    }
}

/// `serve` could not start; one line for the operator.
struct StartupError: Error, CustomStringConvertible {
    let description: String
}

/// Turns SIGTERM and SIGINT into one call of `handler` (on a Dispatch queue, never on the
/// cooperative pool).
final class ShutdownSignals: @unchecked Sendable {  // sources are immutable after init
    private let sources: [any DispatchSourceSignal]

    init(_ handler: @escaping @Sendable () -> Void) {
        let queue = DispatchQueue(label: "trunk-sync.signals")
        sources = [SIGTERM, SIGINT].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler(handler: handler)
            source.resume()
            return source
        }
    }

    func cancel() { sources.forEach { $0.cancel() } }

    /// Waits (at most 2 s) until the sources' handlers are in place. libdispatch installs
    /// its signal handler on its manager thread some time after `resume()`; until then the
    /// disposition is the `SIG_IGN` set above, and a SIGTERM sent right after `listening`
    /// (a supervisor, a test) would be dropped on a busy machine.
    func waitUntilInstalled() async {
        for _ in 0..<2000 {
            if [SIGTERM, SIGINT].allSatisfy({ csystem_signal_is_ignored($0) == 0 }) { return }
            try? await Task.sleep(for: .milliseconds(1))
        }
    }
}
