import Foundation
import HTTPServer
import XCTest

@testable import TrunkSync

/// The PostgREST-style query parser on its own: every parameter, every refusal.
final class RESTQueryTests: XCTestCase {
    func parse(_ query: String) throws -> RESTQuery {
        try RESTQuery.parse(
            HTTPRequest(method: .get, path: "/rest/v1/events", query: query), table: "events",
            columns: RESTRoutes.eventColumns)
    }

    func refusal(_ query: String) -> APIError? {
        do {
            _ = try parse(query)
            return nil
        } catch { return error as? APIError }
    }

    func testSelectOrderLimitOffsetAndFilters() throws {
        let id = UUID()
        let query = try parse(
            "select=seq,type,%20payload&order=seq.desc.nullslast,type&limit=10&offset=5&seq=gt.3&type=eq.a%20b&client_id=eq.\(id)"
                + "&created_at=lte.2026-11-22T04:10:02.123Z")
        XCTAssertEqual(query.columns.map(\.name), ["seq", "type", "payload"])
        XCTAssertEqual(query.order.map(\.column.name), ["seq", "type"])
        XCTAssertEqual(query.order.map(\.descending), [true, false])
        XCTAssertEqual(query.order.first?.nullsFirst, false)
        XCTAssertEqual(query.limit, 10)
        XCTAssertEqual(query.offset, 5)
        XCTAssertEqual(query.filters.map(\.column.name), ["seq", "type", "client_id", "created_at"])
        XCTAssertEqual(query.filters.map(\.op), [.gt, .eq, .eq, .lte])
        let clause = query.whereClause(startingAt: 4)
        XCTAssertEqual(clause.sql, " and seq > $4 and type = $5 and client_id = $6 and created_at <= $7")
        XCTAssertEqual(clause.binds.count, 4)
        XCTAssertEqual(query.orderClause(default: "seq"), " order by seq desc nulls last, type asc")
    }

