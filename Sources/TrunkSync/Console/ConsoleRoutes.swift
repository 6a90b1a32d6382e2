import Foundation
import HTTPServer
import JSON
import Logging
import Postgres

/// The operator console on the admin listener: its page (`/console/`, files embedded in the
/// binary) and the JSON API it calls (`/admin/v1/…`, described in docs/ADMIN-API.md). Never
/// on the public listener.
struct ConsoleRoutes: Sendable {
    let auth: ConsoleAuth
    let store: ConsoleStore
    let accounts: ConsoleAccounts
    let sessions: AuthService
    /// The overview's live figures.
    let overview: @Sendable () async throws -> OverviewFigures
    let logger: Logger

    /// What the overview shows besides the database's counts.
    struct OverviewFigures: Sendable {
        var requests: UInt64
        var serverErrors: UInt64
        var pool: PostgresLoopPool.Statistics
        var longPollsWaiting: Int
        var schemaVersion: String?
        var pendingMigrations: Int
        var startedAt: Double
        /// Requests and errors per second, minute by minute, over the last hour.
        var history: [RequestHistory.Minute] = []
    }

    func register(in routes: inout Routes) {
        routes.add(.get, "/console", family: .native, .inline { request in Self.page(request) })
        routes.add(.get, "/console/:file", family: .native, .inline { request in Self.asset(request) })

        let small = Endpoint.BodyLimit.small
        routes.add(.get, "/admin/v1/session", family: .native, .open { request in try await session(request) })
        routes.add(.post, "/admin/v1/auth/otp", family: .native, bodyLimit: small, .open { try await requestCode($0) })
        routes.add(.post, "/admin/v1/auth/verify", family: .native, bodyLimit: small, .open { try await verify($0) })
        routes.add(
            .post, "/admin/v1/auth/logout", family: .native, bodyLimit: small,
            guarded { try await signOut($0, $1) })
        routes.add(.get, "/admin/v1/overview", family: .native, guarded { _, signedIn in try await overview(signedIn) })
        routes.add(.get, "/admin/v1/users", family: .native, guarded { try await users($0, $1) })
        routes.add(.get, "/admin/v1/users/:id", family: .native, guarded { try await user($0, $1) })
        routes.add(
            .delete, "/admin/v1/users/:id", family: .native, bodyLimit: small, guarded { try await delete($0, $1) })
        routes.add(.get, "/admin/v1/users/:id/sessions", family: .native, guarded { try await userSessions($0, $1) })
        routes.add(
            .delete, "/admin/v1/users/:id/sessions/:session", family: .native, guarded { try await revoke($0, $1) })
        routes.add(.get, "/admin/v1/users/:id/events", family: .native, guarded { try await events($0, $1) })
        routes.add(.get, "/admin/v1/users/:id/export", family: .native, guarded { try await export($0, $1) })
    }

    /// A handler that runs once the request's console session is verified.
    private func guarded(
        _ handler: @escaping @Sendable (HTTPRequest, ConsoleAuth.Operator) async throws -> HTTPResponse
    ) -> Endpoint.Handler {
        .open { [auth] request in try await handler(request, try await auth.authenticate(request)) }
    }

    // MARK: - The page

    /// Headers of every console file: nothing but this listener's own files may load or
    /// run (no inline script or style, no other host), and no other site may frame it.
    /// Trusted Types (`require-trusted-types-for 'script'` with no policy allowed) make the
    /// browser refuse every HTML or script sink given a string (`innerHTML`,
    /// `insertAdjacentHTML`, `document.write`, a `javascript:` URL…): the page builds its DOM
    /// from text only, and the browser holds it to that, so data the app's users control
    /// (names, metadata, event types and payloads, user agents) can never become markup. A
    /// window of another origin that opens the console gets no handle on it
    /// (`Cross-Origin-Opener-Policy`).
    static let pageHeaders: HTTPHeaders = [
        "Content-Security-Policy":
            "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'; "
            + "require-trusted-types-for 'script'; trusted-types 'none'",
        "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
        "Cross-Origin-Opener-Policy": "same-origin", "Cache-Control": "no-cache",
    ]

