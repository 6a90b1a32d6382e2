import Foundation
import HTTPServer
import TrunkCrypto

/// `GET /client/v1/trunk-sync.js`: the browser client (clients/web/trunk-sync.js, embedded by
/// scripts/web-client-embed.sh), so a page imports it from the server it talks to. CORS as
/// every route (a module script from another origin needs it); cacheable, revalidated by ETag.
enum WebClientRoute {
    static let path = "/client/v1/trunk-sync.js"

    /// A strong validator: the SHA-256 of the bytes, so it changes exactly when they do.
    static let etag = "\"" + String(SHA256.hash(WebClientScript.bytes).hexString.prefix(32)) + "\""

    static let cacheControl = "public, max-age=600"

    static func register(in routes: inout Routes) {
        routes.add(.get, path, family: .native, .inline { request in answer(request) })
    }

    static func answer(_ request: HTTPRequest) -> HTTPResponse {
        var headers: HTTPHeaders = [
            "ETag": etag, "Cache-Control": cacheControl, "X-Content-Type-Options": "nosniff",
        ]
        if let tags = request.headers["if-none-match"], matches(tags) {
            return HTTPResponse(status: 304, headers: headers)
        }
        headers.append(name: "Content-Type", value: "text/javascript; charset=utf-8")
        return HTTPResponse(status: .ok, headers: headers, body: WebClientScript.bytes)
    }

    /// `If-None-Match`: `*` or a list holding our tag (weak comparison, as RFC 9110 says).
    static func matches(_ header: String) -> Bool {
        header.split(separator: ",").contains { candidate in
            var tag = candidate.trimmingCharacters(in: .whitespaces)
            if tag.hasPrefix("W/") { tag = String(tag.dropFirst(2)) }
            return tag == "*" || tag == etag
        }
    }
}
