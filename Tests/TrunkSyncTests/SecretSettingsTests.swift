import Foundation
import TestSupport
import TrunkSync
import XCTest

/// Secrets as operators set them, through the real binary: `config check` and `serve` refuse
/// weak or example values with one line that never quotes them.
final class SecretSettingsTests: XCTestCase {
    /// A database URL that parses; `serve` reaches it only after its configuration passed.
    let unreachableDatabase = "postgres://trunk:db-password-7f3a9c@127.0.0.1:1/trunk_sync"

    /// Runs `trunk-sync arguments` and waits at most `seconds`; a process still running then
    /// (a `serve` that accepted its configuration) is killed and reported as nil.
    func run(_ arguments: [String], _ environment: [String: String], seconds: Double = 15) throws -> Command.Result? {
        let (process, stdout, stderr) = try Command.start(
            Command.trunkSyncBinary(), arguments, environment: Command.environment(environment))
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning, Date() < deadline { usleep(20_000) }
        if process.isRunning {
            process.terminate()
            _ = Command.finish(process, stdout, stderr)
            return nil
        }
        return Command.finish(process, stdout, stderr)
    }

    /// `config check` and `serve` both exit 1 with exactly one line on stderr that starts with
    /// `trunk-sync: VARIABLE`, says how to make a good value when asked, and contains none of
    /// `hidden` (in stdout either).
    func assertRefused(
        _ environment: [String: String], variable: String, saying expected: [String] = [], hiding hidden: [String],
        file: StaticString = #filePath, line: UInt = #line
    ) throws {
        for command in [["config", "check"], ["serve"]] {
            guard let result = try run(command, environment) else {
                XCTFail("\(command.joined(separator: " ")) accepted \(variable)", file: file, line: line)
                continue
            }
            let what = "\(command.joined(separator: " ")): \(result.stderr)"
            XCTAssertEqual(result.status, 1, what, file: file, line: line)
            let lines = result.stderr.split(separator: "\n", omittingEmptySubsequences: false)
            XCTAssertEqual(lines.count, 2, "one line: \(what)", file: file, line: line)
            XCTAssertTrue(result.stderr.hasPrefix("trunk-sync: \(variable) "), what, file: file, line: line)
            for text in expected {
                XCTAssertTrue(result.stderr.contains(text), "\(text) in \(what)", file: file, line: line)
            }
            for secret in hidden where !secret.isEmpty {
                XCTAssertFalse(result.stderr.contains(secret), "\(secret) shown: \(what)", file: file, line: line)
                XCTAssertFalse(
                    result.stdout.contains(secret), "\(secret) shown: \(result.stdout)", file: file, line: line)
            }
        }
    }

    // MARK: - Finding: the example secret works in production

