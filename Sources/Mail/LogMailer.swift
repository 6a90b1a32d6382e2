import Logging

/// A `Mailer` that writes each message to the log instead of sending it
/// (`TRUNK_SYNC_MAILER=log`), so sign-in codes can be read from the console in development.
///
/// A message with a `logSummary` is logged as exactly that line, e.g.
/// `sign-in code for a@example.com: 123456`; any other as `mail to TO: SUBJECT` with the
/// body in the `body` metadata. Both at `notice` level, so they show at the default `info`.
public struct LogMailer: Mailer {
    /// Where messages are written.
    public let logger: Logger

    /// A mailer writing to `logger`.
    public init(logger: Logger) {
        self.logger = logger
    }

    /// Logs `message`; never throws.
    public func send(_ message: MailMessage) async throws {
        if let summary = message.logSummary {
            logger.notice("\(summary)")
        } else {
            logger.notice("mail to \(message.to): \(message.subject)", metadata: ["body": "\(message.textBody)"])
        }
    }
}
