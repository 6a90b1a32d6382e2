/// A WebSocket close status code (RFC 6455 section 7.4).
public struct WebSocketCloseCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }
    public init(_ rawValue: UInt16) { self.rawValue = rawValue }

    /// `1000`: the purpose of the connection is fulfilled.
    public static let normal = WebSocketCloseCode(1000)
    /// `1001`: the server is going away (shutdown).
    public static let goingAway = WebSocketCloseCode(1001)
    /// `1002`: the peer broke the protocol (an unmasked frame, a bad opcode …).
    public static let protocolError = WebSocketCloseCode(1002)
    /// `1003`: a kind of message the endpoint does not take.
    public static let unsupportedData = WebSocketCloseCode(1003)
    /// `1007`: a text message (or close reason) that is not UTF-8.
    public static let invalidPayload = WebSocketCloseCode(1007)
    /// `1008`: a message against the endpoint's policy (messages faster than it handles them).
    public static let policyViolation = WebSocketCloseCode(1008)
    /// `1009`: a frame or message over the size limits.
    public static let messageTooBig = WebSocketCloseCode(1009)
    /// `1011`: the server met a condition it cannot handle.
    public static let internalError = WebSocketCloseCode(1011)
    /// `1013`: try again later (the server is at capacity, or the client read too slowly).
    public static let tryAgainLater = WebSocketCloseCode(1013)

    /// Whether a peer may send this code in a close frame (1004-1006 and 1015 are reserved
    /// for local use; 1000-2999 are the protocol's, 3000-4999 the applications').
    public var isValidOnTheWire: Bool {
        switch rawValue {
        case 1000...1003, 1007...1014: return true
        case 3000...4999: return true
        default: return false
        }
    }

    public var description: String { String(rawValue) }
}

/// Size limits of the WebSocket frame parser.
public struct WebSocketLimits: Sendable, Equatable {
    /// Largest payload of one frame, in bytes; more → close `1009`.
    public var maxFrameSize: Int
    /// Largest message (the payloads of its fragments together); more → close `1009`.
    public var maxMessageSize: Int

    public init(maxFrameSize: Int, maxMessageSize: Int) {
        self.maxFrameSize = max(125, maxFrameSize)
        self.maxMessageSize = max(125, maxMessageSize)
    }

    /// 64 KiB frames and messages.
    public static let `default` = WebSocketLimits(maxFrameSize: 64 * 1024, maxMessageSize: 64 * 1024)
}

/// What the parser found in the client's bytes.
public enum WebSocketFrameEvent: Equatable, Sendable {
    /// A complete text message, its UTF-8 checked.
    case text([UInt8])
    /// A complete binary message.
    case binary([UInt8])
    case ping([UInt8])
    case pong([UInt8])
    /// The client's close frame: its code (nil when it sent none) and reason (UTF-8 checked).
    case close(WebSocketCloseCode?, [UInt8])
    /// The client broke the protocol or a limit: fail the connection with this code. Nothing
    /// more is parsed.
    case error(WebSocketCloseCode, String)
}

/// Parses the frames a WebSocket client sends (RFC 6455 section 5): masking required, RSV
/// bits zero, known opcodes only, control frames unfragmented and at most 125 bytes,
/// continuation frames only inside a fragmented message, text UTF-8 valid, frame and message
/// sizes within `WebSocketLimits` (checked from the frame header, before its payload is
/// buffered). Pure: no I/O, no clock; bytes in, events out.
///
/// It buffers at most one frame's header and payload beyond what was already returned, plus
/// the fragments of the message in progress (both bounded by the limits).
public struct WebSocketFrameParser: Sendable {
    public let limits: WebSocketLimits
    private var buffer: [UInt8] = []
    private var start = 0
    /// The opcode of the fragmented message in progress (1 text, 2 binary), and its bytes.
    private var messageOpcode: UInt8? = nil
    private var message: [UInt8] = []
    /// An error or a close was returned: nothing more is parsed.
    public private(set) var isClosed = false

    public init(limits: WebSocketLimits = .default) {
        self.limits = limits
    }

