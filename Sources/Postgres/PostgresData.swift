import Foundation

/// PostgreSQL type OIDs the module encodes or decodes.
public enum PostgresType {
    public static let unknown: UInt32 = 0
    public static let bool: UInt32 = 16
    public static let bytea: UInt32 = 17
    public static let name: UInt32 = 19
    public static let int8: UInt32 = 20
    public static let int2: UInt32 = 21
    public static let int4: UInt32 = 23
    public static let text: UInt32 = 25
    public static let oid: UInt32 = 26
    public static let json: UInt32 = 114
    public static let float4: UInt32 = 700
    public static let float8: UInt32 = 701
    public static let unknownLiteral: UInt32 = 705
    public static let bpchar: UInt32 = 1042
    public static let varchar: UInt32 = 1043
    public static let timestamp: UInt32 = 1114
    public static let timestamptz: UInt32 = 1184
    public static let uuid: UInt32 = 2950
    public static let jsonb: UInt32 = 3802
    public static let boolArray: UInt32 = 1000
    public static let int4Array: UInt32 = 1007
    public static let textArray: UInt32 = 1009
    public static let int8Array: UInt32 = 1016
    public static let timestamptzArray: UInt32 = 1185
    public static let uuidArray: UInt32 = 2951
    public static let jsonbArray: UInt32 = 3807
}

/// One query parameter, ready for `PQexecParams`: its type, wire format and bytes
/// (`nil` is SQL `NULL`).
public struct PostgresBind: Sendable {
    /// The parameter's type OID (0 lets the server infer it from the query).
    public var type: UInt32
    /// 0 for text, 1 for binary.
    public var format: Int32
    /// The encoded value; `nil` for `NULL`.
    public var bytes: [UInt8]?

    /// A bind from its parts.
    public init(type: UInt32, format: Int32, bytes: [UInt8]?) {
        self.type = type
        self.format = format
        self.bytes = bytes
    }

    /// SQL `NULL` of an inferred type.
    public static let null = PostgresBind(type: PostgresType.unknown, format: 0, bytes: nil)
}

/// A Swift value that can be sent as a query parameter.
public protocol PostgresEncodable: Sendable {
    /// The value encoded for the wire.
    var postgresBind: PostgresBind { get }
}

/// A Swift value that can be read from a result cell (binary format).
public protocol PostgresDecodable {
    /// Decodes the value of a non-`NULL` cell of type `type`.
    init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws
}

/// A `timestamptz` value with PostgreSQL's full precision: microseconds since the Unix epoch.
public struct PostgresTimestamp: Hashable, Comparable, Sendable {
    /// Microseconds since 1970-01-01T00:00:00Z.
    public var microsecondsSinceEpoch: Int64

    /// A timestamp from microseconds since the Unix epoch.
    public init(microsecondsSinceEpoch: Int64) {
        self.microsecondsSinceEpoch = microsecondsSinceEpoch
    }

    /// The timestamp nearest to a `Date` (rounded to the microsecond).
    public init(_ date: Date) {
        microsecondsSinceEpoch = Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
    }

    /// The same instant as a `Date` (sub-microsecond rounding may occur).
    public var date: Date { Date(timeIntervalSince1970: Double(microsecondsSinceEpoch) / 1_000_000) }

    /// Orders by instant.
    public static func < (lhs: Self, rhs: Self) -> Bool {
        lhs.microsecondsSinceEpoch < rhs.microsecondsSinceEpoch
    }

    /// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
    static let postgresEpochOffset: Int64 = 946_684_800_000_000
}

/// A JSON document kept as its raw UTF-8 text: sent as `jsonb`, read from `json`/`jsonb`
/// without parsing.
public struct PostgresJSON: Hashable, Sendable {
    /// The document's UTF-8 bytes.
    public var bytes: [UInt8]
    /// Wraps UTF-8 JSON text (not validated here: the server validates it).
    public init(bytes: [UInt8]) { self.bytes = bytes }
    /// Wraps JSON text.
    public init(_ text: String) { self.bytes = Array(text.utf8) }
    /// The document as a string.
    public var text: String { String(decoding: bytes, as: UTF8.self) }
}

// MARK: - Binary helpers

