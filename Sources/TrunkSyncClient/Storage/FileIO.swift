import Foundation

#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Android)
    import Android
#endif

/// A failed file operation: what, on which path, and `errno`'s text.
struct StorageFailure: Error, CustomStringConvertible {
    var description: String

    init(_ operation: String, _ path: String, errno code: Int32 = errno) {
        description = "\(operation) \(path): \(String(cString: strerror(code))) (errno \(code))"
    }

    init(message: String) { description = message }
}

/// The few POSIX calls durable storage needs, which Foundation does not offer in a form that
/// says when bytes are on disk: positioned writes, `fsync` (`F_FULLFSYNC` on Apple
/// platforms, where `fsync` only reaches the drive's cache), `ftruncate`, `flock`, and
/// syncing a directory after a rename.
///
/// Used only from the client actor (or before it exists), never concurrently.
final class DurableFile {
    let path: String
    private var descriptor: Int32

    /// Opens (and with `create`, creates with mode 0600) `path` for reading and writing.
    init(path: String, create: Bool = true) throws {
        self.path = path
        let flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0)
        descriptor = open(path, flags, 0o600)
        if descriptor < 0 { throw StorageFailure("open", path) }
    }

    deinit { close() }

    func close() {
        if descriptor >= 0 {
            _ = closeDescriptor(descriptor)
            descriptor = -1
        }
    }

    /// The file's size in bytes.
    func size() throws -> Int {
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { throw StorageFailure("fstat", path) }
        return Int(info.st_size)
    }

    /// The whole file.
    func readAll() throws -> [UInt8] {
        try read(at: 0, count: try size())
    }

    /// `count` bytes from `offset` (fewer only at the end of the file).
    func read(at offset: Int, count: Int) throws -> [UInt8] {
        guard count > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let result = bytes.withUnsafeMutableBytes { buffer in
                pread(descriptor, buffer.baseAddress! + done, count - done, off_t(offset + done))
            }
            if result < 0 {
                if errno == EINTR { continue }
                throw StorageFailure("read", path)
            }
            if result == 0 { break }
            done += result
        }
        return done == count ? bytes : Array(bytes[0..<done])
    }

    /// Writes all of `bytes` at `offset` (not yet durable: see `sync`).
    func write(_ bytes: [UInt8], at offset: Int) throws {
        var done = 0
        while done < bytes.count {
            let result = bytes.withUnsafeBytes { buffer in
                pwrite(descriptor, buffer.baseAddress! + done, bytes.count - done, off_t(offset + done))
            }
            if result < 0 {
                if errno == EINTR { continue }
                throw StorageFailure("write", path)
            }
            done += result
        }
    }

    /// Makes everything written so far durable.
    func sync() throws {
        #if canImport(Darwin)
            // fsync only hands the data to the drive, which may keep it in a volatile cache.
            if fcntl(descriptor, F_FULLFSYNC) == 0 { return }
        #endif
        while fsync(descriptor) != 0 {
            if errno != EINTR { throw StorageFailure("fsync", path) }
        }
    }

    /// Cuts the file to `length` bytes.
    func truncate(to length: Int) throws {
        guard ftruncate(descriptor, off_t(length)) == 0 else { throw StorageFailure("ftruncate", path) }
    }

    /// Takes an exclusive advisory lock without waiting; false when another open file
    /// description (another process, or another client in this one) holds it.
    func tryLock() throws -> Bool {
        if flock(descriptor, LOCK_EX | LOCK_NB) == 0 { return true }
        if errno == EWOULDBLOCK { return false }
        throw StorageFailure("flock", path)
    }
}

private func closeDescriptor(_ descriptor: Int32) -> Int32 { close(descriptor) }
private func renameFile(_ source: String, _ destination: String) -> Int32 { rename(source, destination) }

enum FileSystem {
    /// Creates `directory` (and its missing parents) and makes each new entry durable: the
    /// parent of every directory it created is synced, from the innermost out, so a crash
    /// right after cannot lose a folder the client went on to write in (`users/<id>/` made
    /// with `users/`: both `users/` and the server's folder are synced). `sync` is
    /// `syncDirectory` but in tests.
    static func createDirectory(_ directory: URL, sync: (URL) throws -> Void = syncDirectory) throws {
        var missing: [URL] = []
        var next = directory.standardizedFileURL
        while !isDirectory(next) {
            missing.append(next)
            let parent = next.deletingLastPathComponent()
            if parent.path == next.path { break }  // the root
            next = parent
        }
        guard !missing.isEmpty else { return }
        do {
            try FileManager.default.createDirectory(
                at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw StorageFailure(message: "cannot create \(directory.path): \(error)")
        }
        for created in missing { try sync(created.deletingLastPathComponent()) }
    }

    private static func isDirectory(_ url: URL) -> Bool {
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory) && isDirectory.boolValue
    }

