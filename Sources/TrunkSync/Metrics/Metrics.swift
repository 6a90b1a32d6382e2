import CSystem
import Foundation
import HTTPServer
import Synchronization

/// The process's metrics, rendered in the Prometheus text format at `GET /metrics`.
///
/// Every series is registered once, at start-up, and updated through its handle: a
/// `Counter` or an `HTTPRouteMetrics`. Updating is a relaxed atomic add — no string, no
/// look-up, no lock — so observing a request costs next to nothing. The lock below guards
/// only registration and rendering.
public final class Metrics: @unchecked Sendable {
    private let lock = NSLock()
    private var counters: [(name: String, help: String, labels: String, counter: Counter)] = []
    private var routes: [String: HTTPRouteMetrics] = [:]
    private var gauges: [(name: String, help: String, labels: String, read: @Sendable () -> Double)] = []

    /// Events stored by pushes (native and REST).
    public let eventsPushed: Counter
    /// Pushed events skipped because their `client_id` was already stored.
    public let eventsDuplicate: Counter
    /// Events returned by pulls (native and REST).
    public let eventsPulled: Counter
    /// Sign-in codes handed to the mailer.
    public let signInCodesSent: Counter
    /// Sign-in mails the mailer failed to send.
    public let mailFailures: Counter
    /// Sign-in mails never handed to the mailer: the mail queue was full (or the server
    /// stopped before their turn).
    public let mailDropped: Counter
    private let rateLimited: [String: Counter]
    /// Answers refused with `503 server_busy` because the output buffers held as many unread
    /// answers as `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT` allows (`limit="total"`).
    public let answersRefused: Counter
    /// Answers refused with `503 server_busy` because the unread large answers of their
    /// account (or client address) held as much as `TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT_PER_CLIENT`
    /// allows (`limit="per_client"`).
    public let answersRefusedPerClient: Counter
    /// Request bodies refused with `503 server_busy` because the bodies being read held as
    /// much as `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT` allows (`limit="total"`).
    public let bodiesRefused: Counter
    /// Request bodies refused with `503 server_busy` because the bodies of their account (or
    /// client address) held as much as `TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT_PER_CLIENT` allows
    /// (`limit="per_client"`).
    public let bodiesRefusedPerClient: Counter

    /// The limits counted in `trunk_sync_rate_limited_total{limit=…}`.
    /// `otp`, `verify`, `token`, `reauthenticate`, `account`: per client; `otp_email`,
    /// `verify_email`: per email address; `mail`: the deployment's mails.
    public static let rateLimitNames = [
        "otp", "verify", "token", "reauthenticate", "account", "otp_email", "verify_email", "mail",
    ]

