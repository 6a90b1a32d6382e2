import Foundation

/// Any JSON value, for the cold paths that need to look inside a document (request bodies
/// of auth routes, user metadata). Hot paths keep raw bytes instead.
public enum JSONValue: Codable, Equatable, Sendable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// Parses a document with the one parser's rules and `limits`; a problem names the
    /// member it is in (`data.name`, `items[2]`).
    public static func parse(_ bytes: [UInt8], limits: JSONLimits = .default) throws(JSONInputError) -> JSONValue {
        guard bytes.count <= limits.maxBytes else {
            throw JSONInputError(
                kind: .tooLarge, path: "", reason: "the document is larger than \(limits.maxBytes) bytes")
        }
        let outcome = bytes.withUnsafeBufferPointer { buffer -> Result<JSONValue, JSONInputError> in
            var scanner = JSONScanner(buffer, limits: limits)
            var path: [String] = []
            var problem: JSONInputError? = nil
            do throws(JSONScanner.Failure) {
                let value = try read(&scanner, path: &path, problem: &problem)
                try scanner.expectEnd()
                if let problem { return .failure(problem) }
                return .success(value)
            } catch {
                return .failure(
                    JSONInputError(kind: .malformed, path: "", reason: "\(error.reason) at byte \(error.offset)"))
            }
        }
        return try outcome.get()
    }

    private static func read(_ scanner: inout JSONScanner, path: inout [String], problem: inout JSONInputError?)
        throws(JSONScanner.Failure) -> JSONValue
    {
        func check(_ scanner: inout JSONScanner) {
            if let violation = scanner.takeViolation(), problem == nil {
                problem = JSONInputError(kind: .invalidValue, path: path.joined(), reason: violation.reason)
            }
        }
        // Counted as the scanner counts it: containers only.
        func enter(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) {
            guard path.count < scanner.limits.maxDepth else {
                throw scanner.fail("nested more than \(scanner.limits.maxDepth) levels deep")
            }
        }
        switch scanner.peek() {
        case UInt8(ascii: "{"):
            try enter(&scanner)
            var members: [String: JSONValue] = [:]
            try scanner.object { (scanner: inout JSONScanner, key: String) throws(JSONScanner.Failure) in
                check(&scanner)  // the key
                path.append(path.isEmpty ? key : "." + key)
                members[key] = try read(&scanner, path: &path, problem: &problem)
                path.removeLast()
            }
            return .object(members)
        case UInt8(ascii: "["):
            try enter(&scanner)
            var elements: [JSONValue] = []
            try scanner.array { (scanner: inout JSONScanner, position: Int) throws(JSONScanner.Failure) in
                path.append("[\(position)]")
                elements.append(try read(&scanner, path: &path, problem: &problem))
                path.removeLast()
            }
            return .array(elements)
        case UInt8(ascii: "\""):
            let text = try scanner.string()
            check(&scanner)
            return .string(text)
        default:
            let range = try scanner.skipValue(depth: path.count)
            check(&scanner)
            let text = String(decoding: scanner.slice(range), as: UTF8.self)
            switch text {
            case "null": return .null
            case "true": return .bool(true)
            case "false": return .bool(false)
            default: return .number(Double(text) ?? 0)
            }
        }
    }

    /// Decodes any JSON value (through `JSONBody.decode`, which has checked the document).
    public init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    /// Encodes the value.
    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// The value as JSON text (object keys sorted, numbers in their shortest form).
    public var jsonBytes: [UInt8] {
        var writer = JSONWriter(capacity: 64)
        write(to: &writer, key: nil)
        return writer.bytes
    }

    private func write(to writer: inout JSONWriter, key: String?) {
        switch self {
        case .null: writer.null(key)
        case .bool(let value): writer.bool(key, value)
        case .number(let value): writer.number(key, value)
        case .string(let value): writer.string(key, value)
        case .array(let elements):
            writer.beginArray(key)
            for element in elements { element.write(to: &writer, key: nil) }
            writer.endArray()
        case .object(let members):
            writer.beginObject(key)
            for name in members.keys.sorted() { members[name]?.write(to: &writer, key: name) }
            writer.endObject()
        }
    }

    /// The members of an object, else nil.
    public var objectValue: [String: JSONValue]? {
        if case .object(let members) = self { return members }
        return nil
    }

    /// The string, else nil.
    public var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    /// The boolean, else nil.
    public var boolValue: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }
}

/// Why a request's JSON was refused: one shape for every route.
public struct JSONInputError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// Not JSON at all.
        case malformed
        /// JSON, but a value trunk-sync refuses (`\u0000`, an unpaired surrogate, a number
        /// outside I-JSON, a string too long).
        case invalidValue
        /// JSON of the wrong shape (a string where a number belongs, not an object).
        case wrongType
        /// Over `JSONLimits.maxBytes`.
        case tooLarge
    }

    public var kind: Kind
    /// The member concerned (`data.full_name`), empty for the whole document.
    public var path: String
    public var reason: String

    public init(kind: Kind, path: String, reason: String) {
        self.kind = kind
        self.path = path
        self.reason = reason
    }

    public var description: String { path.isEmpty ? reason : "\(path): \(reason)" }
}

/// The one way cold paths (auth, admin, configuration) decode a JSON body into a
/// `Decodable`: first the parser's rules and limits, then Foundation's decoder for the
/// shape. Every failure is a `JSONInputError`.
public enum JSONBody {
    public static func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8], limits: JSONLimits = .default)
        throws(JSONInputError) -> T
    {
        let value = try JSONValue.parse(bytes, limits: limits)
        guard case .object = value else {
            throw JSONInputError(kind: .wrongType, path: "", reason: "the body must be a JSON object")
        }
        do {
            return try JSONDecoder().decode(T.self, from: Data(bytes))
        } catch let DecodingError.typeMismatch(_, context) {
            throw JSONInputError(kind: .wrongType, path: Self.path(context.codingPath), reason: "has the wrong type")
        } catch let DecodingError.valueNotFound(_, context) {
            throw JSONInputError(kind: .wrongType, path: Self.path(context.codingPath), reason: "must not be null")
        } catch let DecodingError.keyNotFound(key, context) {
            throw JSONInputError(kind: .wrongType, path: Self.path(context.codingPath + [key]), reason: "is required")
        } catch {
            throw JSONInputError(kind: .wrongType, path: "", reason: "the body has a field of the wrong type")
        }
    }

    static func path(_ keys: [any CodingKey]) -> String {
        var out = ""
        for key in keys {
            if let index = key.intValue {
                out += "[\(index)]"
            } else {
                out += out.isEmpty ? key.stringValue : "." + key.stringValue
            }
        }
        return out
    }
}
