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
///         users/<user id>.cleanup      a removal of that user's data not finished yet
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

    /// The folders the system may empty on its own: the user's caches folder and the
    /// temporary folder.
    static var purgeableFolders: [URL] {
        FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask) + [FileManager.default.temporaryDirectory]
    }

    /// Whether `directory` is one of `folders` (by default `purgeableFolders`) or inside one.
    static func isPurgeable(_ directory: URL, folders: [URL] = purgeableFolders) -> Bool {
        let resolved = directory.resolvingSymlinksInPath().standardizedFileURL.path
        return folders.contains { folder in
            let root = folder.resolvingSymlinksInPath().standardizedFileURL.path
            return resolved == root || resolved.hasPrefix(root.hasSuffix("/") ? root : root + "/")
        }
    }

    var usersDirectory: URL { serverDirectory.appendingPathComponent("users", isDirectory: true) }

    func userDirectory(_ user: UUID) -> URL {
        usersDirectory.appendingPathComponent(user.uuidString.lowercased(), isDirectory: true)
    }

    /// `users/<user id>.cleanup`: what of a user's data is to go (`Cleanup`), written (and
    /// synced) before any of it is removed, removed once that is done. What a failure or a
    /// crash left undone is done when the storage is next opened (`init` of the client), or
    /// that user next signs in, before anything of theirs is read; never signed in from a
    /// session of a user with a clean-up pending.
    func cleanupMarker(_ user: UUID) -> URL {
        usersDirectory.appendingPathComponent(user.uuidString.lowercased() + Self.cleanupSuffix)
    }

    static let cleanupSuffix = ".cleanup"

    /// What goes of a user's data, decided before any of it is removed.
    enum Cleanup: String {
        /// The cursor (`signOut`).
        case forget
        /// The cursor, the outbox with any unsent events, the quarantine
        /// (`signOut(discardingUnsentEvents: true)`).
        case discard
        /// Everything (`deleteAccount`).
        case delete
    }

    /// Writes (durably) that `cleanup` of `user`'s data is to happen.
    func markCleanup(_ cleanup: Cleanup, of user: UUID) throws {
        try FileSystem.writeAtomically(Array(cleanup.rawValue.utf8), to: cleanupMarker(user))
    }

    /// Users with a clean-up pending (their `cleanupMarker`s).
    func pendingCleanups() -> [UUID] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: usersDirectory.path)) ?? []
        return names.compactMap { name in
            guard name.hasSuffix(Self.cleanupSuffix) else { return nil }
            return UUID(uuidString: String(name.dropLast(Self.cleanupSuffix.count)))
        }
    }

    /// Does the clean-up pending for `user` (if any), then removes its marker; throws when
    /// something stays (the marker too, for the next try). An unreadable marker is a
    /// `delete`: nothing of that user's is kept that was meant to go.
    func finishCleanup(of user: UUID, remove: (URL) throws -> Void = FileSystem.remove) throws {
        let marker = cleanupMarker(user)
        guard let bytes = try FileSystem.read(marker) else { return }
        try clean(Cleanup(rawValue: String(decoding: bytes, as: UTF8.self)) ?? .delete, of: user, remove: remove)
    }

    /// Removes what `cleanup` takes of `user`'s data, then the clean-up marker (if any).
    func clean(_ cleanup: Cleanup, of user: UUID, remove: (URL) throws -> Void = FileSystem.remove) throws {
        switch cleanup {
        case .forget: try remove(userDirectory(user).appendingPathComponent(UserStore.cursorFileName))
        case .discard, .delete: try remove(userDirectory(user))
        }
        try remove(cleanupMarker(user))
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

    static let cursorFileName = "cursor.json"
    var cursorFile: URL { directory.appendingPathComponent(Self.cursorFileName) }

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
            // A copy found damaged is set aside (`EventLog.read`): the other one stays.
            guard let inQuarantine = try quarantine.read(id), let inOutbox = try outbox.read(id) else { continue }
            if inOutbox.requeuedFrom == inQuarantine.quarantineID?.uuidString ?? "" {
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
        if let bytes = try FileSystem.read(cursorFile),
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
        // Ids not in the quarantine, or whose frame there was found damaged (set aside), are
        // left out.
        var events = try ids.compactMap { try quarantine.read($0) }
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
