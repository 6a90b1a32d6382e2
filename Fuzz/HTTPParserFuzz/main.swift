// libFuzzer target for HTTPRequestParser; built by scripts/fuzz.sh together with the parser's sources.

/// What one parser reported for one way of feeding the input.
struct Run: Equatable {
    var events: [HTTPParserEvent] = []
    var bufferedByteCount = 0
    var isIdle = false
    var isClosed = false
    var error: HTTPParserError?
}

/// Tight limits, so that short inputs reach every limit check.
let tightLimits = HTTPParserLimits(
    maxRequestLineLength: 48, maxHeaderSectionSize: 160, maxHeaderCount: 6, maxBodySize: 96,
    maxChunkHeaderLength: 12)

/// Inputs up to this size are also fed one byte at a time.
let byteByByteLimit = 512

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let input = UnsafeBufferPointer(start: data, count: size)
    let seed = fnv1a(input)
    for limits in [HTTPParserLimits.default, tightLimits] {
        for mode in [HTTPRequestParser.BodyMode.collect, .stream] {
            let whole = feedWhole(input, limits: limits, mode: mode)
            checkEvents(whole.events, limits: limits, mode: mode, inputSize: size)
            checkFinalState(whole)

            let at = size == 0 ? 0 : Int(seed % UInt64(size + 1))
            let split = feedSplit(input, at: at, limits: limits, mode: mode)
            expectSame(whole, split, mode: mode, "split at \(at)")

            let chunked = feedChunks(input, seed: seed, limits: limits, mode: mode)
            expectSame(whole, chunked, mode: mode, "chunks from seed \(seed)")

            if size <= byteByByteLimit {
                let bytes = feedSplit(input, at: nil, limits: limits, mode: mode)
                expectSame(whole, bytes, mode: mode, "byte by byte")
            }
        }
        // Both body modes must agree on requests, bodies and errors.
        let collect = feedWhole(input, limits: limits, mode: .collect)
        let stream = feedWhole(input, limits: limits, mode: .stream)
        check(collect.events == collected(stream.events), "collect and stream modes disagree")
        check(collect.error == stream.error && collect.isClosed == stream.isClosed, "modes end differently")
    }
    return 0
}

// MARK: - Ways of feeding

func drain(_ parser: inout HTTPRequestParser, into run: inout Run) {
    while let event = parser.next() {
        run.events.append(event)
        check(run.events.count <= 100_000, "parser does not stop producing events")
    }
    // Once drained, it stays drained.
    check(parser.next() == nil, "next() returned an event after returning nil")
}

func finish(_ parser: HTTPRequestParser, _ run: inout Run) {
    run.bufferedByteCount = parser.bufferedByteCount
    run.isIdle = parser.isIdle
    run.isClosed = parser.isClosed
    run.error = parser.error
    check(parser.bufferedByteCount >= 0, "negative bufferedByteCount")
}

func feedWhole(_ input: UnsafeBufferPointer<UInt8>, limits: HTTPParserLimits, mode: HTTPRequestParser.BodyMode) -> Run {
    var parser = HTTPRequestParser(limits: limits, bodyMode: mode)
    var run = Run()
    parser.feed(UnsafeRawBufferPointer(input))
    drain(&parser, into: &run)
    finish(parser, &run)
    return run
}

/// Two pieces split at `at`, or one byte at a time when `at` is nil; drains after each piece.
func feedSplit(
    _ input: UnsafeBufferPointer<UInt8>, at: Int?, limits: HTTPParserLimits, mode: HTTPRequestParser.BodyMode
) -> Run {
    var parser = HTTPRequestParser(limits: limits, bodyMode: mode)
    var run = Run()
    let cuts: [Int] = at.map { [0, $0, input.count] } ?? Array(0...input.count)
    for index in 0..<cuts.count - 1 where cuts[index] < cuts[index + 1] {
        parser.feed(UnsafeBufferPointer(rebasing: input[cuts[index]..<cuts[index + 1]]))
        drain(&parser, into: &run)
    }
    drain(&parser, into: &run)
    finish(parser, &run)
    return run
}

