import COpenSSL
import Foundation
import Synchronization

/// Limits of one WebSocket connection.
public struct WebSocketSettings: Sendable, Equatable {
    /// Frame and message size limits (→ close `1009`).
    public var limits = WebSocketLimits.default
    /// Bytes the session may have sent and the client not yet read; past it `send` says
    /// `.full` (the session decides: a live feed closes the slow reader). Default 256 KiB.
    public var outputBufferLimit = 256 * 1024
    /// Bytes of received messages the session has not taken yet; a client sending faster
    /// than that is closed with `1008`. Default 64 KiB.
    public var inboxLimit = 64 * 1024
    /// Received messages the session has not taken yet, however small: empty frames weigh
    /// no bytes but each takes memory. More closes the connection with `1008` too. Default 1024.
    public var inboxMessageLimit = 1024
    /// A connection on which nothing arrives for this long is closed (a client sending its
    /// heartbeat every 25 s never gets near it). Default 90 s.
    public var idleTimeout: Duration = .seconds(90)

    public init() {}
}

/// A message the client sent.
public enum WebSocketMessage: Sendable, Equatable {
    case text([UInt8])
    case binary([UInt8])

    var size: Int {
        switch self {
        case .text(let bytes), .binary(let bytes): return bytes.count
        }
    }
}

/// What `HTTPResponse.webSocket` carries to the event loop: the settings and the session,
/// which runs once as a task after the `101` is queued.
public struct WebSocketUpgrade: Sendable {
    public var settings: WebSocketSettings
    public var session: @Sendable (WebSocket) async -> Void
}

/// The application's side of an upgraded connection. Safe from any task.
///
/// - `receive()` suspends until the client's next message, and returns nil once the
///   connection is over (the client closed it or broke the protocol, the server is stopping,
///   the session closed it).
/// - `send(text:)` never waits: it frames the message and queues it if fewer than
///   `outputBufferLimit` bytes wait for the client, else says `.full` and sends nothing; also
///   `.full` while the server's total for output held for clients is full
///   (`HTTPServerConfiguration.maxBufferedOutput`) and bytes still wait for the client.
/// - `close(_:reason:)` sends a close frame after what was queued and ends the connection.
///
/// The session's task is cancelled when the connection ends; when it returns without
/// `close`, the connection is closed with `1000`.
public final class WebSocket: Sendable {
    struct Inbox {
        var messages: [WebSocketMessage] = []
        var head = 0
        var bytes = 0
        var ended = false
        var waiter: CheckedContinuation<WebSocketMessage?, Never>? = nil
        var closeRequest: (WebSocketCloseCode, String)? = nil
    }

    let writer: HTTPBodyWriter
    let settings: WebSocketSettings
    private let inbox = Mutex(Inbox())

    /// `budget`: the server's total for output held for clients, which what the socket
    /// queues counts in (nil: not counted).
    init(settings: WebSocketSettings, budget: ByteBudget? = nil, wake: @escaping @Sendable () -> Void) {
        self.settings = settings
        writer = HTTPBodyWriter(bufferLimit: settings.outputBufferLimit, budget: budget, wake: wake)
    }

    // MARK: - For the session

    /// The client's next message; nil once the connection is over.
    public func receive() async -> WebSocketMessage? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<WebSocketMessage?, Never>) in
                let ready = inbox.withLock { inbox -> WebSocketMessage?? in
                    if inbox.head < inbox.messages.count {
                        let message = inbox.messages[inbox.head]
                        inbox.head += 1
                        inbox.bytes -= message.size
                        if inbox.head == inbox.messages.count {
                            inbox.messages.removeAll(keepingCapacity: inbox.messages.capacity <= 16)
                            inbox.head = 0
                        }
                        return .some(message)
                    }
                    if inbox.ended || Task.isCancelled { return .some(nil) }
                    inbox.waiter = continuation
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            inbox.withLock { inbox in
                defer { inbox.waiter = nil }
                return inbox.waiter
            }?.resume(returning: nil)
        }
    }

    /// Queues a text message (UTF-8) unless the client is too far behind (its buffer is
    /// full, or it is behind while the server's total is: `HTTPBodyWriter.writeIfRoom`).
    @discardableResult
    public func send(text: [UInt8]) -> HTTPBodyWriter.WriteResult {
        writer.writeIfRoom(WebSocketFrame.text(text))
    }

    /// Sends a close frame with `code` after what was queued, then ends the connection.
    public func close(_ code: WebSocketCloseCode = .normal, reason: String = "") {
        inbox.withLock { inbox in
            if inbox.closeRequest == nil { inbox.closeRequest = (code, reason) }
        }
        writer.finish()
    }

    /// Whether the connection is over (nothing more will be sent).
    public var isClosed: Bool { writer.isClosed }

    /// Bytes queued and not yet read by the client.
    public var bufferedByteCount: Int { writer.bufferedByteCount }

    // MARK: - For the loop

    /// A message arrived. False when the session is too far behind taking them (the
    /// connection is then failed with `1008`).
    func deliver(_ message: WebSocketMessage) -> Bool {
        let waiter = inbox.withLock { inbox -> CheckedContinuation<WebSocketMessage?, Never>?? in
            if inbox.ended { return .some(nil) }
            if let waiter = inbox.waiter {
                inbox.waiter = nil
                return .some(waiter)
            }
            let waiting = inbox.messages.count - inbox.head
            guard
                waiting == 0
                    || (inbox.bytes + message.size <= settings.inboxLimit && waiting < settings.inboxMessageLimit)
            else {
                return nil
            }
            inbox.messages.append(message)
            inbox.bytes += message.size
            return .some(nil)
        }
        guard let waiter else { return false }
        waiter?.resume(returning: message)
        return true
    }

    /// What the session asked the close frame to say (default `1000`).
    var closeRequest: (WebSocketCloseCode, String) {
        inbox.withLock { $0.closeRequest } ?? (.normal, "")
    }

    /// The connection is over: `receive` returns nil, sends fail.
    func connectionEnded() {
        writer.close()
        inbox.withLock { inbox in
            inbox.ended = true
            inbox.messages = []
            inbox.head = 0
            inbox.bytes = 0
            defer { inbox.waiter = nil }
            return inbox.waiter
        }?.resume(returning: nil)
    }
}

