#!/usr/bin/env bash
# The one test command of the repository (CI runs it through .ci/run).
#
#   bash tests/run.sh
#
# 1. installs what is missing: Debian postgresql + jq, cargo-nextest, and a
#    Python venv at target/py (buf, grpcurl 1.8.6, grpcio, grpcio-tools,
#    pytest, PyJWT, googleapis-common-protos);
# 2. starts a throwaway PostgreSQL on 127.0.0.1 (stopped on exit) and exports
#    CP_TEST_POSTGRES_URL for the Rust store tests;
# 3. cargo fmt --check, buf lint, compose config, clippy -D warnings,
#    build, nextest;
# 4. deploy/build-images.sh: static binaries and the FROM scratch images
#    ctrlplane:dev and ctrlplane-testapp:dev (before nextest: the Docker
#    agent's conformance tests run the test image);
# 5. the grpcurl tests (incl. the README's examples, run verbatim: they start
#    a real ctrlplane-agent-process that joins with a join token) and the
#    Python client tests (which join agents through the generated
#    AgentRegistryService stub) against the built binaries;
# 6. tests/compose/run.sh: the README's Docker Compose blocks verbatim (the
#    whole stack with the Docker agent, workloads as containers) and checks
#    on the Docker engine.
#
# Every step prints a header; a failed check step does not stop the later
# ones (a failed build does). The last line sums up; the exit code is
# non-zero if anything failed. CI=true changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
CP_ROOT=$(pwd)
# shellcheck source=tests/lib/common.sh
source tests/lib/common.sh

LOG_DIR=$CP_TARGET_DIR/test-logs
mkdir -p "$LOG_DIR"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-always}
export NEXTEST_HIDE_PROGRESS_BAR=1

START=$SECONDS
STEP_NAMES=()
STEP_RESULTS=()
FAILED=0
TESTS_PASSED=0
TESTS_FAILED=0
FAILED_CHECKS=0

