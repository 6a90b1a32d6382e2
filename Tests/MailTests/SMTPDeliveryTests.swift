import Foundation
import Logging
import TestSupport
import XCTest

@testable import Mail

/// End-to-end delivery against real servers: aiosmtpd (`scripts/smtp-sink.py`) for the
/// protocol paths a real server takes, plain sockets for the ones it will not take.
final class SMTPDeliveryTests: XCTestCase {
    private var sinks: [SMTPSink] = []

    override func tearDown() {
        for sink in sinks { sink.stop() }
        sinks = []
        super.tearDown()
    }

    private func startSink(_ arguments: [String] = []) throws -> SMTPSink {
        let sink = try SMTPSink(arguments)
        sinks.append(sink)
        return sink
    }

    /// A configuration from `url` with test-sized timeouts.
    private func configuration(
        _ url: String, connectTimeout: Duration = .seconds(5), commandTimeout: Duration = .seconds(10)
    ) throws -> SMTPConfiguration {
        var configuration = try SMTPConfiguration(url: url)
        configuration.connectTimeout = connectTimeout
        configuration.commandTimeout = commandTimeout
        return configuration
    }

    private func send(_ message: MailMessage, _ configuration: SMTPConfiguration) async throws {
        let mailer = try SMTPMailer(configuration: configuration, logger: TestDatabase.quietLogger)
        try await withTimeout(30, "send") { try await mailer.send(message) }
    }

    /// The `MailError` `body` throws.
    private func mailError(_ body: () async throws -> Void) async -> MailError? {
        do {
            try await body()
            XCTFail("expected a MailError")
            return nil
        } catch let error as MailError {
            return error
        } catch {
            XCTFail("expected a MailError, got \(error)")
            return nil
        }
    }

    private static let codeMessage = MailMessage.signInCode(
        code: "482913", to: "zoe@example.com", from: "no-reply@trunk.test", expiresInMinutes: 10)

    // MARK: - Plain text

    func testPlainDeliveryRoundTripsHeadersUTF8AndDotStuffing() async throws {
        let sink = try startSink()
        let body =
            "Hallo Zoë,\n.\n.leading dot\n..two dots\nlast line with ünïcödé ✓ and a long tail "
            + String(repeating: "é", count: 100) + "\r\nwindows line\rold mac line\n"
        let message = MailMessage(
            from: "Trunk Sync <no-reply@trunk.test>", to: "Zoë Ñandú <zoe@example.com>",
            subject: "Grüße aus Köln — dein Code ✓", textBody: body)
        try await send(message, try configuration("smtp://127.0.0.1:\(sink.port)?tls=none"))

        let received = try sink.received()
        XCTAssertEqual(received.count, 1)
        let mail = try XCTUnwrap(received.first)
        XCTAssertEqual(mail.mailFrom, "no-reply@trunk.test")
        XCTAssertEqual(mail.recipients, ["zoe@example.com"])
        XCTAssertFalse(mail.tls)
        XCTAssertNil(mail.auth)
        XCTAssertFalse(mail.helo?.isEmpty ?? true)
        // Decoded by Python's email package: an independent reader of our MIME.
        XCTAssertEqual(mail.defects, [])
        XCTAssertNil(mail.parsed["error"])
        XCTAssertEqual(mail.subject, "Grüße aus Köln — dein Code ✓")
        XCTAssertEqual(mail.parsed["from"] as? String, "Trunk Sync <no-reply@trunk.test>")
        XCTAssertEqual(mail.parsed["to"] as? String, "Zoë Ñandú <zoe@example.com>")
        XCTAssertEqual(mail.parsed["content_type"] as? String, "text/plain")
        XCTAssertEqual(mail.parsed["charset"] as? String, "utf-8")
        XCTAssertEqual(
            mail.body,
            "Hallo Zoë,\n.\n.leading dot\n..two dots\nlast line with ünïcödé ✓ and a long tail "
                + String(repeating: "é", count: 100) + "\nwindows line\nold mac line\n")
        // The raw message: ASCII only, CRLF lines within limits, the expected headers.
        XCTAssertTrue(mail.raw.allSatisfy { $0 < 0x80 })
        let text = String(decoding: mail.raw, as: UTF8.self)
        for line in text.components(separatedBy: "\r\n") {
            XCTAssertLessThanOrEqual(line.utf8.count, 998)
            XCTAssertFalse(line.contains("\r") || line.contains("\n"))
        }
        XCTAssertEqual(mail.rawHeader("MIME-Version"), "1.0")
        XCTAssertEqual(mail.rawHeader("Content-Type"), "text/plain; charset=utf-8")
        XCTAssertEqual(mail.rawHeader("Content-Transfer-Encoding"), "quoted-printable")
        XCTAssertTrue(mail.rawHeader("Subject")?.hasPrefix("=?UTF-8?B?") ?? false)
        let messageID = try XCTUnwrap(mail.rawHeader("Message-ID"))
        XCTAssertNotNil(messageID.range(of: "^<[0-9a-f]{32}@trunk\\.test>$", options: .regularExpression), messageID)
        let date = try XCTUnwrap(mail.rawHeader("Date"))
        XCTAssertNotNil(
            date.range(
                of: "^[A-Z][a-z]{2}, [0-9]{2} [A-Z][a-z]{2} [0-9]{4} [0-9:]{8} \\+0000$", options: .regularExpression),
            date)
    }

