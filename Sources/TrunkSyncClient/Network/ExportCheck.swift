import Foundation

/// Follows an export's body (`GET /sync/v1/export`) piece by piece and tells whether it is
/// whole: the account's line first, then event lines, then the end line
/// `{"kind":"end","events":N,"last_seq":S}` that the server writes only once every event
/// is written, with N the event lines before it and S the last one's `seq` (0 when none),
/// and nothing after it. A body cut short where the HTTP framing was lost (a proxy that
/// ends it by closing the connection) has no end line, or one whose count is not what came.
///
/// The event lines' seqs must increase, so a body with a page missing and another repeated
/// (the same count) is refused too.
///
/// Each line is known by how it starts (`{"kind":"event",`…: the server writes the kind
/// first); the end line is read as JSON (`RawJSONReader`), an event line only up to its `seq`
/// (`seq(ofEventLine:)`). What it holds is the line being read, so a body of any size is
/// checked in the memory of its largest line.
///
///     var check = ExportCheck()
///     try check.push(piece)   // as often as pieces come
///     let end = try check.finish()
struct ExportCheck {
    /// Why a body is not a whole export.
    struct Incomplete: Error, CustomStringConvertible {
        var description: String
    }

    /// What the end line says.
    struct End: Equatable {
        var events: Int64
        var lastSeq: Int64
    }

