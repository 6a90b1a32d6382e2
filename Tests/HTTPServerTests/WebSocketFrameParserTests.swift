import HTTPServer
import XCTest

/// A client frame: masked (unless `masked: false`) with a fixed key.
private func frame(
    _ opcode: UInt8, _ payload: [UInt8], fin: Bool = true, masked: Bool = true, rsv: UInt8 = 0,
    lengthForm: Int? = nil
) -> [UInt8] {
    var out: [UInt8] = [(fin ? 0x80 : 0) | rsv | opcode]
    let maskBit: UInt8 = masked ? 0x80 : 0
    let count = payload.count
    switch lengthForm ?? (count < 126 ? 7 : count <= 0xFFFF ? 16 : 64) {
    case 7: out.append(maskBit | UInt8(count))
    case 16: out += [maskBit | 126, UInt8(count >> 8), UInt8(count & 0xFF)]
    default:
        out.append(maskBit | 127)
        for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: count >> shift)) }
    }
    let key: [UInt8] = [0x37, 0xFA, 0x21, 0x3D]
    if masked { out += key }
    for (index, byte) in payload.enumerated() { out.append(masked ? byte ^ key[index % 4] : byte) }
    return out
}

/// Everything the parser reports for `input`, fed whole, split at every point, and byte by
/// byte; asserts the three agree.
private func parse(
    _ input: [UInt8], limits: WebSocketLimits = .default, file: StaticString = #filePath, line: UInt = #line
)
    -> [WebSocketFrameEvent]
{
    func run(_ pieces: [[UInt8]]) -> [WebSocketFrameEvent] {
        var parser = WebSocketFrameParser(limits: limits)
        var events: [WebSocketFrameEvent] = []
        for piece in pieces {
            parser.feed(piece)
            while let event = parser.next() { events.append(event) }
        }
        return events
    }
    let whole = run([input])
    if input.count <= 300 {
        for cut in 0...input.count {
            XCTAssertEqual(
                run([Array(input[..<cut]), Array(input[cut...])]), whole, "split at \(cut)", file: file, line: line)
        }
        XCTAssertEqual(run(input.map { [$0] }), whole, "byte by byte", file: file, line: line)
    }
    return whole
}

final class WebSocketFrameParserTests: XCTestCase {
    func testMaskedTextBinaryPingPong() {
        let input = frame(1, Array("hello".utf8)) + frame(2, [0, 1, 2]) + frame(9, [7]) + frame(10, [])
        XCTAssertEqual(parse(input), [.text(Array("hello".utf8)), .binary([0, 1, 2]), .ping([7]), .pong([])])
    }

    func testLengthForms() {
        let medium = [UInt8](repeating: 65, count: 300)
        let large = [UInt8](repeating: 66, count: 70_000)
        let limits = WebSocketLimits(maxFrameSize: 100_000, maxMessageSize: 100_000)
        XCTAssertEqual(parse(frame(1, medium), limits: limits), [.text(medium)])
        XCTAssertEqual(parse(frame(2, large), limits: limits), [.binary(large)])
        // A short payload in the 64-bit form is accepted (RFC 6455 asks senders, not receivers).
        XCTAssertEqual(parse(frame(1, [65], lengthForm: 64)), [.text([65])])
    }

    func testUnmaskedFrameIsAProtocolError() {
        guard case .error(let code, _)? = parse(frame(1, Array("hi".utf8), masked: false)).first else {
            return XCTFail("no error")
        }
        XCTAssertEqual(code, .protocolError)
    }

    func testFragmentedMessageWithInterleavedControlFrames() {
        let input =
            frame(1, Array("hel".utf8), fin: false) + frame(9, [1]) + frame(0, Array("lo".utf8), fin: false)
            + frame(0, Array(" you".utf8))
        XCTAssertEqual(parse(input), [.ping([1]), .text(Array("hello you".utf8))])
    }

    func testFragmentationErrors() {
        let cases: [[UInt8]] = [
            frame(0, [1]),  // continuation with nothing to continue
            frame(1, [65], fin: false) + frame(1, [66]),  // a new message inside a fragmented one
            frame(9, [1], fin: false),  // fragmented control frame
            frame(8, [3, 232], fin: false),
            frame(9, [UInt8](repeating: 0, count: 126)),  // control frame over 125 bytes
            frame(3, []),  // reserved opcode
            frame(0xB, []),
            frame(1, [65], rsv: 0x40),  // RSV1 without an extension
        ]
        for input in cases {
            let events = parse(input)
            XCTAssertEqual(events.count, 1, "\(input)")
            guard case .error(let code, _)? = events.last else { return XCTFail("no error for \(input)") }
            XCTAssertEqual(code, .protocolError, "\(input)")
        }
    }

