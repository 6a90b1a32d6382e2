import Foundation

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The client of a trunk-sync server: sign-in with a mailed code, a durable outbox of
/// recorded events, push and paged pull, live updates.
///
/// ```swift
/// let client = try TrunkSyncClient(url: serverURL, storageDirectory: directory)
/// try await client.sendCode(to: "me@example.com")
/// try await client.verify(email: "me@example.com", code: "123456")
/// let id = try await client.record(type: "sprout_planted", payload: ["name": "Oak"])
/// let report = try await client.sync { events in /* apply */ }
/// ```
///
/// One client per server URL and storage directory: a second one (in this process or
/// another) throws `TrunkSyncError.storageInUse` until the first is closed (`close()`) or
/// its process ends. See docs/clients.md, "Client library", for the guarantees.
public actor TrunkSyncClient {
    public let url: URL
    public nonisolated let configuration: Configuration
    /// False when the storage directory is inside a folder the system may empty on its own
    /// (the caches folder, the temporary folder: iOS purges them when space runs low), where
    /// unsent events could go with it. Keep the storage in Application Support (or another
    /// folder nothing deletes), and tell the user when this is false.
    public nonisolated let storagePersisted: Bool

    private let layout: StorageLayout
    private let transport = HTTPTransport()
    private var lock: DurableFile?
    private var session: StoredSession?
    private var store: UserStore?
    private var refreshTask: Task<StoredSession, Error>?
    private var syncBusy = false
    private var syncWaiters: [CheckedContinuation<Void, Never>] = []
    /// Counts sign-ins of another user and sign-outs: a request started before one does not
    /// go on after it.
    private var userGeneration = 0
    /// Requests waiting out a backoff, woken early when another user signs in or the user
    /// signs out.
    private var backoffWaits: [Int: CheckedContinuation<Void, Never>] = [:]
    private var backoffWaitCount = 0
    /// Whether a `sync` is pulling, and the live loops waiting for it to end (`nextLivePage`).
    private var pulling = false
    private var pullWaits: [Int: CheckedContinuation<Void, Never>] = [:]
    private var pullWaitCount = 0
    private nonisolated let signedIn = SignedInState()
    /// How the user's data is removed (`signOut`, `deleteAccount`); tests make it fail.
    var removeItem: @Sendable (URL) throws -> Void = { try FileSystem.remove($0) }

    /// Opens (creating if needed) the client's storage for `url` under `storageDirectory`.
    /// A session stored there by an earlier run is used: the user stays signed in across
    /// restarts. When that user's outbox cannot be opened (say a newer version of the app
    /// wrote a record this one cannot read), the client opens all the same, signed in: the
    /// calls that need the outbox throw `.storage` (trying again each time), and `signOut`
    /// works.
    /// - Throws: `TrunkSyncError.storageInUse` when another client has this storage open,
    ///   `.storage` when it cannot be read or written.
    public init(url: URL, storageDirectory: URL, configuration: Configuration = Configuration()) throws {
        self.url = url
        self.configuration = configuration
        layout = StorageLayout(storageDirectory: storageDirectory, server: url)
        storagePersisted = !StorageLayout.isPurgeable(storageDirectory)
        do {
            try FileSystem.createDirectory(layout.serverDirectory)
            let lock = try DurableFile(path: layout.lockFile.path)
            guard try lock.tryLock() else {
                lock.close()
                throw TrunkSyncError.storageInUse(layout.serverDirectory.path)
            }
            self.lock = lock
            var stored = try StoredSession.load(layout.sessionFile)
            // Removals of users' data a failure or a crash cut short (`signOut`,
            // `deleteAccount`): never signed in as such a user; what is to go goes now (or at
            // the next open, or that user's next sign-in, when it cannot).
            for user in layout.pendingCleanups() {
                if stored?.userID == user {
                    stored = nil
                    try? FileSystem.remove(layout.sessionFile)
                }
                try? layout.finishCleanup(of: user)
            }
            if let session = stored {
                self.session = session
                signedIn.set(User(id: session.userID, email: session.email))
                // Unreadable now: `currentStore()` tries again when a call needs it.
                store = try? Self.openStore(session.userID, layout, configuration)
            }
        } catch let error as TrunkSyncError {
            throw error
        } catch {
            throw TrunkSyncError.storage(String(describing: error))
        }
    }

    /// Opens a user's outbox, quarantine and cursor, telling the observer what it repaired,
    /// then and whenever damage is found later (`EventLog.setAsideDamage`).
    private static func openStore(_ user: UUID, _ layout: StorageLayout, _ configuration: Configuration) throws
        -> UserStore
    {
        let store = try UserStore(userID: user, directory: layout.userDirectory(user))
        let observer = configuration.observer
        for recovery in [store.outbox.recovery, store.quarantine.recovery].compactMap({ $0 }) {
            observer?(.logRecovered(recovery))
        }
        for log in [store.outbox, store.quarantine] { log.onRecovery = { observer?(.logRecovered($0)) } }
        return store
    }

    /// The signed-in user's store, opened now when it could not be before (`init`).
    private func currentStore() throws -> UserStore {
        guard let session else { throw TrunkSyncError.notSignedIn }
        if let store { return store }
        let opened = try storage { try Self.openStore(session.userID, layout, configuration) }
        store = opened
        return opened
    }

    /// Releases the storage (files and lock); the client is unusable afterwards. Also
    /// happens when the client is deinitialized or the process ends.
    public func close() {
        store?.close()
        store = nil
        session = nil
        lock?.close()
        lock = nil
        signedIn.set(nil)
    }

    // MARK: - Sign-in

    /// Whether a user is signed in (also right after a restart, from the stored session).
    public nonisolated var isSignedIn: Bool { signedIn.user != nil }

    /// The signed-in user, if any.
    public nonisolated var currentUser: User? { signedIn.user }

    /// Mails a 6-digit sign-in code to `email` (`POST /auth/v1/otp`).
    /// - Throws: `.rateLimited` when a code was sent to the address within the last minute
    ///   (`retryAfter` says when to offer "send again").
    public func sendCode(to email: String) async throws {
        let body = try JSONSerialization.data(withJSONObject: ["email": email, "create_user": true])
        // Not retried after a network failure: the mail may have gone out, and a second
        // request would be refused for a minute anyway.
        let answer = try await send(
            "POST", "/auth/v1/otp", body: Array(body), retry: RetryRules(network: false, statuses: [503]))
        guard answer.status == 200 else { throw failure(answer) }
    }

    /// Signs in with the code from the mail (`POST /auth/v1/verify`) and stores the session.
    /// Signing in as another user than before keeps that user's outbox and cursor apart: the
    /// first user's requests still running end with `.notSignedIn` (a retry waiting out a
    /// backoff at once), and the switch happens once a running `sync`/`push` ended.
    /// - Throws: `.invalidCode` for a wrong, expired or used code.
    public func verify(email: String, code: String) async throws {
        try ensureOpen()
        let body = try JSONSerialization.data(withJSONObject: ["email": email, "token": code, "type": "email"])
        let answer = try await send(
            "POST", "/auth/v1/verify", body: Array(body), retry: RetryRules(network: false, statuses: [429, 503]))
        if answer.status == 403 || answer.serverError.code == "otp_expired" { throw TrunkSyncError.invalidCode }
        guard answer.status == 200 else { throw failure(answer) }
        try answer.checkWhole("the sign-in")
        let newSession = try StoredSession.parse(answer.body, receivedAt: configuration.now())
        if newSession.userID != session?.userID {
            // Requests of the user signed in until now end (`notSignedIn`) at their next try
            // instead of going on with the new user's token, and end now when they are
            // waiting out a backoff; the sync they belong to is over before the switch.
            userGeneration += 1
            endBackoffWaits()
        }
        await acquireSync()
        defer { releaseSync() }
        try storage {
            // A removal of this user's data left undone (`deleteAccount`) is done first:
            // nothing meant to go is read again.
            if store?.userID != newSession.userID { try layout.finishCleanup(of: newSession.userID) }
            let newStore =
                store?.userID == newSession.userID
                ? store! : try Self.openStore(newSession.userID, layout, configuration)
            try newSession.save(layout.sessionFile)
            if newStore !== store { store?.close() }
            store = newStore
            session = newSession
        }
        signedIn.set(User(id: newSession.userID, email: newSession.email ?? email))
    }

    /// A valid access token for the signed-in user (refreshed first when it is about to
    /// expire), for calling other APIs that trust the server's tokens.
    public func accessToken() async throws -> String {
        try await validAccessToken()
    }

    /// Refreshes the session now (`POST /auth/v1/token`), whatever its expiry.
    public func refreshSession() async throws {
        guard let current = session else { throw TrunkSyncError.notSignedIn }
        _ = try await refreshed(replacing: current.accessToken, proactive: true)
    }

    /// Signs out: revokes the session on the server (`POST /auth/v1/logout?scope=local`)
    /// and removes the stored session and the user's cursor.
    ///
    /// Unsent events are not lost silently: the outbox is pushed first (one quick try);
    /// what could not be sent stays in the user's outbox on this device, is reported in
    /// `SignOutResult.unsentEvents`, and is pushed when the same user signs in again. Pass
    /// `discardingUnsentEvents: true` to delete the user's outbox and quarantine instead.
    /// The local session is removed even when the server cannot be reached.
    ///
    /// It signs out also when the user's outbox cannot be read (`unsentEvents` is then nil;
    /// the outbox stays) or the storage refuses a removal: what is to go is written down
    /// first (`users/<id>.cleanup`) and done at the next open, or the user's next sign-in,
    /// before anything of theirs is read.
    ///
    /// A `sync`/`push` in progress (and a token refresh it started) ends first, with
    /// `.notSignedIn` at its next try: one waiting out a backoff ends at once, so signing out
    /// never waits for its retries. What it had not sent stays in the outbox, as above. The
    /// push and logout of `signOut` itself try twice each, a refresh they need included.
    @discardableResult
    public func signOut(discardingUnsentEvents: Bool = false) async throws -> SignOutResult {
        if session != nil {
            // The user's requests still running end (`notSignedIn`) at their next try, now
            // when they are waiting out a backoff, so the sync they belong to ends soon.
            userGeneration += 1
            endBackoffWaits()
        }
        // After any sync in progress, so none writes a cursor or outbox once they are gone.
        await acquireSync()
        defer { releaseSync() }
        guard let userID = session?.userID else {
            return SignOutResult(unsentEvents: 0, quarantinedEvents: 0, serverSessionRevoked: false)
        }
        // Nil when the user's outbox cannot be read: signed out all the same.
        let store = try? currentStore()
        if !discardingUnsentEvents, let store, store.outbox.count > 0, let user = try? signedInUser() {
            var report = SyncReport()
            try? await pushOutbox(store, user, into: &report, retry: RetryRules(maxAttempts: 2))
        }
        var revoked = false
        if session != nil {
            do {
                let answer = try await send(
                    "POST", "/auth/v1/logout", query: [URLQueryItem(name: "scope", value: "local")], bearer: true,
                    retry: RetryRules(maxAttempts: 2))
                // The server's own answer only: its 204, or its JSON 401/403 (it no longer knows
                // the session, which is what we want). A page of something in the way (a
                // proxy's 401 asking for its own credentials, a captive portal's 200) says
                // nothing of the session, which is still live on the server.
                revoked =
                    ((200..<300).contains(answer.status) && answer.body.isEmpty)
                    || ((answer.status == 401 || answer.status == 403) && answer.isServerError)
            } catch TrunkSyncError.sessionExpired {
                revoked = true
            } catch {
                revoked = false
            }
        }
        let result = SignOutResult(
            unsentEvents: store?.outbox.count, quarantinedEvents: store?.quarantine.count, serverSessionRevoked: revoked
        )
        // The cursor goes (with `discardingUnsentEvents`, the outbox and quarantine too); what
        // the storage refuses now is done at the next open or the user's next sign-in.
        _ = signOutAndCleanUp(discardingUnsentEvents ? .discard : .forget, of: userID)
        return result
    }

    // MARK: - Account

    /// Mails the signed-in user a fresh 6-digit confirmation code (`POST
    /// /auth/v1/reauthenticate`), which `deleteAccount(code:)` takes. Ask the user to type it
    /// from the mail.
    /// - Throws: `.notSignedIn`, `.sessionExpired`; `.rateLimited` when a code was sent
    ///   within the last minute (`retryAfter` says when to offer "send again").
    public func reauthenticate() async throws {
        // Not retried after a network failure, as `sendCode`: the mail may have gone out.
        let answer = try await send(
            "POST", "/auth/v1/reauthenticate", bearer: true, retry: RetryRules(network: false, statuses: [503]))
        guard answer.status == 200 else { throw failure(answer) }
    }

    /// Deletes the signed-in user's account and all their data on the server (`DELETE
    /// /sync/v1/account`) with the code from `reauthenticate()`, then everything this client
    /// stored for the user: session, cursor, outbox (events not sent yet are gone with the
    /// account) and quarantine. Every session of the user, on every device, ends.
    ///
    /// The deletion is sent once. When its answer does not come (the connection broke, the
    /// request timed out, a `5xx`: the server may have deleted the account), it never claims
    /// the deletion: it throws `.outcomeUnknown`, and signs out and removes the user's data here
    /// all the same (after trying to revoke the session), so nothing of it stays readable for
    /// the next person using the device. A removal that fails here is finished when the
    /// storage is next opened (or the user next signs in), before anything of theirs is read.
    /// - Throws: `.invalidCode` for a wrong, expired or used code, and any other refusal of the
    ///   server (a `4xx`; `.rateLimited`): nothing was deleted, still signed in.
    ///   `.outcomeUnknown` when the answer was lost (signed out, data here removed);
    ///   `.notSignedIn`, `.sessionExpired`; `.network` when a token refresh before it failed
    ///   or the deletion cannot have gone out (no network, the connection refused: nothing
    ///   changed); `.storage` when the account is deleted but its data here could not
    ///   be removed yet (signed out; it goes at the next open).
    public func deleteAccount(code: String) async throws {
        await acquireSync()
        defer { releaseSync() }
        let user = try signedInUser()
        let body = try JSONSerialization.data(withJSONObject: ["code": code])
        // A token refresh first, on its own: one that fails has sent nothing.
        _ = try await validAccessToken(for: user)
        let probe = ExchangeProbe()
        let answer: HTTPAnswer
        do {
            // Never repeated: after a lost answer a second try could only find the session
            // gone (the account deleted) and sign out keeping the data.
            answer = try await send(
                "DELETE", "/sync/v1/account", body: Array(body), bearer: true, as: user,
                retry: RetryRules(network: false, statuses: []), probe: probe)
        } catch {
            // Refused before it went out (a refresh, a sign-out meanwhile): nothing deleted.
            guard probe.awaitingAnswer else { throw error }
            throw await forgetAfterUnknownDeletion(user, reason: String(describing: error))
        }
        switch answer.status {
        case 204:
            if let failure = signOutAndCleanUp(.delete, of: user.id) {
                throw TrunkSyncError.storage(
                    "the account is deleted; its data on this device could not be removed yet (\(failure)): "
                        + "that happens when the storage is next opened")
            }
        case 400..<500:
            // The server's own refusal: nothing deleted.
            if answer.serverError.code == "reauthentication_not_valid" { throw TrunkSyncError.invalidCode }
            throw failure(answer)
        default:
            // A 5xx (a gateway that lost the server's answer, a database connection lost at
            // the commit) or anything but the server's 204: the account may be gone.
            throw await forgetAfterUnknownDeletion(user, reason: answer.serverError.description)
        }
    }

    /// After a deletion whose answer was lost: tries once to revoke the session, signs out and
    /// removes the user's data here. The error `deleteAccount` throws.
    private func forgetAfterUnknownDeletion(_ user: PinnedUser, reason: String) async
        -> TrunkSyncError
    {
        if isCurrent(user) {
            _ = try? await send(
                "POST", "/auth/v1/logout", query: [URLQueryItem(name: "scope", value: "local")], bearer: true, as: user,
                retry: RetryRules(network: false, statuses: [], maxAttempts: 1))
        }
        // Also when a sign-out began meanwhile (it waits for this call): it would keep the data.
        let failure = signOutAndCleanUp(.delete, of: user.id)
        return .outcomeUnknown(
            "the answer to the account's deletion was lost (\(reason)): the account may or may not be deleted; "
                + "signed out, and its data on this device "
                + (failure.map { "removed at the next open (now: \($0))" } ?? "removed")
                + ". Sign in again to see whether it still exists")
    }

    /// Signs `user` out and removes `cleanup` of their data: the clean-up marker first
    /// (`StorageLayout.cleanupMarker`), then the session, then the data, then the marker.
    /// Signed out in any case; returns what failed (the next open, or the user's next
    /// sign-in, does the rest).
    private func signOutAndCleanUp(_ cleanup: StorageLayout.Cleanup, of user: UUID) -> Error? {
        userGeneration += 1
        endBackoffWaits()
        if let store, store.userID == user {
            store.close()
            self.store = nil
        }
        if session?.userID == user {
            session = nil
            signedIn.set(nil)
        }
        var failure: Error?
        do { try layout.markCleanup(cleanup, of: user) } catch { failure = error }
        do { try removeItem(layout.sessionFile) } catch { failure = failure ?? error }
        do { try layout.clean(cleanup, of: user, remove: removeItem) } catch { failure = failure ?? error }
        return failure
    }

    /// Downloads a copy of the signed-in user's data (`GET /sync/v1/export`: one JSON object
    /// per line, the account first, then every event in order, then the end line
    /// `{"kind":"end","events":N,"last_seq":S}`) to the file `destination`. The body is
    /// written to a temporary file as it arrives, never held in memory, checked (`ExportCheck`:
    /// it ends with the end line, whose count and last `seq` are those of the event lines
    /// before it, and nothing after it; the event lines' seqs increase) and put in place of the file at `destination` in one
    /// step only once complete: after a failure `destination` is as it was, and no part of a
    /// cut copy is left anywhere. A directory there is never replaced.
    /// - Throws: `.notSignedIn`, `.sessionExpired`; `.server` with code `export_in_progress`
    ///   while another export of the user runs; `.network` when the download broke off;
    ///   `.incompleteExport` when the body ended without its end line or does not match it
    ///   (cut short where the HTTP framing was lost, e.g. by a proxy): try again;
    ///   `.invalidResponse` when a `200` is not NDJSON (a page of something in the way);
    ///   `.storage` when `destination` is a directory.
    public func exportData(to destination: URL) async throws {
        var refreshedAfter401 = false
        let user = try signedInUser()
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: destination.path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw TrunkSyncError.storage("\(destination.path) is a directory: the export is written to a file")
        }
        while true {
            let token = try await validAccessToken(for: user)
            var request = URLRequest(url: try endpoint("/sync/v1/export", []))
            request.httpMethod = "GET"
            request.timeoutInterval = configuration.requestTimeout
            request.setValue("application/x-ndjson", forHTTPHeaderField: "Accept")
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
            if let key = configuration.apiKey { request.setValue(key, forHTTPHeaderField: "apikey") }
            configuration.observer?(.request(method: "GET", path: "/sync/v1/export"))
            let answer: HTTPAnswer
            do {
                answer = try await transport.download(
                    request, to: destination, type: "application/x-ndjson", maxBodyBytes: configuration.maxAnswerBytes
                ) { _ = try ExportCheck.file($0) }
            } catch let failure as TransportFailure {
                throw TrunkSyncError.network(failure.description)
            } catch let incomplete as ExportCheck.Incomplete {
                throw TrunkSyncError.incompleteExport(
                    "\(incomplete); \(destination.path) is as it was")
            }
            // As for every request: only the server's own 401 is worth a refresh (a proxy's
            // 401 page says nothing of the token).
            if answer.status == 401, !refreshedAfter401, answer.isServerError {
                refreshedAfter401 = true
                _ = try await refreshed(replacing: token, proactive: false)
                continue
            }
            guard answer.status == 200 else { throw failure(answer) }
            // A 200 page of something in the way (a captive portal, a proxy set up wrong) is not
            // the copy: `destination` is left as it was. (It was put in its place.)
            guard answer.hasType("application/x-ndjson") else {
                throw TrunkSyncError.invalidResponse(
                    "the export was answered \(answer.header("content-type") ?? "without a type"), not NDJSON: "
                        + "not the server's copy; \(destination.path) is as it was")
            }
            return
        }
    }

    // MARK: - Recording

    /// Records an event: its payload (any `Encodable` that encodes as a JSON object; dates
    /// as ISO 8601) is written to the outbox and synced to disk before this returns. The
    /// returned id is the event's `client_id` for good: every push of it, after any retry,
    /// crash or restart, sends the same id, so the server stores it exactly once.
    /// - Throws: `.notSignedIn`; `.invalidEvent` for a type that is not 1–128 characters or
    ///   a payload that is not a JSON object of at most 64 KiB.
    public func record<Payload: Encodable & Sendable>(type: String, payload: Payload) throws -> UUID {
        let data: Data
        do {
            data = try Self.defaultEncoder().encode(payload)
        } catch {
            throw TrunkSyncError.invalidEvent("the payload cannot be encoded: \(error)")
        }
        return try record(type: type, payloadJSON: data)
    }

    /// Records an event whose payload is JSON text (an object), kept byte for byte.
    public func record(type: String, payloadJSON: Data) throws -> UUID {
        let store = try currentStore()
        let length = type.unicodeScalars.count
        guard (1...128).contains(length) else {
            throw TrunkSyncError.invalidEvent("type must be 1 to 128 characters (it has \(length))")
        }
        guard payloadJSON.count <= Self.maxPayloadBytes else {
            throw TrunkSyncError.invalidEvent(
                "the payload is \(payloadJSON.count) bytes; the server stores at most \(Self.maxPayloadBytes)")
        }
        guard (try? JSONSerialization.jsonObject(with: payloadJSON)) is [String: Any],
            String(data: payloadJSON, encoding: .utf8) != nil
        else {
            throw TrunkSyncError.invalidEvent("the payload must be a JSON object")
        }
        let event = StoredEvent(
            clientID: UUID(), type: type, payload: Array(payloadJSON),
            clientTimestamp: RFC3339.format(configuration.now()))
        try storage { try store.outbox.append([event]) }
        return event.clientID
    }

    /// The largest payload `record` takes (the server's limit, as stored).
    public static let maxPayloadBytes = 64 * 1024

    /// Events in the outbox: recorded, not yet on the server (quarantined ones excluded).
    public var pendingCount: Int { (try? currentStore())?.outbox.count ?? 0 }

    // MARK: - Quarantine

    /// Events the server refused (`SyncReport.rejected` named them), oldest first. They are
    /// never pushed again unless `requeueQuarantined` moves them back.
    public func quarantinedEvents() throws -> [QuarantinedEvent] {
        let store = try currentStore()
        return try storage {
            try store.quarantine.all().map { event in
                QuarantinedEvent(
                    clientID: event.clientID, type: event.type, payload: Data(event.payload),
                    clientTimestamp: RFC3339.parse(event.clientTimestamp) ?? Date(timeIntervalSince1970: 0),
                    rejection: event.rejection
                        ?? Rejection(
                            status: 0, code: "", field: "", reason: "", rejectedAt: Date(timeIntervalSince1970: 0)))
            }
        }
    }

    /// Deletes quarantined events for good (all of them when `ids` is nil).
    public func discardQuarantined(_ ids: [UUID]? = nil) throws {
        let store = try currentStore()
        try storage { try store.quarantine.remove(ids ?? store.quarantine.ids, as: .drop) }
    }

    /// Moves quarantined events back to the outbox, same ids, to be pushed again (after a
    /// server change that accepts them).
    public func requeueQuarantined(_ ids: [UUID]) throws {
        let store = try currentStore()
        try storage { try store.requeue(ids) }
    }

    // MARK: - Sync

    /// Pushes the outbox, then pulls every page of new events, handing each to `handler`.
    ///
    /// - The outbox goes in batches within the server's limits (`maxBatchEvents`,
    ///   `maxBatchBytes`); each stored batch is acknowledged in the outbox and never sent
    ///   again. A batch the server refuses (`400`) names the bad events: they move to the
    ///   quarantine, are reported in `SyncReport.rejected`, and the rest is pushed.
    /// - Pages are pulled until the server says there are no more. The cursor is stored
    ///   only after `handler` returns for a page, so a crash or a throwing handler means
    ///   that page comes again (handlers should skip `seq`s they applied).
    /// - Failures worth retrying are retried (`Configuration.retry`).
    ///
    /// Calls of `sync` run one at a time.
    @discardableResult
    public func sync(_ handler: @escaping @Sendable ([SyncEvent]) async throws -> Void) async throws -> SyncReport {
        await acquireSync()
        defer { releaseSync() }
        let store = try currentStore()
        let user = try signedInUser()
        var report = SyncReport()
        try await pushOutbox(store, user, into: &report, retry: RetryRules())
        try await pullAll(store, user, into: &report, handler)
        return report
    }

    /// Pushes the outbox only (see `sync`).
    @discardableResult
    public func push() async throws -> SyncReport {
        await acquireSync()
        defer { releaseSync() }
        let store = try currentStore()
        let user = try signedInUser()
        var report = SyncReport()
        try await pushOutbox(store, user, into: &report, retry: RetryRules())
        return report
    }

    /// The cursor: the `seq` of the last event applied on this device (0 before the first).
    public var cursor: Int64 { (try? currentStore())?.cursor ?? 0 }

    /// New events as they arrive, page by page, from the stored cursor on.
    ///
    /// Today this long-polls `GET /sync/v1/events?wait=` (`Configuration.longPollWait`):
    /// the server holds each request until the user's next push, so events from another
    /// device arrive within a round trip. (The server also offers `GET /sync/v1/stream`,
    /// Server-Sent Events; a feed over it would plug in at `LiveFeed`, not written yet.)
    ///
    /// The cursor of a page is stored when the loop asks for the next one, i.e. after the
    /// loop's body applied it; a page whose body did not finish comes again. While a `sync`
    /// pulls, the loop asks for nothing and goes on after that pull's cursor (a first
    /// sign-in's history comes once, by the pull), so a `sync` handler must not wait for
    /// the loop's pages; events a `sync` handler applied while a page was on its way are
    /// left out of it. Failures
    /// worth retrying are retried forever with backoff (`liveRetriesForever`), answers that
    /// are not the server's too (a `200` whose body is not a page, a proxy's page of any
    /// status: told to the observer as `.retrying`); the stream ends with an error on
    /// anything else (e.g. `.notSignedIn` after `signOut`, the server's own error), and when
    /// the consuming task is cancelled. A stream belongs to the sign-in it started in: after
    /// `signOut` or another user's sign-in it ends with `.notSignedIn`, also when its next
    /// page is asked for only once signed in again (its last page is then not stored as the
    /// new sign-in's cursor).
    public nonisolated func liveEvents() -> AsyncThrowingStream<[SyncEvent], Error> {
        let position = LivePosition()
        let feed = LongPollFeed(client: self, wait: min(60, max(1, configuration.longPollWait)))
        return AsyncThrowingStream(unfolding: { [self] in
            try await self.nextLivePage(feed, position)
        })
    }

    // MARK: - Internals: push and pull

    /// Pushes `store`'s outbox for `user`: every request of it ends with `.notSignedIn` once
    /// another user signed in or this one signs out, not only those started after.
    private func pushOutbox(
        _ store: UserStore, _ user: PinnedUser, into report: inout SyncReport, retry: RetryRules
    ) async throws {
        let configuredLimit = min(1000, max(1, configuration.maxBatchEvents))
        let byteLimit = min(9 * 1024 * 1024, max(Self.maxPayloadBytes, configuration.maxBatchBytes))
        // Halved to find the event a 400 is about (the full size again after), or to fit under
        // a 413's body limit (someone's on the way, say a proxy's): kept for the rest of this
        // push, so each batch after does not send megabytes only to be refused again.
        var limit = configuredLimit
        var fits = configuredLimit
        while true {
            try ensureCurrent(store)
            let batch = try storage { try store.outbox.oldest(maxEvents: limit, maxBytes: byteLimit) }
            if batch.isEmpty { return }
            let answer = try await send(
                "POST", "/sync/v1/events", body: Self.pushBody(batch), bearer: true, as: user, retry: retry)
            try ensureCurrent(store)
            switch answer.status {
            case 200:
                try answer.checkWhole("the push")
                let (created, duplicates, acknowledged) = try Self.parsePushAnswer(answer.body)
                let ids = batch.map(\.clientID).filter { acknowledged.contains($0) }
                try storage { try store.outbox.remove(ids, as: .ack) }
                guard ids.count == batch.count else {
                    throw TrunkSyncError.invalidResponse("the push answer names \(ids.count) of \(batch.count) events")
                }
                report.pushed += created
                report.duplicates += duplicates
                configuration.observer?(.batchPushed(events: batch.count, created: created, duplicates: duplicates))
                limit = fits
            case 400 where !answer.isServerError:
                // Not the server's judgement of the events but a page of something in the way
                // (a proxy set up wrong): no event is quarantined for it, the push fails.
                throw failure(answer)
            case 400, 413:
                let error = answer.serverError
                let now = configuration.now()
                var rejected: [StoredEvent] = []
                if answer.status == 400 {
                    for problem in error.details where batch.indices.contains(problem.index) {
                        var event = batch[problem.index]
                        if let earlier = rejected.firstIndex(where: { $0.clientID == event.clientID }) {
                            rejected[earlier].rejection!.reason += "; \(problem.field): \(problem.reason)"
                            continue
                        }
                        event.rejection = Rejection(
                            status: 400, code: error.code, field: problem.field, reason: problem.reason,
                            rejectedAt: now)
                        rejected.append(event)
                    }
                }
                if rejected.isEmpty {
                    // No event named: halve the batch until one event alone is refused.
                    if batch.count > 1 {
                        limit = max(1, batch.count / 2)
                        if answer.status == 413 { fits = limit }
                        continue
                    }
                    var event = batch[0]
                    event.rejection = Rejection(
                        status: answer.status, code: error.code, field: error.details.first?.field ?? "",
                        reason: error.details.first?.reason ?? error.message, rejectedAt: now)
                    rejected = [event]
                }
                try storage { try store.moveToQuarantine(rejected) }
                let named = rejected.map {
                    RejectedEvent(clientID: $0.clientID, type: $0.type, rejection: $0.rejection!)
                }
                report.rejected += named
                configuration.observer?(.eventsRejected(named))
            default:
                throw failure(answer)
            }
        }
    }

    private func pullAll(
        _ store: UserStore, _ user: PinnedUser, into report: inout SyncReport,
        _ handler: @Sendable ([SyncEvent]) async throws -> Void
    ) async throws {
        // Live loops do not ask for pages meanwhile: they go on after this pull's cursor.
        pulling = true
        defer {
            pulling = false
            let waits = pullWaits.values
            pullWaits = [:]
            for wait in waits { wait.resume() }
        }
        while true {
            try ensureCurrent(store)
            let cursor = store.cursor
            let page = try await fetchPage(after: cursor, wait: 0, retry: RetryRules(), as: user)
            try ensureCurrent(store)
            if !page.events.isEmpty {
                try await handler(page.events)
                try ensureCurrent(store)
            }
            // Forward only: `liveEvents()` (not under the sync lock) may have stored a later
            // cursor while the handler ran.
            if page.nextAfter > store.cursor { try storage { try store.saveCursor(page.nextAfter) } }
            report.pulled += page.events.count
            report.pages += 1
            report.cursor = store.cursor
            configuration.observer?(.pageApplied(events: page.events.count, cursor: page.nextAfter))
            if !page.hasMore { return }
        }
    }

    /// One page after `cursor` (`wait` > 0: long-poll), for `user` (nil: the one signed in now).
    func fetchPage(after cursor: Int64, wait: Int, retry: RetryRules, as user: PinnedUser? = nil) async throws
        -> EventPage
    {
        var query = [
            URLQueryItem(name: "after", value: String(cursor)),
            URLQueryItem(name: "limit", value: String(min(1000, max(1, configuration.pullLimit)))),
        ]
        if wait > 0 { query.append(URLQueryItem(name: "wait", value: String(wait))) }
        let answer = try await send(
            "GET", "/sync/v1/events", query: query, bearer: true, as: user, retry: retry,
            timeout: wait > 0 ? Double(wait) + 15 : nil)
        do {
            guard answer.status == 200 else {
                // A page of something in the way (a proxy's, a captive portal's), not the
                // server's JSON error: it says nothing about the request.
                guard answer.isServerError else {
                    throw UnreadableAnswer(status: answer.status, error: failure(answer))
                }
                throw failure(answer)
            }
            do {
                try answer.checkWhole("the pull after \(cursor)")
                let page = try EventPage.parse(answer.body)
                try page.check(after: cursor)
                return page
            } catch let error as TrunkSyncError {
                // A 200 that is not a page after `cursor`: cut short, mangled or replaced on the
                // way (a proxy), or a broken server's.
                throw UnreadableAnswer(status: 200, error: error)
            }
        } catch let unreadable as UnreadableAnswer where wait == 0 {
            throw unreadable.error
        }
    }

    /// A long-poll's answer that is not the server's page or error (`fetchPage`): the live
    /// loop takes it as a failure worth retrying, with backoff; `error` is what a pull throws.
    struct UnreadableAnswer: Error {
        var status: Int
        var error: TrunkSyncError
    }

    private func nextLivePage(_ feed: some LiveFeed, _ position: LivePosition) async throws -> [SyncEvent]? {
        let store = try currentStore()
        // A stream is of the sign-in it started in: after a sign-out or another user's
        // sign-in it ends, even when signed in again since (signOut removed the cursor: a page
        // handed out before must not become the new sign-in's cursor).
        let user = try signedInUser()
        guard position.belongs(to: user) else { throw TrunkSyncError.notSignedIn }
        // The consumer asked for the next page: the previous one is applied.
        if let after = position.take(), after > store.cursor {
            try storage { try store.saveCursor(after) }
            configuration.observer?(.pageApplied(events: 0, cursor: after))
        }
        var unreadable = 0
        while true {
            try Task.checkCancellation()
            try ensureCurrent(store)
            // A sync pulling (a first sign-in's history, say) hands those pages to its handler:
            // asking for them here too would download and deliver them twice.
            try await pullEnded()
            try ensureCurrent(store)
            let page: EventPage
            do {
                page = try await feed.nextPage(after: store.cursor)
            } catch let answer as UnreadableAnswer {
                // Worth retrying, as a network failure is (a proxy's page, a body cut short
                // or mangled on the way): with backoff, told to the observer, never in a hot
                // loop. (It ended the loop.)
                unreadable += 1
                let policy = configuration.retry
                guard configuration.liveRetriesForever || unreadable < max(1, policy.maxAttempts) else {
                    throw answer.error
                }
                let delay = policy.backoff(attempt: unreadable - 1)
                configuration.observer?(
                    .retrying(
                        method: "GET", path: "/sync/v1/events", status: answer.status, retryAfter: nil, delay: delay,
                        attempt: unreadable, error: answer.error.description))
                try await backoff(delay, for: user)
                continue
            }
            unreadable = 0
            try ensureCurrent(store)
            // Events a sync's handler applied while this page was on its way (the stored cursor
            // moves only once they are applied) are not handed out again.
            let events = page.events.filter { $0.seq > store.cursor }
            if events.isEmpty {
                if page.nextAfter > store.cursor { try storage { try store.saveCursor(page.nextAfter) } }
                continue
            }
            position.set(page.nextAfter)
            return events
        }
    }

    /// Returns once no `sync` is pulling (at once when none is), or when the task is cancelled.
    private func pullEnded() async throws {
        guard pulling else { return }
        pullWaitCount += 1
        let id = pullWaitCount
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                if Task.isCancelled || !pulling { continuation.resume() } else { pullWaits[id] = continuation }
            }
        } onCancel: {
            Task { await self.endPullWait(id) }
        }
        try Task.checkCancellation()
    }

    private func endPullWait(_ id: Int) {
        pullWaits.removeValue(forKey: id)?.resume()
    }

    /// Tests: live loops waiting for a pull to end.
    var liveLoopsWaitingForPull: Int { pullWaits.count }

    // MARK: - Internals: requests, tokens

    /// Which failures a request retries.
    struct RetryRules {
        /// Retry network failures (not for requests that must not run twice).
        var network = true
        /// Statuses to retry.
        var statuses: Set<Int> = [408, 429, 500, 502, 503, 504]
        /// Tries in all; nil: `configuration.retry.maxAttempts`.
        var maxAttempts: Int? = nil
        /// Retry forever (live feed).
        var unlimited = false
    }

    /// Sends a request, retrying per `retry` and refreshing the token once on a `401`;
    /// returns any answer it does not retry. A `bearer` request is the signed-in user's for
    /// good (`pinned`, else the one signed in now): once another user signed in or this one
    /// signs out, it throws `.notSignedIn` rather than try again or refresh with another
    /// session. So does a request without `bearer` that is given a `pinned` user.
    func send(
        _ method: String, _ path: String, query: [URLQueryItem] = [], body: [UInt8]? = nil, bearer: Bool = false,
        as pinned: PinnedUser? = nil, retry: RetryRules, timeout: TimeInterval? = nil, probe: ExchangeProbe? = nil
    ) async throws -> HTTPAnswer {
        let policy = configuration.retry
        let maxAttempts = retry.maxAttempts ?? max(1, policy.maxAttempts)
        var attempt = 0
        var refreshedAfter401 = false
        let user = try pinned ?? (bearer ? signedInUser() : nil)
        while true {
            try Task.checkCancellation()
            if let user, !isCurrent(user) { throw TrunkSyncError.notSignedIn }
            var request = URLRequest(url: try endpoint(path, query))
            request.httpMethod = method
            request.timeoutInterval = timeout ?? configuration.requestTimeout
            request.setValue("application/json", forHTTPHeaderField: "Accept")
            if let body {
                request.httpBody = Data(body)
                request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            }
            if let key = configuration.apiKey { request.setValue(key, forHTTPHeaderField: "apikey") }
            var token: String? = nil
            if bearer, let user {
                // A refresh first tries as often as this request (signOut's: twice).
                let current = try await validAccessToken(for: user, tries: retry.maxAttempts)
                token = current
                request.setValue("Bearer \(current)", forHTTPHeaderField: "Authorization")
            }
            configuration.observer?(.request(method: method, path: path))
            let answer: HTTPAnswer
            do {
                probe?.awaitingAnswer = true
                answer = try await transport.send(request, maxBodyBytes: configuration.maxAnswerBytes)
                probe?.awaitingAnswer = false
            } catch let failure as TransportFailure {
                if failure.notSent { probe?.awaitingAnswer = false }
                attempt += 1
                guard retry.network, retry.unlimited || attempt < maxAttempts else {
                    throw TrunkSyncError.network(failure.description)
                }
                let delay = policy.backoff(attempt: attempt - 1)
                configuration.observer?(
                    .retrying(
                        method: method, path: path, status: nil, retryAfter: nil, delay: delay, attempt: attempt,
                        error: failure.description))
                try await backoff(delay, for: user)
                continue
            }
            // Only the server's own 401 (its JSON error: the token expired or was refused) is
            // worth a refresh. A 401 page of something in the way (a proxy asking for its own
            // credentials) says nothing of the token: refreshing for it would spend a refresh
            // per retry of the live loop. It is returned as it is (a failure, `.server`; the
            // live loop's unreadable answer, retried with backoff).
            if answer.status == 401, bearer, !refreshedAfter401, answer.isServerError {
                refreshedAfter401 = true
                _ = try await refreshed(replacing: token, proactive: false, tries: retry.maxAttempts)
                continue
            }
            guard retry.statuses.contains(answer.status) else { return answer }
            attempt += 1
            let retryAfter = answer.retryAfter
            let error = answer.serverError
            // Not waited out, but for the live loop (`unlimited`), which waits `maxRetryAfter`
            // and asks again (and is told again): a proxy's day-long Retry-After, or a date
            // counted from a clock that is off, never ends it nor stops it for a day.
            if let retryAfter, retryAfter > policy.maxRetryAfter, !retry.unlimited {
                throw TrunkSyncError.rateLimited(retryAfter: retryAfter, code: error.code, message: error.message)
            }
            guard retry.unlimited || attempt < maxAttempts else { return answer }
            let delay =
                retryAfter.map { policy.delay(retryAfter: min($0, policy.maxRetryAfter)) }
                ?? policy.backoff(attempt: attempt - 1)
            configuration.observer?(
                .retrying(
                    method: method, path: path, status: answer.status, retryAfter: retryAfter, delay: delay,
                    attempt: attempt, error: error.description))
            try await backoff(delay, for: user)
        }
    }

    private func endpoint(_ path: String, _ query: [URLQueryItem]) throws -> URL {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else {
            throw TrunkSyncError.invalidResponse("bad server URL \(url)")
        }
        var base = components.path
        while base.hasSuffix("/") { base.removeLast() }
        components.path = base + path
        components.queryItems = query.isEmpty ? nil : query
        guard let url = components.url else { throw TrunkSyncError.invalidResponse("bad server URL \(url)") }
        return url
    }

    /// Whether a request `send` sent is still without an answer: when `send` throws, the
    /// server may have acted on it (set before each try goes out, cleared when its answer
    /// came or when it cannot have gone out: no network, the connection refused).
    final class ExchangeProbe {
        var awaitingAnswer = false
    }

    /// The signed-in user, pinned by a request that must not go on for another one.
    struct PinnedUser: Equatable {
        var id: UUID
        var generation: Int
    }

    private func signedInUser() throws -> PinnedUser {
        guard let session else { throw TrunkSyncError.notSignedIn }
        return PinnedUser(id: session.userID, generation: userGeneration)
    }

    /// Whether `user` is still signed in: no other user signed in since, no sign-out began.
    private func isCurrent(_ user: PinnedUser) -> Bool {
        session?.userID == user.id && user.generation == userGeneration
    }

    /// The access token, refreshed first when it expires within the refresh margin. When
    /// that refresh cannot reach the server, a token that has not expired yet is used.
    /// With `user`: only that user's, else `.notSignedIn`. A refresh it starts makes at most
    /// `tries` tries (nil: `configuration.retry.maxAttempts`).
    private func validAccessToken(for user: PinnedUser? = nil, tries: Int? = nil) async throws -> String {
        func current() throws -> StoredSession {
            guard let found = session, user.map(isCurrent) ?? true else { throw TrunkSyncError.notSignedIn }
            return found
        }
        let found = try current()
        let margin = min(configuration.refreshMargin, found.lifetime / 2)
        let now = configuration.now()
        guard found.expiresAt.timeIntervalSince(now) <= margin else { return found.accessToken }
        do {
            _ = try await refreshed(replacing: found.accessToken, proactive: true, tries: tries)
            return try current().accessToken
        } catch TrunkSyncError.network(_), TrunkSyncError.rateLimited(_, _, _) {
            let still = try current()
            guard still.expiresAt > configuration.now() else {
                throw TrunkSyncError.network("cannot refresh the session")
            }
            return still.accessToken
        }
    }

    /// A session whose access token is not `token`: refreshes unless another call already
    /// did (or is doing: every concurrent caller shares one refresh, so the rotating
    /// refresh token is used once). A refresh it starts makes at most `tries` tries (nil:
    /// `configuration.retry.maxAttempts`).
    private func refreshed(replacing token: String?, proactive: Bool, tries: Int? = nil) async throws
        -> StoredSession
    {
        guard let current = session else { throw TrunkSyncError.notSignedIn }
        if let token, current.accessToken != token { return current }
        if let refreshTask { return try await refreshTask.value }
        let task = Task {
            // Runs on the actor once this caller suspends, so `refreshTask` is this task.
            defer { self.refreshTask = nil }
            return try await self.performRefresh(current, proactive: proactive, tries: tries)
        }
        refreshTask = task
        return try await task.value
    }

    private func performRefresh(_ current: StoredSession, proactive: Bool, tries: Int?) async throws
        -> StoredSession
    {
        let body = try JSONSerialization.data(withJSONObject: ["refresh_token": current.refreshToken])
        // Retrying after a lost answer is safe: the server hands a token used again within
        // 10 s of its rotation another token of the same session. Pinned, so a sign-out (or
        // another user's sign-in) ends its retries instead of waiting for them.
        var unreadable = 0
        while true {
            let answer = try await send(
                "POST", "/auth/v1/token", query: [URLQueryItem(name: "grant_type", value: "refresh_token")],
                body: Array(body), as: PinnedUser(id: current.userID, generation: userGeneration),
                retry: RetryRules(maxAttempts: tries))
            // Signed out, or signed in again, while the answer came (a slow connection): the
            // answer is about a session no longer stored, maybe one signOut revoked. It must not
            // replace the session stored now, nor end it: a newer session of the same user is
            // used as it is.
            guard let stored = session, stored.refreshToken == current.refreshToken else {
                if let stored = session, stored.userID == current.userID { return stored }
                throw TrunkSyncError.notSignedIn
            }
            switch answer.status {
            case 200:
                guard var next = try? StoredSession.parse(answer.body, receivedAt: configuration.now()) else {
                    // The server may have rotated the token and its answer been mangled on the
                    // way: asked again now, within the server's reuse interval, the same token
                    // gets another of the same session. Kept for later, it would be a reuse
                    // that revokes the session.
                    unreadable += 1
                    if unreadable < 3 { continue }
                    throw TrunkSyncError.invalidResponse("the answer to a refresh is not a session")
                }
                next.email = next.email ?? current.email
                // Stored before anything uses it: a crash now keeps the new refresh token.
                try storage { try next.save(layout.sessionFile) }
                session = next
                configuration.observer?(.tokenRefreshed(proactive: proactive))
                return next
            case 400, 401, 403, 404:
                // Not the server's own refusal (its JSON error) but a page of something in the
                // way (a proxy's 404 while it is set up wrong, a captive portal): the session
                // stays.
                guard answer.isServerError else { throw failure(answer) }
                // The refresh token is unknown or its session revoked: signed out. The user's
                // outbox stays for their next sign-in.
                try? FileSystem.remove(layout.sessionFile)
                session = nil
                store?.close()
                store = nil
                signedIn.set(nil)
                configuration.observer?(.sessionExpired)
                throw TrunkSyncError.sessionExpired
            default:
                throw failure(answer)
            }
        }
    }

    // MARK: - Internals: helpers

    private func failure(_ answer: HTTPAnswer) -> TrunkSyncError {
        let error = answer.serverError
        if answer.status == 429 || answer.status == 503 {
            return .rateLimited(retryAfter: error.retryAfter, code: error.code, message: error.message)
        }
        return .server(error)
    }

    /// Tests: how `deleteAccount` removes the user's data.
    func setRemoveItem(_ remove: @escaping @Sendable (URL) throws -> Void) { removeItem = remove }

    private func ensureOpen() throws {
        guard lock != nil else { throw TrunkSyncError.storage("the client is closed") }
    }

    /// Throws unless `store` is still the signed-in user's (a sign-out or another sign-in
    /// while a call was waiting).
    private func ensureCurrent(_ store: UserStore) throws {
        guard self.store === store, session?.userID == store.userID else { throw TrunkSyncError.notSignedIn }
    }

    private func storage<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as TrunkSyncError {
            throw error
        } catch {
            throw TrunkSyncError.storage(String(describing: error))
        }
    }

    /// Waits `seconds` before a retry of `user`'s request; ends early (and the retry then
    /// finds the user changed) when another user signs in or the user signs out, also when
    /// that happened while the request was on its way.
    private func backoff(_ seconds: TimeInterval, for user: PinnedUser?) async throws {
        backoffWaitCount += 1
        let id = backoffWaitCount
        let timer = Task { [weak self] in
            try? await Task.sleep(nanoseconds: UInt64(max(0, seconds) * 1e9))
            await self?.endBackoffWait(id)
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                if Task.isCancelled || user.map(isCurrent) == false {
                    continuation.resume()
                } else {
                    backoffWaits[id] = continuation
                }
            }
        } onCancel: {
            Task { await self.endBackoffWait(id) }
        }
        timer.cancel()
        try Task.checkCancellation()
    }

    private func endBackoffWait(_ id: Int) {
        backoffWaits.removeValue(forKey: id)?.resume()
    }

    private func endBackoffWaits() {
        let waits = backoffWaits.values
        backoffWaits = [:]
        for wait in waits { wait.resume() }
    }

    private func acquireSync() async {
        if syncBusy {
            await withCheckedContinuation { syncWaiters.append($0) }
        } else {
            syncBusy = true
        }
    }

    private func releaseSync() {
        if syncWaiters.isEmpty { syncBusy = false } else { syncWaiters.removeFirst().resume() }
    }

    static func pushBody(_ events: [StoredEvent]) -> [UInt8] {
        var body = Array(#"{"events":["#.utf8)
        for (index, event) in events.enumerated() {
            if index > 0 { body.append(UInt8(ascii: ",")) }
            body += Array(#"{"client_id":""#.utf8) + Array(event.clientID.uuidString.lowercased().utf8)
            body += Array(#"","type":"#.utf8) + JSONText.quoted(event.type)
            body += Array(#","payload":"#.utf8) + event.payload
            body += Array(#","client_timestamp":""#.utf8) + Array(event.clientTimestamp.utf8) + Array(#""}"#.utf8)
        }
        body += Array("]}".utf8)
        return body
    }

    static func parsePushAnswer(_ body: Data) throws -> (created: Int, duplicates: Int, ids: Set<UUID>) {
        guard let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any],
            let results = object["results"] as? [[String: Any]]
        else { throw TrunkSyncError.invalidResponse("not a push answer") }
        var created = 0
        var duplicates = 0
        var ids = Set<UUID>()
        // Only `created` and `duplicate` say the event is stored; anything else leaves it in
        // the outbox (and the push fails: the answer did not name every event).
        for result in results {
            guard let text = result["client_id"] as? String, let id = UUID(uuidString: text) else { continue }
            switch result["status"] as? String {
            case "created": created += 1
            case "duplicate": duplicates += 1
            default: continue
            }
            ids.insert(id)
        }
        return (created, duplicates, ids)
    }

    /// How `record` encodes payloads: ISO 8601 dates, slashes unescaped.
    static func defaultEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.withoutEscapingSlashes]
        return encoder
    }

    /// How `SyncEvent.decode` decodes payloads by default.
    static func defaultDecoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

/// The signed-in user, readable without awaiting the actor.
final class SignedInState: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var value: User?

    var user: User? { lock.withLock { value } }
    func set(_ user: User?) { lock.withLock { value = user } }
}

/// The page a live stream handed out last, stored as the cursor when the next is asked for,
/// and the sign-in the stream belongs to (the one signed in when it was first asked).
final class LivePosition: @unchecked Sendable {  // guarded by `lock`
    private let lock = NSLock()
    private var pending: Int64?
    private var owner: TrunkSyncClient.PinnedUser?

    /// Whether `user` is the sign-in the stream started in (the first call sets it).
    func belongs(to user: TrunkSyncClient.PinnedUser) -> Bool {
        lock.withLock {
            if owner == nil { owner = user }
            return owner == user
        }
    }

    func set(_ after: Int64) { lock.withLock { pending = after } }
    func take() -> Int64? {
        lock.withLock {
            defer { pending = nil }
            return pending
        }
    }
}
