#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why the parser rejected a request: the status to answer with, a stable machine code and
/// a human message. None of them echoes the client's bytes.
///
/// After an error the parser is dead; the server answers with `status` and closes the
/// connection.
public struct HTTPParserError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The HTTP status code to answer with (400, 413, 414, 431, 501 or 505).
    public let status: Int
    /// A stable machine-readable code, e.g. `header_too_large`.
    public let code: String
    /// A short human-readable explanation, safe to send to the client.
    public let message: String

    init(status: Int, code: String, message: String) {
        self.status = status
        self.code = code
        self.message = message
    }

    /// `status code: message`.
    public var description: String { "\(status) \(code): \(message)" }

    /// 414: the request line is longer than `HTTPParserLimits.maxRequestLineLength`.
    public static let requestLineTooLong = HTTPParserError(
        status: 414, code: "request_line_too_long", message: "The request line is too long.")
    /// 431: the header (or trailer) section is larger than `HTTPParserLimits.maxHeaderSectionSize`.
    public static let headerTooLarge = HTTPParserError(
        status: 431, code: "header_too_large", message: "The request header section is too large.")
    /// 431: more header (or trailer) fields than `HTTPParserLimits.maxHeaderCount`.
    public static let tooManyHeaders = HTTPParserError(
        status: 431, code: "too_many_headers", message: "The request has too many header fields.")
    /// 413: the body is larger than `HTTPParserLimits.maxBodySize`.
    public static let bodyTooLarge = HTTPParserError(
        status: 413, code: "body_too_large", message: "The request body is too large.")
    /// 400: a line ends with LF alone instead of CRLF.
    public static let bareLineFeed = HTTPParserError(
        status: 400, code: "bare_lf", message: "Lines must end with CRLF.")
    /// 400: the request line is not `method SP target SP version`.
    public static let invalidRequestLine = HTTPParserError(
        status: 400, code: "invalid_request_line", message: "The request line is malformed.")
    /// 400: the method is not a token.
    public static let invalidMethod = HTTPParserError(
        status: 400, code: "invalid_method", message: "The request method is invalid.")
    /// 400: the request target has invalid characters or an unsupported form.
    public static let invalidTarget = HTTPParserError(
        status: 400, code: "invalid_target", message: "The request target is invalid.")
    /// 400: the protocol version is not of the form `HTTP/d.d`.
    public static let invalidVersion = HTTPParserError(
        status: 400, code: "invalid_version", message: "The HTTP version is malformed.")
    /// 505: a well-formed version other than HTTP/1.0 or HTTP/1.1.
    public static let unsupportedVersion = HTTPParserError(
        status: 505, code: "unsupported_version", message: "Only HTTP/1.0 and HTTP/1.1 are supported.")
    /// 400: a header field name contains a character that is not a token character.
    public static let invalidHeaderName = HTTPParserError(
        status: 400, code: "invalid_header_name", message: "A header field name is invalid.")
    /// 400: a header field value contains a control character other than HTAB.
    public static let invalidHeaderValue = HTTPParserError(
        status: 400, code: "invalid_header_value", message: "A header field value is invalid.")
    /// 400: a header line has no colon.
    public static let invalidHeaderLine = HTTPParserError(
        status: 400, code: "invalid_header_line", message: "A header line is malformed.")
    /// 400: whitespace between a header field name and its colon.
    public static let whitespaceBeforeColon = HTTPParserError(
        status: 400, code: "whitespace_before_colon",
        message: "Whitespace is not allowed between a header field name and the colon.")
    /// 400: a header line starts with whitespace (obsolete line folding).
    public static let obsoleteLineFolding = HTTPParserError(
        status: 400, code: "obsolete_line_folding", message: "Obsolete header line folding is not allowed.")
    /// 400: an HTTP/1.1 request without `Host`.
    public static let missingHost = HTTPParserError(
        status: 400, code: "missing_host", message: "The Host header field is required.")
    /// 400: more than one `Host` field.
    public static let duplicateHost = HTTPParserError(
        status: 400, code: "duplicate_host", message: "The Host header field must appear once.")
    /// 400: `Content-Length` is not a non-negative decimal that fits in an `Int`.
    public static let invalidContentLength = HTTPParserError(
        status: 400, code: "invalid_content_length", message: "The Content-Length is invalid.")
    /// 400: several different `Content-Length` values.
    public static let conflictingContentLength = HTTPParserError(
        status: 400, code: "conflicting_content_length", message: "Conflicting Content-Length values.")
    /// 400: both `Content-Length` and `Transfer-Encoding`.
    public static let contentLengthWithTransferEncoding = HTTPParserError(
        status: 400, code: "content_length_with_transfer_encoding",
        message: "Content-Length and Transfer-Encoding must not both be present.")
    /// 501: a transfer coding other than `chunked`.
    public static let unsupportedTransferEncoding = HTTPParserError(
        status: 501, code: "unsupported_transfer_encoding", message: "Only the chunked transfer coding is supported.")
    /// 400: `Transfer-Encoding` empty, `chunked` more than once, or sent with HTTP/1.0.
    public static let invalidTransferEncoding = HTTPParserError(
        status: 400, code: "invalid_transfer_encoding", message: "The Transfer-Encoding is invalid.")
    /// 400: a chunk size that is not hexadecimal or overflows.
    public static let invalidChunkSize = HTTPParserError(
        status: 400, code: "invalid_chunk_size", message: "A chunk size is invalid.")
    /// 400: a chunk extension with control characters.
    public static let invalidChunkExtension = HTTPParserError(
        status: 400, code: "invalid_chunk_extension", message: "A chunk extension is invalid.")
    /// 400: a chunk-size line longer than `HTTPParserLimits.maxChunkHeaderLength`.
    public static let chunkHeaderTooLong = HTTPParserError(
        status: 400, code: "chunk_header_too_long", message: "A chunk-size line is too long.")
    /// 400: chunk data not followed by CRLF.
    public static let invalidChunkTerminator = HTTPParserError(
        status: 400, code: "invalid_chunk_terminator", message: "Chunk data must be followed by CRLF.")
}

