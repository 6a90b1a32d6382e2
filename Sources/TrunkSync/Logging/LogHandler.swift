import Foundation
import HTTPServer
import Logging

/// Writes log records to standard error, one line each, as text or JSON
/// (`TRUNK_SYNC_LOG_FORMAT`). Each line goes out in a single `write(2)`, so lines from
/// several threads never interleave.
public struct TrunkLogHandler: LogHandler {
    /// Installs this handler for every logger of the process (call once, at start).
    public static func bootstrap(level: Logger.Level, format: Configuration.LogFormat) {
        // Lines logged while a request is handled carry its id.
        let requestID = Logger.MetadataProvider {
            RequestContext.requestID.map { ["request_id": .string($0)] } ?? [:]
        }
        LoggingSystem.bootstrap(
            { label, provider in
                var handler = TrunkLogHandler(label: label, format: format)
                handler.logLevel = level
                handler.metadataProvider = provider
                return handler
            }, metadataProvider: requestID)
    }

    /// Adds metadata from the context of each call (the request id).
    public var metadataProvider: Logger.MetadataProvider?

    /// The logger's label (`trunk-sync`, `http`, …).
    public let label: String
    /// Text or JSON.
    public let format: Configuration.LogFormat
    /// Metadata attached to every record of this logger.
    public var metadata: Logger.Metadata = [:]
    /// The least severe level written.
    public var logLevel: Logger.Level = .info

    /// A handler for `label` writing `format`.
    public init(label: String, format: Configuration.LogFormat) {
        self.label = label
        self.format = format
    }

    /// Metadata of this logger by key.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes one record.
    public func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { _, new in new } }
        if let extra = event.metadata { merged.merge(extra) { _, new in new } }
        let line: String
        switch format {
        case .text:
            line = Self.textLine(level: event.level, label: label, message: "\(event.message)", metadata: merged)
        case .json:
            line = Self.jsonLine(level: event.level, label: label, message: "\(event.message)", metadata: merged)
        }
        var bytes = Array(line.utf8)
        bytes.append(UInt8(ascii: "\n"))
        bytes.withUnsafeBytes { buffer in
            guard let base = buffer.baseAddress else { return }
            var offset = 0
            while offset < buffer.count {
                let written = write(STDERR_FILENO, base + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    return
                }
                offset += written
            }
        }
    }

    static func timestamp() -> String {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        var seconds = time_t(time.tv_sec)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
            Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), time.tv_nsec / 1_000_000)
    }

    static func textLine(level: Logger.Level, label: String, message: String, metadata: Logger.Metadata) -> String {
        var line = "\(timestamp()) \(level) \(label): \(message)"
        for key in metadata.keys.sorted() {
            if let value = metadata[key] { line += " \(key)=\(value)" }
        }
        return line
    }

    static func jsonLine(level: Logger.Level, label: String, message: String, metadata: Logger.Metadata) -> String {
        var line =
            "{\"ts\":\"\(timestamp())\",\"level\":\"\(level)\",\"logger\":\(jsonString(label)),\"msg\":\(jsonString(message))"
        for key in metadata.keys.sorted() {
            if let value = metadata[key] { line += ",\(jsonString(key)):\(jsonString("\(value)"))" }
        }
        return line + "}"
    }

    static func jsonString(_ text: String) -> String { JSONText.quote(text) }
}
