import Foundation
import Postgres
import Synchronization
import TestSupport
import XCTest

final class ConnectionTests: XCTestCase {
    func testWrongPortNamesEndpointAndReason() throws {
        var configuration = try TestDatabase.adminConfiguration()
        configuration.setParameter("port", "1")
        XCTAssertThrowsError(try PostgresConnection.connect(configuration)) { error in
            let error = error as? PostgresError
            XCTAssertEqual(error?.kind, .connectionFailed)
            let message = error?.description ?? ""
            XCTAssertTrue(message.contains("127.0.0.1:1/postgres"), message)
            XCTAssertTrue(message.contains("Connection refused"), message)
            XCTAssertFalse(message.contains("\n"), message)
        }
    }

    /// The cancellable opening (`serve`'s start-up role check, `migrate`) behaves as the
    /// blocking one: it connects, names a refusal the same way; and `cancel()` from another
    /// thread ends an attempt a silent server would hold for ever (no `connect_timeout`).
    func testACancellableOpeningConnectsRefusesAsConnectAndEndsWhenCancelled() throws {
        let cancellation = try ConnectCancellation()
        let connection = try PostgresConnection.connect(
            try TestDatabase.adminConfiguration(), cancellation: cancellation)
        XCTAssertEqual(try connection.query("select 1::int8")[0].decode(Int64.self, column: 0), 1)

        var refused = try TestDatabase.adminConfiguration()
        refused.setParameter("port", String(try unusedPort()))
        var blocking = ""
        XCTAssertThrowsError(try PostgresConnection.connect(refused)) { blocking = "\($0)" }
        XCTAssertThrowsError(try PostgresConnection.connect(refused, cancellation: cancellation)) { error in
            XCTAssertEqual("\(error)", blocking)
        }

        let silent = try SilentServer()
        var silentTarget = try TestDatabase.adminConfiguration()
        silentTarget.setParameter("port", String(silent.port))
        silentTarget.setParameter("connect_timeout", "0")
        let target = silentTarget
        let ended = DispatchSemaphore(value: 0)
        let outcome = Mutex<(any Error)?>(nil)
        Thread {
            do { _ = try PostgresConnection.connect(target, cancellation: cancellation) } catch {
                outcome.withLock { $0 = error }
            }
            ended.signal()
        }.start()
        cancellation.cancel()
        XCTAssertEqual(ended.wait(timeout: .now() + 30), .success, "cancel() did not end the attempt")
        XCTAssertTrue(outcome.withLock { $0 } is CancellationError, "\(String(describing: outcome.withLock { $0 }))")
        // Cancelled stays cancelled (so a cancel that came before the attempt waited counts
        // too): a later attempt ends at once.
        XCTAssertThrowsError(try PostgresConnection.connect(target, cancellation: cancellation)) { error in
            XCTAssertTrue(error is CancellationError, "\(error)")
        }
    }

    func testWrongPasswordIsClearAndNeverShowsThePassword() throws {
        var configuration = try TestDatabase.adminConfiguration()
        configuration.setParameter("password", "hunter2-not-the-password")
        XCTAssertThrowsError(try PostgresConnection.connect(configuration)) { error in
            let message = "\(error)" + String(reflecting: error)
            XCTAssertTrue(message.contains("password authentication failed"), message)
            XCTAssertFalse(message.contains("hunter2"), message)
        }
        XCTAssertFalse(configuration.description.contains("hunter2"))
        XCTAssertTrue(configuration.description.contains("password=***"))
    }

    func testMissingDatabaseIsNamed() throws {
        let configuration = try TestDatabase.adminConfiguration().withDatabase("no_such_database_here")
        XCTAssertThrowsError(try PostgresConnection.connect(configuration)) { error in
            let message = "\(error)"
            XCTAssertTrue(message.contains("/no_such_database_here"), message)
            XCTAssertTrue(message.contains("does not exist"), message)
        }
    }

    func testURLAndConninfoFormsBothParse() throws {
        let url = try PostgresConfiguration("postgres://alice:secret@db.example:6543/app?sslmode=disable")
        XCTAssertEqual(url["host"], "db.example")
        XCTAssertEqual(url["port"], "6543")
        XCTAssertEqual(url["dbname"], "app")
        XCTAssertEqual(url["user"], "alice")
        XCTAssertEqual(url.endpoint, "db.example:6543/app")
        XCTAssertFalse(url.description.contains("secret"))
        let conninfo = try PostgresConfiguration("host=/run/pg dbname='my db' user=bob")
        XCTAssertEqual(conninfo["dbname"], "my db")
        XCTAssertEqual(conninfo.endpoint, "/run/pg:5432/my db")
        XCTAssertThrowsError(try PostgresConfiguration("host=x unterminated='")) { error in
            XCTAssertEqual((error as? PostgresError)?.kind, .invalidConfiguration)
        }
        XCTAssertThrowsError(try PostgresConfiguration("postgres://[::1")) { error in
            XCTAssertEqual((error as? PostgresError)?.kind, .invalidConfiguration)
        }
    }

    /// libpq quotes the pieces of a connection string it cannot parse, up to the whole URL:
    /// those never reach a message; its own keywords still do.
    func testParseErrorsNeverQuoteTheInput() throws {
        for input in [
            "postgres://u:p%zzhunter2@h/db", "postgres://u:hunter2@[::1/db", "host=h password=hunter2 hunter2",
            "postgres://u:hunter2@h/db?hunter2=1", "host=h password='hunter2",
        ] {
            XCTAssertThrowsError(try PostgresConfiguration(input)) { error in
                let message = "\(error)" + String(reflecting: error)
                XCTAssertTrue(message.hasPrefix("invalid database URL: "), message)
                XCTAssertFalse(message.contains("hunter2"), message)
            }
        }
        XCTAssertThrowsError(try PostgresConfiguration("host=h nosuchoption=1")) { error in
            XCTAssertEqual("\(error)", #"invalid database URL: invalid connection option "…""#)
        }
    }

    func testValuesNeverBecomeSQL() throws {
        let connection = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        let hostile = "'); drop table pg_class; --"
        let echoed = try connection.query("select $1::text", hostile)[0].decode(String.self, column: 0)
        XCTAssertEqual(echoed, hostile)
        let quoted = try connection.quoteIdentifier("we\"ird")
        XCTAssertEqual(quoted, "\"we\"\"ird\"")
    }
}