    public init() {
        var register: [(String, String, String, Counter)] = []
        func counter(_ name: String, _ help: String, labels: String = "") -> Counter {
            let counter = Counter()
            register.append((name, help, labels, counter))
            return counter
        }
        eventsPushed = counter("trunk_sync_events_pushed_total", "Events stored by pushes (native and REST).")
        eventsDuplicate = counter(
            "trunk_sync_events_duplicate_total", "Pushed events skipped because their client_id was already stored.")
        eventsPulled = counter("trunk_sync_events_pulled_total", "Events returned by pulls (native and REST).")
        signInCodesSent = counter("trunk_sync_signin_codes_sent_total", "Sign-in codes handed to the mailer.")
        mailFailures = counter("trunk_sync_mail_failures_total", "Sign-in mails the mailer failed to send.")
        mailDropped = counter(
            "trunk_sync_mail_dropped_total", "Sign-in mails dropped unsent because the mail queue was full.")
        var limits: [String: Counter] = [:]
        for name in Self.rateLimitNames {
            limits[name] = counter(
                "trunk_sync_rate_limited_total", "Requests refused by a rate limit, by limit.",
                labels: "limit=\"\(name)\"")
        }
        rateLimited = limits
        let answersRefusedHelp =
            "Answers refused with 503 server_busy, by limit: total, the output buffers held as many unread answers as TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT allows; per_client, those of the answer's account (or client address) as many as TRUNK_SYNC_HTTP_MAX_BUFFERED_OUTPUT_PER_CLIENT allows."
        answersRefused = counter(
            "trunk_sync_http_answers_refused_total", answersRefusedHelp, labels: #"limit="total""#)
        answersRefusedPerClient = counter(
            "trunk_sync_http_answers_refused_total", answersRefusedHelp, labels: #"limit="per_client""#)
        let bodiesRefusedHelp =
            "Request bodies refused with 503 server_busy, by limit: total, the bodies being read held as much as TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT allows; per_client, those of the body's account (or client address) as much as TRUNK_SYNC_HTTP_MAX_BUFFERED_INPUT_PER_CLIENT allows."
        bodiesRefused = counter(
            "trunk_sync_http_bodies_refused_total", bodiesRefusedHelp, labels: #"limit="total""#)
        bodiesRefusedPerClient = counter(
            "trunk_sync_http_bodies_refused_total", bodiesRefusedHelp, labels: #"limit="per_client""#)
        counters = register
    }

    /// The counter of refusals by the rate limit `name` (one of `rateLimitNames`).
    public func rateLimited(_ name: String) -> Counter {
        rateLimited[name] ?? rateLimited["otp"] ?? Counter()
    }

    /// The request metrics of a route pattern: the same handle for every method of it.
    public func route(_ pattern: String) -> HTTPRouteMetrics {
        lock.withLock {
            if let existing = routes[pattern] { return existing }
            let created = HTTPRouteMetrics(pattern: pattern)
            routes[pattern] = created
            return created
        }
    }

    /// Requests answered so far on every route, and of those the `5xx` answers: what the
    /// console's overview turns into requests and errors per second. Reads the cells (no
    /// rendering); never on a request's path.
    public func requestTotals() -> (requests: UInt64, serverErrors: UInt64) {
        let routes = lock.withLock { Array(self.routes.values) }
        return routes.reduce(into: (UInt64(0), UInt64(0))) { sum, route in
            let totals = route.totals()
            sum.0 += totals.requests
            sum.1 += totals.serverErrors
        }
    }

    /// Registers a counter (at start-up, like every series) and returns its handle.
    public func counter(_ name: String, help: String, labels: String = "") -> Counter {
        let counter = Counter()
        lock.withLock { counters.append((name, help, labels, counter)) }
        return counter
    }

    /// Registers a gauge read at render time (`labels`: e.g. `loop="0"`, one series each).
    public func gauge(_ name: String, help: String, labels: String = "", _ read: @escaping @Sendable () -> Double) {
        lock.withLock { gauges.append((name, help, labels, read)) }
    }

    /// Everything in the Prometheus text exposition format (version 0.0.4).
    public func render() -> String {
        let (counters, routes, gauges) = lock.withLock { (self.counters, self.routes, self.gauges) }
        var out = ""
        var lastName = ""
        for entry in counters.sorted(by: { ($0.name, $0.labels) < ($1.name, $1.labels) }) {
            if entry.name != lastName {
                out += "# HELP \(entry.name) \(entry.help)\n# TYPE \(entry.name) counter\n"
                lastName = entry.name
            }
            out += "\(entry.name)\(entry.labels.isEmpty ? "" : "{\(entry.labels)}") \(entry.counter.value)\n"
        }
        let sortedRoutes = routes.values.sorted { $0.pattern < $1.pattern }
        out += "# HELP trunk_sync_http_requests_total HTTP requests answered, by method, route and status.\n"
        out += "# TYPE trunk_sync_http_requests_total counter\n"
        for route in sortedRoutes { route.renderCounts(into: &out) }
        out +=
            "# HELP trunk_sync_http_request_duration_seconds Time from a complete request head to its response, by route.\n"
        out += "# TYPE trunk_sync_http_request_duration_seconds histogram\n"
        for route in sortedRoutes { route.renderHistogram(into: &out) }
        lastName = ""
        for gauge in gauges.sorted(by: { ($0.name, $0.labels) < ($1.name, $1.labels) }) {
            if gauge.name != lastName {
                out += "# HELP \(gauge.name) \(gauge.help)\n# TYPE \(gauge.name) gauge\n"
                lastName = gauge.name
            }
            out += "\(gauge.name)\(gauge.labels.isEmpty ? "" : "{\(gauge.labels)}") \(Self.number(gauge.read()))\n"
        }
        return out
    }

    static func number(_ value: Double) -> String {
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }

    static func escapeLabel(_ value: String) -> String {
        var out = ""
        for character in value {
            switch character {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(character)
            }
        }
        return out
    }
}

/// A monotonically increasing count.
public final class Counter: Sendable {
    private let cell = Atomic<UInt64>(0)

    public init() {}

    /// Adds `amount` (relaxed: counters need no ordering).
    public func increment(by amount: Int = 1) {
        guard amount > 0 else { return }
        cell.wrappingAdd(UInt64(amount), ordering: .relaxed)
    }

    /// The current value.
    public var value: UInt64 { cell.load(ordering: .relaxed) }
}

/// The slot of the calling thread among per-loop copies of something (metric cells, request
/// id counters): each event loop of a server writes its own, so two loops never contend for
/// a cache line on a request's path; readers sum them. Loops beyond `count - 1` and every
/// other thread share the last slot (which is why its updates stay atomic).
enum LoopSlot {
    /// Slots: one per online core (the default number of loops, at most 32), and the shared one.
    static let count = min(max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN))), 32) + 1

    /// The calling thread's slot.
    @inline(__always)
    static var current: Int {
        guard let loop = LoopExecutor.current else { return count - 1 }
        return min(loop.index, count - 1)
    }
}

/// The request count by method and status, and the latency histogram, of one route pattern.
/// All cells live in one flat table updated with relaxed atomic adds, one table per
/// `LoopSlot` (each on cache lines of its own), summed when read.
public final class HTTPRouteMetrics: @unchecked Sendable {  // cells are only touched atomically
    /// The route pattern (`/sync/v1/events`), `OPTIONS` or `unmatched`: never a raw path.
    public let pattern: String
    private let cells: UnsafeMutablePointer<UInt64>