    func testBadUTF8Is1007() {
        let bad: [[UInt8]] = [[0xFF], [0xC0, 0x80], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xE2, 0x82]]
        for bytes in bad {
            guard case .error(let code, _)? = parse(frame(1, bytes)).last else { return XCTFail("accepted \(bytes)") }
            XCTAssertEqual(code, .invalidPayload)
        }
        // A character split across fragments is fine once whole.
        let euro: [UInt8] = [0xE2, 0x82, 0xAC]
        XCTAssertEqual(parse(frame(1, [euro[0]], fin: false) + frame(0, Array(euro[1...]))), [.text(euro)])
        XCTAssertEqual(parse(frame(2, [0xFF])), [.binary([0xFF])])  // binary is not checked
        XCTAssertTrue(UTF8Validation.isValid(Array("zoë 🎉".utf8)))
    }

    func testSizeLimitsAre1009BeforeThePayloadArrives() {
        let limits = WebSocketLimits(maxFrameSize: 200, maxMessageSize: 300)
        var parser = WebSocketFrameParser(limits: limits)
        // Only the header of a 1 MiB frame: refused at once, nothing buffered for it.
        parser.feed(Array(frame(2, [UInt8](repeating: 0, count: 1 << 20)).prefix(14)))
        guard case .error(let code, _)? = parser.next() else { return XCTFail("no error") }
        XCTAssertEqual(code, .messageTooBig)
        XCTAssertEqual(parser.bufferedByteCount, 0)
        XCTAssertTrue(parser.isClosed)
        // Fragments each within the frame limit but over the message limit together.
        let pieces =
            frame(1, [UInt8](repeating: 65, count: 200), fin: false) + frame(0, [UInt8](repeating: 65, count: 150))
        guard case .error(let code2, _)? = parse(pieces, limits: limits).last else { return XCTFail("no error") }
        XCTAssertEqual(code2, .messageTooBig)
    }

    func testCloseFrames() {
        XCTAssertEqual(parse(frame(8, [])), [.close(nil, [])])
        XCTAssertEqual(parse(frame(8, [0x03, 0xE8] + Array("bye".utf8))), [.close(.normal, Array("bye".utf8))])
        XCTAssertEqual(parse(frame(8, [0x0F, 0xA0])), [.close(WebSocketCloseCode(4000), [])])
        for payload: [UInt8] in [[0x03], [0x03, 0xED], [0x03, 0xEE], [0x00, 0x00], [0x13, 0x88]] {
            guard case .error(let code, _)? = parse(frame(8, payload)).last else {
                return XCTFail("accepted \(payload)")
            }
            XCTAssertEqual(code, .protocolError, "\(payload)")
        }
        guard case .error(let code, _)? = parse(frame(8, [0x03, 0xE8, 0xFF])).last else { return XCTFail("accepted") }
        XCTAssertEqual(code, .invalidPayload)
        // Nothing is parsed after a close.
        XCTAssertEqual(parse(frame(8, []) + frame(1, [65])), [.close(nil, [])])
    }

    func testServerFramesAndHandshakeKey() {
        XCTAssertEqual(WebSocketFrame.text(Array("hi".utf8)), [0x81, 2, 104, 105])
        let long = WebSocketFrame.text([UInt8](repeating: 65, count: 300))
        XCTAssertEqual(Array(long.prefix(4)), [0x81, 126, 1, 44])
        let big = WebSocketFrame.text([UInt8](repeating: 65, count: 70_000))
        XCTAssertEqual(Array(big.prefix(10)), [0x81, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70])
        XCTAssertEqual(WebSocketFrame.close(.goingAway), [0x88, 2, 0x03, 0xE9])
        // A reason is cut to fit 125 bytes without splitting a character.
        let close = WebSocketFrame.close(.normal, reason: String(repeating: "é", count: 100))
        XCTAssertLessThanOrEqual(close.count, 127)
        XCTAssertTrue(UTF8Validation.isValid(Array(close[4...])))
        // RFC 6455 section 1.3's example.
        XCTAssertEqual(
            WebSocketHandshake.acceptValue(forKey: "dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    }
}