# A setup step (run in this shell: it changes PATH and the environment) that
# fails ends the script through errexit; the exit trap then records it.
CURRENT_SETUP=""
on_exit() {
  local rc=$?
  if [ -n "$CURRENT_SETUP" ]; then
    STEP_NAMES+=("$CURRENT_SETUP")
    STEP_RESULTS+=("FAILED")
    FAILED=$((FAILED + 1))
    FAILED_CHECKS=$((FAILED_CHECKS + 1))
    CURRENT_SETUP=""
    summary
  fi
  stop_postgres
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

summary() {
  local i
  header "summary ($((SECONDS - START)) s)"
  for i in "${!STEP_NAMES[@]}"; do
    printf '  %-8s %s\n' "${STEP_RESULTS[$i]}" "${STEP_NAMES[$i]}"
  done
  if [ "$FAILED" -eq 0 ]; then
    printf 'tests/run.sh: all %d steps passed\n' "${#STEP_NAMES[@]}"
  else
    printf 'tests/run.sh: %d of %d steps FAILED\n' "$FAILED" "${#STEP_NAMES[@]}"
  fi
  # Tests counted over nextest, the grpcurl checks and pytest (a failed
  # non-test step adds one failure).
  printf 'total: %d passed, %d failed\n' "$TESTS_PASSED" "$((TESTS_FAILED + FAILED_CHECKS))"
}

# step NAME CMD... — runs CMD in a subshell with errexit (so a failing
# command inside a function fails the step), records the result.
step() {
  local name=$1 t0=$SECONDS rc
  shift
  header "$name"
  set +e
  ( set -e; "$@" )
  rc=$?
  set -e
  STEP_NAMES+=("$name")
  if [ "$rc" -eq 0 ]; then
    STEP_RESULTS+=("ok")
    log "--- $name: ok ($((SECONDS - t0)) s)"
  else
    STEP_RESULTS+=("FAILED")
    FAILED=$((FAILED + 1))
    log "--- $name: FAILED (exit $rc, $((SECONDS - t0)) s)"
  fi
  return "$rc"
}

# setup NAME CMD... — runs CMD in this shell; a failure ends the run.
setup() {
  local name=$1 t0=$SECONDS
  shift
  header "$name"
  CURRENT_SETUP=$name
  "$@"
  CURRENT_SETUP=""
  STEP_NAMES+=("$name")
  STEP_RESULTS+=("ok")
  log "--- $name: ok ($((SECONDS - t0)) s)"
}

# Stops at once (after the summary) when a step the rest depends on fails.
required() {
  "$@" || { summary; exit 1; }
}

# tally LOGFILE LINE_REGEX — adds the "N passed" and "N failed" counts of the
# last line matching LINE_REGEX (a runner's summary line; colour codes
# stripped) to the totals. A failed step with no failed test counted (a
# crash, a build error) counts as one failure.
tally() {
  local line passed failed
  line=$(sed -E 's/\x1b\[[0-9;]*m//g' "$1" 2>/dev/null | grep -E "$2" | tail -n 1 || true)
  passed=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+' || true)
  failed=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+' || true)
  passed=${passed:-0}
  failed=${failed:-0}
  TESTS_PASSED=$((TESTS_PASSED + passed))
  TESTS_FAILED=$((TESTS_FAILED + failed))
  if [ "${STEP_RESULTS[-1]}" != ok ] && [ "$failed" -eq 0 ]; then
    TESTS_FAILED=$((TESTS_FAILED + 1))
  fi
}

# check NAME CMD... — a step that runs no tests; a failure counts as one.
check() {
  step "$@" || { FAILED_CHECKS=$((FAILED_CHECKS + 1)); return 1; }
}

# --- prerequisites ----------------------------------------------------------

prerequisites() {
  ensure_apt_packages
  ensure_rust_components
  ensure_nextest
  ensure_python_tools
  log "cargo: $(cargo --version)"
  log "nextest: $(cargo nextest --version 2>/dev/null | head -n 1)"
  log "buf: $(buf --version)  grpcurl: $(grpcurl -version 2>&1)  python: $("$CP_VENV/bin/python" --version)"
}
setup "prerequisites" prerequisites
setup "PostgreSQL for the store tests" start_postgres

# --- Rust ---------------------------------------------------------------------

check "cargo fmt --all --check" cargo fmt --all --check || true
check "buf lint (proto/)" bash -c 'cd proto && buf lint' || true
compose_config() {
  local compose=(docker compose)
  command -v docker-compose >/dev/null 2>&1 && compose=(docker-compose)
  "${compose[@]}" -f docker-compose.yml config -q
  "${compose[@]}" -f docker-compose.yml -f docker-compose.postgres.yml config -q
}
check "docker-compose.yml (+ docker-compose.postgres.yml) is valid" compose_config || true
check "cargo clippy --workspace --all-targets -- -D warnings" \
  cargo clippy --workspace --all-targets -- -D warnings || true
required check "cargo build --workspace --all-targets" cargo build --workspace --all-targets

# The FROM scratch images ctrlplane:dev and ctrlplane-testapp:dev: the Docker
# agent's conformance tests (in nextest) run ctrlplane-testapp:dev, and the
# compose test runs both.
build_images() {
  timeout 1200 deploy/build-images.sh 2>&1 | tee "$LOG_DIR/images.log"
}
check "container images (deploy/build-images.sh)" build_images || true

nextest() {
  timeout 1500 cargo nextest run --workspace --no-fail-fast 2>&1 | tee "$LOG_DIR/nextest.log"
}
step "cargo nextest run --workspace" nextest || true
tally "$LOG_DIR/nextest.log" 'tests? run: '

# --- against the running binaries --------------------------------------------

grpcurl_tests() {
  timeout 600 bash tests/grpcurl/run.sh 2>&1 | tee "$LOG_DIR/grpcurl.log"
}
step "grpcurl tests + README examples (tests/grpcurl/run.sh)" grpcurl_tests || true
tally "$LOG_DIR/grpcurl.log" '^grpcurl: [0-9]+ passed'

python_tests() {
  timeout 1200 "$CP_VENV/bin/python" -m pytest tests/python -q -rfE --color=yes 2>&1 \
    | tee "$LOG_DIR/pytest.log"
}
step "Python client tests (pytest tests/python)" python_tests || true
tally "$LOG_DIR/pytest.log" '[0-9]+ (passed|failed).* in [0-9.]+s'

compose_tests() {
  timeout 900 bash tests/compose/run.sh 2>&1 | tee "$LOG_DIR/compose.log"
}
step "Docker Compose end to end + README compose blocks (tests/compose/run.sh)" compose_tests || true
tally "$LOG_DIR/compose.log" '^compose: [0-9]+ passed'

summary
[ "$FAILED" -eq 0 ]
