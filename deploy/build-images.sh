#!/usr/bin/env bash
# Builds the ctrlplane images without a container registry: static binaries
# on this machine, then FROM scratch images around them.
#
#   deploy/build-images.sh
#
# 1. cargo builds the service binaries and the test workload as static
#    x86_64 Linux executables (glibc linked in, bundled SQLite, rustls; no
#    OpenSSL) with the `image` profile of the root Cargo.toml, into
#    target/x86_64-unknown-linux-gnu/image/;
# 2. docker builds, each from a small context directory under
#    target/images/ (never the repository):
#      ctrlplane:dev          every service binary and the CLI in
#                             /usr/local/bin (deploy/Dockerfile.local)
#      ctrlplane-testapp:dev  /ctrlplane-testapp, the workload the Docker
#                             agent's tests and tests/compose run
#                             (deploy/Dockerfile.testapp)
#    and runs each once to check that it starts.
#
# Both images carry the label io.ctrlplane.image (find them with
# `docker images --filter label=io.ctrlplane.image`) and
# org.opencontainers.image.revision (the git commit).
#
# Settings (environment): CP_IMAGE_TAG (default dev), CP_IMAGE_PROFILE
# (cargo profile, default image), CARGO_TARGET_DIR. With a registry,
# `docker compose build` (deploy/Dockerfile) builds the same image the
# usual way instead.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

TAG=${CP_IMAGE_TAG:-dev}
PROFILE=${CP_IMAGE_PROFILE:-image}
TRIPLE=x86_64-unknown-linux-gnu
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT_DIR=$TARGET_DIR/$TRIPLE/$PROFILE
CONTEXT_DIR=$TARGET_DIR/images

# package:binary — the binaries of the ctrlplane image.
SERVICE_BINS=(
  ctrlplane-cli:ctrlplane
  ctrlplane-datacenter:ctrlplane-datacenter
  ctrlplane-bootstrap:ctrlplane-bootstrap
  ctrlplane-scheduler:ctrlplane-scheduler
  ctrlplane-agent-docker:ctrlplane-agent-docker
  ctrlplane-agent-process:ctrlplane-agent-process
)
TESTAPP=ctrlplane-testapp:ctrlplane-testapp

log() { printf '%s\n' "$*" >&2; }
die() { log "build-images: $*"; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "only x86_64 hosts are supported (static $TRIPLE binaries)"
command -v cargo >/dev/null || die "cargo is missing (a Rust toolchain, 1.94 or newer)"
command -v docker >/dev/null || die "docker is missing"
docker info >/dev/null 2>&1 || die "no Docker engine answers (is dockerd running, may you use its socket?)"

# --- 1. static binaries ---------------------------------------------------------

packages=()
for pb in "${SERVICE_BINS[@]}" "$TESTAPP"; do
  packages+=(-p "${pb%%:*}")
done
t0=$SECONDS
log "==> cargo build --profile $PROFILE --target $TRIPLE (static) ${packages[*]}"
# crt-static links glibc in; a static relocation model makes a plain static
# executable (not static-pie); getrandom uses the getrandom(2) syscall, so no
# /dev/urandom is needed. RUSTFLAGS applies to the target only (not to
# build scripts and proc macros, because --target is given).
RUSTFLAGS='-C target-feature=+crt-static -C relocation-model=static --cfg getrandom_backend="linux_getrandom"' \
  cargo build --profile "$PROFILE" --target "$TRIPLE" "${packages[@]}"
build_secs=$((SECONDS - t0))
log "static binaries built in ${build_secs} s"

# Static means no program interpreter (PT_INTERP) in the ELF headers.
is_static() {
  python3 - "$1" <<'PY'
import struct, sys
with open(sys.argv[1], "rb") as f:
    data = f.read(1 << 16)
assert data[:4] == b"\x7fELF" and data[4] == 2, "not a 64-bit ELF file"
phoff, = struct.unpack_from("<Q", data, 0x20)
phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
for i in range(phnum):
    p_type, = struct.unpack_from("<I", data, phoff + i * phentsize)
    if p_type == 3:  # PT_INTERP
        sys.exit(1)
PY
}

# --- 2. images ------------------------------------------------------------------

REVISION=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null | head -n 1)" ]; then
  REVISION="$REVISION-dirty"