/// What the parser reports, in order, from `HTTPRequestParser.next()`.
///
/// Every request yields `.head` first. In `.collect` mode it is followed by one `.request`
/// carrying the whole body; in `.stream` mode by zero or more `.body` and one `.end`.
public enum HTTPParserEvent: Hashable, Sendable {
    /// A request head is complete. Sent before any body byte is read, so the server can
    /// answer `Expect: 100-continue` or refuse the request early.
    case head(HTTPRequestHead)
    /// The next body bytes, de-chunked (`.stream` mode). How the body is split into events
    /// depends on how the bytes arrived and means nothing.
    case body([UInt8])
    /// The request whose head was reported last is complete (`.stream` mode).
    case end
    /// The request whose head was reported last is complete, with its whole de-chunked
    /// body (`.collect` mode).
    case request(HTTPRequestHead, body: [UInt8])
    /// The bytes are not an acceptable request. The parser is dead from now on: answer
    /// with the error's status and close the connection.
    case error(HTTPParserError)
}

/// An incremental HTTP/1.1 request parser: a pure state machine without I/O.
///
/// Give it bytes as they arrive, with `feed(_:)` or by letting `read(2)` write straight
/// into its buffer with `fill(upTo:using:)`, then call `next()` until it returns `nil`
/// (it needs more bytes). Pipelined requests come out one after another; bytes after a
/// request stay buffered for the next one.
///
/// Design choices:
/// - Lines must end with CRLF; a bare LF is rejected with `400 bare_lf` (as strict servers
///   do; accepting it is what makes LF-vs-CRLF smuggling possible behind lenient proxies).
///   Empty lines before a request line are ignored (RFC 9112 §2.2).
/// - Parsing is lazy: `next()` does the work, so the caller decides how much it buffers
///   (see `bufferedByteCount`) and nothing is parsed ahead of what it consumes.
/// - Once a request without keep-alive is complete the parser stops (`isClosed`) and drops
///   anything after it; after an error it is dead.
/// - The outcome depends only on the bytes, never on how they were split into chunks.
public struct HTTPRequestParser: Sendable {
    /// How body bytes are delivered.
    public enum BodyMode: Hashable, Sendable {
        /// Buffer the body and report the complete request as `.request(head, body:)`.
        case collect
        /// Report body bytes as `.body` events as they arrive, then `.end`.
        case stream
    }

    /// The limits in force.
    public let limits: HTTPParserLimits
    /// How body bytes are delivered.
    public let bodyMode: BodyMode

    private enum State {
        case requestLine
        case headerFields
        case fixedBody(remaining: Int)
        case chunkHeader
        case chunkData(remaining: Int)
        case chunkDataEnd
        case trailerFields
        case closed
        case failed(HTTPParserError)
    }

    /// What is known of the head being parsed.
    private struct HeadBuilder {
        var method = HTTPMethod.get
        var target = ""
        var path = ""
        var query: String?
        var version = HTTPVersion.http11
        var headers = HTTPHeaders()
        var headerBytes = 0
        var fieldCount = 0
        var contentLength: Int?
        var transferEncodingSeen = false
        var transferChunkedCount = 0
        var transferUnsupported = false
        var hostCount = 0
        var connectionClose = false
        var connectionKeepAlive = false
        var expectsContinue = false
    }

