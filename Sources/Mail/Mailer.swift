/// Something that delivers email: `SMTPMailer` for real delivery, `LogMailer` for
/// development (`TRUNK_SYNC_MAILER=log`).
public protocol Mailer: Sendable {
    /// Delivers `message`, returning once the mail server (or log) has accepted it.
    /// - Throws: `MailError`, whose `description` is safe to log.
    func send(_ message: MailMessage) async throws
}
