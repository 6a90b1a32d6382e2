/// Where and how `SMTPMailer` delivers mail: server, TLS, credentials and timeouts.
///
/// Usually parsed from `TRUNK_SYNC_SMTP_URL`:
///
///     smtp://[user:pass@]host[:port][?tls=none|starttls|tls][&verify=false][&ca_file=PATH]
///     smtps://[user:pass@]host[:port][?verify=false][&ca_file=PATH]
///
/// - `smtp://` uses STARTTLS by default and *requires* it: a server that does not offer
///   it is an error, never a silent fall-back to plain text. `tls=none` (local sinks
///   only) sends in plain text; `tls=tls` is implicit TLS, like `smtps://`.
/// - `smtps://` is implicit TLS (TLS from the first byte, RFC 8314).
/// - The default port follows the TLS mode: 587 for STARTTLS, 465 for implicit TLS, 25
///   for `tls=none`.
/// - `user` and `pass` are percent-decoded (write `@` as `%40`, `:` as `%3A`, `/` as
///   `%2F`). Credentials are sent only over TLS, or in plain text when `tls=none` was
///   chosen explicitly.
/// - Certificates are verified by default against the system's CA store: the chain, and
///   that the certificate names `host` (a DNS name, or an IP address when `host` is one).
///   `verify=false` turns verification off (self-signed test servers); `ca_file=PATH`
///   trusts the PEM certificates in PATH instead of the system store.
/// - Anything else (an unknown option, a path, a fragment) is an error, so a typo cannot
///   quietly weaken the connection.
public struct SMTPConfiguration: Sendable, Equatable, CustomStringConvertible {
    /// How the connection is protected.
    public enum TLSMode: String, Sendable, Equatable, CaseIterable {
        /// Plain text throughout. For local test sinks only.
        case none
        /// Plain-text greeting, then `STARTTLS`, which the server must offer.
        case startTLS = "starttls"
        /// TLS from the first byte (`smtps://`).
        case implicit = "tls"
    }

    /// A user name and password for `AUTH PLAIN` / `AUTH LOGIN`. Its `description` hides the password.
    public struct Credentials: Sendable, Equatable, CustomStringConvertible {
        /// The user name, decoded.
        public var username: String
        /// The password, decoded.
        public var password: String

        /// Credentials from decoded values.
        public init(username: String, password: String) {
            self.username = username
            self.password = password
        }

        /// `username:***`.
        public var description: String { "\(username):***" }
    }

    /// The server's host name or IP address (without brackets for IPv6).
    public var host: String
    /// The server's TCP port.
    public var port: Int
    /// How the connection is protected. Default: `.startTLS` for `smtp://`, `.implicit` for `smtps://`.
    public var tls: TLSMode
    /// Whether the server's certificate is verified (chain and host name). Default: `true`.
    public var verifyCertificate: Bool
    /// A PEM file of CA certificates to trust instead of the system store (`ca_file=`).
    /// Default: `nil`, the system store.
    public var caFile: String?
    /// Credentials for `AUTH`, or `nil` to send without signing in. Default: `nil`.
    public var credentials: Credentials?
    /// The longest wait to establish the TCP connection, per address the host resolves to.
    /// Default: 10 seconds.
    public var connectTimeout: Duration
    /// The longest wait for each step after that: a TLS handshake, or a command and its
    /// reply (the message data and its final reply count as one). Default: 30 seconds.
    public var commandTimeout: Duration

    /// The name of the environment variable the URL normally comes from, used in errors.
    public static let environmentVariable = "TRUNK_SYNC_SMTP_URL"

    /// A configuration from its parts; the timeouts take their defaults.
    public init(
        host: String, port: Int, tls: TLSMode, credentials: Credentials? = nil, verifyCertificate: Bool = true,
        caFile: String? = nil
    ) {
        self.host = host
        self.port = port
        self.tls = tls
        self.credentials = credentials
        self.verifyCertificate = verifyCertificate
        self.caFile = caFile
        self.connectTimeout = .seconds(10)
        self.commandTimeout = .seconds(30)
    }

    /// Parses an `smtp://` or `smtps://` URL (see the type's documentation).
    /// - Parameter setting: the name errors give the URL (default `TRUNK_SYNC_SMTP_URL`).
    /// - Throws: `MailError` of kind `.invalidConfiguration` naming `setting` and why,
    ///   never quoting the URL's user name, password, host or options.
    public init(url: String, setting: String = SMTPConfiguration.environmentVariable) throws {
        self = try SMTPURLParser(setting: setting).parse(url)
    }

