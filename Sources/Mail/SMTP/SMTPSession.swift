import Glibc
import Logging

/// Carries out one SMTP session on the calling thread (which blocks): connects, then
/// executes the actions of an `SMTPClientStateMachine` until the message is accepted or
/// refused. Used only from `SMTPMailer`'s own threads.
struct SMTPSession {
    let configuration: SMTPConfiguration
    let tlsContext: TLSClientContext?
    let logger: Logger

    /// Delivers `message`, returning once the server accepted it.
    /// - Throws: `MailError`.
    func deliver(_ message: MIMEMessage) throws {
        let endpoint = configuration.endpoint
        let connection = try TCPConnection.connect(
            host: configuration.host, port: configuration.port, timeout: configuration.connectTimeout,
            endpoint: endpoint)
        let stream = SMTPStream(connection: connection)
        defer { stream.close() }

        if configuration.tls == .implicit {
            try startTLS(stream, deadline: .after(configuration.commandTimeout))
        }
        var machine = SMTPClientStateMachine(
            plan: .init(
                endpoint: endpoint, tls: configuration.tls, credentials: configuration.credentials,
                sender: message.sender.address, recipient: message.recipient.address,
                localName: Self.localName(stream)))
        var parser = SMTPReplyParser()
        var action = machine.connected()
        while true {
            switch action {
            case .readReply:
                let reply = try readReply(stream, &parser, deadline: .after(configuration.commandTimeout), after: nil)
                action = machine.received(reply)

            case .send(let command):
                let deadline = Deadline.after(configuration.commandTimeout)
                try write(Array((command.line + "\r\n").utf8), to: stream, deadline: deadline, during: command.verb)
                let reply = try readReply(stream, &parser, deadline: deadline, after: command.verb)
                logger.trace("SMTP reply", metadata: ["command": "\(command.verb)", "code": "\(reply.code)"])
                action = machine.received(reply)

            case .startTLS:
                // Bytes that arrived with the STARTTLS reply were sent before encryption and
                // would be taken as encrypted replies (the CVE-2011-0411 injection).
                guard !parser.hasBufferedBytes else {
                    throw MailError(
                        .protocolViolation, "SMTP server \(endpoint) sent data after its STARTTLS reply, before TLS")
                }
                try startTLS(stream, deadline: .after(configuration.commandTimeout))
                action = machine.tlsEstablished()

            case .sendMessage:
                let deadline = Deadline.after(configuration.commandTimeout)
                try write(SMTPDataEncoding.encode(message.data), to: stream, deadline: deadline, during: "the message")
                let reply = try readReply(stream, &parser, deadline: deadline, after: "the message")
                action = machine.received(reply)

            case .quit(let error):
                quit(stream, &parser)
                if let error { throw error }
                logger.debug("SMTP server accepted the message", metadata: ["smtp.server": "\(endpoint)"])
                return
            }
        }
    }

    // MARK: - Steps

    private func startTLS(_ stream: SMTPStream, deadline: Deadline) throws {
        let endpoint = configuration.endpoint
        guard let tlsContext else {
            throw MailError(.tlsFailed, "no TLS context for SMTP server \(endpoint)")
        }
        do {
            try stream.startTLS(context: tlsContext, host: configuration.host, deadline: deadline)
        } catch .certificate(let reason) {
            throw MailError(
                .certificateRejected,
                "TLS handshake with SMTP server \(endpoint) failed: its certificate was rejected: \(reason) "
                    + "(ca_file= trusts a private CA; verify=false turns checks off, for test servers only)")
        } catch .tls(let reason) {
            throw MailError(.tlsFailed, "TLS handshake with SMTP server \(endpoint) failed: \(reason)")
        } catch .socket(let failure) {
            throw error(failure, during: "during the TLS handshake")
        }
    }

    /// Sends `QUIT` and waits briefly for its reply; a failure here changes nothing.
    private func quit(_ stream: SMTPStream, _ parser: inout SMTPReplyParser) {
        let deadline = Deadline.after(min(configuration.commandTimeout, .seconds(5)))
        do {
            try stream.write(Array("QUIT\r\n".utf8), deadline: deadline)
            while try parser.next() == nil { parser.append(try stream.read(deadline: deadline)) }
        } catch {}
        stream.shutdownTLS(deadline: deadline)
    }

    private func write(_ bytes: [UInt8], to stream: SMTPStream, deadline: Deadline, during what: String) throws {
        do {
            try stream.write(bytes, deadline: deadline)
        } catch {
            throw self.error(error, during: "sending \(what)")
        }
    }

    /// Reads until a complete reply is parsed.
    /// - Parameter command: the command being answered, for errors (`nil`: the greeting).
    private func readReply(
        _ stream: SMTPStream, _ parser: inout SMTPReplyParser, deadline: Deadline, after command: String?
    ) throws -> SMTPReply {
        let waitingFor = command.map { "the reply to \($0)" } ?? "the greeting"
        while true {
            do {
                if let reply = try parser.next() { return reply }
            } catch let malformed as SMTPReplyParser.Malformed {
                throw MailError(
                    .protocolViolation,
                    "SMTP server \(configuration.endpoint) sent a malformed reply: \(malformed.reason)")
            }
            do {
                parser.append(try stream.read(deadline: deadline))
            } catch {
                throw self.error(error, during: "waiting for \(waitingFor)")
            }
        }
    }

    private func error(_ failure: SMTPStream.Failure, during what: String) -> MailError {
        switch failure {
        case .socket(let socketFailure): return error(socketFailure, during: what)
        case .tls(let reason):
            return MailError(.tlsFailed, "TLS error with SMTP server \(configuration.endpoint) \(what): \(reason)")
        case .certificate(let reason):
            return MailError(
                .certificateRejected, "SMTP server \(configuration.endpoint) certificate rejected: \(reason)")
        }
    }

    private func error(_ failure: SocketFailure, during what: String) -> MailError {
        let endpoint = configuration.endpoint
        switch failure {
        case .timedOut:
            return MailError(
                .timedOut,
                "SMTP server \(endpoint) timed out \(what) (after \(TCPConnection.seconds(configuration.commandTimeout)))"
            )
        case .closed:
            return MailError(.connectionClosed, "SMTP server \(endpoint) closed the connection \(what)")
        case .system:
            return MailError(
                .connectionClosed, "connection to SMTP server \(endpoint) failed \(what): \(failure.reason)")
        }
    }

    /// What `EHLO` announces: the machine's host name when it is fully qualified, else the
    /// connection's local address as a literal (`[192.0.2.1]`), which RFC 5321 §4.1.4 allows.
    static func localName(_ stream: SMTPStream) -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        if gethostname(&buffer, buffer.count - 1) == 0 {
            let name = String(nulTerminated: buffer)
            let labels = name.split(separator: ".", omittingEmptySubsequences: false)
            let valid =
                labels.count >= 2
                && labels.allSatisfy { label in
                    !label.isEmpty && label.utf8.count <= 63
                        && label.unicodeScalars.allSatisfy { CharacterSetASCII.isAlphanumeric($0) || $0 == "-" }
                }
            if valid { return name }
        }
        return stream.localAddressLiteral() ?? "[127.0.0.1]"
    }
}
