import ArgumentParser
import Foundation
import Logging
import TrunkSync

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the HTTP server.")

    @OptionGroup var options: CommonOptions

    @Option(help: "Address to listen on; overrides TRUNK_SYNC_HOST.")
    var host: String?

    @Option(help: "Port to listen on; overrides TRUNK_SYNC_PORT.")
    var port: String?

    func run() async throws {
        try await reportingErrors {
            var flags: [String: String] = [:]
            flags["host"] = host
            flags["port"] = port
            let configuration = try options.load(extraFlags: flags)
            try configuration.validateForServe()
            let logger = Logger(label: "trunk-sync")
            logger.notice("configuration is valid; the HTTP server is not built yet, so serve stops here")
        }
    }
}