    /// The default port of a TLS mode: 587 (STARTTLS), 465 (implicit TLS), 25 (none).
    public static func defaultPort(for tls: TLSMode) -> Int {
        switch tls {
        case .startTLS: return 587
        case .implicit: return 465
        case .none: return 25
        }
    }

    /// `host:port`, with brackets around an IPv6 address; what error messages name.
    public var endpoint: String {
        host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    /// The configuration as a URL with every default spelled out and the password replaced
    /// by `***`, e.g. `smtp://mailer:***@mail.example.com:587?tls=starttls`. Safe to log.
    public var redactedDescription: String {
        var text = tls == .implicit ? "smtps://" : "smtp://"
        if let credentials {
            text += SMTPURLParser.percentEncode(credentials.username) + ":***@"
        }
        text += endpoint
        var options: [String] = []
        if tls != .implicit { options.append("tls=\(tls.rawValue)") }
        if !verifyCertificate { options.append("verify=false") }
        if let caFile { options.append("ca_file=\(SMTPURLParser.percentEncode(caFile))") }
        if !options.isEmpty { text += "?" + options.joined(separator: "&") }
        return text
    }

    /// The redacted URL (`redactedDescription`), so interpolating a configuration never leaks the password.
    public var description: String { redactedDescription }
}

/// Turns the text of an SMTP URL into an `SMTPConfiguration`. Errors never quote the URL:
/// an unencoded `@`, `/` or `?` in a password shifts its pieces into the host, port,
/// path or options, so any of them may hold part of the password.
struct SMTPURLParser {
    let setting: String

    private static let percentEncodingHint =
        "characters such as @ : / ? # % in the user name or password must be percent-encoded"

    func parse(_ url: String) throws -> SMTPConfiguration {
        guard !url.isEmpty else { throw invalid("it is empty") }
        guard let schemeEnd = url.firstRange(of: "://") else {
            throw invalid("expected smtp://[user:pass@]host[:port][?tls=none|starttls|tls] or smtps://…")
        }
        let scheme = url[..<schemeEnd.lowerBound].lowercased()
        let implicitScheme: Bool
        switch scheme {
        case "smtp": implicitScheme = false
        case "smtps": implicitScheme = true
        default:
            let shown = scheme.count <= 16 && scheme.allSatisfy { $0.isLetter || $0.isNumber || $0 == "+" || $0 == "-" }
            throw invalid("unsupported scheme\(shown ? " \"\(scheme)\"" : ""): use smtp:// or smtps://")
        }
        var rest = url[schemeEnd.upperBound...]
        if rest.contains("#") { throw invalid("it has a fragment (#…); \(Self.percentEncodingHint)") }
        var query: Substring = ""
        if let questionMark = rest.firstIndex(of: "?") {
            query = rest[rest.index(after: questionMark)...]
            rest = rest[..<questionMark]
        }
        var authority = rest
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            let path = rest[slash...]
            guard path == "/" else { throw invalid("it has a path after the host; \(Self.percentEncodingHint)") }
        }

        var credentials: SMTPConfiguration.Credentials?
        var hostAndPort = authority
        if let at = authority.lastIndex(of: "@") {
            credentials = try parseCredentials(authority[..<at])
            hostAndPort = authority[authority.index(after: at)...]
        }
        let (host, explicitPort) = try parseHostAndPort(hostAndPort)

        var tls: SMTPConfiguration.TLSMode = implicitScheme ? .implicit : .startTLS
        var verify = true
        var caFile: String?
        var seen: Set<String> = []
        for option in query.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = option.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let key = String(parts[0])
            let value = parts.count == 2 ? String(parts[1]) : ""
            guard ["tls", "verify", "ca_file"].contains(key) else {
                throw invalid("it has an unknown option (the options are tls, verify and ca_file)")
            }
            guard seen.insert(key).inserted else { throw invalid("option \(key) is given twice") }
            switch key {
            case "tls":
                guard let mode = SMTPConfiguration.TLSMode(rawValue: value.lowercased()) else {
                    throw invalid("tls must be none, starttls or tls")
                }
                if implicitScheme && mode != .implicit {
                    throw invalid("smtps:// always uses implicit TLS; for tls=\(mode.rawValue) use smtp://")
                }
                tls = mode
            case "verify":
                switch value.lowercased() {
                case "true": verify = true
                case "false": verify = false
                default: throw invalid("verify must be true or false")
                }
            default:
                guard let path = Self.percentDecode(Substring(value)), !path.isEmpty else {
                    throw invalid("ca_file must be a path (percent-encoded)")
                }
                caFile = path
            }
        }
        if tls == .none && (seen.contains("verify") || caFile != nil) {
            throw invalid("verify and ca_file have no effect with tls=none")
        }
        if !verify && caFile != nil { throw invalid("ca_file has no effect with verify=false") }

