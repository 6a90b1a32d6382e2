import Foundation

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// An HTTP answer: status, headers (names lowercased), body.
struct HTTPAnswer: Sendable {
    var status: Int
    var headers: [String: String]
    var body: Data
    /// Set when the body ran past the most the client reads of an answer
    /// (`Configuration.maxAnswerBytes`, this many bytes): it was not read on (`body` is
    /// empty), the connection was closed. Not the server's answer: its pages and errors are
    /// far smaller.
    var bodyCutOff: Int? = nil

    func header(_ name: String) -> String? { headers[name.lowercased()] }

    /// Whether the answer's `Content-Type` is `type` (parameters such as `charset` aside).
    func hasType(_ type: String) -> Bool { Self.isType(type, headers["content-type"]) }

    static func isType(_ type: String, _ contentType: String?) -> Bool {
        let media = contentType?.split(separator: ";").first?.trimmingCharacters(in: .whitespaces).lowercased()
        return media == type.lowercased()
    }

    /// `Retry-After` in seconds: delta-seconds or an HTTP date. A date is counted from the
    /// answer's own `Date` (the same clock) when it has one, not from this device's clock,
    /// which may be off by hours: waiting hours for a few seconds' pause, or not at all.
    var retryAfter: TimeInterval? {
        guard let value = header("retry-after")?.trimmingCharacters(in: .whitespaces) else { return nil }
        if let seconds = Double(value), seconds >= 0 { return seconds }
        guard let date = Self.httpDate(value) else { return nil }
        let now = header("date").flatMap(Self.httpDate) ?? Date()
        return max(0, date.timeIntervalSince(now))
    }

    /// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
    static func httpDate(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return formatter.date(from: text.trimmingCharacters(in: .whitespaces))
    }

    /// Throws `.invalidResponse` when the body was cut off (`bodyCutOff`): `what` it should
    /// have been cannot be read from it.
    func checkWhole(_ what: String) throws {
        guard let limit = bodyCutOff else { return }
        throw TrunkSyncError.invalidResponse(
            "\(what) was answered \(status) with a body of over \(limit) bytes (maxAnswerBytes), not read: "
                + "not the server's")
    }

    /// Whether the body is an error of the server's (a JSON object with `error_code` or
    /// `code`), not a page of something in between (a proxy, a captive portal).
    var isServerError: Bool {
        guard let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any] else { return false }
        return object["error_code"] is String || object["code"] is String
    }

    /// The error body in any of the server's shapes (`/sync/v1`: `code`, `message`,
    /// `details`; `/auth/v1`: also `error_code`, `msg`).
    var serverError: ServerError {
        var code = "http_\(status)"
        var message = HTTPURLResponse.localizedString(forStatusCode: status)
        if let limit = bodyCutOff { message += " (a body of over \(limit) bytes, not read: not the server's)" }
        var details: [ServerError.FieldProblem] = []
        if let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any] {
            if let value = object["error_code"] as? String ?? object["code"] as? String { code = value }
            if let value = object["message"] as? String ?? object["msg"] as? String { message = value }
            for item in object["details"] as? [[String: Any]] ?? [] {
                details.append(
                    ServerError.FieldProblem(
                        index: (item["index"] as? NSNumber)?.intValue ?? -1, field: item["field"] as? String ?? "",
                        reason: item["reason"] as? String ?? ""))
            }
        }
        return ServerError(status: status, code: code, message: message, details: details, retryAfter: retryAfter)
    }
}

/// A failure below HTTP: no connection, connection lost, timeout.
struct TransportFailure: Error, CustomStringConvertible {
    var description: String
    /// The request cannot have reached the server: no network, the host unknown, the
    /// connection (or its TLS handshake) refused. Else it may have, whatever came back.
    var notSent = false

    /// `URLError` codes of failures before the request goes out.
    static let notSentCodes: Set<Int> = [
        NSURLErrorNotConnectedToInternet, NSURLErrorCannotFindHost, NSURLErrorDNSLookupFailed,
        NSURLErrorCannotConnectToHost, NSURLErrorSecureConnectionFailed, NSURLErrorServerCertificateUntrusted,
        NSURLErrorServerCertificateHasBadDate, NSURLErrorServerCertificateNotYetValid,
        NSURLErrorServerCertificateHasUnknownRoot, NSURLErrorClientCertificateRejected,
        NSURLErrorAppTransportSecurityRequiresSecureConnection, NSURLErrorInternationalRoamingOff,
        NSURLErrorDataNotAllowed, NSURLErrorCallIsActive,
    ]
}

