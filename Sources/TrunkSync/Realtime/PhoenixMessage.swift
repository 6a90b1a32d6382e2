import JSON

/// One Phoenix channels message, as the Supabase Realtime clients speak them: `vsn=1.0.0`
/// sends JSON objects `{join_ref, ref, topic, event, payload}`, `vsn=2.0.0` JSON arrays
/// `[join_ref, ref, topic, event, payload]` (and binary frames for Broadcast only).
struct PhoenixMessage: Sendable, Equatable {
    var joinRef: String?
    var ref: String?
    var topic: String
    var event: String
    var payload: JSONValue

    /// The serializer a socket speaks, from its `vsn` parameter.
    enum Version: String, Sendable {
        case v1 = "1.0.0"
        case v2 = "2.0.0"
    }

    /// Why a client's message could not be read.
    struct Malformed: Error, Equatable {
        var reason: String
    }

    static let jsonLimits = JSONLimits.default

    /// Reads a text frame.
    static func decode(_ bytes: [UInt8], version: Version) throws(Malformed) -> PhoenixMessage {
        let value: JSONValue
        do {
            value = try JSONValue.parse(bytes, limits: jsonLimits)
        } catch {
            throw Malformed(reason: "the message is not JSON: \(error)")
        }
        func text(_ value: JSONValue?, _ name: String) throws(Malformed) -> String? {
            switch value {
            case nil, .null?: return nil
            case .string(let text)?: return text
            case .number(let number)? where number == number.rounded() && abs(number) < 1e15:
                return String(Int64(number))
            default: throw Malformed(reason: "\(name) must be a string")
            }
        }
        let joinRef: String?
        let ref: String?
        let topic: String?
        let event: String?
        let payload: JSONValue?
        switch (version, value) {
        case (.v2, .array(let parts)):
            guard parts.count == 5 else {
                throw Malformed(reason: "a message is an array of 5: [join_ref, ref, topic, event, payload]")
            }
            (joinRef, ref, topic, event, payload) = (
                try text(parts[0], "join_ref"), try text(parts[1], "ref"), try text(parts[2], "topic"),
                try text(parts[3], "event"), parts[4]
            )
        case (.v1, .object(let members)):
            (joinRef, ref, topic, event, payload) = (
                try text(members["join_ref"], "join_ref"), try text(members["ref"], "ref"),
                try text(members["topic"], "topic"), try text(members["event"], "event"), members["payload"]
            )
        case (.v2, _):
            throw Malformed(reason: "vsn 2.0.0 messages are JSON arrays")
        case (.v1, _):
            throw Malformed(reason: "vsn 1.0.0 messages are JSON objects")
        }
        guard let topic, !topic.isEmpty, let event, !event.isEmpty else {
            throw Malformed(reason: "a message needs a topic and an event")
        }
        return PhoenixMessage(joinRef: joinRef, ref: ref, topic: topic, event: event, payload: payload ?? .object([:]))
    }

    /// The header of a vsn 2.0.0 binary frame (a Broadcast push: kind 3, then the lengths of
    /// join_ref, ref, topic, event and metadata, the payload encoding, then those strings), to
    /// answer it; nil when it is not one.
    static func binaryPushHeader(_ bytes: [UInt8]) -> (joinRef: String, ref: String, topic: String)? {
        guard bytes.count >= 7, bytes[0] == 3 else { return nil }
        let sizes = (1...3).map { Int(bytes[$0]) }
        var offset = 7
        var fields: [String] = []
        for size in sizes {
            guard offset + size <= bytes.count else { return nil }
            fields.append(String(decoding: bytes[offset..<offset + size], as: UTF8.self))
            offset += size
        }
        return (fields[0], fields[1], fields[2])
    }

    /// A server message, written in `version`'s form. `payload` is JSON text.
    static func encode(
        joinRef: String?, ref: String?, topic: String, event: String, payload: [UInt8], version: Version
    ) -> [UInt8] {
        var writer = JSONWriter(capacity: payload.count + topic.utf8.count + 64)
        switch version {
        case .v2:
            writer.beginArray()
            writer.string(nil, joinRef)
            writer.string(nil, ref)
            writer.string(nil, topic)
            writer.string(nil, event)
            writer.raw(nil, payload)
            writer.endArray()
        case .v1:
            writer.beginObject()
            writer.string("join_ref", joinRef)
            writer.string("ref", ref)
            writer.string("topic", topic)
            writer.string("event", event)
            writer.raw("payload", payload)
            writer.endObject()
        }
        return writer.bytes
    }

    /// A `phx_reply` payload: `{status, response}`.
    static func reply(ok: Bool, response: [UInt8]) -> [UInt8] {
        var writer = JSONWriter(capacity: response.count + 32)
        writer.beginObject()
        writer.string("status", ok ? "ok" : "error")
        writer.raw("response", response)
        writer.endObject()
        return writer.bytes
    }

    /// `{"reason": …}`, the response of an error reply.
    static func reason(_ text: String) -> [UInt8] {
        var writer = JSONWriter(capacity: text.utf8.count + 16)
        writer.beginObject()
        writer.string("reason", text)
        writer.endObject()
        return writer.bytes
    }
}
