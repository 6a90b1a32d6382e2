import Foundation
import Postgres
import TestSupport
import XCTest

/// `serve` and `config check` on the two setups: logged in as the owner (here the cluster's
/// superuser, as the compose file's was), which they warn about loudly but accept; and on a
/// login of its own made by `migrate`, which they accept silently and which serves every flow.
final class DatabaseRoleTests: EndToEndTestCase {
    func configCheck(_ environment: [String: String]) throws -> Command.Result {
        try Command.run(Command.trunkSyncBinary(), ["config", "check"], environment: environment)
    }

    func testServeAndConfigCheckWarnWhenTheServerLogsInAsASuperuser() throws {
        let server = try startServer()  // TRUNK_SYNC_DATABASE_URL: the cluster's superuser
        let warning = "TRUNK_SYNC_DATABASE_URL logs in as trunk, a superuser: row-level security does not bind it"
        let line = server.stderr.waitForLine(containing: "logs in as", timeout: 5) ?? ""
        XCTAssertTrue(line.contains("warning"), line)
        XCTAssertTrue(line.contains(warning), line)
        XCTAssertTrue(line.contains("TRUNK_SYNC_MIGRATION_DATABASE_URL"), "says what to do: \(line)")
        assertServerHealthy(server)  // a warning, not a refusal

        let checked = try configCheck(server.environment)
        XCTAssertEqual(checked.status, 0, checked.stderr)
        XCTAssertTrue(checked.stdout.contains("configuration OK"), checked.stdout)
        XCTAssertTrue(checked.stderr.contains(warning), checked.stderr)
        XCTAssertFalse(checked.stderr.contains(try XCTUnwrap(server.database["password"])))
    }

    func testTheServersOwnLoginServesEveryFlowWithoutWarnings() throws {
        let database = try TestDatabase.create(prefix: "split")
        let role = TestDatabase.roleName("split_server")
        defer {
            try? TestDatabase.drop(database)
            TestDatabase.dropRole(role)
        }
        let ownerURL = try TestDatabase.url(of: database)
        let serverURL = try TestDatabase.url(of: database, user: role, password: TestSecrets.randomHex())
        let migrate = try Command.run(
            Command.trunkSyncBinary(), ["migrate"],
            environment: ServerProcess.serveEnvironment(
                databaseURL: serverURL, overrides: ["TRUNK_SYNC_MIGRATION_DATABASE_URL": ownerURL]))
        XCTAssertEqual(migrate.status, 0, migrate.stderr)
        XCTAssertTrue(migrate.stdout.contains("created the server's login role \(role)"), migrate.stdout)

        let server = try launchServer(on: database, ["TRUNK_SYNC_DATABASE_URL": serverURL])
        try server.waitUntilListening(timeout: 15)
        XCTAssertTrue(
            eventually(within: 10) { (try? server.exchange(request("GET", "/readyz")).0.status) == 200 }, server.logs)
        XCTAssertFalse(server.logs.contains("logs in as"), server.logs)
        let checked = try configCheck(server.environment)
        XCTAssertEqual(checked.status, 0, checked.stderr)
        XCTAssertFalse(checked.stderr.contains("logs in as"), checked.stderr)

        // Sign-in by code (the code is in the log mailer's line), refresh, push, pull, profile.
        let (otp, _) = try server.exchange(
            request(
                "POST", "/auth/v1/otp", headers: [("Content-Type", "application/json")],
                body: #"{"email":"split@example.com"}"#))
        XCTAssertEqual(otp.status, 200, otp.bodyText)
        let codeLine = try XCTUnwrap(server.stderr.waitForLine(containing: "split@example.com", timeout: 5))
        let code = try XCTUnwrap(codeLine.firstMatch(of: /\b(\d{6})\b/)?.1)
        let (verified, _) = try server.exchange(
            request(
                "POST", "/auth/v1/verify", headers: [("Content-Type", "application/json")],
                body: #"{"email":"split@example.com","token":"\#(code)","type":"email"}"#))
        XCTAssertEqual(verified.status, 200, verified.bodyText)
        let refreshToken = try XCTUnwrap(verified.jsonObject?["refresh_token"] as? String)
        let (refreshed, _) = try server.exchange(
            request(
                "POST", "/auth/v1/token?grant_type=refresh_token", headers: [("Content-Type", "application/json")],
                body: #"{"refresh_token":"\#(refreshToken)"}"#))
        XCTAssertEqual(refreshed.status, 200, refreshed.bodyText)
        let token = try XCTUnwrap(refreshed.jsonObject?["access_token"] as? String)
        let bearer = [("Authorization", "Bearer \(token)"), ("Content-Type", "application/json")]
        let (pushed, _) = try server.exchange(
            request(
                "POST", "/sync/v1/events", headers: bearer,
                body:
                    #"{"events":[{"client_id":"6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b10","type":"note","payload":{},"client_timestamp":"2026-11-22T04:10:02.123Z"}]}"#
            ))
        XCTAssertEqual(pushed.status, 200, pushed.bodyText)
        let (pulled, _) = try server.exchange(request("GET", "/sync/v1/events?after=0", headers: bearer))
        XCTAssertEqual((pulled.jsonObject?["events"] as? [Any])?.count, 1, pulled.bodyText)
        let (updated, _) = try server.exchange(
            request("PUT", "/auth/v1/user", headers: bearer, body: #"{"data":{"full_name":"Split"}}"#))
        XCTAssertEqual(updated.status, 200, updated.bodyText)
        let (profile, _) = try server.exchange(request("GET", "/rest/v1/profiles?select=full_name", headers: bearer))
        XCTAssertEqual(profile.bodyText, #"[{"full_name":"Split"}]"#)
        let (loggedOut, _) = try server.exchange(request("POST", "/auth/v1/logout", headers: bearer))
        XCTAssertEqual(loggedOut.status, 204, loggedOut.bodyText)

        // Every connection the server holds logs in as its own role.
        let logins = try PostgresConnection.connect(database).query(
            "select distinct usename::text from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() and usename is not null"
        ).map { try $0.decode(String.self, column: 0) }
        XCTAssertEqual(logins, [role])
    }
}
