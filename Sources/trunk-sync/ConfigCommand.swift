import ArgumentParser
import Foundation
import Logging
import TrunkSync

struct ConfigCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "config",
        abstract: "Inspect the configuration.",
        subcommands: [Check.self, Defaults.self]
    )

    struct Check: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Print the effective configuration (secrets redacted) and every problem migrate or serve would refuse; exit 1 if there is one."
        )

        @OptionGroup var options: CommonOptions

        func run() async throws {
            try await reportingErrors {
                // Every problem in one run, after the configuration as far as it could be read.
                let configuration = Configuration.inspect(file: options.configFile, flags: options.flags)
                TrunkLogHandler.bootstrap(level: configuration.logLevel, format: configuration.logFormat)
                print(configuration.redactedDescription)
                // What serve would warn about at start-up (not part of the exit status).
                if let warning = configuration.documentationHostWarning {
                    Logger(label: "trunk-sync.config").warning("\(warning)")
                }
                let problems = configuration.allProblems
                if !problems.isEmpty {
                    for problem in problems {
                        FileHandle.standardError.write(Data("trunk-sync: \(problem)\n".utf8))
                    }
                    print(
                        "configuration refused: \(problems.count) problem\(problems.count == 1 ? "" : "s") (on stderr)")
                    throw ExitCode(1)
                }
                print("configuration OK")
                // What serve would warn about the database role (not part of the exit status).
                await DatabaseRoles.report(
                    url: try configuration.requireDatabaseURL(), logger: Logger(label: "trunk-sync.config"))
            }
        }
    }

    struct Defaults: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Print every setting's default as config/defaults.json (--json) or as the settings table of config/README.md (--markdown)."
        )

        @Flag(help: "Print config/defaults.json.") var json = false
        @Flag(help: "Print the settings table of config/README.md.") var markdown = false

        func validate() throws {
            guard json != markdown else { throw ValidationError("give one of --json or --markdown") }
        }

        func run() throws {
            print(json ? SettingsDocument.defaultsJSON : SettingsDocument.markdownTable, terminator: "")
        }
    }
}
