import Foundation

/// Where a client keeps its state, under the app's storage directory:
///
///     <storageDirectory>/
///       <server>/                      one per server URL, e.g. sync.example.com-443-5f3a9c1e
///         lock                         held (flock) by the one client that has it open
///         session.json                 the signed-in user's session (mode 0600)
///         users/<user id>/             one per user who signed in on this device
///           outbox.log                 recorded events not yet on the server
///           quarantine.log             events the server refused
///           cursor.json                {"after": N}: the seq of the last applied event
///
/// So outboxes and cursors are per server and per user: signing in as another user, or
/// pointing the app at another server, never mixes them.
struct StorageLayout {
    let serverDirectory: URL

    init(storageDirectory: URL, server: URL) {
        serverDirectory = storageDirectory.appendingPathComponent(Self.key(for: server), isDirectory: true)
    }

    var lockFile: URL { serverDirectory.appendingPathComponent("lock") }
    var sessionFile: URL { serverDirectory.appendingPathComponent("session.json") }

    func userDirectory(_ user: UUID) -> URL {
        serverDirectory.appendingPathComponent("users", isDirectory: true)
            .appendingPathComponent(user.uuidString.lowercased(), isDirectory: true)
    }

    /// A readable, file-name-safe key: host, port and a hash of the whole URL (so
    /// `https://a/x` and `https://a/y` differ).
    static func key(for server: URL) -> String {
        let normalized = server.absoluteString.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "/"))
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325  // FNV-1a, 64 bits
        for byte in normalized.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01B3
        }
        let host = (server.host ?? "server").lowercased().map { $0.isLetter || $0.isNumber || $0 == "." ? $0 : "_" }
        let port = server.port ?? (server.scheme?.lowercased() == "http" ? 80 : 443)
        let hex = String(hash, radix: 16)
        return "\(String(host))-\(port)-\(String(repeating: "0", count: 16 - hex.count) + hex)"
    }
}

/// The session as the client keeps it.
struct StoredSession: Codable, Equatable, Sendable {
    var userID: UUID
    var email: String?
    var accessToken: String
    var refreshToken: String
    /// When the access token expires, on this device's clock (`expires_in` after it
    /// arrived: the device's clock may be off from the server's).
    var expiresAt: Date
    /// The token's lifetime in seconds.
    var lifetime: TimeInterval

    enum CodingKeys: String, CodingKey {
        case userID = "user_id"
        case email
        case accessToken = "access_token"
        case refreshToken = "refresh_token"
        case expiresAt = "expires_at"
        case lifetime
    }

    /// Reads a session answer (`/auth/v1/verify`, `/auth/v1/token`) received at `now`.
    static func parse(_ body: Data, receivedAt now: Date) throws -> StoredSession {
        guard let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any],
            let access = object["access_token"] as? String, let refresh = object["refresh_token"] as? String,
            let user = object["user"] as? [String: Any], let idText = user["id"] as? String,
            let id = UUID(uuidString: idText)
        else {
            throw TrunkSyncError.invalidResponse("not a session")
        }
        let lifetime = (object["expires_in"] as? NSNumber)?.doubleValue ?? 3600
        return StoredSession(
            userID: id, email: user["email"] as? String, accessToken: access, refreshToken: refresh,
            expiresAt: now.addingTimeInterval(lifetime), lifetime: lifetime)
    }

    static func load(_ url: URL) throws -> StoredSession? {
        guard let bytes = try FileSystem.read(url) else { return nil }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .millisecondsSince1970
        do {
            return try decoder.decode(StoredSession.self, from: Data(bytes))
        } catch {
            // Written atomically, so never torn; unreadable means another format: signed out.
            return nil
        }
    }

    func save(_ url: URL) throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .millisecondsSince1970
        encoder.outputFormatting = [.sortedKeys]
        try FileSystem.writeAtomically(Array(try encoder.encode(self)), to: url)
    }
}

/// One user's outbox, quarantine and cursor.
final class UserStore {
    let userID: UUID
    let directory: URL
    let outbox: EventLog
    let quarantine: EventLog
    private(set) var cursor: Int64

    var cursorFile: URL { directory.appendingPathComponent("cursor.json") }

    init(userID: UUID, directory: URL) throws {
        self.userID = userID
        self.directory = directory
        try FileSystem.createDirectory(directory)
        let outbox = try EventLog(url: directory.appendingPathComponent("outbox.log"))
        let quarantine = try EventLog(url: directory.appendingPathComponent("quarantine.log"))
        // An event in both is a move a crash cut short: finish it. Into the quarantine
        // (`moveToQuarantine`: written there first, then dropped from the outbox), unless the
        // outbox's copy is a requeue of this very stay (`requeue`: written to the outbox
        // first, then dropped from the quarantine): then back out of it.
        var intoQuarantine: [UUID] = []
        var outOfQuarantine: [UUID] = []
        for id in quarantine.ids where outbox.contains(id) {
            let stay = try quarantine.read(id).quarantineID?.uuidString ?? ""
            if try outbox.read(id).requeuedFrom == stay {
                outOfQuarantine.append(id)
            } else {
                intoQuarantine.append(id)
            }
        }
        try outbox.remove(intoQuarantine, as: .drop)
        try quarantine.remove(outOfQuarantine, as: .drop)
        self.outbox = outbox
        self.quarantine = quarantine
        cursor = 0
        if let bytes = try FileSystem.read(directory.appendingPathComponent("cursor.json")),
            let object = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any],
            let after = (object["after"] as? NSNumber)?.int64Value
        {
            cursor = after
        }
    }

    /// Stores the cursor durably (write, sync, rename).
    func saveCursor(_ after: Int64) throws {
        try FileSystem.writeAtomically(Array("{\"after\":\(after)}".utf8), to: cursorFile)
        cursor = after
    }

    func removeCursor() throws {
        try FileSystem.remove(cursorFile)
        cursor = 0
    }

    /// Moves events to the quarantine (durable there before they leave the outbox), each
    /// stay with an id of its own (see `requeue`).
    func moveToQuarantine(_ events: [StoredEvent]) throws {
        try quarantine.append(
            events.map { event in
                var event = event
                event.quarantineID = UUID()
                event.requeuedFrom = nil
                return event
            })
        try outbox.remove(events.map(\.clientID), as: .drop)
    }

    /// Moves quarantined events back to the outbox, same ids; ids not in the quarantine are
    /// ignored. One synced write does it (`writeRequeue`): from then on, a crash before the
    /// quarantine's drop is finished by the next open (`init`), the events in the outbox.
    func requeue(_ ids: [UUID]) throws {
        try quarantine.remove(try writeRequeue(ids), as: .drop)
    }

    /// `requeue`'s one step that counts: the events appended to the outbox, each marked with
    /// the stay it comes from. Returns their ids.
    func writeRequeue(_ ids: [UUID]) throws -> [UUID] {
        var events = try ids.filter { quarantine.contains($0) }.map { try quarantine.read($0) }
        for index in events.indices {
            events[index].requeuedFrom = events[index].quarantineID?.uuidString ?? ""
            events[index].quarantineID = nil
            events[index].rejection = nil
        }
        try outbox.append(events)
        return events.map(\.clientID)
    }

    func close() {
        outbox.close()
        quarantine.close()
    }
}