    // Received bytes live in buffer[readIndex..<writeIndex]; buffer.count is the capacity.
    private var buffer: [UInt8] = []
    private var readIndex = 0
    private var writeIndex = 0
    /// Bytes of the current, incomplete line already searched for LF.
    private var scanned = 0
    private var state = State.requestLine
    private var builder = HeadBuilder()
    /// The head of the request being read, from `.head` to its end.
    private var current: HTTPRequestHead? = nil
    private static let noHead = HTTPRequestHead(
        method: .get, target: "/", path: "/", query: nil, version: .http11, headers: HTTPHeaders(),
        keepAlive: true, expectsContinue: false, bodyFraming: .empty)
    private var body: [UInt8] = []
    /// Body bytes announced so far by chunk sizes (checked against `maxBodySize`).
    private var chunkedTotal = 0
    /// The current request's body limit (`limitBody(to:)`), at most `limits.maxBodySize`.
    private var bodyLimit = Int.max
    /// The current request's body is read (framing must be honoured) but not kept.
    private var discardingBody = false
    private var trailerBytes = 0
    private var trailerCount = 0

    /// Creates a parser waiting for the first request.
    public init(limits: HTTPParserLimits = .default, bodyMode: BodyMode = .collect) {
        self.limits = limits
        self.bodyMode = bodyMode
    }

    // MARK: - Input

    /// Appends received bytes (copied once into the parser's buffer). Ignored once the
    /// parser is closed or dead.
    public mutating func feed(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty, acceptsInput else { return }
        reserveFreeSpace(bytes.count)
        let start = writeIndex
        buffer.withUnsafeMutableBytes { storage in
            UnsafeMutableRawBufferPointer(rebasing: storage[start..<start + bytes.count]).copyMemory(from: bytes)
        }
        writeIndex += bytes.count
    }