@inline(__always)
func appendBigEndian<T: FixedWidthInteger>(_ value: T, to bytes: inout [UInt8]) {
    withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
}

@inline(__always)
func readBigEndian<T: FixedWidthInteger>(_: T.Type, _ bytes: UnsafeRawBufferPointer, at offset: Int = 0)
    -> T
{
    var value: T = 0
    withUnsafeMutableBytes(of: &value) { target in
        target.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + MemoryLayout<T>.size]))
    }
    return T(bigEndian: value)
}

func decodingError(_ swiftType: Any.Type, _ type: UInt32, _ reason: String = "") -> PostgresError {
    PostgresError(
        kind: .decoding,
        message: "cannot decode PostgreSQL type \(type) as \(swiftType)\(reason.isEmpty ? "" : ": \(reason)")"
    )
}

// MARK: - Encodable conformances

extension String: PostgresEncodable {
    /// Text format with an inferred type, so a string can stand for any type the query expects.
    public var postgresBind: PostgresBind {
        PostgresBind(type: PostgresType.unknown, format: 0, bytes: Array(utf8))
    }
}

extension Int64: PostgresEncodable {
    /// `int8`, binary.
    public var postgresBind: PostgresBind {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(8)
        appendBigEndian(self, to: &bytes)
        return PostgresBind(type: PostgresType.int8, format: 1, bytes: bytes)
    }
}

extension Int: PostgresEncodable {
    /// `int8`, binary.
    public var postgresBind: PostgresBind { Int64(self).postgresBind }
}

extension Int32: PostgresEncodable {
    /// `int4`, binary.
    public var postgresBind: PostgresBind {
        var bytes: [UInt8] = []
        appendBigEndian(self, to: &bytes)
        return PostgresBind(type: PostgresType.int4, format: 1, bytes: bytes)
    }
}

extension Bool: PostgresEncodable {
    /// `bool`, binary.
    public var postgresBind: PostgresBind {
        PostgresBind(type: PostgresType.bool, format: 1, bytes: [self ? 1 : 0])
    }
}

extension Double: PostgresEncodable {
    /// `float8`, binary.
    public var postgresBind: PostgresBind {
        var bytes: [UInt8] = []
        appendBigEndian(bitPattern, to: &bytes)
        return PostgresBind(type: PostgresType.float8, format: 1, bytes: bytes)
    }
}

extension UUID: PostgresEncodable {
    /// `uuid`, binary (16 bytes).
    public var postgresBind: PostgresBind {
        PostgresBind(type: PostgresType.uuid, format: 1, bytes: uuidBytes)
    }

    var uuidBytes: [UInt8] {
        withUnsafeBytes(of: uuid) { Array($0) }
    }
}

extension PostgresTimestamp: PostgresEncodable {
    /// `timestamptz`, binary (microseconds since 2000-01-01).
    public var postgresBind: PostgresBind {
        var bytes: [UInt8] = []
        appendBigEndian(microsecondsSinceEpoch - Self.postgresEpochOffset, to: &bytes)
        return PostgresBind(type: PostgresType.timestamptz, format: 1, bytes: bytes)
    }
}

extension Date: PostgresEncodable {
    /// `timestamptz`, binary, rounded to the microsecond.
    public var postgresBind: PostgresBind { PostgresTimestamp(self).postgresBind }
}

extension PostgresJSON: PostgresEncodable {
    /// `jsonb`, binary (version byte 1 followed by the text).
    public var postgresBind: PostgresBind {
        var data: [UInt8] = [1]
        data.append(contentsOf: bytes)
        return PostgresBind(type: PostgresType.jsonb, format: 1, bytes: data)
    }
}

extension Optional: PostgresEncodable where Wrapped: PostgresEncodable {
    /// The wrapped value, or `NULL` of the wrapped value's type.
    public var postgresBind: PostgresBind {
        switch self {
        case .some(let value): return value.postgresBind
        case .none:
            // Keep the type so the server need not infer it from a bare NULL.
            let typed = Self.nullType
            return PostgresBind(type: typed, format: 1, bytes: nil)
        }
    }

