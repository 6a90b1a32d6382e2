import ArgumentParser
import Foundation
import Logging
import Postgres
import TrunkSync

struct UsersCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "users",
        abstract: "List, show, export and delete users.",
        subcommands: [List.self, Show.self, Export.self, Delete.self]
    )

    static func admin(_ options: CommonOptions) async throws -> (UserAdmin, Accounts) {
        let configuration = try options.load()
        let logger = Logger(label: "trunk-sync.users")
        let database = try await ownerDatabase(configuration, logger: logger)
        return (UserAdmin(database: database), Accounts(database: database, logger: logger))
    }

    static func user(_ admin: UserAdmin, _ email: String) async throws -> UserAdmin.Summary {
        guard let address = Email(email) else { throw CommandError("\(email) is not a valid email address") }
        guard let user = try await admin.find(address) else { throw CommandError("no user with email \(address)") }
        return user
    }

    static func time(_ timestamp: PostgresTimestamp?) -> String {
        timestamp.map { RFC3339.format($0, fractionDigits: 0) } ?? "never"
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "A table of users: email, created, last sign-in, events.")
        @OptionGroup var options: CommonOptions

        func run() async throws {
            try await reportingErrors {
                let (admin, _) = try await UsersCommand.admin(options)
                let users = try await admin.list()
                let rows = users.map {
                    [$0.email, UsersCommand.time($0.createdAt), UsersCommand.time($0.lastSignInAt), String($0.events)]
                }
                print(table(header: ["EMAIL", "CREATED", "LAST SIGN-IN", "EVENTS"], rows: rows))
                print("\(users.count) user(s)")
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Details of one user.")
        @OptionGroup var options: CommonOptions
        @Argument(help: "The user's email address.") var email: String

        func run() async throws {
            try await reportingErrors {
                let (admin, _) = try await UsersCommand.admin(options)
                let user = try await UsersCommand.user(admin, email)
                print("id:              \(user.id.uuidString.lowercased())")
                print("email:           \(user.email)")
                // None (or empty) shows as the console shows it.
                print("full name:       \(user.fullName.flatMap { $0.isEmpty ? nil : $0 } ?? "—")")
                print("created:         \(UsersCommand.time(user.createdAt))")
                print("last sign-in:    \(UsersCommand.time(user.lastSignInAt))")
                print("events:          \(user.events)")
                print("active sessions: \(user.activeSessions)")
            }
        }
    }

    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Write the user's account and events as JSON lines to stdout, as GET /sync/v1/export does (progress on stderr when it is a terminal)."
        )
        @OptionGroup var options: CommonOptions
        @Argument(help: "The user's email address.") var email: String

        func run() async throws {
            try await reportingErrors {
                let (admin, accounts) = try await UsersCommand.admin(options)
                let user = try await UsersCommand.user(admin, email)
                let showProgress = isatty(STDERR_FILENO) == 1
                let written = try await accounts.export(
                    user.id,
                    progress: { done, total in
                        guard showProgress else { return }
                        let width = 30
                        let filled = total > 0 ? Int(Double(done) / Double(total) * Double(width)) : width
                        let bar =
                            String(repeating: "#", count: min(filled, width))
                            + String(repeating: ".", count: max(0, width - filled))
                        FileHandle.standardError.write(Data("\r[\(bar)] \(done)/\(total) events".utf8))
                    },
                    write: { FileHandle.standardOutput.write(Data($0)) }
                ).events
                if showProgress { FileHandle.standardError.write(Data("\n".utf8)) }
                FileHandle.standardError.write(Data("exported \(written) event(s) of \(user.email)\n".utf8))
            }
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete a user with their sessions and events (asks first unless --yes).")
        @OptionGroup var options: CommonOptions
        @Argument(help: "The user's email address.") var email: String
        @Flag(help: "Do not ask for confirmation.") var yes = false

        func run() async throws {
            try await reportingErrors {
                let (admin, accounts) = try await UsersCommand.admin(options)
                let user = try await UsersCommand.user(admin, email)
                if !yes {
                    FileHandle.standardError.write(
                        Data(
                            "Delete \(user.email) with \(user.events) event(s) and all sessions? This cannot be undone. Type the email to confirm: "
                                .utf8))
                    guard let answer = readLine(),
                        answer.trimmingCharacters(in: .whitespaces).lowercased() == user.email.lowercased()
                    else {
                        throw CommandError("not confirmed; nothing deleted")
                    }
                }
                guard let deleted = try await accounts.delete(user.id) else {
                    throw CommandError("no user with email \(user.email)")
                }
                print("deleted \(user.email) and \(deleted.events) event(s)")
            }
        }
    }
}

/// A one-line error for the operator.
struct CommandError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A plain text table with columns padded to their widest cell.
func table(header: [String], rows: [[String]]) -> String {
    let all = [header] + rows
    let widths = header.indices.map { column in all.map { $0[column].count }.max() ?? 0 }
    return all.map { row in
        row.enumerated().map { index, cell in
            index == row.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
        }.joined(separator: "  ")
    }.joined(separator: "\n")
}