fi
# Docker CLIs without the buildx plugin fall back to the classic builder;
# say so up front instead of letting them try BuildKit.
if ! docker buildx version >/dev/null 2>&1; then
  export DOCKER_BUILDKIT=0
fi

# rootfs DIR — the image's directories: /tmp (1777), /data, and the host's CA
# bundle (for TLS to Postgres or remote hooks).
make_rootfs() {
  local dir=$1
  mkdir -p "$dir/tmp" "$dir/data"
  chmod 1777 "$dir/tmp"
  chmod 0755 "$dir/data"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    mkdir -p "$dir/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/"
  fi
}

# copy_bin BIN DEST — a built binary into a context directory, checked static.
copy_bin() {
  local src=$OUT_DIR/$1
  [ -x "$src" ] || die "$src is missing after the build"
  is_static "$src" || die "$src is not a static executable (it names a program interpreter)"
  cp "$src" "$2"
}

t1=$SECONDS
rm -rf "$CONTEXT_DIR"
mkdir -p "$CONTEXT_DIR/ctrlplane/bin" "$CONTEXT_DIR/testapp"
make_rootfs "$CONTEXT_DIR/ctrlplane/rootfs"
rm -rf "$CONTEXT_DIR/testapp/rootfs" && mkdir -p "$CONTEXT_DIR/testapp/rootfs/tmp"
chmod 1777 "$CONTEXT_DIR/testapp/rootfs/tmp"
for pb in "${SERVICE_BINS[@]}"; do
  copy_bin "${pb#*:}" "$CONTEXT_DIR/ctrlplane/bin/"
done
copy_bin "${TESTAPP#*:}" "$CONTEXT_DIR/testapp/"
cp deploy/Dockerfile.local "$CONTEXT_DIR/ctrlplane/Dockerfile"
cp deploy/Dockerfile.testapp "$CONTEXT_DIR/testapp/Dockerfile"

build_image() { # build_image NAME CONTEXT
  log "==> docker build -t $1 ($2: $(du -sh "$2" | cut -f1))"
  # The classic builder's deprecation notice is noise here: its output is
  # shown only when the build fails.
  if ! docker build --quiet \
      --label "org.opencontainers.image.revision=$REVISION" \
      --label "org.opencontainers.image.version=$TAG" \
      -t "$1" "$2" >"$2.log" 2>&1; then
    cat "$2.log" >&2
    die "docker build of $1 failed"
  fi
}
build_image "ctrlplane:$TAG" "$CONTEXT_DIR/ctrlplane"
build_image "ctrlplane-testapp:$TAG" "$CONTEXT_DIR/testapp"

# The images these tags pointed at before, now untagged and unused, go
# (only dangling ones carrying our label).
docker image prune -f --filter label=io.ctrlplane.image >/dev/null 2>&1 || true

# Each starts in its FROM scratch image.
docker run --rm "ctrlplane:$TAG" ctrlplane --version >/dev/null \
  || die "ctrlplane:$TAG does not run \`ctrlplane --version\`"
docker run --rm "ctrlplane:$TAG" ctrlplane-datacenter --help >/dev/null \
  || die "ctrlplane:$TAG does not run \`ctrlplane-datacenter --help\`"
docker run --rm "ctrlplane-testapp:$TAG" exit 0 >/dev/null \
  || die "ctrlplane-testapp:$TAG does not run \`exit 0\`"
image_secs=$((SECONDS - t1))

log ""
log "built (cargo ${build_secs} s, images ${image_secs} s, total $((SECONDS - t0)) s):"
for image in "ctrlplane:$TAG" "ctrlplane-testapp:$TAG"; do
  printf '  %-26s %s\n' "$image" "$(docker image inspect --format '{{.Id}} {{.Size}}' "$image" \
    | awk '{ printf "%s  %.1f MB", substr($1, 8, 12), $2 / 1e6 }')"
done
for pb in "${SERVICE_BINS[@]}" "$TESTAPP"; do
  printf '  %-26s %s\n' "${pb#*:}" "$(du -h "$OUT_DIR/${pb#*:}" | cut -f1)" >&2
done
