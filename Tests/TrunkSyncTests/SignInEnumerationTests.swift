import Foundation
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// `/otp` must not tell an address with an account from one without: same answer, same
/// work on the request path, same time, whatever the mailer does.
final class SignInEnumerationTests: XCTestCase {
    var app: AppHarness!

    override func setUp() async throws { app = try await AppHarness() }
    override func tearDown() async throws { await app.stop() }

    /// The headers that may differ between two answers: the request id and the date.
    func comparableHeaders(_ response: AppHarness.Response) -> [String: String] {
        response.headers.filter { !["x-request-id", "date"].contains($0.key) }
    }

    func otp(_ email: String, createUser: Bool?) async throws -> AppHarness.Response {
        var body: [String: Any] = ["email": email]
        if let createUser { body["create_user"] = createUser }
        return try await app.request("POST", "/auth/v1/otp", json: body)
    }

    func testKnownAndUnknownAddressesGetTheSameAnswerFromTheSameStatements() async throws {
        for index in 0..<2 { _ = try await app.token("known\(index)@example.com") }
        let cases: [(String, Bool?)] = [
            ("known0@example.com", false), ("nobody@example.com", false), ("known1@example.com", nil),
            ("newcomer@example.com", true),
        ]
        var answers: [AppHarness.Response] = []
        var work: [[String]] = []
        for (email, createUser) in cases {
            var response: AppHarness.Response?
            work.append(try await app.statements.during { response = try await otp(email, createUser: createUser) })
            answers.append(try XCTUnwrap(response))
        }
        for (index, answer) in answers.enumerated() {
            XCTAssertEqual(answer.status, 200, "\(cases[index])")
            XCTAssertEqual(answer.body, answers[0].body, "\(cases[index])")
            XCTAssertEqual(comparableHeaders(answer), comparableHeaders(answers[0]), "\(cases[index])")
            XCTAssertEqual(work[index], work[0], "\(cases[index]) ran other statements")
        }
        XCTAssertGreaterThan(work[0].count, 3, "\(work[0])")
        // Only the addresses with an account, or asking for one, get a mail.
        _ = try await app.sender.code(for: "known0@example.com")
        _ = try await app.sender.code(for: "known1@example.com")
        _ = try await app.sender.code(for: "newcomer@example.com")
        XCTAssertEqual(app.sender.count(for: "nobody@example.com"), 0)

        // Asking again within the resend interval: the same 429 for all.
        var again: [AppHarness.Response] = []
        for (email, createUser) in cases { again.append(try await otp(email, createUser: createUser)) }
        for answer in again {
            XCTAssertEqual(answer.status, 429)
            XCTAssertEqual(answer.json["code"] as? String, "over_email_send_rate_limit")
            XCTAssertEqual(Set(comparableHeaders(answer).keys), Set(comparableHeaders(again[0]).keys))
        }
    }

    func testASlowMailServerDoesNotSlowTheAnswerForKnownAddresses() async throws {
        // The mail server does not answer until the end of the test. Before mail left the
        // request path, an address with an account answered only once its mail was sent; now
        // it must answer like an unknown one. A mail server that never answers (rather than
        // one 300 ms slow) lets the bounds below be generous enough for a loaded 2-core
        // machine while the failure they catch stays far beyond them.
        let rounds = 8
        for index in 0..<rounds { _ = try await app.token("slow\(index)@example.com") }
        let sender = app.sender
        sender.hold()
        let sentBefore = sender.total
        // Were a request to wait for its mail, it ends after 30 s and fails the bounds (no hang).
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30))
            sender.release()
        }
        defer { watchdog.cancel() }
        var known: [Double] = []
        var unknown: [Double] = []
        for index in 0..<rounds {
            for (email, into) in [("slow\(index)@example.com", 0), ("ghost\(index)@example.com", 1)] {
                let started = ContinuousClock.now
                let response = try await otp(email, createUser: false)
                let elapsed = started.duration(to: .now)
                XCTAssertEqual(response.status, 200)
                let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                if into == 0 { known.append(seconds) } else { unknown.append(seconds) }
            }
        }
        func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
        XCTAssertLessThan(abs(median(known) - median(unknown)), 1, "known \(known), unknown \(unknown)")
        XCTAssertLessThan(median(known), 2, "\(known)")
        let sentMeanwhile = sender.total - sentBefore
        XCTAssertEqual(sentMeanwhile, 0, "the answers came while every mail was still held")
        sender.release()
        // Released, every held mail goes out.
        for index in 0..<rounds { _ = try await sender.code(for: "slow\(index)@example.com") }
    }

    func testAFullMailQueueDropsMailsButAnswersTheSame() async throws {
        await app.stop()
        app = try await AppHarness(environment: ["TRUNK_SYNC_MAIL_SENDERS": "1", "TRUNK_SYNC_MAIL_QUEUE_SIZE": "1"])
        app.sender.hold()  // the one sender is stuck on the first mail
        var answers: [AppHarness.Response] = []
        for index in 0..<5 { answers.append(try await otp("full\(index)@example.com", createUser: true)) }
        for answer in answers {
            XCTAssertEqual(answer.status, 200)
            XCTAssertEqual(answer.text, "{}")
        }
        // One being sent, one waiting, three dropped: counted and logged, without addresses.
        let metrics = app.application.metrics
        XCTAssertEqual(metrics.mailDropped.value, 3)
        XCTAssertTrue(metrics.render().contains("trunk_sync_mail_dropped_total 3\n"))
        XCTAssertTrue(metrics.render().contains("trunk_sync_mail_queue_length 1\n"))
        let dropped = app.logs.lines.filter { $0.contains("sign-in mail dropped") }
        XCTAssertEqual(dropped.count, 1, "one line per interval, not one per mail: \(app.logs.lines)")
        XCTAssertFalse(dropped.joined().contains("@example.com"))
        app.sender.release()
        _ = try await app.sender.code(for: "full0@example.com")
        _ = try await app.sender.code(for: "full1@example.com")
        XCTAssertEqual(app.sender.count(for: "full4@example.com"), 0)
    }
}
