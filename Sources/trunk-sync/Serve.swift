import ArgumentParser
import Dispatch
import Foundation
import HTTPServer
import Logging
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
            try configuration.validateForServe()
            let logger = Logger(label: "trunk-sync")
            let application = try Application(configuration: configuration, logger: logger)
            // Loudly, but not a refusal: deployments that log in as the owner keep working.
            await DatabaseRoles.report(url: try configuration.requireDatabaseURL(), logger: logger)
            // Before accepting requests, so tokens signed with ES256 keys verify from the start.
            // A key the key encryption key cannot open is a configuration error: serving
            // without it would answer its tokens 401, so refuse to start instead.
            if let loaded = await application.startSigningKeyRefresh(), let (kid, reason) = loaded.undecryptable.first {
                await application.close()
                throw CommandError("signing key \(kid) cannot be used: \(reason)")
            }
            let server = HTTPServer(
                configuration: application.serverConfiguration, responder: application.pipeline(),
                logger: Logger(label: "trunk-sync.http"))
            // Signals first: a SIGTERM right after "listening" must still shut down cleanly.
            let signals = ShutdownSignals {
                logger.notice("signal received, shutting down")
                application.beginShutdown()
                server.shutdown()
            }
            let port = try server.start()
            if configuration.mailer == .log {
                logger.warning("TRUNK_SYNC_MAILER=log: sign-in codes are printed to this log, not mailed")
            }
            logger.notice(
                "listening", metadata: ["address": "\(configuration.host)", "port": "\(port)", "url": "\(configuration.publicURL)"])

            await server.waitUntilStopped()
            signals.cancel()
            await application.close()
            logger.notice("stopped")
        }
    }
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
}
