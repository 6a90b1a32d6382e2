import Foundation
import TestSupport
import XCTest

/// The browser client (clients/web/trunk-sync.js): served by the binary at
/// `/client/v1/trunk-sync.js`, and driven in headless Chromium (Debian's `chromium` and
/// `chromium-driver`, Selenium from the test venv) by Tests/Browser/web_client.py against the
/// real server, Postgres and an SMTP sink.
final class WebClientTests: EndToEndTestCase {
    static let source = repositoryRoot() + "/clients/web/trunk-sync.js"

    /// The pure parts (batching, backoff, Retry-After, SSE framing) under Node's test runner
    /// (Debian's `nodejs`; scripts/test.sh installs it): clients/web/test/.
    func testPurePartsUnderNode() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/node") else {
            throw TestEnvironmentError("/usr/bin/node is missing: run the tests with `make test` (it installs nodejs)")
        }
        let result = try Command.run("/usr/bin/node", ["--test", repositoryRoot() + "/clients/web/test/"])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        XCTAssertTrue(result.stdout.contains("# fail 0"), result.stdout)
        XCTAssertFalse(result.stdout.contains("# pass 0"), result.stdout)
    }

    func testServedCacheableWithCORSAndRevalidatedByETag() throws {
        let origin = "http://app.example.com"
        let server = try startServer(["TRUNK_SYNC_CORS_ORIGINS": origin])
        let (response, _) = try server.exchange(
            request("GET", "/client/v1/trunk-sync.js", headers: [("Origin", origin)]))
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.header("Content-Type"), "text/javascript; charset=utf-8")
        XCTAssertEqual(response.header("Cache-Control"), "public, max-age=600")
        XCTAssertEqual(response.header("Access-Control-Allow-Origin"), origin)
        XCTAssertEqual(response.header("X-Content-Type-Options"), "nosniff")
        XCTAssertTrue(response.body == Array(try Data(contentsOf: URL(fileURLWithPath: Self.source))))
        let etag = try XCTUnwrap(response.header("ETag"))
        XCTAssertTrue(etag.hasPrefix("\"") && etag.hasSuffix("\"") && etag.count == 34, etag)

        let (fresh, _) = try server.exchange(
            request("GET", "/client/v1/trunk-sync.js", headers: [("If-None-Match", "\"other\", \(etag)")]),
            bodyExpected: false)
        XCTAssertEqual(fresh.status, 304)
        XCTAssertEqual(fresh.header("ETag"), etag)
        XCTAssertTrue(fresh.body.isEmpty)
        let (stale, _) = try server.exchange(
            request("GET", "/client/v1/trunk-sync.js", headers: [("If-None-Match", "\"other\"")]))
        XCTAssertEqual(stale.status, 200)
        XCTAssertFalse(stale.body.isEmpty)

        // An origin that is not allowed gets the file without the CORS header: the browser
        // refuses to run it as a module from that origin.
        let (foreign, _) = try server.exchange(
            request("GET", "/client/v1/trunk-sync.js", headers: [("Origin", "http://evil.example")]))
        XCTAssertNil(foreign.header("Access-Control-Allow-Origin"))
        // Only GET: anything else is the API's 405, a body is refused from the head.
        let (post, _) = try server.exchange(request("POST", "/client/v1/trunk-sync.js", body: "{}"))
        assertJSONError(post, status: 405)
        let (large, _) = try server.exchange(
            request("GET", "/client/v1/trunk-sync.js", headers: [("Content-Length", "4096")]))
        assertJSONError(large, status: 413)
    }

    func testTheClientInARealBrowser() throws {
        let python = try browserTestPython()
        let sink = try SMTPSink()
        defer { sink.stop() }
        let pagePort = try freePort()
        let server = try startServer([
            "TRUNK_SYNC_MAILER": "smtp", "TRUNK_SYNC_SMTP_URL": "smtp://127.0.0.1:\(sink.port)?tls=none",
            "TRUNK_SYNC_CORS_ORIGINS": "http://127.0.0.1:\(pagePort)",
            // The script signs the same user in several times in a row.
            "TRUNK_SYNC_OTP_RESEND_INTERVAL": "1",
            "TRUNK_SYNC_RATE_LIMIT_OTP": "1000/300", "TRUNK_SYNC_RATE_LIMIT_VERIFY": "1000/300",
            // Not the per-address default (10 codes an hour), which the script comes near.
            "TRUNK_SYNC_RATE_LIMIT_OTP_EMAIL": "1000/3600",
            // Keep-alives well inside the stream watchdog the script sets (3 s).
            "TRUNK_SYNC_STREAM_HEARTBEAT": "1",
        ])
        let result = try Command.run(
            python,
            [
                repositoryRoot() + "/Tests/Browser/web_client.py", "http://127.0.0.1:\(server.port)", String(pagePort),
                sink.directory.path,
            ])
        XCTAssertEqual(result.status, 0, result.stdout + result.stderr)
        for step in [
            "the served module imports from another origin",
            "recorded offline, then synced: each event once on the server",
            "tab killed mid-push", "leader tab killed, the other took over",
            "a first sign-in downloaded the history of",
            "a second profile got every event live, none missed after a cut connection",
            "429 and 503 with Retry-After honoured",
            "maxBatchEvents 0 pushes batches of one",
            "a proxy's 413 halves the batch, and the size that fit is kept for the rest of the push",
            "a 2xx push answer that names no event stored removes nothing from the outbox",
            "a push answer naming only some events removes those, in runs, and keeps the others",
            "a pull answer that is not the server's fails the sync and leaves the cursor",
            "a push answer that never came timed out and the push was tried again",
            "a stream gone silent was dropped and reopened, none missed",
            "a stream that ends at once or is not an event stream is retried with backoff",
            "a stream refused with 401 while refreshes succeed is retried with backoff",
            "a stream answered with a proxy's 401 page backs off and spends no refresh",
            "token expiry mid-sync: refreshed and the sync went on",
            "one token refresh shared by two tabs",
            "a refused event quarantined, the others pushed",
            "the app is told of a refused event, a failed push and a sign-out by the server",
            "'pushed' is told in every tab",
            "an event whose announcement was lost is pushed when the page becomes visible",
            "a type of 128 characters outside the BMP is recorded and stored",
            "two accounts in one browser kept apart",
            "sign-out kept the unsent events for the next sign-in, or discarded them when asked",
            "sign-out ends its own session, not the one another tab signed in meanwhile",
            "reauthenticate and deleteAccount never go on for a user another tab signed in",
            "sign-out ends its session also when a tab of the previous version refreshed it (no id)",
            "a refresh refused after its session ended leaves the session another tab signed in",
            "sign-out with discard leaves the outbox of the same user signed in again in another tab",
            "sign-out revokes its session when another tab's sign-in is seen only at its refresh",
            "sign-out with IndexedDB refusing signs out, and the discard happens at the next opening",
            "persistent storage refused is told (storagePersisted, 'storage_not_persisted')",
            "without IndexedDB, record refuses clearly",
            "an export whose body stalls is aborted with a network error",
            "an export answered with a page in the way is refused, not handed out as the copy",
            "an export cut short where the break did not show is refused, not handed out as the copy",
            "exported the account as NDJSON",
            "the example page signs in, records and lists a note",
            "the example page keeps a note the browser did not store in its field, and says so",
            "the example page warns that storage may be cleared, without hiding its message",
            "the example page lists a note another device added during its first sync",
            "the example page's count of unsent notes follows the push's answer, after the note's live event",
            "two tabs of the example page keep each other's notes, and an earlier version's",
            "deleted the account with a mailed code, and its local data",
            "a deletion whose answer was lost is not claimed, and signs out and removes the local data",
            "the complete page of the guide signs in, records and lists a note",
            "a pull page saying has_more without moving past the cursor is refused, not asked for again",
            "a 4xx page in the way of a token refresh or a call keeps the session",
            "a 401 page in the way of a call spends no token refresh",
            "an answer past maxAnswerBytes is cancelled unread: the sync fails, the cursor and outbox stay",
            "a Retry-After date is counted from the answer's Date, not the device's clock",
            "a Retry-After over maxRetryAfter holds the leader's stream and push back for maxRetryAfter at most",
            "a 400 page in the way of a push quarantines nothing; the events stay in the outbox",
            "a token refresh whose 200 answer is mangled is asked again at once; the session lives on",
            "outbox records that cannot be sent go to the quarantine as they were; the others are pushed, in order",
            "a stored cursor or a quarantine entry it cannot read blocks no sync: pulled again from the start",
            "an outbox record the browser cannot read (its large value's file lost) is set aside, told once;"
                + " the others are pushed, in order",
            "an outbox record whose reads fail for a while (its large value's file cut short) is kept until it failed"
                + " in a later push too, then set aside",
            "a live stream message cut short loses no event: the one before it delivered, the app told",
            "a live stream line that never ends is dropped and reopened; the next event arrives",
        ] {
            XCTAssertTrue(
                result.stdout.contains("ok \(step)"), "missing step \(step): \(result.stdout)\(result.stderr)")
        }
        XCTAssertFalse(server.logs.contains("access_token="), "a token in the log")
    }
}
