import Foundation
import HTTPServer
import JSON
import Logging
import Mail
import Postgres

/// The effective configuration of a trunk-sync process, merged from (lowest to highest
/// precedence) the defaults, a JSON file given with `--config`, the `TRUNK_SYNC_*`
/// environment variables and command-line flags, then validated.
public struct Configuration: Sendable {
    /// Where a value came from, for error messages.
    public enum Source: Sendable, Equatable, CustomStringConvertible {
        case defaultValue, file(String), environment, flag
        public var description: String {
            switch self {
            case .defaultValue: return "default"
            case .file(let path): return "config file \(path)"
            case .environment: return "environment"
            case .flag: return "command line"
            }
        }
    }

    /// Which mailer sends sign-in codes.
    public enum MailerKind: String, Sendable { case log, smtp }
    /// How log lines are written.
    public enum LogFormat: String, Sendable { case text, json }

    /// Raw values by setting key, with their source.
    public private(set) var values: [String: (value: String, source: Source)] = [:]

    /// `TRUNK_SYNC_DATABASE_URL`: what `serve` (and `token`) log in with.
    public var databaseURL: String? { value("database_url") }
    /// `TRUNK_SYNC_MIGRATION_DATABASE_URL`, defaulting to `TRUNK_SYNC_DATABASE_URL`: what
    /// `migrate`, `keys` and `users` log in with (the tables' owner).
    public var migrationDatabaseURL: String? { value("migration_database_url") ?? databaseURL }
    /// `TRUNK_SYNC_HOST`.
    public var host: String { value("host") ?? Setting.host.textDefault }
    /// `TRUNK_SYNC_PORT`.
    public private(set) var port = Setting.port.integerDefault
    /// `TRUNK_SYNC_ADMIN_HOST`: where the operator listener (`/metrics`) binds.
    public var adminHost: String { value("admin_host") ?? Setting.adminHost.textDefault }
    /// `TRUNK_SYNC_ADMIN_PORT`.
    public private(set) var adminPort = Setting.adminPort.integerDefault
    /// `TRUNK_SYNC_ADMIN_EMAILS`: who may sign in to the operator console (normalised,
    /// without repeats). Empty: console sign-in is disabled.
    public private(set) var adminEmails: [Email] = []
    /// `TRUNK_SYNC_ADMIN_HOSTNAMES`: names the operator listener answers to besides its
    /// addresses (lower case, without repeats).
    public private(set) var adminHostnames: [String] = []
    /// `TRUNK_SYNC_TRUSTED_PROXIES`, parsed.
    public private(set) var trustedProxies = TrustedProxies()
    /// `TRUNK_SYNC_JWT_SECRET`.
    public var jwtSecret: String? { value("jwt_secret") }
    /// `TRUNK_SYNC_KEY_ENCRYPTION_KEY`, or what `TRUNK_SYNC_KEY_ENCRYPTION_KEY_FILE` holds.
    public private(set) var keyEncryptionSecret: String?
    /// The key that encrypts stored signing keys, when one is configured.
    public var keyEncryptionKey: KeyEncryptionKey? { keyEncryptionSecret.map(KeyEncryptionKey.init(secret:)) }
    /// `TRUNK_SYNC_PUBLIC_URL`, defaulting to `http://HOST:PORT`.
    public var publicURL: String {
        if let url = value("public_url") { return url }
        return host.contains(":") ? "http://[\(host)]:\(port)" : "http://\(host):\(port)"
    }
    /// `TRUNK_SYNC_ACCEPTED_ISSUERS`, split on commas.
    public var acceptedIssuers: [String] {
        (value("accepted_issuers") ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty }
    }
    /// `TRUNK_SYNC_MAILER`.
    public private(set) var mailer = MailerKind(rawValue: Setting.mailer.textDefault) ?? .log
    /// `TRUNK_SYNC_SMTP_URL`.
    public var smtpURL: String? { value("smtp_url") }
    /// `TRUNK_SYNC_API_KEY`: the `apikey` the REST routes require, if any.
    public var apiKey: String? { value("api_key") }
    /// `TRUNK_SYNC_MAIL_FROM`.
    public var mailFrom: String { value("mail_from") ?? Setting.mailFrom.textDefault }
    /// `TRUNK_SYNC_CORS_ORIGINS`, split on commas.
    public var corsOrigins: [String] {
        (value("cors_origins") ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty }
    }
    /// `TRUNK_SYNC_LOG_LEVEL`.
    public private(set) var logLevel = Logger.Level(rawValue: Setting.logLevel.textDefault) ?? .info
    /// `TRUNK_SYNC_LOG_FORMAT`.
    public private(set) var logFormat = LogFormat(rawValue: Setting.logFormat.textDefault) ?? .text
    /// `TRUNK_SYNC_MIGRATIONS_DIR`, resolved to a directory.
    public var migrationsDirectory: String { Migration.defaultDirectory(explicit: value("migrations_dir")) }
    /// `TRUNK_SYNC_DB_POOL_SIZE`.
    public private(set) var databasePoolSize = Setting.databasePoolSize.integerDefault
    /// `TRUNK_SYNC_DB_SHARED_READS`.
    public private(set) var databaseSharedReads = Setting.databaseSharedReads.integerDefault
    /// `TRUNK_SYNC_DB_POOL_TIMEOUT`, in seconds.
    public private(set) var databasePoolTimeout = Setting.databasePoolTimeout.secondsDefault
    /// `TRUNK_SYNC_REST_STATEMENT_TIMEOUT`, in seconds.
    public private(set) var restStatementTimeout = Setting.restStatementTimeout.secondsDefault
    /// `TRUNK_SYNC_HTTP_HEADER_TIMEOUT`, in seconds.
    public private(set) var httpHeaderTimeout = Setting.httpHeaderTimeout.secondsDefault
    /// `TRUNK_SYNC_HTTP_BODY_TIMEOUT`, in seconds.
    public private(set) var httpBodyTimeout = Setting.httpBodyTimeout.secondsDefault
    /// `TRUNK_SYNC_HTTP_IDLE_TIMEOUT`, in seconds.
    public private(set) var httpIdleTimeout = Setting.httpIdleTimeout.secondsDefault
    /// `TRUNK_SYNC_HTTP_WRITE_TIMEOUT`, in seconds.
    public private(set) var httpWriteTimeout = Setting.httpWriteTimeout.secondsDefault
    /// `TRUNK_SYNC_HTTP_MAX_CONNECTIONS`.
    public private(set) var httpMaxConnections = Setting.httpMaxConnections.integerDefault
    /// `TRUNK_SYNC_HTTP_MAX_CONNECTIONS_PER_CLIENT` (0: no cap).
    public private(set) var httpMaxConnectionsPerClient = Setting.httpMaxConnectionsPerClient.integerDefault
    /// `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT`, in bytes.
    public private(set) var httpMaxBufferedOutput = Setting.httpMaxBufferedOutput.integerDefault
    /// `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT_PER_CLIENT`, in bytes (0: no per-client share).
    public private(set) var httpMaxBufferedOutputPerClient = Setting.httpMaxBufferedOutputPerClient.integerDefault
    /// `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT`, in bytes.
    public private(set) var httpMaxBufferedInput = Setting.httpMaxBufferedInput.integerDefault
    /// `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT_PER_CLIENT`, in bytes (0: no per-client share).
    public private(set) var httpMaxBufferedInputPerClient = Setting.httpMaxBufferedInputPerClient.integerDefault
    /// `TRUNK_SYNC_EVENT_LOOPS` (0: one per online core; see `eventLoopCount`).
    public private(set) var eventLoops = Setting.eventLoops.integerDefault
    /// `event_loop_scheduling`: how the public listener's loop threads are scheduled.
    public private(set) var eventLoopScheduling =
        LoopScheduling(rawValue: Setting.eventLoopScheduling.textDefault) ?? .batch

