/// What the JSON parser accepts beyond RFC 8259's grammar. Every limit has a reason: the
/// document must be storable as PostgreSQL `jsonb` exactly, numbers must mean the same in
/// every client (I-JSON, RFC 7493), and no input may cost more than its size.
public struct JSONLimits: Sendable, Hashable {
    /// Deepest nesting of arrays and objects. Default 64.
    public var maxDepth: Int
    /// Longest string, in bytes as written (escapes included). Default 64 KiB.
    public var maxStringBytes: Int
    /// Longest number, in characters (`-0.5e-3` is 7). I-JSON numbers are IEEE doubles:
    /// 17 significant digits say all a double can hold. Default 40.
    public var maxNumberLength: Int
    /// Largest document, in bytes. Default 10 MiB.
    public var maxBytes: Int

    public init(
        maxDepth: Int = 64, maxStringBytes: Int = 64 * 1024, maxNumberLength: Int = 40, maxBytes: Int = 10 * 1024 * 1024
    ) {
        self.maxDepth = maxDepth
        self.maxStringBytes = maxStringBytes
        self.maxNumberLength = maxNumberLength
        self.maxBytes = maxBytes
    }

    /// The defaults.
    public static let `default` = JSONLimits()
}
