/// Something that delivers email: `SMTPMailer` for real delivery, `LogMailer` for
/// development (`TRUNK_SYNC_MAILER=log`).
public protocol Mailer: Sendable {
    /// Delivers `message`, returning once the mail server (or log) has accepted it.
    /// - Throws: `MailError`, whose `description` is safe to log.
    func send(_ message: MailMessage) async throws
    /// Lets the mailer's threads end once the mails in hand are done; later sends fail.
    func close()
}

extension Mailer {
    /// Nothing to close.
    public func close() {}
}
