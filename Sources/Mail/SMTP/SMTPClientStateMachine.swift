import TrunkCrypto

/// One SMTP command line (without its CRLF).
struct SMTPCommand: Sendable, Equatable {
    /// The command's name as errors show it (`AUTH`, `MAIL FROM`), never its arguments.
    let verb: String
    /// The full line. For `AUTH` it holds credentials: never log it.
    let line: String

    static func ehlo(_ name: String) -> SMTPCommand { SMTPCommand(verb: "EHLO", line: "EHLO \(name)") }
    static func helo(_ name: String) -> SMTPCommand { SMTPCommand(verb: "HELO", line: "HELO \(name)") }
    static let startTLS = SMTPCommand(verb: "STARTTLS", line: "STARTTLS")
    static let data = SMTPCommand(verb: "DATA", line: "DATA")
    static let quit = SMTPCommand(verb: "QUIT", line: "QUIT")
    static func authentication(_ line: String) -> SMTPCommand { SMTPCommand(verb: "AUTH", line: line) }
    static func mailFrom(_ address: String) -> SMTPCommand {
        SMTPCommand(verb: "MAIL FROM", line: "MAIL FROM:<\(address)>")
    }
    static func rcptTo(_ address: String) -> SMTPCommand { SMTPCommand(verb: "RCPT TO", line: "RCPT TO:<\(address)>") }
}

/// The client side of one SMTP session (RFC 5321, 3207 STARTTLS, 4954 AUTH) as a pure
/// state machine: it takes events (connected, a reply, TLS established) and returns the
/// next action for the I/O layer (`SMTPSession`) to carry out. It does no I/O, so every
/// path — including the refusals — is tested without a server.
///
/// The session: greeting → `EHLO` (→ `HELO` if refused) → `STARTTLS` and `EHLO` again when
/// the configuration asks for it → `AUTH PLAIN` or `AUTH LOGIN` when credentials are
/// configured → `MAIL FROM` → `RCPT TO` → `DATA` → message → `QUIT`.
struct SMTPClientStateMachine: Sendable {
    /// What the session is for.
    struct Plan: Sendable {
        /// `host:port`, for errors.
        var endpoint: String
        var tls: SMTPConfiguration.TLSMode
        var credentials: SMTPConfiguration.Credentials?
        /// The envelope addresses (`local@domain`).
        var sender: String
        var recipient: String
        /// What `EHLO`/`HELO` announce: a host name or an address literal.
        var localName: String
    }

    /// What the I/O layer does next.
    enum Action: Sendable, Equatable {
        /// Read a reply, then call `received(_:)`.
        case readReply
        /// Write the command, read its reply, then call `received(_:)`.
        case send(SMTPCommand)
        /// Run the TLS handshake (refusing bytes the server sent before it), then call
        /// `tlsEstablished()`.
        case startTLS
        /// Write the message (dot-stuffed, with its final `.`), read the reply, then call `received(_:)`.
        case sendMessage
        /// Write `QUIT` and read its reply, ignoring failures, close the connection, then
        /// finish: successfully with nil, else by throwing the error.
        case quit(MailError?)
    }

    /// Which reply of the AUTH exchange is awaited.
    private enum AuthStep: Sendable {
        /// The verdict on `AUTH PLAIN <token>` (sent with its initial response, RFC 4954 §4).
        case plain
        /// The prompt for the user name after `AUTH LOGIN`.
        case loginUsername
        /// The prompt for the password.
        case loginPassword
        /// The verdict after the password; a further 334 is a refusal, never a loop.
        case loginResult
    }

    private enum State: Sendable {
        case idle
        case greeting
        case ehlo
        case helo
        case startTLS
        case handshaking
        case authenticating(AuthStep)
        case mailFrom
        case rcptTo
        case data
        case message
        case finished
    }

    private let plan: Plan
    private var state: State = .idle
    /// Whether the connection is encrypted (from the start with implicit TLS).
    private(set) var secured: Bool
    /// The extensions of the latest `EHLO` reply (keyword → parameters, keywords upper-cased).
    private(set) var extensions: [String: [String]] = [:]

    init(plan: Plan) {
        self.plan = plan
        self.secured = plan.tls == .implicit
    }

    /// The connection is open (and, for implicit TLS, encrypted): wait for the greeting.
    mutating func connected() -> Action {
        state = .greeting
        return .readReply
    }

    /// The TLS handshake after `STARTTLS` succeeded: say `EHLO` again, since what the
    /// server offers may change (RFC 3207 §4.2).
    mutating func tlsEstablished() -> Action {
        secured = true
        extensions = [:]
        state = .ehlo
        return .send(.ehlo(plan.localName))
    }