    private static let accountPrefix = Array(#"{"kind":"account","#.utf8)
    private static let eventPrefix = Array(#"{"kind":"event","#.utf8)
    private static let endPrefix = Array(#"{"kind":"end","#.utf8)

    /// Whole lines read.
    private(set) var lines = 0
    /// Event lines read.
    private(set) var events: Int64 = 0
    /// The line being read (not ended by a newline yet).
    private var partial: [UInt8] = []
    /// The last event line's `seq` (0 before the first).
    private var lastSeq: Int64 = 0
    private var end: End?

    /// Reads the next piece of the body; throws as soon as it cannot be a whole export.
    mutating func push<Bytes: Collection<UInt8>>(_ piece: Bytes) throws where Bytes.Index == Int {
        var start = piece.startIndex
        while let newline = piece[start...].firstIndex(of: UInt8(ascii: "\n")) {
            if partial.isEmpty {
                try line(Array(piece[start..<newline]))
            } else {
                partial.append(contentsOf: piece[start..<newline])
                let whole = partial
                partial = []
                try line(whole)
            }
            start = newline + 1
        }
        if start < piece.endIndex {
            if end != nil { throw Incomplete(description: "the body goes on after its end line") }
            partial.append(contentsOf: piece[start...])
        }
    }

    /// The end line, once the body has ended; throws when it is not a whole export.
    func finish() throws -> End {
        guard partial.isEmpty else {
            throw Incomplete(
                description: "the body stops in the middle of line \(lines + 1) (\(events) event line(s) before)")
        }
        guard lines > 0 else { throw Incomplete(description: "the body is empty") }
        guard let end else {
            throw Incomplete(description: "the body has no end line: \(events) event line(s) came, then nothing more")
        }
        guard end.events == events else {
            throw Incomplete(description: "the end line counts \(end.events) event line(s), but \(events) came")
        }
        guard end.lastSeq == lastSeq else {
            throw Incomplete(description: "the end line says the last seq is \(end.lastSeq), but it is \(lastSeq)")
        }
        return end
    }

    private mutating func line(_ bytes: [UInt8]) throws {
        lines += 1
        if end != nil { throw Incomplete(description: "the body goes on after its end line") }
        if lines == 1 {
            guard bytes.starts(with: Self.accountPrefix) else {
                throw Incomplete(description: "the body's first line is not the account")
            }
        } else if bytes.starts(with: Self.eventPrefix) {
            let seq = try Self.seq(ofEventLine: bytes, line: lines)
            guard seq > lastSeq || events == 0 else {
                throw Incomplete(description: "line \(lines) has seq \(seq), not after the previous event's \(lastSeq)")
            }
            events += 1
            lastSeq = seq
        } else if bytes.starts(with: Self.endPrefix) {
            end = try Self.end(of: bytes)
        } else {
            throw Incomplete(description: "line \(lines) is neither an event nor the end line")
        }
    }

    /// The integer members `keys` of the JSON object `bytes` (nil for one that is missing);
    /// throws when `bytes` is not a JSON object or one of them is not an integer.
    private static func integers(_ keys: Set<String>, of bytes: [UInt8]) throws -> [String: Int64] {
        var reader = RawJSONReader(bytes)
        var found: [String: Int64] = [:]
        try reader.readObject { key, value in
            if keys.contains(key) { found[key] = try value.readInt64() } else { _ = try value.readRaw() }
        }
        guard reader.atEnd() else { throw Incomplete(description: "not one JSON object") }
        return found
    }

    private static func end(of bytes: [UInt8]) throws -> End {
        guard let members = try? integers(["events", "last_seq"], of: bytes), let events = members["events"],
            events >= 0, let lastSeq = members["last_seq"], lastSeq >= 0
        else { throw Incomplete(description: "the end line cannot be read") }
        return End(events: events, lastSeq: lastSeq)
    }

    private static let seqKey = Array(#""seq":"#.utf8)

    /// The `seq` of an event line (line `line` of the body): its top-level members are walked
    /// up to it, strings skipped and nested values passed by their depth. The server writes it
    /// second, so this reads some 60 bytes of a line, not its payload.
    static func seq(ofEventLine bytes: [UInt8], line: Int) throws -> Int64 {
        let quote = UInt8(ascii: "\""), backslash = UInt8(ascii: "\\")
        var depth = 0
        var inString = false
        var escaped = false
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            if inString {
                if escaped {
                    escaped = false
                } else if byte == backslash {
                    escaped = true
                } else if byte == quote {
                    inString = false
                }
            } else if byte == quote {
                // A key of the line's object: at depth 1, right after `{` or `,`.
                if depth == 1, bytes[index - 1] == UInt8(ascii: "{") || bytes[index - 1] == UInt8(ascii: ","),
                    bytes[index...].starts(with: seqKey)
                {
                    return try digits(bytes, from: index + seqKey.count, line: line)
                }
                inString = true
            } else if byte == UInt8(ascii: "{") || byte == UInt8(ascii: "[") {
                depth += 1
            } else if byte == UInt8(ascii: "}") || byte == UInt8(ascii: "]") {
                depth -= 1
            }
            index += 1
        }
        throw Incomplete(description: "line \(line) is an event line without a seq")
    }

    /// The whole number of at least 0 at `start`, ended by `,` or `}`.
    private static func digits(_ bytes: [UInt8], from start: Int, line: Int) throws -> Int64 {
        var value: Int64 = 0
        var index = start
        while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
            let (times10, overflow) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = times10.addingReportingOverflow(Int64(bytes[index] - UInt8(ascii: "0")))
            guard !overflow, !overflow2 else { break }
            value = sum
            index += 1
        }
        guard index > start, index < bytes.count, bytes[index] == UInt8(ascii: ",") || bytes[index] == UInt8(ascii: "}")
        else { throw Incomplete(description: "line \(line) is an event line whose seq cannot be read") }
        return value
    }

    /// Checks the file at `url` (a download's body) in pieces of `pieceSize` bytes.
    static func file(_ url: URL, pieceSize: Int = 256 * 1024) throws -> End {
        let file = try DurableFile(path: url.path, create: false)
        defer { file.close() }
        let size = try file.size()
        var check = ExportCheck()
        for start in stride(from: 0, to: size, by: pieceSize) {
            try check.push(try file.read(at: start, count: min(pieceSize, size - start)))
        }
        return try check.finish()
    }
}
