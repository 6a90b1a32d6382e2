import XCTest

@testable import Mail

final class SMTPConfigurationTests: XCTestCase {
    func testValidURLs() throws {
        typealias Expected = (
            host: String, port: Int, tls: SMTPConfiguration.TLSMode, verify: Bool, user: String?, password: String?
        )
        let table: [(String, Expected)] = [
            ("smtp://mail.example.com", ("mail.example.com", 587, .startTLS, true, nil, nil)),
            ("smtp://mail.example.com/", ("mail.example.com", 587, .startTLS, true, nil, nil)),
            ("SMTP://Mail.Example.com:2525", ("Mail.Example.com", 2525, .startTLS, true, nil, nil)),
            ("smtp://mail.example.com?tls=starttls", ("mail.example.com", 587, .startTLS, true, nil, nil)),
            ("smtp://localhost:1025?tls=none", ("localhost", 1025, .none, true, nil, nil)),
            ("smtp://localhost?tls=none", ("localhost", 25, .none, true, nil, nil)),
            ("smtp://mail.example.com?tls=tls", ("mail.example.com", 465, .implicit, true, nil, nil)),
            ("smtp://mail.example.com?tls=TLS", ("mail.example.com", 465, .implicit, true, nil, nil)),
            ("smtps://mail.example.com", ("mail.example.com", 465, .implicit, true, nil, nil)),
            ("smtps://mail.example.com:2465?tls=tls", ("mail.example.com", 2465, .implicit, true, nil, nil)),
            ("smtp://mail.example.com?verify=false", ("mail.example.com", 587, .startTLS, false, nil, nil)),
            ("smtps://h:1?verify=FALSE", ("h", 1, .implicit, false, nil, nil)),
            ("smtp://127.0.0.1:65535?tls=none", ("127.0.0.1", 65535, .none, true, nil, nil)),
            ("smtp://[::1]:2525?tls=none", ("::1", 2525, .none, true, nil, nil)),
            ("smtp://[2001:db8::1]", ("2001:db8::1", 587, .startTLS, true, nil, nil)),
            ("smtp://mailer:s3cret@mail.example.com", ("mail.example.com", 587, .startTLS, true, "mailer", "s3cret")),
            (
                "smtp://us%40er.example:p%40ss%3Aw%C3%B6rd%2F%3F%23%25@mail.example.com:587",
                ("mail.example.com", 587, .startTLS, true, "us@er.example", "p@ss:wörd/?#%")
            ),
            // An unencoded @ in the password: the host starts after the last @.
            ("smtp://user:pa@ss@mail.example.com", ("mail.example.com", 587, .startTLS, true, "user", "pa@ss")),
            ("smtps://user:pw@[::1]:465", ("::1", 465, .implicit, true, "user", "pw")),
        ]
        for (url, expected) in table {
            let configuration = try SMTPConfiguration(url: url)
            XCTAssertEqual(configuration.host, expected.host, url)
            XCTAssertEqual(configuration.port, expected.port, url)
            XCTAssertEqual(configuration.tls, expected.tls, url)
            XCTAssertEqual(configuration.verifyCertificate, expected.verify, url)
            XCTAssertEqual(configuration.credentials?.username, expected.user, url)
            XCTAssertEqual(configuration.credentials?.password, expected.password, url)
            XCTAssertNil(configuration.caFile, url)
            XCTAssertEqual(configuration.connectTimeout, .seconds(10))
            XCTAssertEqual(configuration.commandTimeout, .seconds(30))
        }
    }

    func testCAFileIsPercentDecoded() throws {
        XCTAssertEqual(try SMTPConfiguration(url: "smtp://h?ca_file=/etc/ssl/ca.pem").caFile, "/etc/ssl/ca.pem")
        XCTAssertEqual(try SMTPConfiguration(url: "smtp://h?ca_file=%2Ftmp%2Fa%20b.pem").caFile, "/tmp/a b.pem")
    }