    /// Appends received bytes (`[UInt8]`, `ArraySlice<UInt8>`, `Data`, …). Ignored once the
    /// parser is closed or dead.
    public mutating func feed<Bytes: Sequence>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        let done: Void? = bytes.withContiguousStorageIfAvailable { feed(UnsafeRawBufferPointer($0)) }
        if done == nil {
            Array(bytes).withUnsafeBytes { feed($0) }
        }
    }

    /// Lets `read` write up to `maxCount` bytes straight into the parser's buffer (no extra
    /// copy), e.g. `parser.fill(upTo: 65536) { read(fd, $0.baseAddress, $0.count) }`.
    ///
    /// `read` returns how many bytes it wrote; a value of zero or less (EOF, error) adds
    /// nothing and is returned unchanged. Once the parser is closed or dead the bytes are
    /// read and dropped.
    @discardableResult
    public mutating func fill<E: Error>(
        upTo maxCount: Int, using read: (UnsafeMutableRawBufferPointer) throws(E) -> Int
    ) throws(E) -> Int {
        let count = max(maxCount, 1)
        reserveFreeSpace(count)
        let start = writeIndex
        let result: Result<Int, E> = buffer.withUnsafeMutableBytes { storage in
            do throws(E) {
                return .success(try read(UnsafeMutableRawBufferPointer(rebasing: storage[start..<start + count])))
            } catch {
                return .failure(error)
            }
        }
        let written = try result.get()
        if written > 0 && acceptsInput {
            writeIndex += min(written, count)
        }
        return written
    }

    /// Lowers the body limit for the request whose head was just reported (the route's
    /// limit): a chunked body growing past it fails with `413 body_too_large`. A
    /// `Content-Length` over it is the caller's to refuse, from the head.
    public mutating func limitBody(to limit: Int) {
        bodyLimit = limit
    }

    /// Reads the body of the request whose head was just reported without keeping it: its
    /// `.request` event comes with an empty body. For requests answered regardless of their
    /// body (an unknown path) on a connection that stays open.
    public mutating func discardBody() {
        discardingBody = true
    }

    /// Hands over the bytes received after the last request and not parsed (a connection
    /// upgraded to another protocol reads them as its first bytes); the parser is left empty.
    public mutating func takeBufferedBytes() -> [UInt8] {
        let rest = Array(buffer[readIndex..<writeIndex])
        readIndex = 0
        writeIndex = 0
        scanned = 0
        return rest
    }

    // MARK: - State

    /// Bytes received and not yet parsed: an unfinished line, or body bytes and pipelined
    /// requests that `next()` has not reached yet. Use it to stop reading when it grows.
    public var bufferedByteCount: Int { writeIndex - readIndex }

    /// Frees the buffer while nothing is buffered between two requests: an idle keep-alive
    /// connection then holds no buffer (the next request's bytes allocate one, or `adopt`
    /// gives it one). Returns the buffer given up (empty when none was), for `adopt` on
    /// another connection.
    @discardableResult
    public mutating func releaseBufferBetweenRequests() -> [UInt8] {
        guard readIndex == writeIndex, scanned == 0, case .requestLine = state else { return [] }
        var released: [UInt8] = []
        swap(&released, &buffer)
        readIndex = 0
        writeIndex = 0
        return released
    }

    /// Bytes the body being collected holds (its buffer's capacity; `.collect` mode).
    public var bodyCapacity: Int { body.capacity }

    /// Whether the parser holds no buffer (it released it, or never needed one).
    public var hasNoBuffer: Bool { buffer.isEmpty }

    /// Takes `spare` as its buffer if it holds none (a buffer another parser released: what
    /// it contains is never read). Saves allocating one for the next bytes.
    public mutating func adopt(_ spare: inout [UInt8]) {
        guard buffer.isEmpty, readIndex == writeIndex else { return }
        swap(&buffer, &spare)
        readIndex = 0
        writeIndex = 0
    }

    /// Whether the parser is between requests with nothing buffered: a connection closed
    /// now loses no request.
    public var isIdle: Bool {
        if case .requestLine = state { return readIndex == writeIndex }
        return false
    }

    /// Whether no further request will be parsed: a request without keep-alive ended, or
    /// the parser failed.
    public var isClosed: Bool {
        switch state {
        case .closed, .failed: true
        default: false
        }
    }

    /// The error the parser died of, if any.
    public var error: HTTPParserError? {
        if case .failed(let error) = state { return error }
        return nil
    }

    private var acceptsInput: Bool { !isClosed }

    // MARK: - Output

    /// Parses what has been received and returns the next event, or `nil` when more bytes
    /// are needed (or the parser is closed or dead). Call it until it returns `nil`.
    public mutating func next() -> HTTPParserEvent? {
        if isClosed { return nil }
        let storage = buffer
        return storage.withUnsafeBufferPointer { bytes in
            do throws(HTTPParserError) {
                return try step(bytes)
            } catch {
                state = .failed(error)
                readIndex = writeIndex
                scanned = 0
                body = []
                builder = HeadBuilder()
                return .error(error)
            }
        }
    }

    private mutating func step(_ p: UnsafeBufferPointer<UInt8>) throws(HTTPParserError) -> HTTPParserEvent? {
        while true {
            switch state {
            case .requestLine:
                guard let lineFeed = findLineFeed(p) else {
                    // A line still without LF may end in the CR of its CRLF.
                    if bufferedByteCount - 1 > limits.maxRequestLineLength { throw .requestLineTooLong }
                    return nil
                }
                let start = readIndex
                let end = try lineContentEnd(
                    p, start: start, lineFeed: lineFeed, limit: limits.maxRequestLineLength,
                    tooLong: .requestLineTooLong)
                consumeLine(through: lineFeed)
                if end == start { continue }
                try parseRequestLine(p, from: start, to: end)
                builder.headers.reserveCapacity(16)
                state = .headerFields

            case .headerFields:
                guard let lineFeed = findLineFeed(p) else {
                    if builder.headerBytes + bufferedByteCount > limits.maxHeaderSectionSize {
                        throw .headerTooLarge
                    }
                    return nil
                }
                let start = readIndex
                builder.headerBytes += lineFeed + 1 - start
                if builder.headerBytes > limits.maxHeaderSectionSize { throw .headerTooLarge }
                let end = try lineContentEnd(p, start: start, lineFeed: lineFeed, limit: .max, tooLong: .headerTooLarge)
                consumeLine(through: lineFeed)
                if end == start { return try finishHead() }
                builder.fieldCount += 1
                if builder.fieldCount > limits.maxHeaderCount { throw .tooManyHeaders }
                try parseField(p, from: start, to: end, isTrailer: false)

            case .fixedBody(let remaining):
                if remaining == 0 { return finishMessage() }
                let count = min(bufferedByteCount, remaining)
                if count == 0 { return nil }
                let bytes = UnsafeBufferPointer(rebasing: p[readIndex..<readIndex + count])
                readIndex += count
                state = .fixedBody(remaining: remaining - count)
                switch bodyMode {
                case .stream: return .body(Array(bytes))
                case .collect: appendToBody(bytes, expectedTotal: body.count + remaining)
                }

            case .chunkHeader:
                guard let lineFeed = findLineFeed(p) else {
                    if bufferedByteCount - 1 > limits.maxChunkHeaderLength { throw .chunkHeaderTooLong }
                    return nil
                }
                let start = readIndex
                let end = try lineContentEnd(
                    p, start: start, lineFeed: lineFeed, limit: limits.maxChunkHeaderLength,
                    tooLong: .chunkHeaderTooLong)
                consumeLine(through: lineFeed)
                let size = try parseChunkHeader(p, from: start, to: end)
                if size == 0 {
                    trailerBytes = 0
                    trailerCount = 0
                    state = .trailerFields
                } else {
                    if size > min(limits.maxBodySize, bodyLimit) - chunkedTotal { throw .bodyTooLarge }
                    chunkedTotal += size
                    state = .chunkData(remaining: size)
                }

            case .chunkData(let remaining):
                let count = min(bufferedByteCount, remaining)
                if count == 0 { return nil }
                let bytes = UnsafeBufferPointer(rebasing: p[readIndex..<readIndex + count])
                readIndex += count
                state = count == remaining ? .chunkDataEnd : .chunkData(remaining: remaining - count)
                switch bodyMode {
                case .stream: return .body(Array(bytes))
                case .collect: appendToBody(bytes, expectedTotal: nil)
                }

            case .chunkDataEnd:
                let available = bufferedByteCount
                if available == 0 { return nil }
                if p[readIndex] != cr { throw .invalidChunkTerminator }
                if available == 1 { return nil }
                if p[readIndex + 1] != lf { throw .invalidChunkTerminator }
                readIndex += 2
                state = .chunkHeader

            case .trailerFields:
                guard let lineFeed = findLineFeed(p) else {
                    if trailerBytes + bufferedByteCount > limits.maxHeaderSectionSize { throw .headerTooLarge }
                    return nil
                }
                let start = readIndex
                trailerBytes += lineFeed + 1 - start
                if trailerBytes > limits.maxHeaderSectionSize { throw .headerTooLarge }
                let end = try lineContentEnd(p, start: start, lineFeed: lineFeed, limit: .max, tooLong: .headerTooLarge)
                consumeLine(through: lineFeed)
                if end == start { return finishMessage() }
                trailerCount += 1
                if trailerCount > limits.maxHeaderCount { throw .tooManyHeaders }
                try parseField(p, from: start, to: end, isTrailer: true)

            case .closed, .failed:
                return nil
            }
        }
    }

    // MARK: - Lines

    /// The index of the LF ending the current line, or `nil` (remembering how far it looked).
    private mutating func findLineFeed(_ p: UnsafeBufferPointer<UInt8>) -> Int? {
        let from = readIndex + scanned
        let count = writeIndex - from
        if count > 0, let base = p.baseAddress, let hit = memchr(base + from, Int32(lf), count) {
            return UnsafeRawPointer(base).distance(to: UnsafeRawPointer(hit))
        }
        scanned = writeIndex - readIndex
        return nil
    }

    private mutating func consumeLine(through lineFeed: Int) {
        readIndex = lineFeed + 1
        scanned = 0
    }

    /// The end of the line's content (before CRLF). The length check comes first so that a
    /// line is judged the same whether or not its end has arrived yet.
    private func lineContentEnd(
        _ p: UnsafeBufferPointer<UInt8>, start: Int, lineFeed: Int, limit: Int, tooLong: HTTPParserError
    ) throws(HTTPParserError) -> Int {
        let hasCR = lineFeed > start && p[lineFeed - 1] == cr
        let end = hasCR ? lineFeed - 1 : lineFeed
        if end - start > limit { throw tooLong }
        if !hasCR { throw .bareLineFeed }
        return end
    }

    // MARK: - Request line

    private mutating func parseRequestLine(
        _ p: UnsafeBufferPointer<UInt8>, from start: Int, to end: Int
    ) throws(HTTPParserError) {
        guard let methodEnd = firstIndex(of: sp, in: p, from: start, to: end), methodEnd > start else {
            throw .invalidRequestLine
        }
        for i in start..<methodEnd where !isTokenByte(p[i]) { throw .invalidMethod }
        let targetStart = methodEnd + 1
        guard let targetEnd = firstIndex(of: sp, in: p, from: targetStart, to: end), targetEnd > targetStart else {
            throw .invalidRequestLine
        }
        builder.version = try parseVersion(p, from: targetEnd + 1, to: end)
        builder.method = method(p, start, methodEnd)

        for i in targetStart..<targetEnd {
            let byte = p[i]
            if byte < 0x21 || byte > 0x7E { throw .invalidTarget }
        }
        let target = string(p, targetStart, targetEnd)
        builder.target = target
        let first = p[targetStart]
        if first == slash {
            guard let mark = firstIndex(of: questionMark, in: p, from: targetStart, to: targetEnd) else {
                builder.path = target
                builder.query = nil
                return
            }
            builder.path = string(p, targetStart, mark)
            builder.query = string(p, mark + 1, targetEnd)
        } else if first == asterisk && targetEnd - targetStart == 1 {
            guard builder.method == .options else { throw .invalidTarget }
            builder.path = target
            builder.query = nil
        } else if let authorityStart = absoluteFormAuthorityStart(p, from: targetStart, to: targetEnd) {
            var pathStart = authorityStart
            while pathStart < targetEnd && p[pathStart] != slash && p[pathStart] != questionMark { pathStart += 1 }
            guard pathStart > authorityStart else { throw .invalidTarget }
            let mark = firstIndex(of: questionMark, in: p, from: pathStart, to: targetEnd)
            let pathEnd = mark ?? targetEnd
            builder.path = pathEnd > pathStart ? string(p, pathStart, pathEnd) : "/"
            builder.query = mark.map { string(p, $0 + 1, targetEnd) }
        } else {
            throw .invalidTarget
        }
    }

    /// The method of `p[start..<end]`: the usual ones without making a string.
    private func method(_ p: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int) -> HTTPMethod {
        switch end - start {
        case 3:
            if equals(p, start, end, "GET") { return .get }
            if equals(p, start, end, "PUT") { return .put }
        case 4:
            if equals(p, start, end, "POST") { return .post }
            if equals(p, start, end, "HEAD") { return .head }
        case 5:
            if equals(p, start, end, "PATCH") { return .patch }
        case 6:
            if equals(p, start, end, "DELETE") { return .delete }
        case 7:
            if equals(p, start, end, "OPTIONS") { return .options }
        default:
            break
        }
        return HTTPMethod(rawValue: string(p, start, end))
    }

    /// For `http://` or `https://` (any case), the index after `//`.
    private func absoluteFormAuthorityStart(_ p: UnsafeBufferPointer<UInt8>, from start: Int, to end: Int) -> Int? {
        for scheme: StaticString in ["http://", "https://"] {
            let count = scheme.utf8CodeUnitCount
            if end - start > count && equalsIgnoringCase(p, start, start + count, scheme) {
                return start + count
            }
        }
        return nil
    }

    private func parseVersion(
        _ p: UnsafeBufferPointer<UInt8>, from start: Int, to end: Int
    ) throws(HTTPParserError) -> HTTPVersion {
        // Exactly "HTTP/" DIGIT "." DIGIT, case-sensitive (RFC 9112 §2.3).
        guard end - start == 8,
            p[start] == 0x48, p[start + 1] == 0x54, p[start + 2] == 0x54, p[start + 3] == 0x50,
            p[start + 4] == slash, p[start + 6] == dot
        else { throw .invalidVersion }
        let major = p[start + 5] &- zero
        let minor = p[start + 7] &- zero
        guard major < 10, minor < 10 else { throw .invalidVersion }
        guard major == 1, minor <= 1 else { throw .unsupportedVersion }
        return minor == 1 ? .http11 : .http10
    }

    // MARK: - Header fields

    private mutating func parseField(
        _ p: UnsafeBufferPointer<UInt8>, from start: Int, to end: Int, isTrailer: Bool
    ) throws(HTTPParserError) {
        let first = p[start]
        if first == sp || first == htab { throw .obsoleteLineFolding }
        var colon = start
        while colon < end && isTokenByte(p[colon]) { colon += 1 }
        guard colon < end, p[colon] == colonByte else {
            if colon == end { throw .invalidHeaderLine }
            if p[colon] == sp || p[colon] == htab {
                if firstIndex(of: colonByte, in: p, from: colon, to: end) != nil { throw .whitespaceBeforeColon }
                throw .invalidHeaderLine
            }
            throw .invalidHeaderName
        }
        if colon == start { throw .invalidHeaderName }

        var valueStart = colon + 1
        var valueEnd = end
        while valueStart < valueEnd && (p[valueStart] == sp || p[valueStart] == htab) { valueStart += 1 }
        while valueEnd > valueStart && (p[valueEnd - 1] == sp || p[valueEnd - 1] == htab) { valueEnd -= 1 }
        for i in valueStart..<valueEnd {
            let byte = p[i]
            if (byte < 0x20 && byte != htab) || byte == 0x7F { throw .invalidHeaderValue }
        }
        if isTrailer { return }

        try interpretField(p, name: start..<colon, value: valueStart..<valueEnd)
        builder.headers.append(name: string(p, start, colon), value: string(p, valueStart, valueEnd))
    }

    /// Records what the framing and connection logic needs from a header field.
    private mutating func interpretField(
        _ p: UnsafeBufferPointer<UInt8>, name: Range<Int>, value: Range<Int>
    ) throws(HTTPParserError) {
        switch name.count {
        case 4:
            if equalsIgnoringCase(p, name.lowerBound, name.upperBound, "host") { builder.hostCount += 1 }
        case 6:
            if equalsIgnoringCase(p, name.lowerBound, name.upperBound, "expect"),
                equalsIgnoringCase(p, value.lowerBound, value.upperBound, "100-continue")
            {
                builder.expectsContinue = true
            }
        case 10:
            guard equalsIgnoringCase(p, name.lowerBound, name.upperBound, "connection") else { return }
            forEachListElement(p, value) { start, end in
                if equalsIgnoringCase(p, start, end, "close") {
                    builder.connectionClose = true
                } else if equalsIgnoringCase(p, start, end, "keep-alive") {
                    builder.connectionKeepAlive = true
                }
            }
        case 14:
            guard equalsIgnoringCase(p, name.lowerBound, name.upperBound, "content-length") else { return }
            try parseContentLength(p, value)
        case 17:
            guard equalsIgnoringCase(p, name.lowerBound, name.upperBound, "transfer-encoding") else { return }
            builder.transferEncodingSeen = true
            forEachListElement(p, value) { start, end in
                if equalsIgnoringCase(p, start, end, "chunked") {
                    builder.transferChunkedCount += 1
                } else {
                    builder.transferUnsupported = true
                }
            }
        default:
            return
        }
    }

    /// `Content-Length` as a comma list of identical decimals; empty elements are invalid.
    private mutating func parseContentLength(
        _ p: UnsafeBufferPointer<UInt8>, _ value: Range<Int>
    ) throws(HTTPParserError) {
        var elementStart = value.lowerBound
        while true {
            let comma = firstIndex(of: commaByte, in: p, from: elementStart, to: value.upperBound)
            var start = elementStart
            var end = comma ?? value.upperBound
            while start < end && (p[start] == sp || p[start] == htab) { start += 1 }
            while end > start && (p[end - 1] == sp || p[end - 1] == htab) { end -= 1 }
            if start == end { throw .invalidContentLength }
            var length = 0
            for i in start..<end {
                let digit = p[i] &- zero
                guard digit < 10 else { throw .invalidContentLength }
                let (shifted, overflow1) = length.multipliedReportingOverflow(by: 10)
                let (sum, overflow2) = shifted.addingReportingOverflow(Int(digit))
                if overflow1 || overflow2 { throw .invalidContentLength }
                length = sum
            }
            if let previous = builder.contentLength, previous != length { throw .conflictingContentLength }
            builder.contentLength = length
            guard let comma else { return }
            elementStart = comma + 1
        }
    }

    /// Calls `body` with the bounds of each non-empty, OWS-trimmed element of a comma list.
    private func forEachListElement(
        _ p: UnsafeBufferPointer<UInt8>, _ value: Range<Int>, _ body: (Int, Int) -> Void
    ) {
        var elementStart = value.lowerBound
        while elementStart <= value.upperBound {
            let comma = firstIndex(of: commaByte, in: p, from: elementStart, to: value.upperBound)
            var start = elementStart
            var end = comma ?? value.upperBound
            while start < end && (p[start] == sp || p[start] == htab) { start += 1 }
            while end > start && (p[end - 1] == sp || p[end - 1] == htab) { end -= 1 }
            if start < end { body(start, end) }
            guard let comma else { return }
            elementStart = comma + 1
        }
    }

    private mutating func finishHead() throws(HTTPParserError) -> HTTPParserEvent {
        var parsed = HeadBuilder()
        swap(&parsed, &builder)
        var framing = HTTPRequestHead.BodyFraming.empty
        if parsed.transferEncodingSeen {
            if parsed.contentLength != nil { throw .contentLengthWithTransferEncoding }
            // RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 means faulty framing.
            if parsed.version == .http10 { throw .invalidTransferEncoding }
            if parsed.transferUnsupported { throw .unsupportedTransferEncoding }
            if parsed.transferChunkedCount != 1 { throw .invalidTransferEncoding }
            framing = .chunked
        } else if let length = parsed.contentLength {
            framing = .contentLength(length)
        }
        if parsed.hostCount > 1 { throw .duplicateHost }
        if parsed.hostCount == 0 && parsed.version == .http11 { throw .missingHost }
        if case .contentLength(let length) = framing, length > limits.maxBodySize { throw .bodyTooLarge }

        let isHTTP11 = parsed.version == .http11
        let keepAlive = !parsed.connectionClose && (isHTTP11 || parsed.connectionKeepAlive)
        let head = HTTPRequestHead(
            method: parsed.method, target: parsed.target, path: parsed.path, query: parsed.query,
            version: parsed.version, headers: parsed.headers, keepAlive: keepAlive,
            expectsContinue: isHTTP11 && parsed.expectsContinue && HTTPRequestHead.hasBody(framing),
            bodyFraming: framing)
        current = head
        chunkedTotal = 0
        bodyLimit = Int.max
        discardingBody = false
        switch framing {
        case .empty: state = .fixedBody(remaining: 0)
        case .contentLength(let length): state = .fixedBody(remaining: length)
        case .chunked: state = .chunkHeader
        }
        return .head(head)
    }

    private mutating func finishMessage() -> HTTPParserEvent {
        // Moved out, not copied: the parser needs nothing of this head any more.
        var head: HTTPRequestHead? = nil
        swap(&head, &current)
        let keepAlive = head?.keepAlive ?? true
        let event: HTTPParserEvent
        switch bodyMode {
        case .collect:
            event = .request(head ?? Self.noHead, body: body)
            body = []
        case .stream:
            event = .end
        }
        if keepAlive {
            state = .requestLine
        } else {
            state = .closed
            readIndex = writeIndex
            scanned = 0
        }
        return event
    }

    // MARK: - Chunked body

    /// The size of a chunk-size line `1*HEXDIG [ BWS ";" chunk-ext ]`; extensions are ignored.
    private func parseChunkHeader(
        _ p: UnsafeBufferPointer<UInt8>, from start: Int, to end: Int
    ) throws(HTTPParserError) -> Int {
        var size = 0
        var i = start
        while i < end, let digit = hexValue(p[i]) {
            let (shifted, overflow1) = size.multipliedReportingOverflow(by: 16)
            let (sum, overflow2) = shifted.addingReportingOverflow(digit)
            if overflow1 || overflow2 { throw .invalidChunkSize }
            size = sum
            i += 1
        }
        if i == start { throw .invalidChunkSize }
        if i == end { return size }
        while i < end && (p[i] == sp || p[i] == htab) { i += 1 }
        guard i < end, p[i] == semicolon else { throw .invalidChunkSize }
        for j in (i + 1)..<end {
            let byte = p[j]
            if (byte < 0x20 && byte != htab) || byte == 0x7F { throw .invalidChunkExtension }
        }
        return size
    }

    private mutating func appendToBody(_ bytes: UnsafeBufferPointer<UInt8>, expectedTotal: Int?) {
        if discardingBody { return }
        let needed = body.count + bytes.count
        if needed > body.capacity {
            // Grow geometrically, but never past a declared Content-Length.
            var capacity = max(needed, body.capacity * 2)
            if let expectedTotal { capacity = min(capacity, expectedTotal) }
            body.reserveCapacity(capacity)
        }
        body.append(contentsOf: bytes)
    }

    // MARK: - Buffer

    /// Makes room for `count` more bytes after `writeIndex`, moving unread bytes to the front
    /// (memmove/memcpy, never byte by byte) and growing the buffer geometrically.
    private mutating func reserveFreeSpace(_ count: Int) {
        if readIndex == writeIndex {
            readIndex = 0
            writeIndex = 0
            // Give back a buffer that a large request grew, once it is drained.
            if buffer.count > 256 * 1024 && count <= 256 * 1024 { buffer = [] }
        }
        if buffer.count - writeIndex >= count { return }
        let pending = writeIndex - readIndex
        let from = readIndex
        let needed = pending + count
        if buffer.count >= needed {
            buffer.withUnsafeMutableBytes { storage in
                guard let base = storage.baseAddress else { return }
                memmove(base, base + from, pending)
            }
        } else {
            let newCount = max(needed, buffer.count * 2, 512)
            let old = buffer
            buffer = [UInt8](unsafeUninitializedCapacity: newCount) { storage, initializedCount in
                guard let target = storage.baseAddress else { return }
                old.withUnsafeBytes { source in
                    if pending > 0, let base = source.baseAddress { memcpy(target, base + from, pending) }
                }
                memset(target + pending, 0, newCount - pending)
                initializedCount = newCount
            }
        }
        readIndex = 0
        writeIndex = pending
    }
}

