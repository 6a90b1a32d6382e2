import Foundation
import HTTPServer
import TestSupport
import TrunkSync
import XCTest

final class ConfigurationTests: XCTestCase {
    func testDefaults() throws {
        let configuration = try Configuration.load(environment: [:])
        XCTAssertEqual(configuration.host, "127.0.0.1")
        XCTAssertEqual(configuration.port, 8080)
        XCTAssertEqual(configuration.mailer, .log)
        XCTAssertEqual(configuration.mailFrom, "no-reply@localhost")
        XCTAssertEqual(configuration.publicURL, "http://127.0.0.1:8080")
        XCTAssertEqual(configuration.logLevel, .info)
        XCTAssertEqual(configuration.logFormat, .text)
        XCTAssertEqual(configuration.corsOrigins, [])
        XCTAssertNil(configuration.databaseURL)
        XCTAssertEqual(configuration.adminHost, "127.0.0.1")
        XCTAssertEqual(configuration.adminPort, 9090)
        XCTAssertTrue(configuration.trustedProxies.isEmpty)
        XCTAssertEqual(configuration.httpMaxConnectionsPerClient, 256)
        XCTAssertEqual(configuration.auth.otpEmailRule, RateLimiter.Rule(limit: 10, window: 3600))
        XCTAssertEqual(configuration.auth.verifyEmailRule, RateLimiter.Rule(limit: 30, window: 3600))
        let server = Application.serverConfiguration(of: configuration)
        XCTAssertEqual(server.maxConnectionsPerClient, 256)
        XCTAssertEqual(server.bodyTimeout, .seconds(30))
        XCTAssertEqual(server.maxBufferedOutput, 256 * 1024 * 1024)
        XCTAssertEqual(Application.adminServerConfiguration(of: configuration).maxBufferedOutput, 256 * 1024 * 1024)
        XCTAssertEqual(server.maxBufferedInput, 256 * 1024 * 1024)
        XCTAssertEqual(Application.adminServerConfiguration(of: configuration).maxBufferedInput, 256 * 1024 * 1024)
        XCTAssertEqual(configuration.httpMaxBufferedInputPerClient, 64 * 1024 * 1024, "a quarter of the total")
        XCTAssertEqual(server.maxBufferedInputPerClient, 64 * 1024 * 1024)
        XCTAssertEqual(configuration.httpMaxBufferedOutputPerClient, 64 * 1024 * 1024, "a quarter of the total")
        XCTAssertEqual(server.maxBufferedOutputPerClient, 64 * 1024 * 1024)
    }

    func testTrustedProxiesAndTheNetworkSettings() throws {
        let configuration = try Configuration.load(environment: [
            "TRUNK_SYNC_TRUSTED_PROXIES": " 10.0.0.0/8, 192.0.2.7 ,fd00::/8,, 2001:db8::1",
            "TRUNK_SYNC_HTTP_MAX_CONNECTIONS_PER_CLIENT": "0", "TRUNK_SYNC_ADMIN_PORT": "0",
            "TRUNK_SYNC_ADMIN_HOST": "::1", "TRUNK_SYNC_RATE_LIMIT_OTP_EMAIL": "3/60",
            "TRUNK_SYNC_RATE_LIMIT_VERIFY_EMAIL": "4/120", "TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT": "1048576",
            "TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT": "2097152", "TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT_PER_CLIENT": "1048576",
        ])
        XCTAssertEqual(
            configuration.trustedProxies.networks.map(\.description),
            ["10.0.0.0/8", "192.0.2.7/32", "fd00::/8", "2001:db8::1/128"])
        XCTAssertEqual(configuration.httpMaxConnectionsPerClient, 0)
        XCTAssertEqual(configuration.adminPort, 0)
        XCTAssertEqual(configuration.adminHost, "::1")
        XCTAssertEqual(configuration.auth.otpEmailRule, RateLimiter.Rule(limit: 3, window: 60))
        XCTAssertEqual(configuration.auth.verifyEmailRule, RateLimiter.Rule(limit: 4, window: 120))
        let server = Application.serverConfiguration(of: configuration)
        XCTAssertEqual(server.trustedProxies, configuration.trustedProxies)
        XCTAssertEqual(server.maxConnectionsPerClient, 0)
        XCTAssertEqual(server.maxBufferedOutput, 1_048_576)
        XCTAssertEqual(server.maxBufferedInput, 2_097_152)
        XCTAssertEqual(server.maxBufferedInputPerClient, 1_048_576)
        let admin = Application.adminServerConfiguration(of: configuration)
        XCTAssertEqual(admin.host, "::1")
        XCTAssertEqual(admin.port, 0)
        XCTAssertEqual(admin.trustedProxies, configuration.trustedProxies, "a TLS proxy may serve the console")
    }