    /// `/console/`: the page; `/console` redirects there so its relative links resolve.
    static func page(_ request: HTTPRequest) -> HTTPResponse {
        guard request.path.hasSuffix("/") else {
            return HTTPResponse(status: 301, headers: ["Location": "/console/", "Cache-Control": "no-cache"])
        }
        return file("index.html")
    }

    static func asset(_ request: HTTPRequest) -> HTTPResponse {
        file(request.parameters["file"] ?? "")
    }

    static func file(_ name: String) -> HTTPResponse {
        guard let asset = ConsoleAssets.files[name] else { return APIError.notFound().response(for: .native) }
        var headers = pageHeaders
        headers.append(name: "Content-Type", value: asset.contentType)
        return HTTPResponse(status: .ok, headers: headers, body: asset.bytes)
    }

    // MARK: - Sign-in

    private struct EmailBody: Decodable {
        var email: String?
    }

    private struct VerifyBody: Decodable {
        var email: String?
        var code: String?
    }

    private func requestCode(_ request: HTTPRequest) async throws -> HTTPResponse {
        guard auth.isEnabled else { throw ConsoleError.disabled }
        try await sessions.limit(.consoleOTP, ip: request.remoteAddress)  // before any parsing
        let body = try AuthRoutes.decode(EmailBody.self, from: request)
        let email = try AuthRoutes.email(body.email)
        try await sessions.limit(.consoleOTP, email: email)
        try await auth.requestCode(email: email)
        return Self.json(Array("{}".utf8))
    }

    private func verify(_ request: HTTPRequest) async throws -> HTTPResponse {
        guard auth.isEnabled else { throw ConsoleError.disabled }
        try await sessions.limit(.consoleVerify, ip: request.remoteAddress)
        let body = try AuthRoutes.decode(VerifyBody.self, from: request)
        let email = try AuthRoutes.email(body.email)
        try await sessions.limit(.consoleVerify, email: email)
        guard let code = body.code, !code.isEmpty else { throw ConsoleError.validation("code is required") }
        let (token, signedIn): (String, ConsoleAuth.Operator)
        do {
            (token, signedIn) = try await auth.verify(
                email: email, code: code.trimmingCharactersInWhitespace(), ip: request.remoteAddress,
                userAgent: request.headers["user-agent"])
        } catch let error as APIError where error.code == AuthError.otpExpired.code {
            auth.logFailedSignIn(email: email, ip: request.remoteAddress)
            throw error
        }
        var response = Self.json(Self.sessionJSON(signedIn))
        response.headers.append(name: "Set-Cookie", value: ConsoleAuth.setCookie(token, secure: request.forwardedHTTPS))
        return response
    }

    private func session(_ request: HTTPRequest) async throws -> HTTPResponse {
        var signedIn: ConsoleAuth.Operator? = nil
        do {
            signedIn = try await auth.authenticate(request)
        } catch let error as APIError where error.status == 401 || error.status == 403 {
            signedIn = nil
        }
        var writer = JSONWriter()
        writer.beginObject()
        writer.bool("sign_in_enabled", auth.isEnabled)
        writer.bool("signed_in", signedIn != nil)
        if let signedIn {
            writer.string("email", signedIn.email)
            writer.int("expires_at", signedIn.expiresAt)
        }
        writer.endObject()
        return Self.json(writer.bytes)
    }

    private func signOut(_ request: HTTPRequest, _ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        try await auth.signOut(signedIn)
        var headers = Self.apiHeaders
        headers.append(name: "Set-Cookie", value: ConsoleAuth.setCookie(nil, secure: request.forwardedHTTPS))
        return HTTPResponse(status: .noContent, headers: headers)
    }

