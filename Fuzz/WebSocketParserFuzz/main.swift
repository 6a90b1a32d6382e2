// libFuzzer target for WebSocketFrameParser; built by scripts/fuzz.sh together with the parser's source.

/// Tight limits, so that short inputs reach the size checks.
let tightLimits = WebSocketLimits(maxFrameSize: 130, maxMessageSize: 200)

func run(_ input: UnsafeBufferPointer<UInt8>, limits: WebSocketLimits, cuts: [Int]) -> [WebSocketFrameEvent] {
    var parser = WebSocketFrameParser(limits: limits)
    var events: [WebSocketFrameEvent] = []
    var start = 0
    for end in cuts + [input.count] where end >= start {
        parser.feed(UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: input[start..<end])))
        while let event = parser.next() { events.append(event) }
        start = end
    }
    return events
}

func check(_ events: [WebSocketFrameEvent], limits: WebSocketLimits) {
    for (index, event) in events.enumerated() {
        switch event {
        case .text(let bytes):
            precondition(bytes.count <= limits.maxMessageSize, "text over the message limit")
            precondition(String(validating: bytes, as: UTF8.self) != nil, "text that is not UTF-8")
        case .binary(let bytes):
            precondition(bytes.count <= limits.maxMessageSize, "binary over the message limit")
        case .ping(let bytes), .pong(let bytes):
            precondition(bytes.count <= 125, "control frame over 125 bytes")
        case .close(let code, let reason):
            precondition(code.map { $0.isValidOnTheWire } ?? true, "close code not allowed")
            precondition(String(validating: reason, as: UTF8.self) != nil, "close reason not UTF-8")
            precondition(index == events.count - 1, "an event after a close")
        case .error:
            precondition(index == events.count - 1, "an event after an error")
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let input = UnsafeBufferPointer(start: data, count: size)
    for limits in [WebSocketLimits.default, tightLimits] {
        let whole = run(input, limits: limits, cuts: [])
        check(whole, limits: limits)
        let at = size == 0 ? 0 : Int(input.reduce(UInt64(1469598103934665603)) { ($0 ^ UInt64($1)) &* 1099511628211 } % UInt64(size + 1))
        precondition(run(input, limits: limits, cuts: [at]) == whole, "split at \(at) differs")
        if size <= 512 {
            precondition(run(input, limits: limits, cuts: Array(0..<size)) == whole, "byte by byte differs")
        }
    }
    return 0
}
