import TrunkCrypto
import XCTest

@testable import Mail

final class SMTPReplyParserTests: XCTestCase {
    func testSingleAndMultiLineReplies() throws {
        var parser = SMTPReplyParser()
        parser.append(
            Array(
                "220 mail.example.com ESMTP ready\r\n250-mail.example.com\r\n250-STARTTLS\r\n250 AUTH PLAIN LOGIN\r\n"
                    .utf8))
        XCTAssertEqual(try parser.next(), SMTPReply(code: 220, lines: ["mail.example.com ESMTP ready"]))
        XCTAssertEqual(
            try parser.next(), SMTPReply(code: 250, lines: ["mail.example.com", "STARTTLS", "AUTH PLAIN LOGIN"]))
        XCTAssertNil(try parser.next())
        XCTAssertFalse(parser.hasBufferedBytes)
    }

    func testRepliesSplitAcrossReadsAndBareLineFeeds() throws {
        var parser = SMTPReplyParser()
        var replies: [SMTPReply] = []
        for byte in Array("250-first\n250 second\r\n354\r\n".utf8) {
            parser.append([byte])
            while let reply = try parser.next() { replies.append(reply) }
        }
        XCTAssertEqual(replies, [SMTPReply(code: 250, lines: ["first", "second"]), SMTPReply(code: 354, lines: [""])])
    }

    func testPartialReplyIsBuffered() throws {
        var parser = SMTPReplyParser()
        parser.append(Array("250-one\r\n250 tw".utf8))
        XCTAssertNil(try parser.next())
        XCTAssertTrue(parser.hasBufferedBytes)
    }

    func testMalformedReplies() {
        let samples = [
            "hello\r\n", "25\r\n", "250x\r\n", "650 nope\r\n", "150 nope\r\n", "250-a\r\n251 b\r\n",
            String(repeating: "x", count: 5000) + "\r\n",
        ]
        for sample in samples {
            var parser = SMTPReplyParser()
            parser.append(Array(sample.utf8))
            XCTAssertThrowsError(try parser.next(), sample.prefix(20).debugDescription) { error in
                XCTAssertTrue(error is SMTPReplyParser.Malformed)
            }
        }
        // Without a line end, too: a server streaming one endless line is cut off.
        var endless = SMTPReplyParser()
        endless.append([UInt8](repeating: UInt8(ascii: "2"), count: 5000))
        XCTAssertThrowsError(try endless.next())
        // And a reply of endless lines.
        var many = SMTPReplyParser()
        many.append(Array(String(repeating: "250-x\r\n", count: 300).utf8))
        XCTAssertThrowsError(try many.next())
    }

    func testEnhancedStatusCode() {
        XCTAssertEqual(SMTPReply(code: 535, lines: ["5.7.8 Authentication failed"]).codeDescription, "535 5.7.8")
        XCTAssertEqual(SMTPReply(code: 550, lines: ["No such user"]).codeDescription, "550")
        XCTAssertEqual(SMTPReply(code: 550, lines: ["5.1 x"]).codeDescription, "550")
        XCTAssertEqual(SMTPReply(code: 250, lines: ["2.0.0"]).codeDescription, "250 2.0.0")
    }
}

final class SMTPDataEncodingTests: XCTestCase {
    func testDotStuffingAndTerminator() {
        func encode(_ text: String) -> String {
            String(decoding: SMTPDataEncoding.encode(Array(text.utf8)), as: UTF8.self)
        }
        XCTAssertEqual(encode(".x\r\nab\r\n.\r\n"), "..x\r\nab\r\n..\r\n.\r\n")
        XCTAssertEqual(encode("a\r\n..b"), "a\r\n...b\r\n.\r\n")
        XCTAssertEqual(encode("a\nb\r.c"), "a\r\nb\r\n..c\r\n.\r\n")
        XCTAssertEqual(encode("a.b\r\n"), "a.b\r\n.\r\n")
    }
}

final class SMTPClientStateMachineTests: XCTestCase {
    private let credentials = SMTPConfiguration.Credentials(username: "mailer", password: "s3cret-pw")

    private func machine(
        tls: SMTPConfiguration.TLSMode, credentials: SMTPConfiguration.Credentials? = nil
    ) -> SMTPClientStateMachine {
        SMTPClientStateMachine(
            plan: .init(
                endpoint: "mail.example.com:587", tls: tls, credentials: credentials, sender: "from@example.com",
                recipient: "to@example.com", localName: "client.example.com"))
    }

    private func reply(_ code: Int, _ lines: String...) -> SMTPReply {
        SMTPReply(code: code, lines: lines.isEmpty ? [""] : lines)
    }

    private func commandLine(_ action: SMTPClientStateMachine.Action) -> String? {
        if case .send(let command) = action { return command.line }
        return nil
    }

