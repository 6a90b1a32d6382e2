/// Hexadecimal (base 16) text for bytes: lowercase when encoding, either case when decoding.
public enum Hex {
    private static let digits = Array("0123456789abcdef".utf8)

    /// Encodes `bytes` as lowercase hexadecimal, two digits per byte.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        withContiguousBytes(bytes) { input in
            makeASCIIString(count: input.count * 2) { output in
                digits.withUnsafeBufferPointer { digit in
                    for (index, byte) in input.enumerated() {
                        output[2 * index] = digit[Int(byte >> 4)]
                        output[2 * index + 1] = digit[Int(byte & 0x0F)]
                    }
                }
            }
        }
    }

    /// Decodes hexadecimal `string` (digits in either case), or returns nil when its
    /// length is odd or it holds anything but hexadecimal digits (no `0x`, no spaces).
    public static func decode(_ string: String) -> [UInt8]? {
        withContiguousBytes(string.utf8) { input in
            guard input.count % 2 == 0 else { return nil }
            var output = [UInt8]()
            output.reserveCapacity(input.count / 2)
            var index = 0
            while index < input.count {
                guard let high = value(ofDigit: input[index]), let low = value(ofDigit: input[index + 1]) else {
                    return nil
                }
                output.append(high << 4 | low)
                index += 2
            }
            return output
        }
    }

    private static func value(ofDigit digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

extension Collection<UInt8> {
    /// These bytes as lowercase hexadecimal, e.g. `SHA256.hash("abc").hexString`.
    public var hexString: String {
        Hex.encode(self)
    }
}