    /// Every `TRUNK_SYNC_JWT_SECRET=` value the repository's documentation shows.
    func documentedSecrets(_ variable: String) throws -> [String] {
        let files = [
            ".env.example", "README.md", "docs/operations.md", "docs/api.md", "config/README.md", "docker-compose.yml",
        ]
        var values: [String] = []
        for file in files {
            let text = try String(contentsOfFile: repositoryRoot() + "/" + file, encoding: .utf8)
            let pattern = try NSRegularExpression(pattern: "\(variable)=([^\\s$`'\"|]+)")
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                if let range = Range(match.range(at: 1), in: text) { values.append(String(text[range])) }
            }
        }
        return values
    }

    func testTheExampleSecretIsRefused() throws {
        let examples = try documentedSecrets("TRUNK_SYNC_JWT_SECRET")
        XCTAssertFalse(examples.isEmpty, ".env.example shows a placeholder")
        for example in examples {
            try assertRefused(
                ["TRUNK_SYNC_DATABASE_URL": unreachableDatabase, "TRUNK_SYNC_JWT_SECRET": example],
                variable: "TRUNK_SYNC_JWT_SECRET", saying: ["openssl rand -base64 48"], hiding: [example])
        }
        // Supabase's documented JWT secrets, which operators moving from Supabase paste.
        for example in [
            "super-secret-jwt-token-with-at-least-32-characters-long",
            "your-super-secret-jwt-token-with-at-least-32-characters-long",
        ] {
            try assertRefused(
                ["TRUNK_SYNC_DATABASE_URL": unreachableDatabase, "TRUNK_SYNC_JWT_SECRET": example],
                variable: "TRUNK_SYNC_JWT_SECRET", saying: ["Supabase", "openssl rand -base64 48"], hiding: [example])
        }
        let keys = try documentedSecrets("TRUNK_SYNC_KEY_ENCRYPTION_KEY")
        XCTAssertFalse(keys.isEmpty, ".env.example shows a placeholder")
        for example in keys {
            try assertRefused(
                [
                    "TRUNK_SYNC_DATABASE_URL": unreachableDatabase, "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
                    "TRUNK_SYNC_KEY_ENCRYPTION_KEY": example,
                ],
                variable: "TRUNK_SYNC_KEY_ENCRYPTION_KEY", saying: ["openssl rand -base64 48"], hiding: [example])
        }
        // The database passwords the documentation shows: .env.example's and the README's
        // postgres://user:pass@host:port/db.
        let example = try String(contentsOfFile: repositoryRoot() + "/.env.example", encoding: .utf8)
        let passwords =
            example.split(separator: "\n").filter {
                $0.hasPrefix("POSTGRES_PASSWORD=") || $0.hasPrefix("SERVER_DB_PASSWORD=")
            }
            .map { String($0.split(separator: "=", maxSplits: 1)[1]) } + ["pass"]
        XCTAssertEqual(passwords.count, 3)
        for password in passwords {
            try assertRefused(
                [
                    "TRUNK_SYNC_DATABASE_URL": "postgres://user:\(password)@127.0.0.1:1/trunk_sync",
                    "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
                ],
                variable: "TRUNK_SYNC_DATABASE_URL", saying: ["example password"],
                hiding: [password == "pass" ? "" : password])
        }
    }

    func testShortAndLowEntropySecretsAreRefused() throws {
        let weak = [
            "too-short-secret",  // < 32 bytes
            String(repeating: "x", count: 48),  // one character
            String(repeating: "s3cr3t-", count: 6),  // a short unit repeated
            "0123456789abcdef0123456789abcdef",  // a sequence, repeated
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij",  // a run of consecutive characters
            "end-to-end-test-secret-0123456789abcdef",  // words and a run
            "aaaaaaaabbbbbbbbccccccccddddddddeeeeeeee",  // few distinct characters
            "Change-Me-Please-" + TestSecrets.random(),  // a placeholder, lengthened
        ]
        for secret in weak {
            try assertRefused(
                ["TRUNK_SYNC_DATABASE_URL": unreachableDatabase, "TRUNK_SYNC_JWT_SECRET": secret],
                variable: "TRUNK_SYNC_JWT_SECRET", saying: ["openssl rand -base64 48"], hiding: [secret])
        }
    }

    func testRandomSecretsAreAccepted() throws {
        // What the documentation says to run, and the other common ways of making one.
        for arguments in [
            ["rand", "-base64", "48"], ["rand", "-base64", "32"], ["rand", "-hex", "32"], ["rand", "-hex", "16"],
        ] {
            let made = try Command.run("/usr/bin/openssl", arguments)
            XCTAssertEqual(made.status, 0, made.stderr)
            let secret = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            let result = try XCTUnwrap(
                try run(
                    ["config", "check"],
                    ["TRUNK_SYNC_DATABASE_URL": unreachableDatabase, "TRUNK_SYNC_JWT_SECRET": secret]))
            XCTAssertEqual(result.status, 0, "\(arguments): \(result.stderr)")
            XCTAssertTrue(result.stdout.contains("configuration OK"), result.stdout)
            XCTAssertFalse(result.stdout.contains(secret))
        }
    }

    // MARK: - Finding: secrets in errors

    /// Malformed values of each secret setting, each holding `marker` where the secret part is.
    /// Every setting `Setting.all` marks secret must have some.
    func malformedValues(_ marker: String) -> [String: [String]] {
        let databaseURLs = [
            "postgres://trunk:\(marker)@127.0.0.1:notaport/trunk_sync",  // port
            "postgres://trunk:\(marker)/x@127.0.0.1/trunk_sync",  // unescaped / in the password
            "postgres://trunk:ab@\(marker)@127.0.0.1/trunk_sync",  // unescaped @ in the password
            "postgres://trunk:p%zz\(marker)@127.0.0.1/trunk_sync",  // bad percent-encoding
            "postgres://trunk:\(marker)@[::1/trunk_sync",  // libpq quotes the whole URL
            "postgres://trunk:\(marker)@127.0.0.1/trunk_sync?\(marker)=1",  // unknown parameter
            "postgres://trunk:\(marker)@127.0.0.1/trunk_sync?sslmode=\(marker)",
            "host=127.0.0.1 password=\(marker) \(marker)",  // conninfo without =
            "host=127.0.0.1 password='\(marker)",  // unterminated quote
        ]
        return [
            "database_url": databaseURLs,
            "migration_database_url": databaseURLs,
            "jwt_secret": [
                marker,  // short
                marker + String(repeating: "a", count: 40),  // guessable
                marker + "-change-me-" + TestSecrets.random(),  // a placeholder
            ],
            "smtp_url": [
                "smtp://user:\(marker)@127.0.0.1:notaport",
                "smtp://user:\(marker)@127.0.0.1:587?tls=\(marker)",
                "ftp://user:\(marker)@127.0.0.1",
                "smtp://user:\(marker)@127.0.0.1/path",
                "smtp://user:\(marker)@[::1",
                "smtp://user:p%zz\(marker)@127.0.0.1",
            ],
            "api_key": [marker + "\u{7}", marker + " key", marker + "é"],
            "key_encryption_key": [
                marker,  // short
                marker + String(repeating: "b", count: 40),  // guessable
                marker + "-example-" + TestSecrets.random(),  // a placeholder
            ],
        ]
    }

    func testMalformedSecretSettingsAreRefusedWithoutBeingShown() throws {
        let marker = "sekr" + TestSecrets.randomHex().prefix(12)
        let cases = malformedValues(marker)
        for setting in Setting.all where setting.isSecret {
            let values = try XCTUnwrap(cases[setting.key], "no malformed values for secret setting \(setting.key)")
            for value in values {
                var environment = [
                    "TRUNK_SYNC_DATABASE_URL": unreachableDatabase, "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
                ]
                environment[setting.environmentVariable] = value
                try assertRefused(environment, variable: setting.environmentVariable, hiding: [marker, value])
            }
        }
    }

    /// A command that cannot reach its database says, in its one line, which setting's URL
    /// that is (an operator has two: the owner's and the server's), and never its password.
    /// It said only `could not connect to PostgreSQL at 127.0.0.1:1/trunk_sync: …`.
    func testADatabaseThatCannotBeReachedIsNamedBySetting() throws {
        let owner = "postgres://owner:owner-password-5d1e@127.0.0.1:1/trunk_sync"
        let migrations = repositoryRoot() + "/migrations"
        let both = [
            "TRUNK_SYNC_DATABASE_URL": unreachableDatabase, "TRUNK_SYNC_MIGRATION_DATABASE_URL": owner,
            "TRUNK_SYNC_MIGRATIONS_DIR": migrations, "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
        ]
        let serverOnly = both.filter { $0.key != "TRUNK_SYNC_MIGRATION_DATABASE_URL" }
        let cases: [(arguments: [String], environment: [String: String], variable: String)] = [
            (["migrate"], both, "TRUNK_SYNC_MIGRATION_DATABASE_URL"),
            (["users", "list"], both, "TRUNK_SYNC_MIGRATION_DATABASE_URL"),
            (["keys", "list"], both, "TRUNK_SYNC_MIGRATION_DATABASE_URL"),
            (["migrate", "status"], serverOnly, "TRUNK_SYNC_DATABASE_URL"),
            (["token", "--email", "someone@example.org"], both, "TRUNK_SYNC_DATABASE_URL"),
        ]
        for (arguments, environment, variable) in cases {
            let result = try XCTUnwrap(try run(arguments, environment), "\(arguments) still running")
            let what = "\(arguments.joined(separator: " ")): \(result.stderr)"
            XCTAssertEqual(result.status, 1, what)
            XCTAssertTrue(
                result.stderr.hasSuffix(
                    "trunk-sync: \(variable): could not connect to PostgreSQL at 127.0.0.1:1/trunk_sync: Connection refused; "
                        + "Is the server running on that host and accepting TCP/IP connections?\n"), what)
            XCTAssertFalse(
                result.stderr.contains("db-password-7f3a9c") || result.stderr.contains("owner-password"), what)
        }
    }

    /// A key file that cannot be read is refused with one line naming it, exit 1: it was
    /// `Error: cannot read FILE` followed by the top-level usage, exit 64.
    func testAnUnreadableJWKSFileIsRefusedInOneLine() throws {
        let missing = FileManager.default.temporaryDirectory.appendingPathComponent("jwks-\(UUID().uuidString).json")
            .path
        for file in [missing, FileManager.default.temporaryDirectory.path] {
            let result = try XCTUnwrap(
                try run(["keys", "import-jwks", file], ["TRUNK_SYNC_DATABASE_URL": unreachableDatabase]))
            XCTAssertEqual(result.status, 1, result.stderr)
            XCTAssertEqual(result.stderr, "trunk-sync: cannot read the JWKS file \(file)\n")
        }
    }

    /// A well-formed URL with the wrong password: `serve` runs and logs why it cannot reach
    /// the database, and the password is in no line of it.
    func testDatabaseErrorsInServesLogDoNotShowThePassword() throws {
        let database = try TestDatabase.create(prefix: "secrets")
        defer { try? TestDatabase.drop(database) }
        let marker = "sekr" + TestSecrets.randomHex().prefix(12)
        let url = try TestDatabase.url(of: database).replacingOccurrences(of: "://trunk:", with: "://trunk:\(marker)")
        let (process, stdout, stderr) = try Command.start(
            Command.trunkSyncBinary(), ["serve"],
            environment: Command.environment([
                "TRUNK_SYNC_DATABASE_URL": url, "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(), "TRUNK_SYNC_PORT": "0",
                "TRUNK_SYNC_MIGRATIONS_DIR": repositoryRoot() + "/migrations",
            ]))
        let errors = OutputCollector(reading: stderr.fileHandleForReading)
        let output = OutputCollector(reading: stdout.fileHandleForReading)
        // The first key load fails at once: stop the server once it said why.
        let refused = errors.waitForLine(containing: "password authentication failed", timeout: 30)
        process.terminate()
        process.waitUntilExit()
        XCTAssertTrue(errors.waitForEnd(timeout: 30) && output.waitForEnd(timeout: 30), "the server's output ended")
        XCTAssertNotNil(refused, errors.text)
        XCTAssertFalse(errors.text.contains(marker), errors.text)
        XCTAssertFalse(output.text.contains(marker), output.text)
    }
}
