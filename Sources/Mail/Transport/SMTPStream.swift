import COpenSSL
import Glibc

/// A byte stream to the SMTP server: plain TCP, then TLS once `startTLS` succeeds.
///
/// TLS runs over memory BIOs: OpenSSL only encrypts and decrypts, and every byte goes
/// through `TCPConnection`, so each step keeps the session's deadline and writes never
/// raise `SIGPIPE`.
final class SMTPStream {
    /// Why a stream operation failed; `SMTPSession` adds the context.
    enum Failure: Error {
        case socket(SocketFailure)
        /// The TLS layer failed: the reason OpenSSL gives.
        case tls(String)
        /// The certificate did not verify: OpenSSL's verification error (e.g. `self-signed certificate`).
        case certificate(String)
    }

    private let connection: TCPConnection
    private var ssl: OpaquePointer?
    /// Ciphertext from the network, for OpenSSL to read (owned by `ssl`).
    private var networkInput: OpaquePointer?
    /// Ciphertext from OpenSSL, for the network (owned by `ssl`).
    private var networkOutput: OpaquePointer?
    private var buffer = [UInt8](repeating: 0, count: 16 * 1024)

    init(connection: TCPConnection) {
        self.connection = connection
    }

    deinit {
        if let ssl { SSL_free(ssl) }
    }

    /// Whether `startTLS` has succeeded.
    var isEncrypted: Bool { ssl != nil }

    /// This end's address as an SMTP address literal.
    func localAddressLiteral() -> String? { connection.localAddressLiteral() }

    // MARK: - TLS

    /// Runs the client handshake with server name indication and, when the context
    /// verifies, checks that the certificate names `host` (a DNS name, or an IP address).
    func startTLS(context: TLSClientContext, host: String, deadline: Deadline) throws(Failure) {
        ERR_clear_error()
        guard let ssl = SSL_new(context.handle), let input = BIO_new(BIO_s_mem()), let output = BIO_new(BIO_s_mem())
        else {
            throw .tls("cannot create a TLS connection: \(OpenSSLError.take())")
        }
        SSL_set_bio(ssl, input, output)
        self.ssl = ssl
        self.networkInput = input
        self.networkOutput = output
        SSL_set_connect_state(ssl)

        let isAddress = Self.isIPAddress(host)
        if !isAddress {
            // SNI carries host names only (RFC 6066 §3).
            guard trunk_SSL_set_tlsext_host_name(ssl, host) == 1 else {
                throw .tls("cannot set the server name: \(OpenSSLError.take())")
            }
        }
        if context.verifiesCertificates {
            SSL_set_hostflags(ssl, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS))
            let configured =
                isAddress ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) : SSL_set1_host(ssl, host)
            guard configured == 1 else { throw .tls("cannot set the name to verify: \(OpenSSLError.take())") }
        }

        while true {
            ERR_clear_error()
            let result = SSL_do_handshake(ssl)
            // Send what OpenSSL produced, including an alert explaining a failure.
            try flushOutput(deadline: deadline)
            if result == 1 { return }
            let error = SSL_get_error(ssl, result)
            if error == SSL_ERROR_WANT_READ {
                try fillInput(deadline: deadline)
                continue
            }
            let verification = SSL_get_verify_result(ssl)
            if verification != X509_V_OK {
                let reason =
                    X509_verify_cert_error_string(verification).map { String(cString: $0) } ?? "error \(verification)"
                ERR_clear_error()
                throw .certificate(reason)
            }
            throw .tls(OpenSSLError.take())
        }
    }

    /// Sends a TLS close_notify, best effort (the caller closes the socket next).
    func shutdownTLS(deadline: Deadline) {
        guard let ssl else { return }
        ERR_clear_error()
        _ = SSL_shutdown(ssl)
        try? flushOutput(deadline: deadline)
        ERR_clear_error()
    }

    // MARK: - Bytes

    /// Writes all of `bytes` by `deadline` (encrypted once TLS is on).
    func write(_ bytes: [UInt8], deadline: Deadline) throws(Failure) {
        guard let ssl else {
            do {
                try connection.write(bytes[...], deadline: deadline)
            } catch {
                throw .socket(error)
            }
            return
        }
        var offset = 0
        while offset < bytes.count {
            ERR_clear_error()
            let chunk = Int32(clamping: bytes.count - offset)
            let written = bytes.withUnsafeBytes { raw in
                SSL_write(ssl, raw.baseAddress.map { $0 + offset }, chunk)
            }
            if written > 0 {
                offset += Int(written)
                try flushOutput(deadline: deadline)
                continue
            }
            let error = SSL_get_error(ssl, written)
            if error == SSL_ERROR_WANT_READ {
                try flushOutput(deadline: deadline)
                try fillInput(deadline: deadline)
                continue
            }
            throw failure(for: error)
        }
    }

    /// Reads what is available (at least one byte) by `deadline`.
    func read(deadline: Deadline) throws(Failure) -> ArraySlice<UInt8> {
        guard let ssl else {
            do {
                let count = try connection.read(into: &buffer, deadline: deadline)
                return buffer[..<count]
            } catch {
                throw .socket(error)
            }
        }
        while true {
            ERR_clear_error()
            let count = buffer.withUnsafeMutableBytes { raw in
                SSL_read(ssl, raw.baseAddress, Int32(raw.count))
            }
            if count > 0 { return buffer[..<Int(count)] }
            let error = SSL_get_error(ssl, count)
            if error == SSL_ERROR_WANT_READ {
                // Post-handshake messages (a key update) may need an answer first.
                try flushOutput(deadline: deadline)
                try fillInput(deadline: deadline)
                continue
            }
            throw failure(for: error)
        }
    }

    /// Closes the connection.
    func close() {
        connection.close()
    }

    // MARK: - Moving ciphertext

    /// Sends everything OpenSSL has written to its output BIO.
    private func flushOutput(deadline: Deadline) throws(Failure) {
        guard let output = networkOutput else { return }
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while BIO_ctrl_pending(output) > 0 {
            let count = chunk.withUnsafeMutableBytes { raw in
                BIO_read(output, raw.baseAddress, Int32(raw.count))
            }
            guard count > 0 else { return }
            do {
                try connection.write(chunk[..<Int(count)], deadline: deadline)
            } catch {
                throw .socket(error)
            }
        }
    }

    /// Reads ciphertext from the network into OpenSSL's input BIO.
    private func fillInput(deadline: Deadline) throws(Failure) {
        guard let input = networkInput else { return }
        let count: Int
        do {
            count = try connection.read(into: &buffer, deadline: deadline)
        } catch {
            throw .socket(error)
        }
        let written = buffer.withUnsafeBytes { raw in BIO_write(input, raw.baseAddress, Int32(count)) }
        guard written == Int32(count) else { throw .tls("cannot buffer received data: \(OpenSSLError.take())") }
    }

    private func failure(for error: Int32) -> Failure {
        if error == SSL_ERROR_ZERO_RETURN {
            ERR_clear_error()
            return .socket(.closed)
        }
        if error == SSL_ERROR_SYSCALL {
            ERR_clear_error()
            return .socket(.closed)
        }
        return .tls(OpenSSLError.take())
    }

    /// Whether `host` is an IPv4 or IPv6 address rather than a name.
    static func isIPAddress(_ host: String) -> Bool {
        var ipv4 = in_addr()
        var ipv6 = in6_addr()
        return inet_pton(AF_INET, host, &ipv4) == 1 || inet_pton(AF_INET6, host, &ipv6) == 1
    }
}