    /// `fsync` on a directory, so a new, renamed or removed entry in it survives a crash.
    static func syncDirectory(_ directory: URL) throws {
        let descriptor = open(directory.path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw StorageFailure("open", directory.path) }
        defer { _ = closeDescriptor(descriptor) }
        #if canImport(Darwin)
            if fcntl(descriptor, F_FULLFSYNC) == 0 { return }
        #endif
        // Some file systems refuse fsync on directories (EINVAL); there is nothing more to do.
        if fsync(descriptor) != 0 && errno != EINVAL && errno != EBADF {
            throw StorageFailure("fsync", directory.path)
        }
    }

    /// Replaces `url` with `bytes` atomically and durably: a temporary file beside it is
    /// written and synced, renamed over it, and the directory synced. A crash leaves either
    /// the old or the new content, never a mix.
    static func writeAtomically(_ bytes: [UInt8], to url: URL) throws {
        try writeAtomically(to: url) { append in try append(bytes) }
    }

    /// How much the streaming `writeAtomically` gathers before it writes.
    static let writeStep = 1024 * 1024

    /// `writeAtomically` for content too large to hold at once: `produce` hands it over
    /// piece by piece to `append`, which writes in steps of about `writeStep` bytes.
    static func writeAtomically(to url: URL, _ produce: (_ append: ([UInt8]) throws -> Void) throws -> Void) throws {
        let temporary = url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).tmp")
        _ = unlink(temporary.path)
        let file = try DurableFile(path: temporary.path)
        do {
            try file.truncate(to: 0)
            var pending: [UInt8] = []
            var written = 0
            func flush() throws {
                try file.write(pending, at: written)
                written += pending.count
                pending.removeAll(keepingCapacity: true)
            }
            try produce { bytes in
                pending += bytes
                if pending.count >= writeStep { try flush() }
            }
            try flush()
            try file.sync()
            file.close()
        } catch {
            file.close()
            _ = unlink(temporary.path)
            throw error
        }
        do {
            try rename(temporary, over: url)
        } catch {
            _ = unlink(temporary.path)  // e.g. a directory at `url`: nothing left behind
            throw error
        }
    }

    /// Renames `source` over `destination` (atomic replace) and syncs the directory.
    static func rename(_ source: URL, over destination: URL) throws {
        guard renameFile(source.path, destination.path) == 0 else {
            throw StorageFailure("rename to \(destination.lastPathComponent)", source.path)
        }
        try syncDirectory(destination.deletingLastPathComponent())
    }

    /// Puts the file at `source` in the place of `destination` in one step, durably: a rename,
    /// or, from another volume, a copy beside `destination` renamed over it. A crash leaves the
    /// old file or the new one. A directory at `destination` is refused, never replaced.
    static func replace(_ destination: URL, withFileAt source: URL) throws {
        if renameFile(source.path, destination.path) == 0 {
            try syncDirectory(destination.deletingLastPathComponent())
            return
        }
        guard errno == EXDEV else { throw StorageFailure("rename to \(destination.path)", source.path) }
        let file = try DurableFile(path: source.path, create: false)
        defer { file.close() }
        let size = try file.size()
        try writeAtomically(to: destination) { append in
            for start in stride(from: 0, to: size, by: writeStep) {
                try append(try file.read(at: start, count: min(writeStep, size - start)))
            }
        }
    }

    /// The file's bytes, or nil when it does not exist.
    static func read(_ url: URL) throws -> [UInt8]? {
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        let file = try DurableFile(path: url.path, create: false)
        defer { file.close() }
        return try file.readAll()
    }

    /// Removes a file or directory tree if present, and syncs its parent.
    static func remove(_ url: URL) throws {
        guard FileManager.default.fileExists(atPath: url.path) else { return }
        do {
            try FileManager.default.removeItem(at: url)
        } catch {
            throw StorageFailure(message: "cannot remove \(url.path): \(error)")
        }
        try syncDirectory(url.deletingLastPathComponent())
    }
}
