/// Writes text made of many small pieces (a response head, a log line) into a buffer sized
/// beforehand, to be appended to an array with one copy: appending each piece to the array
/// costs more than writing it.
///
/// Use `ByteWriter.append(to:capacity:_:)`; the writer never writes past its buffer (a piece
/// that does not fit is cut short, so size the buffer for the longest text).
public struct ByteWriter {
    private let buffer: UnsafeMutableBufferPointer<UInt8>
    /// Bytes written so far.
    public private(set) var count = 0

    private init(_ buffer: UnsafeMutableBufferPointer<UInt8>) { self.buffer = buffer }

    /// Lets `body` write at most `capacity` bytes (on the stack when small), then appends
    /// what it wrote to `output`.
    public static func append(to output: inout [UInt8], capacity: Int, _ body: (inout ByteWriter) -> Void) {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: max(capacity, 1)) { buffer in
            var writer = ByteWriter(buffer)
            body(&writer)
            output.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[..<writer.count]))
        }
    }

    /// Writes `bytes` (as many as fit).
    public mutating func write(_ bytes: UnsafeBufferPointer<UInt8>) {
        let length = min(bytes.count, buffer.count - count)
        guard length > 0, let source = bytes.baseAddress, let target = buffer.baseAddress else { return }
        (target + count).update(from: source, count: length)
        count += length
    }

    /// Writes `bytes` (as many as fit).
    public mutating func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBufferPointer { write($0) }
    }

    /// Writes the UTF-8 of `text` (as much as fits).
    public mutating func write(_ text: StaticString) {
        write(UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// Writes the UTF-8 of `text` (one copy: a native or small string's bytes are contiguous).
    public mutating func write(_ text: String) {
        let done: Void? = text.utf8.withContiguousStorageIfAvailable { write($0) }
        if done == nil { write(Array(text.utf8)) }
    }

    /// Writes one byte, if it fits.
    public mutating func write(_ byte: UInt8) {
        guard count < buffer.count else { return }
        buffer[count] = byte
        count += 1
    }

    /// Writes `value` in decimal (negative values as 0), left-padded with zeros to `width`
    /// digits (at most 20).
    public mutating func writeDecimal(_ value: Int, width: Int = 1) {
        var rest = UInt64(max(value, 0))
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes on the stack
        withUnsafeMutableBytes(of: &digits) { scratch in
            var start = scratch.count
            repeat {
                start -= 1
                scratch[start] = UInt8(ascii: "0") + UInt8(truncatingIfNeeded: rest % 10)
                rest /= 10
            } while rest > 0
            while scratch.count - start < min(width, 20) {
                start -= 1
                scratch[start] = UInt8(ascii: "0")
            }
            for index in start..<scratch.count { write(scratch[index]) }
        }
    }
}