    /// The server answered.
    mutating func received(_ reply: SMTPReply) -> Action {
        switch state {
        case .greeting:
            guard reply.code == 220 else { return fail(.rejected, "refused the connection", reply) }
            state = .ehlo
            return .send(.ehlo(plan.localName))

        case .ehlo:
            if reply.code == 250 {
                extensions = Self.parseExtensions(reply)
                return afterGreeting()
            }
            // Servers without ESMTP answer 500/502; after STARTTLS, EHLO has to work.
            let afterStartTLS = plan.tls == .startTLS && secured
            if reply.category == 5 && !afterStartTLS {
                state = .helo
                return .send(.helo(plan.localName))
            }
            return fail(.rejected, "refused EHLO", reply)

        case .helo:
            guard reply.code == 250 else { return fail(.rejected, "refused HELO", reply) }
            extensions = [:]
            return afterGreeting()

        case .startTLS:
            guard reply.code == 220 else { return fail(.tlsFailed, "refused STARTTLS", reply) }
            state = .handshaking
            return .startTLS

        case .authenticating(let step):
            return authenticationReply(reply, step: step)

        case .mailFrom:
            guard reply.category == 2 else { return fail(.rejected, "refused MAIL FROM", reply) }
            state = .rcptTo
            return .send(.rcptTo(plan.recipient))

        case .rcptTo:
            guard reply.category == 2 else { return fail(.rejected, "refused RCPT TO", reply) }
            state = .data
            return .send(.data)

        case .data:
            guard reply.code == 354 else { return fail(.rejected, "refused DATA", reply) }
            state = .message
            return .sendMessage

        case .message:
            guard reply.category == 2 else { return fail(.rejected, "refused the message", reply) }
            state = .finished
            return .quit(nil)

        case .idle, .handshaking, .finished:
            return failWithoutReply(.protocolViolation, "SMTP server \(plan.endpoint) sent a reply out of turn")
        }
    }

    // MARK: - Steps

    /// After a successful `EHLO`/`HELO`: STARTTLS, sign in, or begin the transaction.
    private mutating func afterGreeting() -> Action {
        if plan.tls == .startTLS && !secured {
            guard extensions["STARTTLS"] != nil else {
                return failWithoutReply(
                    .tlsFailed,
                    "SMTP server \(plan.endpoint) does not offer STARTTLS, which tls=starttls requires "
                        + "(tls=none sends in plain text, for local test servers only)")
            }
            state = .startTLS
            return .send(.startTLS)
        }
        guard let credentials = plan.credentials else { return beginTransaction() }
        guard secured || plan.tls == .none else {
            return failWithoutReply(
                .authenticationFailed, "refusing to send credentials to SMTP server \(plan.endpoint) without TLS")
        }
        let mechanisms = (extensions["AUTH"] ?? []).map { $0.uppercased() }
        if mechanisms.contains("PLAIN") {
            state = .authenticating(.plain)
            let token = Base64.encode([0] + Array(credentials.username.utf8) + [0] + Array(credentials.password.utf8))
            return .send(.authentication("AUTH PLAIN \(token)"))
        }
        if mechanisms.contains("LOGIN") {
            state = .authenticating(.loginUsername)
            return .send(.authentication("AUTH LOGIN"))
        }
        let offered = mechanisms.isEmpty ? "none" : mechanisms.joined(separator: " ")
        return failWithoutReply(
            .authenticationFailed,
            "SMTP server \(plan.endpoint) offers no AUTH mechanism this client supports (PLAIN, LOGIN); it offers: \(offered)"
        )
    }

    private mutating func authenticationReply(_ reply: SMTPReply, step: AuthStep) -> Action {
        guard let credentials = plan.credentials else { return beginTransaction() }
        switch (step, reply.code) {
        case (.plain, 235), (.loginResult, 235):
            return beginTransaction()
        case (.loginUsername, 334):
            state = .authenticating(.loginPassword)
            return .send(.authentication(Base64.encode(credentials.username)))
        case (.loginPassword, 334):
            state = .authenticating(.loginResult)
            return .send(.authentication(Base64.encode(credentials.password)))
        default:
            return fail(.authenticationFailed, "refused AUTH", reply)
        }
    }

    private mutating func beginTransaction() -> Action {
        state = .mailFrom
        return .send(.mailFrom(plan.sender))
    }

    private mutating func fail(_ kind: MailError.Kind, _ what: String, _ reply: SMTPReply) -> Action {
        state = .finished
        return .quit(
            MailError(
                kind, "SMTP server \(plan.endpoint) \(what) (\(reply.codeDescription))", replyCode: reply.code,
                detail: reply.text))
    }

    private mutating func failWithoutReply(_ kind: MailError.Kind, _ message: String) -> Action {
        state = .finished
        return .quit(MailError(kind, message))
    }

    /// The `EHLO` reply's lines after the first, as keyword → parameters. The obsolete
    /// `AUTH=PLAIN LOGIN` spelling counts as `AUTH`.
    static func parseExtensions(_ reply: SMTPReply) -> [String: [String]] {
        var extensions: [String: [String]] = [:]
        for line in reply.lines.dropFirst() {
            var words = line.split(separator: " ").map(String.init)
            guard !words.isEmpty else { continue }
            var keyword = words.removeFirst().uppercased()
            if keyword.hasPrefix("AUTH=") {
                words.insert(String(keyword.dropFirst(5)), at: 0)
                keyword = "AUTH"
            }
            extensions[keyword, default: []].append(contentsOf: words)
        }
        return extensions
    }
}