// MARK: - Byte helpers

private let cr: UInt8 = 0x0D
private let lf: UInt8 = 0x0A
private let sp: UInt8 = 0x20
private let htab: UInt8 = 0x09
private let colonByte: UInt8 = 0x3A
private let commaByte: UInt8 = 0x2C
private let semicolon: UInt8 = 0x3B
private let slash: UInt8 = 0x2F
private let questionMark: UInt8 = 0x3F
private let asterisk: UInt8 = 0x2A
private let dot: UInt8 = 0x2E
private let zero: UInt8 = 0x30

/// RFC 9110 `tchar`: ALPHA, DIGIT and ``!#$%&'*+-.^_`|~``, as two 64-bit masks.
@inline(__always)
private func isTokenByte(_ byte: UInt8) -> Bool {
    if byte < 64 { return (0x03FF_6CFA_0000_0000 as UInt64) >> UInt64(byte) & 1 == 1 }
    if byte < 128 { return (0x57FF_FFFF_C7FF_FFFE as UInt64) >> UInt64(byte - 64) & 1 == 1 }
    return false
}

@inline(__always)
private func hexValue(_ byte: UInt8) -> Int? {
    switch byte {
    case 0x30...0x39: Int(byte - 0x30)
    case 0x41...0x46: Int(byte - 0x41 + 10)
    case 0x61...0x66: Int(byte - 0x61 + 10)
    default: nil
    }
}

