import Foundation
import TestSupport
import XCTest

/// Parses the exposition with the reference Python parser (prometheus_client, which
/// `make test` installs) and returns the samples by `name{label=value,…}`.
func prometheusSamples(_ text: String) throws -> [String: Double] {
    guard let python = ProcessInfo.processInfo.environment["TRUNK_SYNC_TEST_PYTHON"] else {
        throw TestEnvironmentError("TRUNK_SYNC_TEST_PYTHON is not set: run the tests with `make test`")
    }
    let file = NSTemporaryDirectory() + "metrics-\(UUID().uuidString).txt"
    try text.write(toFile: file, atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(atPath: file) }
    let script = """
        import sys, json
        from prometheus_client.parser import text_string_to_metric_families
        out = {}
        for family in text_string_to_metric_families(open(sys.argv[1]).read()):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[sample.name + ("{" + labels + "}" if labels else "")] = sample.value
        print(json.dumps(out))
        """
    let result = try Command.run(python, ["-c", script, file])
    XCTAssertEqual(result.status, 0, result.stderr)
    return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Double])
}
