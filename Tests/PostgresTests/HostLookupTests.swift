import CSystem
import Foundation
import Synchronization
import TestSupport
import XCTest

@testable import Postgres

/// Host names are looked up before an opening, on a thread of their own: the loop that
/// drives the pool keeps serving while a resolver is slow, openings at the same time share
/// one look-up, and a name without an address fails in libpq's words.
final class HostLookupTests: XCTestCase {
    private var loop: PostgresLoopThread!

    override func setUp() async throws {
        loop = try PostgresLoopThread(name: "pg-loop-lookup")
    }

    override func tearDown() async throws {
        await loop?.close()
    }

    private func makePool(_ connection: PostgresConfiguration, size: Int = 1, lookup: HostLookup = .system)
        -> PostgresLoopPool
    {
        var settings = PostgresLoopPool.Configuration()
        settings.maxConnections = size
        settings.hostLookup = lookup
        return PostgresLoopPool(connection, configuration: settings, loop: loop, logger: TestDatabase.quietLogger)
    }

    private static func selectOne(_ pool: PostgresLoopPool) async throws -> Int32 {
        try await pool.withConnection { connection in
            try await connection.pipeline([PostgresStatement("select 1")])[0][0].decode(Int32.self, column: 0)
        }
    }

    /// The test cluster's configuration with `host` set to `name` (it listens on 127.0.0.1).
    private static func named(_ name: String) throws -> PostgresConfiguration {
        var configuration = try TestDatabase.adminConfiguration()
        configuration.setParameter("host", name)
        return configuration
    }

    func testASlowLookUpHoldsNoLoopAndOpeningsAtTheSameTimeShareIt() async throws {
        let gate = DispatchSemaphore(value: 0)
        let calls = Mutex<[String]>([])
        let lookup = HostLookup { name in
            var buffer = [CChar](repeating: 0, count: 32)
            _ = csystem_get_thread_name(&buffer, buffer.count)
            let thread = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            calls.withLock { $0.append("\(name) on \(thread)") }
            // Released by the test once it has seen the loop serve meanwhile (bounded, so a
            // failing test cannot hang).
            _ = gate.wait(timeout: .now() + 30)
            return ["127.0.0.1"]
        }
        let named = makePool(try Self.named("db.example.test"), size: 3, lookup: lookup)
        let requests = (0..<3).map { _ in Task { try await Self.selectOne(named) } }
        let asked = await waitUntil(10) { calls.withLock { !$0.isEmpty } && named.statistics.waiting == 3 }
        XCTAssertTrue(asked, "the look-up started; three requests wait for their openings")

        // The same loop opens and serves another pool while the look-up waits.
        let direct = makePool(try TestDatabase.adminConfiguration())
        let served = try await Self.selectOne(direct)
        XCTAssertEqual(served, 1)

        gate.signal()
        for request in requests {
            let value = try await request.value
            XCTAssertEqual(value, 1)
        }
        let opened = await waitUntil(10) { named.statistics.open == 3 }
        XCTAssertTrue(opened, "three openings, one look-up: \(named.statistics)")
        XCTAssertEqual(calls.withLock { $0 }, ["db.example.test on pg-resolve"], "one look-up, off the loop")
        await named.close()
        await direct.close()
    }