    private func error(_ action: SMTPClientStateMachine.Action) -> MailError? {
        if case .quit(let error) = action { return error }
        return nil
    }

    func testStartTLSThenAuthPlainThenDelivery() {
        var machine = machine(tls: .startTLS, credentials: credentials)
        XCTAssertEqual(machine.connected(), .readReply)
        XCTAssertEqual(commandLine(machine.received(reply(220, "ready"))), "EHLO client.example.com")
        XCTAssertEqual(
            commandLine(machine.received(reply(250, "hi", "PIPELINING", "STARTTLS", "8BITMIME"))), "STARTTLS")
        XCTAssertEqual(machine.received(reply(220, "go ahead")), .startTLS)
        XCTAssertEqual(commandLine(machine.tlsEstablished()), "EHLO client.example.com")
        let plain = Base64.encode([0] + Array("mailer".utf8) + [0] + Array("s3cret-pw".utf8))
        XCTAssertEqual(commandLine(machine.received(reply(250, "hi", "AUTH LOGIN PLAIN"))), "AUTH PLAIN \(plain)")
        XCTAssertEqual(commandLine(machine.received(reply(235, "2.7.0 ok"))), "MAIL FROM:<from@example.com>")
        XCTAssertEqual(commandLine(machine.received(reply(250, "ok"))), "RCPT TO:<to@example.com>")
        XCTAssertEqual(commandLine(machine.received(reply(250, "ok"))), "DATA")
        XCTAssertEqual(machine.received(reply(354, "go")), .sendMessage)
        XCTAssertEqual(machine.received(reply(250, "queued")), .quit(nil))
        XCTAssertTrue(machine.secured)
    }

    func testAuthLoginWhenPlainIsNotOffered() {
        var machine = machine(tls: .implicit, credentials: credentials)
        XCTAssertTrue(machine.secured)
        _ = machine.connected()
        _ = machine.received(reply(220))
        XCTAssertEqual(commandLine(machine.received(reply(250, "hi", "AUTH=LOGIN"))), "AUTH LOGIN")
        XCTAssertEqual(commandLine(machine.received(reply(334, "VXNlcm5hbWU6"))), Base64.encode("mailer"))
        XCTAssertEqual(commandLine(machine.received(reply(334, "UGFzc3dvcmQ6"))), Base64.encode("s3cret-pw"))
        XCTAssertEqual(commandLine(machine.received(reply(235))), "MAIL FROM:<from@example.com>")
    }

    func testAuthLoginDoesNotLoopOnAnotherChallenge() {
        var machine = machine(tls: .implicit, credentials: credentials)
        _ = machine.connected()
        _ = machine.received(reply(220))
        _ = machine.received(reply(250, "hi", "AUTH LOGIN"))
        _ = machine.received(reply(334))
        _ = machine.received(reply(334))
        XCTAssertEqual(error(machine.received(reply(334)))?.kind, .authenticationFailed)
    }

    func testRefusedCredentialsGiveAClearErrorWithoutThePassword() throws {
        var machine = machine(tls: .implicit, credentials: credentials)
        _ = machine.connected()
        _ = machine.received(reply(220))
        _ = machine.received(reply(250, "hi", "AUTH PLAIN"))
        let failure = try XCTUnwrap(error(machine.received(reply(535, "5.7.8 Authentication credentials invalid"))))
        XCTAssertEqual(failure.kind, .authenticationFailed)
        XCTAssertEqual(failure.replyCode, 535)
        XCTAssertEqual(failure.description, "SMTP server mail.example.com:587 refused AUTH (535 5.7.8)")
        XCTAssertFalse(failure.debugDescription.contains("s3cret"))
        XCTAssertFalse(failure.debugDescription.contains(Base64.encode("s3cret-pw")))
        XCTAssertFalse(failure.isTransient)
    }

    func testStartTLSIsRequiredWhenConfigured() throws {
        var machine = machine(tls: .startTLS)
        _ = machine.connected()
        _ = machine.received(reply(220))
        let failure = try XCTUnwrap(error(machine.received(reply(250, "hi", "AUTH PLAIN"))))
        XCTAssertEqual(failure.kind, .tlsFailed)
        XCTAssertTrue(failure.description.contains("does not offer STARTTLS"), failure.description)
    }

    func testStartTLSRefusal() throws {
        var machine = machine(tls: .startTLS)
        _ = machine.connected()
        _ = machine.received(reply(220))
        _ = machine.received(reply(250, "hi", "STARTTLS"))
        let failure = try XCTUnwrap(error(machine.received(reply(454, "4.7.0 TLS not available"))))
        XCTAssertEqual(failure.kind, .tlsFailed)
        XCTAssertTrue(failure.isTransient)
        XCTAssertEqual(failure.description, "SMTP server mail.example.com:587 refused STARTTLS (454 4.7.0)")
    }