    func testInvalidURLsNameTheSettingAndWhyWithoutLeakingThePassword() {
        let table: [(String, String)] = [
            ("", "it is empty"),
            ("mail.example.com:587", "expected smtp://"),
            ("user:s3cret@mail.example.com", "expected smtp://"),
            ("http://mail.example.com", "unsupported scheme \"http\""),
            ("smtp://", "the host is missing"),
            ("smtp://:25", "the host is missing"),
            ("smtp://user:s3cret@", "the host is missing"),
            ("smtp://h:0", "port must be a number from 1 to 65535"),
            ("smtp://h:65536", "port must be a number from 1 to 65535"),
            ("smtp://h:", "port must be a number"),
            ("smtp://h:+25", "port must be a number"),
            ("smtp://h:25x", "port must be a number"),
            // Unencoded / ? # in a password move its pieces into the port, path, options or
            // fragment: the error must not quote them.
            ("smtp://user:s3cret/x@h", "path after the host"),
            ("smtp://user:s3/cret@h", "path after the host"),
            ("smtp://h/s3cret", "path after the host"),
            ("smtp://user:s3c?ret@h", "port must be a number"),
            ("smtp://h?s3cret@x", "unknown option"),
            ("smtp://user:s3c#ret@h", "fragment"),
            ("smtp://user@h", "user name but no password"),
            ("smtp://user:@h", "the password is empty"),
            ("smtp://:s3cret@h", "the user name is empty"),
            ("smtp://user:s3cret%zz@h", "percent-encoded UTF-8"),
            ("smtp://user:s3cret%FF@h", "percent-encoded UTF-8"),
            ("smtp://h?tls=ssl", "tls must be none, starttls or tls"),
            ("smtp://h?tls", "tls must be none, starttls or tls"),
            ("smtps://h?tls=none", "smtps:// always uses implicit TLS"),
            ("smtps://h?tls=starttls", "smtps:// always uses implicit TLS"),
            ("smtp://h?verify=no", "verify must be true or false"),
            ("smtp://h?tls=none&verify=false", "no effect with tls=none"),
            ("smtp://h?tls=none&ca_file=/x", "no effect with tls=none"),
            ("smtp://h?verify=false&ca_file=/x", "ca_file has no effect with verify=false"),
            ("smtp://h?ca_file=", "ca_file must be a path"),
            ("smtp://h?tls=none&tls=none", "option tls is given twice"),
            ("smtp://h?timeout=5", "unknown option"),
            ("smtp://[::1", "closing ]"),
            ("smtp://[::1]x", "unexpected text after the IPv6 address"),
            ("smtp://[zz]", "the IPv6 address is invalid"),
            ("smtp://mail example.com", "not a valid host name"),
            ("smtp://mäil.example.com", "not a valid host name"),
        ]
        for (url, reason) in table {
            XCTAssertThrowsError(try SMTPConfiguration(url: url), url) { error in
                guard let error = error as? MailError else { return XCTFail("\(url): \(error)") }
                XCTAssertEqual(error.kind, .invalidConfiguration, url)
                XCTAssertTrue(error.description.hasPrefix("TRUNK_SYNC_SMTP_URL is invalid: "), error.description)
                XCTAssertTrue(error.description.contains(reason), "\(url): \(error.description)")
                for secret in ["s3cret", "s3c", "cret", "ret@"] {
                    XCTAssertFalse(error.debugDescription.contains(secret), "\(url) leaks: \(error.debugDescription)")
                }
            }
        }
    }

    func testErrorsNameTheGivenSetting() {
        XCTAssertThrowsError(try SMTPConfiguration(url: "", setting: "--smtp-url")) { error in
            XCTAssertEqual((error as? MailError)?.description, "--smtp-url is invalid: it is empty")
        }
    }

    func testRedactedDescriptionSpellsOutDefaultsAndHidesThePassword() throws {
        let table: [(String, String)] = [
            ("smtp://mailer:s3cret@mail.example.com", "smtp://mailer:***@mail.example.com:587?tls=starttls"),
            ("smtp://us%40er:s3cret@h:25?tls=none", "smtp://us%40er:***@h:25?tls=none"),
            ("smtps://h", "smtps://h:465"),
            ("smtp://h?tls=tls", "smtps://h:465"),
            ("smtp://[::1]:1025?verify=false", "smtp://[::1]:1025?tls=starttls&verify=false"),
            ("smtps://h?ca_file=/etc/my%20ca.pem", "smtps://h:465?ca_file=%2Fetc%2Fmy%20ca.pem"),
        ]
        for (url, redacted) in table {
            let configuration = try SMTPConfiguration(url: url)
            XCTAssertEqual(configuration.redactedDescription, redacted)
            XCTAssertEqual("\(configuration)", redacted)
            // The redacted form parses back to the same configuration.
            XCTAssertEqual(
                try SMTPConfiguration(url: redacted.replacingOccurrences(of: "***", with: "s3cret")), configuration)
        }
        let credentials = SMTPConfiguration.Credentials(username: "mailer", password: "s3cret")
        XCTAssertEqual("\(credentials)", "mailer:***")
    }
}
