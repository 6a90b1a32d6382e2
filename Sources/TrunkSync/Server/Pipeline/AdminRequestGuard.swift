import Foundation
import HTTPServer

/// What the admin listener checks on every request's head before routing it, so that a web
/// page on another site cannot reach it through the operator's browser:
///
/// - **`Host`** must name this listener: an address it is bound to (any IP literal when it
///   binds a wildcard address), `localhost` when it is bound to loopback or a wildcard, or one
///   of `TRUNK_SYNC_ADMIN_HOSTNAMES`. A DNS rebinding attack reaches the listener under the
///   attacker's own name, so it is refused (`421 host_not_allowed`).
/// - **`Origin`**, when a browser sends one, must be this listener itself (`http://` or
///   `https://` and the request's `Host`): a script or form on another site is refused
///   (`403 origin_not_allowed`), whatever the route.
/// - a body sent to a route that reads one must be `application/json`: a cross-site "simple"
///   `POST` (`text/plain`, no preflight) is refused (`415 unsupported_media_type`) before it is
///   read, never parsed as JSON.
///
/// And every answer it sends carries the headers of `secure(_:)`.
struct AdminRequestGuard: Sendable {
    /// Host names accepted, lower case, without a trailing dot.
    let names: Set<String>
    /// IP addresses accepted in `Host`; nil: any (the listener binds a wildcard address).
    let addresses: Set<IPAddress>?

    /// The guard of a listener bound to `bindHost`, also answering to `hostnames`.
    init(bindHost: String, hostnames: [String]) {
        var names = Set(hostnames.map { Self.normalised($0) })
        let bound = IPAddress(bindHost)
        let wildcard = bound == IPAddress(high: 0, low: 0) || bound == IPAddress(ipv4: 0)
        let loopback = bound.map(Self.isLoopback) ?? (Self.normalised(bindHost) == "localhost")
        if wildcard || loopback { names.insert("localhost") }
        if bound == nil { names.insert(Self.normalised(bindHost)) }  // bound by name
        if wildcard {
            addresses = nil
        } else {
            // Any loopback address reaches a loopback listener (127.0.0.1 and ::1 alike).
            var accepted = Set(bound.map { [$0] } ?? [])
            if loopback { accepted.formUnion([IPAddress(ipv4: 0x7F00_0001), IPAddress(high: 0, low: 1)]) }
            addresses = accepted
        }
        self.names = names
    }

    /// The refusal for `head` on `endpoint` (nil: the request may go on).
    func check(_ head: HTTPRequestHead, endpoint: Endpoint?) -> APIError? {
        let host = head.headers["host"]
        // HTTP/1.0 without `Host` is a tool's request, not a browser's.
        if let host, !isAllowed(host: host) {
            return APIError(
                status: 421, code: "host_not_allowed",
                message: "This listener does not answer to this Host: use its address, "
                    + "or add the name to TRUNK_SYNC_ADMIN_HOSTNAMES.")
        }
        if let origin = head.headers["origin"], !Self.isSameOrigin(origin, host: host) {
            return APIError(
                status: 403, code: "origin_not_allowed", message: "Requests from other sites are not accepted here.")
        }
        if let endpoint, endpoint.bodyLimit > Endpoint.BodyLimit.none, head.hasBody,
            !Self.isJSON(head.headers["content-type"])
        {
            return APIError(
                status: 415, code: "unsupported_media_type",
                message: "The body must be JSON: Content-Type: application/json.")
        }
        return nil
    }

    /// Adds what every answer of the admin listener carries, errors and `/metrics` included,
    /// unless the route set its own: `X-Content-Type-Options: nosniff` (no answer is ever
    /// read as another type), `Cache-Control: no-store` (the console's pages of users, events
    /// and sessions stay out of every cache; the page's own files say `no-cache`), and
    /// `Cross-Origin-Resource-Policy: same-origin` (a page of another origin, even one on the
    /// same host such as an app on the public port, cannot load any of it with `<img>`,
    /// `<script>` or a `no-cors` fetch; nothing but the console's own page needs it).
    static func secure(_ headers: inout HTTPHeaders) {
        for (name, value) in [
            ("X-Content-Type-Options", "nosniff"), ("Cache-Control", "no-store"),
            ("Cross-Origin-Resource-Policy", "same-origin"),
        ] where !headers.contains(name) {
            headers.append(name: name, value: value)
        }
    }

    /// Whether `Host` (`name`, `name:port`, `192.0.2.1:9090`, `[::1]:9090`) names this listener.
    func isAllowed(host value: String) -> Bool {
        guard let host = Self.hostPart(value) else { return false }
        if let address = IPAddress(host) { return addresses?.contains(address) ?? true }
        return names.contains(host)
    }

    /// The host of a `Host` value, lower case, without port, brackets or a trailing dot; nil
    /// when it is not of that form.
    static func hostPart(_ value: String) -> String? {
        var text = Substring(value.lowercased())
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            let rest = text[text.index(after: close)...]
            guard rest.isEmpty || (rest.hasPrefix(":") && isPort(rest.dropFirst())) else { return nil }
            return String(text[text.index(after: text.startIndex)..<close])
        }
        if let colon = text.lastIndex(of: ":") {
            guard isPort(text[text.index(after: colon)...]) else { return nil }
            text = text[..<colon]
        }
        guard !text.isEmpty, !text.contains(":") else { return nil }
        return normalised(String(text))
    }

    /// Whether `origin` is `http://HOST` or `https://HOST` with the request's `Host`
    /// (`null`, another scheme or another host: no).
    static func isSameOrigin(_ origin: String, host: String?) -> Bool {
        guard let host else { return false }
        let value = origin.lowercased()
        for scheme in ["http://", "https://"] where value.hasPrefix(scheme) {
            return String(value.dropFirst(scheme.count)) == host.lowercased()
        }
        return false
    }

    static func isJSON(_ contentType: String?) -> Bool {
        guard let contentType else { return false }
        let mediaType = contentType.split(separator: ";", maxSplits: 1).first ?? ""
        return mediaType.trimmingCharacters(in: .whitespaces).lowercased() == "application/json"
    }

    private static func isPort(_ text: Substring) -> Bool {
        !text.isEmpty && text.count <= 5 && text.utf8.allSatisfy { $0 >= 48 && $0 <= 57 }
    }

    private static func normalised(_ name: String) -> String {
        var name = name.trimmingCharacters(in: .whitespaces).lowercased()
        while name.hasSuffix(".") { name.removeLast() }
        return name
    }

    private static func isLoopback(_ address: IPAddress) -> Bool {
        address == IPAddress(high: 0, low: 1) || (address.isIPv4 && (address.low >> 24) & 0xFF == 127)
    }
}
