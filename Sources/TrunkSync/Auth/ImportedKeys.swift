import Foundation
import Postgres
import TrunkCrypto

/// Verify-only public keys imported from another issuer's JWKS (a hosted Supabase project on
/// asymmetric keys), so the access tokens it issued stay valid here until they expire.
public enum ImportedKeys {
    /// One key of a JWKS document, checked and ready to store.
    public struct Entry: Sendable {
        public var keyID: String
        public var algorithm: String
        /// The compact JSON of the public members (what is stored).
        public var json: Data
        public var key: JWT.Key
    }

    /// Why a JWKS document was refused; names the key (by position or kid) and the problem.
    public struct InvalidJWKS: Error, CustomStringConvertible {
        public var description: String
    }

    /// Reads a JWKS document (`{"keys": [...]}`) or a single JWK. Every key must be a public
    /// EC P-256 (`ES256`) or RSA (`RS256`, 2048 to 8192 bits) key with a `kid`; private
    /// members (`d`, `p`, …) are refused so a private key is never stored by mistake.
    public static func parse(_ data: Data) throws -> [Entry] {
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw InvalidJWKS(description: "not a JSON object (expected {\"keys\": [...]})")
        }
        let list: [Any]
        if let keys = object["keys"] { list = keys as? [Any] ?? [] } else { list = [object] }
        guard !list.isEmpty else { throw InvalidJWKS(description: "the JWKS has no keys") }
        return try list.enumerated().map { index, item in try entry(item, index: index) }
    }

    private static func entry(_ item: Any, index: Int) throws -> Entry {
        func fail(_ reason: String) -> InvalidJWKS { InvalidJWKS(description: "key \(index + 1): \(reason)") }
        guard let jwk = item as? [String: Any] else { throw fail("not a JSON object") }
        guard let kid = jwk["kid"] as? String, !kid.isEmpty, kid.utf8.count <= 256 else {
            throw fail("has no kid (tokens name their key by kid)")
        }
        for member in ["d", "p", "q", "dp", "dq", "qi", "k"] where jwk[member] != nil {
            throw fail("kid \(kid) has private member \"\(member)\": import only the public JWKS")
        }
        if let use = jwk["use"] as? String, use != "sig" { throw fail("kid \(kid) is not a signing key (use \(use))") }
        func bytes(_ member: String) throws -> [UInt8] {
            guard let text = jwk[member] as? String, let decoded = Base64URL.decode(text.utf8) else {
                throw fail("kid \(kid): \"\(member)\" missing or not base64url")
            }
            return decoded
        }
        let kty = jwk["kty"] as? String
        let key: JWT.Key
        var publicMembers: [String: Any] = ["kid": kid, "kty": kty ?? ""]
        switch (kty, jwk["alg"] as? String) {
        case ("EC", "ES256"?), ("EC", nil):
            guard jwk["crv"] as? String == "P-256" else { throw fail("kid \(kid): only EC keys on P-256 (ES256)") }
            do {
                key = .es256(try JWT.ES256Key(publicX: try bytes("x"), y: try bytes("y"), keyID: kid))
            } catch let error as JWT.KeyError {
                throw fail("kid \(kid): \(error)")
            }
            publicMembers.merge(["crv": "P-256", "x": jwk["x"] ?? "", "y": jwk["y"] ?? "", "alg": "ES256"]) { $1 }
        case ("RSA", "RS256"?), ("RSA", nil):
            do {
                key = .rs256(try JWT.RS256Key(modulus: try bytes("n"), exponent: try bytes("e"), keyID: kid))
            } catch let error as JWT.KeyError {
                throw fail("kid \(kid): \(error) (RSA keys of 2048 to 8192 bits)")
            }
            publicMembers.merge(["n": jwk["n"] ?? "", "e": jwk["e"] ?? "", "alg": "RS256"]) { $1 }
        default:
            throw fail("kid \(kid): only ES256 (EC P-256) and RS256 (RSA) keys are accepted")
        }
        let json = try JSONSerialization.data(withJSONObject: publicMembers, options: [.sortedKeys])
        return Entry(keyID: kid, algorithm: key.algorithm.rawValue, json: json, key: key)
    }

    /// Stores `entries` (a kid already imported is replaced and un-retired); returns how many.
    public static func store(_ entries: [Entry], database: Database) async throws -> Int {
        let inserts = entries.map { entry in
            PostgresStatement(
                """
                insert into imported_keys (kid, algorithm, public_jwk) values ($1, $2, $3)
                on conflict (kid) do update set algorithm = excluded.algorithm, public_jwk = excluded.public_jwk,
                  retired_at = null
                """, entry.keyID, entry.algorithm, PostgresJSON(bytes: Array(entry.json)))
        }
        // One round trip: every key and the commit.
        _ = try await database.transaction(as: .server) { tx in try await tx.pipeline(inserts + [.commit]) }
        return inserts.count
    }

    /// Retires an imported key; false when no such key is imported.
    public static func retire(_ kid: String, database: Database) async throws -> Bool {
        try await database.transaction(as: .server) { tx in
            let retire = PostgresStatement(
                "update imported_keys set retired_at = coalesce(retired_at, now()) where kid = $1 returning kid", kid)
            return try await tx.pipeline([retire, .commit])[0].count == 1
        }
    }

    /// The imported keys, for `keys list`: kid, algorithm, created, retired.
    public static func list(database: Database) async throws
        -> [(keyID: String, algorithm: String, createdAt: PostgresTimestamp, retiredAt: PostgresTimestamp?)]
    {
        try await database.read(as: .server) { tx in
            try await tx.query(
                "select kid, algorithm, created_at, retired_at from imported_keys order by created_at, kid"
            )
            .map { row in
                (
                    try row.decode(String.self, column: 0), try row.decode(String.self, column: 1),
                    try row.decode(PostgresTimestamp.self, column: 2),
                    try row.decode(PostgresTimestamp?.self, column: 3)
                )
            }
        }
    }
}

extension SigningKeyStore {
    /// The non-retired imported keys as verification keys, and those that no longer parse.
    func importedKeys() async throws -> (keys: [JWT.Key], unreadable: [(keyID: String, reason: String)]) {
        let rows = try await database.read(as: .server) { tx in
            try await tx.query("select kid, public_jwk from imported_keys where retired_at is null order by kid").map {
                (try $0.decode(String.self, column: 0), try $0.decode(PostgresJSON.self, column: 1).bytes)
            }
        }
        var keys: [JWT.Key] = []
        var unreadable: [(keyID: String, reason: String)] = []
        for (kid, jwk) in rows {
            do {
                keys += try ImportedKeys.parse(Data(jwk)).map(\.key)
            } catch {
                unreadable.append((kid, "\(error)"))
            }
        }
        return (keys, unreadable)
    }
}