    func testFileThenEnvironmentThenFlags() throws {
        let file = NSTemporaryDirectory() + "config-\(UUID().uuidString).json"
        try
            #"{"_comment": "test", "port": 9000, "host": "0.0.0.0", "cors_origins": ["https://a.example", "https://b.example"], "log_format": "json"}"#
            .write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let configuration = try Configuration.load(
            file: file, environment: ["TRUNK_SYNC_PORT": "9100", "TRUNK_SYNC_LOG_FORMAT": "text"],
            flags: ["port": "9200"])
        XCTAssertEqual(configuration.port, 9200)
        XCTAssertEqual(configuration.host, "0.0.0.0")
        XCTAssertEqual(configuration.logFormat, .text)
        XCTAssertEqual(configuration.corsOrigins, ["https://a.example", "https://b.example"])
        XCTAssertEqual(configuration.publicURL, "http://0.0.0.0:9200")
    }

    func testSharedReadsAreOffByDefaultAndTakeADepth() throws {
        XCTAssertEqual(try Configuration.load(file: nil, environment: [:], flags: [:]).databaseSharedReads, 1)
        let on = try Configuration.load(file: nil, environment: ["TRUNK_SYNC_DB_SHARED_READS": "4"], flags: [:])
        XCTAssertEqual(on.databaseSharedReads, 4)
    }

    func testRESTStatementTimeoutIsEightSecondsByDefault() throws {
        XCTAssertEqual(try Configuration.load(file: nil, environment: [:], flags: [:]).restStatementTimeout, 8)
        let short = try Configuration.load(
            file: nil, environment: ["TRUNK_SYNC_REST_STATEMENT_TIMEOUT": "0.25"], flags: [:])
        XCTAssertEqual(short.restStatementTimeout, 0.25)
    }

    func testLoopSchedulingIsBatchByDefaultForBothListeners() throws {
        let defaults = try Configuration.load(file: nil, environment: [:], flags: [:])
        XCTAssertEqual(defaults.eventLoopScheduling, .batch)
        XCTAssertEqual(Application.serverConfiguration(of: defaults).loopScheduling, .batch)
        XCTAssertEqual(Application.adminServerConfiguration(of: defaults).loopScheduling, .batch)
        let normal = try Configuration.load(
            file: nil, environment: ["TRUNK_SYNC_EVENT_LOOP_SCHEDULING": "Normal"], flags: [:])
        XCTAssertEqual(normal.eventLoopScheduling, .normal)
        XCTAssertEqual(Application.serverConfiguration(of: normal).loopScheduling, .normal)
    }

