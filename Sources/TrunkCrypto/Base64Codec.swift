/// The encoder and strict decoder shared by `Base64` and `Base64URL`, which differ only in
/// the last two symbols of the alphabet and in whether `=` padding is written and required.
struct Base64Codec: Sendable {
    /// The standard alphabet of RFC 4648 §4, padded.
    static let standard = Base64Codec(lastTwoSymbols: "+/", padded: true)

    /// The URL- and filename-safe alphabet of RFC 4648 §5, unpadded (as JWTs use it).
    static let url = Base64Codec(lastTwoSymbols: "-_", padded: false)

    private static let invalid: UInt8 = 0xFF

    /// The 64 symbols, by value.
    private let symbols: [UInt8]
    /// The value of each byte as a symbol, or `invalid`.
    private let values: [UInt8]
    private let padded: Bool

    private init(lastTwoSymbols: String, padded: Bool) {
        let symbols =
            Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".utf8)
            + Array(lastTwoSymbols.utf8)
        var values = [UInt8](repeating: Self.invalid, count: 256)
        for (value, symbol) in symbols.enumerated() {
            values[Int(symbol)] = UInt8(value)
        }
        self.symbols = symbols
        self.values = values
        self.padded = padded
    }

    func encode(_ bytes: some Collection<UInt8>) -> String {
        withContiguousBytes(bytes) { input in
            let remainder = input.count % 3
            let tail = remainder == 0 ? 0 : (padded ? 4 : remainder + 1)
            return makeASCIIString(count: input.count / 3 * 4 + tail) { output in
                symbols.withUnsafeBufferPointer { symbol in
                    var inputIndex = 0
                    var outputIndex = 0
                    while input.count - inputIndex >= 3 {
                        let b0 = input[inputIndex]
                        let b1 = input[inputIndex + 1]
                        let b2 = input[inputIndex + 2]
                        output[outputIndex] = symbol[Int(b0 >> 2)]
                        output[outputIndex + 1] = symbol[Int((b0 & 0x03) << 4 | b1 >> 4)]
                        output[outputIndex + 2] = symbol[Int((b1 & 0x0F) << 2 | b2 >> 6)]
                        output[outputIndex + 3] = symbol[Int(b2 & 0x3F)]
                        inputIndex += 3
                        outputIndex += 4
                    }
                    guard remainder > 0 else { return }
                    let b0 = input[inputIndex]
                    let b1 = remainder == 2 ? input[inputIndex + 1] : 0
                    output[outputIndex] = symbol[Int(b0 >> 2)]
                    output[outputIndex + 1] = symbol[Int((b0 & 0x03) << 4 | b1 >> 4)]
                    if remainder == 2 {
                        output[outputIndex + 2] = symbol[Int((b1 & 0x0F) << 2)]
                    } else if padded {
                        output[outputIndex + 2] = UInt8(ascii: "=")
                    }
                    if padded {
                        output[outputIndex + 3] = UInt8(ascii: "=")
                    }
                }
            }
        }
    }

    /// Decodes `encoded` (ASCII bytes), or returns nil unless it is the exact output
    /// `encode` gives for some input: only alphabet symbols, padding present and correct
    /// when `padded` (a length that is a multiple of 4, at most two `=` at the very end)
    /// and absent otherwise (a length that is not 1 more than a multiple of 4), and the
    /// unused low bits of the last symbol zero. Accepting only canonical text means one
    /// value has one encoding, so encoded tokens and signatures cannot be altered and
    /// still decode to the same bytes.
    func decode(_ encoded: some Collection<UInt8>) -> [UInt8]? {
        withContiguousBytes(encoded) { input in
            var count = input.count
            if padded {
                guard count % 4 == 0 else { return nil }
                // A third `=`, or one elsewhere, is not a symbol and is rejected below.
                var paddingCount = 0
                while paddingCount < 2, count > 0, input[count - 1] == UInt8(ascii: "=") {
                    count -= 1
                    paddingCount += 1
                }
            }
            let remainder = count % 4
            guard remainder != 1 else { return nil }
            let outputCount = count / 4 * 3 + (remainder == 0 ? 0 : remainder - 1)

            var valid = true
            let output = [UInt8](unsafeUninitializedCapacity: outputCount) { output, initializedCount in
                initializedCount = 0
                values.withUnsafeBufferPointer { value in
                    var inputIndex = 0
                    var outputIndex = 0
                    while count - inputIndex >= 4 {
                        let v0 = value[Int(input[inputIndex])]
                        let v1 = value[Int(input[inputIndex + 1])]
                        let v2 = value[Int(input[inputIndex + 2])]
                        let v3 = value[Int(input[inputIndex + 3])]
                        // Symbols are 0 ..< 64, `invalid` is not: one test covers all four.
                        guard (v0 | v1 | v2 | v3) < 64 else {
                            valid = false
                            return
                        }
                        output[outputIndex] = v0 << 2 | v1 >> 4
                        output[outputIndex + 1] = v1 << 4 | v2 >> 2
                        output[outputIndex + 2] = v2 << 6 | v3
                        inputIndex += 4
                        outputIndex += 3
                    }
                    if remainder >= 2 {
                        let v0 = value[Int(input[inputIndex])]
                        let v1 = value[Int(input[inputIndex + 1])]
                        let v2 = remainder == 3 ? value[Int(input[inputIndex + 2])] : 0
                        let unusedBits = remainder == 3 ? v2 & 0x03 : v1 & 0x0F
                        guard (v0 | v1 | v2) < 64, unusedBits == 0 else {
                            valid = false
                            return
                        }
                        output[outputIndex] = v0 << 2 | v1 >> 4
                        if remainder == 3 {
                            output[outputIndex + 1] = v1 << 4 | v2 >> 2
                        }
                    }
                }
                // Plain bytes need no deinitialisation, so a rejected input can leave the
                // buffer half written; only a valid one is handed out.
                initializedCount = valid ? outputCount : 0
            }
            return valid ? output : nil
        }
    }
}