    /// The public listener's event loops: `eventLoops`, or one per online core when 0.
    public var eventLoopCount: Int {
        eventLoops > 0 ? eventLoops : max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN)))
    }

    /// The event streams' limits and heartbeat (`stream_*`).
    public private(set) var streams = EventStreams.Settings()
    /// Supabase Realtime's limits (`realtime_*`).
    public private(set) var realtime = RealtimeFeed.Settings()

    /// Sign-in rules from `jwt_expiry`, `otp_*`, `rate_limit_*`, `refresh_reuse_interval`,
    /// `mail_senders`, `mail_queue_size`.
    public private(set) var auth = AuthSettings()
    /// `TRUNK_SYNC_JWT_EXPIRY`, seconds.
    public private(set) var jwtExpiry = Setting.jwtExpiry.integerDefault

    /// Loads and validates the configuration.
    /// - Parameters:
    ///   - file: path of a JSON config file (`--config`), if any.
    ///   - environment: the process environment (only `TRUNK_SYNC_*` variables are read).
    ///   - flags: values given on the command line, by setting key.
    /// - Throws: the first of `problems`, a `ConfigurationError` naming the setting and why.
    public static func load(
        file: String? = nil, environment: [String: String] = ProcessInfo.processInfo.environment,
        flags: [String: String] = [:]
    ) throws -> Configuration {
        let configuration = inspect(file: file, environment: environment, flags: flags)
        if let first = configuration.problems.first { throw first }
        return configuration
    }

    /// Loads the configuration as `load` does, but records every problem in `problems`
    /// instead of stopping at the first (`config check` reports them all in one run). A bad
    /// value leaves its setting at its default.
    public static func inspect(
        file: String? = nil, environment: [String: String] = ProcessInfo.processInfo.environment,
        flags: [String: String] = [:]
    ) -> Configuration {
        var configuration = Configuration()
        for setting in Setting.all {
            if let value = setting.defaultValue { configuration.values[setting.key] = (value, .defaultValue) }
        }
        if let file {
            do {
                for (key, value) in try readFile(file) { configuration.values[key] = (value, .file(file)) }
            } catch {
                configuration.record(error)
            }
        }
        for setting in Setting.all {
            if let value = environment[setting.environmentVariable] {
                configuration.values[setting.key] = (value, .environment)
            }
        }
        for (key, value) in flags { configuration.values[key] = (value, .flag) }
        configuration.validate()
        return configuration
    }

    /// What is wrong with the settings, one line each, in the order they were checked
    /// (empty: every setting is valid; `serveProblems` adds what `serve` needs).
    public private(set) var problems: [ConfigurationError] = []

    private mutating func record(_ error: Error) {
        problems.append(error as? ConfigurationError ?? ConfigurationError(message: "\(error)"))
    }

    /// Records that `key`'s value is refused, and why; validation goes on.
    private mutating func refuse(_ key: String, _ reason: String) { problems.append(error(key, reason)) }

    private func value(_ key: String) -> String? {
        guard let value = values[key]?.value, !value.isEmpty else { return nil }
        return value
    }

    private func error(_ key: String, _ reason: String) -> ConfigurationError {
        let setting = Setting.named(key)
        let source = values[key]?.source
        var message = "\(setting?.environmentVariable ?? key) \(reason)"
        if let source, source != .environment, source != .defaultValue { message += " (from \(source))" }
        return ConfigurationError(message: message)
    }

    private mutating func validate() {
        if let text = value("port") {
            if let port = Int(text), Setting.port.integerRange.contains(port) {
                self.port = port
            } else {
                refuse("port", "must be a port number between 0 and 65535 (0: any free port)")
            }
        }
        if let text = value("admin_port") {
            if let port = Int(text), Setting.adminPort.integerRange.contains(port) {
                adminPort = port
            } else {
                refuse("admin_port", "must be a port number between 0 and 65535 (0: any free port)")
            }
        }
        if adminPort != 0, adminPort == port {
            refuse(
                "admin_port",
                "must differ from TRUNK_SYNC_PORT (\(port)): the operator listener is a listener of its own")
        }
        if let text = value("admin_emails") {
            var emails: [Email] = []
            for entry in text.split(separator: ",") {
                let trimmed = entry.trimmingCharacters(in: .whitespaces)
                if trimmed.isEmpty { continue }
                guard let email = Email(trimmed) else {
                    refuse(
                        "admin_emails", "must be a comma-separated list of email addresses; \"\(trimmed)\" is not one")
                    break
                }
                if !emails.contains(email) { emails.append(email) }
            }
            adminEmails = emails
        }
        if let text = value("admin_hostnames") {
            var names: [String] = []
            for entry in text.split(separator: ",") {
                let name = entry.trimmingCharacters(in: .whitespaces).lowercased()
                if name.isEmpty { continue }
                let labels = name.split(separator: ".", omittingEmptySubsequences: false)
                guard name.utf8.count <= 253,
                    labels.allSatisfy({ label in
                        !label.isEmpty && label.utf8.count <= 63 && !label.hasPrefix("-") && !label.hasSuffix("-")
                            && label.utf8.allSatisfy { ($0 >= 97 && $0 <= 122) || ($0 >= 48 && $0 <= 57) || $0 == 45 }
                    })
                else {
                    refuse("admin_hostnames", "must be a comma-separated list of host names; \"\(name)\" is not one")
                    break
                }
                if !names.contains(name) { names.append(name) }
            }
            adminHostnames = names
        }
        for key in ["host", "admin_host"] {
            if let text = value(key),
                let reason = Self.listenAddressProblem(
                    text, portSetting: key == "host" ? "TRUNK_SYNC_PORT" : "TRUNK_SYNC_ADMIN_PORT")
            {
                refuse(key, reason)
            }
        }
        if let text = value("cors_origins") {
            for entry in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) })
            where !entry.isEmpty && entry != "*" {
                if let reason = Self.originProblem(entry) {
                    refuse(
                        "cors_origins",
                        "must be * or a comma-separated list of origins (scheme://host[:port]: no path, no trailing slash); \"\(entry)\" is not one\(reason)"
                    )
                    break
                }
            }
        }
        if let text = value("trusted_proxies") {
            var networks: [IPNetwork] = []
            for entry in text.split(separator: ",") {
                let trimmed = entry.trimmingCharacters(in: .whitespaces)
                if trimmed.isEmpty { continue }
                guard let network = IPNetwork(trimmed) else {
                    refuse(
                        "trusted_proxies",
                        "must be a comma-separated list of addresses or CIDR blocks such as 10.0.0.0/8 or fd00::/8 (no bits set past the prefix); \"\(trimmed)\" is not one"
                    )
                    break
                }
                networks.append(network)
            }
            trustedProxies = TrustedProxies(networks)
        }
        if let text = value("mailer") {
            if let mailer = MailerKind(rawValue: text.lowercased()) {
                self.mailer = mailer
            } else {
                refuse("mailer", "must be log or smtp")
            }
        }
        if let text = value("event_loop_scheduling") {
            if let scheduling = LoopScheduling(rawValue: text.lowercased()) {
                eventLoopScheduling = scheduling
            } else {
                refuse("event_loop_scheduling", "must be batch or normal")
            }
        }
        if let text = value("log_level") {
            if let level = Logger.Level(rawValue: text.lowercased()) {
                logLevel = level
            } else {
                refuse("log_level", "must be one of trace, debug, info, notice, warning, error, critical")
            }
        }
        if let text = value("log_format") {
            if let format = LogFormat(rawValue: text.lowercased()) {
                logFormat = format
            } else {
                refuse("log_format", "must be text or json")
            }
        }
        databasePoolSize = integer(Setting.databasePoolSize) ?? databasePoolSize
        databaseSharedReads = integer(Setting.databaseSharedReads) ?? databaseSharedReads
        if let text = value("db_pool_timeout") {
            let maximum = Setting.databasePoolTimeout.secondsMaximum
            if let seconds = Double(text), seconds > 0, seconds <= maximum {
                databasePoolTimeout = seconds
            } else {
                refuse("db_pool_timeout", "must be a number of seconds between 0 and \(Int(maximum))")
            }
        }
        restStatementTimeout = seconds(Setting.restStatementTimeout) ?? restStatementTimeout
        httpHeaderTimeout = seconds(Setting.httpHeaderTimeout) ?? httpHeaderTimeout
        httpBodyTimeout = seconds(Setting.httpBodyTimeout) ?? httpBodyTimeout
        httpIdleTimeout = seconds(Setting.httpIdleTimeout) ?? httpIdleTimeout
        httpWriteTimeout = seconds(Setting.httpWriteTimeout) ?? httpWriteTimeout
        httpMaxConnections = integer(Setting.httpMaxConnections) ?? httpMaxConnections
        httpMaxBufferedOutput = integer(Setting.httpMaxBufferedOutput) ?? httpMaxBufferedOutput
        httpMaxBufferedOutputPerClient =
            integer(Setting.httpMaxBufferedOutputPerClient) ?? httpMaxBufferedOutputPerClient
        httpMaxBufferedInput = integer(Setting.httpMaxBufferedInput) ?? httpMaxBufferedInput
        httpMaxBufferedInputPerClient =
            integer(Setting.httpMaxBufferedInputPerClient) ?? httpMaxBufferedInputPerClient
        eventLoops = integer(Setting.eventLoops) ?? eventLoops
        if let text = value("http_max_connections_per_client") {
            let range = Setting.httpMaxConnectionsPerClient.integerRange
            if let count = Int(text), range.contains(count) {
                httpMaxConnectionsPerClient = count
            } else {
                refuse(
                    "http_max_connections_per_client",
                    "must be an integer between \(range.lowerBound) (no cap) and \(range.upperBound)")
            }
        }
        if let url = value("public_url") {
            let parsed = URL(string: url)
            if !["http", "https"].contains(parsed?.scheme?.lowercased() ?? "") || parsed?.host == nil {
                refuse("public_url", "must be an http:// or https:// URL")
            }
        }
        streams.heartbeat = integer(Setting.streamHeartbeat) ?? streams.heartbeat
        streams.maxPerUser = integer(Setting.streamMaxPerUser) ?? streams.maxPerUser
        streams.maxTotal = integer(Setting.streamMax) ?? streams.maxTotal
        streams.bufferBytes = integer(Setting.streamBuffer) ?? streams.bufferBytes
        realtime.maxSockets = integer(Setting.realtimeMax) ?? realtime.maxSockets
        realtime.maxChannelsPerUser = integer(Setting.realtimeMaxChannelsPerUser) ?? realtime.maxChannelsPerUser
        realtime.maxFilterBytesPerUser = integer(Setting.realtimeMaxFilterBytes) ?? realtime.maxFilterBytesPerUser
        realtime.bufferBytes = integer(Setting.realtimeBuffer) ?? realtime.bufferBytes
        realtime.idleTimeout = integer(Setting.realtimeIdleTimeout) ?? realtime.idleTimeout
        realtime.maxJoinsPerSecond = integer(Setting.realtimeMaxJoinsPerSecond) ?? realtime.maxJoinsPerSecond
        realtime.maxMessagesPerSecond =
            integer(Setting.realtimeMaxMessagesPerSecond) ?? realtime.maxMessagesPerSecond
        jwtExpiry = integer(Setting.jwtExpiry) ?? jwtExpiry
        auth.otpLifetime = integer(Setting.otpExpiry) ?? auth.otpLifetime
        auth.otpResendInterval = integer(Setting.otpResendInterval) ?? auth.otpResendInterval
        auth.otpMaxAttempts = integer(Setting.otpMaxAttempts) ?? auth.otpMaxAttempts
        auth.otpFailureRule = rule(Setting.otpFailureLimit) ?? auth.otpFailureRule
        auth.otpLockout = integer(Setting.otpLockout) ?? auth.otpLockout
        auth.otpRule = rule(Setting.rateLimitOTP) ?? auth.otpRule
        auth.verifyRule = rule(Setting.rateLimitVerify) ?? auth.verifyRule
        auth.tokenRule = rule(Setting.rateLimitToken) ?? auth.tokenRule
        auth.mailRule = rule(Setting.rateLimitMail) ?? auth.mailRule
        auth.otpEmailRule = rule(Setting.rateLimitOTPEmail) ?? auth.otpEmailRule
        auth.verifyEmailRule = rule(Setting.rateLimitVerifyEmail) ?? auth.verifyEmailRule
        auth.refreshReuseInterval = integer(Setting.refreshReuseInterval) ?? auth.refreshReuseInterval
        auth.mailSenders = integer(Setting.mailSenders) ?? auth.mailSenders
        auth.mailQueueSize = integer(Setting.mailQueueSize) ?? auth.mailQueueSize
        for key in ["database_url", "migration_database_url"] {
            do { try validateDatabaseURL(key) } catch { record(error) }
        }
        do { try loadKeyEncryptionKey() } catch { record(error) }
        if let key = apiKey {
            // It travels in a header: visible ASCII only. The message does not quote it.
            if key.utf8.count > 1024 || !key.unicodeScalars.allSatisfy({ (0x21...0x7E).contains($0.value) }) {
                refuse("api_key", "must be at most 1024 visible ASCII characters (no spaces or control characters)")
            }
        }
        if mailer == .smtp, smtpURL == nil { refuse("smtp_url", "is required when TRUNK_SYNC_MAILER is smtp") }
        if let url = smtpURL {
            do {
                _ = try SMTPConfiguration(url: url)
            } catch {
                // The mail module's message names the variable and never quotes the URL.
                record(error)
            }
        }
        do {
            _ = try MailAddress(mailFrom, role: "sender")
        } catch {
            refuse("mail_from", "must be an address like no-reply@example.com or Name <no-reply@example.com>")
        }
    }

    /// Reads the key encryption key from its variable or its file and holds it to the rules
    /// of token-protecting secrets: it guards the ES256 keys as the JWT secret guards HS256.
    private mutating func loadKeyEncryptionKey() throws {
        let inline = value("key_encryption_key")
        let file = value("key_encryption_key_file")
        if inline != nil, file != nil {
            throw error("key_encryption_key_file", "and TRUNK_SYNC_KEY_ENCRYPTION_KEY are both set: set only one")
        }
        if let file {
            guard let data = FileManager.default.contents(atPath: file) else {
                throw error("key_encryption_key_file", "names a file that cannot be read: \(file)")
            }
            let secret = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            if let weakness = SecretRules.weakness(of: secret) {
                throw error("key_encryption_key_file", "names a file whose key \(weakness); \(SecretRules.howToMake)")
            }
            keyEncryptionSecret = secret
        } else if let inline {
            if let weakness = SecretRules.weakness(of: inline) {
                throw error("key_encryption_key", "\(weakness); \(SecretRules.howToMake)")
            }
            keyEncryptionSecret = inline
        }
    }

    /// Parses a database URL as libpq will, so a malformed one stops every command with one
    /// line, and refuses a URL whose password would spill into other fields. Neither message
    /// quotes the URL: libpq's reason has its quoted input removed.
    private func validateDatabaseURL(_ key: String) throws {
        guard let url = value(key) else { return }
        let parsed: PostgresConfiguration
        do {
            parsed = try PostgresConfiguration(url)
        } catch {
            let reason = "\(error)".replacingOccurrences(of: "invalid database URL: ", with: "")
            throw self.error(key, "is not a valid postgres:// URL or libpq conninfo string (\(reason))")
        }
        if Self.hasUnescapedCredentials(url) {
            throw self.error(
                key, "has an unescaped @ or / in its user name or password: percent-encode them (@ as %40, / as %2F)")
        }
        // libpq checks values only when it connects, and its message quotes them; these two
        // are the ones a misplaced password ends up in.
        if let ports = parsed["port"],
            !ports.split(separator: ",", omittingEmptySubsequences: false).allSatisfy({
                $0.isEmpty || (Int($0).map { (1...65535).contains($0) } ?? false)
            })
        {
            throw self.error(key, "has a port that is not a number from 1 to 65535")
        }
        if let mode = parsed["sslmode"],
            !["disable", "allow", "prefer", "require", "verify-ca", "verify-full"].contains(mode)
        {
            throw self.error(
                key, "has an sslmode that is not disable, allow, prefer, require, verify-ca or verify-full")
        }
    }

    /// Whether a `postgres://` URL's user name or password holds a raw `@` or `/`. libpq ends
    /// the user information at the first of either, so the rest of the password becomes the
    /// host, port or database name, and libpq's errors (and ours, naming the host) would
    /// show it. Neither a host list nor a database name holds `@`.
    static func hasUnescapedCredentials(_ url: String) -> Bool {
        let lowered = url.lowercased()
        guard let scheme = ["postgresql://", "postgres://"].first(where: { lowered.hasPrefix($0) }) else {
            return false
        }
        let rest = url.dropFirst(scheme.count)
        let beforeQuery = rest[..<(rest.firstIndex(of: "?") ?? rest.endIndex)]
        guard let end = beforeQuery.firstIndex(where: { $0 == "@" || $0 == "/" }) else { return false }
        return beforeQuery[beforeQuery.index(after: end)...].contains("@")
    }

    private mutating func integer(_ setting: Setting) -> Int? {
        let key = setting.key
        let range = setting.integerRange
        guard let text = value(key) else { return nil }
        guard let number = Int(text), range.contains(number) else {
            refuse(key, "must be an integer between \(range.lowerBound) and \(range.upperBound)")
            return nil
        }
        return number
    }

    private mutating func rule(_ setting: Setting) -> RateLimiter.Rule? {
        let key = setting.key
        guard let text = value(key) else { return nil }
        let parts = text.split(separator: "/")
        guard parts.count == 2, let limit = Int(parts[0]), let window = Int(parts[1]), limit >= 1, window >= 1,
            window <= Setting.longestRuleWindow
        else {
            refuse(key, "must look like REQUESTS/SECONDS, e.g. 30/300")
            return nil
        }
        return RateLimiter.Rule(limit: limit, window: window)
    }

    /// Adjusts the sign-in rules beyond what settings allow (tests: one-second windows).
    public mutating func adjustAuth(_ change: (inout AuthSettings) -> Void) { change(&auth) }

    /// A timeout setting in seconds (fractions allowed), or `nil` when unset.
    private mutating func seconds(_ setting: Setting) -> Double? {
        let key = setting.key
        let maximum = setting.secondsMaximum
        guard let text = value(key) else { return nil }
        guard let seconds = Double(text), seconds > 0, seconds <= maximum else {
            refuse(key, "must be a number of seconds greater than 0 and at most \(Int(maximum))")
            return nil
        }
        return seconds
    }

    /// Checks what `serve` needs beyond the common settings: a database, and a JWT secret
    /// no one can guess (see `SecretRules`).
    /// - Throws: the first of `serveProblems`.
    /// `mail: false` for a command that sends no mail (`token`): the SMTP URL is not held to
    /// the example check.
    public func validateForServe(mail: Bool = true) throws {
        if let first = (mail ? serveProblems : serveProblems.filter { $0 != smtpPlaceholderProblem }).first {
            throw first
        }
    }

    /// What `serve` would refuse beyond `problems`: no database URL or one with a
    /// placeholder password, a missing or guessable JWT secret, a key-encryption key equal
    /// to the JWT secret, the example SMTP URL, a listen address that is a name that does not
    /// resolve (looked up here: the one look-up of the configuration).
    public var serveProblems: [ConfigurationError] {
        var found: [ConfigurationError] = []
        if databaseURL == nil {
            found.append(error("database_url", "is required (postgres://user:pass@host:port/db)"))
        } else if let problem = databasePasswordProblem("database_url") {
            found.append(problem)
        }
        if let secret = jwtSecret {
            if let weakness = SecretRules.weakness(of: secret) {
                found.append(error("jwt_secret", "\(weakness); \(SecretRules.howToMake)"))
            } else if keyEncryptionSecret == secret {
                found.append(
                    error(
                        value("key_encryption_key") != nil ? "key_encryption_key" : "key_encryption_key_file",
                        "must differ from TRUNK_SYNC_JWT_SECRET (a leak of one must not give away the other); \(SecretRules.howToMake)"
                    ))
            }
        } else {
            found.append(error("jwt_secret", "is required; \(SecretRules.howToMake)"))
        }
        if let problem = smtpPlaceholderProblem { found.append(problem) }
        found += listenNameProblems
        return found
    }

    /// A listen address (`TRUNK_SYNC_HOST`, `TRUNK_SYNC_ADMIN_HOST`) given as a host name
    /// that does not resolve: the listener could not bind it. Checked before start-up waits on
    /// the database, instead of failing after it. IP addresses are never looked up.
    private var listenNameProblems: [ConfigurationError] {
        ["host", "admin_host"].compactMap { key in
            let text = key == "host" ? host : adminHost
            guard Self.numericAddress(text) == nil, Self.listenAddressProblem(text, portSetting: "") == nil,
                let failure = Self.resolutionFailure(text)
            else { return nil }
            return error(
                key,
                "\"\(text)\" does not resolve (\(failure)): set an IP address of this machine (0.0.0.0 or :: for every interface, 127.0.0.1 for this machine only) or a name it resolves"
            )
        }
    }

    /// Why `text` cannot be a listen address (nil: it can): an IP address (IPv4, or IPv6
    /// without brackets) or a host name, nothing more (no scheme, port, path or brackets).
    static func listenAddressProblem(_ text: String, portSetting: String) -> String? {
        if numericAddress(text) != nil { return nil }
        let hint: String
        if text.contains("://") {
            hint = ": an address, not a URL"
        } else if text.hasPrefix("[") {
            hint = ": an IPv6 address goes without brackets"
        } else if text.filter({ $0 == ":" }).count == 1 {
            hint = ": the port goes in \(portSetting)"
        } else {
            hint = ""
        }
        if hint.isEmpty, isHostName(text) { return nil }
        return
            "must be an IP address (such as 0.0.0.0, 127.0.0.1 or ::) or a host name; \"\(text)\" is not one\(hint)"
    }

    /// Whether `text` is an IP address literal as `getaddrinfo` reads one (`AI_NUMERICHOST`:
    /// IPv4, IPv6 with an optional `%zone`; no look-up); nil when it is not.
    static func numericAddress(_ text: String) -> String? {
        var hints = addrinfo()
        hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var results: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(text, nil, &hints, &results) == 0 else { return nil }
        freeaddrinfo(results)
        return text
    }

    /// Labels of letters, digits, `-` (not first or last) and `_` (container names), at most
    /// 63 bytes each and 253 in all, an optional trailing dot; not all digits (a mistyped
    /// IPv4 address is not a name).
    static func isHostName(_ text: String) -> Bool {
        let name = text.hasSuffix(".") ? String(text.dropLast()) : text
        let labels = name.split(separator: ".", omittingEmptySubsequences: false)
        guard !name.isEmpty, name.utf8.count <= 253, !labels.allSatisfy({ $0.allSatisfy(\.isNumber) }) else {
            return false
        }
        return labels.allSatisfy { label in
            !label.isEmpty && label.utf8.count <= 63 && !label.hasPrefix("-") && !label.hasSuffix("-")
                && label.utf8.allSatisfy { byte in
                    (byte >= 97 && byte <= 122) || (byte >= 65 && byte <= 90) || (byte >= 48 && byte <= 57)
                        || byte == 45 || byte == 95
                }
        }
    }

    /// Why `name` does not resolve for listening (`getaddrinfo`'s words), nil when it does.
    static func resolutionFailure(_ name: String) -> String? {
        var hints = addrinfo()
        hints.ai_flags = AI_PASSIVE
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var results: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(name, nil, &hints, &results)
        guard status == 0 else { return String(cString: gai_strerror(status)) }
        freeaddrinfo(results)
        return nil
    }

    /// Why `entry` is not an origin as a browser sends it in `Origin` (nil: it is one):
    /// `scheme://host[:port]`, the host a name, an IPv4 address or a bracketed IPv6 address,
    /// the port without its scheme's default. The reason starts with ": " (or is empty).
    static func originProblem(_ entry: String) -> String? {
        guard let separator = entry.range(of: "://") else { return ": it has no scheme://" }
        let scheme = entry[..<separator.lowerBound]
        let rest = entry[separator.upperBound...]
        guard let first = scheme.first, first.isASCII, first.isLetter,
            scheme.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+-.".contains($0)) })
        else { return ": it has no scheme://" }
        if let slash = rest.firstIndex(of: "/") {
            return rest.index(after: slash) == rest.endIndex ? ": drop the trailing slash" : ": an origin has no path"
        }
        if rest.contains(where: { "?#@*".contains($0) || $0.isWhitespace }) {
            return rest.contains("*") ? ": only * alone allows any origin" : ""
        }
        var host = Substring(rest)
        var port: Substring? = nil
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]"),
                IPAddress(rest[rest.index(after: rest.startIndex)..<close]) != nil
            else { return "" }
            host = rest[...close]
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { return "" }
                port = after.dropFirst()
            }
        } else if let colon = rest.lastIndex(of: ":") {
            host = rest[..<colon]
            port = rest[rest.index(after: colon)...]
        }
        if !host.hasPrefix("["), IPAddress(host) == nil, !isHostName(String(host)) || host.hasSuffix(".") {
            return ""
        }
        if let port {
            guard !port.isEmpty, port.utf8.count <= 5, port.allSatisfy({ $0.isASCII && $0.isNumber }),
                let number = Int(port), (1...65535).contains(number), !port.hasPrefix("0")
            else { return ": the port must be a number from 1 to 65535" }
            let defaults = ["http": 80, "https": 443, "ws": 80, "wss": 443]
            if defaults[scheme.lowercased()] == number {
                return ": browsers send it without the default port :\(number)"
            }
        }
        return nil
    }

    /// An SMTP URL left as the documentation's (`smtp://user:password@smtp.example.com`):
    /// serve would start and every sign-in mail would fail, `/otp` still answering `200`. A
    /// host under a domain reserved for examples (RFC 2606: `example.com`, `.example`,
    /// `.invalid`) receives no mail, and the documentation's passwords are nobody's.
    private var smtpPlaceholderProblem: ConfigurationError? {
        guard mailer == .smtp, let url = smtpURL, let smtp = try? SMTPConfiguration(url: url) else { return nil }
        let host = smtp.host.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "."))
        let reservedDomains = ["example.com", "example.net", "example.org", "example", "invalid"]
        let exampleHost = reservedDomains.contains { host == $0 || host.hasSuffix("." + $0) }
        // The documentation's passwords exactly, not any password containing a placeholder
        // word (a real one may).
        let examplePassword =
            smtp.credentials.map {
                let password = $0.password.lowercased()
                return SecretRules.placeholderPasswords.contains(password)
                    || SecretRules.placeholderWords.contains(password)
            } ?? false
        guard exampleHost || examplePassword else { return nil }
        return error(
            "smtp_url",
            "is the documentation's example (\(exampleHost ? "a host under a domain reserved for examples" : "an example password")): no sign-in mail would arrive; set your mail provider's SMTP URL, or TRUNK_SYNC_MAILER=log to print codes to the log"
        )
    }

    /// The domains RFC 2606 reserves for documentation that `.env.example` and the guides
    /// use in URLs (`https://sync.example.com`, `https://app.example.com`, `no-reply@example.com`).
    static let documentationDomains = ["example.com", "example.net", "example.org"]

    /// Whether `host` is one of `documentationDomains` or a name under one.
    static func isDocumentationHost(_ host: String) -> Bool {
        let name = host.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "."))
        return documentationDomains.contains { name == $0 || name.hasSuffix("." + $0) }
    }

    /// One line naming every setting whose host is under a domain reserved for documentation
    /// (`documentationDomains`): a deployment left with `.env.example`'s values would mail
    /// sign-in links to sync.example.com. A warning, logged once by `serve` and `config check`,
    /// not a refusal: tests and local setups may use such names. Nil when there is none.
    public var documentationHostWarning: String? {
        let hosts: [(key: String, hosts: [String])] = [
            ("public_url", [value("public_url").flatMap { URL(string: $0)?.host }].compactMap { $0 }),
            ("cors_origins", corsOrigins.compactMap { URL(string: $0)?.host }),
            ("accepted_issuers", acceptedIssuers.compactMap { URL(string: $0)?.host }),
            ("mail_from", [(try? MailAddress(mailFrom, role: "sender")).map { String($0.domain) }].compactMap { $0 }),
        ]
        let named = hosts.filter { $0.hosts.contains(where: Self.isDocumentationHost) }.map {
            Setting.named($0.key)?.environmentVariable ?? $0.key
        }
        guard !named.isEmpty else { return nil }
        return
            "\(named.joined(separator: ", ")) \(named.count == 1 ? "names a host" : "name hosts") under example.com, example.net or example.org, reserved for documentation (RFC 2606), as .env.example does: set your deployment's own (sign-in mails link to TRUNK_SYNC_PUBLIC_URL)"
    }

    /// Everything `config check` reports: `problems`, `serveProblems`, and what `migrate`
    /// would refuse in TRUNK_SYNC_MIGRATION_DATABASE_URL, each once.
    public var allProblems: [ConfigurationError] {
        var found = problems
        for problem in serveProblems + [databasePasswordProblem("migration_database_url")].compactMap({ $0 })
        where !found.contains(problem) {
            found.append(problem)
        }
        return found
    }

    /// Refuses a database URL whose password is a documentation placeholder (the compose
    /// example's, for one): the database is the second wall only if its password is secret.
    private func checkDatabasePassword(_ key: String) throws {
        if let problem = databasePasswordProblem(key) { throw problem }
    }

    private func databasePasswordProblem(_ key: String) -> ConfigurationError? {
        guard let url = value(key), let password = try? PostgresConfiguration(url)["password"] else { return nil }
        guard SecretRules.isPlaceholderPassword(password) else { return nil }
        switch SecretRules.composePasswordVariables[password] {
        case "SERVER_DB_PASSWORD":
            return error(
                key,
                "has the example password of .env.example's SERVER_DB_PASSWORD: set SERVER_DB_PASSWORD in .env (docker compose builds this URL from it) to a new one, e.g. openssl rand -hex 32; migrate sets it on the server's role"
            )
        case "POSTGRES_PASSWORD":
            return error(
                key,
                "has the example password of .env.example's POSTGRES_PASSWORD: set POSTGRES_PASSWORD in .env (docker compose builds this URL from it) to a new one, e.g. openssl rand -hex 32; if the postgres service has already started with the example, change it there too (ALTER ROLE ... PASSWORD)"
            )
        default:
            return error(
                key,
                "has an example password from the trunk-sync documentation; choose a new one (e.g. openssl rand -hex 32) and set it on the database role too"
            )
        }
    }

    /// Checks that a database URL is set.
    @discardableResult
    public func requireDatabaseURL() throws -> String {
        guard let url = databaseURL else {
            throw error("database_url", "is required (postgres://user:pass@host:port/db)")
        }
        return url
    }

    /// `requireDatabaseURL()` parsed, its connection errors naming `TRUNK_SYNC_DATABASE_URL`.
    public func serverDatabase() throws -> PostgresConfiguration {
        var parsed = try PostgresConfiguration(try requireDatabaseURL())
        parsed.setting = Setting.named("database_url")?.environmentVariable
        return parsed
    }

    /// `requireMigrationDatabaseURL()` parsed, its connection errors naming the setting it
    /// came from (`TRUNK_SYNC_MIGRATION_DATABASE_URL`, or `TRUNK_SYNC_DATABASE_URL` when that
    /// one is unset).
    public func ownerDatabase() throws -> PostgresConfiguration {
        var parsed = try PostgresConfiguration(try requireMigrationDatabaseURL())
        let key = value("migration_database_url") == nil ? "database_url" : "migration_database_url"
        parsed.setting = Setting.named(key)?.environmentVariable
        return parsed
    }

    /// The owner's URL for `migrate`, `keys` and `users` (refusing documentation placeholders:
    /// `migrate` also gives the server's role the password in TRUNK_SYNC_DATABASE_URL).
    public func requireMigrationDatabaseURL() throws -> String {
        guard let url = migrationDatabaseURL else {
            throw error(
                "database_url",
                "is required (postgres://user:pass@host:port/db; migrate, keys and users use TRUNK_SYNC_MIGRATION_DATABASE_URL instead when set)"
            )
        }
        try checkDatabasePassword("migration_database_url")
        try checkDatabasePassword("database_url")
        return url
    }

    /// Every setting with its effective value (secrets as `***`) and source, for `config check`.
    public var redactedDescription: String {
        Setting.all.map { setting in
            let entry = values[setting.key]
            let shown: String
            if let value = entry?.value, !value.isEmpty {
                shown = setting.isSecret ? "***" : value
            } else if setting.key == "public_url" {
                shown = publicURL
            } else if setting.key == "migrations_dir" {
                shown = migrationsDirectory
            } else {
                shown = "(unset)"
            }
            return "\(setting.environmentVariable)=\(shown)  [\(entry?.source.description ?? "default")]"
        }.joined(separator: "\n")
    }

    static func readFile(_ path: String) throws -> [String: String] {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigurationError(message: "cannot read config file \(path)")
        }
        let object: [String: FileValue]
        do {
            object = try JSONBody.decode([String: FileValue].self, from: Array(data))
        } catch {
            throw ConfigurationError(
                message:
                    "config file \(path) must hold one JSON object of strings, numbers, booleans or lists (\(error))")
        }
        var values: [String: String] = [:]
        for (key, raw) in object {
            if key.hasPrefix("_") { continue }  // "_comment" keys document the file
            guard Setting.named(key) != nil else {
                throw ConfigurationError(message: "config file \(path): unknown setting \"\(key)\"")
            }
            if let text = raw.text { values[key] = text }
        }
        return values
    }
}

/// A value in a JSON config file.
enum FileValue: Decodable {
    case scalar(String)
    case list([FileValue])
    case null

    init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let bool = try? container.decode(Bool.self) {
            self = .scalar(bool ? "true" : "false")
        } else if let integer = try? container.decode(Int.self) {
            self = .scalar(String(integer))
        } else if let number = try? container.decode(Double.self) {
            self = .scalar(String(number))
        } else if let text = try? container.decode(String.self) {
            self = .scalar(text)
        } else {
            self = .list(try container.decode([FileValue].self))
        }
    }

    var text: String? {
        switch self {
        case .scalar(let text): return text
        case .list(let items): return items.compactMap(\.text).joined(separator: ",")
        case .null: return nil
        }
    }
}

/// A bad or missing setting. `message` is one line naming the setting and why.
public struct ConfigurationError: Error, CustomStringConvertible, Equatable {
    /// One line naming the setting and why.
    public let message: String
    public var description: String { message }
}
