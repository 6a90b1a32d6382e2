/// One configuration setting: its key in a config file, its environment variable, its
/// default and what it does. `Setting.all` is the single list that loading, `config check`
/// and the documentation in `config/` follow.
public struct Setting: Sendable {
    /// Key in a JSON config file, e.g. `database_url`.
    public let key: String
    /// Default value as text, or `nil` when there is none.
    public let defaultValue: String?
    /// Whether the value is a secret (redacted in `config check` and logs).
    public let isSecret: Bool
    /// What the setting does.
    public let summary: String

    /// The environment variable, e.g. `TRUNK_SYNC_DATABASE_URL`.
    public var environmentVariable: String { "TRUNK_SYNC_" + key.uppercased() }

    /// Every setting trunk-sync reads.
    public static let all: [Setting] = [
        Setting(
            key: "database_url", defaultValue: nil, isSecret: true,
            summary: "PostgreSQL to use: postgres://user:pass@host:port/db or a libpq conninfo string. Required. serve and token log in with it: best a role of the server's own (see TRUNK_SYNC_MIGRATION_DATABASE_URL); serve and config check warn when it is a superuser or owns the tables."),
        Setting(
            key: "migration_database_url", defaultValue: nil, isSecret: true,
            summary: "PostgreSQL URL of the tables' owner, for migrate, keys and users. Default: TRUNK_SYNC_DATABASE_URL. When it logs in as another role than TRUNK_SYNC_DATABASE_URL, migrate creates or updates that role as the server's login (LOGIN, member of trunk_sync_app and nothing else, the password given there)."),
        Setting(key: "host", defaultValue: "127.0.0.1", isSecret: false, summary: "Address to listen on (IPv4 or IPv6)."),
        Setting(key: "port", defaultValue: "8080", isSecret: false, summary: "TCP port to listen on (0: any free port, logged at start)."),
        Setting(
            key: "admin_host", defaultValue: "127.0.0.1", isSecret: false,
            summary: "Address of the operator listener (GET /metrics, detailed /readyz). Keep it private: loopback, or a network only your monitoring reaches."),
        Setting(
            key: "admin_port", defaultValue: "9090", isSecret: false,
            summary: "TCP port of the operator listener (0: any free port, logged at start as `admin listening`). Must differ from TRUNK_SYNC_PORT."),
        Setting(
            key: "admin_emails", defaultValue: "", isSecret: false,
            summary: "Comma-separated email addresses that may sign in to the operator console (/console/ on the admin listener) with a mailed code. Default none: console sign-in is disabled."),
        Setting(
            key: "admin_hostnames", defaultValue: "", isSecret: false,
            summary: "Comma-separated host names the operator listener answers to besides its addresses (e.g. trunk-sync for a scraper on a compose network, or the name a TLS proxy serves the console under). A request whose Host is another name is refused (421): DNS rebinding cannot reach the listener. Default none: addresses only, and localhost when bound to loopback or a wildcard address."),
        Setting(
            key: "trusted_proxies", defaultValue: "", isSecret: false,
            summary: "Comma-separated addresses or CIDR blocks (IPv4 and IPv6) of your reverse proxies. Only for a peer in this list is the client taken from X-Forwarded-For (the rightmost address that is not a trusted proxy). Default none: the peer is the client."),
        Setting(
            key: "jwt_secret", defaultValue: nil, isSecret: true,
            summary: "HS256 signing secret for access tokens: openssl rand -base64 48 (at least 32 bytes; example and guessable values are refused). Required by serve."),
        Setting(
            key: "key_encryption_key", defaultValue: nil, isSecret: true,
            summary: "Encrypts the ES256 private keys stored in the database (AES-256-GCM): openssl rand -base64 48, the same for migrate, keys add and every server, kept out of the database and its backups. Required by keys add, and by migrate and serve once signing keys exist."),
        Setting(
            key: "key_encryption_key_file", defaultValue: nil, isSecret: false,
            summary: "A file holding TRUNK_SYNC_KEY_ENCRYPTION_KEY instead (a Docker or Kubernetes secret); surrounding whitespace is ignored. Set one of the two."),
        Setting(
            key: "public_url", defaultValue: nil, isSecret: false,
            summary: "External base URL. URL/auth/v1 is the token issuer (iss), checked on every request: every instance of a deployment, and trunk-sync token, must share it. Default http://HOST:PORT."),
        Setting(
            key: "accepted_issuers", defaultValue: "", isSecret: false,
            summary: "Comma-separated further token issuers (iss) accepted beside URL/auth/v1, full URLs such as https://<ref>.supabase.co/auth/v1: after moving from a hosted Supabase project, its access tokens (signed with TRUNK_SYNC_JWT_SECRET set to the project's JWT secret, or with keys from keys import-jwks) keep working until they expire. Default none."),
        Setting(key: "mailer", defaultValue: "log", isSecret: false, summary: "log (codes printed to the log) or smtp."),
        Setting(
            key: "smtp_url", defaultValue: nil, isSecret: true,
            summary: "smtp://[user:pass@]host:port[?tls=none|starttls|tls][&verify=false][&ca_file=PATH] or smtps://…; smtp:// requires STARTTLS unless tls=none; required when mailer is smtp."),
        Setting(key: "mail_from", defaultValue: "no-reply@localhost", isSecret: false, summary: "Sender address of sign-in mails."),
        Setting(
            key: "mail_senders", defaultValue: "2", isSecret: false,
            summary: "Sign-in mails sent at once (sender tasks, and SMTP sessions). Mails go out after /otp has answered."),
        Setting(
            key: "mail_queue_size", defaultValue: "1000", isSecret: false,
            summary: "Sign-in mails waiting for a sender; when full, a new one is dropped (counted in trunk_sync_mail_dropped_total, logged) and /otp still answers 200."),
        Setting(
            key: "cors_origins", defaultValue: "", isSecret: false,
            summary: "Comma-separated origins allowed by CORS; * allows any. Default none."),
        Setting(key: "log_level", defaultValue: "info", isSecret: false, summary: "trace, debug, info, notice, warning, error or critical; info and below write the access log."),
        Setting(key: "log_format", defaultValue: "text", isSecret: false, summary: "text or json (one object per line)."),
        Setting(
            key: "migrations_dir", defaultValue: nil, isSecret: false,
            summary: "Directory of migration files. Default ./migrations, else share/trunk-sync/migrations beside the binary."),
        Setting(
            key: "db_pool_size", defaultValue: "10", isSecret: false,
            summary: "Most database connections the server opens (each with a thread of its own)."),
        Setting(
            key: "db_pool_timeout", defaultValue: "5", isSecret: false,
            summary: "Seconds a request waits for a free database connection before 503."),
        Setting(
            key: "api_key", defaultValue: nil, isSecret: true,
            summary: "When set, /rest/v1 requests must send it in the apikey header (the apps' anon key; visible ASCII, at most 1024 characters). Default: any value."),
        Setting(key: "jwt_expiry", defaultValue: "3600", isSecret: false, summary: "Access token lifetime in seconds."),
        Setting(key: "otp_expiry", defaultValue: "600", isSecret: false, summary: "Seconds a sign-in or confirmation code stays valid."),
        Setting(
            key: "otp_resend_interval", defaultValue: "60", isSecret: false,
            summary: "Seconds before another code may be sent to the same address (or, for confirmation codes, the same user)."),
        Setting(
            key: "otp_max_attempts", defaultValue: "5", isSecret: false,
            summary: "Wrong guesses after which a code (sign-in or confirmation) is dead."),
        Setting(
            key: "otp_failure_limit", defaultValue: "10/3600", isSecret: false,
            summary: "Refused /auth/v1/verify requests per address, across codes and client addresses, that lock verification for the address, as failures/seconds; likewise refused confirmation codes per user for DELETE /sync/v1/account."),
        Setting(
            key: "otp_lockout", defaultValue: "3600", isSecret: false,
            summary: "Seconds verification stays locked; meanwhile every code, the right one too, gets otp_expired."),
        Setting(
            key: "rate_limit_otp", defaultValue: "30/300", isSecret: false,
            summary: "Per-client limit (an IPv4 address or an IPv6 /64) on POST /auth/v1/otp, and apart on /auth/v1/reauthenticate, as requests/seconds."),
        Setting(
            key: "rate_limit_verify", defaultValue: "30/300", isSecret: false,
            summary: "Per-client limit (an IPv4 address or an IPv6 /64) on POST /auth/v1/verify, and apart on DELETE /sync/v1/account, as requests/seconds."),
        Setting(
            key: "rate_limit_token", defaultValue: "150/300", isSecret: false,
            summary: "Per-client limit (an IPv4 address or an IPv6 /64) on POST /auth/v1/token, as requests/seconds."),
        Setting(
            key: "rate_limit_otp_email", defaultValue: "10/3600", isSecret: false,
            summary: "Per email address limit on POST /auth/v1/otp, and apart on /auth/v1/reauthenticate, whatever client asks, as requests/seconds."),
        Setting(
            key: "rate_limit_verify_email", defaultValue: "30/3600", isSecret: false,
            summary: "Per email address limit on POST /auth/v1/verify, whatever client asks, as requests/seconds."),
        Setting(
            key: "rate_limit_mail", defaultValue: "1000/3600", isSecret: false,
            summary: "Sign-in and confirmation codes the whole deployment may issue (mailed or not), as codes/seconds."),
        Setting(
            key: "refresh_reuse_interval", defaultValue: "10", isSecret: false,
            summary: "Seconds a just-rotated refresh token still yields a session (tabs refreshing together)."),
        Setting(
            key: "http_header_timeout", defaultValue: "10", isSecret: false,
            summary: "Seconds a client has to send a whole request head from its first byte (then 408); also how long a new connection may stay silent."),
        Setting(
            key: "http_body_timeout", defaultValue: "30", isSecret: false,
            summary: "Seconds a client has to send a whole request body once its head was accepted (then 408)."),
        Setting(
            key: "http_idle_timeout", defaultValue: "60", isSecret: false,
            summary: "Seconds an idle keep-alive connection stays open between requests."),
        Setting(
            key: "http_write_timeout", defaultValue: "30", isSecret: false,
            summary: "Seconds a response may wait for the client to read it before the connection is closed."),
        Setting(
            key: "http_max_connections", defaultValue: "10000", isSecret: false,
            summary: "Most open client connections; more are answered 503 and closed."),
        Setting(
            key: "http_max_connections_per_client", defaultValue: "256", isSecret: false,
            summary: "Most open connections from one client address (an IPv6 client counts per /64); more are answered 503 and closed. Decided at accept from the peer address (X-Forwarded-For is not read yet): trusted proxies are exempt. 0: no cap."),
        Setting(
            key: "stream_heartbeat", defaultValue: "15", isSecret: false,
            summary: "Seconds between the `: keep-alive` comments of every event stream (GET /sync/v1/stream), so proxies keep idle streams open."),
        Setting(
            key: "stream_max_per_user", defaultValue: "10", isSecret: false,
            summary: "Most event streams one user may have open on this instance; more are answered 429 with Retry-After."),
        Setting(
            key: "stream_max", defaultValue: "5000", isSecret: false,
            summary: "Most event streams open on this instance; more are answered 429 with Retry-After. Each is an open connection: keep it below TRUNK_SYNC_HTTP_MAX_CONNECTIONS."),
        Setting(
            key: "stream_buffer", defaultValue: "262144", isSecret: false,
            summary: "Bytes an event stream may have waiting for a slow client; a live event that finds it full ends the stream (the client resumes with Last-Event-ID, losing nothing)."),
        Setting(
            key: "realtime_max", defaultValue: "5000", isSecret: false,
            summary: "Most Supabase Realtime sockets (GET /realtime/v1/websocket) open on this instance; more are answered 429 with Retry-After. Each is an open connection: keep it below TRUNK_SYNC_HTTP_MAX_CONNECTIONS."),
        Setting(
            key: "realtime_max_channels_per_user", defaultValue: "100", isSecret: false,
            summary: "Most Realtime channels one user may have joined on this instance; a join over it is refused in its reply."),
        Setting(
            key: "realtime_buffer", defaultValue: "262144", isSecret: false,
            summary: "Bytes a Realtime socket may have waiting for a slow client; a message that finds it full closes the socket with 1013 (Realtime does not replay: the client rejoins and should pull)."),
        Setting(
            key: "realtime_idle_timeout", defaultValue: "90", isSecret: false,
            summary: "Seconds a Realtime socket may send nothing (not even its 25 s heartbeat) before it is closed."),
    ]

    /// The setting with a config-file key, if any.
    public static func named(_ key: String) -> Setting? { all.first { $0.key == key } }
}
