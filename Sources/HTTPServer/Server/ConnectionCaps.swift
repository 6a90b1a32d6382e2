import Synchronization

/// The connection caps every loop of a server shares: `maxConnections` over all loops, and
/// `maxConnectionsPerClient` per client whichever loops its connections landed on. One
/// atomic add per accept and per close, and (with a per-client cap) one short lock taken for
/// a hash look-up; a client's entry goes when its last connection does, so the table never
/// holds more entries than there are connections.
final class ConnectionCaps: Sendable {
    private let maxConnections: Int
    private let maxPerClient: Int
    private let open = Atomic<Int>(0)
    private let perClient = Mutex<[IPAddress: Int]>([:])

    init(maxConnections: Int, maxPerClient: Int) {
        self.maxConnections = maxConnections
        self.maxPerClient = maxPerClient
    }

    /// Open connections over every loop.
    var openConnections: Int { open.load(ordering: .relaxed) }

    /// Takes a slot for a new connection; false when the server is full.
    func takeConnection() -> Bool {
        if open.wrappingAdd(1, ordering: .relaxed).newValue <= maxConnections { return true }
        open.wrappingSubtract(1, ordering: .relaxed)
        return false
    }

    /// Gives back a slot taken by `takeConnection`.
    func releaseConnection() { open.wrappingSubtract(1, ordering: .relaxed) }

    /// Takes one of `client`'s slots; false when it has `maxConnectionsPerClient` open.
    func takeClientSlot(_ client: IPAddress) -> Bool {
        perClient.withLock { table in
            let count = table[client, default: 0]
            guard count < maxPerClient else { return false }
            table[client] = count + 1
            return true
        }
    }

    /// Gives back a slot taken by `takeClientSlot`.
    func releaseClientSlot(_ client: IPAddress) {
        perClient.withLock { table in
            guard let count = table[client] else { return }
            if count <= 1 { table.removeValue(forKey: client) } else { table[client] = count - 1 }
        }
    }
}
