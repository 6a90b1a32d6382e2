# trunk-sync: multi-stage build (Swift 6 toolchain → slim Debian runtime).
FROM swift:6.3-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpq-dev libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Resolve dependencies first so they are cached apart from the sources, each pinned to the
# exact version the tests build with (scripts/package-versions), not the newest of the day.
COPY Package.swift ./
COPY scripts/package-versions ./scripts/package-versions
RUN swift package resolve \
 && grep -v '^#' scripts/package-versions | while read -r name version; do \
      swift package resolve "$name" --version "$version" || exit 1; \
    done
COPY Sources ./Sources
COPY Tests ./Tests
RUN swift build -c release --product trunk-sync \
 && install -D "$(swift build -c release --show-bin-path)/trunk-sync" /out/bin/trunk-sync

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpq5 libssl3 ca-certificates curl tzdata \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin trunk
# The Swift runtime libraries the binary links against.
COPY --from=build /usr/lib/swift/linux/*.so* /usr/lib/swift/linux/
RUN echo /usr/lib/swift/linux > /etc/ld.so.conf.d/swift.conf && ldconfig
COPY --from=build /out/bin/trunk-sync /usr/bin/trunk-sync
# The migrations, where trunk-sync looks for them (share/trunk-sync/migrations beside the
# binary's bin/). The config directory is a reference copy (defaults.json,
# production.example.json, README.md): trunk-sync reads no file there by itself, only one
# named with --config.
COPY migrations /usr/share/trunk-sync/migrations
COPY config /usr/share/trunk-sync/config
# A working directory the owner's tools can write to (`import supabase` writes its reject
# file there unless told otherwise; docs/moving-from-supabase.md).
RUN install -d -o trunk -g trunk /var/lib/trunk-sync
WORKDIR /var/lib/trunk-sync
USER trunk
# The image's own migrations, named: a ./migrations in the (writable, possibly mounted)
# working directory is never taken for them.
ENV TRUNK_SYNC_HOST=0.0.0.0 TRUNK_SYNC_PORT=8080 TRUNK_SYNC_MIGRATIONS_DIR=/usr/share/trunk-sync/migrations
EXPOSE 8080
ENTRYPOINT ["/usr/bin/trunk-sync"]
CMD ["serve"]