    func testPlainTextAuthOnlyWithTLSNone() {
        var machine = machine(tls: .none, credentials: credentials)
        _ = machine.connected()
        _ = machine.received(reply(220))
        XCTAssertEqual(
            commandLine(machine.received(reply(250, "hi", "AUTH PLAIN", "STARTTLS")))?.hasPrefix("AUTH PLAIN "), true)
        XCTAssertFalse(machine.secured)
    }

    func testNoSupportedAuthMechanism() throws {
        var machine = machine(tls: .implicit, credentials: credentials)
        _ = machine.connected()
        _ = machine.received(reply(220))
        let failure = try XCTUnwrap(error(machine.received(reply(250, "hi", "AUTH CRAM-MD5 XOAUTH2"))))
        XCTAssertEqual(failure.kind, .authenticationFailed)
        XCTAssertTrue(failure.description.hasSuffix("it offers: CRAM-MD5 XOAUTH2"), failure.description)
        var noAuth = self.machine(tls: .implicit, credentials: credentials)
        _ = noAuth.connected()
        _ = noAuth.received(reply(220))
        XCTAssertTrue(error(noAuth.received(reply(250, "hi")))?.description.hasSuffix("it offers: none") ?? false)
    }

    func testHELOFallbackWhenEHLOIsNotSupported() {
        var machine = machine(tls: .none)
        _ = machine.connected()
        _ = machine.received(reply(220))
        XCTAssertEqual(commandLine(machine.received(reply(502, "command not implemented"))), "HELO client.example.com")
        XCTAssertEqual(commandLine(machine.received(reply(250, "hello"))), "MAIL FROM:<from@example.com>")
    }

    func testNoHELOFallbackAfterStartTLS() {
        var machine = machine(tls: .startTLS)
        _ = machine.connected()
        _ = machine.received(reply(220))
        _ = machine.received(reply(250, "hi", "STARTTLS"))
        _ = machine.received(reply(220))
        _ = machine.tlsEstablished()
        XCTAssertEqual(error(machine.received(reply(502)))?.kind, .rejected)
    }

    func testRefusals() {
        func run(failingAt step: Int, with failure: SMTPReply) -> MailError? {
            var machine = machine(tls: .none)
            var action = machine.connected()
            let script = [reply(220), reply(250, "hi"), reply(250), reply(250), reply(354), reply(250)]
            for (index, answer) in script.enumerated() {
                action = machine.received(index == step ? failure : answer)
                if index == step { break }
            }
            return error(action)
        }
        let cases: [(Int, SMTPReply, String)] = [
            (0, reply(554, "5.7.1 go away"), "refused the connection (554 5.7.1)"),
            (0, reply(421, "busy"), "refused the connection (421)"),
            (1, reply(421, "closing"), "refused EHLO (421)"),
            (2, reply(550, "5.7.1 sender rejected"), "refused MAIL FROM (550 5.7.1)"),
            (3, reply(550, "5.1.1 no such user"), "refused RCPT TO (550 5.1.1)"),
            (3, reply(452, "4.2.2 mailbox full"), "refused RCPT TO (452 4.2.2)"),
            (4, reply(554, "no valid recipients"), "refused DATA (554)"),
            (5, reply(552, "5.3.4 too big"), "refused the message (552 5.3.4)"),
        ]
        for (step, failure, expected) in cases {
            let error = run(failingAt: step, with: failure)
            XCTAssertEqual(error?.kind, .rejected, expected)
            XCTAssertEqual(error?.description, "SMTP server mail.example.com:587 \(expected)")
            XCTAssertEqual(error?.replyCode, failure.code)
            XCTAssertEqual(error?.isTransient, failure.category == 4)
            XCTAssertEqual(error?.detail, failure.text)
        }
    }

    func testReplyOutOfTurnIsAViolation() {
        var machine = machine(tls: .none)
        XCTAssertEqual(error(machine.received(reply(220)))?.kind, .protocolViolation)
    }

    func testExtensionParsing() {
        let extensions = SMTPClientStateMachine.parseExtensions(
            reply(250, "mail.example.com greets you", "SIZE 35882577", "auth plain login", "AUTH=XOAUTH2", "STARTTLS"))
        XCTAssertEqual(extensions["SIZE"], ["35882577"])
        XCTAssertEqual(extensions["AUTH"], ["plain", "login", "XOAUTH2"])
        XCTAssertEqual(extensions["STARTTLS"], [])
        XCTAssertNil(extensions["MAIL.EXAMPLE.COM"])
    }
}