    func testASCIISignInMailGoesOutAs7bit() async throws {
        let sink = try startSink()
        try await send(Self.codeMessage, try configuration("smtp://127.0.0.1:\(sink.port)?tls=none"))
        let mail = try XCTUnwrap(try sink.received().first)
        XCTAssertEqual(mail.rawHeader("Content-Transfer-Encoding"), "7bit")
        XCTAssertEqual(mail.rawHeader("Subject"), "Your sign-in code: 482913")
        XCTAssertEqual(mail.body, Self.codeMessage.textBody)
        XCTAssertEqual(mail.defects, [])
    }

    func testSeveralMessagesInARow() async throws {
        let sink = try startSink()
        let mailer = try SMTPMailer(
            configuration: try configuration("smtp://127.0.0.1:\(sink.port)?tls=none"), logger: TestDatabase.quietLogger
        )
        try await withTimeout(30, "sends") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<5 {
                    group.addTask {
                        try await mailer.send(
                            MailMessage(
                                from: "a@trunk.test", to: "user\(index)@example.com", subject: "n\(index)",
                                textBody: "x"))
                    }
                }
                try await group.waitForAll()
            }
        }
        XCTAssertEqual(Set(try sink.received().flatMap(\.recipients)), Set((0..<5).map { "user\($0)@example.com" }))
    }

    // MARK: - TLS

    func testStartTLSWithAnUntrustedCertificateIsRefusedClearly() async throws {
        let sink = try startSink(try SharedCertificate.get().sinkArguments + ["--require-starttls"])
        let error = await mailError {
            try await self.send(Self.codeMessage, try self.configuration("smtp://localhost:\(sink.port)"))
        }
        XCTAssertEqual(error?.kind, .certificateRejected)
        let description = error?.description ?? ""
        XCTAssertTrue(description.contains("localhost:\(sink.port)"), description)
        XCTAssertTrue(description.contains("certificate was rejected: self"), description)
        XCTAssertTrue(description.contains("verify=false"), description)
        XCTAssertEqual(try sink.received().count, 0)
    }

    func testStartTLSWithVerificationOffDelivers() async throws {
        let sink = try startSink(try SharedCertificate.get().sinkArguments + ["--require-starttls"])
        try await send(Self.codeMessage, try configuration("smtp://localhost:\(sink.port)?verify=false"))
        let mail = try XCTUnwrap(try sink.received().first)
        XCTAssertTrue(mail.tls)
        XCTAssertEqual(mail.subject, "Your sign-in code: 482913")
    }

    func testTrustedCAStillChecksTheHostName() async throws {
        let certificate = try SharedCertificate.get()
        let sink = try startSink(certificate.sinkArguments + ["--require-starttls"])
        let caFile = certificate.certificatePath
        // The certificate names localhost: trusted and matching.
        try await send(Self.codeMessage, try configuration("smtp://localhost:\(sink.port)?ca_file=\(caFile)"))
        XCTAssertEqual(try sink.received().count, 1)
        // The same server reached by IP address: the certificate does not name it.
        let error = await mailError {
            try await self.send(
                Self.codeMessage, try self.configuration("smtp://127.0.0.1:\(sink.port)?ca_file=\(caFile)"))
        }
        XCTAssertEqual(error?.kind, .certificateRejected)
        XCTAssertTrue(error?.description.contains("IP address mismatch") ?? false, error?.description ?? "")
        XCTAssertEqual(try sink.received().count, 1)
    }

    func testImplicitTLS() async throws {
        let certificate = try SharedCertificate.get()
        let sink = try startSink(certificate.sinkArguments + ["--implicit-tls"])
        let refused = await mailError {
            try await self.send(Self.codeMessage, try self.configuration("smtps://localhost:\(sink.port)"))
        }
        XCTAssertEqual(refused?.kind, .certificateRejected)
        try await send(Self.codeMessage, try configuration("smtps://localhost:\(sink.port)?verify=false"))
        try await send(
            Self.codeMessage,
            try configuration("smtp://localhost:\(sink.port)?tls=tls&ca_file=\(certificate.certificatePath)"))
        let received = try sink.received()
        XCTAssertEqual(received.count, 2)
        XCTAssertTrue(received.allSatisfy(\.tls))
    }

    func testStartTLSRequiredButNotOffered() async throws {
        let sink = try startSink()
        let error = await mailError {
            try await self.send(Self.codeMessage, try self.configuration("smtp://127.0.0.1:\(sink.port)"))
        }
        XCTAssertEqual(error?.kind, .tlsFailed)
        XCTAssertEqual(
            error?.description,
            "SMTP server 127.0.0.1:\(sink.port) does not offer STARTTLS, which tls=starttls requires "
                + "(tls=none sends in plain text, for local test servers only)")
        XCTAssertEqual(try sink.received().count, 0)
    }

    func testImplicitTLSAgainstAPlainServerFailsQuickly() async throws {
        let sink = try startSink()
        let started = ContinuousClock.now
        let error = await mailError {
            try await self.send(
                Self.codeMessage, try self.configuration("smtps://127.0.0.1:\(sink.port)", commandTimeout: .seconds(3)))
        }
        XCTAssertEqual(error?.kind, .tlsFailed, error?.debugDescription ?? "")
        XCTAssertLessThan(ContinuousClock.now - started, .seconds(3))
    }

    // MARK: - AUTH

    func testAuthPlainOverStartTLS() async throws {
        let sink = try startSink(
            try SharedCertificate.get().sinkArguments + ["--auth", "mailer:p@ss:wörd", "--auth-mechanisms", "PLAIN"])
        try await send(
            Self.codeMessage, try configuration("smtp://mailer:p%40ss%3Aw%C3%B6rd@localhost:\(sink.port)?verify=false"))
        let mail = try XCTUnwrap(try sink.received().first)
        XCTAssertEqual(mail.auth, ["PLAIN", "mailer"])
        XCTAssertTrue(mail.tls)
    }

    func testAuthLoginWhenOnlyLoginIsOffered() async throws {
        let sink = try startSink(
            try SharedCertificate.get().sinkArguments + ["--auth", "mailer:s3cret", "--auth-mechanisms", "LOGIN"])
        try await send(Self.codeMessage, try configuration("smtp://mailer:s3cret@localhost:\(sink.port)?verify=false"))
        XCTAssertEqual(try sink.received().first?.auth, ["LOGIN", "mailer"])
    }

    func testAuthOverImplicitTLS() async throws {
        let sink = try startSink(
            try SharedCertificate.get().sinkArguments + ["--implicit-tls", "--auth", "mailer:s3cret"])
        try await send(Self.codeMessage, try configuration("smtps://mailer:s3cret@localhost:\(sink.port)?verify=false"))
        XCTAssertEqual(try sink.received().first?.auth, ["PLAIN", "mailer"])
    }

    func testWrongPasswordIsAClearErrorWithoutThePassword() async throws {
        for mechanism in ["PLAIN", "LOGIN"] {
            let sink = try startSink(
                try SharedCertificate.get().sinkArguments + ["--auth", "mailer:right", "--auth-mechanisms", mechanism])
            let error = await mailError {
                try await self.send(
                    Self.codeMessage,
                    try self.configuration("smtp://mailer:Wr0ngPa55@localhost:\(sink.port)?verify=false"))
            }
            XCTAssertEqual(error?.kind, .authenticationFailed, mechanism)
            XCTAssertEqual(error?.replyCode, 535)
            XCTAssertEqual(error?.description, "SMTP server localhost:\(sink.port) refused AUTH (535 5.7.8)")
            for text in [error?.description ?? "", error?.debugDescription ?? "", "\(String(describing: error))"] {
                XCTAssertFalse(text.contains("Wr0ngPa55"), text)
                XCTAssertFalse(text.contains("482913"), text)
            }
            XCTAssertEqual(try sink.received().count, 0)
        }
    }

    func testCredentialsInPlainTextOnlyWithTLSNone() async throws {
        let sink = try startSink(["--auth", "mailer:s3cret", "--auth-plaintext"])
        try await send(Self.codeMessage, try configuration("smtp://mailer:s3cret@127.0.0.1:\(sink.port)?tls=none"))
        XCTAssertEqual(try sink.received().first?.auth, ["PLAIN", "mailer"])
    }

    func testAuthRequiredButNoCredentialsConfigured() async throws {
        let sink = try startSink(["--auth", "mailer:s3cret", "--auth-plaintext"])
        let error = await mailError {
            try await self.send(Self.codeMessage, try self.configuration("smtp://127.0.0.1:\(sink.port)?tls=none"))
        }
        XCTAssertEqual(error?.kind, .rejected)
        XCTAssertEqual(error?.replyCode, 530)
        XCTAssertTrue(error?.description.contains("refused MAIL FROM (530") ?? false, error?.description ?? "")
    }

    // MARK: - Failures of the connection

    func testConnectionRefusedIsQuickAndClear() async throws {
        let port = try unusedPort()
        let started = ContinuousClock.now
        let error = await mailError {
            try await self.send(Self.codeMessage, try self.configuration("smtp://127.0.0.1:\(port)?tls=none"))
        }
        XCTAssertEqual(error?.kind, .connectionFailed)
        XCTAssertEqual(error?.description, "cannot connect to SMTP server 127.0.0.1:\(port): Connection refused")
        XCTAssertEqual(error?.isTransient, true)
        XCTAssertLessThan(ContinuousClock.now - started, .seconds(2))
    }

    func testUnresolvableHost() async throws {
        let error = await mailError {
            try await self.send(Self.codeMessage, try self.configuration("smtp://no-such-host.invalid:25?tls=none"))
        }
        XCTAssertEqual(error?.kind, .connectionFailed)
        XCTAssertTrue(
            error?.description.hasPrefix("cannot resolve SMTP server no-such-host.invalid:25: ") ?? false,
            error?.description ?? "")
    }

    func testServerThatNeverAnswersTimesOut() async throws {
        let server = try SilentServer()
        let started = ContinuousClock.now
        let error = await mailError {
            try await self.send(
                Self.codeMessage,
                try self.configuration("smtp://127.0.0.1:\(server.port)?tls=none", commandTimeout: .milliseconds(500)))
        }
        XCTAssertEqual(error?.kind, .timedOut)
        XCTAssertEqual(
            error?.description, "SMTP server 127.0.0.1:\(server.port) timed out waiting for the greeting (after 0.5 s)")
        let elapsed = ContinuousClock.now - started
        XCTAssertGreaterThanOrEqual(elapsed, .milliseconds(450))
        XCTAssertLessThan(elapsed, .seconds(3))
    }

    func testTLSHandshakeWithASilentServerTimesOut() async throws {
        let server = try SilentServer()
        let error = await mailError {
            try await self.send(
                Self.codeMessage,
                try self.configuration("smtps://127.0.0.1:\(server.port)", commandTimeout: .milliseconds(300)))
        }
        XCTAssertEqual(error?.kind, .timedOut)
        XCTAssertTrue(error?.description.contains("during the TLS handshake") ?? false, error?.description ?? "")
    }

    func testSessionsNeverBlockTheCooperativePool() async throws {
        let server = try SilentServer()
        let timeout = Duration.seconds(3)
        let mailer = try SMTPMailer(
            configuration: try configuration("smtp://127.0.0.1:\(server.port)?tls=none", commandTimeout: timeout),
            logger: TestDatabase.quietLogger, maximumConnections: 4)
        let started = ContinuousClock.now
        // Four sessions wait for a greeting until they time out; if they held cooperative
        // threads (2 on this machine), the task below could not run until they gave up. The
        // bounds are fractions of the timeout, not absolute figures, so a loaded machine's
        // scheduling delays (hundreds of ms) do not break them.
        let message = Self.codeMessage
        let sends = Task { await sendConcurrently(message, 4, through: mailer) }
        try await Task.sleep(for: .milliseconds(100))
        let ranAfter = await Task.detached { ContinuousClock.now - started }.value
        XCTAssertLessThan(ranAfter, timeout * 2 / 3, "a task waited for the SMTP sessions")
        let kinds = await sends.value
        XCTAssertEqual(kinds, [MailError.Kind?](repeating: .timedOut, count: 4))
        // Four sessions in parallel: about one timeout, not four (nor two, as two threads would give).
        XCTAssertLessThan(ContinuousClock.now - started, timeout * 2 - .milliseconds(500))
    }

    func testAFullQueueRefusesAtOnce() async throws {
        let server = try SilentServer()
        let mailer = try SMTPMailer(
            configuration: try configuration("smtp://127.0.0.1:\(server.port)?tls=none", commandTimeout: .seconds(1)),
            logger: TestDatabase.quietLogger, maximumConnections: 1, queueLimit: 1)
        let started = ContinuousClock.now
        let kinds = await withTaskGroup(of: (MailError.Kind?, Duration).self) { group in
            for _ in 0..<3 {
                group.addTask {
                    do {
                        try await mailer.send(Self.codeMessage)
                        return (nil, ContinuousClock.now - started)
                    } catch {
                        return ((error as? MailError)?.kind, ContinuousClock.now - started)
                    }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        let overloaded = kinds.filter { $0.0 == .overloaded }
        XCTAssertEqual(overloaded.count, 1, "\(kinds)")
        let timedOut = kinds.filter { $0.0 == .timedOut }
        XCTAssertEqual(timedOut.count, 2, "\(kinds)")
        // At once: refused before the first session's timeout ended (an ordering, which load
        // cannot upset, rather than a figure in milliseconds).
        XCTAssertLessThan(
            overloaded.first?.1 ?? .seconds(99), timedOut.map(\.1).min() ?? .zero, "\(kinds)")
    }

    func testInvalidMessageFailsBeforeConnecting() async throws {
        // Nothing listens on the port: had the mailer tried to connect, the error would be
        // .connectionFailed, so .invalidMessage shows the check came first (no timing needed).
        let port = try unusedPort()
        var message = Self.codeMessage
        message.to = "zoë@example.com"
        let error = await mailError {
            try await self.send(message, try self.configuration("smtp://127.0.0.1:\(port)?tls=none"))
        }
        XCTAssertEqual(error?.kind, .invalidMessage)
    }

    // MARK: - Scripted servers

    func testHELOFallbackWithAServerWithoutESMTP() async throws {
        let server = try ScriptedServer([
            .send("220 old.example.com SMTP\r\n"),
            .expect("EHLO "), .send("502 5.5.1 command not implemented\r\n"),
            .expect("HELO "), .send("250 old.example.com\r\n"),
            .expect("MAIL FROM:<no-reply@trunk.test>"), .send("250 ok\r\n"),
            .expect("RCPT TO:<zoe@example.com>"), .send("250 ok\r\n"),
            .expect("DATA"), .send("354 go ahead\r\n"),
            .readData, .send("250 queued\r\n"),
            .expect("QUIT"), .send("221 bye\r\n"),
        ])
        var message = Self.codeMessage
        message.textBody = ".\n.hidden\nvisible\n"
        try await send(message, try configuration("smtp://127.0.0.1:\(server.port)?tls=none"))
        let transcript = server.transcript()
        XCTAssertEqual(transcript.count, 6, "\(transcript)")
        XCTAssertEqual(transcript.last, "QUIT")
        // On the wire, lines starting with a dot carry an extra one.
        XCTAssertTrue(server.data.hasSuffix("\n..\n..hidden\nvisible"), server.data)
    }

    func testDataInjectedBeforeTheTLSHandshakeIsRefused() async throws {
        let server = try ScriptedServer([
            .send("220 mail.example.com ESMTP\r\n"),
            .expect("EHLO "), .send("250-mail.example.com\r\n250 STARTTLS\r\n"),
            .expect("STARTTLS"), .send("220 go ahead\r\n250-injected\r\n"),
            .expect("QUIT"),
        ])
        let error = await mailError {
            try await self.send(
                Self.codeMessage, try self.configuration("smtp://127.0.0.1:\(server.port)?verify=false"))
        }
        XCTAssertEqual(error?.kind, .protocolViolation)
        XCTAssertTrue(error?.description.contains("after its STARTTLS reply") ?? false, error?.description ?? "")
    }

    func testMalformedGreeting() async throws {
        let server = try ScriptedServer([.send("hello there\r\n"), .expect("QUIT")])
        let error = await mailError {
            try await self.send(Self.codeMessage, try self.configuration("smtp://127.0.0.1:\(server.port)?tls=none"))
        }
        XCTAssertEqual(error?.kind, .protocolViolation)
        XCTAssertEqual(
            error?.description,
            "SMTP server 127.0.0.1:\(server.port) sent a malformed reply: a reply does not start with a three-digit code"
        )
    }

    func testServerClosingMidSession() async throws {
        let server = try ScriptedServer([.send("220 ready\r\n"), .expect("EHLO "), .close])
        let error = await mailError {
            try await self.send(Self.codeMessage, try self.configuration("smtp://127.0.0.1:\(server.port)?tls=none"))
        }
        XCTAssertEqual(error?.kind, .connectionClosed)
        XCTAssertEqual(
            error?.description,
            "SMTP server 127.0.0.1:\(server.port) closed the connection waiting for the reply to EHLO")
    }

    func testBadCAFileIsAConfigurationError() throws {
        XCTAssertThrowsError(
            try SMTPMailer(
                configuration: try configuration("smtps://localhost?ca_file=/nonexistent/ca.pem"),
                logger: TestDatabase.quietLogger)
        ) { error in
            XCTAssertEqual((error as? MailError)?.kind, .invalidConfiguration)
            XCTAssertTrue("\(error)".hasPrefix("TRUNK_SYNC_SMTP_URL is invalid: ca_file cannot be loaded"), "\(error)")
        }
    }
}

/// One self-signed certificate for all the tests of a run.
enum SharedCertificate {
    private static let lock = NSLock()
    nonisolated(unsafe) private static var cached: TestCertificate?

    static func get() throws -> TestCertificate {
        try lock.withLock {
            if let cached { return cached }
            let certificate = try TestCertificate.make()
            cached = certificate
            return certificate
        }
    }
}

/// Sends `message` `count` times at once; the kind of error each ended with (nil: delivered).
private func sendConcurrently(_ message: MailMessage, _ count: Int, through mailer: SMTPMailer) async -> [MailError
    .Kind?]
{
    await withTaskGroup(of: MailError.Kind?.self) { group in
        for _ in 0..<count {
            group.addTask {
                do {
                    try await mailer.send(message)
                    return nil
                } catch {
                    return (error as? MailError)?.kind
                }
            }
        }
        return await group.reduce(into: []) { $0.append($1) }
    }
}
