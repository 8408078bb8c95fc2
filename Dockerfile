# syntax=docker/dockerfile:1
#
# redis-policy-proxy container image.
#
#   docker build -t redis-policy-proxy .
#   docker run --rm -p 6380:6380 redis-policy-proxy      # upstream 127.0.0.1:6379: a sidecar
#                                                        # in the Redis pod, or --network host
#   docker run --rm -p 6380:6380 redis-policy-proxy \
#       --config /etc/redis-policy-proxy/default.yaml --listen 0.0.0.0:6380 \
#       --upstream redis.example:6379
#
# Arguments after the image name replace the whole default CMD (repeat --config and --listen);
# the ENTRYPOINT, the binary, stays. The config files live in /etc/redis-policy-proxy/ (mount
# your own there). The health check expects the proxy on port 6380 inside the container.

# ---- build ---------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src

# The whole context (minus .dockerignore): whatever the build needs (benches and tests that
# Cargo.toml declares, a build script, files pulled in with include_str!) is there, so new
# targets never break the image. BuildKit cache mounts keep the crate registry and target/
# between builds instead of a dependency-only layer; the binary is copied out of the mount
# in the same step.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin redis-policy-proxy \
    && install -D -m 0755 target/release/redis-policy-proxy /out/redis-policy-proxy \
    && strip --strip-debug /out/redis-policy-proxy \
    && /out/redis-policy-proxy --version

# ---- runtime -------------------------------------------------------------------------------
FROM debian:bookworm-slim

# No packages needed: the binary links only glibc, and the health check uses bash's /dev/tcp.
RUN groupadd --system --gid 10001 rpp \
    && useradd --system --uid 10001 --gid rpp --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin rpp

COPY --from=builder /out/redis-policy-proxy /usr/local/bin/redis-policy-proxy
COPY policy/ /etc/redis-policy-proxy/

# Fail the build if a shipped config does not validate.
RUN for f in /etc/redis-policy-proxy/*.yaml; do redis-policy-proxy --check "$f" || exit 1; done

USER 10001:10001
# 6380: Redis clients; 6390: the admin endpoint (/metrics, /healthz, /readyz).
EXPOSE 6380 6390

# Healthy when /readyz answers 200: the process serves, a policy is loaded and an upstream
# connection is up. A 2 s read timeout bounds a hung connection.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/6390 && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && IFS= read -r -t 2 status <&3 && [[ \"$status\" == *' 200 '* ]]"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/redis-policy-proxy"]
CMD ["--config", "/etc/redis-policy-proxy/default.yaml", "--listen", "0.0.0.0:6380", "--admin", "0.0.0.0:6390"]