        return SMTPConfiguration(
            host: host, port: explicitPort ?? SMTPConfiguration.defaultPort(for: tls), tls: tls,
            credentials: credentials, verifyCertificate: verify, caFile: caFile)
    }

    private func parseCredentials(_ userInfo: Substring) throws -> SMTPConfiguration.Credentials {
        guard let colon = userInfo.firstIndex(of: ":") else {
            throw invalid("it has a user name but no password (write user:pass@host)")
        }
        guard let username = Self.percentDecode(userInfo[..<colon]),
            let password = Self.percentDecode(userInfo[userInfo.index(after: colon)...])
        else {
            throw invalid("the user name or password is not valid percent-encoded UTF-8")
        }
        guard !username.isEmpty else { throw invalid("the user name is empty") }
        guard !password.isEmpty else { throw invalid("the password is empty") }
        return SMTPConfiguration.Credentials(username: username, password: password)
    }

    private func parseHostAndPort(_ text: Substring) throws -> (host: String, port: Int?) {
        let host: Substring
        var portText: Substring?
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { throw invalid("the IPv6 address lacks its closing ]") }
            host = text[text.index(after: text.startIndex)..<close]
            let after = text[text.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw invalid("unexpected text after the IPv6 address") }
                portText = after.dropFirst()
            }
            guard !host.isEmpty, host.allSatisfy({ $0.isASCII && ($0.isHexDigit || $0 == ":" || $0 == ".") }) else {
                throw invalid("the IPv6 address is invalid")
            }
        } else {
            if let colon = text.firstIndex(of: ":") {
                host = text[..<colon]
                portText = text[text.index(after: colon)...]
            } else {
                host = text
            }
            guard !host.isEmpty else { throw invalid("the host is missing") }
            let allowed = host.unicodeScalars.allSatisfy {
                $0.isASCII && (CharacterSetASCII.isAlphanumeric($0) || $0 == "." || $0 == "-" || $0 == "_")
            }
            guard allowed else {
                throw invalid("the host is not a valid host name or IP address; \(Self.percentEncodingHint)")
            }
        }
        guard let portText else { return (String(host), nil) }
        guard !portText.isEmpty, portText.count <= 5, portText.allSatisfy({ $0.isASCII && $0.isNumber }),
            let port = Int(portText), (1...65535).contains(port)
        else {
            throw invalid("the port must be a number from 1 to 65535; \(Self.percentEncodingHint)")
        }
        return (String(host), port)
    }

    private func invalid(_ reason: String) -> MailError {
        MailError(.invalidConfiguration, "\(setting) is invalid: \(reason)")
    }

    /// Decodes `%XX` escapes; nil for a malformed escape or bytes that are not UTF-8.
    static func percentDecode(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else {
                return nil
            }
            bytes.append(high << 4 | low)
        }
        let decoded = String(decoding: bytes, as: UTF8.self)
        // Decoding replaces invalid UTF-8 with U+FFFD, which then no longer encodes to `bytes`.
        return decoded.utf8.elementsEqual(bytes) ? decoded : nil
    }

    /// Percent-encodes everything but RFC 3986's unreserved characters.
    static func percentEncode(_ text: String) -> String {
        var result = ""
        for byte in text.utf8 {
            let scalar = Unicode.Scalar(byte)
            if CharacterSetASCII.isAlphanumeric(scalar) || "-._~".unicodeScalars.contains(scalar) {
                result.unicodeScalars.append(scalar)
            } else {
                result += "%" + String(byte, radix: 16, uppercase: true).leftPadded(to: 2)
            }
        }
        return result
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
