import CLibPQ

extension PostgresConnection {
    /// Runs `COPY … FROM STDIN` (`sql`) and sends `data`, rows already encoded in the COPY
    /// format the statement names (text by default); returns the rows the server took.
    /// Bulk loading without a round trip or a parse per row: an import's fast path.
    ///
    /// An error from the server (a bad row, a constraint) is thrown after the copy ends; as
    /// with `query`, it leaves an explicit transaction failed.
    @discardableResult
    public func copyIn(_ sql: String, data: [UInt8]) throws -> Int {
        statementObserver?(sql)
        guard let started = PQexec(handle, sql) else { throw connectionError() }
        guard PQresultStatus(started) == PGRES_COPY_IN else {
            _ = try check(started)  // throws the server's error, if it sent one
            PQclear(started)
            throw PostgresError(kind: .server, message: "not a COPY FROM STDIN statement")
        }
        PQclear(started)
        // Chunks bounded so a large batch never hands libpq one huge buffer at once.
        let chunk = 256 * 1024
        var offset = 0
        var failed = false
        data.withUnsafeBytes { bytes in
            while offset < bytes.count, !failed {
                let count = min(chunk, bytes.count - offset)
                let pointer = bytes.baseAddress?.advanced(by: offset).assumingMemoryBound(to: CChar.self)
                if PQputCopyData(handle, pointer, Int32(count)) != 1 { failed = true }
                offset += count
            }
        }
        if PQputCopyEnd(handle, failed ? "client failed to send data" : nil) != 1 { throw connectionError() }
        var rows = 0
        var firstError: Error? = nil
        while let result = PQgetResult(handle) {
            do {
                rows = try check(result).affectedRows
            } catch {
                if firstError == nil { firstError = error }
            }
        }
        if let firstError { throw firstError }
        if failed { throw connectionError() }
        return rows
    }
}
