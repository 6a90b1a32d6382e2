/// One configuration setting: its key in a config file, its environment variable, its
/// default and what it does. This file is the only place a setting or its default is written:
/// loading, `config check`, the typed defaults of `Configuration` (and of the settings structs
/// it fills) and the generated `config/defaults.json` and settings table of
/// `config/README.md` (`scripts/config-generate.sh`, see `SettingsDocument`) all follow it.
public struct Setting: Sendable {
    /// What a setting's value is: how its default is written in `config/defaults.json`.
    public enum Kind: Sendable {
        /// Free text (a URL, an address, a name from a fixed list).
        case text
        /// A whole number in a range.
        case integer(ClosedRange<Int>)
        /// A number of seconds (fractions allowed), more than 0 and at most `maximum`.
        case seconds(maximum: Double)
        /// A comma-separated list (a JSON list in a config file).
        case list
        /// A rate limit written `COUNT/SECONDS` (both at least 1, `SECONDS` at most
        /// `Setting.longestRuleWindow`).
        case rule
    }

    /// The longest window a `.rule` setting may have, in seconds (a day).
    public static let longestRuleWindow = 86_400

    /// Key in a JSON config file, e.g. `database_url`.
    public let key: String
    /// What the value is.
    public let kind: Kind
    /// Default value as text, or `nil` when there is none.
    public let defaultValue: String?
    /// Whether the value is a secret (redacted in `config check` and logs).
    public let isSecret: Bool
    /// What the setting does, in Markdown (one line: the meaning column of config/README.md).
    public let summary: String

    /// The environment variable, e.g. `TRUNK_SYNC_DATABASE_URL`.
    public var environmentVariable: String { "TRUNK_SYNC_" + key.uppercased() }

