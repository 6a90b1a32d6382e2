import Foundation
import Postgres
import TestSupport
import XCTest

@testable import TrunkSync

/// The plans of `trunk-sync import supabase`'s per-batch statements in a destination that
/// already holds many sessions, analysed as the import analyses it: each batch finds its
/// sessions and tokens by their indexes. A statement that reads the whole of `sessions` or
/// `refresh_tokens` for each batch of 1000 makes the sessions phase grow with the square of
/// the sessions (bench/README.md, session 16: a re-run over 100,000 sessions spent 100 ms a
/// batch hashing all of `sessions`).
final class SupabaseImportPlanTests: XCTestCase {
    func testABatchOfSessionsAlreadyHereIsFoundByTheIndexesNotByReadingEverySession() throws {
        let (configuration, owner) = try migratedDatabase(prefix: "importplans")
        defer { try? TestDatabase.drop(configuration) }
        // 20,000 imported sessions with a live token each, as after a first run.
        try owner.execute(
            """
            insert into users (id, email) select gen_random_uuid(), 'plan' || g || '@example.com' from generate_series(1, 20000) g;
            insert into sessions (id, user_id) select gen_random_uuid(), id from users;
            insert into refresh_tokens (session_id, user_id, token_hash) select id, user_id, sha256(id::text::bytea) from sessions;
            insert into supabase_imported_sessions (session_id) select id from sessions;
            insert into supabase_imported_tokens (token_id) select id from refresh_tokens;
            analyze users; analyze sessions; analyze refresh_tokens;
            """)
        // A re-run's batch: 1000 of them, with the tokens they have.
        try owner.execute(
            SupabaseImport.sessionSetup
                + """
                insert into import_sessions
                select s.id, s.user_id, s.created_at, s.aal, t.token_hash, null
                from sessions s join refresh_tokens t on t.session_id = s.id order by s.id limit 1000;
                """)
        let rows = try owner.query("explain (costs off) " + ImportRun.insertSessions)
        let plan = try (0..<rows.count).map { try rows[$0].decode(String.self, column: 0) }
        // The sessions here of the batch (for their tokens), and the tokens of the batch's
        // sessions that the hosted project rotated away: by index, whatever the tables hold.
        let here = Self.node("CTE here", of: plan)
        XCTAssertFalse(here.contains("Seq Scan on sessions"), here)
        XCTAssertTrue(here.contains("Index Scan using sessions_pkey on sessions"), here)
        let stale = Self.node("CTE stale", of: plan)
        XCTAssertFalse(stale.contains("Seq Scan on refresh_tokens"), stale)
        XCTAssertTrue(stale.contains("refresh_tokens_session_id_idx"), stale)
    }

    /// The lines of `plan` from the one starting with `title` (after its indentation) to the
    /// next at the same indentation or less.
    static func node(_ title: String, of plan: [String]) -> String {
        guard let start = plan.firstIndex(where: { $0.trimmingCharacters(in: .whitespaces).hasPrefix(title) }) else {
            return "(no \(title) in the plan)\n" + plan.joined(separator: "\n")
        }
        let indent = plan[start].prefix { $0 == " " }.count
        let end =
            plan[(start + 1)...].firstIndex { line in
                line.prefix { $0 == " " }.count <= indent && !line.trimmingCharacters(in: .whitespaces).isEmpty
            } ?? plan.endIndex
        return plan[start..<end].joined(separator: "\n")
    }
}
