// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "trunk-sync",
    // iOS for the client library (TrunkSyncClient); the server builds for macOS and Linux.
    platforms: [.macOS(.v14), .iOS(.v16)],
    products: [
        .executable(name: "trunk-sync", targets: ["trunk-sync"]),
        // The Swift client apps depend on: Foundation only (docs/clients.md, "Client library").
        .library(name: "TrunkSyncClient", targets: ["TrunkSyncClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
    ],
    targets: [
        // System libraries (Debian: libpq-dev, libssl-dev).
        .systemLibrary(
            name: "CLibPQ",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]
        ),

        // Linux calls Swift's Glibc module does not export (epoll, accept4, thread names).
        .target(name: "CSystem"),

        // Libraries, each owning one concern (docs/ARCHITECTURE.md).
        .target(name: "TrunkCrypto", dependencies: ["COpenSSL", "JSON"]),
        .target(
            name: "Postgres",
            dependencies: ["CLibPQ", "CSystem", .product(name: "Logging", package: "swift-log")],
            exclude: ["README.md"]
        ),
        .target(
            name: "HTTPServer", dependencies: ["CSystem", "COpenSSL", .product(name: "Logging", package: "swift-log")],
            // The event loop is generic over the application's responder: let the executable
            // specialize it (unspecialized, generic metadata look-ups cost ~10% of /healthz). Its
            // state is confined to the loop thread, so release builds skip the run-time
            // exclusivity checks on it (~2% of /healthz).
            swiftSettings: [
                .unsafeFlags(
                    ["-cross-module-optimization", "-enforce-exclusivity=unchecked"], .when(configuration: .release))
            ]),
        // The one JSON parser and writer, with I-JSON rules (no dependencies, so the fuzzer
        // builds it on its own).
        .target(name: "JSON"),
        .target(
            name: "Mail",
            dependencies: ["COpenSSL", "CSystem", "TrunkCrypto", .product(name: "Logging", package: "swift-log")]),
        .target(
            name: "TrunkSync",
            dependencies: [
                "Postgres", "TrunkCrypto", "HTTPServer", "Mail", "CSystem", "JSON",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "trunk-sync",
            dependencies: [
                "TrunkSync", "Postgres", "CSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        // The client library: Foundation (and FoundationNetworking on Linux) only, no module of
        // the server and no system library, so iOS, macOS and Linux apps can depend on it.
        .target(name: "TrunkSyncClient"),
        // Signs in, records and syncs from the command line (and drives the client tests' crashes).
        .executableTarget(name: "trunk-sync-example", dependencies: ["TrunkSyncClient"]),

        // Tests. Those that need a database read TRUNK_SYNC_TEST_DATABASE_URL, set by `make test`
        // (scripts/test.sh starts a private PostgreSQL cluster for them).
        .target(name: "TestSupport", dependencies: ["Postgres"], path: "Tests/TestSupport"),
        .testTarget(name: "TrunkCryptoTests", dependencies: ["TrunkCrypto"]),
        .testTarget(name: "PostgresTests", dependencies: ["Postgres", "TestSupport", "CSystem"]),
        .testTarget(
            name: "HTTPServerTests", dependencies: ["HTTPServer", .product(name: "Logging", package: "swift-log")]),
        .testTarget(name: "JSONTests", dependencies: ["JSON"]),
        .testTarget(name: "MailTests", dependencies: ["Mail", "TestSupport"]),
        .testTarget(name: "EndToEndTests", dependencies: ["TestSupport", "Postgres", "TrunkCrypto"]),
        .testTarget(name: "TrunkSyncClientTests", dependencies: ["TrunkSyncClient", "TestSupport", "Postgres"]),
        .testTarget(
            name: "TrunkSyncTests",
            dependencies: [
                "TrunkSync", "Postgres", "TrunkCrypto", "TestSupport", "HTTPServer", "JSON",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