    /// `database_url`.
    public static let databaseURL = Setting(
        key: "database_url", kind: .text, defaultValue: nil, isSecret: true,
        summary:
            "PostgreSQL to use: postgres://user:pass@host:port/db or a libpq conninfo string. Required. `serve` and `token` log in with it: best a role of the server's own (see `TRUNK_SYNC_MIGRATION_DATABASE_URL`); `serve` and `config check` warn when it is a superuser or owns the tables."
    )
    /// `migration_database_url`.
    public static let migrationDatabaseURL = Setting(
        key: "migration_database_url", kind: .text, defaultValue: nil, isSecret: true,
        summary:
            "PostgreSQL URL of the tables' owner, for `migrate`, `keys` and `users`. Default: `TRUNK_SYNC_DATABASE_URL`. When it logs in as another role than `TRUNK_SYNC_DATABASE_URL`, `migrate` creates or updates that role as the server's login (LOGIN, member of `trunk_sync_app` and nothing else, the password given there)."
    )
    /// `host`.
    public static let host = Setting(
        key: "host", kind: .text, defaultValue: "127.0.0.1", isSecret: false,
        summary:
            "Address to listen on: an IP address (IPv4, or IPv6 without brackets; `0.0.0.0` or `::` for every interface) or a host name this machine resolves (its first address is used). A URL, a port or a name that does not resolve is refused at start-up."
    )
    /// `port`.
    public static let port = Setting(
        key: "port", kind: .integer(0...65535), defaultValue: "8080", isSecret: false,
        summary: "TCP port to listen on (0: any free port, logged at start).")
    /// `admin_host`.
    public static let adminHost = Setting(
        key: "admin_host", kind: .text, defaultValue: "127.0.0.1", isSecret: false,
        summary:
            "Address of the operator listener (`GET /metrics`, detailed `/readyz`), written as `TRUNK_SYNC_HOST`. Keep it private: loopback, or a network only your monitoring reaches."
    )
    /// `admin_port`.
    public static let adminPort = Setting(
        key: "admin_port", kind: .integer(0...65535), defaultValue: "9090", isSecret: false,
        summary:
            "TCP port of the operator listener (0: any free port, logged at start as `admin listening`). Must differ from `TRUNK_SYNC_PORT`."
    )
    /// `admin_emails`.
    public static let adminEmails = Setting(
        key: "admin_emails", kind: .list, defaultValue: "", isSecret: false,
        summary:
            "Comma-separated email addresses that may sign in to the operator console (`/console/` on the admin listener) with a mailed code. Default none: console sign-in is disabled (the console says so)."
    )
    /// `admin_hostnames`.
    public static let adminHostnames = Setting(
        key: "admin_hostnames", kind: .list, defaultValue: "", isSecret: false,
        summary:
            "Comma-separated host names the operator listener answers to besides its addresses (e.g. `trunk-sync` for a scraper on a compose network, or the name a TLS proxy serves the console under). A request whose `Host` is another name is refused (`421`): DNS rebinding cannot reach the listener. Default none: addresses only, and `localhost` when bound to loopback or a wildcard address."
    )
    /// `trusted_proxies`.
    public static let trustedProxies = Setting(
        key: "trusted_proxies", kind: .list, defaultValue: "", isSecret: false,
        summary:
            "Comma-separated addresses or CIDR blocks (IPv4 and IPv6) of your reverse proxies. Only for a peer in this list is the client taken from `X-Forwarded-For` (the rightmost address that is not a trusted proxy). Default none: the peer is the client."
    )
    /// `jwt_secret`.
    public static let jwtSecret = Setting(
        key: "jwt_secret", kind: .text, defaultValue: nil, isSecret: true,
        summary:
            "HS256 signing secret for access tokens: `openssl rand -base64 48` (at least 32 bytes; example and guessable values are refused). Required by serve."
    )
    /// `key_encryption_key`.
    public static let keyEncryptionKey = Setting(
        key: "key_encryption_key", kind: .text, defaultValue: nil, isSecret: true,
        summary:
            "Encrypts the ES256 private keys stored in the database (AES-256-GCM): `openssl rand -base64 48`, the same for `migrate`, `keys add` and every server, kept out of the database and its backups. Required by `keys add`, and by `migrate` and `serve` once signing keys exist."
    )
    /// `key_encryption_key_file`.
    public static let keyEncryptionKeyFile = Setting(
        key: "key_encryption_key_file", kind: .text, defaultValue: nil, isSecret: false,
        summary:
            "A file holding `TRUNK_SYNC_KEY_ENCRYPTION_KEY` instead (a Docker or Kubernetes secret); surrounding whitespace is ignored. Set one of the two."
    )
    /// `public_url`.
    public static let publicURL = Setting(
        key: "public_url", kind: .text, defaultValue: nil, isSecret: false,
        summary:
            "External base URL. URL/auth/v1 is the token issuer (`iss`), checked on every request: every instance of a deployment, and `trunk-sync token`, must share it. Default http://HOST:PORT."
    )
    /// `accepted_issuers`.
    public static let acceptedIssuers = Setting(
        key: "accepted_issuers", kind: .list, defaultValue: "", isSecret: false,
        summary:
            "Comma-separated further token issuers (`iss`) accepted beside URL/auth/v1, full URLs such as `https://<ref>.supabase.co/auth/v1`: after moving from a hosted Supabase project, its access tokens (signed with `TRUNK_SYNC_JWT_SECRET` set to the project's JWT secret, or with keys from `keys import-jwks`) keep working until they expire. Default none."
    )
    /// `mailer`.
    public static let mailer = Setting(
        key: "mailer", kind: .text, defaultValue: "log", isSecret: false,
        summary: "log (codes printed to the log) or smtp.")
    /// `smtp_url`.
    public static let smtpURL = Setting(
        key: "smtp_url", kind: .text, defaultValue: nil, isSecret: true,
        summary:
            "smtp://[user:pass@]host:port[?tls=none|starttls|tls][&verify=false][&ca_file=PATH] or smtps://…; smtp:// requires STARTTLS unless tls=none; required when mailer is smtp."
    )
    /// `mail_from`.
    public static let mailFrom = Setting(
        key: "mail_from", kind: .text, defaultValue: "no-reply@localhost", isSecret: false,
        summary: "Sender address of sign-in mails.")
    /// `mail_senders`.
    public static let mailSenders = Setting(
        key: "mail_senders", kind: .integer(1...64), defaultValue: "2", isSecret: false,
        summary: "Sign-in mails sent at once (sender tasks, and SMTP sessions). Mails go out after /otp has answered.")
    /// `mail_queue_size`.
    public static let mailQueueSize = Setting(
        key: "mail_queue_size", kind: .integer(1...100_000), defaultValue: "1000", isSecret: false,
        summary:
            "Sign-in mails waiting for a sender; when full, a new one is dropped (counted in `trunk_sync_mail_dropped_total`, logged) and /otp still answers 200."
    )
    /// `cors_origins`.
    public static let corsOrigins = Setting(
        key: "cors_origins", kind: .list, defaultValue: "", isSecret: false,
        summary:
            "Comma-separated origins allowed by CORS, each exactly as browsers send `Origin`: `scheme://host[:port]`, no path, no trailing slash, no default port (`https://app.example.com`, `http://localhost:5173`); `*` allows any. Anything else is refused at start-up, naming the entry. Default none."
    )
    /// `log_level`.
    public static let logLevel = Setting(
        key: "log_level", kind: .text, defaultValue: "info", isSecret: false,
        summary:
            "trace, debug, info, notice, warning, error or critical. At `info` and below, one access-log line per request (method, path without query, status, duration, request id, user id)."
    )
    /// `log_format`.
    public static let logFormat = Setting(
        key: "log_format", kind: .text, defaultValue: "text", isSecret: false,
        summary: "text or json (one object per line).")
    /// `migrations_dir`.
    public static let migrationsDir = Setting(
        key: "migrations_dir", kind: .text, defaultValue: nil, isSecret: false,
        summary:
            "Directory of migration files. Default ./migrations, else share/trunk-sync/migrations beside the binary.")
    /// `db_pool_size`.
    public static let databasePoolSize = Setting(
        key: "db_pool_size", kind: .integer(1...500), defaultValue: "10", isSecret: false,
        summary:
            "Database connections of the HTTP event loops, split evenly between them (at least one each, so never fewer than the loops). Work off the loops (background jobs, the live streams' and exports' reads, the admin listener's requests) has a quarter of this again (at least 2), and `LISTEN` one: at most max(this, event_loops) + max(2, ⌊this ÷ 4⌋) + 1 connections, 10 + 2 + 1 with the defaults on up to 10 cores."
    )
    /// `db_pool_timeout`.
    public static let databasePoolTimeout = Setting(
        key: "db_pool_timeout", kind: .seconds(maximum: 300), defaultValue: "5", isSecret: false,
        summary: "Seconds a request waits for a free database connection before 503.")
    /// `db_shared_reads`.
    public static let databaseSharedReads = Setting(
        key: "db_shared_reads", kind: .integer(1...64), defaultValue: "1", isSecret: false,
        summary:
            "Reads that are one round trip (a pull's, Realtime's) in flight at once on one database connection. Above 1, a read is sent behind others on a connection already busy with such reads, up to this many, before another connection is taken: PostgreSQL runs them back to back and the server reads several answers per wake-up (about 20 % more one-row pulls per second on 2 cores, bench/README.md), but on a saturated 2-core machine the few backends doing all the reads were left runnable without CPU for 50 ms to over a second by Linux's group scheduling when PostgreSQL ran in a session's autogroup of its own: keep 1 (each read has a connection of its own) there. With PostgreSQL and the server in cgroups of their own (containers, as docker-compose.yml runs them, which sets 4) depth 4 did not stall and served about 50 % more one-row pulls."
    )
    /// `rest_statement_timeout`.
    public static let restStatementTimeout = Setting(
        key: "rest_statement_timeout", kind: .seconds(maximum: 3600), defaultValue: "8", isSecret: false,
        summary:
            "Seconds one database statement of a /rest/v1 request may run before PostgreSQL cancels it and the request gets 400 `57014`: bounds what a large offset, `Prefer: count=exact`, or a filter or order on a column without an index can cost (a user's own rows only). Hosted Supabase gives signed-in users 8 s."
    )
    /// `api_key`.
    public static let apiKey = Setting(
        key: "api_key", kind: .text, defaultValue: nil, isSecret: true,
        summary:
            "When set, /rest/v1 requests must send it in the apikey header, and GET /realtime/v1/websocket in that header or as ?apikey= (the apps' anon key; visible ASCII, at most 1024 characters). Default: any value."
    )
    /// `jwt_expiry`.
    public static let jwtExpiry = Setting(
        key: "jwt_expiry", kind: .integer(60...604_800), defaultValue: "3600", isSecret: false,
        summary: "Access token lifetime in seconds.")
    /// `otp_expiry`.
    public static let otpExpiry = Setting(
        key: "otp_expiry", kind: .integer(30...86_400), defaultValue: "600", isSecret: false,
        summary: "Seconds a sign-in or confirmation code stays valid.")
    /// `otp_resend_interval`.
    public static let otpResendInterval = Setting(
        key: "otp_resend_interval", kind: .integer(0...3600), defaultValue: "60", isSecret: false,
        summary:
            "Seconds before another code may be sent to the same address (or, for confirmation codes, the same user).")
    /// `otp_max_attempts`.
    public static let otpMaxAttempts = Setting(
        key: "otp_max_attempts", kind: .integer(1...100), defaultValue: "5", isSecret: false,
        summary: "Wrong guesses after which a code (sign-in or confirmation) is dead.")
    /// `otp_failure_limit`.
    public static let otpFailureLimit = Setting(
        key: "otp_failure_limit", kind: .rule, defaultValue: "10/3600", isSecret: false,
        summary:
            "Refused /auth/v1/verify requests per address, across codes and client addresses, that lock verification for the address, as failures/seconds; likewise refused confirmation codes per user for DELETE /sync/v1/account."
    )
    /// `otp_lockout`.
    public static let otpLockout = Setting(
        key: "otp_lockout", kind: .integer(1...604_800), defaultValue: "3600", isSecret: false,
        summary: "Seconds verification stays locked; meanwhile every code, the right one too, gets `otp_expired`.")
    /// `rate_limit_otp`.
    public static let rateLimitOTP = Setting(
        key: "rate_limit_otp", kind: .rule, defaultValue: "30/300", isSecret: false,
        summary:
            "Per-client limit (an IPv4 address or an IPv6 /64) on POST /auth/v1/otp, and apart on /auth/v1/reauthenticate, as requests/seconds."
    )
    /// `rate_limit_verify`.
    public static let rateLimitVerify = Setting(
        key: "rate_limit_verify", kind: .rule, defaultValue: "30/300", isSecret: false,
        summary:
            "Per-client limit (an IPv4 address or an IPv6 /64) on POST /auth/v1/verify, and apart on DELETE /sync/v1/account, as requests/seconds."
    )
    /// `rate_limit_token`.
    public static let rateLimitToken = Setting(
        key: "rate_limit_token", kind: .rule, defaultValue: "150/300", isSecret: false,
        summary: "Per-client limit (an IPv4 address or an IPv6 /64) on POST /auth/v1/token, as requests/seconds.")
    /// `rate_limit_otp_email`.
    public static let rateLimitOTPEmail = Setting(
        key: "rate_limit_otp_email", kind: .rule, defaultValue: "10/3600", isSecret: false,
        summary:
            "Per email address limit on POST /auth/v1/otp, and apart on /auth/v1/reauthenticate, whatever client asks, as requests/seconds."
    )
    /// `rate_limit_verify_email`.
    public static let rateLimitVerifyEmail = Setting(
        key: "rate_limit_verify_email", kind: .rule, defaultValue: "30/3600", isSecret: false,
        summary: "Per email address limit on POST /auth/v1/verify, whatever client asks, as requests/seconds.")
    /// `rate_limit_mail`.
    public static let rateLimitMail = Setting(
        key: "rate_limit_mail", kind: .rule, defaultValue: "1000/3600", isSecret: false,
        summary: "Sign-in and confirmation codes the whole deployment may issue (mailed or not), as codes/seconds.")
    /// `refresh_reuse_interval`.
    public static let refreshReuseInterval = Setting(
        key: "refresh_reuse_interval", kind: .integer(0...300), defaultValue: "10", isSecret: false,
        summary: "Seconds a just-rotated refresh token still yields a session (tabs refreshing together).")
    /// `http_header_timeout`.
    public static let httpHeaderTimeout = Setting(
        key: "http_header_timeout", kind: .seconds(maximum: 3600), defaultValue: "10", isSecret: false,
        summary:
            "Seconds a client has to send a whole request head from its first byte (then 408); also how long a new connection may stay silent."
    )
    /// `http_body_timeout`.
    public static let httpBodyTimeout = Setting(
        key: "http_body_timeout", kind: .seconds(maximum: 3600), defaultValue: "30", isSecret: false,
        summary: "Seconds a client has to send a whole request body once its head was accepted (then 408).")
    /// `http_idle_timeout`.
    public static let httpIdleTimeout = Setting(
        key: "http_idle_timeout", kind: .seconds(maximum: 3600), defaultValue: "60", isSecret: false,
        summary: "Seconds an idle keep-alive connection stays open between requests.")
    /// `http_write_timeout`.
    public static let httpWriteTimeout = Setting(
        key: "http_write_timeout", kind: .seconds(maximum: 3600), defaultValue: "30", isSecret: false,
        summary: "Seconds a response may wait for the client to read it before the connection is closed.")
    /// `http_max_connections`.
    public static let httpMaxConnections = Setting(
        key: "http_max_connections", kind: .integer(1...1_000_000), defaultValue: "10000", isSecret: false,
        summary: "Most open client connections; more are answered 503 and closed.")
    /// `http_max_connections_per_client`.
    public static let httpMaxConnectionsPerClient = Setting(
        key: "http_max_connections_per_client", kind: .integer(0...1_000_000), defaultValue: "256", isSecret: false,
        summary:
            "Most open connections from one client address (an IPv6 client counts per /64); more are answered 503 and closed. Decided at accept from the peer address (`X-Forwarded-For` is not read yet): trusted proxies are exempt. 0: no cap."
    )
    /// `http_max_buffered_output`.
    public static let httpMaxBufferedOutput = Setting(
        key: "http_max_buffered_output", kind: .integer(1_048_576...1_099_511_627_776), defaultValue: "268435456",
        isSecret: false,
        summary:
            "Bytes of output the server may hold for clients that have not read it yet, over all connections: answers, event streams, exports and Realtime messages. A GET whose answer is over 64 KiB and would go past it is answered 503 server_busy with Retry-After: 1 instead; smaller answers, and answers to requests that change something, always go. While it is reached, a client that has not read what it was sent gets nothing more: its event stream ends at the next live event (it resumes with Last-Event-ID), its Realtime socket closes with 1013, its export waits. Keep it above the largest answer (~66 MB: a REST read of 1,000 full rows) and within the memory the server can spare."
    )
    /// `http_max_buffered_output_per_client`.
    public static let httpMaxBufferedOutputPerClient = Setting(
        key: "http_max_buffered_output_per_client", kind: .integer(0...1_099_511_627_776), defaultValue: "67108864",
        isSecret: false,
        summary:
            "Bytes of the answers over 64 KiB counted in `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT` that one account may hold, over all its connections and devices, until its clients have read them; an answer to a request without a bearer token, or on a route that takes none, counts for its client address instead (an IPv6 client per /64; behind `TRUNK_SYNC_TRUSTED_PROXIES`, the forwarded client). A GET whose answer is over 64 KiB and would take its account or address past it is answered 503 server_busy with Retry-After: 1 instead, as over `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT`, so one user asking for large answers on many connections and never reading them cannot hold the whole of it and refuse everyone else's large reads; answers to requests that change something count but always go. An answer counts whole until it is sent or its connection closes. Event streams, exports and Realtime messages have no share (streams are capped per user, one export per user at a time). Keep it above the largest answer (~66 MB: a REST read of 1,000 full rows), with room for the large reads one user's devices make at once. 0, or at least `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT`: no share."
    )
    /// `http_max_buffered_input`.
    public static let httpMaxBufferedInput = Setting(
        key: "http_max_buffered_input", kind: .integer(1_048_576...1_099_511_627_776), defaultValue: "268435456",
        isSecret: false,
        summary:
            "Bytes of request bodies the server may hold while it reads and handles them, over all connections (a body counts until its request is answered). A body over 64 KiB that would go past it is answered 503 server_busy with Retry-After: 1 instead of being read (from its head; a chunked body when it grows past); smaller bodies always pass. Keep it above the largest body (10 MiB: a push or a REST insert) and within the memory the server can spare."
    )
    /// `http_max_buffered_input_per_client`.
    public static let httpMaxBufferedInputPerClient = Setting(
        key: "http_max_buffered_input_per_client", kind: .integer(0...1_099_511_627_776), defaultValue: "67108864",
        isSecret: false,
        summary:
            "Bytes of the request bodies counted in `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT` that one account may hold, over all its connections and devices; a body sent without a bearer token, or on a route that takes none, counts for its client address instead (an IPv6 client per /64; behind `TRUNK_SYNC_TRUSTED_PROXIES`, the forwarded client). A body over 64 KiB that would take its account or address past it is answered 503 server_busy with Retry-After: 1 instead of being read, as over `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT`, so one user with many connections cannot hold the whole of it and refuse everyone else's large pushes. Keep it above the largest body (10 MiB), with room for the large pushes one user's devices make at once. 0, or at least `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT`: no share."
    )
    /// `event_loops`.
    public static let eventLoops = Setting(
        key: "event_loops", kind: .integer(0...1024), defaultValue: "0", isSecret: false,
        summary:
            "Event loops of the public listener, each a thread with its own share of the connections and of the database pool (db_pool_size split across them, at least 1 each). 0: one per online core."
    )
    /// `event_loop_scheduling`.
    public static let eventLoopScheduling = Setting(
        key: "event_loop_scheduling", kind: .text, defaultValue: "batch", isSecret: false,
        summary:
            "How the kernel schedules the event loops' threads: `batch` (SCHED_BATCH: a loop woken by a request does not preempt a busy thread on its core, such as a PostgreSQL backend, but runs when that thread's time slice ends or it waits, then handles all that arrived meanwhile: fewer context switches per request when cores are shared) or `normal` (SCHED_OTHER)."
    )
    /// `stream_heartbeat`.
    public static let streamHeartbeat = Setting(
        key: "stream_heartbeat", kind: .integer(1...3600), defaultValue: "15", isSecret: false,
        summary:
            "Seconds between the `: keep-alive` comments of every event stream (GET /sync/v1/stream), so proxies keep idle streams open."
    )
    /// `stream_max_per_user`.
    public static let streamMaxPerUser = Setting(
        key: "stream_max_per_user", kind: .integer(1...100_000), defaultValue: "10", isSecret: false,
        summary: "Most event streams one user may have open on this instance; more are answered 429 with Retry-After.")
    /// `stream_max`.
    public static let streamMax = Setting(
        key: "stream_max", kind: .integer(1...1_000_000), defaultValue: "5000", isSecret: false,
        summary:
            "Most event streams open on this instance; more are answered 429 with Retry-After. Each is an open connection: keep it below TRUNK_SYNC_HTTP_MAX_CONNECTIONS."
    )
    /// `stream_buffer`.
    public static let streamBuffer = Setting(
        key: "stream_buffer", kind: .integer(4096...67_108_864), defaultValue: "262144", isSecret: false,
        summary:
            "Bytes an event stream may have waiting for a slow client; a live event that finds it full ends the stream (the client resumes with Last-Event-ID, losing nothing), as does one that finds the client behind while TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT, which counts every stream's waiting bytes, is reached."
    )
    /// `realtime_max`.
    public static let realtimeMax = Setting(
        key: "realtime_max", kind: .integer(1...1_000_000), defaultValue: "5000", isSecret: false,
        summary:
            "Most Supabase Realtime sockets (`GET /realtime/v1/websocket`) open on this instance; more are answered 429 with Retry-After. Each is an open connection: keep it below TRUNK_SYNC_HTTP_MAX_CONNECTIONS."
    )
    /// `realtime_max_channels_per_user`.
    public static let realtimeMaxChannelsPerUser = Setting(
        key: "realtime_max_channels_per_user", kind: .integer(1...100_000), defaultValue: "100", isSecret: false,
        summary:
            "Most Realtime channels one user may have joined on this instance; a join over it is refused in its reply. Also the most sockets of one user that joined a channel once and have none now: one more closes the oldest."
    )
    /// `realtime_max_filter_bytes`.
    public static let realtimeMaxFilterBytes = Setting(
        key: "realtime_max_filter_bytes", kind: .integer(1024...16_777_216), defaultValue: "65536", isSecret: false,
        summary:
            "Bytes of postgres_changes filters (`column=op.value`, as the client sent them) one user's joined Realtime channels may have together on this instance; a join over it is refused in its reply. Each channel keeps its filters parsed while joined (`in.(…)` values each in a set): this bounds that memory per account, which the limits on channels and bindings alone left at 100 join messages of filters (6.4 MB of text before parsing). 65536 fits 1,000 bindings of `user_id=eq.<uuid>`, or 17 of `id=in.(…)` with 100 UUIDs."
    )
    /// `realtime_buffer`.
    public static let realtimeBuffer = Setting(
        key: "realtime_buffer", kind: .integer(4096...67_108_864), defaultValue: "262144", isSecret: false,
        summary:
            "Bytes a Realtime socket may have waiting for a slow client; a message that finds it full closes the socket with 1013 (Realtime does not replay: the client rejoins and should pull), as does one that finds the client behind while TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT, which counts every socket's waiting bytes, is reached."
    )
    /// `realtime_idle_timeout`.
    public static let realtimeIdleTimeout = Setting(
        key: "realtime_idle_timeout", kind: .integer(30...3600), defaultValue: "90", isSecret: false,
        summary: "Seconds a Realtime socket may send nothing (not even its 25 s heartbeat) before it is closed.")
    /// `realtime_max_joins_per_second`.
    public static let realtimeMaxJoinsPerSecond = Setting(
        key: "realtime_max_joins_per_second", kind: .integer(1...10_000), defaultValue: "10", isSecret: false,
        summary:
            "Channel joins (phx_join) one Realtime socket may send per second on average, in bursts of up to 100 (the channels a socket may have: a client that reconnects rejoins them all at once) or this, whichever is more. Each join checks a token and may read the database. One more is refused with ClientJoinRateLimitReached: Too many joins per second, and the socket is closed with 1008, as Supabase Realtime disconnects it (the clients reconnect and rejoin)."
    )
    /// `realtime_max_messages_per_second`.
    public static let realtimeMaxMessagesPerSecond = Setting(
        key: "realtime_max_messages_per_second", kind: .integer(1...100_000), defaultValue: "100", isSecret: false,
        summary:
            "Messages of any kind (heartbeats, joins, access_token, leaves, refused ones) one Realtime socket may send per second on average, in bursts of up to 200 (a join and an access_token for each of the 100 channels a socket may have) or this, whichever is more. One more is answered with Too many messages per second (Supabase Realtime's reason), and the socket is closed with 1008."
    )

