import ArgumentParser
import Foundation
import Logging
import TrunkSync

struct TokenCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token",
        abstract: "Print a session (as /auth/v1/verify returns it) for an email, creating the user if needed."
    )

    @OptionGroup var options: CommonOptions

    @Option(help: "The user's email address.")
    var email: String

    func run() async throws {
        try await reportingErrors {
            let configuration = try options.load()
            try configuration.validateForServe(mail: false)
            guard let address = Email(email) else { throw ValidationError("\(email) is not a valid email address") }
            let logger = Logger(label: "trunk-sync.token")
            let application = try Application(configuration: configuration, logger: logger, listen: false)
            onExit { await application.close() }
            try await application.reloadSigningKeys()  // sign as the servers do (ES256 when a key signs)
            let session = try await application.auth.issueSession(email: address)
            FileHandle.standardOutput.write(Data(session.json + [UInt8(ascii: "\n")]))
        }
    }
}
