# syntax=docker/dockerfile:1
#
# redis-policy-proxy container image.
#
#   docker build -t redis-policy-proxy --build-arg RPP_GIT_COMMIT=$(git rev-parse --short HEAD) .
#   docker run --rm --network host -e RPP_LISTEN=127.0.0.1:6380 -e RPP_ADMIN=127.0.0.1:8379 \
#       redis-policy-proxy                                 # in front of the host's 127.0.0.1:6379
#   docker run --rm -p 127.0.0.1:6380:6380 -p 127.0.0.1:8379:8379 \
#       -v "$PWD/policy:/etc/redis-policy-proxy:ro" \
#       -e RPP_UPSTREAM=redis.example:6379 redis-policy-proxy --log-format json
#   docker kill -s HUP <container>                         # reload the policy
#
# Inside the container the proxy listens on 0.0.0.0 (what `-p` publishes from); what the host
# exposes is decided by `-p` (give it 127.0.0.1: as above, or the host's other interfaces on
# purpose) or, with --network host, by RPP_LISTEN/RPP_ADMIN (set them to 127.0.0.1 as above:
# the image's 0.0.0.0 would listen on every interface of the host).
#
# Building needs BuildKit (the `# syntax` line and the cache mounts): Docker 23+ with the
# buildx plugin (Debian/Ubuntu: docker-buildx-plugin; `docker buildx version` shows it); the
# legacy builder refuses `RUN --mount`. It needs network access for the base images (and the
# dockerfile frontend named on the first line), and for the crates unless they are vendored.
# Without direct access:
#   --build-arg RUST_IMAGE=mirror.example/library/rust:1-bookworm \
#   --build-arg RUNTIME_IMAGE=mirror.example/library/debian:bookworm-slim   # a registry mirror
#   crates: a .cargo/config.toml in the build context is honoured (COPY . . takes it), so
#   `cargo vendor --locked vendor >> .cargo/config.toml` (the vendored sources) or a
#   [source.crates-io] replace-with = "mirror" entry (a crates mirror) builds without crates.io.
#
# The defaults live in the environment (RPP_CONFIG, RPP_LISTEN, RPP_ADMIN below), not in a CMD,
# so arguments after the image name add to them (`--log-format json`, `--upstream ...`) instead
# of replacing them; a flag wins over its variable, and both win over the file's `listen` and
# `admin.listen`. Set -e RPP_CONFIG=/etc/redis-policy-proxy/<yours>.yaml to pick another file of
# the mounted directory (mount a directory, not a file: edits are then picked up without a
# restart). The health check reads /readyz on the admin port (RPP_ADMIN's, 8379 by default).

# ---- build ---------------------------------------------------------------------------------
# Base images; a registry mirror can be given with --build-arg (see the top of this file).
ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
FROM ${RUST_IMAGE} AS builder
WORKDIR /src

# The whole context (minus .dockerignore): whatever the build needs (benches and tests that
# Cargo.toml declares, a build script, files pulled in with include_str!) is there, so new
# targets never break the image. BuildKit cache mounts keep the crate registry and target/
# between builds instead of a dependency-only layer; the binary is copied out of the mount
# in the same step.
COPY . .
# The commit for --version and rpp_build_info: .git is not in the context (.dockerignore).
# Build arguments reach RUN as environment variables, which build.rs reads.
ARG RPP_GIT_COMMIT=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin redis-policy-proxy \
    && install -D -m 0755 target/release/redis-policy-proxy /out/redis-policy-proxy \
    && strip --strip-debug /out/redis-policy-proxy \
    && /out/redis-policy-proxy --version

# ---- runtime -------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE}

# No packages needed: the binary links only glibc, and the health check uses bash's /dev/tcp.
RUN groupadd --system --gid 10001 rpp \
    && useradd --system --uid 10001 --gid rpp --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin rpp

COPY --from=builder /out/redis-policy-proxy /usr/local/bin/redis-policy-proxy
COPY policy/ /etc/redis-policy-proxy/

# Fail the build if a shipped config does not validate.
RUN for f in /etc/redis-policy-proxy/*.yaml; do redis-policy-proxy --check "$f" || exit 1; done

USER 10001:10001
# 6380: Redis clients; 8379: the admin endpoint (/metrics, /healthz, /readyz).
EXPOSE 6380 8379

# The defaults, as variables the binary reads (`redis-policy-proxy --help`): the shipped
# policy, clients from outside the container, and the admin endpoint reachable by probes and
# Prometheus. Override any of them with -e, or with its flag after the image name; with
# --network host set RPP_LISTEN and RPP_ADMIN to 127.0.0.1 (see the top of this file).
ENV RPP_CONFIG=/etc/redis-policy-proxy/default.yaml \
    RPP_LISTEN=0.0.0.0:6380 \
    RPP_ADMIN=0.0.0.0:8379

# Healthy when /readyz answers 200: the process serves, a policy is loaded and an upstream
# connection is up. A 2 s read timeout bounds a hung connection. The port is RPP_ADMIN's, so
# moving the admin endpoint with -e RPP_ADMIN=0.0.0.0:PORT moves the check with it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${RPP_ADMIN##*:} && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && IFS= read -r -t 2 status <&3 && [[ \"$status\" == *' 200 '* ]]"]

STOPSIGNAL SIGTERM
# No CMD: `docker run IMAGE ARGS...` appends ARGS to the binary, keeping the defaults above.
ENTRYPOINT ["/usr/local/bin/redis-policy-proxy"]
