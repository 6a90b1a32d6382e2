internal import COpenSSL

/// Cryptographically secure random values from OpenSSL's CSPRNG (`RAND_bytes`), for
/// anything an attacker must not guess: one-time codes, refresh tokens, session ids, keys.
///
/// Every function here either returns unpredictable output or stops the process: if
/// `RAND_bytes` ever fails (the generator cannot be seeded from the operating system), the
/// process crashes. That is the one deliberate crash in this module. No caller could do
/// anything sensible with an error, and any fallback (zeros, a weaker generator) would
/// hand out guessable codes and tokens, which is worse than being down.
public enum SecureRandom {
    /// Returns `count` random bytes; an empty array when `count` is zero or negative.
    public static func bytes(count: Int) -> [UInt8] {
        guard count > 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: count) { buffer, initializedCount in
            fill(UnsafeMutableRawBufferPointer(buffer))
            initializedCount = count
        }
    }

    /// Returns a random integer uniformly distributed in `0 ..< upperBound`.
    ///
    /// Uses rejection sampling rather than `random % upperBound`, which would favour small
    /// results whenever `upperBound` does not divide 2³². An `upperBound` of 0 is treated
    /// as 1 (the result is 0), so no value of the argument can crash.
    public static func uniform(upperBound: UInt32) -> UInt32 {
        uniform(upperBound: upperBound, drawing: randomUInt32)
    }

    /// Returns `count` uniformly random decimal digits, leading zeros included
    /// (`digits(6)` gives one of the 10⁶ codes `"000000"` … `"999999"` with equal odds);
    /// an empty string when `count` is zero or negative.
    public static func digits(_ count: Int) -> String {
        makeASCIIString(count: max(0, count)) { buffer in
            for index in buffer.indices {
                buffer[index] = UInt8(ascii: "0") + UInt8(truncatingIfNeeded: uniform(upperBound: 10))
            }
        }
    }

    /// The rejection sampling behind `uniform(upperBound:)`, with the source of random
    /// 32-bit words injectable so that tests can check which draws are rejected.
    static func uniform(upperBound: UInt32, drawing draw: () -> UInt32) -> UInt32 {
        guard upperBound > 1 else { return 0 }
        // 2³² mod upperBound: the words below it are the surplus that would make the low
        // results more likely; the remaining 2³² − threshold words are a whole number of
        // copies of 0 ..< upperBound.
        let threshold = (0 &- upperBound) % upperBound
        while true {
            let word = draw()
            if word >= threshold {
                return word % upperBound
            }
        }
    }

    private static func randomUInt32() -> UInt32 {
        var word: UInt32 = 0
        withUnsafeMutableBytes(of: &word) { fill($0) }
        return word
    }

    private static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        guard let base = buffer.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return }
        var offset = 0
        while offset < buffer.count {
            let chunk = min(buffer.count - offset, Int(Int32.max))
            guard RAND_bytes(base + offset, Int32(chunk)) == 1 else {
                // See the type's documentation: continuing without randomness would issue
                // predictable secrets.
                fatalError("RAND_bytes failed: OpenSSL's random generator is unavailable")
            }
            offset += chunk
        }
    }
}