    /// Methods with a cell row of their own; any other counts as `other`, so a client
    /// cannot create series.
    static let methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"]
    /// Statuses with a cell of their own; any other counts as `other`.
    static let statuses = [
        100, 101, 200, 201, 202, 204, 206, 301, 302, 304, 307, 308, 400, 401, 403, 404, 405, 406, 408, 409, 410, 411,
        412, 413, 414, 415, 416, 422, 428, 429, 431, 500, 501, 502, 503, 504, 505,
    ]
    /// Upper bounds (seconds) of the latency histogram.
    static let bounds: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
    private static let boundNanoseconds: [UInt64] = bounds.map { UInt64($0 * 1e9) }
    private static let statusSlot: [UInt8] = {
        var slots = [UInt8](repeating: UInt8(statuses.count), count: 600)
        for (index, status) in statuses.enumerated() { slots[status] = UInt8(index) }
        return slots
    }()
    private static let statusSlots = statuses.count + 1
    private static let countCells = methods.count * statusSlots
    /// After the counts: one cell per bucket (not cumulative) and +Inf, the count, the sum in nanoseconds.
    private static let histogramStart = countCells
    private static let cellCount = countCells + bounds.count + 1 + 2
    /// One slot's table, rounded up to whole 64-byte cache lines.
    private static let stride = (cellCount + 7) / 8 * 8

    init(pattern: String) {
        self.pattern = pattern
        cells = UnsafeMutableRawPointer.allocate(byteCount: Self.stride * 8 * LoopSlot.count, alignment: 64)
            .bindMemory(to: UInt64.self, capacity: Self.stride * LoopSlot.count)
        cells.initialize(repeating: 0, count: Self.stride * LoopSlot.count)
    }