    private static var nullType: UInt32 {
        switch Wrapped.self {
        case is String.Type: return PostgresType.unknown
        case is Int.Type, is Int64.Type: return PostgresType.int8
        case is Int32.Type: return PostgresType.int4
        case is Bool.Type: return PostgresType.bool
        case is Double.Type: return PostgresType.float8
        case is UUID.Type: return PostgresType.uuid
        case is Date.Type, is PostgresTimestamp.Type: return PostgresType.timestamptz
        case is PostgresJSON.Type: return PostgresType.jsonb
        default: return PostgresType.unknown
        }
    }
}

/// Element types that can travel in a binary one-dimensional array parameter.
public protocol PostgresArrayElement: PostgresEncodable {
    /// The OID of the array type (`text[]`, `uuid[]`, …).
    static var postgresArrayType: UInt32 { get }
    /// The OID of the element type.
    static var postgresElementType: UInt32 { get }
    /// The element in binary format.
    var postgresBinaryBytes: [UInt8] { get }
    /// How many bytes `writePostgresArrayElement` writes.
    var postgresArrayElementSize: Int { get }
    /// Writes the element in binary format, preceded by its length (`Int32`), at `out`:
    /// exactly `postgresArrayElementSize` bytes. An array's element, without an array of its
    /// own.
    func writePostgresArrayElement(to out: UnsafeMutableRawPointer)
}

/// Stores `value` big-endian at `out` (no alignment needed).
@inline(__always)
func storeBigEndian<T: FixedWidthInteger>(_ value: T, at out: UnsafeMutableRawPointer) {
    out.storeBytes(of: value.bigEndian, as: T.self)
}

extension PostgresArrayElement {
    public var postgresArrayElementSize: Int { 4 + postgresBinaryBytes.count }

    public func writePostgresArrayElement(to out: UnsafeMutableRawPointer) {
        let bytes = postgresBinaryBytes
        storeBigEndian(Int32(bytes.count), at: out)
        bytes.withUnsafeBytes { if let base = $0.baseAddress { (out + 4).copyMemory(from: base, byteCount: $0.count) } }
    }
}

extension String: PostgresArrayElement {
    public static var postgresArrayType: UInt32 { PostgresType.textArray }
    public static var postgresElementType: UInt32 { PostgresType.text }
    public var postgresBinaryBytes: [UInt8] { Array(utf8) }

    public var postgresArrayElementSize: Int { 4 + utf8.count }

    public func writePostgresArrayElement(to out: UnsafeMutableRawPointer) {
        var text = self
        text.withUTF8 { utf8 in
            storeBigEndian(Int32(utf8.count), at: out)
            if let base = utf8.baseAddress { (out + 4).copyMemory(from: base, byteCount: utf8.count) }
        }
    }
}

extension Int64: PostgresArrayElement {
    public static var postgresArrayType: UInt32 { PostgresType.int8Array }
    public static var postgresElementType: UInt32 { PostgresType.int8 }
    public var postgresBinaryBytes: [UInt8] { postgresBind.bytes ?? [] }

    public var postgresArrayElementSize: Int { 12 }

    public func writePostgresArrayElement(to out: UnsafeMutableRawPointer) {
        storeBigEndian(Int32(8), at: out)
        storeBigEndian(self, at: out + 4)
    }
}

extension UUID: PostgresArrayElement {
    public static var postgresArrayType: UInt32 { PostgresType.uuidArray }
    public static var postgresElementType: UInt32 { PostgresType.uuid }
    public var postgresBinaryBytes: [UInt8] { uuidBytes }

    public var postgresArrayElementSize: Int { 20 }

    public func writePostgresArrayElement(to out: UnsafeMutableRawPointer) {
        storeBigEndian(Int32(16), at: out)
        withUnsafeBytes(of: uuid) { if let base = $0.baseAddress { (out + 4).copyMemory(from: base, byteCount: 16) } }
    }
}

extension PostgresTimestamp: PostgresArrayElement {
    public static var postgresArrayType: UInt32 { PostgresType.timestamptzArray }
    public static var postgresElementType: UInt32 { PostgresType.timestamptz }
    public var postgresBinaryBytes: [UInt8] { postgresBind.bytes ?? [] }

    public var postgresArrayElementSize: Int { 12 }