    /// Bytes received and not yet returned as (part of) an event.
    public var bufferedByteCount: Int { buffer.count - start + message.count }

    /// Adds bytes received from the client.
    public mutating func feed(_ bytes: UnsafeRawBufferPointer) {
        guard !isClosed else { return }
        if start > 4096, start * 2 > buffer.count {
            buffer.removeSubrange(0..<start)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// Adds bytes received from the client.
    public mutating func feed(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { feed($0) }
    }

    /// The next complete event, or nil when more bytes are needed (or the parser is closed).
    public mutating func next() -> WebSocketFrameEvent? {
        while !isClosed {
            let available = buffer.count - start
            if available == 0, !buffer.isEmpty {
                // Everything was returned: an idle socket keeps no buffer.
                buffer = []
                start = 0
            }
            guard available >= 2 else { return nil }
            let first = buffer[start]
            let second = buffer[start + 1]
            let fin = first & 0x80 != 0
            let opcode = first & 0x0F
            if first & 0x70 != 0 { return fail(.protocolError, "reserved bits set without an extension") }
            guard second & 0x80 != 0 else { return fail(.protocolError, "client frames must be masked") }
            var headerSize = 6  // 2 + mask
            var length = UInt64(second & 0x7F)
            if length == 126 {
                headerSize = 8
                guard available >= 4 else { return nil }
                length = UInt64(buffer[start + 2]) << 8 | UInt64(buffer[start + 3])
            } else if length == 127 {
                headerSize = 14
                guard available >= 10 else { return nil }
                length = 0
                for index in 2..<10 { length = length << 8 | UInt64(buffer[start + index]) }
                if length >> 63 != 0 { return fail(.protocolError, "frame length has its top bit set") }
            }
            let isControl = opcode & 0x08 != 0
            switch opcode {
            case 0x0:
                if messageOpcode == nil {
                    return fail(.protocolError, "continuation frame without a message to continue")
                }
            case 0x1, 0x2:
                if messageOpcode != nil { return fail(.protocolError, "new message before the fragmented one ended") }
            case 0x8, 0x9, 0xA:
                if !fin { return fail(.protocolError, "fragmented control frame") }
                if length > 125 { return fail(.protocolError, "control frame longer than 125 bytes") }
            default:
                return fail(.protocolError, "unknown opcode \(opcode)")
            }
            if !isControl {
                if length > UInt64(limits.maxFrameSize) {
                    return fail(.messageTooBig, "frame larger than \(limits.maxFrameSize) bytes")
                }
                if UInt64(message.count) + length > UInt64(limits.maxMessageSize) {
                    return fail(.messageTooBig, "message larger than \(limits.maxMessageSize) bytes")
                }
            }
            let payloadLength = Int(length)
            guard available >= headerSize + payloadLength else { return nil }
            let maskAt = start + headerSize - 4
            let mask = (buffer[maskAt], buffer[maskAt + 1], buffer[maskAt + 2], buffer[maskAt + 3])
            let payloadStart = start + headerSize
            var payload = [UInt8](repeating: 0, count: payloadLength)
            buffer.withUnsafeBufferPointer { source in
                payload.withUnsafeMutableBufferPointer { target in
                    for index in 0..<payloadLength {
                        let key: UInt8
                        switch index & 3 {
                        case 0: key = mask.0
                        case 1: key = mask.1
                        case 2: key = mask.2
                        default: key = mask.3
                        }
                        target[index] = source[payloadStart + index] ^ key
                    }
                }
            }
            start = payloadStart + payloadLength
            switch opcode {
            case 0x8:
                if payload.count == 1 { return fail(.protocolError, "close frame with a one-byte payload") }
                guard payload.count >= 2 else {
                    isClosed = true
                    return .close(nil, [])
                }
                let code = WebSocketCloseCode(UInt16(payload[0]) << 8 | UInt16(payload[1]))
                guard code.isValidOnTheWire else { return fail(.protocolError, "close code \(code) is not allowed") }
                let reason = Array(payload[2...])
                guard UTF8Validation.isValid(reason) else { return fail(.invalidPayload, "close reason is not UTF-8") }
                isClosed = true
                return .close(code, reason)
            case 0x9:
                return .ping(payload)
            case 0xA:
                return .pong(payload)
            default:
                let kind = opcode == 0 ? messageOpcode ?? 1 : opcode
                if fin {
                    let whole: [UInt8]
                    if message.isEmpty {
                        whole = payload
                    } else {
                        message.append(contentsOf: payload)
                        whole = message
                        message = []
                    }
                    messageOpcode = nil
                    if kind == 0x1 {
                        guard UTF8Validation.isValid(whole) else {
                            return fail(.invalidPayload, "text message is not UTF-8")
                        }
                        return .text(whole)
                    }
                    return .binary(whole)
                }
                messageOpcode = kind
                message.append(contentsOf: payload)
                continue
            }
        }
        return nil
    }

    private mutating func fail(_ code: WebSocketCloseCode, _ reason: String) -> WebSocketFrameEvent {
        isClosed = true
        buffer = []
        start = 0
        message = []
        return .error(code, reason)
    }
}

/// Server frames: unmasked, one frame per message.
public enum WebSocketFrame {
    /// Appends a frame of `opcode` (1 text, 2 binary, 8 close, 9 ping, 10 pong) with `payload`.
    public static func append(opcode: UInt8, payload: some Collection<UInt8>, to output: inout [UInt8]) {
        let count = payload.count
        output.reserveCapacity(output.count + count + 10)
        output.append(0x80 | opcode)
        if count < 126 {
            output.append(UInt8(count))
        } else if count <= 0xFFFF {
            output.append(126)
            output.append(UInt8(count >> 8))
            output.append(UInt8(count & 0xFF))
        } else {
            output.append(127)
            for shift in stride(from: 56, through: 0, by: -8) {
                output.append(UInt8(truncatingIfNeeded: UInt64(count) >> UInt64(shift)))
            }
        }
        output.append(contentsOf: payload)
    }

    /// A text frame of `payload` (UTF-8).
    public static func text(_ payload: [UInt8]) -> [UInt8] {
        var output: [UInt8] = []
        append(opcode: 0x1, payload: payload, to: &output)
        return output
    }

    /// A close frame with `code` and `reason` (cut to fit a control frame's 125 bytes).
    public static func close(_ code: WebSocketCloseCode, reason: String = "") -> [UInt8] {
        var payload: [UInt8] = [UInt8(code.rawValue >> 8), UInt8(code.rawValue & 0xFF)]
        var reasonBytes = Array(reason.utf8.prefix(123))
        while !reasonBytes.isEmpty, !UTF8Validation.isValid(reasonBytes) { reasonBytes.removeLast() }
        payload.append(contentsOf: reasonBytes)
        var output: [UInt8] = []
        append(opcode: 0x8, payload: payload, to: &output)
        return output
    }
}

/// Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
public enum UTF8Validation {
    public static func isValid(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBufferPointer { buffer in
            var index = 0
            let count = buffer.count
            while index < count {
                let byte = buffer[index]
                if byte < 0x80 {
                    index += 1
                    continue
                }
                let needed: Int
                var lower: UInt8 = 0x80
                var upper: UInt8 = 0xBF
                switch byte {
                case 0xC2...0xDF: needed = 1
                case 0xE0:
                    needed = 2
                    lower = 0xA0
                case 0xE1...0xEC, 0xEE...0xEF: needed = 2
                case 0xED:
                    needed = 2
                    upper = 0x9F
                case 0xF0:
                    needed = 3
                    lower = 0x90
                case 0xF1...0xF3: needed = 3
                case 0xF4:
                    needed = 3
                    upper = 0x8F
                default: return false
                }
                guard index + needed < count else { return false }
                let second = buffer[index + 1]
                guard second >= lower, second <= upper else { return false }
                for offset in stride(from: 2, through: needed, by: 1) {
                    let next = buffer[index + offset]
                    guard next >= 0x80, next <= 0xBF else { return false }
                }
                index += needed + 1
            }
            return true
        }
    }
}
