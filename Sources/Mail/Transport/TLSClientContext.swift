import COpenSSL

/// The OpenSSL client context of one `SMTPMailer`, built once from its configuration:
/// TLS 1.2 or newer, and (unless verification is off) peer verification against the
/// system's CA store or `ca_file`. OpenSSL allows creating connections from a configured
/// context on several threads at once; it is never changed after `init`.
final class TLSClientContext: @unchecked Sendable {
    let handle: OpaquePointer
    /// Whether connections check the certificate chain and host name.
    let verifiesCertificates: Bool

    /// - Throws: `.invalidConfiguration` when the context cannot be made or `caFile` does not load.
    init(verifyCertificate: Bool, caFile: String?, setting: String) throws {
        ERR_clear_error()
        guard let handle = SSL_CTX_new(TLS_client_method()) else {
            throw MailError(.invalidConfiguration, "cannot create a TLS context: \(OpenSSLError.take())")
        }
        self.handle = handle
        self.verifiesCertificates = verifyCertificate
        guard trunk_SSL_CTX_set_min_proto_version(handle, TLS1_2_VERSION) == 1 else {
            throw MailError(.invalidConfiguration, "cannot require TLS 1.2: \(OpenSSLError.take())")
        }
        guard verifyCertificate else {
            SSL_CTX_set_verify(handle, SSL_VERIFY_NONE, nil)
            return
        }
        SSL_CTX_set_verify(handle, SSL_VERIFY_PEER, nil)
        if let caFile {
            guard SSL_CTX_load_verify_file(handle, caFile) == 1 else {
                throw MailError(
                    .invalidConfiguration,
                    "\(setting) is invalid: ca_file cannot be loaded as PEM certificates: \(OpenSSLError.take())")
            }
        } else {
            guard SSL_CTX_set_default_verify_paths(handle) == 1 else {
                throw MailError(
                    .invalidConfiguration, "cannot load the system's CA certificates: \(OpenSSLError.take())")
            }
        }
    }

    deinit { SSL_CTX_free(handle) }
}

/// Reads OpenSSL's per-thread error queue.
enum OpenSSLError {
    /// The reason of the oldest queued error (e.g. `certificate verify failed`), clearing
    /// the queue; `unknown error` when it is empty.
    static func take() -> String {
        let code = ERR_get_error()
        ERR_clear_error()
        guard code != 0 else { return "unknown error" }
        if let reason = ERR_reason_error_string(code) { return String(cString: reason) }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        return String(nulTerminated: buffer)
    }
}