@inline(__always)
private func firstIndex(of byte: UInt8, in p: UnsafeBufferPointer<UInt8>, from start: Int, to end: Int) -> Int? {
    guard start < end, let base = p.baseAddress, let hit = memchr(base + start, Int32(byte), end - start) else {
        return nil
    }
    return UnsafeRawPointer(base).distance(to: UnsafeRawPointer(hit))
}

/// Whether `p[start..<end]` equals `lowercase` ignoring ASCII case (`lowercase` must be lowercase).
@inline(__always)
private func equalsIgnoringCase(
    _ p: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int, _ lowercase: StaticString
) -> Bool {
    let count = lowercase.utf8CodeUnitCount
    guard end - start == count else { return false }
    let expected = lowercase.utf8Start
    for i in 0..<count where HTTPHeaders.asciiLowercased(p[start + i]) != expected[i] {
        return false
    }
    return true
}

/// Whether `p[start..<end]` is exactly `text` (case-sensitive).
@inline(__always)
private func equals(_ p: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int, _ text: StaticString) -> Bool {
    let count = text.utf8CodeUnitCount
    guard end - start == count, let base = p.baseAddress else { return false }
    return memcmp(base + start, text.utf8Start, count) == 0
}

@inline(__always)
private func string(_ p: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int) -> String {
    String(decoding: UnsafeBufferPointer(rebasing: p[start..<end]), as: UTF8.self)
}