/// Sends requests with `URLSession` (Foundation on Apple platforms, FoundationNetworking
/// on Linux) through the delegate and completion-handler APIs, which both have, and cancels
/// the request when the calling task is cancelled.
final class HTTPTransport: Sendable {
    let session: URLSession
    private let reader = BoundedReader()

    init() {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        configuration.urlCache = nil
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.timeoutIntervalForResource = 24 * 3600
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        session = URLSession(configuration: configuration, delegate: reader, delegateQueue: queue)
    }

    deinit { session.invalidateAndCancel() }

    /// Sends `request` and reads at most `maxBodyBytes` of its answer's body: past that (or
    /// when its `Content-Length` says it will be), the request is cancelled and the answer
    /// comes back without its body, `bodyCutOff` set. A misbehaving proxy's endless `200`
    /// would otherwise grow the client's memory until the request timed out, or for good
    /// while it kept coming (the timeout counts only silence).
    func send(_ request: URLRequest, maxBodyBytes: Int) async throws -> HTTPAnswer {
        try await perform { finish in
            let task = session.dataTask(with: request)
            reader.expect(task, limit: max(0, maxBodyBytes)) { response, body, cutOff, error in
                finish(
                    Self.answer(response, error) { _, _ in body }.map { answer in
                        var answer = answer
                        answer.bodyCutOff = cutOff ? maxBodyBytes : nil
                        return answer
                    })
            }
            return task
        }
    }

    /// Sends `request` and writes a `2xx` answer's body of `type` (its `Content-Type`) to
    /// `destination` as it arrives (a download task's temporary file, put in place of the
    /// file there in one step once the body is complete and `check` has not thrown:
    /// `FileSystem.replace`). A `2xx` of another type (a page of something in the way) leaves
    /// `destination` as it is, its body unread; so does one `check` refuses (its error is
    /// thrown as it is). Any other answer's body is returned in memory (an error, small), at
    /// most `maxBodyBytes` of it (past that it comes back without its body, `bodyCutOff` set).
    func download(
        _ request: URLRequest, to destination: URL, type: String, maxBodyBytes: Int,
        check: @escaping @Sendable (URL) throws -> Void = { _ in }
    ) async throws -> HTTPAnswer {
        try await perform { finish in
            session.downloadTask(with: request) { location, response, error in
                // The temporary file is removed when this handler returns: move or read it now.
                var cutOff = false
                let outcome = Self.answer(
                    response, location == nil ? error ?? TransportFailure(description: "no body") : error
                ) { status, contentType in
                    guard let location else { return Data() }
                    let stored = (200..<300).contains(status) && HTTPAnswer.isType(type, contentType)
                    if stored { try check(location) }
                    do {
                        guard (200..<300).contains(status) else {
                            let limit = max(0, maxBodyBytes)
                            let file = try FileHandle(forReadingFrom: location)
                            defer { try? file.close() }
                            let body = try file.read(upToCount: limit + 1) ?? Data()
                            cutOff = body.count > limit
                            return cutOff ? Data() : body
                        }
                        if stored { try FileSystem.replace(destination, withFileAt: location) }
                        return Data()
                    } catch {
                        throw TransportFailure(description: "cannot store the download: \(error)")
                    }
                }
                finish(
                    outcome.map { answer in
                        var answer = answer
                        answer.bodyCutOff = cutOff ? maxBodyBytes : nil
                        return answer
                    })
            }
        }
    }