    func testBadValuesNameTheVariable() {
        let cases: [([String: String], String)] = [
            (["TRUNK_SYNC_PORT": "http"], "TRUNK_SYNC_PORT must be a port number"),
            (["TRUNK_SYNC_PORT": "70000"], "TRUNK_SYNC_PORT must be a port number"),
            (["TRUNK_SYNC_MAILER": "pigeon"], "TRUNK_SYNC_MAILER must be log or smtp"),
            (["TRUNK_SYNC_MAILER": "smtp"], "TRUNK_SYNC_SMTP_URL is required"),
            (["TRUNK_SYNC_LOG_LEVEL": "loud"], "TRUNK_SYNC_LOG_LEVEL must be one of"),
            (["TRUNK_SYNC_LOG_FORMAT": "xml"], "TRUNK_SYNC_LOG_FORMAT must be text or json"),
            (["TRUNK_SYNC_PUBLIC_URL": "ftp://x"], "TRUNK_SYNC_PUBLIC_URL must be an http"),
            (["TRUNK_SYNC_DB_POOL_SIZE": "0"], "TRUNK_SYNC_DB_POOL_SIZE must be an integer"),
            (["TRUNK_SYNC_DB_SHARED_READS": "0"], "TRUNK_SYNC_DB_SHARED_READS must be an integer"),
            (["TRUNK_SYNC_DB_SHARED_READS": "65"], "TRUNK_SYNC_DB_SHARED_READS must be an integer"),
            (["TRUNK_SYNC_EVENT_LOOPS": "-1"], "TRUNK_SYNC_EVENT_LOOPS must be an integer"),
            (["TRUNK_SYNC_EVENT_LOOPS": "1025"], "TRUNK_SYNC_EVENT_LOOPS must be an integer"),
            (["TRUNK_SYNC_EVENT_LOOPS": "two"], "TRUNK_SYNC_EVENT_LOOPS must be an integer"),
            (["TRUNK_SYNC_EVENT_LOOP_SCHEDULING": "fifo"], "TRUNK_SYNC_EVENT_LOOP_SCHEDULING must be batch or normal"),
            (
                ["TRUNK_SYNC_REST_STATEMENT_TIMEOUT": "0"],
                "TRUNK_SYNC_REST_STATEMENT_TIMEOUT must be a number of seconds"
            ),
            (
                ["TRUNK_SYNC_REST_STATEMENT_TIMEOUT": "8s"],
                "TRUNK_SYNC_REST_STATEMENT_TIMEOUT must be a number of seconds"
            ),
            (
                ["TRUNK_SYNC_TRUSTED_PROXIES": "10.0.0.0/8,proxy.internal"],
                "TRUNK_SYNC_TRUSTED_PROXIES must be a comma-separated list"
            ),
            (["TRUNK_SYNC_TRUSTED_PROXIES": "10.0.0.1/8"], "TRUNK_SYNC_TRUSTED_PROXIES must be a comma-separated list"),
            (
                ["TRUNK_SYNC_TRUSTED_PROXIES": "10.0.0.0/33"],
                "TRUNK_SYNC_TRUSTED_PROXIES must be a comma-separated list"
            ),
            (["TRUNK_SYNC_ADMIN_PORT": "x"], "TRUNK_SYNC_ADMIN_PORT must be a port number"),
            (
                ["TRUNK_SYNC_ADMIN_HOSTNAMES": "console.internal:9090"],
                "TRUNK_SYNC_ADMIN_HOSTNAMES must be a comma-separated list of host names"
            ),
            (
                ["TRUNK_SYNC_ADMIN_HOSTNAMES": "-bad.example"],
                "TRUNK_SYNC_ADMIN_HOSTNAMES must be a comma-separated list of host names"
            ),
            (
                ["TRUNK_SYNC_ADMIN_HOSTNAMES": "a..b"],
                "TRUNK_SYNC_ADMIN_HOSTNAMES must be a comma-separated list of host names"
            ),
            (["TRUNK_SYNC_ADMIN_PORT": "8080"], "TRUNK_SYNC_ADMIN_PORT must differ from TRUNK_SYNC_PORT"),
            (
                ["TRUNK_SYNC_HTTP_MAX_CONNECTIONS_PER_CLIENT": "-1"],
                "TRUNK_SYNC_HTTP_MAX_CONNECTIONS_PER_CLIENT must be"
            ),
            (["TRUNK_SYNC_RATE_LIMIT_OTP_EMAIL": "10"], "TRUNK_SYNC_RATE_LIMIT_OTP_EMAIL must look like"),
            (["TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT": "1048575"], "TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT must be"),
            (["TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT": "256MiB"], "TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT must be"),
            (["TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT": "1048575"], "TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT must be"),
            (["TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT": "256MiB"], "TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT must be"),
            (["TRUNK_SYNC_RATE_LIMIT_VERIFY_EMAIL": "0/60"], "TRUNK_SYNC_RATE_LIMIT_VERIFY_EMAIL must look like"),
        ]
        for (environment, expected) in cases {
            XCTAssertThrowsError(try Configuration.load(environment: environment)) { error in
                XCTAssertTrue("\(error)".hasPrefix(expected), "\(error)")
            }
        }
    }

