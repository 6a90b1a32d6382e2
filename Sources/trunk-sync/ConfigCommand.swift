import ArgumentParser
import Foundation
import Logging
import TrunkSync

struct ConfigCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "config",
        abstract: "Inspect the configuration.",
        subcommands: [Check.self]
    )

    struct Check: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the effective configuration (secrets redacted); exit 1 if it is not valid for serve."
        )

        @OptionGroup var options: CommonOptions

        func run() async throws {
            try await reportingErrors {
                let configuration = try options.load()
                print(configuration.redactedDescription)
                try configuration.validateForServe()
                print("configuration OK")
                // What serve would warn about the database role (not part of the exit status).
                await DatabaseRoles.report(
                    url: try configuration.requireDatabaseURL(), logger: Logger(label: "trunk-sync.config"))
            }
        }
    }
}
