/// An error from the `Mail` module.
///
/// `description` is safe to log or show: it names the server and the step that failed,
/// with the SMTP reply code, and never contains a password, a message body (which carries
/// sign-in codes) or a message's addresses. `debugDescription` adds what the server or
/// OpenSSL said, for debugging only.
public struct MailError: Error, Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    /// What went wrong, broadly.
    public enum Kind: Sendable, Equatable {
        /// `TRUNK_SYNC_SMTP_URL` (or another setting) is invalid, or the TLS setup it asks
        /// for cannot be made (a CA file that does not load).
        case invalidConfiguration
        /// The message cannot be sent as given: an address that is not a plain
        /// `local@domain`, a header with a line break.
        case invalidMessage
        /// The server could not be reached: name resolution failed, the connection was
        /// refused, or it did not complete within the connect timeout.
        case connectionFailed
        /// The server did not answer within the command timeout.
        case timedOut
        /// The server closed the connection in the middle of the session.
        case connectionClosed
        /// TLS could not be set up: STARTTLS is not offered or was refused, or the
        /// handshake failed for a reason other than the certificate.
        case tlsFailed
        /// The server's certificate did not verify (untrusted chain, expired, or issued for
        /// another host name).
        case certificateRejected
        /// The server refused the credentials, offers no mechanism this client supports,
        /// or sign-in would have sent them without TLS.
        case authenticationFailed
        /// The server refused the connection, a command, the sender, the recipient or the
        /// message; see `replyCode`.
        case rejected
        /// The server's replies do not follow the SMTP protocol.
        case protocolViolation
        /// Too many messages are already waiting for a connection; nothing was sent.
        case overloaded
    }

    /// What went wrong, broadly.
    public let kind: Kind
    /// The SMTP reply code the server answered with (e.g. `535`), when a reply caused the error.
    public let replyCode: Int?
    /// A safe, one-line summary.
    let message: String
    /// What the server or OpenSSL said (may contain addresses or other data).
    public let detail: String?

    init(_ kind: Kind, _ message: String, replyCode: Int? = nil, detail: String? = nil) {
        self.kind = kind
        self.message = message
        self.replyCode = replyCode
        self.detail = detail
    }

    /// Whether trying again later may succeed: a `4xx` reply, a timeout, an unreachable or
    /// vanished server, or a full queue.
    public var isTransient: Bool {
        if let replyCode { return (400..<500).contains(replyCode) }
        switch kind {
        case .connectionFailed, .timedOut, .connectionClosed, .overloaded: return true
        default: return false
        }
    }

    /// A one-line message that is safe to log.
    public var description: String { message }

    /// The message and what the server or OpenSSL said. Not for logs a user can read.
    public var debugDescription: String {
        guard let detail, !detail.isEmpty else { return message }
        return "\(message): \(detail)"
    }
}
