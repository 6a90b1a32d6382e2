import Foundation
import XCTest

/// A client of `GET /sync/v1/stream` on a raw connection: reads the chunked body and splits
/// it into Server-Sent Events messages.
final class EventStreamClient {
    enum Message: Equatable {
        case event(id: Int64, data: String)
        case comment(String)
        case retry(Int)
    }

    let client: RawClient
    let head: RawResponse
    private var text = ""
    /// The last chunk arrived: the server ended the stream cleanly.
    private(set) var ended = false
    /// The `id` of the last event read.
    private(set) var lastEventID: Int64? = nil

    /// Opens a stream with `target` (path and query) and `headers`; the head must be `200`.
    init(server: ServerProcess, target: String, headers: [(String, String)]) throws {
        client = try server.connect()
        try client.send(request("GET", target, headers: [("Accept", "text/event-stream")] + headers))
        head = try client.readResponse(bodyExpected: false)
        guard head.status == 200 else {
            throw ClientError("stream refused: \(head.status) \(head.header("content-type") ?? "")")
        }
    }

    /// The next message; nil when the stream ended (its last chunk arrived).
    func next(timeout: Double = 5) throws -> Message? {
        let deadline = Deadline(seconds: timeout)
        while true {
            if let range = text.range(of: "\n\n") {
                let block = String(text[..<range.lowerBound])
                text.removeSubrange(..<range.upperBound)
                return try parse(block)
            }
            if ended { return nil }
            guard !deadline.hasPassed else { throw ClientError("no message within \(timeout) s") }
            let left = max(0.05, Double(deadline.pollTimeout) / 1000)
            if let chunk = try client.readChunk(timeout: left) {
                text += String(decoding: chunk, as: UTF8.self)
            } else {
                ended = true
            }
        }
    }

    private func parse(_ block: String) throws -> Message {
        if block.hasPrefix(":") { return .comment(String(block.dropFirst()).trimmingCharacters(in: .whitespaces)) }
        var id: Int64? = nil
        var event: String? = nil
        var data: String? = nil
        for line in block.split(separator: "\n") {
            if line.hasPrefix("retry: "), let value = Int(line.dropFirst(7)) { return .retry(value) }
            if line.hasPrefix("id: ") { id = Int64(line.dropFirst(4)) }
            if line.hasPrefix("event: ") { event = String(line.dropFirst(7)) }
            if line.hasPrefix("data: ") {
                guard data == nil else { throw ClientError("more than one data line: \(block)") }
                data = String(line.dropFirst(6))
            }
        }
        guard let id, event == "event", let data else { throw ClientError("not an event message: \(block)") }
        lastEventID = id
        return .event(id: id, data: data)
    }

    /// The next `count` events (skipping comments and `retry:`), as (id, data).
    func events(_ count: Int, timeout: Double = 10) throws -> [(id: Int64, data: String)] {
        var events: [(Int64, String)] = []
        let deadline = Date().addingTimeInterval(timeout)
        while events.count < count {
            let left = deadline.timeIntervalSinceNow
            guard left > 0 else { throw ClientError("only \(events.count) of \(count) events within \(timeout) s") }
            switch try next(timeout: left) {
            case .event(let id, let data): events.append((id, data))
            case .comment, .retry: continue
            case nil: throw ClientError("the stream ended after \(events.count) of \(count) events")
            }
        }
        return events
    }

    /// Reads until the stream ends; the events read meanwhile. Throws if it does not end in
    /// time.
    func readToEnd(timeout: Double = 10) throws -> [(id: Int64, data: String)] {
        var events: [(Int64, String)] = []
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let left = deadline.timeIntervalSinceNow
            guard left > 0 else { throw ClientError("the stream did not end within \(timeout) s") }
            switch try next(timeout: left) {
            case .event(let id, let data): events.append((id, data))
            case .comment, .retry: continue
            case nil: return events
            }
        }
    }

    /// Whether no event arrives within `seconds` (comments may).
    func noEvent(within seconds: Double) throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while deadline.timeIntervalSinceNow > 0 {
            do {
                switch try next(timeout: deadline.timeIntervalSinceNow) {
                case .event: return false
                case .comment, .retry: continue
                case nil: return true
                }
            } catch is ClientError {
                return true
            }
        }
        return true
    }

    func close() { client.close() }
}