    /// Every setting trunk-sync reads, in the order `config check` prints them and the
    /// generated files list them.
    public static let all: [Setting] = [
        databaseURL,
        migrationDatabaseURL,
        host,
        port,
        adminHost,
        adminPort,
        adminEmails,
        adminHostnames,
        trustedProxies,
        jwtSecret,
        keyEncryptionKey,
        keyEncryptionKeyFile,
        publicURL,
        acceptedIssuers,
        mailer,
        smtpURL,
        mailFrom,
        mailSenders,
        mailQueueSize,
        corsOrigins,
        logLevel,
        logFormat,
        migrationsDir,
        databasePoolSize,
        databasePoolTimeout,
        databaseSharedReads,
        restStatementTimeout,
        apiKey,
        jwtExpiry,
        otpExpiry,
        otpResendInterval,
        otpMaxAttempts,
        otpFailureLimit,
        otpLockout,
        rateLimitOTP,
        rateLimitVerify,
        rateLimitToken,
        rateLimitOTPEmail,
        rateLimitVerifyEmail,
        rateLimitMail,
        refreshReuseInterval,
        httpHeaderTimeout,
        httpBodyTimeout,
        httpIdleTimeout,
        httpWriteTimeout,
        httpMaxConnections,
        httpMaxConnectionsPerClient,
        httpMaxBufferedOutput,
        httpMaxBufferedOutputPerClient,
        httpMaxBufferedInput,
        httpMaxBufferedInputPerClient,
        eventLoops,
        eventLoopScheduling,
        streamHeartbeat,
        streamMaxPerUser,
        streamMax,
        streamBuffer,
        realtimeMax,
        realtimeMaxChannelsPerUser,
        realtimeMaxFilterBytes,
        realtimeBuffer,
        realtimeIdleTimeout,
        realtimeMaxJoinsPerSecond,
        realtimeMaxMessagesPerSecond,
    ]