/// The opening handshake (RFC 6455 section 4.2).
public enum WebSocketHandshake {
    /// Why a request is not a WebSocket handshake the server takes.
    public enum Refusal: Error, Equatable, Sendable {
        /// Not `GET` with `Upgrade: websocket` and `Connection: upgrade`, or no valid key.
        case notAHandshake(String)
        /// `Sec-WebSocket-Version` is not 13: answer `426` with `Sec-WebSocket-Version: 13`.
        case unsupportedVersion
    }

    static let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// The `Sec-WebSocket-Accept` value for `request`, or why it is refused.
    public static func accept(_ request: HTTPRequest) -> Result<String, Refusal> {
        guard request.method == .get else { return .failure(.notAHandshake("A WebSocket handshake is a GET request.")) }
        func hasToken(_ name: String, _ token: String) -> Bool {
            request.headers.values(for: name).contains { value in
                value.split(separator: ",").contains { $0.trimmingCharacters(in: .whitespaces).lowercased() == token }
            }
        }
        guard hasToken("upgrade", "websocket"), hasToken("connection", "upgrade") else {
            return .failure(.notAHandshake("This route takes WebSocket connections only (Upgrade: websocket)."))
        }
        let versions = request.headers.values(for: "sec-websocket-version")
        guard versions.count == 1, versions[0].trimmingCharacters(in: .whitespaces) == "13" else {
            return .failure(.unsupportedVersion)
        }
        let keys = request.headers.values(for: "sec-websocket-key")
        guard keys.count == 1 else { return .failure(.notAHandshake("Sec-WebSocket-Key is missing or repeated.")) }
        let key = keys[0].trimmingCharacters(in: .whitespaces)
        guard key.utf8.count == 24, Data(base64Encoded: key)?.count == 16 else {
            return .failure(.notAHandshake("Sec-WebSocket-Key must be 16 bytes in base64."))
        }
        return .success(acceptValue(forKey: key))
    }

    /// base64(SHA-1(key + the protocol's GUID)).
    public static func acceptValue(forKey key: String) -> String {
        let input = Array((key + guid).utf8)
        var digest = [UInt8](repeating: 0, count: 20)
        var length: UInt32 = 0
        _ = input.withUnsafeBufferPointer { source in
            digest.withUnsafeMutableBufferPointer { target in
                EVP_Digest(source.baseAddress, source.count, target.baseAddress, &length, EVP_sha1(), nil)
            }
        }
        return Data(digest).base64EncodedString()
    }
}

extension HTTPResponse {
    /// `101 Switching Protocols` to WebSocket: once it is queued, `session` runs as a task
    /// with the connection's `WebSocket`. `accept` comes from `WebSocketHandshake.accept`.
    public static func webSocket(
        accept: String, headers: HTTPHeaders = [:], settings: WebSocketSettings = WebSocketSettings(),
        _ session: @escaping @Sendable (WebSocket) async -> Void
    ) -> HTTPResponse {
        var all = headers
        all.append(name: "Upgrade", value: "websocket")
        all.append(name: "Sec-WebSocket-Accept", value: accept)
        var response = HTTPResponse(status: 101, headers: all)
        response.webSocket = WebSocketUpgrade(settings: settings, session: session)
        return response
    }
}