    public func writePostgresArrayElement(to out: UnsafeMutableRawPointer) {
        storeBigEndian(Int32(8), at: out)
        storeBigEndian(microsecondsSinceEpoch - Self.postgresEpochOffset, at: out + 4)
    }
}

extension PostgresJSON: PostgresArrayElement {
    public static var postgresArrayType: UInt32 { PostgresType.jsonbArray }
    public static var postgresElementType: UInt32 { PostgresType.jsonb }
    public var postgresBinaryBytes: [UInt8] { postgresBind.bytes ?? [] }

    public var postgresArrayElementSize: Int { 5 + bytes.count }

    public func writePostgresArrayElement(to out: UnsafeMutableRawPointer) {
        storeBigEndian(Int32(1 + bytes.count), at: out)
        out.storeBytes(of: 1, toByteOffset: 4, as: UInt8.self)  // jsonb's binary format version
        bytes.withUnsafeBytes { if let base = $0.baseAddress { (out + 5).copyMemory(from: base, byteCount: $0.count) } }
    }
}

extension Array: PostgresEncodable where Element: PostgresArrayElement {
    /// A one-dimensional array in binary format, for `unnest($1::uuid[])` and `= any($1)`:
    /// sized first, then written in place.
    public var postgresBind: PostgresBind {
        var size = isEmpty ? 12 : 20
        for element in self { size += element.postgresArrayElementSize }
        let bytes = [UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            guard let base = buffer.baseAddress else { return }
            let out = UnsafeMutableRawPointer(base)
            storeBigEndian(Int32(isEmpty ? 0 : 1), at: out)  // dimensions
            storeBigEndian(Int32(0), at: out + 4)  // has nulls
            storeBigEndian(Element.postgresElementType, at: out + 8)
            var offset = 12
            if !isEmpty {
                storeBigEndian(Int32(count), at: out + 12)
                storeBigEndian(Int32(1), at: out + 16)  // lower bound
                offset = 20
                for element in self {
                    element.writePostgresArrayElement(to: out + offset)
                    offset += element.postgresArrayElementSize
                }
            }
            initialized = offset
        }
        return PostgresBind(type: Element.postgresArrayType, format: 1, bytes: bytes)
    }
}

// MARK: - Decodable conformances

extension String: PostgresDecodable {
    /// Any text-like type, `json`, `jsonb` (without its version byte) and `uuid`.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        switch type {
        case PostgresType.text, PostgresType.varchar, PostgresType.bpchar, PostgresType.name,
            PostgresType.unknownLiteral, PostgresType.json:
            self = String(decoding: bytes, as: UTF8.self)
        case PostgresType.jsonb:
            guard bytes.first == 1 else { throw decodingError(String.self, type, "unknown jsonb version") }
            self = String(decoding: UnsafeRawBufferPointer(rebasing: bytes.dropFirst()), as: UTF8.self)
        case PostgresType.uuid:
            self = try UUID(postgresBytes: bytes, type: type).uuidString.lowercased()
        default:
            throw decodingError(String.self, type)
        }
    }
}

extension Int64: PostgresDecodable {
    /// `int2`, `int4`, `int8` and `oid`.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        switch (type, bytes.count) {
        case (PostgresType.int8, 8): self = readBigEndian(Int64.self, bytes)
        case (PostgresType.int4, 4): self = Int64(readBigEndian(Int32.self, bytes))
        case (PostgresType.int2, 2): self = Int64(readBigEndian(Int16.self, bytes))
        case (PostgresType.oid, 4): self = Int64(readBigEndian(UInt32.self, bytes))
        default: throw decodingError(Int64.self, type)
        }
    }
}

extension Int: PostgresDecodable {
    /// `int2`, `int4`, `int8` and `oid`.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        self = Int(try Int64(postgresBytes: bytes, type: type))
    }
}

extension Int32: PostgresDecodable {
    /// `int2` and `int4`.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        switch (type, bytes.count) {
        case (PostgresType.int4, 4): self = readBigEndian(Int32.self, bytes)
        case (PostgresType.int2, 2): self = Int32(readBigEndian(Int16.self, bytes))
        default: throw decodingError(Int32.self, type)
        }
    }
}