    static func sessionJSON(_ signedIn: ConsoleAuth.Operator) -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.string("email", signedIn.email)
        writer.int("expires_at", signedIn.expiresAt)
        writer.endObject()
        return writer.bytes
    }

    // MARK: - Overview

    private func overview(_ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        let counts = try await store.counts(signedIn)
        let days = try await store.eventsPerDay(signedIn)
        let figures = try await overview()
        var writer = JSONWriter(capacity: 6144)
        writer.beginObject()
        writer.int("users", counts.users)
        writer.int("events_last_24h", counts.eventsLastDay)
        writer.int("requests_total", Int64(clamping: figures.requests))
        writer.int("server_errors_total", Int64(clamping: figures.serverErrors))
        writer.number("sampled_at", (Date().timeIntervalSince1970 * 1000).rounded() / 1000)
        writer.number("uptime_seconds", (Date().timeIntervalSince1970 - figures.startedAt).rounded())
        writer.beginObject("database_pool")
        writer.int("open", Int64(figures.pool.open))
        writer.int("in_use", Int64(figures.pool.inUse))
        writer.int("waiting", Int64(figures.pool.waiting))
        writer.int("max", Int64(figures.pool.maxConnections))
        writer.endObject()
        writer.int("long_polls_waiting", Int64(figures.longPollsWaiting))
        writer.string("schema_version", figures.schemaVersion)
        writer.int("pending_migrations", Int64(figures.pendingMigrations))
        writer.string("version", TrunkSyncVersion.current)
        writer.beginArray("requests_per_minute")
        for minute in figures.history {
            writer.beginObject()
            writer.int("start", minute.start)
            writer.number("requests_per_second", minute.requestsPerSecond)
            writer.number("errors_per_second", minute.errorsPerSecond)
            writer.endObject()
        }
        writer.endArray()
        writer.beginArray("events_per_day")
        for day in days {
            writer.beginObject()
            writer.string("day", day.day)
            writer.int("events", day.events)
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return Self.json(writer.bytes)
    }

    // MARK: - Users

    private func users(_ request: HTTPRequest, _ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        let limit = try Self.integer(request, "limit", in: 1...100) ?? 25
        let offset = try Self.integer(request, "offset", in: 0...1_000_000) ?? 0
        let search = try Self.text(request, "q", maxBytes: 320)?.trimmingCharactersInWhitespace()
        let page = try await store.users(
            signedIn, search: search?.isEmpty == false ? search : nil, limit: limit, offset: offset)
        if let search, !search.isEmpty {
            logger.notice(
                "console: users searched",
                metadata: ["admin": "\(signedIn.email)", "search": "\(search)", "found": "\(page.total)"])
        } else {
            logger.notice("console: users listed", metadata: ["admin": "\(signedIn.email)", "offset": "\(offset)"])
        }
        var writer = JSONWriter(capacity: 256 + 256 * page.users.count)
        writer.beginObject()
        writer.int("total", page.total)
        writer.int("limit", Int64(limit))
        writer.int("offset", Int64(offset))
        writer.beginArray("users")
        for user in page.users { Self.write(user, to: &writer) }
        writer.endArray()
        writer.endObject()
        return Self.json(writer.bytes)
    }

    private static func write(_ user: ConsoleStore.UserRow, to writer: inout JSONWriter, key: String? = nil) {
        writer.beginObject(key)
        writer.string("id", user.id.uuidString.lowercased())
        writer.string("email", user.email)
        writer.string("full_name", user.fullName)
        writer.string("created_at", RFC3339.format(user.createdAt))
        writer.string("last_sign_in_at", user.lastSignInAt.map { RFC3339.format($0) })
        writer.string("last_event_at", user.lastEventAt.map { RFC3339.format($0) })
        writer.int("events", user.events)
        writer.int("active_sessions", user.activeSessions)
        writer.endObject()
    }

    /// The user named by the path, or `404` (`400` when the id is not a UUID).
    private func target(_ request: HTTPRequest) async throws -> (
        ConsoleStore.UserRow, metadata: [UInt8], types: [String]
    ) {
        let id = try Self.uuid(request.parameters["id"], name: "user id")
        guard let found = try await store.user(id) else { throw ConsoleError.userNotFound }
        return found
    }

    private func user(_ request: HTTPRequest, _ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        let (user, metadata, types) = try await target(request)
        log("user viewed", signedIn, user.id)
        var writer = JSONWriter(capacity: 1024 + metadata.count)
        writer.beginObject()
        Self.write(user, to: &writer, key: "user")
        writer.raw("user_metadata", metadata)
        writer.beginArray("event_types")
        for type in types { writer.string(nil, type) }
        writer.endArray()
        writer.endObject()
        return Self.json(writer.bytes)
    }

    private func userSessions(_ request: HTTPRequest, _ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        let (user, _, _) = try await target(request)
        let rows = try await store.sessions(of: user.id)
        log("sessions viewed", signedIn, user.id, ["sessions": "\(rows.count)"])
        var writer = JSONWriter(capacity: 256 + 256 * rows.count)
        writer.beginObject()
        writer.beginArray("sessions")
        for session in rows {
            writer.beginObject()
            writer.string("id", session.id.uuidString.lowercased())
            writer.string("created_at", RFC3339.format(session.createdAt))
            writer.string("refreshed_at", session.refreshedAt.map { RFC3339.format($0) })
            writer.string("revoked_at", session.revokedAt.map { RFC3339.format($0) })
            writer.string("access_expires_at", session.accessExpiresAt.map { RFC3339.format($0) })
            writer.string("ip", session.ip)
            writer.string("user_agent", session.userAgent)
            writer.bool("active", session.revokedAt == nil)
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return Self.json(writer.bytes)
    }

    private func revoke(_ request: HTTPRequest, _ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        let (user, _, _) = try await target(request)
        let session = try Self.uuid(request.parameters["session"], name: "session id")
        guard try await store.liveSessions(of: user.id).contains(session) else { throw ConsoleError.sessionNotFound }
        // The app's own sign-out of that one session: revoked here before the answer, on
        // every other instance through the trigger's notification.
        try await sessions.logout(AccessClaims(userID: user.id, sessionID: session, expiresAt: 0), scope: .local)
        log("session revoked", signedIn, user.id, ["session_id": "\(session.uuidString.lowercased())"])
        return HTTPResponse(status: .noContent, headers: Self.apiHeaders)
    }

    private struct DeleteBody: Decodable {
        var confirmEmail: String?

        enum CodingKeys: String, CodingKey {
            case confirmEmail = "confirm_email"
        }
    }

    private func delete(_ request: HTTPRequest, _ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        let (user, _, _) = try await target(request)
        let body = try AuthRoutes.decode(DeleteBody.self, from: request)
        guard let confirmation = body.confirmEmail.flatMap(Email.init), confirmation.value == user.email.lowercased()
        else {
            throw APIError(
                status: 400, code: "confirmation_mismatch",
                message: "confirm_email must be the user's email address; nothing was deleted.")
        }
        let live = try await store.liveSessions(of: user.id)
        guard try await accounts.delete(user.summary) else { throw ConsoleError.userNotFound }
        log("user deleted", signedIn, user.id, ["events": "\(user.events)", "sessions_revoked": "\(live.count)"])
        var writer = JSONWriter()
        writer.beginObject()
        writer.bool("deleted", true)
        writer.string("id", user.id.uuidString.lowercased())
        writer.int("events", user.events)
        writer.int("sessions_revoked", Int64(live.count))
        writer.endObject()
        return Self.json(writer.bytes)
    }

    private func export(_ request: HTTPRequest, _ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        let (user, _, _) = try await target(request)
        let export = try await accounts.beginExport(user.summary)
        log("user exported", signedIn, user.id, ["events": "\(export.through)"])
        var headers = Self.apiHeaders
        headers.append(name: "Content-Type", value: "application/x-ndjson; charset=utf-8")
        headers.append(
            name: "Content-Disposition",
            value: "attachment; filename=\"trunk-sync-\(user.id.uuidString.lowercased()).jsonl\"")
        // Streamed as the account's own export: any size, in flat memory, at the browser's pace.
        return AccountRoutes.streamed(export, of: accounts.accounts, headers: headers)
    }

    // MARK: - Events

    private func events(_ request: HTTPRequest, _ signedIn: ConsoleAuth.Operator) async throws -> HTTPResponse {
        let limit = try Self.integer(request, "limit", in: 1...200) ?? 50
        var filter = ConsoleStore.EventFilter()
        filter.before = try Self.integer(request, "before", in: 1...Int.max).map(Int64.init)
        if let type = try Self.text(request, "type", maxBytes: 128), !type.isEmpty { filter.type = type }
        filter.from = try Self.time(request, "from")
        filter.to = try Self.time(request, "to")
        if let from = filter.from, let to = filter.to, from >= to {
            throw ConsoleError.validation("from must be before to")
        }
        let (user, _, _) = try await target(request)
        let page = try await store.events(of: user.id, filter, limit: limit)
        log("events viewed", signedIn, user.id)
        var writer = JSONWriter(capacity: page.eventsJSON.count + 128)
        writer.beginObject()
        writer.raw("events", page.eventsJSON)
        writer.bool("has_more", page.hasMore)
        if page.hasMore, let last = page.lastSeq { writer.int("next_before", last) } else { writer.null("next_before") }
        writer.endObject()
        return Self.json(writer.bytes)
    }

    // MARK: - Helpers

    /// What every `/admin/v1` answer carries: never cached, never sniffed.
    static let apiHeaders: HTTPHeaders = ["Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"]

    static func json(_ body: [UInt8], status: HTTPStatus = .ok) -> HTTPResponse {
        .json(status, body, headers: apiHeaders)
    }

    /// Every admin action on a user is logged with the operator's address and the user's id.
    private func log(
        _ message: Logger.Message, _ signedIn: ConsoleAuth.Operator, _ user: UUID, _ extra: Logger.Metadata = [:]
    ) {
        logger.notice(
            "console: \(message)",
            metadata: extra.merging(["admin": "\(signedIn.email)", "user_id": "\(user.uuidString.lowercased())"]) { $1 }
        )
    }

    static func uuid(_ raw: String?, name: String) throws -> UUID {
        guard let raw, raw.utf8.count == 36, let id = UUID(uuidString: raw) else {
            throw ConsoleError.validation("\(name) must be a UUID")
        }
        return id
    }

    /// The query parameter `name` as text of at most `maxBytes` bytes, nil when absent. Control
    /// characters are refused: PostgreSQL text cannot hold NUL (`%00`; libpq would cut the
    /// value short), and no address or event type contains the others.
    static func text(_ request: HTTPRequest, _ name: String, maxBytes: Int) throws -> String? {
        guard let text = request.queryValue(name) else { return nil }
        guard text.utf8.count <= maxBytes else {
            throw ConsoleError.validation("\(name) must be at most \(maxBytes) bytes")
        }
        guard !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw ConsoleError.validation("\(name) must not contain control characters")
        }
        return text
    }

    /// The query parameter `name` as an integer within `range`, nil when absent.
    static func integer(_ request: HTTPRequest, _ name: String, in range: ClosedRange<Int>) throws -> Int? {
        guard let text = request.queryValue(name), !text.isEmpty else { return nil }
        guard text.utf8.count <= 19, text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }), let value = Int(text),
            range.contains(value)
        else {
            throw ConsoleError.validation("\(name) must be an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return value
    }

    /// The query parameter `name` as an RFC 3339 time, nil when absent.
    static func time(_ request: HTTPRequest, _ name: String) throws -> PostgresTimestamp? {
        guard let text = request.queryValue(name), !text.isEmpty else { return nil }
        guard text.utf8.count <= 64, let time = RFC3339.parse(text) else {
            throw ConsoleError.validation("\(name) must be an RFC 3339 time such as 2026-11-22T04:10:02Z")
        }
        return time
    }
}
