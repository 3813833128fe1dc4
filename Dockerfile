# syntax=docker/dockerfile:1
# loopwarden container image: `docker build -t loopwarden .`
#
# The build stage runs exactly the commands .ci/run runs (it executes this stage's RUN
# lines, see scripts/dockerfile-build-steps), so the image build cannot rot unnoticed.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN scripts/install-build-deps
RUN --mount=type=cache,target=/usr/local/cargo/registry --mount=type=cache,target=/src/target scripts/build-release dist

# Runtime: Debian slim (glibc, zlib and CA certificates for TLS to brokers and
# collectors); OpenSSL and librdkafka are linked into the binary.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 loopwarden \
    && useradd --system --uid 10001 --gid loopwarden --home-dir /var/lib/loopwarden --shell /usr/sbin/nologin loopwarden \
    && install -d -o loopwarden -g loopwarden -m 0750 /var/lib/loopwarden
COPY --from=build /src/dist/loopwarden /usr/local/bin/loopwarden
COPY deploy/docker/loopwarden.toml /etc/loopwarden/loopwarden.toml
USER 10001:10001
WORKDIR /var/lib/loopwarden
# sled state; keep it on a volume so a restart does not restore everything from the
# changelog.
VOLUME ["/var/lib/loopwarden"]
# /metrics, /healthz, /readyz
EXPOSE 9464
ENV LOOPWARDEN_CONFIG=/etc/loopwarden/loopwarden.toml
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["loopwarden", "healthcheck", "--url", "http://127.0.0.1:9464/healthz"]
ENTRYPOINT ["loopwarden"]
CMD ["run"]
