/// Calls `body` with the bytes of `bytes` in one contiguous buffer, copying them only when
/// the collection does not already store them contiguously (`[UInt8]`, `ArraySlice`,
/// `String.UTF8View` of a native string and `UnsafeBufferPointer` do).
func withContiguousBytes<Result>(
    _ bytes: some Collection<UInt8>,
    _ body: (UnsafeBufferPointer<UInt8>) -> Result
) -> Result {
    if let result = bytes.withContiguousStorageIfAvailable(body) {
        return result
    }
    return Array(bytes).withUnsafeBufferPointer(body)
}

/// Builds an ASCII string of exactly `count` bytes written by `body`.
func makeASCIIString(count: Int, _ body: (UnsafeMutableBufferPointer<UInt8>) -> Void) -> String {
    guard count > 0 else { return "" }
    return String(unsafeUninitializedCapacity: count) { buffer in
        body(buffer)
        return count
    }
}
