import Foundation
import Logging
import Mail
import XCTest

final class LogMailerTests: XCTestCase {
    func testSignInCodeIsLoggedAsItsSummaryAtNotice() async throws {
        let records = RecordedLogs()
        let mailer = LogMailer(logger: records.logger())
        try await mailer.send(
            .signInCode(code: "123456", to: "a@example.com", from: "no-reply@localhost", expiresInMinutes: 10))
        XCTAssertEqual(records.entries.map(\.message), ["sign-in code for a@example.com: 123456"])
        XCTAssertEqual(records.entries.map(\.level), [.notice])
    }

    func testOtherMessagesLogSubjectAndBody() async throws {
        let records = RecordedLogs()
        let mailer = LogMailer(logger: records.logger())
        try await mailer.send(
            MailMessage(from: "a@example.com", to: "b@example.com", subject: "Hello", textBody: "Body"))
        XCTAssertEqual(records.entries.map(\.message), ["mail to b@example.com: Hello"])
        XCTAssertEqual(records.entries.first?.metadata["body"], "Body")
    }
}

/// Collects log records in memory.
final class RecordedLogs: @unchecked Sendable {
    struct Entry {
        let level: Logger.Level
        let message: String
        let metadata: Logger.Metadata
    }

    private let lock = NSLock()
    private var stored: [Entry] = []

    var entries: [Entry] { lock.withLock { stored } }

    func append(_ entry: Entry) { lock.withLock { stored.append(entry) } }

    func logger() -> Logger {
        Logger(label: "test") { _ in Handler(records: self) }
    }

    struct Handler: LogHandler {
        let records: RecordedLogs
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            records.append(
                Entry(
                    level: event.level, message: "\(event.message)",
                    metadata: metadata.merging(event.metadata ?? [:]) { $1 }))
        }
    }
}