    /// `in.(…)` is one array parameter whatever its length (so one statement text), with
    /// every element quoted and escaped; `is.` binds nothing.
    func testInAndIsClauses() throws {
        let query = try parse(
            "type=in.(a,%22b,c%22,%22d%5C%22e%22,,f)&seq=in.(1,2)&client_id=is.null&created_at=is.not_null&seq=in.()")
        XCTAssertEqual(query.filters.map(\.op), [.in, .in, .is, .is, .in])
        let clause = query.whereClause(startingAt: 4)
        XCTAssertEqual(
            clause.sql,
            " and type = any($4::text[]) and seq = any($5::int8[]) and client_id is null and created_at is not null"
                + " and seq = any($6::int8[])")
        XCTAssertEqual(
            clause.binds.map { String(decoding: $0.bytes ?? [], as: UTF8.self) },
            [#"{"a","b,c","d\"e","","f"}"#, #"{"1","2"}"#, "{}"])
        let stamp = try parse("created_at=in.(2026-11-22T04:10:02.123%2B01:00)").whereClause(startingAt: 1)
        XCTAssertEqual(stamp.sql, " and created_at = any($1::timestamptz[])")
        XCTAssertEqual(
            stamp.binds.first.map { String(decoding: $0.bytes ?? [], as: UTF8.self) },
            #"{"2026-11-22T03:10:02.123000Z"}"#)
        XCTAssertEqual(
            try parse("seq=in.(" + (1...RESTQuery.maxListed).map(String.init).joined(separator: ",") + ")").filters
                .count, 1)
        XCTAssertEqual(
            refusal("seq=in.(" + (0...RESTQuery.maxListed).map(String.init).joined(separator: ",") + ")")?.details,
            .text("at most 1000 values"))
    }

    /// `is.`'s values in any case, as PostgREST reads them (its operators in lower case
    /// only), on their own and inside `or=`/`and=`.
    func testIsValuesInAnyCase() throws {
        let query = try parse("client_id=is.NULL&created_at=not.is.Not_Null&or=(type.is.Null,seq.is.NOT_NULL)")
        XCTAssertEqual(query.filters.map(\.isNull), [true, false])
        XCTAssertEqual(
            query.whereClause(startingAt: 1).sql,
            " and client_id is null and not (created_at is not null) and (type is null or seq is not null)")
        XCTAssertEqual(refusal("and=(type.is.False)")?.code, "42804")
        XCTAssertEqual(
            refusal("type=is.False")?.message, "argument of IS FALSE must be type boolean, not type of column type")
    }

    /// `not.` before any operator negates it; `like` and `ilike` take PostgREST's `*` as SQL's
    /// `%` and leave the rest of the pattern as it is.
    func testNotLikeAndIlikeClauses() throws {
        let query = try parse(
            "type=like.sprout*&type=not.ilike.%25WEED_&seq=not.in.(1,2)&client_id=not.is.null&seq=not.eq.3")
        XCTAssertEqual(query.filters.map(\.op), [.like, .ilike, .in, .is, .eq])
        XCTAssertEqual(query.filters.map(\.negated), [false, true, true, true, true])
        let clause = query.whereClause(startingAt: 2)
        XCTAssertEqual(
            clause.sql,
            " and type like $2 and not (type ilike $3) and not (seq = any($4::int8[]))"
                + " and not (client_id is null) and not (seq = $5)")
        let patterns = clause.binds.prefix(2).map { $0.bytes.map { String(decoding: $0, as: UTF8.self) } }
        XCTAssertEqual(patterns, ["sprout%", "%WEED_"])
        XCTAssertEqual(try parse("type=eq.a*b").filters.first?.value?.bytes, Array("a*b".utf8), "only like's * is %")
        let escaped = try parse("type=like.a%5C%5C").filters.first?.value?.bytes
        XCTAssertEqual(escaped, Array(#"a\\"#.utf8), "an escaped escape")
    }

    /// `or=`, `and=` and their `not.`, nested: each condition a filter as on its own, values
    /// quoted where they hold `,` or `)`, `in.(…)` with its own parentheses.
    func testLogicTrees() throws {
        let query = try parse(
            "or=" + #"(type.eq.a,and(seq.gt.1,seq.lt.5),type.not.in.(x,"y,z"), type.eq."p,q)",type.like.s*)"#
                .addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
                + "&not.and=(seq.eq.1,type.is.null)&seq=gte.0")
        XCTAssertEqual(query.filters.count, 1)
        XCTAssertEqual(query.groups.count, 2)
        let clause = query.whereClause(startingAt: 2)
        XCTAssertEqual(
            clause.sql,
            " and seq >= $2 and (type = $3 or (seq > $4 and seq < $5) or not (type = any($6::text[]))"
                + " or type = $7 or type like $8) and not (seq = $9 and type is null)")
        let texts = clause.binds.map { $0.bytes.map { String(decoding: $0, as: UTF8.self) } }
        XCTAssertEqual(texts[1], "a")
        XCTAssertEqual(texts[4], #"{"x","y,z"}"#)
        XCTAssertEqual(texts[5], "p,q)")
        XCTAssertEqual(texts[6], "s%")
        let spaced = try parse("or=(seq.eq.1%20,%20seq.eq.2%20)").whereClause(startingAt: 1)
        XCTAssertEqual(spaced.sql, " and (seq = $1 or seq = $2)", "spaces around conditions are not values")
        let nested = try parse("or=(and(or(type.eq.a,type.eq.b),seq.eq.1),not.or(seq.eq.2,seq.eq.3))")
        XCTAssertEqual(
            nested.whereClause(startingAt: 1).sql,
            " and (((type = $1 or type = $2) and seq = $3) or not (seq = $4 or seq = $5))")
    }

    func testMalformedLogicTreesAreRefused() {
        let deep = String(repeating: "or(", count: 8) + "seq.eq.1" + String(repeating: ")", count: 8)
        let cases: [(String, String)] = [
            ("or=(type.eq.a,)", "PGRST100"), ("or=type.eq.a", "PGRST100"), ("or=(type.eq.a", "PGRST100"),
            ("or=()", "PGRST100"), ("or=(type.eq.a)x", "PGRST100"), ("or=(type.eq.\"a)", "PGRST100"),
            ("or=(type)", "PGRST100"), ("or=(type.eq)", "PGRST100"), ("or=(type.in.(a,b)", "PGRST100"),
            ("or=(nope.eq.1)", "42703"), ("or=(seq.eq.x)", "22P02"), ("or=(seq.like.1)", "42883"),
            ("or=(payload.eq.1)", "PGRST100"), ("and=(" + deep + ")", "PGRST100"),
            ("or=(seq.eq.1,and(type.eq.a,))", "PGRST100"),
        ]
        for (query, code) in cases {
            let error = refusal(query.replacingOccurrences(of: "\"", with: "%22"))
            XCTAssertEqual(error?.status, 400, query)
            XCTAssertEqual(error?.code, code, query)
        }
        let sevenDeep = String(repeating: "or(", count: 7) + "seq.eq.1" + String(repeating: ")", count: 7)
        XCTAssertNoThrow(try parse("and=(" + sevenDeep + ")"), "eight levels in all are allowed")
    }

    func testDefaults() throws {
        let query = try parse("")
        XCTAssertEqual(query.columns.map(\.name), RESTRoutes.eventColumns.map(\.name))
        XCTAssertNil(query.limit)
        XCTAssertEqual(query.offset, 0)
        XCTAssertEqual(query.orderClause(default: "seq"), " order by seq")
        XCTAssertEqual(query.whereClause(startingAt: 2).sql, "")
        XCTAssertEqual(try parse("select=*").columns.count, RESTRoutes.eventColumns.count)
    }

    /// Each column at most once (PostgREST would print the key twice): the select list can
    /// never ask for more than the table's columns, so an answer's size is bounded by the rows.
    func testEachColumnAtMostOnce() throws {
        XCTAssertEqual(try parse("select=payload,seq,type").columns.map(\.name), ["payload", "seq", "type"])
        XCTAssertEqual(
            try parse("select=" + RESTRoutes.eventColumns.map(\.name).joined(separator: ",")).columns.count,
            RESTRoutes.eventColumns.count)
        let repeated = refusal("select=seq,payload,payload")
        XCTAssertEqual(repeated?.message, "failed to parse select parameter (payload)")
        XCTAssertEqual(repeated?.details, .text("column payload is selected more than once"))
    }

    func testColumnsOfAnInsert() throws {
        XCTAssertEqual(try parse(#"columns="type","client_id""#).insertColumns, ["type", "client_id"])
        XCTAssertEqual(refusal("columns=nope")?.code, "42703")
    }

    func testEveryRefusalHasItsPostgRESTCode() {
        let cases: [(String, String)] = [
            ("select=nope", "42703"), ("select=seq::text", "PGRST100"), ("select=*,seq", "PGRST100"),
            ("order=seq.sideways", "PGRST100"), ("order=nope", "42703"), ("order=seq.asc.nullsfirst.x", "PGRST100"),
            ("limit=-1", "PGRST100"), ("limit=ten", "PGRST100"), ("offset=-5", "PGRST100"), ("seq=5", "PGRST100"),
            ("seq=like.5", "42883"), ("created_at=ilike.2026*", "42883"), ("payload=like.a", "PGRST100"),
            ("seq=not.5", "PGRST100"), ("seq=not.not.eq.5", "PGRST100"), ("seq=not.gt.five", "22P02"),
            ("type=like.a%00", "22P02"), ("type=like.a%5C", "22025"), ("type=ilike.%5C%5C%5C", "22025"),
            ("seq=in.(5,x)", "22P02"), ("seq=in.5", "PGRST100"), ("type=is.true", "42804"),
            ("type=is.TRUE", "42804"), ("type=is.Unknown", "42804"), ("type=is.nul", "PGRST100"),
            ("type=IS.null", "PGRST100"),
            ("seq=gt.five", "22P02"), ("client_id=eq.nope", "22P02"),
            ("client_id=eq.6f1f0e3c11114c3e9d7a3a1c8f0f2b10", "22P02"), ("created_at=gt.now", "22P02"),
            ("payload=eq.{}", "PGRST100"), ("nope=eq.1", "42703"), ("type=eq.a%00b", "22P02"),
            ("select=payload,payload", "PGRST100"), ("select=seq,%20seq", "PGRST100"),
            ("select=" + Array(repeating: "payload", count: 900).joined(separator: ","), "PGRST100"),
            ("select=" + Array(repeating: "nope", count: 9).joined(separator: ","), "PGRST100"),
        ]
        for (query, code) in cases {
            let error = refusal(query)
            XCTAssertEqual(error?.status, 400, query)
            XCTAssertEqual(error?.code, code, query)
            XCTAssertFalse(error?.message.isEmpty ?? true, query)
        }
    }

    /// PostgREST's features outside the subset are named in a `PGRST100`, never taken for a
    /// missing column (`42703`): supabase-js's `.or()` sends `or=(…)`, `.not()` `col=not.op.v`.
    func testUnsupportedPostgRESTFeaturesAreNamed() throws {
        let cases: [(String, String)] = [
            ("items.or=(seq.eq.1)", "The embedded resource parameter (items.or) is not supported by this server."),
            ("or=(type.fts.a,seq.eq.1)", "The fts operator is not supported by this server."),
            ("seq=isdistinct.2", "The isdistinct operator is not supported by this server."),
            ("type=match.^a", "The match operator is not supported by this server."),
            ("type=not.imatch.^a", "The imatch operator is not supported by this server."),
            ("type=like(all).{a*,b*}", "The like(all) operator is not supported by this server."),
            ("type=fts(english).sprout", "The fts(english) operator is not supported by this server."),
            ("seq=eq(any).{1,2}", "The eq(any) operator is not supported by this server."),
            ("payload->>kind=eq.a", "The JSON path filter (payload->>kind) is not supported by this server."),
            ("items.seq=eq.1", "The embedded resource parameter (items.seq) is not supported by this server."),
            ("order=payload->kind.desc", "The JSON path order (payload->kind) is not supported by this server."),
            ("order=items(seq).desc", "The embedded resource order (items(seq)) is not supported by this server."),
        ]
        for (query, message) in cases {
            let error = refusal(query)
            XCTAssertEqual(error?.status, 400, query)
            XCTAssertEqual(error?.code, "PGRST100", query)
            XCTAssertEqual(error?.message, message, query)
            XCTAssertEqual(
                error?.details,
                .text(
                    "Filters are column=op.value or column=not.op.value with eq, neq, gt, gte, lt, lte, in, is, like, ilike; several are combined with and; or=(…) and and=(…) combine conditions."
                ),
                query)
        }
        // An operator PostgREST does not know either: its own message, still PGRST100.
        let unknown = refusal("seq=around.5")
        XCTAssertEqual(unknown?.code, "PGRST100")
        XCTAssertEqual(unknown?.message, "failed to parse filter (around.5)")
        // What the subset has keeps working, and an unknown column is still one.
        XCTAssertEqual(try parse("seq=gt.1&type=neq.a&order=seq.desc").filters.map(\.op), [.gt, .neq])
        XCTAssertEqual(refusal("orr=eq.1")?.code, "42703")
        XCTAssertEqual(refusal("notes=eq.1")?.code, "42703")
    }
}