/// Pseudo-random pieces through `fill(upTo:using:)` (short reads, zero-byte reads), with
/// `next()` called after some of them only: parsing is lazy, so when it runs must not matter.
func feedChunks(
    _ input: UnsafeBufferPointer<UInt8>, seed: UInt64, limits: HTTPParserLimits, mode: HTTPRequestParser.BodyMode
) -> Run {
    var parser = HTTPRequestParser(limits: limits, bodyMode: mode)
    var run = Run()
    var random = seed | 1
    var offset = 0
    while offset < input.count {
        random = xorshift(random)
        let window = Int(random % 64) + 1
        let sent = min(Int((random >> 8) % UInt64(window + 1)), input.count - offset)
        let start = offset
        let written = parser.fill(upTo: window) { buffer -> Int in
            check(buffer.count >= window, "fill offered less room than asked")
            let source = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(input)[start..<start + sent])
            buffer.copyMemory(from: source)
            return sent
        }
        check(written == sent, "fill returned \(written), not what the reader returned (\(sent))")
        offset += sent
        if (random >> 20) & 3 != 0 { drain(&parser, into: &run) }
    }
    // EOF and errors add nothing.
    check(parser.fill(upTo: 16) { _ in 0 } == 0 && parser.fill(upTo: 16) { _ in -1 } == -1, "fill EOF")
    drain(&parser, into: &run)
    finish(parser, &run)
    return run
}

// MARK: - Invariants

func expectSame(_ whole: Run, _ other: Run, mode: HTTPRequestParser.BodyMode, _ how: @autoclosure () -> String) {
    var left = whole
    var right = other
    if mode == .stream {
        // How a streamed body is cut into events depends on arrival and means nothing.
        left.events = mergingBodies(left.events)
        right.events = mergingBodies(right.events)
    }
    check(left == right, "outcome differs when fed \(how()) (\(mode))")
}

func checkFinalState(_ run: Run) {
    if let error = run.error {
        check(run.isClosed && !run.isIdle && run.bufferedByteCount == 0, "dead parser still holds input")
        check(run.events.last == .error(error), "error not the last event")
    }
    if run.isClosed { check(run.bufferedByteCount == 0, "closed parser keeps bytes") }
    if run.isIdle { check(run.bufferedByteCount == 0 && !run.isClosed, "idle parser holds bytes or is closed") }
}

func checkEvents(
    _ events: [HTTPParserEvent], limits: HTTPParserLimits, mode: HTTPRequestParser.BodyMode, inputSize: Int
) {
    var open: HTTPRequestHead?
    var streamed = 0
    var bodyTotal = 0
    for (index, event) in events.enumerated() {
        let isLast = index == events.count - 1
        switch event {
        case .head(let head):
            check(open == nil, "head before the previous request ended")
            checkHead(head, limits: limits)
            open = head
            streamed = 0
        case .body(let bytes):
            check(mode == .stream, ".body in collect mode")
            check(!bytes.isEmpty, "empty .body")
            check(open?.hasBody == true, ".body outside a request with a body")
            streamed += bytes.count
            bodyTotal += bytes.count
            if case .contentLength(let length)? = open?.bodyFraming {
                check(streamed <= length, "more body than Content-Length")
            }
        case .end:
            check(mode == .stream, ".end in collect mode")
            guard let head = open else { return check(false, ".end without head") }
            checkBodyLength(streamed, head: head, limits: limits)
            if !head.keepAlive { check(isLast, "events after a request without keep-alive") }
            open = nil
        case .request(let head, let body):
            check(mode == .collect, ".request in stream mode")
            check(open == head, ".request head differs from the reported head")
            checkBodyLength(body.count, head: head, limits: limits)
            bodyTotal += body.count
            if !head.keepAlive { check(isLast, "events after a request without keep-alive") }
            open = nil
        case .error(let error):
            check(isLast, "events after an error")
            check([400, 413, 414, 431, 501, 505].contains(error.status), "unexpected status \(error.status)")
            check(!error.code.isEmpty && !error.message.isEmpty, "error without code or message")
        }
    }
    check(bodyTotal <= inputSize, "more body bytes than input bytes")
}

func checkBodyLength(_ count: Int, head: HTTPRequestHead, limits: HTTPParserLimits) {
    switch head.bodyFraming {
    case .empty: check(count == 0, "body without framing")
    case .contentLength(let length): check(count == length, "body of \(count) bytes, Content-Length \(length)")
    case .chunked: check(count <= limits.maxBodySize, "chunked body past maxBodySize")
    }
}

