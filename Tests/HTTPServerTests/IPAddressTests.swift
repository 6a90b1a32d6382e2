import XCTest

@testable import HTTPServer

/// Addresses, CIDR blocks and the choice of the client from `X-Forwarded-For`.
final class IPAddressTests: XCTestCase {
    func address(_ text: String, file: StaticString = #filePath, line: UInt = #line) throws -> IPAddress {
        try XCTUnwrap(IPAddress(text), "\(text) did not parse", file: file, line: line)
    }

    func network(_ text: String, file: StaticString = #filePath, line: UInt = #line) throws -> IPNetwork {
        try XCTUnwrap(IPNetwork(text), "\(text) did not parse", file: file, line: line)
    }

    // MARK: - Addresses

    func testAddressesParseAndPrintCanonically() throws {
        let cases = [
            ("192.0.2.1", "192.0.2.1"), ("0.0.0.0", "0.0.0.0"), ("255.255.255.255", "255.255.255.255"),
            ("::1", "::1"), ("::", "::"), ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"), ("fe80::1:2", "fe80::1:2"),
            ("2001:0db8:85a3:0000:0000:8a2e:0370:7334", "2001:db8:85a3::8a2e:370:7334"),
            // IPv4-mapped IPv6 is the IPv4 address.
            ("::ffff:192.0.2.1", "192.0.2.1"), ("::FFFF:c000:0201", "192.0.2.1"),
        ]
        for (text, canonical) in cases {
            XCTAssertEqual(try address(text).description, canonical, text)
        }
        XCTAssertEqual(try address("::ffff:192.0.2.1"), try address("192.0.2.1"))
        XCTAssertTrue(try address("192.0.2.1").isIPv4)
        XCTAssertFalse(try address("2001:db8::1").isIPv4)
        XCTAssertEqual(IPAddress(ipv4: 0xC000_0201), try address("192.0.2.1"))
        XCTAssertEqual(IPAddress(bytes: [192, 0, 2, 1]), try address("192.0.2.1"))
        XCTAssertEqual(IPAddress(bytes: try address("2001:db8::1").bytes), try address("2001:db8::1"))
        XCTAssertNil(IPAddress(bytes: [1, 2, 3]))
    }

    func testAnythingButExactlyAnAddressIsRefused() {
        let refused = [
            "", " ", "1", "1.2.3", "1.2.3.4.5", "256.0.0.1", "01.2.3.4", "1.2.3.04", "1.2.3.4 ", " 1.2.3.4",
            "1.2.3.4:80", "[::1]", "[::1]:80", "::1%lo", "fe80::1%25eth0", "1.2.3.4/32", "::1/128", "unknown",
            "example.com", "0x7f.0.0.1", "1..2.3", "1.2.3.", "-1.2.3.4", "+1.2.3.4", "2001:db8::g", "2001:db8:::1",
            "1:2:3:4:5:6:7:8:9", "12345::1", ":::", "1.2.3.4\u{0}", "１.2.3.4", String(repeating: "1", count: 46),
            "2001:db8::1\n",
        ]
        for text in refused { XCTAssertNil(IPAddress(text), text.debugDescription) }
    }

    func testAnIPv6ClientIsItsSlash64AndAnIPv4ClientIsItsAddress() throws {
        let first = try address("2001:db8:1:2:aaaa:bbbb:cccc:dddd")
        let second = try address("2001:db8:1:2::1")
        let neighbour = try address("2001:db8:1:3::1")
        XCTAssertEqual(first.client, second.client, "one /64, one client")
        XCTAssertNotEqual(first.client, neighbour.client)
        XCTAssertEqual(first.clientText, "2001:db8:1:2::/64")
        XCTAssertEqual(try address("192.0.2.1").client, try address("192.0.2.1"))
        XCTAssertNotEqual(try address("192.0.2.1").client, try address("192.0.2.2").client)
        XCTAssertEqual(try address("192.0.2.1").clientText, "192.0.2.1")
        XCTAssertEqual(try address("::ffff:192.0.2.1").clientText, "192.0.2.1")
    }

