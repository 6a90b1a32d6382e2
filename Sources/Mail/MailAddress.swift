/// An email address as SMTP sends it: `local@domain`, optionally with a display name
/// (`Trunk <no-reply@trunk.example>`).
///
/// Only what SMTP without extensions can carry is accepted: an ASCII dot-atom local part
/// (no quoted local parts), and a domain of ASCII labels (IDNs in their `xn--` form) or an
/// address literal (`[192.0.2.1]`). Single-label domains such as `localhost` are allowed.
/// The display name may be any text without line breaks; non-ASCII names are encoded
/// (RFC 2047) when the header is written.
public struct MailAddress: Sendable, Hashable, CustomStringConvertible {
    /// `local@domain`, as given in `MAIL FROM:<…>` / `RCPT TO:<…>`.
    public let address: String
    /// The display name, without quotes, or `nil`.
    public let displayName: String?

    /// Parses `local@domain` or `Display Name <local@domain>` (the name may be quoted).
    /// - Parameter role: what the address is, for the error (`"sender"`, `"recipient"`).
    /// - Throws: `MailError` of kind `.invalidMessage` saying what is wrong, without
    ///   quoting the address.
    public init(_ text: String, role: String = "email") throws {
        let trimmed = text.trimmingASCIIWhitespace()
        var addressText = trimmed
        var displayName: String?
        if trimmed.hasSuffix(">"), let open = trimmed.lastIndex(of: "<") {
            addressText = String(trimmed[trimmed.index(after: open)..<trimmed.index(before: trimmed.endIndex)])
            var name = String(trimmed[..<open]).trimmingASCIIWhitespace()
            if name.count >= 2, name.hasPrefix("\""), name.hasSuffix("\"") {
                name = Self.unquote(name.dropFirst().dropLast())
            }
            displayName = name.isEmpty ? nil : name
        }
        if let displayName, displayName.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
            throw MailError(.invalidMessage, "the \(role) address's display name contains a control character")
        }
        if let reason = Self.problem(withAddress: addressText) {
            throw MailError(.invalidMessage, "the \(role) address is invalid: \(reason)")
        }
        self.address = addressText
        self.displayName = displayName
    }

    /// The domain part, after the `@`.
    public var domain: Substring {
        guard let at = address.lastIndex(of: "@") else { return "" }
        return address[address.index(after: at)...]
    }

    /// `Name <local@domain>`, or `local@domain` without a display name (not header-encoded).
    public var description: String {
        guard let displayName else { return address }
        return "\(displayName) <\(address)>"
    }

    /// Why `address` is not a plain ASCII `local@domain` of SMTP's limits, or nil if it is.
    static func problem(withAddress address: String) -> String? {
        guard !address.isEmpty else { return "it is empty" }
        guard address.utf8.count <= 254 else { return "it is longer than 254 characters" }
        guard address.unicodeScalars.allSatisfy({ $0.isASCII }) else {
            return "only ASCII addresses are supported (write international domains in their xn-- form)"
        }
        guard let at = address.lastIndex(of: "@") else { return "it has no @" }
        let local = address[..<at]
        let domain = address[address.index(after: at)...]
        guard !local.isEmpty, local.utf8.count <= 64 else { return "the part before @ must have 1 to 64 characters" }
        guard local.unicodeScalars.allSatisfy({ isAtext($0) || $0 == "." }), !local.hasPrefix("."),
            !local.hasSuffix("."), !local.contains("..")
        else {
            return "the part before @ has characters or dots a plain address cannot have"
        }
        guard !domain.isEmpty else { return "the domain is empty" }
        if domain.hasPrefix("[") {
            let inner = domain.dropFirst()
            guard inner.hasSuffix("]"),
                inner.dropLast().unicodeScalars.allSatisfy({
                    CharacterSetASCII.isAlphanumeric($0) || $0 == "." || $0 == ":"
                }),
                inner.count > 1
            else {
                return "the address literal after @ is invalid"
            }
            return nil
        }
        guard domain.utf8.count <= 253 else { return "the domain is longer than 253 characters" }
        for label in domain.split(separator: ".", omittingEmptySubsequences: false) {
            guard !label.isEmpty, label.utf8.count <= 63,
                label.unicodeScalars.allSatisfy({ CharacterSetASCII.isAlphanumeric($0) || $0 == "-" }),
                !label.hasPrefix("-"), !label.hasSuffix("-")
            else {
                return "the domain is not a valid host name"
            }
        }
        return nil
    }

    /// RFC 5322 `atext`: the characters of an unquoted local part, besides dots.
    static func isAtext(_ scalar: Unicode.Scalar) -> Bool {
        CharacterSetASCII.isAlphanumeric(scalar) || "!#$%&'*+-/=?^_`{|}~".unicodeScalars.contains(scalar)
    }

    private static func unquote(_ text: Substring) -> String {
        var result = ""
        var escaped = false
        for character in text {
            if !escaped && character == "\\" {
                escaped = true
                continue
            }
            escaped = false
            result.append(character)
        }
        return result
    }
}

extension String {
    /// The string without leading and trailing spaces, tabs and line breaks.
    func trimmingASCIIWhitespace() -> String {
        let isSpace: (Unicode.Scalar) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\r" || $0 == "\n" }
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !isSpace($0) }),
            let last = scalars.lastIndex(where: { !isSpace($0) })
        else { return "" }
        return String(scalars[first...last])
    }
}
