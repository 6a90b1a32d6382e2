import Foundation

/// The process's metrics, rendered in the Prometheus text format at `GET /metrics`.
/// Counters and histograms are kept under one lock; gauges are read when rendered.
public final class Metrics: @unchecked Sendable {
    /// Upper bounds (seconds) of the request latency histogram.
    static let latencyBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

    private struct Histogram {
        var buckets: [UInt64]
        var sum: Double = 0
        var count: UInt64 = 0
    }

    private let lock = NSLock()
    private var counters: [String: [String: Double]] = [:]
    private var histograms: [String: [String: Histogram]] = [:]
    private var gauges: [(name: String, help: String, read: @Sendable () -> Double)] = []
    private let help: [String: String] = [
        "trunk_sync_http_requests_total": "HTTP requests answered, by method, route and status.",
        "trunk_sync_http_request_duration_seconds": "Time from a complete request to its response, by route.",
        "trunk_sync_events_pushed_total": "Events stored by pushes (native and REST).",
        "trunk_sync_events_duplicate_total": "Pushed events skipped because their client_id was already stored.",
        "trunk_sync_events_pulled_total": "Events returned by pulls (native and REST).",
        "trunk_sync_signin_codes_sent_total": "Sign-in codes handed to the mailer.",
        "trunk_sync_mail_failures_total": "Sign-in mails that could not be sent.",
        "trunk_sync_rate_limited_total": "Requests refused by a rate limit, by limit.",
    ]

    public init() {}

    /// Adds `value` to a counter.
    public func increment(_ name: String, labels: [(String, String)] = [], by value: Double = 1) {
        let key = Self.labelText(labels)
        lock.withLock { counters[name, default: [:]][key, default: 0] += value }
    }

    /// Records one observation in a histogram.
    public func observe(_ name: String, labels: [(String, String)] = [], _ value: Double) {
        let key = Self.labelText(labels)
        lock.withLock {
            var histogram = histograms[name, default: [:]][key] ?? Histogram(buckets: Array(repeating: 0, count: Self.latencyBuckets.count))
            for (index, bound) in Self.latencyBuckets.enumerated() where value <= bound { histogram.buckets[index] += 1 }
            histogram.sum += value
            histogram.count += 1
            histograms[name, default: [:]][key] = histogram
        }
    }

    /// Registers a gauge read at render time.
    public func gauge(_ name: String, help: String, _ read: @escaping @Sendable () -> Double) {
        lock.withLock { gauges.append((name, help, read)) }
    }

    /// Everything in the Prometheus text exposition format (version 0.0.4).
    public func render() -> String {
        let (counters, histograms, gauges) = lock.withLock { (self.counters, self.histograms, self.gauges) }
        var out = ""
        for name in Set(help.keys).union(counters.keys).union(histograms.keys).sorted() {
            if let series = counters[name] ?? (histograms[name] == nil && name.hasSuffix("_total") ? [:] : nil) {
                out += "# HELP \(name) \(help[name] ?? name)\n# TYPE \(name) counter\n"
                if series.isEmpty, !name.contains("http") { out += "\(name) 0\n" }
                for (labels, value) in series.sorted(by: { $0.key < $1.key }) {
                    out += "\(name)\(labels.isEmpty ? "" : "{\(labels)}") \(Self.number(value))\n"
                }
            } else if let series = histograms[name] ?? (name.hasSuffix("_seconds") ? [:] : nil) {
                out += "# HELP \(name) \(help[name] ?? name)\n# TYPE \(name) histogram\n"
                for (labels, histogram) in series.sorted(by: { $0.key < $1.key }) {
                    let prefix = labels.isEmpty ? "" : labels + ","
                    for (index, bound) in Self.latencyBuckets.enumerated() {
                        out += "\(name)_bucket{\(prefix)le=\"\(Self.number(bound))\"} \(histogram.buckets[index])\n"
                    }
                    out += "\(name)_bucket{\(prefix)le=\"+Inf\"} \(histogram.count)\n"
                    out += "\(name)_sum\(labels.isEmpty ? "" : "{\(labels)}") \(Self.number(histogram.sum))\n"
                    out += "\(name)_count\(labels.isEmpty ? "" : "{\(labels)}") \(histogram.count)\n"
                }
            }
        }
        for gauge in gauges.sorted(by: { $0.name < $1.name }) {
            out += "# HELP \(gauge.name) \(gauge.help)\n# TYPE \(gauge.name) gauge\n\(gauge.name) \(Self.number(gauge.read()))\n"
        }
        return out
    }

    static func labelText(_ labels: [(String, String)]) -> String {
        labels.map { name, value in
            let escaped = value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
                .replacingOccurrences(of: "\n", with: "\\n")
            return "\(name)=\"\(escaped)\""
        }.joined(separator: ",")
    }

    static func number(_ value: Double) -> String {
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }
}
