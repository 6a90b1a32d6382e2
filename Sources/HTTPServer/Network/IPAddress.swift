#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// An IPv4 or IPv6 address as 128 bits. IPv4 addresses are kept IPv4-mapped
/// (`::ffff:a.b.c.d`), so both families share one representation and compare, hash and
/// match networks alike, and `::ffff:192.0.2.1` is the same client as `192.0.2.1`.
public struct IPAddress: Hashable, Sendable, CustomStringConvertible {
    /// The first 64 bits, in network order read as a number.
    public let high: UInt64
    /// The last 64 bits.
    public let low: UInt64

    /// An address from its 128 bits.
    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// An IPv4 address from its 32 bits (`0xC0000201` is `192.0.2.1`).
    public init(ipv4 value: UInt32) {
        high = 0
        low = 0xFFFF_0000_0000 | UInt64(value)
    }

    /// An address from 4 (IPv4) or 16 (IPv6) bytes in network order; nil for any other count.
    public init?<Bytes: Collection>(bytes: Bytes) where Bytes.Element == UInt8 {
        switch bytes.count {
        case 4:
            self.init(ipv4: bytes.reduce(0) { $0 << 8 | UInt32($1) })
        case 16:
            let first = bytes.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            let second = bytes.dropFirst(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            self.init(high: first, low: second)
        default:
            return nil
        }
    }

    /// Parses an address strictly: IPv4 as exactly four decimal parts of 0–255 without
    /// leading zeros (`192.0.2.1`), or IPv6 in RFC 4291 text (`2001:db8::1`,
    /// `::ffff:192.0.2.1`). Nothing else: no surrounding space, brackets, port, zone
    /// (`%eth0`) or prefix length. This is what `X-Forwarded-For` entries and configured
    /// proxies are held to: a value that is not exactly an address is not trusted.
    public init?(_ text: some StringProtocol) {
        // The longest IPv6 text is 45 characters; anything longer is not an address, and
        // the check keeps inet_pton from scanning long hostile input.
        let count = text.utf8.count
        guard count >= 2, count <= 45 else { return nil }
        var isIPv6 = false
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."): continue
            case UInt8(ascii: "a")...UInt8(ascii: "f"), UInt8(ascii: "A")...UInt8(ascii: "F"), UInt8(ascii: ":"):
                isIPv6 = true
            default:
                return nil
            }
        }
        var bytes = (UInt64(0), UInt64(0))
        let parsed = withUnsafeMutableBytes(of: &bytes) { buffer in
            String(text).withCString { inet_pton(isIPv6 ? AF_INET6 : AF_INET, $0, buffer.baseAddress) }
        }
        guard parsed == 1 else { return nil }
        let raw = withUnsafeBytes(of: &bytes) { Array($0) }
        self.init(bytes: isIPv6 ? raw : Array(raw.prefix(4)))
    }

    /// Whether this is an IPv4 address (or the IPv4-mapped form of one).
    public var isIPv4: Bool { high == 0 && low >> 32 == 0xFFFF }

    /// The 16 bytes in network order.
    public var bytes: [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * $0)) }
            + (0..<8).map { UInt8(truncatingIfNeeded: low >> (56 - 8 * $0)) }
    }

    /// The address with only its first `length` bits kept (`length` in 0...128, counted on
    /// the 128-bit form: an IPv4 /24 is 96 + 24).
    public func masked(toPrefix length: Int) -> IPAddress {
        let length = min(max(length, 0), 128)
        let highMask: UInt64 = length >= 64 ? .max : (length == 0 ? 0 : .max << (64 - length))
        let lowMask: UInt64 = length <= 64 ? 0 : (length == 128 ? .max : .max << (128 - length))
        return IPAddress(high: high & highMask, low: low & lowMask)
    }

    /// What counts as one client for per-client limits: an IPv4 address is one client, an
    /// IPv6 client is its /64. A single subscriber, host or VM usually gets a whole /64 and
    /// can pick any of its 2^64 addresses, so limits per IPv6 address would limit nothing.
    public var client: IPAddress { isIPv4 ? self : masked(toPrefix: 64) }

    /// `client` as text for keys that outlive the process (rate-limit buckets): the IPv4
    /// address (`192.0.2.1`), or the IPv6 /64 (`2001:db8:1:2::/64`).
    public var clientText: String { isIPv4 ? description : client.description + "/64" }

    /// The canonical text: dotted decimal for IPv4, RFC 5952 for IPv6 (lower case, longest
    /// zero run as `::`), so one address is always written one way.
    public var description: String {
        var text = [CChar](repeating: 0, count: 64)
        var raw = bytes
        let written: UnsafePointer<CChar>? = raw.withUnsafeMutableBytes { buffer in
            guard let base = buffer.baseAddress else { return nil }
            return isIPv4
                ? inet_ntop(AF_INET, base + 12, &text, socklen_t(text.count))
                : inet_ntop(AF_INET6, base, &text, socklen_t(text.count))
        }
        guard written != nil else { return "" }  // cannot fail: the buffer fits any address
        return String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// A block of addresses in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`), or one address.
public struct IPNetwork: Hashable, Sendable, CustomStringConvertible {
    /// The first address of the block.
    public let address: IPAddress
    /// The prefix length on the 128-bit form (an IPv4 /8 is 104).
    public let prefixLength: Int

    /// Parses `ADDRESS/LENGTH` or a bare `ADDRESS` (a block of one). Strict: the length is
    /// 0–32 for IPv4 and 0–128 for IPv6, written in decimal without sign or leading zero,
    /// and the address has no bits set past the prefix (`10.0.0.1/8` is refused: it is
    /// almost always a typo for a single address or for `10.0.0.0/8`).
    public init?(_ text: some StringProtocol) {
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let address = IPAddress(parts[0]) else { return nil }
        let maximum = address.isIPv4 ? 32 : 128
        var length = maximum
        if parts.count == 2 {
            let digits = parts[1]
            guard (1...3).contains(digits.utf8.count), digits.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
                digits.utf8.count == 1 || digits.utf8.first != UInt8(ascii: "0"), let value = Int(digits),
                value <= maximum
            else { return nil }
            length = value
        }
        let prefix = address.isIPv4 ? 96 + length : length
        guard address.masked(toPrefix: prefix) == address else { return nil }
        self.address = address
        prefixLength = prefix
    }

    /// Whether `candidate` is in the block.
    @inline(__always)
    public func contains(_ candidate: IPAddress) -> Bool {
        candidate.masked(toPrefix: prefixLength) == address
    }

    /// `10.0.0.0/8`, `2001:db8::/32`.
    public var description: String {
        "\(address)/\(address.isIPv4 ? prefixLength - 96 : prefixLength)"
    }
}

/// The reverse proxies whose `X-Forwarded-For` the server believes
/// (`TRUNK_SYNC_TRUSTED_PROXIES`). Empty by default: then every peer is the client, and
/// nothing here runs per request.
public struct TrustedProxies: Sendable, Equatable {
    /// The blocks trusted.
    public let networks: [IPNetwork]

    /// At most this many `X-Forwarded-For` entries are examined from the right: a chain of
    /// trusted proxies is a few hops, and a longer list of trusted addresses is not worth
    /// walking (the peer is used instead).
    public static let maximumHops = 32

    /// Trusts `networks`.
    public init(_ networks: [IPNetwork] = []) { self.networks = networks }

    /// Whether no proxy is trusted.
    public var isEmpty: Bool { networks.isEmpty }

    /// Whether `address` is a trusted proxy.
    public func contains(_ address: IPAddress) -> Bool {
        for network in networks where network.contains(address) { return true }
        return false
    }

    /// The client of a request that came from a trusted proxy, from its `X-Forwarded-For`
    /// field values (in the order received; repeated fields are one list, RFC 9110 §5.3):
    /// the rightmost address that is not a trusted proxy, since every entry left of the
    /// nearest untrusted one was written by the client itself and proves nothing.
    ///
    /// Returns nil (use the peer) when there is no entry, when the entry that decides is not
    /// strictly an address (garbage, a port, an empty entry), or when more than
    /// `maximumHops` entries are trusted. When every entry is a trusted proxy, the leftmost
    /// one is the client (the request started inside the trusted network).
    public func forwardedClient(_ values: [String]) -> IPAddress? {
        var hops = 0
        var leftmost: IPAddress? = nil
        for value in values.reversed() {
            for entry in value.utf8.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false).reversed() {
                hops += 1
                guard hops <= Self.maximumHops else { return nil }
                guard let address = IPAddress(Substring(Self.trimmed(entry))) else { return nil }
                if !contains(address) { return address }
                leftmost = address
            }
        }
        return leftmost
    }

    /// `entry` without the optional whitespace (spaces, tabs) around list elements.
    private static func trimmed(_ entry: Substring.UTF8View.SubSequence) -> Substring.UTF8View.SubSequence {
        var slice = entry
        while let first = slice.first, first == 0x20 || first == 0x09 { slice = slice.dropFirst() }
        while let last = slice.last, last == 0x20 || last == 0x09 { slice = slice.dropLast() }
        return slice
    }
}
