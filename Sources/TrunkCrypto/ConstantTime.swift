internal import COpenSSL

/// Returns whether `lhs` and `rhs` hold the same bytes, taking the same time for any two
/// inputs of a given length, wherever they differ (OpenSSL's `CRYPTO_memcmp`).
///
/// Use it to compare secrets and anything derived from them (MACs, token hashes, codes),
/// where `==` would stop at the first differing byte and let an attacker learn a correct
/// value byte by byte from response times. Inputs of different lengths compare unequal at
/// once: only the lengths, which are not secret, can be learnt from the timing.
public func constantTimeEquals(_ lhs: some Collection<UInt8>, _ rhs: some Collection<UInt8>) -> Bool {
    withContiguousBytes(lhs) { left in
        withContiguousBytes(rhs) { right in
            guard left.count == right.count else { return false }
            if left.isEmpty { return true }
            guard let leftBase = left.baseAddress, let rightBase = right.baseAddress else { return false }
            return CRYPTO_memcmp(leftBase, rightBase, left.count) == 0
        }
    }
}