    /// Runs the task `make` builds (it calls `finish` once, from its completion handler) and
    /// cancels it when the calling task is cancelled.
    private func perform(
        _ make: (@escaping @Sendable (Result<HTTPAnswer, Error>) -> Void) -> URLSessionTask
    ) async throws -> HTTPAnswer {
        let box = TaskBox()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<HTTPAnswer, Error>) in
                box.start(make { continuation.resume(with: $0) })
            }
        } onCancel: {
            box.cancel()
        }
    }

    /// A finished task's outcome: its error (cancellation as `CancellationError`, anything
    /// else as `TransportFailure`), or the answer with the body `body` makes for its status
    /// and `Content-Type`.
    private static func answer(_ response: URLResponse?, _ error: Error?, body: (Int, String?) throws -> Data)
        -> Result<HTTPAnswer, Error>
    {
        if let error {
            let nsError = error as NSError
            if nsError.domain == NSURLErrorDomain && nsError.code == NSURLErrorCancelled {
                return .failure(CancellationError())
            }
            if error is TransportFailure { return .failure(error) }
            return .failure(
                TransportFailure(
                    description: error.localizedDescription,
                    notSent: nsError.domain == NSURLErrorDomain && TransportFailure.notSentCodes.contains(nsError.code))
            )
        }
        guard let http = response as? HTTPURLResponse else {
            return .failure(TransportFailure(description: "not an HTTP response"))
        }
        var headers: [String: String] = [:]
        for (name, value) in http.allHeaderFields {
            if let name = name as? String, let value = value as? String { headers[name.lowercased()] = value }
        }
        return Result {
            HTTPAnswer(
                status: http.statusCode, headers: headers, body: try body(http.statusCode, headers["content-type"]))
        }
    }
}

/// The data task of one request, cancellable from the cancellation handler (which may run
/// before the task exists).
private final class TaskBox: @unchecked Sendable {  // state guarded by `lock`
    private let lock = NSLock()
    private var task: URLSessionTask?
    private var cancelled = false

    func start(_ task: URLSessionTask) {
        let cancelNow = lock.withLock {
            self.task = task
            return cancelled
        }
        task.resume()
        if cancelNow { task.cancel() }
    }

    func cancel() {
        let task = lock.withLock {
            cancelled = true
            return self.task
        }
        task?.cancel()
    }
}

/// The session's delegate: collects the body of each data task `HTTPTransport.send` started,
/// up to its limit, and cancels the task past it (or when the answer's `Content-Length`
/// announces more), then hands over the outcome once the task completed.
final class BoundedReader: NSObject, URLSessionDataDelegate, @unchecked Sendable {  // guarded by `lock`
    typealias Finish = @Sendable (_ response: URLResponse?, _ body: Data, _ cutOff: Bool, _ error: Error?) -> Void

    /// One task's body so far. A class: each piece is appended to the one body in place. (A
    /// struct copied out of the table and stored back made every piece copy the whole body
    /// before it: a 1 MiB page in 16 KiB pieces copied some 32 MiB, a 32 MiB answer GiBs.)
    private final class Pending {
        let limit: Int
        var body = Data()
        var cutOff = false
        let finish: Finish

        init(limit: Int, finish: @escaping Finish) {
            self.limit = limit
            self.finish = finish
        }
    }

    private let lock = NSLock()
    private var pending: [Int: Pending] = [:]

    /// Collects `task`'s body (call before the task is resumed).
    func expect(_ task: URLSessionTask, limit: Int, finish: @escaping Finish) {
        lock.withLock { pending[task.taskIdentifier] = Pending(limit: limit, finish: finish) }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        let over = lock.withLock { () -> Bool in
            guard let entry = pending[dataTask.taskIdentifier], !entry.cutOff else { return false }
            // The head's length is looked at with the first piece of the body (the
            // response-disposition delegate method is not the same on every platform).
            let announced = entry.body.isEmpty ? dataTask.response?.expectedContentLength ?? -1 : -1
            if announced > Int64(entry.limit) || entry.body.count + data.count > entry.limit {
                entry.cutOff = true
                entry.body = Data()
            } else {
                entry.body.append(data)
            }
            return entry.cutOff  // once: what comes after is dropped by the guard above
        }
        guard over else { return }
        // Not on the delegate queue: FoundationNetworking's cancel waits for its work queue,
        // which a body coming at loopback speed keeps busy; meanwhile what still arrives is
        // dropped here as it comes (the queue must go on draining), never kept.
        DispatchQueue.global().async { dataTask.cancel() }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        guard let entry = lock.withLock({ pending.removeValue(forKey: task.taskIdentifier) }) else { return }
        // Cut off: the cancellation was this reader's, not the caller's.
        entry.finish(task.response, entry.body, entry.cutOff, entry.cutOff ? nil : error)
    }

    /// Tests: where the body collected so far for `task` is in memory (nil: none).
    func bodyAddress(of task: URLSessionTask) -> UnsafeRawPointer? {
        lock.withLock { pending[task.taskIdentifier]?.body.withUnsafeBytes { $0.baseAddress } }
    }
}