func checkHead(_ head: HTTPRequestHead, limits: HTTPParserLimits) {
    let method = Array(head.method.rawValue.utf8)
    check(!method.isEmpty && method.allSatisfy(isToken), "method not a token")
    check(head.version == .http10 || head.version == .http11, "version other than 1.0/1.1")
    let target = Array(head.target.utf8)
    check(!target.isEmpty && target.allSatisfy { $0 >= 0x21 && $0 <= 0x7E }, "target with invalid bytes")
    check(target.count <= limits.maxRequestLineLength, "target longer than the request line limit")
    check(!head.path.isEmpty, "empty path")
    if target.first == UInt8(ascii: "/") {
        let rebuilt = head.path + (head.query.map { "?" + $0 } ?? "")
        check(rebuilt == head.target, "path and query do not rebuild the target")
        check(!head.path.utf8.contains(UInt8(ascii: "?")), "path contains ?")
    }
    check(head.headers.count <= limits.maxHeaderCount, "more fields than maxHeaderCount")
    var hosts = 0
    for field in head.headers {
        let name = Array(field.name.utf8)
        let value = Array(field.value.utf8)
        check(!name.isEmpty && name.allSatisfy(isToken), "field name not a token")
        check(value.allSatisfy { ($0 >= 0x20 && $0 != 0x7F) || $0 == 0x09 }, "control byte in a field value")
        check(value.first != 0x20 && value.first != 0x09, "field value not trimmed at the start")
        check(value.last != 0x20 && value.last != 0x09, "field value not trimmed at the end")
        if HTTPHeaders.namesEqual(field.name, "host") { hosts += 1 }
    }
    check(hosts <= 1, "several Host fields accepted")
    if head.version == .http11 { check(hosts == 1, "HTTP/1.1 without Host accepted") }
    let hasContentLength = head.headers.contains("content-length")
    let hasTransferEncoding = head.headers.contains("transfer-encoding")
    check(!(hasContentLength && hasTransferEncoding), "Content-Length with Transfer-Encoding accepted")
    switch head.bodyFraming {
    case .empty: check(!hasContentLength && !hasTransferEncoding, "framing headers ignored")
    case .contentLength(let length):
        check(hasContentLength && length >= 0 && length <= limits.maxBodySize, "bad Content-Length framing")
    case .chunked: check(hasTransferEncoding && head.version == .http11, "bad chunked framing")
    }
    if head.expectsContinue { check(head.hasBody && head.version == .http11, "100-continue without a body") }
    if head.version == .http10 && !head.headers.contains("connection") {
        check(!head.keepAlive, "HTTP/1.0 keep-alive without Connection")
    }
}

// MARK: - Helpers

/// Consecutive `.body` events joined into one.
func mergingBodies(_ events: [HTTPParserEvent]) -> [HTTPParserEvent] {
    var merged: [HTTPParserEvent] = []
    for event in events {
        if case .body(let bytes) = event, case .body(let previous)? = merged.last {
            merged[merged.count - 1] = .body(previous + bytes)
        } else {
            merged.append(event)
        }
    }
    return merged
}

/// Stream-mode events as collect mode would report them (a body cut short by an error is dropped).
func collected(_ events: [HTTPParserEvent]) -> [HTTPParserEvent] {
    var result: [HTTPParserEvent] = []
    var head: HTTPRequestHead?
    var body: [UInt8] = []
    for event in events {
        switch event {
        case .head(let next):
            result.append(event)
            head = next
            body = []
        case .body(let bytes): body += bytes
        case .end:
            if let head { result.append(.request(head, body: body)) }
            head = nil
        case .request, .error: result.append(event)
        }
    }
    return result
}

@inline(__always)
func isToken(_ byte: UInt8) -> Bool {
    switch byte {
    case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
        UInt8(ascii: "0")...UInt8(ascii: "9"):
        return true
    default:
        return tokenPunctuation.contains(byte)
    }
}

let tokenPunctuation: Set<UInt8> = Set("!#$%&'*+-.^_`|~".utf8)

func fnv1a(_ bytes: UnsafeBufferPointer<UInt8>) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in bytes { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
    return hash
}

func xorshift(_ value: UInt64) -> UInt64 {
    var x = value
    x ^= x << 13
    x ^= x >> 7
    x ^= x << 17
    return x
}

/// A failed invariant: trap with the message (on stderr), so libFuzzer saves the input.
func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError("fuzz invariant violated: \(message())") }
}