    /// What cannot be a listen address is refused with one line naming the setting and the
    /// value (the listener would fail to bind only after start-up waited on the database);
    /// IP addresses and host names are taken, a name that does not resolve refused by `serve`.
    func testListenAddressesMustBeAnAddressOrANameThatResolves() throws {
        let refused: [(String, String, String)] = [
            ("TRUNK_SYNC_HOST", "http://0.0.0.0", #""http://0.0.0.0" is not one: an address, not a URL"#),
            ("TRUNK_SYNC_HOST", "0.0.0.0:8080", #""0.0.0.0:8080" is not one: the port goes in TRUNK_SYNC_PORT"#),
            ("TRUNK_SYNC_ADMIN_HOST", "[::1]", #""[::1]" is not one: an IPv6 address goes without brackets"#),
            ("TRUNK_SYNC_ADMIN_HOST", "127.0.0.1:9", #"is not one: the port goes in TRUNK_SYNC_ADMIN_PORT"#),
            ("TRUNK_SYNC_HOST", "300.1.2.3", #""300.1.2.3" is not one"#),
            ("TRUNK_SYNC_HOST", "two words", #""two words" is not one"#),
        ]
        for (variable, value, reason) in refused {
            XCTAssertThrowsError(try Configuration.load(environment: [variable: value]), value) { error in
                XCTAssertTrue(
                    "\(error)".hasPrefix(
                        "\(variable) must be an IP address (such as 0.0.0.0, 127.0.0.1 or ::) or a host name;"),
                    "\(error)")
                XCTAssertTrue("\(error)".contains(reason), "\(error)")
            }
        }
        let base = ["TRUNK_SYNC_DATABASE_URL": "postgres://x/y", "TRUNK_SYNC_JWT_SECRET": TestSecrets.random()]
        for value in ["0.0.0.0", "::", "::1", "fe80::1%lo", "localhost", "LOCALHOST"] {
            let configuration = try Configuration.load(
                environment: base.merging(["TRUNK_SYNC_HOST": value, "TRUNK_SYNC_ADMIN_HOST": value]) { $1 })
            XCTAssertNoThrow(try configuration.validateForServe(), value)
        }
        // A name is looked up for serve (and config check), not by every command: `.invalid`
        // never resolves (RFC 6761).
        for variable in ["TRUNK_SYNC_HOST", "TRUNK_SYNC_ADMIN_HOST"] {
            let configuration = try Configuration.load(environment: base.merging([variable: "nowhere.invalid"]) { $1 })
            XCTAssertThrowsError(try configuration.validateForServe()) { error in
                XCTAssertTrue("\(error)".hasPrefix(#"\#(variable) "nowhere.invalid" does not resolve ("#), "\(error)")
                XCTAssertTrue("\(error)".hasSuffix("or a name it resolves"), "\(error)")
            }
        }
    }

    /// A misspelt origin would silently break the web app (the browser refuses every answer):
    /// each entry must be `*` or an origin exactly as a browser sends it.
    func testCORSOriginsMustBeOrigins() throws {
        let prefix =
            "TRUNK_SYNC_CORS_ORIGINS must be * or a comma-separated list of origins (scheme://host[:port]: no path, no trailing slash); "
        let refused: [(String, String)] = [
            ("https://app.example.com/", #""https://app.example.com/" is not one: drop the trailing slash"#),
            (
                "https://ok.example, https://app.example.com/app",
                #""https://app.example.com/app" is not one: an origin has no path"#
            ),
            ("app.example.com", #""app.example.com" is not one: it has no scheme://"#),
            ("null", #""null" is not one: it has no scheme://"#),
            ("https://*.example.com", #""https://*.example.com" is not one: only * alone allows any origin"#),
            ("https://app.example.com:443", #"is not one: browsers send it without the default port :443"#),
            ("http://app.example.com:80", #"is not one: browsers send it without the default port :80"#),
            ("https://app.example.com:0", #"is not one: the port must be a number from 1 to 65535"#),
            ("https://app.example.com:99999", #"is not one: the port must be a number from 1 to 65535"#),
            ("https://user@app.example.com", #""https://user@app.example.com" is not one"#),
            ("https://a b.example", #""https://a b.example" is not one"#),
            ("https://app.example.com?x", #""https://app.example.com?x" is not one"#),
            ("https://[::1", #""https://[::1" is not one"#),
            ("1https://app.example.com", #""1https://app.example.com" is not one: it has no scheme://"#),
        ]
        for (value, reason) in refused {
            XCTAssertThrowsError(try Configuration.load(environment: ["TRUNK_SYNC_CORS_ORIGINS": value]), value) {
                XCTAssertTrue("\($0)".hasPrefix(prefix), "\($0)")
                XCTAssertTrue("\($0)".hasSuffix(reason), "\($0)")
            }
        }
        let accepted =
            "*, https://app.example.com, http://localhost:5173, HTTPS://App.Example.COM, capacitor://localhost, "
            + "http://[::1]:3000, http://127.0.0.1:8080, https://app.example.com:8443, tauri://localhost"
        let configuration = try Configuration.load(environment: ["TRUNK_SYNC_CORS_ORIGINS": accepted])
        XCTAssertEqual(configuration.corsOrigins.count, 9)
    }

    func testServeNeedsAStrongSecretAndADatabase() throws {
        XCTAssertThrowsError(
            try Configuration.load(environment: ["TRUNK_SYNC_JWT_SECRET": TestSecrets.random()]).validateForServe()
        ) {
            XCTAssertTrue("\($0)".hasPrefix("TRUNK_SYNC_DATABASE_URL is required"), "\($0)")
        }
        let short = try Configuration.load(environment: [
            "TRUNK_SYNC_DATABASE_URL": "postgres://x/y", "TRUNK_SYNC_JWT_SECRET": "short",
        ])
        XCTAssertThrowsError(try short.validateForServe()) {
            XCTAssertEqual(
                "\($0)", "TRUNK_SYNC_JWT_SECRET must be at least 32 bytes; make one with: openssl rand -base64 48")
        }
        let good = try Configuration.load(
            environment: ["TRUNK_SYNC_DATABASE_URL": "postgres://x/y", "TRUNK_SYNC_JWT_SECRET": TestSecrets.random()])
        XCTAssertNoThrow(try good.validateForServe())
    }

    /// The documentation's SMTP URL left in place: serve would start and no sign-in mail
    /// would ever arrive. Refused, naming the setting, the URL never quoted.
    func testServeRefusesTheExampleSMTPURL() throws {
        let base = [
            "TRUNK_SYNC_DATABASE_URL": "postgres://x/y", "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
            "TRUNK_SYNC_MAILER": "smtp",
        ]
        for url in [
            "smtp://user:password@smtp.example.com:587?tls=starttls",  // .env.example's
            "smtp://mailer:Xk29vQ7pLr@smtp.example.com",  // the example host, a real password
            "smtps://mailer:Xk29vQ7pLr@mail.EXAMPLE.org.:465",
            "smtp://mailer:Xk29vQ7pLr@relay.invalid",
            "smtp://user:pass@mail.provider.net",  // a real host, the example password
            "smtp://user:change-me@mail.provider.net",
        ] {
            let configuration = try Configuration.load(environment: base.merging(["TRUNK_SYNC_SMTP_URL": url]) { $1 })
            XCTAssertThrowsError(try configuration.validateForServe(), url) {
                XCTAssertTrue("\($0)".hasPrefix("TRUNK_SYNC_SMTP_URL is the documentation's example"), "\($0)")
                XCTAssertFalse("\($0)".contains("example.com") || "\($0)".contains("password@"), "\($0)")
            }
        }
        for url in [
            "smtp://mailer:Xk29vQ7pLr@smtp.provider.net", "smtp://127.0.0.1:1025?tls=none", "smtp://mail.examples.com",
            // A local catcher under .test, and a real password that merely contains a word.
            "smtp://mailpit.test:1025?tls=none", "smtp://mailer:my-example-Xk29vQ7@smtp.provider.net",
        ] {
            let configuration = try Configuration.load(environment: base.merging(["TRUNK_SYNC_SMTP_URL": url]) { $1 })
            XCTAssertNoThrow(try configuration.validateForServe(), url)
        }
        // `token` sends no mail: the example URL is no reason to refuse it.
        let example = try Configuration.load(
            environment: base.merging(["TRUNK_SYNC_SMTP_URL": "smtp://user:password@smtp.example.com"]) { $1 })
        XCTAssertNoThrow(try example.validateForServe(mail: false))
        // With the log mailer the URL is not used: nothing to refuse.
        var logMailer = base
        logMailer["TRUNK_SYNC_MAILER"] = "log"
        logMailer["TRUNK_SYNC_SMTP_URL"] = "smtp://user:password@smtp.example.com"
        XCTAssertNoThrow(try Configuration.load(environment: logMailer).validateForServe())
    }

    func testKeyEncryptionKeyFromTheEnvironmentOrAFile() throws {
        let secret = TestSecrets.random()
        XCTAssertEqual(
            try Configuration.load(environment: ["TRUNK_SYNC_KEY_ENCRYPTION_KEY": secret]).keyEncryptionSecret, secret)
        XCTAssertNil(try Configuration.load(environment: [:]).keyEncryptionSecret)
        let file = NSTemporaryDirectory() + "kek-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: file) }
        try (secret + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let fromFile = try Configuration.load(environment: ["TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE": file])
        XCTAssertEqual(fromFile.keyEncryptionSecret, secret, "the trailing newline is not part of it")
        XCTAssertFalse(fromFile.redactedDescription.contains(secret))
        // Empty counts as unset, as for every setting: compose passes an emptied line of .env
        // as an empty variable (docker-compose.yml, the key in a compose secret).
        for (inline, named) in [("", file), (secret, "")] {
            let loaded = try Configuration.load(environment: [
                "TRUNK_SYNC_KEY_ENCRYPTION_KEY": inline, "TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE": named,
            ])
            XCTAssertEqual(loaded.keyEncryptionSecret, secret)
        }
        XCTAssertNil(try Configuration.load(environment: ["TRUNK_SYNC_KEY_ENCRYPTION_KEY": ""]).keyEncryptionSecret)
        XCTAssertThrowsError(
            try Configuration.load(environment: [
                "TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE": file, "TRUNK_SYNC_KEY_ENCRYPTION_KEY": secret,
            ])
        ) {
            XCTAssertTrue(
                "\($0)".hasPrefix("TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE and TRUNK_SYNC_KEY_ENCRYPTION_KEY are both set"),
                "\($0)")
        }
        XCTAssertThrowsError(
            try Configuration.load(environment: ["TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE": file + ".missing"])
        ) {
            XCTAssertEqual(
                "\($0)", "TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE names a file that cannot be read: \(file).missing")
        }
        try "short\n".write(toFile: file, atomically: true, encoding: .utf8)
        XCTAssertThrowsError(try Configuration.load(environment: ["TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE": file])) {
            XCTAssertEqual(
                "\($0)",
                "TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE names a file whose key must be at least 32 bytes; make one with: openssl rand -base64 48"
            )
        }
        // One secret must not serve as both.
        XCTAssertThrowsError(
            try Configuration.load(environment: [
                "TRUNK_SYNC_DATABASE_URL": "postgres://x/y", "TRUNK_SYNC_JWT_SECRET": secret,
                "TRUNK_SYNC_KEY_ENCRYPTION_KEY": secret,
            ]).validateForServe()
        ) {
            XCTAssertTrue(
                "\($0)".hasPrefix("TRUNK_SYNC_KEY_ENCRYPTION_KEY must differ from TRUNK_SYNC_JWT_SECRET"), "\($0)")
        }
    }

    func testUnknownOrMalformedFileIsRefused() throws {
        let file = NSTemporaryDirectory() + "config-\(UUID().uuidString).json"
        defer { try? FileManager.default.removeItem(atPath: file) }
        try #"{"prot": 9000}"#.write(toFile: file, atomically: true, encoding: .utf8)
        XCTAssertThrowsError(try Configuration.load(file: file, environment: [:])) {
            XCTAssertTrue("\($0)".contains("unknown setting \"prot\""), "\($0)")
        }
        try "{ not json".write(toFile: file, atomically: true, encoding: .utf8)
        XCTAssertThrowsError(try Configuration.load(file: file, environment: [:])) {
            XCTAssertTrue("\($0)".contains("must hold one JSON object"), "\($0)")
        }
        XCTAssertThrowsError(try Configuration.load(file: file + ".missing", environment: [:])) {
            XCTAssertTrue("\($0)".contains("cannot read config file"), "\($0)")
        }
    }

    func testRedactedDescriptionHidesSecrets() throws {
        let configuration = try Configuration.load(environment: [
            "TRUNK_SYNC_DATABASE_URL": "postgres://u:db-password@h/d",
            "TRUNK_SYNC_JWT_SECRET": "jwt-secret-value-that-is-long-enough",
            "TRUNK_SYNC_SMTP_URL": "smtp://u:smtp-password@mail:25",
        ])
        let text = configuration.redactedDescription
        for secret in ["db-password", "jwt-secret-value", "smtp-password"] {
            XCTAssertFalse(text.contains(secret), text)
        }
        XCTAssertTrue(text.contains("TRUNK_SYNC_DATABASE_URL=***"), text)
        XCTAssertTrue(text.contains("TRUNK_SYNC_PORT=8080"), text)
    }

    func testConfigCheckCommand() throws {
        let secret = TestSecrets.random()
        let good = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"],
            environment: Command.environment([
                "TRUNK_SYNC_DATABASE_URL": "postgres://u:pw@127.0.0.1:1/d", "TRUNK_SYNC_JWT_SECRET": secret,
            ]))
        XCTAssertEqual(good.status, 0, good.stderr)
        XCTAssertTrue(good.stdout.contains("configuration OK"))
        XCTAssertFalse(good.stdout.contains(secret))
        let base = ["TRUNK_SYNC_DATABASE_URL": "postgres://u:pw@127.0.0.1:1/d", "TRUNK_SYNC_JWT_SECRET": secret]
        let bad = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"],
            environment: Command.environment(base.merging(["TRUNK_SYNC_PORT": "-1"]) { $1 }))
        XCTAssertEqual(bad.status, 1)
        XCTAssertEqual(
            bad.stderr, "trunk-sync: TRUNK_SYNC_PORT must be a port number between 0 and 65535 (0: any free port)\n")
        let proxies = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"],
            environment: Command.environment(
                base.merging(["TRUNK_SYNC_TRUSTED_PROXIES": "10.0.0.0/8, 10.1.2.3:80"]) { $1 }))
        XCTAssertEqual(proxies.status, 1)
        XCTAssertEqual(proxies.stderr.filter { $0 == "\n" }.count, 1, proxies.stderr)
        XCTAssertTrue(proxies.stderr.contains("\"10.1.2.3:80\" is not one"), proxies.stderr)
    }
}

extension ConfigurationTests {
    /// One run of `config check` names every problem (a bad port, a placeholder JWT secret,
    /// the example key-encryption key, a placeholder database password in either URL) and
    /// still prints the configuration, secrets redacted.
    func testConfigCheckReportsEveryProblemInOneRun() throws {
        let example = try String(contentsOfFile: repositoryRoot() + "/.env.example", encoding: .utf8)
        func exampleValue(_ name: String) throws -> String {
            let line = try XCTUnwrap(example.split(separator: "\n").first { $0.hasPrefix(name + "=") })
            return String(line.dropFirst(name.count + 1))
        }
        let ownerPassword = try exampleValue("POSTGRES_PASSWORD")
        let kek = try exampleValue("TRUNK_SYNC_KEY_ENCRYPTION_KEY")
        let jwt = "your-super-secret-jwt-token-with-at-least-32-characters-long"
        let result = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"],
            environment: Command.environment([
                "TRUNK_SYNC_PORT": "70000", "TRUNK_SYNC_ADMIN_PORT": "x", "TRUNK_SYNC_JWT_SECRET": jwt,
                "TRUNK_SYNC_KEY_ENCRYPTION_KEY": kek,
                "TRUNK_SYNC_DATABASE_URL": "postgres://server:7f3a9c1d0be24e8a@127.0.0.1:1/d",
                "TRUNK_SYNC_MIGRATION_DATABASE_URL": "postgres://trunk:\(ownerPassword)@127.0.0.1:1/d",
            ]))
        XCTAssertEqual(result.status, 1, result.stdout + result.stderr)
        let lines = result.stderr.split(separator: "\n").map(String.init)
        XCTAssertEqual(
            lines.map { $0.split(separator: " ").prefix(2).joined(separator: " ") },
            [
                "trunk-sync: TRUNK_SYNC_PORT", "trunk-sync: TRUNK_SYNC_ADMIN_PORT",
                "trunk-sync: TRUNK_SYNC_KEY_ENCRYPTION_KEY",
                "trunk-sync: TRUNK_SYNC_JWT_SECRET", "trunk-sync: TRUNK_SYNC_MIGRATION_DATABASE_URL",
            ], result.stderr)
        XCTAssertTrue(result.stderr.contains("Supabase's documentation"), result.stderr)
        // The variable the operator edits, not only the URL compose builds from it.
        XCTAssertTrue(
            result.stderr.contains(
                "TRUNK_SYNC_MIGRATION_DATABASE_URL has the example password of .env.example's POSTGRES_PASSWORD: "
                    + "set POSTGRES_PASSWORD in .env"), result.stderr)
        XCTAssertTrue(result.stdout.contains("TRUNK_SYNC_PORT=70000  [environment]"), result.stdout)
        XCTAssertTrue(result.stdout.contains("TRUNK_SYNC_JWT_SECRET=***"), result.stdout)
        XCTAssertTrue(result.stdout.contains("configuration refused: 5 problems"), result.stdout)
        for secret in [jwt, kek, ownerPassword, "7f3a9c1d0be24e8a"] {
            XCTAssertFalse(result.stdout.contains(secret) || result.stderr.contains(secret), secret)
        }
        // The server's URL with the compose example's password: refused as migrate and serve would.
        let server = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"],
            environment: Command.environment([
                "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
                "TRUNK_SYNC_DATABASE_URL": "postgres://server:\(try exampleValue("SERVER_DB_PASSWORD"))@127.0.0.1:1/d",
            ]))
        XCTAssertEqual(server.status, 1)
        XCTAssertTrue(
            server.stderr.hasPrefix(
                "trunk-sync: TRUNK_SYNC_DATABASE_URL has the example password of .env.example's SERVER_DB_PASSWORD: "
                    + "set SERVER_DB_PASSWORD in .env (docker compose builds this URL from it)"), server.stderr)
        XCTAssertFalse(server.stdout.contains("configuration OK"), server.stdout)
        // Another placeholder: no compose variable to name.
        let other = try Command.run(
            Command.trunkSyncBinary(), ["config", "check"],
            environment: Command.environment([
                "TRUNK_SYNC_JWT_SECRET": TestSecrets.random(),
                "TRUNK_SYNC_DATABASE_URL": "postgres://server:password@127.0.0.1:1/d",
            ]))
        XCTAssertEqual(other.status, 1)
        XCTAssertTrue(
            other.stderr.hasPrefix("trunk-sync: TRUNK_SYNC_DATABASE_URL has an example password"), other.stderr)
    }

    func testLoadStillStopsAtTheFirstProblem() {
        XCTAssertThrowsError(
            try Configuration.load(environment: ["TRUNK_SYNC_PORT": "x", "TRUNK_SYNC_LOG_LEVEL": "loud"])
        ) {
            XCTAssertTrue("\($0)".hasPrefix("TRUNK_SYNC_PORT "), "\($0)")
        }
        let inspected = Configuration.inspect(environment: ["TRUNK_SYNC_PORT": "x", "TRUNK_SYNC_LOG_LEVEL": "loud"])
        XCTAssertEqual(inspected.problems.count, 2, "\(inspected.problems)")
        XCTAssertEqual(inspected.port, 8080, "a bad value leaves the default")
    }
}

/// The rules behind the refusals `SecretSettingsTests` checks through the binary.
final class SecretRulesTests: XCTestCase {
    func testShippedExamplesAndPlaceholdersAreRefused() {
        for example in SecretRules.shippedExamples { XCTAssertNotNil(SecretRules.weakness(of: example), example) }
        // Supabase's documented JWT secrets (self-hosting guide, docker/.env.example).
        for example in [
            "super-secret-jwt-token-with-at-least-32-characters-long",
            "your-super-secret-jwt-token-with-at-least-32-characters-long",
        ] {
            XCTAssertEqual(SecretRules.weakness(of: example), "is an example value from Supabase's documentation")
        }
        for password in ["password", "pass", "change-me-to-a-long-random-password", "CHANGEME"] {
            XCTAssertTrue(SecretRules.isPlaceholderPassword(password), password)
        }
        XCTAssertFalse(SecretRules.isPlaceholderPassword("f3a9c1d07be2"))
    }

    func testRandomSecretsPassAndPatternsDoNot() {
        for _ in 0..<2000 { XCTAssertNil(SecretRules.weakness(of: TestSecrets.random())) }
        XCTAssertNil(SecretRules.weakness(of: "7f3a9c1d0be24e8a9f6c3b5d7e1a2c4f"), "hex with 14 different digits")
        XCTAssertNil(
            SecretRules.weakness(of: "q1234567!" + TestSecrets.random().prefix(30)), "a run of seven is allowed")
        XCTAssertNotNil(SecretRules.weakness(of: "q12345678" + TestSecrets.random().prefix(30)))
        XCTAssertNotNil(SecretRules.weakness(of: "zyxwvuts" + TestSecrets.random().prefix(30)), "descending run")
        XCTAssertNotNil(SecretRules.weakness(of: "deadbeef" + "deadbeef" + "deadbeef" + "deadbeef"))
        XCTAssertNotNil(
            SecretRules.weakness(of: String(TestSecrets.random().prefix(20)) + String(repeating: "=", count: 12)))
    }
}
