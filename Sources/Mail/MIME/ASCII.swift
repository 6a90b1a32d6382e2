/// ASCII character classes (Foundation's `CharacterSet` and `Character.isLetter` accept
/// far more than ASCII).
enum CharacterSetASCII {
    static func isAlphanumeric(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: return true
        default: return false
        }
    }
}
