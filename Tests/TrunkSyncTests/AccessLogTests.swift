import Foundation
import HTTPServer
import Logging
import Synchronization
import TestSupport
import XCTest

@testable import TrunkSync

/// The access log's lines, formatted straight into bytes: the same fields, in the same
/// format, as a `TrunkLogHandler` line would have.
final class AccessLogTests: XCTestCase {
    let user = UUID(uuidString: "0F8FAD5B-D9CB-469F-A165-70867728950E")!
    let epoch = AccessLog.secondPrefix(0)

    func entry(
        method: String = "GET", path: String = "/x", status: Int = 200, nanoseconds: UInt64 = 1_234_567,
        requestID: String = "abc-1", userID: UUID? = nil, client: String = ""
    ) -> AccessLog.Entry {
        AccessLog.Entry(
            method: method, path: path, status: status, nanoseconds: nanoseconds, requestID: requestID, userID: userID,
            client: client)
    }

    func line(_ log: AccessLog, _ entry: AccessLog.Entry, milliseconds: Int = 7, prefix: [UInt8]? = nil) -> String {
        var out: [UInt8] = []
        log.append(entry, milliseconds: milliseconds, prefix: prefix ?? epoch, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    // MARK: - Text

    func testTextLine() {
        let log = AccessLog(format: .text, label: "trunk-sync.http")
        XCTAssertEqual(
            line(log, entry()),
            "1970-01-01T00:00:00.007Z info trunk-sync.http: request duration_ms=1.23 method=GET path=/x request_id=abc-1 status=200\n"
        )
        XCTAssertEqual(
            line(
                log, entry(method: "POST", path: "/sync/v1/events", status: 201, nanoseconds: 0, userID: user),
                milliseconds: 999),
            "1970-01-01T00:00:00.999Z info trunk-sync.http: request duration_ms=0.00 method=POST path=/sync/v1/events request_id=abc-1 status=201 user_id=0f8fad5b-d9cb-469f-a165-70867728950e\n"
        )
    }

    func testTextLineMatchesTheLogHandlersLine() {
        let log = AccessLog(format: .text, label: "trunk-sync.http")
        let accessLine = line(log, entry(status: 404, userID: user))
        let handlerLine = TrunkLogHandler.textLine(
            level: .info, label: "trunk-sync.http", message: "request",
            metadata: [
                "duration_ms": "1.23", "method": "GET", "path": "/x", "request_id": "abc-1", "status": "404",
                "user_id": "0f8fad5b-d9cb-469f-a165-70867728950e",
            ])
        // Everything after the timestamp is the same.
        XCTAssertEqual(accessLine.drop { $0 != " " }, (handlerLine + "\n").drop { $0 != " " })
    }

    func testTextLineWithTheClientAddressMatchesTheLogHandlersLine() {
        let log = AccessLog(format: .text, label: "trunk-sync.http")
        for client in ["192.0.2.1", "2001:db8::7"] {
            let accessLine = line(log, entry(client: client))
            XCTAssertTrue(accessLine.contains(": request client=\(client) duration_ms=1.23 "), accessLine)
            let handlerLine = TrunkLogHandler.textLine(
                level: .info, label: "trunk-sync.http", message: "request",
                metadata: [
                    "client": "\(client)", "duration_ms": "1.23", "method": "GET", "path": "/x", "request_id": "abc-1",
                    "status": "200",
                ])
            XCTAssertEqual(accessLine.drop { $0 != " " }, (handlerLine + "\n").drop { $0 != " " })
        }
    }

    // MARK: - JSON

    func testJSONLineWithTheClientAddressMatchesTheLogHandlersLine() throws {
        let log = AccessLog(format: .json, label: "trunk-sync.http")
        let accessLine = line(log, entry(userID: user, client: "2001:db8::7"))
        let handlerLine = TrunkLogHandler.jsonLine(
            level: .info, label: "trunk-sync.http", message: "request",
            metadata: [
                "client": "2001:db8::7", "duration_ms": "1.23", "method": "GET", "path": "/x", "request_id": "abc-1",
                "status": "200", "user_id": "0f8fad5b-d9cb-469f-a165-70867728950e",
            ])
        guard case .object(var access) = try TestJSON(parsing: Array(accessLine.utf8)),
            case .object(var handler) = try TestJSON(parsing: Array(handlerLine.utf8))
        else { return XCTFail("not objects") }
        XCTAssertNotNil(access.removeValue(forKey: "ts"))
        XCTAssertNotNil(handler.removeValue(forKey: "ts"))
        XCTAssertEqual(access, handler)
    }

    func testJSONLine() throws {
        let log = AccessLog(format: .json, label: "trunk-sync.http")
        let text = line(log, entry(userID: user), milliseconds: 42, prefix: AccessLog.secondPrefix(1_700_000_000))
        XCTAssertTrue(text.hasSuffix("}\n"))
        XCTAssertEqual(text.filter { $0 == "\n" }.count, 1)
        XCTAssertEqual(
            try TestJSON(parsing: Array(text.utf8)),
            try TestJSON(
                parsing: Array(
                    #"""
                    {"ts":"2023-11-14T22:13:20.042Z","level":"info","logger":"trunk-sync.http","msg":"request",
                     "duration_ms":"1.23","method":"GET","path":"/x","request_id":"abc-1","status":"200",
                     "user_id":"0f8fad5b-d9cb-469f-a165-70867728950e"}
                    """#.utf8)))
        // Without a user: no user_id member at all.
        let anonymous = try TestJSON(parsing: Array(line(log, entry()).utf8))
        guard case .object(let members) = anonymous else { return XCTFail("not an object") }
        XCTAssertEqual(
            Set(members.keys),
            ["ts", "level", "logger", "msg", "duration_ms", "method", "path", "request_id", "status"])
    }

    func testJSONLineMatchesTheLogHandlersLine() throws {
        let log = AccessLog(format: .json, label: "trunk-sync.http")
        let accessLine = line(log, entry(status: 503, userID: user))
        let handlerLine = TrunkLogHandler.jsonLine(
            level: .info, label: "trunk-sync.http", message: "request",
            metadata: [
                "duration_ms": "1.23", "method": "GET", "path": "/x", "request_id": "abc-1", "status": "503",
                "user_id": "0f8fad5b-d9cb-469f-a165-70867728950e",
            ])
        guard case .object(var access) = try TestJSON(parsing: Array(accessLine.utf8)),
            case .object(var handler) = try TestJSON(parsing: Array(handlerLine.utf8))
        else { return XCTFail("not objects") }
        XCTAssertNotNil(access.removeValue(forKey: "ts"))
        XCTAssertNotNil(handler.removeValue(forKey: "ts"))
        XCTAssertEqual(access, handler)
    }

    func testJSONLineEscapesPathAndLabel() throws {
        let log = AccessLog(format: .json, label: "odd \"label\"")
        let path = "/a\"b\\c\u{1}d\u{E9}"
        let text = line(log, entry(method: "M\"X", path: path))
        guard case .object(let members) = try TestJSON(parsing: Array(text.utf8)) else {
            return XCTFail("not a JSON object: \(text)")
        }
        XCTAssertEqual(members["path"], .string(path))
        XCTAssertEqual(members["logger"], .string("odd \"label\""))
        XCTAssertEqual(members["method"], .string("M\"X"))
        XCTAssertTrue(text.contains(#""path":"/a\"b\\c\u0001d\#u{E9}""#), text)
    }

    func testLongPathsAndMethodsAreCutSoALineStaysUnderAPipesBatch() throws {
        let path = "/" + String(repeating: "a", count: 8 * 1024)
        let method = String(repeating: "M", count: 4 * 1024)
        for format in [Configuration.LogFormat.text, .json] {
            var fds: [Int32] = [0, 0]
            XCTAssertEqual(pipe(&fds), 0)
            defer { close(fds[0]); close(fds[1]) }
            let log = AccessLog(format: format, output: fds[1])
            let text = line(log, entry(method: method, path: path, userID: user, client: "2001:db8::1"))
            XCTAssertLessThan(text.utf8.count, log.batchLimit / 2, "\(format)")
            XCTAssertTrue(text.contains(String(path.prefix(1024)) + "…"), "\(format)")
            XCTAssertFalse(text.contains(String(path.prefix(1025))), "\(format)")
            XCTAssertTrue(text.contains(String(repeating: "M", count: 32) + "…"), "\(format)")
        }
        // Up to the limit, as it is.
        let fits = "/" + String(repeating: "b", count: 1023)
        XCTAssertTrue(line(AccessLog(format: .text), entry(path: fits)).contains("path=\(fits) "))
    }

    // MARK: - Batches

    /// A temporary file's descriptor, closed and removed at the end of the test.
    func temporaryFile() throws -> (fd: Int32, path: String) {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("access-\(UUID().uuidString).log").path
        let fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        XCTAssertGreaterThanOrEqual(fd, 0)
        addTeardownBlock {
            close(fd)
            unlink(path)
        }
        return (fd, path)
    }

    func lines(in path: String) -> [String] {
        let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        return text.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init)
    }

    func testBatchesStayUnderPipeBufToAPipeAndGrowToAFile() throws {
        var fds: [Int32] = [0, 0]
        XCTAssertEqual(pipe(&fds), 0)
        defer { close(fds[0]); close(fds[1]) }
        XCTAssertEqual(AccessLog(format: .text, output: fds[1]).batchLimit, 3 * 1024)
        XCTAssertLessThanOrEqual(AccessLog(format: .text, output: fds[1]).batchLimit, Int(PIPE_BUF))
        XCTAssertEqual(AccessLog(format: .text, output: try temporaryFile().fd).batchLimit, 32 * 1024)
    }

    func testLinesWaitForAFlushUntilABatchIsFullThenGoOutInWholeLines() throws {
        var fds: [Int32] = [0, 0]
        XCTAssertEqual(pipe(&fds), 0)
        defer { close(fds[0]); close(fds[1]) }
        XCTAssertEqual(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0)
        func drain() -> String {
            var out: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = read(fds[0], &chunk, chunk.count)
                guard count > 0 else { return String(decoding: out, as: UTF8.self) }
                out.append(contentsOf: chunk[..<count])
            }
        }
        let log = AccessLog(format: .text, output: fds[1])
        log.record(entry(requestID: "r-0"))
        XCTAssertEqual(drain(), "", "one line waits for the loop (or a flush)")
        var written = ""
        var recorded = 1
        while written.isEmpty {
            log.record(entry(requestID: "r-\(recorded)"))
            recorded += 1
            written = drain()
            XCTAssertLessThan(recorded, 100, "a batch of 3 KiB holds about 25 lines")
        }
        XCTAssertLessThanOrEqual(written.utf8.count, log.batchLimit)
        XCTAssertTrue(written.hasSuffix("\n"), "only whole lines")
        log.flush()
        let all = (written + drain()).split(separator: "\n")
        XCTAssertEqual(
            all.map { $0.split(separator: " ").first { $0.hasPrefix("request_id=") } },
            (0..<recorded).map { "request_id=r-\($0)" })
        log.flush()
        XCTAssertEqual(drain(), "", "nothing is written twice")
    }

    /// A responder whose loops record lines when told and write them when they wait.
    struct LoggingResponder: HTTPResponder {
        let log: AccessLog
        func admit(_ head: HTTPRequestHead, client: String) -> Admission<Int> {
            .answer(HTTPResponse(status: .notFound), 0)
        }
        func respond(to request: HTTPRequest, context: Int) -> Reply<Int> { .now(HTTPResponse(status: .notFound), 0) }
        func complete(_ response: inout HTTPResponse, context: Int) {}
        func reject(_ error: HTTPParserError, peer: String) -> HTTPResponse { HTTPResponse(status: .badRequest) }
        func refuseConnection() -> HTTPResponse { HTTPResponse(status: .serviceUnavailable) }
        func loopWillWait() -> Int32? { log.loopWillWait() }
        func loopDidStop() { log.loopDidStop() }

        /// A started server on a free port with `loops` loops answering through `log`.
        static func server(log: AccessLog, loops: Int) throws -> HTTPServer<LoggingResponder> {
            var configuration = HTTPServerConfiguration()
            configuration.port = 0
            configuration.loops = loops
            let server = HTTPServer(
                configuration: configuration, responder: LoggingResponder(log: log), logger: Logger(label: "test"))
            try server.start()
            return server
        }
    }

    /// A clock the test sets (the loop reads it too).
    final class SetClock: Sendable {
        let time = Mutex(timespec(tv_sec: 1_800_000_000, tv_nsec: 0))
        func now() -> timespec { time.withLock { $0 } }
        func advance(milliseconds: Int) {
            time.withLock { time in
                let total = time.tv_nsec + milliseconds * 1_000_000
                time = timespec(tv_sec: time.tv_sec + total / 1_000_000_000, tv_nsec: total % 1_000_000_000)
            }
        }
    }

    func testALoopHoldsItsLinesUntilTheOldestHasLingeredThenWritesThemTogether() async throws {
        let file = try temporaryFile()
        let clock = SetClock()
        let log = AccessLog(format: .text, output: file.fd, linger: 10_000_000, clock: { clock.now() })
        let server = try LoggingResponder.server(log: log, loops: 1)
        let loop = server.executors[0]
        let onLoop = { (work: @escaping @Sendable () -> Int32?) async -> Int32? in
            await Task(executorPreference: loop) { work() }.value
        }
        let first = entry(requestID: "first"), second = entry(requestID: "second")
        var due = await onLoop {
            log.record(first)
            return log.loopWillWait()
        }
        XCTAssertEqual(due, 10, "due in the linger: the loop sleeps no longer")
        clock.advance(milliseconds: 4)
        due = await onLoop {
            log.record(second)
            return log.loopWillWait()
        }
        XCTAssertEqual(due, 6, "the oldest line sets when the buffer is due")
        // The loop's own waits read the same clock: nothing has been written.
        XCTAssertEqual(lines(in: file.path), [])
        clock.advance(milliseconds: 6)
        due = await onLoop { log.loopWillWait() }
        XCTAssertNil(due, "nothing left to hold")
        XCTAssertEqual(
            lines(in: file.path).compactMap { $0.split(separator: " ").first { $0.hasPrefix("request_id=") } },
            ["request_id=first", "request_id=second"])
        // A clock set back does not hold a line for longer.
        let third = entry(requestID: "third")
        _ = await onLoop {
            log.record(third)
            return nil
        }
        clock.time.withLock { $0.tv_sec -= 60 }
        due = await onLoop { log.loopWillWait() }
        XCTAssertNil(due)
        XCTAssertEqual(lines(in: file.path).count, 3)
        server.shutdown()
        await server.waitUntilStopped()
    }

    func testEachLoopWritesItsLinesWhenItWaitsAndWhatIsLeftWhenItStops() async throws {
        let file = try temporaryFile()
        let log = AccessLog(format: .text, output: file.fd)
        let server = try LoggingResponder.server(log: log, loops: 2)
        // A line recorded on each loop's thread (into that loop's own buffer) is written
        // when that loop next waits: nothing else flushes it.
        for executor in server.executors {
            let line = entry(requestID: "loop-\(executor.index)")
            await Task(executorPreference: executor) {
                XCTAssertEqual(LoopExecutor.current?.index, executor.index)
                log.record(line)
            }.value
        }
        let deadline = Date().addingTimeInterval(30)
        while lines(in: file.path).count < 2, Date() < deadline { try await Task.sleep(for: .milliseconds(10)) }
        XCTAssertEqual(
            Set(lines(in: file.path).compactMap { $0.split(separator: " ").first { $0.hasPrefix("request_id=") } }),
            ["request_id=loop-0", "request_id=loop-1"])
        // Lines recorded right before the loops stop are written before they have stopped.
        for executor in server.executors {
            let line = entry(requestID: "last-\(executor.index)")
            let last = executor === server.executors.last
            await Task(executorPreference: executor) {
                log.record(line)
                if last { server.shutdown() }
            }.value
        }
        await server.waitUntilStopped()
        XCTAssertEqual(lines(in: file.path).count, 4)
        XCTAssertEqual(lines(in: file.path).filter { $0.contains("request_id=last-") }.count, 2)
    }

    func testLinesFromOtherThreadsAreWrittenByTheNextLoopThatWaits() async throws {
        let file = try temporaryFile()
        let log = AccessLog(format: .text, output: file.fd)
        log.record(entry(requestID: "elsewhere"))  // the test's thread: no loop
        XCTAssertEqual(lines(in: file.path), [])
        let server = try LoggingResponder.server(log: log, loops: 1)
        let deadline = Date().addingTimeInterval(30)
        while lines(in: file.path).isEmpty, Date() < deadline { try await Task.sleep(for: .milliseconds(10)) }
        XCTAssertEqual(lines(in: file.path).count, 1)
        XCTAssertTrue(lines(in: file.path)[0].contains("request_id=elsewhere"))
        server.shutdown()
        await server.waitUntilStopped()
    }

    // MARK: - Numbers and time

    func testDurationInHundredthsOfAMillisecond() {
        let log = AccessLog(format: .text, label: "l")
        func duration(_ nanoseconds: UInt64) -> Substring? {
            let text = line(log, entry(nanoseconds: nanoseconds))
            return text.split(separator: " ").first { $0.hasPrefix("duration_ms=") }?.dropFirst("duration_ms=".count)
        }
        XCTAssertEqual(duration(0), "0.00")
        XCTAssertEqual(duration(9_999), "0.00")  // truncated, not rounded
        XCTAssertEqual(duration(10_000), "0.01")
        XCTAssertEqual(duration(1_000_000), "1.00")
        XCTAssertEqual(duration(1_234_567), "1.23")
        XCTAssertEqual(duration(123_456_789_000), "123456.78")
    }

    func testAppendPadded() {
        func padded(_ value: Int, _ width: Int) -> String {
            var out: [UInt8] = []
            AccessLog.appendPadded(value, width: width, to: &out)
            return String(decoding: out, as: UTF8.self)
        }
        XCTAssertEqual(padded(0, 1), "0")
        XCTAssertEqual(padded(0, 3), "000")
        XCTAssertEqual(padded(5, 1), "5")
        XCTAssertEqual(padded(5, 2), "05")
        XCTAssertEqual(padded(7, 3), "007")
        XCTAssertEqual(padded(10, 1), "10")
        XCTAssertEqual(padded(99, 2), "99")
        XCTAssertEqual(padded(100, 2), "100")
        XCTAssertEqual(padded(1234, 0), "1234")
        XCTAssertEqual(padded(1234, 2), "1234")
        XCTAssertEqual(padded(1234, 4), "1234")
        XCTAssertEqual(padded(1234, 6), "001234")
        XCTAssertEqual(padded(-5, 2), "00")  // negatives are clamped to zero
        XCTAssertEqual(padded(Int.max, 1), String(Int.max))
        XCTAssertEqual(padded(999_999_999_999_999_999, 1), "999999999999999999")
        XCTAssertEqual(padded(1_000_000_000_000_000_000, 1), "1000000000000000000")
        // Appends after what is there.
        var out = Array("x=".utf8)
        AccessLog.appendPadded(42, width: 3, to: &out)
        XCTAssertEqual(String(decoding: out, as: UTF8.self), "x=042")
    }

    func testAppendHundredths() {
        func hundredths(_ value: UInt64) -> String {
            var out: [UInt8] = []
            AccessLog.appendHundredths(value, to: &out)
            return String(decoding: out, as: UTF8.self)
        }
        XCTAssertEqual(hundredths(0), "0.00")
        XCTAssertEqual(hundredths(5), "0.05")
        XCTAssertEqual(hundredths(50), "0.50")
        XCTAssertEqual(hundredths(99), "0.99")
        XCTAssertEqual(hundredths(100), "1.00")
        XCTAssertEqual(hundredths(1234), "12.34")
        XCTAssertEqual(hundredths(123_456), "1234.56")
    }

    func testSecondPrefix() {
        func prefix(_ second: Int) -> String { String(decoding: AccessLog.secondPrefix(second), as: UTF8.self) }
        XCTAssertEqual(prefix(0), "1970-01-01T00:00:00.")
        XCTAssertEqual(prefix(1_700_000_000), "2023-11-14T22:13:20.")
        XCTAssertEqual(prefix(951_782_400), "2000-02-29T00:00:00.")
        XCTAssertEqual(prefix(4_102_444_799), "2099-12-31T23:59:59.")
    }

    // MARK: - Batching (standard error redirected to a file)

    /// Standard error by default; to a regular file in batches of up to 32 KiB (to a pipe,
    /// under `PIPE_BUF`: `testLinesWaitForAFlushUntilABatchIsFullThenGoOutInWholeLines`).
    func testRecordBatchesWholeLinesToStandardErrorUntilFlushed() throws {
        let file = NSTemporaryDirectory() + "access-log-\(UUID().uuidString).txt"
        defer { try? FileManager.default.removeItem(atPath: file) }
        let fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        XCTAssertGreaterThanOrEqual(fd, 0)
        let saved = dup(STDERR_FILENO)
        XCTAssertEqual(dup2(fd, STDERR_FILENO), STDERR_FILENO)
        close(fd)
        var restored = false
        func restore() {
            guard !restored else { return }
            restored = true
            dup2(saved, STDERR_FILENO)
            close(saved)
        }
        defer { restore() }

        let log = AccessLog(format: .json, label: "trunk-sync.http")
        func written() throws -> [UInt8] { Array(try Data(contentsOf: URL(fileURLWithPath: file))) }
        var sizes: [Int] = []
        var lastSize = 0
        let count = 200
        for index in 0..<count {
            log.record(entry(path: "/sync/v1/events/\(index)", requestID: "req-\(index)", userID: user))
            let bytes = try written()
            if bytes.count != lastSize {
                sizes.append(bytes.count - lastSize)
                XCTAssertEqual(bytes.last, UInt8(ascii: "\n"), "a batch ends with a whole line")
                lastSize = bytes.count
            }
        }
        let beforeFlush = try written()
        log.flush()
        log.flush()  // nothing left: writes nothing
        let all = try written()
        restore()

        XCTAssertFalse(sizes.isEmpty, "batches are written before the flush once they near the limit")
        XCTAssertEqual(log.batchLimit, 32 * 1024, "standard error is a regular file here")
        for size in sizes {
            XCTAssertLessThanOrEqual(size, log.batchLimit, "a batch stays under the limit")
            XCTAssertGreaterThan(size, log.batchLimit - 1024, "lines are batched, not written one by one")
        }
        XCTAssertLessThan(beforeFlush.count, all.count, "the rest waits for the flush")
        let lines = all.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).dropLast()
        XCTAssertEqual(lines.count, count)
        for (index, line) in lines.enumerated() {
            guard case .object(let members) = try TestJSON(parsing: Array(line)) else {
                return XCTFail("line \(index)")
            }
            XCTAssertEqual(members["request_id"], .string("req-\(index)"), "lines keep their order")
            XCTAssertEqual(members["path"], .string("/sync/v1/events/\(index)"))
        }
    }
}