    deinit { UnsafeMutableRawPointer(cells).deallocate() }

    /// Counts one answered request.
    public func record(method: HTTPMethod, status: Int, nanoseconds: UInt64) {
        let cells = self.cells + LoopSlot.current * Self.stride
        let row = Self.methodRow(method)
        let slot = status >= 0 && status < 600 ? Int(Self.statusSlot[status]) : Self.statusSlots - 1
        csystem_atomic_add(cells + row * Self.statusSlots + slot, 1)
        let bounds = Self.boundNanoseconds  // one look-up of the global, not one per bucket
        var bucket = 0
        while bucket < bounds.count, nanoseconds > bounds[bucket] { bucket += 1 }
        csystem_atomic_add(cells + Self.histogramStart + bucket, 1)
        csystem_atomic_add(cells + Self.histogramStart + Self.bounds.count + 1, 1)
        csystem_atomic_add(cells + Self.histogramStart + Self.bounds.count + 2, nanoseconds)
    }

    private static func methodRow(_ method: HTTPMethod) -> Int {
        switch method.rawValue {
        case "GET": 0
        case "HEAD": 1
        case "POST": 2
        case "PUT": 3
        case "PATCH": 4
        case "DELETE": 5
        case "OPTIONS": 6
        default: 7
        }
    }

    /// A cell's value summed over the slots.
    private func load(_ index: Int) -> UInt64 {
        var sum: UInt64 = 0
        for slot in 0..<LoopSlot.count { sum &+= csystem_atomic_load(cells + slot * Self.stride + index) }
        return sum
    }

    /// Requests counted, and those answered with a `5xx` status.
    func totals() -> (requests: UInt64, serverErrors: UInt64) {
        var requests: UInt64 = 0
        var serverErrors: UInt64 = 0
        for row in 0..<Self.methods.count {
            for slot in 0..<Self.statusSlots {
                let value = load(row * Self.statusSlots + slot)
                requests += value
                if slot < Self.statuses.count, Self.statuses[slot] >= 500 { serverErrors += value }
            }
        }
        return (requests, serverErrors)
    }

    func renderCounts(into out: inout String) {
        let route = Metrics.escapeLabel(pattern)
        for (row, method) in Self.methods.enumerated() {
            for slot in 0..<Self.statusSlots {
                let value = load(row * Self.statusSlots + slot)
                guard value > 0 else { continue }
                let status = slot < Self.statuses.count ? String(Self.statuses[slot]) : "other"
                out +=
                    "trunk_sync_http_requests_total{method=\"\(method)\",route=\"\(route)\",status=\"\(status)\"} \(value)\n"
            }
        }
    }

    func renderHistogram(into out: inout String) {
        let count = load(Self.histogramStart + Self.bounds.count + 1)
        guard count > 0 else { return }
        let route = Metrics.escapeLabel(pattern)
        var cumulative: UInt64 = 0
        for (index, bound) in Self.bounds.enumerated() {
            cumulative += load(Self.histogramStart + index)
            out +=
                "trunk_sync_http_request_duration_seconds_bucket{route=\"\(route)\",le=\"\(Metrics.number(bound))\"} \(cumulative)\n"
        }
        // Read separately from the buckets: under load the total may be a little ahead.
        cumulative += load(Self.histogramStart + Self.bounds.count)
        out +=
            "trunk_sync_http_request_duration_seconds_bucket{route=\"\(route)\",le=\"+Inf\"} \(max(cumulative, count))\n"
        let seconds = Double(load(Self.histogramStart + Self.bounds.count + 2)) / 1e9
        out += "trunk_sync_http_request_duration_seconds_sum{route=\"\(route)\"} \(seconds)\n"
        out += "trunk_sync_http_request_duration_seconds_count{route=\"\(route)\"} \(max(cumulative, count))\n"
    }
}