    func testANameWithoutAddressFailsInLibpqsWordsAndTheNextOpeningLooksAgain() async throws {
        let answers = Mutex<[Result<[String], HostLookup.LookupFailure>]>([
            .failure(HostLookup.LookupFailure(reason: "Name or service not known")), .success(["127.0.0.1"]),
        ])
        let lookup = HostLookup { _ in try answers.withLock { $0.removeFirst() }.get() }
        let configuration = try Self.named("db.example.test")
        let pool = makePool(configuration, lookup: lookup)
        do {
            _ = try await Self.selectOne(pool)
            XCTFail("the opening must fail")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .connectionFailed)
            XCTAssertEqual(
                error.description,
                "could not connect to PostgreSQL at \(configuration.endpoint): could not translate host name "
                    + "\"db.example.test\" to address: Name or service not known")
        }
        let value = try await Self.selectOne(pool)
        XCTAssertEqual(value, 1, "the database is found once the name has an address")
        await pool.close()
    }

    func testAListSkipsANameWithoutAddressAndLooksUpItsNamesAtTheSameTime() async throws {
        // "b" answers only once "c" has been asked: looked up one after the other, the
        // opening would wait out the bound below and fail.
        let cAsked = DispatchSemaphore(value: 0)
        let waitedInVain = Mutex(false)
        let lookup = HostLookup { name in
            switch name {
            case "b.example.test":
                if cAsked.wait(timeout: .now() + 10) == .timedOut { waitedInVain.withLock { $0 = true } }
                return ["127.0.0.1"]
            case "c.example.test":
                cAsked.signal()
                throw HostLookup.LookupFailure(reason: "Name or service not known")
            default:
                throw HostLookup.LookupFailure(reason: "Name or service not known")
            }
        }
        // As libpq does, a host it cannot resolve is skipped, wherever it stands in the list.
        for hosts in ["gone.example.test,b.example.test,c.example.test", "b.example.test,c.example.test"] {
            let pool = makePool(try Self.named(hosts), lookup: lookup)
            let value = try await Self.selectOne(pool)
            XCTAssertEqual(value, 1, hosts)
            await pool.close()
        }
        XCTAssertFalse(waitedInVain.withLock { $0 }, "the list's names are looked up at the same time")

        // With no entry left, the first name that has no address is named.
        let configuration = try Self.named("gone.example.test,c.example.test")
        let none = makePool(configuration, lookup: lookup)
        do {
            _ = try await Self.selectOne(none)
            XCTFail("no host has an address")
        } catch let error as PostgresError {
            XCTAssertEqual(error.kind, .connectionFailed)
            XCTAssertTrue(
                error.description.hasSuffix(
                    "could not translate host name \"gone.example.test\" to address: Name or service not known"),
                error.description)
        }
        await none.close()
    }

    func testTheSystemResolverFindsLocalhost() async throws {
        let addresses = try HostLookup.system.resolve("localhost")
        XCTAssertTrue(addresses.contains("127.0.0.1"), "\(addresses)")
        let pool = makePool(try Self.named("localhost"))
        let value = try await Self.selectOne(pool)
        XCTAssertEqual(value, 1)
        await pool.close()
        XCTAssertThrowsError(try HostLookup.system.resolve("")) { error in
            XCTAssertFalse("\(error)".isEmpty)
        }
    }

    // MARK: - What libpq is given

    private static func configuration(_ pairs: [(String, String)]) throws -> PostgresConfiguration {
        var configuration = try PostgresConfiguration("dbname=app")
        for (keyword, value) in pairs { configuration.setParameter(keyword, value) }
        return configuration
    }

    func testOnlyNamesAreLookedUp() throws {
        XCTAssertEqual(HostLookup.hostsToLookUp(try Self.configuration([("host", "db")])), ["db"])
        XCTAssertEqual(HostLookup.hostsToLookUp(try Self.configuration([("host", "10.0.0.1,db")])), ["10.0.0.1", "db"])
        for host in ["127.0.0.1", "::1", "10.0.0.1,fe80::1", "/var/run/postgresql", "@abstract", "", "db,/tmp"] {
            XCTAssertNil(HostLookup.hostsToLookUp(try Self.configuration([("host", host)])), host)
        }
        XCTAssertNil(HostLookup.hostsToLookUp(try Self.configuration([])), "no host: libpq's Unix socket")
        XCTAssertNil(
            HostLookup.hostsToLookUp(try Self.configuration([("host", "db"), ("hostaddr", "10.0.0.9")])),
            "hostaddr given")
        XCTAssertNil(
            HostLookup.hostsToLookUp(try Self.configuration([("host", "db")]), environment: ["PGHOSTADDR": "10.0.0.9"]),
            "libpq takes PGHOSTADDR when the configuration has no hostaddr")
        XCTAssertEqual(
            HostLookup.hostsToLookUp(try Self.configuration([("host", "db")]), environment: ["PGHOSTADDR": ""]), ["db"])
        // libpq refuses ports that are neither one for all nor one per host: left to it.
        XCTAssertNil(HostLookup.hostsToLookUp(try Self.configuration([("host", "a,b,c"), ("port", "5432,5433")])))
        XCTAssertEqual(
            HostLookup.hostsToLookUp(try Self.configuration([("host", "a,b"), ("port", "5432,5433")])), ["a", "b"])
    }

    func testEachAddressBecomesAnEntryOfTheHostList() throws {
        let single = HostLookup.expanded(
            try Self.configuration([("host", "db"), ("port", "5433")]), hosts: ["db"],
            addresses: ["db": ["10.0.0.2", "fd00::2", "10.0.0.2"]])
        XCTAssertEqual(single["host"], "db,db")
        XCTAssertEqual(single["hostaddr"], "10.0.0.2,fd00::2")
        XCTAssertEqual(single["port"], "5433", "one port serves every entry")

        let list = HostLookup.expanded(
            try Self.configuration([("host", "primary,10.0.0.7"), ("port", "5432,5433")]),
            hosts: ["primary", "10.0.0.7"],
            addresses: ["primary": ["10.0.0.1", "10.0.0.2"]])
        XCTAssertEqual(list["host"], "primary,primary,10.0.0.7")
        XCTAssertEqual(list["hostaddr"], "10.0.0.1,10.0.0.2,10.0.0.7")
        XCTAssertEqual(list["port"], "5432,5432,5433", "each host's port follows its addresses")
        XCTAssertEqual(list["dbname"], "app")

        let skipped = HostLookup.expanded(
            try Self.configuration([("host", "gone,db"), ("port", "5432,5433")]), hosts: ["gone", "db"],
            addresses: ["db": ["10.0.0.3"]])
        XCTAssertEqual(skipped["host"], "db", "a name without addresses is left out")
        XCTAssertEqual(skipped["hostaddr"], "10.0.0.3")
        XCTAssertEqual(skipped["port"], "5433", "with its port")
    }
}
