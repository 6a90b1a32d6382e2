/// A normalised, validated email address (trimmed, lower-cased).
public struct Email: Hashable, Sendable, CustomStringConvertible {
    /// The normalised address.
    public let value: String

    /// Parses user input; nil unless it looks like `local@domain.tld` within RFC 5321 lengths,
    /// with no spaces, control characters, quotes or angle brackets.
    public init?(_ raw: String) {
        let text = raw.trimmingCharactersInWhitespace().lowercased()
        // Mail goes out over SMTP without SMTPUTF8: ASCII addresses (IDNs in xn-- form).
        guard text.utf8.allSatisfy({ $0 < 0x80 }) else { return nil }
        let parts = text.split(separator: "@", omittingEmptySubsequences: false)
        guard text.utf8.count <= 254, parts.count == 2 else { return nil }
        let local = parts[0]
        let domain = parts[1]
        guard !local.isEmpty, local.utf8.count <= 64, !domain.isEmpty, domain.utf8.count <= 253 else { return nil }
        let forbidden: Set<Character> = [" ", "\"", "<", ">", "(", ")", ",", ";", ":", "\\", "[", "]"]
        guard
            !text.contains(where: {
                forbidden.contains($0) || $0.isNewline || ($0.asciiValue.map { $0 < 0x20 || $0 == 0x7F } ?? false)
            })
        else { return nil }
        let labels = domain.split(separator: ".", omittingEmptySubsequences: false)
        guard labels.count >= 2,
            labels.allSatisfy({ !$0.isEmpty && $0.utf8.count <= 63 && !$0.hasPrefix("-") && !$0.hasSuffix("-") })
        else { return nil }
        guard !local.hasPrefix("."), !local.hasSuffix("."), !local.contains("..") else { return nil }
        value = text
    }

    /// The address.
    public var description: String { value }
}

extension String {
    func trimmingCharactersInWhitespace() -> String {
        var slice = Substring(self)
        while let first = slice.first, first.isWhitespace { slice = slice.dropFirst() }
        while let last = slice.last, last.isWhitespace { slice = slice.dropLast() }
        return String(slice)
    }
}
