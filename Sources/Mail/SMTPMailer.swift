import Glibc
import Logging

/// A `Mailer` that delivers through an SMTP server (`TRUNK_SYNC_MAILER=smtp`).
///
/// Each message gets its own session — connect, TLS as configured, `AUTH` when
/// credentials are configured, `MAIL FROM`, `RCPT TO`, `DATA`, `QUIT` — on a thread the
/// mailer owns: `send` suspends the caller and never blocks Swift's cooperative pool.
/// At most `maximumConnections` sessions run at once and at most `queueLimit` messages
/// wait for one; beyond that `send` fails at once with `.overloaded` (nothing grows
/// without bound while a mail server is slow).
///
/// Cancelling the task that awaits `send` does not stop a session already queued: a mail
/// may be accepted after its sender stopped waiting, but never half-sent.
public final class SMTPMailer: Mailer {
    /// Where and how mail is delivered.
    public let configuration: SMTPConfiguration
    private let tlsContext: TLSClientContext?
    private let threads: SessionThreads
    private let logger: Logger

    /// A mailer for `configuration`.
    /// - Parameters:
    ///   - logger: receives `debug` lines about deliveries and `trace` lines per command
    ///     (command names and reply codes only, never arguments).
    ///   - maximumConnections: sessions running at once. Default: 2.
    ///   - queueLimit: messages waiting for a free session. Default: 100.
    /// - Throws: `.invalidConfiguration` when the TLS context cannot be set up (a `ca_file`
    ///   that does not load, no system CA store).
    public init(
        configuration: SMTPConfiguration, logger: Logger, maximumConnections: Int = 2, queueLimit: Int = 100
    ) throws {
        self.configuration = configuration
        self.logger = logger
        self.tlsContext =
            configuration.tls == .none
            ? nil
            : try TLSClientContext(
                verifyCertificate: configuration.verifyCertificate, caFile: configuration.caFile,
                setting: SMTPConfiguration.environmentVariable)
        self.threads = SessionThreads(name: "smtp", maximumThreads: maximumConnections, queueLimit: queueLimit)
    }

    deinit { threads.stop() }

    /// Lets the session threads end once the mails in hand are done (the process joins them
    /// before exiting); later sends fail as `.overloaded`.
    public func close() { threads.stop() }

    /// Delivers `message`, returning once the server accepted it.
    /// - Throws: `MailError`: `.invalidMessage` before connecting, `.overloaded` when the
    ///   queue is full, else what the session ran into (see `MailError.Kind`).
    public func send(_ message: MailMessage) async throws {
        let mime = try MIMEMessage(message, unixTime: time(nil))
        let session = SMTPSession(configuration: configuration, tlsContext: tlsContext, logger: logger)
        let endpoint = configuration.endpoint
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let accepted = threads.submit {
                do {
                    try session.deliver(mime)
                    continuation.resume()
                } catch {
                    continuation.resume(throwing: error)
                }
            }
            if !accepted {
                continuation.resume(
                    throwing: MailError(
                        .overloaded, "too many messages are waiting for SMTP server \(endpoint); this one was not sent")
                )
            }
        }
    }
}