extension Bool: PostgresDecodable {
    /// `bool`.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        guard type == PostgresType.bool, bytes.count == 1 else { throw decodingError(Bool.self, type) }
        self = bytes[0] != 0
    }
}

extension Double: PostgresDecodable {
    /// `float4`, `float8` and the integer types.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        switch (type, bytes.count) {
        case (PostgresType.float8, 8): self = Double(bitPattern: readBigEndian(UInt64.self, bytes))
        case (PostgresType.float4, 4): self = Double(Float(bitPattern: readBigEndian(UInt32.self, bytes)))
        default: self = Double(try Int64(postgresBytes: bytes, type: type))
        }
    }
}

extension UUID: PostgresDecodable {
    /// `uuid` (16 bytes).
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        guard type == PostgresType.uuid, bytes.count == 16 else { throw decodingError(UUID.self, type) }
        var raw: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &raw) { $0.copyMemory(from: bytes) }
        self = UUID(uuid: raw)
    }
}

extension PostgresTimestamp: PostgresDecodable {
    /// `timestamptz` and `timestamp` (taken as UTC). `±infinity` are rejected.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        guard type == PostgresType.timestamptz || type == PostgresType.timestamp, bytes.count == 8 else {
            throw decodingError(PostgresTimestamp.self, type)
        }
        let raw = readBigEndian(Int64.self, bytes)
        guard raw != .max, raw != .min else { throw decodingError(PostgresTimestamp.self, type, "infinity") }
        self.init(microsecondsSinceEpoch: raw + Self.postgresEpochOffset)
    }
}

extension Date: PostgresDecodable {
    /// `timestamptz` and `timestamp` (taken as UTC).
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        self = try PostgresTimestamp(postgresBytes: bytes, type: type).date
    }
}

extension PostgresJSON: PostgresDecodable {
    /// `json` and `jsonb`, as raw text.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        switch type {
        case PostgresType.json: self.init(bytes: Array(bytes))
        case PostgresType.jsonb:
            guard bytes.first == 1 else { throw decodingError(PostgresJSON.self, type, "unknown jsonb version") }
            self.init(bytes: Array(bytes.dropFirst()))
        default: throw decodingError(PostgresJSON.self, type)
        }
    }
}

extension Array: PostgresDecodable where Element: PostgresDecodable {
    /// One-dimensional arrays without `NULL` elements.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        guard bytes.count >= 12 else { throw decodingError([Element].self, type) }
        let dimensions = readBigEndian(Int32.self, bytes, at: 0)
        let elementType = readBigEndian(UInt32.self, bytes, at: 8)
        if dimensions == 0 {
            self = []
            return
        }
        guard dimensions == 1, bytes.count >= 20 else {
            throw decodingError([Element].self, type, "not one-dimensional")
        }
        let count = Int(readBigEndian(Int32.self, bytes, at: 12))
        var offset = 20
        var result: [Element] = []
        result.reserveCapacity(count)
        for _ in 0..<count {
            guard offset + 4 <= bytes.count else { throw decodingError([Element].self, type, "truncated") }
            let length = Int(readBigEndian(Int32.self, bytes, at: offset))
            offset += 4
            guard length >= 0 else { throw decodingError([Element].self, type, "NULL element") }
            guard offset + length <= bytes.count else { throw decodingError([Element].self, type, "truncated") }
            let element = UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + length])
            result.append(try Element(postgresBytes: element, type: elementType))
            offset += length
        }
        self = result
    }
}

/// `bytea` values.
public struct PostgresBytes: Hashable, Sendable, PostgresEncodable, PostgresDecodable {
    /// The raw bytes.
    public var bytes: [UInt8]
    /// Wraps raw bytes.
    public init(_ bytes: [UInt8]) { self.bytes = bytes }
    /// `bytea`, binary.
    public var postgresBind: PostgresBind { PostgresBind(type: PostgresType.bytea, format: 1, bytes: bytes) }
    /// `bytea`.
    public init(postgresBytes bytes: UnsafeRawBufferPointer, type: UInt32) throws {
        guard type == PostgresType.bytea else { throw decodingError(PostgresBytes.self, type) }
        self.bytes = Array(bytes)
    }
}
