// trunk-sync-example: the TrunkSyncClient library from the command line.
//
//     trunk-sync-example [--url URL] [--storage DIR] COMMAND …
//
//     sign-in EMAIL [CODE]      mails a code and reads it from stdin (or verifies CODE)
//     send-code EMAIL           mails a code
//     verify EMAIL CODE         signs in with it
//     record TYPE JSON [--count N] [--start S] [--interval-ms MS]
//                               records events (JSON: an object); with --count, N events
//                               whose payloads also carry "index": S, S+1, …, MS apart;
//                               prints "recorded <client_id>" after each is durable
//     sync                      pushes the outbox, pulls new events, prints both
//     live                      prints events as they arrive (Ctrl-C ends)
//     status                    signed in as whom, events pending, cursor
//     quarantine [--discard]    lists (or discards) events the server refused
//     sign-out [--discard]      signs out (--discard: delete unsent events)
//
// URL and DIR default to $TRUNK_SYNC_URL (http://127.0.0.1:8080) and $TRUNK_SYNC_STORAGE
// (./.trunk-sync-example).
import Foundation
import TrunkSyncClient

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

@main
enum Example {
    /// Writes a line to stdout at once (unbuffered: the tests read it while we run).
    static func say(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    static func fail(_ message: String, status: Int32 = 1) -> Never {
        FileHandle.standardError.write(Data("trunk-sync-example: \(message)\n".utf8))
        exit(status)
    }

    static func line(_ event: SyncEvent) -> String {
        "event \(event.seq) \(event.clientID.uuidString.lowercased()) \(event.type) "
            + String(decoding: event.payload, as: UTF8.self)
    }

    static func main() async {
        let usage = """
            usage: trunk-sync-example [--url URL] [--storage DIR] COMMAND …
              sign-in EMAIL [CODE] | send-code EMAIL | verify EMAIL CODE
              record TYPE JSON [--count N] [--start S] [--interval-ms MS] | sync | live | status
              quarantine [--discard] | sign-out [--discard]
            """

        var arguments = Array(CommandLine.arguments.dropFirst())
        let environment = ProcessInfo.processInfo.environment
        var serverURL = environment["TRUNK_SYNC_URL"] ?? "http://127.0.0.1:8080"
        var storagePath = environment["TRUNK_SYNC_STORAGE"] ?? ".trunk-sync-example"

        /// Removes `--name VALUE` from the arguments and returns VALUE.
        func option(_ name: String) -> String? {
            guard let index = arguments.firstIndex(of: name) else { return nil }
            guard index + 1 < arguments.count else { fail("\(name) needs a value") }
            let value = arguments[index + 1]
            arguments.removeSubrange(index...(index + 1))
            return value
        }

        /// Removes `--name` from the arguments and returns whether it was there.
        func flag(_ name: String) -> Bool {
            guard let index = arguments.firstIndex(of: name) else { return false }
            arguments.remove(at: index)
            return true
        }

        serverURL = option("--url") ?? serverURL
        storagePath = option("--storage") ?? storagePath
        guard let command = arguments.first else { fail(usage, status: 2) }
        arguments.removeFirst()
        guard let url = URL(string: serverURL) else { fail("bad URL \(serverURL)") }

        do {
            let client = try TrunkSyncClient(url: url, storageDirectory: URL(fileURLWithPath: storagePath))
            switch command {
            case "send-code":
                guard arguments.count == 1 else { fail(usage, status: 2) }
                try await client.sendCode(to: arguments[0])
                say("code sent to \(arguments[0])")
            case "verify", "sign-in":
                guard (1...2).contains(arguments.count), command == "sign-in" || arguments.count == 2 else {
                    fail(usage, status: 2)
                }
                let email = arguments[0]
                var code = arguments.count == 2 ? arguments[1] : nil
                if code == nil {
                    try await client.sendCode(to: email)
                    FileHandle.standardError.write(Data("code sent to \(email); enter it: ".utf8))
                    say("code sent to \(email)")
                    code = readLine()?.trimmingCharacters(in: .whitespaces)
                }
                guard let code, !code.isEmpty else { fail("no code") }
                try await client.verify(email: email, code: code)
                say("signed in as \(email) (\(client.currentUser?.id.uuidString.lowercased() ?? "?"))")
            case "record":
                let countOption = option("--count")
                let startOption = option("--start")
                let interval = Double(option("--interval-ms") ?? "0") ?? 0
                let count = Int(countOption ?? "1") ?? 1
                let start = Int(startOption ?? "0") ?? 0
                guard arguments.count == 2 else { fail(usage, status: 2) }
                let type = arguments[0]
                guard let object = try JSONSerialization.jsonObject(with: Data(arguments[1].utf8)) as? [String: Any]
                else {
                    fail("the payload must be a JSON object")
                }
                for index in start..<(start + count) {
                    var payload = object
                    if countOption != nil || startOption != nil { payload["index"] = index }
                    let data = try JSONSerialization.data(withJSONObject: payload, options: [.sortedKeys])
                    let id = try await client.record(type: type, payloadJSON: data)
                    say("recorded \(id.uuidString.lowercased())")
                    if interval > 0 { try await Task.sleep(nanoseconds: UInt64(interval * 1_000_000)) }
                }
                say("pending \(await client.pendingCount)")
            case "sync":
                let report = try await client.sync { events in
                    for event in events { say(line(event)) }
                }
                say(
                    "pushed \(report.pushed) duplicates \(report.duplicates) pulled \(report.pulled) pages \(report.pages) "
                        + "cursor \(report.cursor)")
                for rejected in report.rejected {
                    say("rejected \(rejected.clientID.uuidString.lowercased()) \(rejected.field): \(rejected.reason)")
                }
            case "live":
                say("listening (cursor \(await client.cursor))")
                for try await events in client.liveEvents() {
                    for event in events { say(line(event)) }
                }
            case "status":
                if let user = client.currentUser {
                    say("signed in as \(user.email ?? "?") (\(user.id.uuidString.lowercased()))")
                } else {
                    say("signed out")
                }
                say("pending \(await client.pendingCount) cursor \(await client.cursor)")
            case "quarantine":
                if flag("--discard") {
                    try await client.discardQuarantined()
                    say("discarded")
                } else {
                    for event in try await client.quarantinedEvents() {
                        say(
                            "\(event.clientID.uuidString.lowercased()) \(event.type) \(event.rejection.field): "
                                + "\(event.rejection.reason) \(String(decoding: event.payload, as: UTF8.self))")
                    }
                }
            case "sign-out":
                let result = try await client.signOut(discardingUnsentEvents: flag("--discard"))
                say(
                    "signed out (server session revoked: \(result.serverSessionRevoked); unsent events kept: "
                        + "\(result.unsentEvents.map(String.init) ?? "all (the outbox could not be read)"))")
            default:
                fail(usage, status: 2)
            }
            await client.close()
        } catch {
            fail("\(error)")
        }
    }
}
