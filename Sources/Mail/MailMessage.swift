/// A plain-text email to one recipient.
///
/// Addresses are checked when the message is sent (see `MailAddress`); `SMTPMailer` writes
/// it as a MIME message (UTF-8 text, headers encoded as needed).
public struct MailMessage: Sendable, Equatable {
    /// The sender: `local@domain` or `Name <local@domain>`.
    public var from: String
    /// The recipient: `local@domain` or `Name <local@domain>`.
    public var to: String
    /// The subject, any Unicode text without line breaks.
    public var subject: String
    /// The body, plain text; line endings may be `\n`, `\r\n` or `\r`.
    public var textBody: String
    /// One line describing the message for a console log (`LogMailer`), e.g.
    /// `sign-in code for a@example.com: 123456`; `nil` logs the subject and body instead.
    /// `SMTPMailer` ignores it.
    public var logSummary: String?

    /// A message from its parts.
    public init(from: String, to: String, subject: String, textBody: String, logSummary: String? = nil) {
        self.from = from
        self.to = to
        self.subject = subject
        self.textBody = textBody
        self.logSummary = logSummary
    }

    /// The email carrying a one-time sign-in code.
    ///
    /// The subject is `Your sign-in code: CODE` (so it shows in notification previews);
    /// the body repeats the code, says how long it stays valid, and that the email can be
    /// ignored if the reader did not ask to sign in. `logSummary` is
    /// `sign-in code for TO: CODE`.
    /// - Parameters:
    ///   - code: the code, e.g. `123456`.
    ///   - to: the recipient's address.
    ///   - from: the sender (`TRUNK_SYNC_MAIL_FROM`).
    ///   - expiresInMinutes: how long the code is valid.
    public static func signInCode(code: String, to: String, from: String, expiresInMinutes: Int) -> MailMessage {
        let minutes = expiresInMinutes == 1 ? "1 minute" : "\(expiresInMinutes) minutes"
        let body = """
            Your sign-in code is:

                \(code)

            Enter it in the app to finish signing in. It expires in \(minutes) and works only once.

            If you did not ask to sign in, you can ignore this email: nobody can sign in without the code.

            """
        return MailMessage(
            from: from, to: to, subject: "Your sign-in code: \(code)", textBody: body,
            logSummary: "sign-in code for \(to): \(code)")
    }

    /// The email carrying a one-time code that confirms an action of a signed-in user
    /// (`POST /auth/v1/reauthenticate`, needed to delete the account).
    ///
    /// The subject is `Your confirmation code: CODE`; the body repeats the code, says how
    /// long it stays valid and that it confirms deleting the account, and tells a reader who
    /// did not ask to ignore it and sign out elsewhere. `logSummary` is `confirmation code
    /// for TO: CODE`.
    public static func confirmationCode(code: String, to: String, from: String, expiresInMinutes: Int) -> MailMessage {
        let minutes = expiresInMinutes == 1 ? "1 minute" : "\(expiresInMinutes) minutes"
        let body = """
            Your confirmation code is:

                \(code)

            The app asked for it to confirm a change to your account, such as deleting it with all
            its data. It expires in \(minutes) and works only once.

            If you did not ask for it, do not enter it anywhere: someone may be signed in as you.
            Sign out of your other devices from the app, and nothing will be changed.

            """
        return MailMessage(
            from: from, to: to, subject: "Your confirmation code: \(code)", textBody: body,
            logSummary: "confirmation code for \(to): \(code)")
    }
}