    func testMasking() throws {
        let full = try address("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
        XCTAssertEqual(full.masked(toPrefix: 0), try address("::"))
        XCTAssertEqual(full.masked(toPrefix: 1), try address("8000::"))
        XCTAssertEqual(full.masked(toPrefix: 64), try address("ffff:ffff:ffff:ffff::"))
        XCTAssertEqual(full.masked(toPrefix: 65), try address("ffff:ffff:ffff:ffff:8000::"))
        XCTAssertEqual(full.masked(toPrefix: 127), try address("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"))
        XCTAssertEqual(full.masked(toPrefix: 128), full)
        XCTAssertEqual(try address("10.1.2.3").masked(toPrefix: 104), try address("10.0.0.0"))
    }

    // MARK: - Networks

    func testNetworksParseStrictlyAndMatch() throws {
        let private10 = try network("10.0.0.0/8")
        XCTAssertTrue(private10.contains(try address("10.0.0.0")))
        XCTAssertTrue(private10.contains(try address("10.255.255.255")))
        XCTAssertTrue(private10.contains(try address("::ffff:10.1.2.3")))
        XCTAssertFalse(private10.contains(try address("11.0.0.0")))
        XCTAssertFalse(private10.contains(try address("::a01:203")), "IPv4-compatible is not IPv4-mapped")
        XCTAssertEqual(private10.description, "10.0.0.0/8")

        let single = try network("192.0.2.7")
        XCTAssertEqual(single.description, "192.0.2.7/32")
        XCTAssertTrue(single.contains(try address("192.0.2.7")))
        XCTAssertFalse(single.contains(try address("192.0.2.8")))

        let ula = try network("fd00::/8")
        XCTAssertTrue(ula.contains(try address("fd12:3456::1")))
        XCTAssertFalse(ula.contains(try address("fe80::1")))
        XCTAssertFalse(ula.contains(try address("10.0.0.1")))
        XCTAssertEqual(try network("2001:db8::1").description, "2001:db8::1/128")

        let everyIPv4 = try network("0.0.0.0/0")
        XCTAssertTrue(everyIPv4.contains(try address("203.0.113.9")))
        XCTAssertFalse(everyIPv4.contains(try address("2001:db8::1")))
        XCTAssertTrue(try network("::/0").contains(try address("2001:db8::1")))
        XCTAssertTrue(try network("2001:db8:1:2::/64").contains(try address("2001:db8:1:2:ffff::1")))
        XCTAssertFalse(try network("2001:db8:1:2::/64").contains(try address("2001:db8:1:3::1")))
    }

    func testMalformedNetworksAreRefused() {
        let refused = [
            "10.0.0.1/8", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/+8", "10.0.0.0/08", "10.0.0.0/8/8",
            "10.0.0.0/ 8", " 10.0.0.0/8", "2001:db8::/129", "2001:db8::1/64", "::/1000", "proxy.internal/32", "/8", "",
            "10.0.0.0/8a",
        ]
        for text in refused { XCTAssertNil(IPNetwork(text), text.debugDescription) }
    }

    // MARK: - X-Forwarded-For

    func proxies(_ blocks: String...) throws -> TrustedProxies {
        TrustedProxies(try blocks.map { try network($0) })
    }

    func client(_ proxies: TrustedProxies, _ values: [String]) -> String? {
        proxies.forwardedClient(values)?.description
    }

    func testTheRightmostUntrustedAddressIsTheClient() throws {
        let trusted = try proxies("10.0.0.0/8", "fd00::/8")
        XCTAssertEqual(client(trusted, ["203.0.113.5"]), "203.0.113.5")
        XCTAssertEqual(
            client(trusted, ["198.51.100.1, 203.0.113.5"]), "203.0.113.5", "the left one is the client's word")
        XCTAssertEqual(client(trusted, ["198.51.100.1, 203.0.113.5, 10.0.0.2"]), "203.0.113.5", "one proxy more")
        XCTAssertEqual(client(trusted, ["203.0.113.5,10.0.0.3,fd00::7"]), "203.0.113.5")
        XCTAssertEqual(client(trusted, ["2001:DB8::5 , 10.1.1.1"]), "2001:db8::5", "canonical form")
        XCTAssertEqual(client(trusted, ["\t::ffff:203.0.113.5\t"]), "203.0.113.5")
        // Repeated fields are one list, in order.
        XCTAssertEqual(client(trusted, ["203.0.113.9", "203.0.113.5, 10.0.0.2"]), "203.0.113.5")
        XCTAssertEqual(client(trusted, ["203.0.113.9, 203.0.113.5", "10.0.0.2"]), "203.0.113.5")
        // Entries left of the client are never read: garbage there changes nothing.
        XCTAssertEqual(client(trusted, ["not-an-address, , 203.0.113.5"]), "203.0.113.5")
    }

    func testWhenEveryEntryIsTrustedTheLeftmostIsTheClient() throws {
        let trusted = try proxies("10.0.0.0/8")
        XCTAssertEqual(client(trusted, ["10.0.0.9, 10.0.0.2"]), "10.0.0.9")
        XCTAssertEqual(client(trusted, ["10.0.0.9"]), "10.0.0.9")
    }

    func testGarbageWhereTheClientShouldBeFallsBackToThePeer() throws {
        let trusted = try proxies("10.0.0.0/8")
        let garbage = [
            [], [""], [" "], ["unknown"], ["203.0.113.5:4711"], ["[2001:db8::1]"], ["203.0.113.5,"],
            ["203.0.113.5, 10.0.0.2,"], ["203.0.113.5 10.0.0.2"], ["203.0.113.5;10.0.0.2"], ["_hidden, 10.0.0.2"],
            ["203.0.113.5", ""], ["2001:db8::1%eth0"], ["203.0.113.5/32"], ["0x7f000001"],
        ]
        for values in garbage { XCTAssertNil(client(trusted, values), "\(values)") }
    }

    func testLongChainsOfTrustedEntriesAreNotWalked() throws {
        let trusted = try proxies("10.0.0.0/8")
        let hops = Array(repeating: "10.0.0.1", count: TrustedProxies.maximumHops)
        XCTAssertEqual(client(trusted, [(["203.0.113.5"] + hops.dropLast()).joined(separator: ",")]), "203.0.113.5")
        XCTAssertNil(client(trusted, [(["203.0.113.5"] + hops).joined(separator: ",")]))
    }

    func testNothingIsTrustedByDefault() throws {
        let none = TrustedProxies()
        XCTAssertTrue(none.isEmpty)
        XCTAssertFalse(none.contains(try address("127.0.0.1")))
        XCTAssertTrue(try proxies("127.0.0.1").contains(try address("127.0.0.1")))
        XCTAssertFalse(try proxies("127.0.0.1").contains(try address("127.0.0.2")))
    }
}
