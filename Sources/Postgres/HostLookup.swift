import CSystem
import Foundation
import Synchronization

/// Looks up the database's host *names* before a connection is opened on an event loop, on
/// a thread of their own, so that no loop waits for the resolver.
///
/// libpq resolves a host name with `getaddrinfo` inside `PQconnectStartParams`, which
/// blocks: on a loop, every request it serves would wait as long as the resolver takes (a
/// slow or unreachable DNS server: seconds). Instead, the opening asks this lookup first
/// and hands libpq the addresses as `hostaddr`, keeping `host` for what libpq uses it for
/// besides connecting (TLS's `verify-full`, `.pgpass`, messages). Each address of a name
/// becomes an entry of libpq's host list, tried in order as libpq tries a name's addresses.
///
/// Nothing changes when there is no name to look up: `hostaddr` given (or `PGHOSTADDR`), a
/// Unix socket (`host` empty or a path), only IP addresses, or a `port` list libpq would
/// refuse (neither one port nor one per host: its error stands). Names are looked up at
/// every opening, as libpq did (a database that moved is found again); a list's names are
/// looked up at the same time, and openings that ask for the same name at the same time
/// share one look-up. As libpq skips a host it cannot resolve and tries the next, a name
/// without an address is left out of the list; the opening fails only when no entry is left.
public final class HostLookup: Sendable {
    /// Turns a name into its addresses (numeric text), blocking; throws with the reason.
    let resolve: @Sendable (String) throws -> [String]
    /// The look-ups running, by name, with the openings waiting for each.
    private let running = Mutex<[String: [CheckedContinuation<[String], any Error>]]>([:])

    /// A lookup with `resolve` instead of the system's resolver (tests: a resolver that
    /// waits until told, or fails).
    public init(_ resolve: @escaping @Sendable (String) throws -> [String]) {
        self.resolve = resolve
    }

    /// The system's resolver (`getaddrinfo`, as libpq calls it).
    public static let system = HostLookup { name in
        var addresses = [CChar](repeating: 0, count: 2048)
        var reason = [CChar](repeating: 0, count: 256)
        let count = csystem_resolve(name, &addresses, addresses.count, &reason, reason.count)
        guard count > 0 else { throw LookupFailure(reason: text(reason)) }
        return text(addresses).split(separator: ",").map(String.init)
    }

    /// The text of a NUL-terminated C string in `buffer`.
    private static func text(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Why a name has no address.
    struct LookupFailure: Error, CustomStringConvertible {
        let reason: String
        var description: String { reason }
    }

    /// `configuration` with its host names' addresses as `hostaddr`, or unchanged when
    /// there is nothing to look up. Waits without blocking the caller's thread.
    /// - Throws: `.connectionFailed` in libpq's words (`could not translate host name "db"
    ///   to address: …`, the list's first such name) when no entry of the host list has an
    ///   address, or no thread can be started to look.
    func resolving(_ configuration: PostgresConfiguration) async throws -> PostgresConfiguration {
        guard let hosts = Self.hostsToLookUp(configuration) else { return configuration }
        var names: [String] = []
        for host in hosts where !Self.isAddress(host) && !names.contains(host) { names.append(host) }
        var addresses: [String: [String]] = [:]
        var failures: [String: String] = [:]
        await withTaskGroup(of: (String, Result<[String], any Error>).self) { group in
            for name in names {
                group.addTask {
                    do { return (name, .success(try await self.lookUp(name))) } catch { return (name, .failure(error)) }
                }
            }
            for await (name, result) in group {
                switch result {
                case .success(let found): addresses[name] = found
                case .failure(let error): failures[name] = "\(error)"
                }
            }
        }
        guard hosts.contains(where: { Self.isAddress($0) || addresses[$0] != nil }) else {
            let name = hosts.first { failures[$0] != nil } ?? hosts[0]
            throw PostgresConnection.openingError(
                reason: "could not translate host name \"\(name)\" to address: \(failures[name] ?? "no address")",
                configuration)
        }
        return Self.expanded(configuration, hosts: hosts, addresses: addresses)
    }

    /// The entries of `host` when at least one is a name libpq would look up; nil when
    /// there is nothing to do (see the type's notes). `environment`: the process's, where
    /// libpq finds `PGHOSTADDR`.
    static func hostsToLookUp(
        _ configuration: PostgresConfiguration, environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> [String]? {
        guard configuration["hostaddr"]?.isEmpty ?? (environment["PGHOSTADDR"]?.isEmpty ?? true),
            let host = configuration["host"], !host.isEmpty
        else { return nil }
        let hosts = host.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        // A Unix socket (a path, or Linux's abstract namespace) or an empty entry: leave the
        // list to libpq as it is (no host list mixes them in practice).
        guard hosts.allSatisfy({ !$0.isEmpty && !$0.hasPrefix("/") && !$0.hasPrefix("@") }),
            hosts.contains(where: { !isAddress($0) })
        else { return nil }
        // Ports neither one for all nor one per host: libpq refuses the list, in its words.
        if let ports = configuration["port"]?.split(separator: ",", omittingEmptySubsequences: false),
            ports.count > 1, ports.count != hosts.count
        {
            return nil
        }
        return hosts
    }

    /// Whether `host` is an IPv4 or IPv6 address (nothing to look up).
    static func isAddress(_ host: String) -> Bool {
        var buffer = in6_addr()
        return host.withCString { inet_pton(AF_INET, $0, &buffer) == 1 || inet_pton(AF_INET6, $0, &buffer) == 1 }
    }

    /// The configuration with one host-list entry per address: `host` repeats each name once
    /// per address, `hostaddr` lists them, and a per-host `port` list follows the hosts. A
    /// name without addresses is left out (with its port), as libpq skips it.
    static func expanded(
        _ configuration: PostgresConfiguration, hosts: [String], addresses: [String: [String]]
    ) -> PostgresConfiguration {
        let ports = configuration["port"].map {
            $0.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        }
        var hostList: [String] = []
        var addressList: [String] = []
        var portList: [String] = []
        for (index, host) in hosts.enumerated() {
            var seen = Set<String>()
            for address in isAddress(host) ? [host] : addresses[host] ?? [] where seen.insert(address).inserted {
                hostList.append(host)
                addressList.append(address)
                if let ports, ports.count > 1, ports.count == hosts.count { portList.append(ports[index]) }
            }
        }
        var copy = configuration
        copy.setParameter("host", hostList.joined(separator: ","))
        copy.setParameter("hostaddr", addressList.joined(separator: ","))
        if !portList.isEmpty { copy.setParameter("port", portList.joined(separator: ",")) }
        return copy
    }

    /// The addresses of `name`, looked up on a thread of its own (one per name at a time).
    private func lookUp(_ name: String) async throws -> [String] {
        try await withCheckedThrowingContinuation { continuation in
            let first = running.withLock { running -> Bool in
                if running[name] != nil {
                    running[name]?.append(continuation)
                    return false
                }
                running[name] = [continuation]
                return true
            }
            guard first else { return }
            let started = startThreadIfPossible(name: "pg-resolve") { [self] in
                let result = Result { try resolve(name) }
                finish(name, result)
            }
            if !started { finish(name, .failure(LookupFailure(reason: "cannot start a thread to look it up"))) }
        }
    }

    private func finish(_ name: String, _ result: Result<[String], any Error>) {
        let waiting = running.withLock { $0.removeValue(forKey: name) ?? [] }
        let answer = result.flatMap { addresses in
            addresses.isEmpty ? .failure(LookupFailure(reason: "no address")) : .success(addresses)
        }
        for continuation in waiting { continuation.resume(with: answer) }
    }
}
