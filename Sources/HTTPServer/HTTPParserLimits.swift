/// Size limits the request parser enforces before it buffers or hands on anything.
///
/// Each limit maps to the status the client receives when it is exceeded; see the
/// property docs. The defaults suit a JSON API server.
public struct HTTPParserLimits: Sendable, Hashable {
    /// Longest request line accepted, in bytes, not counting its CRLF.
    /// A longer one fails with `414 request_line_too_long`. Default: 8 KiB (8192).
    public var maxRequestLineLength: Int

    /// Largest header section accepted, in bytes: everything after the request line's CRLF
    /// up to and including the CRLF of the empty line that ends the head.
    /// A larger one fails with `431 header_too_large`. The same limit applies to the trailer
    /// section of a chunked body. Default: 32 KiB (32768).
    public var maxHeaderSectionSize: Int

    /// Most header fields (lines) accepted in one request; more fail with
    /// `431 too_many_headers`. The same limit applies to trailer fields. Default: 100.
    public var maxHeaderCount: Int

    /// Largest request body accepted, in bytes. A larger `Content-Length` fails with
    /// `413 body_too_large` as soon as the head is complete, before any body byte is read;
    /// a chunked body fails as soon as a chunk size would take the total past it.
    /// Default: 10 MiB (10_485_760).
    public var maxBodySize: Int

    /// Longest chunk-size line (size plus extensions) accepted, in bytes, not counting its
    /// CRLF. A longer one fails with `400 chunk_header_too_long`. Default: 4 KiB (4096).
    public var maxChunkHeaderLength: Int

    /// Creates limits; every parameter defaults to the value documented on its property.
    public init(
        maxRequestLineLength: Int = 8192,
        maxHeaderSectionSize: Int = 32768,
        maxHeaderCount: Int = 100,
        maxBodySize: Int = 10 * 1024 * 1024,
        maxChunkHeaderLength: Int = 4096
    ) {
        self.maxRequestLineLength = maxRequestLineLength
        self.maxHeaderSectionSize = maxHeaderSectionSize
        self.maxHeaderCount = maxHeaderCount
        self.maxBodySize = maxBodySize
        self.maxChunkHeaderLength = maxChunkHeaderLength
    }

    /// The default limits (8 KiB request line, 32 KiB / 100 header fields, 10 MiB body,
    /// 4 KiB chunk-size line).
    public static let `default` = HTTPParserLimits()
}
