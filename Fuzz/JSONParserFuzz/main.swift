// libFuzzer target for the JSON module's parser; built by scripts/fuzz.sh json together with
// the module's sources.

/// Tight limits, so that short inputs reach every limit.
let tightLimits = JSONLimits(maxDepth: 4, maxStringBytes: 8, maxNumberLength: 6, maxBytes: 64)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let input = UnsafeBufferPointer(start: data, count: size)
    for limits in [JSONLimits.default, tightLimits] {
        check(input, limits: limits)
    }
    return 0
}

/// What the scanner made of a whole document.
enum Verdict: Equatable {
    case failed
    case refused
    case accepted(storedSize: Int)
}

func scan(_ input: UnsafeBufferPointer<UInt8>, limits: JSONLimits) -> Verdict {
    var scanner = JSONScanner(input, limits: limits)
    do throws(JSONScanner.Failure) {
        let (range, stored) = try scanner.skipValueMeasured()
        try scanner.expectEnd()
        // A value lies inside the input, and the stored size counts what jsonb keeps: at
        // least one byte per value, never negative.
        expect(range.lowerBound >= 0 && range.upperBound <= input.count, "range \(range) outside the input")
        expect(stored >= 1, "stored size \(stored)")
        return scanner.takeViolation() == nil ? .accepted(storedSize: stored) : .refused
    } catch {
        expect(error.offset >= 0 && error.offset <= input.count, "failure offset \(error.offset) outside the input")
        expect(!error.reason.isEmpty, "a failure without a reason")
        return .failed
    }
}

func check(_ input: UnsafeBufferPointer<UInt8>, limits: JSONLimits) {
    let verdict = scan(input, limits: limits)
    // The tree parser is the same parser: it must agree on what is JSON and what is refused.
    let bytes = Array(input)
    let parsed: Result<JSONValue, JSONInputError>
    do { parsed = .success(try JSONValue.parse(bytes, limits: limits)) } catch { parsed = .failure(error) }
    switch (verdict, parsed) {
    case (.accepted, .success(let value)):
        // What the writer makes of a value reads back as the same value.
        let written = value.jsonBytes
        let reread: JSONValue
        do { reread = try JSONValue.parse(written, limits: JSONLimits(maxDepth: limits.maxDepth, maxStringBytes: .max / 2, maxNumberLength: 64, maxBytes: .max)) } catch {
            fatalError("the writer's output does not parse: \(error) — \(String(decoding: written, as: UTF8.self))")
        }
        expect(reread == value, "round trip changed the value: \(value) → \(reread)")
    case (.accepted, .failure(let error)):
        expect(error.kind == .tooLarge, "the scanner accepts what the tree parser refuses: \(error)")
    case (.refused, .failure(let error)):
        expect(error.kind == .invalidValue || error.kind == .tooLarge, "refused by the scanner, \(error.kind) by the tree parser")
    case (.failed, .failure(let error)):
        expect(error.kind == .malformed || error.kind == .tooLarge, "not JSON to the scanner, \(error.kind) to the tree parser")
    case (_, .success):
        fatalError("the tree parser accepts what the scanner did not (\(verdict)): \(String(decoding: bytes, as: UTF8.self))")
    }
    // A string the scanner can read decodes without trapping, violations included.
    if let first = input.first, first == UInt8(ascii: "\"") {
        var scanner = JSONScanner(input, limits: limits)
        _ = try? scanner.string()
    }
}

func expect(_ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String) {
    if !condition() { fatalError(message()) }
}