    /// The setting with a config-file key, if any.
    public static func named(_ key: String) -> Setting? { all.first { $0.key == key } }
}

/// The defaults as typed values, for the properties that hold a setting before (or instead
/// of) its value is read. Every default is valid (`Configuration.load(environment: [:])`
/// succeeds, and ConfigurationFilesTests checks it), so the fallbacks are never taken.
extension Setting {
    /// The default as text (empty when there is none).
    var textDefault: String { defaultValue ?? "" }
    /// The default of an `.integer` setting.
    var integerDefault: Int { defaultValue.flatMap { Int($0) } ?? 0 }
    /// The default of a `.seconds` setting.
    var secondsDefault: Double { defaultValue.flatMap { Double($0) } ?? 0 }
    /// The values an `.integer` setting accepts.
    var integerRange: ClosedRange<Int> {
        if case .integer(let range) = kind { return range }
        return Int.min...Int.max
    }
    /// The most seconds a `.seconds` setting accepts.
    var secondsMaximum: Double {
        if case .seconds(let maximum) = kind { return maximum }
        return .infinity
    }
    /// The default of a `.rule` setting.
    var ruleDefault: RateLimiter.Rule {
        let parts = textDefault.split(separator: "/").compactMap { Int($0) }
        return RateLimiter.Rule(limit: parts.first ?? 0, window: parts.count == 2 ? parts[1] : 0)
    }
}
