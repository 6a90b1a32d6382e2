import ArgumentParser
import Foundation
import Logging
import Postgres
import TrunkSync

struct KeysCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keys",
        abstract: "List, add and retire the ES256 keys that sign access tokens; import another issuer's public keys.",
        discussion: """
            Without keys, access tokens are HS256 with TRUNK_SYNC_JWT_SECRET. That secret always \
            verifies tokens, so adding keys signs no one out.

            Rotation (servers reload keys every 60 seconds; no restart needed):

            1. `trunk-sync keys add` prints the new kid. Within 60 s every instance verifies the \
            key and publishes it in /auth/v1/.well-known/jwks.json. It signs new tokens 11 minutes \
            after it was added, once every instance and every jwks.json cache (max-age 600 s) \
            knows it.

            2. `trunk-sync keys list` shows it pending, then signing; older keys keep verifying.

            3. `trunk-sync keys retire OLD_KID` once the access token lifetime \
            (TRUNK_SYNC_JWT_EXPIRY, default 1 hour) has passed since the new key started signing. \
            Before that, retire refuses unless --force: tokens signed with the old key would get 401.

            Private keys are stored in the table signing_keys encrypted (AES-256-GCM) with \
            TRUNK_SYNC_KEY_ENCRYPTION_KEY, which add needs, as do migrate and every server: the \
            same key everywhere, kept out of the database and its backups.

            Moving from a hosted Supabase project on asymmetric keys: `trunk-sync keys import-jwks \
            FILE` stores its public keys as verify-only (with TRUNK_SYNC_ACCEPTED_ISSUERS naming \
            its issuer), so the access tokens it issued work until they expire.
            """,
        subcommands: [List.self, Add.self, Retire.self, ImportJWKS.self]
    )

    /// The store on the owner's connection; `writing` (add, retire) first checks that it is
    /// the owner, whom the server's login is not.
    static func store(_ options: CommonOptions, writing: Bool) async throws -> (SigningKeyStore, Configuration) {
        let configuration = try options.load()
        let logger = Logger(label: "trunk-sync.keys")
        let database =
            writing
            ? try await ownerDatabase(configuration, logger: logger)
            : try commandDatabase(configuration, logger: logger)
        return (SigningKeyStore(database: database, encryption: configuration.keyEncryptionKey), configuration)
    }

    static func time(_ timestamp: PostgresTimestamp) -> String { RFC3339.format(timestamp, fractionDigits: 0) }

    static func duration(_ seconds: Double) -> String {
        let whole = max(0, Int(seconds.rounded(.up)))
        return whole >= 60 ? "\(whole / 60)m\(String(format: "%02d", whole % 60))s" : "\(whole)s"
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "A table of signing keys: KID, ALG, CREATED, STATUS (signing, verifying, pending, retired).")
        @OptionGroup var options: CommonOptions

        func run() async throws {
            try await reportingErrors {
                let (store, _) = try await KeysCommand.store(options, writing: false)
                let keys = try await store.list()
                let rows = keys.map { key -> [String] in
                    let status: String
                    switch key.status {
                    case .signing: status = "signing"
                    case .verifying: status = "verifying"
                    case .pending(let seconds):
                        status = "pending (verifying; signs in \(KeysCommand.duration(seconds)))"
                    case .retired: status = "retired " + (key.retiredAt.map(KeysCommand.time) ?? "")
                    }
                    return [key.keyID, key.algorithm, KeysCommand.time(key.createdAt), status]
                }
                let imported = try await ImportedKeys.list(database: store.database).map { key -> [String] in
                    [
                        key.keyID, key.algorithm, KeysCommand.time(key.createdAt),
                        key.retiredAt.map { "retired " + KeysCommand.time($0) } ?? "imported (verifies only)",
                    ]
                }
                print(table(header: ["KID", "ALG", "CREATED", "STATUS"], rows: rows + imported))
                let signing = keys.contains { $0.status == .signing }
                print(
                    "\(keys.count) key(s); HS256 (TRUNK_SYNC_JWT_SECRET) verifies"
                        + (signing ? "" : " and signs new tokens"))
            }
        }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Generate a P-256 key and print its kid. It verifies within 60 s and signs after 11 minutes.",
            discussion: "See `trunk-sync keys --help` for the whole rotation.")
        @OptionGroup var options: CommonOptions

        func run() async throws {
            try await reportingErrors {
                let (store, _) = try await KeysCommand.store(options, writing: true)
                let key = try await store.add()
                print(key.keyID ?? "")
                FileHandle.standardError.write(
                    Data(
                        """
                        added ES256 key \(key.keyID ?? ""): servers verify and publish it within 60 s and sign \
                        new tokens with it in \(KeysCommand.duration(SigningKeyStore.activationDelay)).
                        Retire the previous key once the token lifetime has passed after that.

                        """.utf8))
            }
        }
    }

    struct Retire: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Stop verifying (and publishing) a key; servers reject its tokens within 60 s.",
            discussion: """
                Refuses, unless --force, while the key signs or is pending (about to sign), or while \
                tokens it signed may still be valid (the access token lifetime after a newer key took over).
                """)
        @OptionGroup var options: CommonOptions
        @Argument(help: "The key's kid (see trunk-sync keys list).") var kid: String
        @Flag(help: "Retire even though tokens it signed may still be valid (they get 401).") var force = false

        func run() async throws {
            try await reportingErrors {
                let (store, configuration) = try await KeysCommand.store(options, writing: true)
                // An imported key signs nothing here: retiring it only ends its tokens.
                if try await ImportedKeys.retire(kid, database: store.database) {
                    print("retired imported key \(kid): servers stop verifying its tokens within 60 s")
                    return
                }
                switch try await store.retire(kid, tokenLifetime: configuration.jwtExpiry, force: force) {
                case .retired:
                    print("retired \(kid): servers stop verifying its tokens within 60 s")
                case .alreadyRetired(let time):
                    print("\(kid) was already retired at \(KeysCommand.time(time))")
                }
            }
        }
    }

    struct ImportJWKS: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "import-jwks",
            abstract: "Import another issuer's public keys (a JWKS file) as verify-only keys.",
            discussion: """
                For a hosted Supabase project on asymmetric keys: save \
                https://<ref>.supabase.co/auth/v1/.well-known/jwks.json to FILE, import it, and set \
                TRUNK_SYNC_ACCEPTED_ISSUERS=https://<ref>.supabase.co/auth/v1. ES256 and RS256 keys \
                are accepted; each needs a kid; private members are refused. Servers verify with \
                them within 60 s. Retire one with `trunk-sync keys retire KID` once the tokens it \
                signed have expired.
                """)
        @OptionGroup var options: CommonOptions
        @Argument(help: "The JWKS file ({\"keys\": [...]}) or one JWK.") var file: String

        func run() async throws {
            try await reportingErrors {
                // One line and exit 1, as every other refusal (a ValidationError printed
                // the top-level usage after it and exited 64).
                guard let data = FileManager.default.contents(atPath: file) else {
                    throw CommandError("cannot read the JWKS file \(file)")
                }
                let entries = try ImportedKeys.parse(data)
                let (store, _) = try await KeysCommand.store(options, writing: true)
                _ = try await ImportedKeys.store(entries, database: store.database)
                for entry in entries { print("imported \(entry.algorithm) key \(entry.keyID) (verifies only)") }
            }
        }
    }
}
