import Foundation
import TestSupport
import XCTest

/// The operator console in headless Chromium (Debian's `chromium` and `chromium-driver`,
/// Selenium from the test venv; scripts/test.sh installs them): Tests/Console/console_browser.py
/// drives it against the real binary and a real SMTP sink. Screenshots of each page are
/// written to .build/console-screenshots/ for a person to look at.
final class ConsoleBrowserTests: EndToEndTestCase {
    func testTheConsoleInARealBrowser() throws {
        let python = try browserTestPython()
        let sink = try SMTPSink()
        defer { sink.stop() }
        let server = try startServer([
            "TRUNK_SYNC_MAILER": "smtp", "TRUNK_SYNC_SMTP_URL": "smtp://127.0.0.1:\(sink.port)?tls=none",
            "TRUNK_SYNC_ADMIN_EMAILS": "ops@example.com",
            // The script signs the same app user in twice in a row.
            "TRUNK_SYNC_OTP_RESEND_INTERVAL": "1",
        ])
        let screenshots = repositoryRoot() + "/.build/console-screenshots"
        let result = try Command.run(
            python,
            [
                repositoryRoot() + "/Tests/Console/console_browser.py", "http://127.0.0.1:\(server.adminPort)",
                "http://127.0.0.1:\(server.port)", sink.directory.path, screenshots, "ops@example.com",
            ])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        for step in [
            "app user created through the API with two sessions and 12 events",
            "sign-in page: email and one-time-code forms", "a non-operator cannot sign in",
            "operator signed in with the mailed code", "overview with live figures",
            "overview charts: requests per minute, events per day",
            "found the user and opened their events", "events filtered by type",
            "revoked a session and its token is refused",
            "an export cut short where the break did not show is refused, nothing saved",
            "exported the user's events", "deleted the user",
            "overview charts: empty state", "markup in a user's data shows as text and runs nothing",
            "a link with anything but a user id opens nothing",
            "trusted types refuse HTML from strings", "another origin cannot use the console or load its answers",
            "a sign-out that fails says so and keeps the session", "signed out, in every tab",
            "no console errors",
        ] {
            XCTAssertTrue(
                result.stdout.contains("ok \(step)\n"), "missing step \(step): \(result.stdout)\(result.stderr)")
        }
        for page in [
            "01-sign-in", "02-overview", "03-users", "04-user", "05-deleted", "06-overview-empty", "07-hostile-user",
        ] {
            XCTAssertTrue(FileManager.default.fileExists(atPath: "\(screenshots)/\(page).png"), page)
        }
        // Every action on the user is in the log with the operator's address and the user's id.
        for action in [
            "console: user viewed", "console: session revoked", "console: user exported", "console: user deleted",
        ] {
            let line = try XCTUnwrap(server.stderr.waitForLine(containing: action, timeout: 5), action)
            XCTAssertTrue(line.contains("admin=ops@example.com") && line.contains("user_id="), line)
        }
    }
}
