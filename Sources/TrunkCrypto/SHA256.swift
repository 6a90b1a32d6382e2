internal import COpenSSL

/// SHA-256 (FIPS 180-4): one-shot with `SHA256.hash(_:)`, or incremental with
/// `update(_:)` and `finalize()` when the input comes in parts.
///
/// Hashing cannot fail: it runs on a plain-value OpenSSL context, with no allocation and
/// no provider lookup (see `shim.h`). A `SHA256` value is copyable, so a state that has
/// absorbed a common prefix can be reused for several inputs.
public struct SHA256: Sendable {
    /// Length of a digest in bytes (32).
    public static let byteCount = 32

    /// Length of the block SHA-256 compresses at a time, in bytes (64); HMAC pads keys to it.
    public static let blockByteCount = 64

    private var context = SHA256_CTX()

    /// Creates the state of an empty input.
    public init() {
        trunk_SHA256_Init(&context)
    }

    /// Appends `bytes` to the input.
    public mutating func update(_ bytes: some Collection<UInt8>) {
        withContiguousBytes(bytes) { buffer in
            guard let base = buffer.baseAddress, !buffer.isEmpty else { return }
            trunk_SHA256_Update(&context, base, buffer.count)
        }
    }

    /// Appends the UTF-8 encoding of `string` to the input.
    public mutating func update(_ string: String) {
        update(string.utf8)
    }

    /// Returns the digest of everything appended so far (32 bytes). The state is left
    /// unchanged, so more input may follow for a longer message.
    public func finalize() -> [UInt8] {
        var finalContext = context
        return [UInt8](unsafeUninitializedCapacity: Self.byteCount) { buffer, initializedCount in
            trunk_SHA256_Final(buffer.baseAddress, &finalContext)
            initializedCount = Self.byteCount
        }
    }

    /// Returns the SHA-256 digest of `bytes` (32 bytes).
    public static func hash(_ bytes: some Collection<UInt8>) -> [UInt8] {
        var hasher = SHA256()
        hasher.update(bytes)
        return hasher.finalize()
    }

    /// Returns the SHA-256 digest of the UTF-8 encoding of `string` (32 bytes).
    public static func hash(_ string: String) -> [UInt8] {
        hash(string.utf8)
    }
}
