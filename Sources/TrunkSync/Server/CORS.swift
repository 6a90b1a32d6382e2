/// CORS from the configured origins: `*` allows any origin; otherwise an origin is echoed
/// only when listed. Tokens travel in `Authorization`, not cookies, so no credentials mode.
struct CORSPolicy: Sendable {
    let allowAny: Bool
    let origins: Set<String>

    init(origins: [String]) {
        allowAny = origins.contains("*")
        self.origins = Set(origins.map { $0.lowercased() })
    }

    var isEnabled: Bool { allowAny || !origins.isEmpty }

    /// The value for `Access-Control-Allow-Origin`, or nil when the origin is not allowed.
    func allowedOrigin(_ origin: String?) -> String? {
        guard let origin else { return nil }
        if allowAny { return "*" }
        return origins.contains(origin.lowercased()) ? origin : nil
    }

    static let allowedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
    static let defaultAllowedHeaders =
        "authorization, apikey, content-type, x-client-info, x-supabase-api-version, prefer, accept-profile, content-profile, range, x-request-id"
    static let exposedHeaders = "Content-Range, X-Request-Id, X-Supabase-Api-Version, Retry-After, Date"
}
