import Foundation
import Postgres

/// Changes to the whole test cluster that a test undoes when it ends.
public enum TestCluster {
    /// The cluster accepting TLS, until `disable()`.
    public struct TLS {
        let admin: PostgresConnection
        let directory: String

        /// Turns TLS off again and removes the certificate.
        public func disable() {
            for setting in ["ssl", "ssl_cert_file", "ssl_key_file"] {
                try? admin.execute("alter system reset \(setting)")
            }
            try? admin.execute("select pg_reload_conf()")
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    /// Makes the test cluster take TLS with a self-signed certificate (`sslmode=require` does
    /// not verify it) and returns once new sessions get it. The tests run as root: the key is
    /// given to the `postgres` user, as PostgreSQL refuses a key others may read.
    public static func enableTLS() throws -> TLS {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tls-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let certificate = directory + "/server.crt"
        let key = directory + "/server.key"
        let made = try Command.run(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-keyout", key,
                "-out", certificate,
            ])
        guard made.status == 0 else { throw TestEnvironmentError("openssl req failed: \(made.stderr)") }
        for file in [directory, certificate, key] {
            try FileManager.default.setAttributes([.ownerAccountName: "postgres"], ofItemAtPath: file)
        }
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
        let admin = try PostgresConnection.connect(try TestDatabase.adminConfiguration())
        let tls = TLS(admin: admin, directory: directory)
        // One statement each: ALTER SYSTEM runs outside a transaction block.
        try admin.execute("alter system set ssl_cert_file = '\(certificate)'")
        try admin.execute("alter system set ssl_key_file = '\(key)'")
        try admin.execute("alter system set ssl = on")
        try admin.execute("select pg_reload_conf()")
        // The reload reaches new sessions once the postmaster has read it.
        let deadline = Date().addingTimeInterval(30)
        while try PostgresConnection.connect(try TestDatabase.adminConfiguration()).query("show ssl")[0]
            .decode(String.self, column: 0) != "on"
        {
            guard Date() < deadline else {
                tls.disable()
                throw TestEnvironmentError("the test cluster did not take TLS")
            }
            usleep(50_000)
        }
        return tls
    }
}
