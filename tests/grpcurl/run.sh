#!/usr/bin/env bash
# grpcurl 1.8.6 against a started ctrlplane-datacenter, and the README's
# example blocks run verbatim.
#
#   bash tests/grpcurl/run.sh      (after cargo build --workspace)
#
# Starts target/debug/ctrlplane-datacenter on a free loopback port with a
# temporary SQLite file and a fresh secret, mints tokens with
# target/debug/ctrlplane, and checks reflection (list, describe), health,
# every DatacenterService call the README shows, error cases (bad input,
# no/forged token, forbidden transition) and that the change log survives a
# restart. Ends with "grpcurl: N passed, M failed"; exits non-zero on any
# failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
CP_ROOT=$(pwd)
# shellcheck source=tests/lib/common.sh
source tests/lib/common.sh

ensure_python_tools
command -v jq >/dev/null || apt_install jq
[ -x "$CP_BIN_DIR/ctrlplane" ] || die "$CP_BIN_DIR/ctrlplane is missing (cargo build --workspace)"
export PATH="$CP_BIN_DIR:$PATH"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ctrlplane-grpcurl.XXXXXX")
# `env` arguments that drop this environment's CP_* variables (such as
# CP_TEST_POSTGRES_URL) for servers started here: each test gives its own.
mapfile -t UNSET_CP < <(without_cp_env)
DC_PID=""
cleanup() {
  stop_pid "$DC_PID"
  rm -rf "$WORK"
}
trap cleanup EXIT

PASSED=0
FAILED=0
FAILED_NAMES=()
OUT=$WORK/out.txt # stdout + stderr of the last command run by `run`

# run CMD... — runs CMD, output to $OUT; returns CMD's exit status.
run() {
  set +e
  "$@" >"$OUT" 2>&1
  local rc=$?
  set -e
  return $rc
}

# check NAME CMD... — one test: CMD (usually a function of assertions)
# must succeed.
check() {
  local name=$1 rc
  shift
  set +e
  ( set -e; "$@" ) >"$WORK/check.log" 2>&1
  rc=$?
  set -e
  if [ $rc -eq 0 ]; then
    PASSED=$((PASSED + 1))
    printf '  PASS  %s\n' "$name"
  else
    FAILED=$((FAILED + 1))
    FAILED_NAMES+=("$name")
    printf '  FAIL  %s\n' "$name"
    sed 's/^/        | /' "$WORK/check.log"
    if [ -s "$OUT" ]; then
      printf '        | last command output (its end):\n'
      tail -n 80 "$OUT" | sed 's/^/        | /'
    fi
  fi
}

# Assertions (used inside check functions; they print why they fail).
contains() { # contains TEXT — $OUT contains TEXT
  grep -qF -- "$1" "$OUT" || { echo "expected output to contain: $1"; return 1; }
}
jq_true() { # jq_true FILTER — FILTER over $OUT is true
  jq -e "$1" "$OUT" >/dev/null || { echo "expected jq filter to be true: $1"; return 1; }
}
fails_with() { # fails_with CODE CMD... — CMD fails and prints "Code: CODE"
  local code=$1
  shift
  if run "$@"; then echo "expected the call to fail with $code, it succeeded"; return 1; fi
  contains "Code: $code"
}

DC=ctrlplane.datacenter.v1.DatacenterService

# --- the server ---------------------------------------------------------------

header "starting ctrlplane-datacenter"
mkdir -p "$WORK/server"
start_datacenter "$WORK/server"
log "serving on $DC_ADDR (pid $DC_PID)"
ADDR=$DC_ADDR
export CP_AUTH_SECRET=$DC_SECRET

call() { # call TOKEN METHOD JSON — grpcurl an authenticated call
  local token=$1 method=$2 data=$3
  run grpcurl -plaintext -H "authorization: Bearer $token" -d "$data" "$ADDR" "$DC/$method"
}

# --- README examples, verbatim --------------------------------------------------

# readme_block NAME — the fenced block that follows "<!-- test: NAME -->" in
# README.md.
readme_block() {
  awk -v marker="<!-- test: $1 -->" '
    index($0, marker) == 1 { armed = 1; next }
    armed && !inside && /^```/ { inside = 1; next }
    inside && /^```/ { exit }
    inside { print }
  ' README.md
}

# run_readme_blocks NAME... — runs the named blocks one after the other in
# one bash (as a reader pastes them into one shell) against the started
# server, with errexit on; a block whose name ends in "-errors" is made of
# commands that fail on purpose and runs with errexit off. Only the address
# is rewritten: the README uses the default localhost:7100, the test server
# listens on a free port. Output goes to $OUT, each block's after a
# "### <name>" line.
run_readme_blocks() {
  local script=$WORK/readme.sh name
  : >"$script"
  for name in "$@"; do
    readme_block "$name" >"$WORK/block"
    [ -s "$WORK/block" ] || { echo "README.md has no block marked <!-- test: $name -->"; return 1; }
    case $name in
      *-errors) echo "set +e" >>"$script" ;;
      *) echo "set -e" >>"$script" ;;
    esac
    printf 'echo "### %s"\n' "$name" >>"$script"
    sed "s/localhost:7100/$ADDR/g" "$WORK/block" >>"$script"
  done
  echo 'echo "### end"' >>"$script"
  echo "--- README blocks $* (address rewritten to $ADDR):"
  cat "$script"
  # The exit status is that of the last command, which fails on purpose in
  # an -errors block: reaching the end marker is what counts.
  (cd "$WORK" && PS4='+ ' bash -uo pipefail -x "$script") >"$OUT" 2>&1 || true
  grep -qx '### end' "$OUT" || { echo "the README commands stopped at an error (see the output's end)"; return 1; }
}

# section NAME — the output of one block of the last run_readme_blocks.
section() {
  awk -v start="### $1" '$0 == start { on = 1; next } /^### / { on = 0 } on' "$OUT"
}

header "README examples (run verbatim)"
readme_grpcurl() {
  run_readme_blocks grpcurl-quickstart grpcurl-errors
  section grpcurl-quickstart >"$WORK/quickstart.out"
  grep -qF '"slug": "berlin-1"' "$WORK/quickstart.out" || { echo "CreateDatacenter output missing"; return 1; }
  grep -qF '"DATACENTER_STATUS_MAINTENANCE"' "$WORK/quickstart.out" || { echo "SetDatacenterStatus output missing"; return 1; }
  grep -qF '"DATACENTER_STATUS_DELETING"' "$WORK/quickstart.out" || { echo "DeleteDatacenter output missing"; return 1; }
  section grpcurl-errors >"$WORK/errors.out"
  [ "$(grep -c '^  Code: ' "$WORK/errors.out")" = 2 ] || { echo "both error examples must fail"; return 1; }
  grep -qF 'Code: InvalidArgument' "$WORK/errors.out" || { echo "no InvalidArgument"; return 1; }
  grep -qF 'datacenter.name: is required' "$WORK/errors.out" || { echo "message as shown missing"; return 1; }
  grep -qF 'datacenter.labels[bad key!]' "$WORK/errors.out" || { echo "message as shown missing"; return 1; }
  grep -qF 'Code: Unauthenticated' "$WORK/errors.out" || { echo "no Unauthenticated"; return 1; }
  grep -qF 'Message: missing authorization metadata (expected "authorization: Bearer <token>")' "$WORK/errors.out" \
    || { echo "message as shown missing"; return 1; }
}
check "README grpcurl blocks work verbatim" readme_grpcurl

readme_cli() {
  run_readme_blocks cli-quickstart
  contains 'paris-1'
  contains 'maintenance'
  grep -qiE 'deleting' "$OUT" || { echo "delete output missing"; return 1; }
}
check "README CLI block works verbatim" readme_cli

# --- reflection and health ------------------------------------------------------

header "reflection and health (no token)"
t_list() {
  run grpcurl -plaintext "$ADDR" list
  contains "$DC"
  contains grpc.health.v1.Health
}
check "list services" t_list

t_list_methods() {
  run grpcurl -plaintext "$ADDR" list "$DC"
  local m
  for m in CreateDatacenter GetDatacenter GetDatacenterBySlug ListDatacenters UpdateDatacenter \
    DeleteDatacenter SetDatacenterStatus ResolveProvider WatchDatacenters ListDatacenterEvents \
    PurgeDatacenter; do
    contains "$DC.$m"
  done
}
check "list DatacenterService methods" t_list_methods

t_describe() {
  run grpcurl -plaintext "$ADDR" describe "$DC"
  contains "$DC is a service:"
  contains 'rpc CreateDatacenter ( .ctrlplane.datacenter.v1.CreateDatacenterRequest ) returns ( .ctrlplane.datacenter.v1.CreateDatacenterResponse );'
  contains 'returns ( stream .ctrlplane.datacenter.v1.WatchDatacentersResponse );'
}
check "describe DatacenterService" t_describe

t_describe_msg() {
  run grpcurl -plaintext "$ADDR" describe ctrlplane.datacenter.v1.Datacenter
  contains 'repeated .ctrlplane.bootstrap.v1.BootstrapServiceSpec bootstrap_services = 13;'
  contains '.ctrlplane.datacenter.v1.DatacenterStatus status = 8;'
}
check "describe a message across files (Datacenter)" t_describe_msg

t_describe_health() {
  run grpcurl -plaintext "$ADDR" describe grpc.health.v1.Health
  contains 'rpc Check'
}
check "describe grpc.health.v1.Health" t_describe_health

t_health() {
  run grpcurl -plaintext "$ADDR" grpc.health.v1.Health/Check
  jq_true '.status == "SERVING"'
  run grpcurl -plaintext -d "{\"service\": \"$DC\"}" "$ADDR" grpc.health.v1.Health/Check
  jq_true '.status == "SERVING"'
}
check "health SERVING (overall and DatacenterService)" t_health

# --- authentication ---------------------------------------------------------------

header "authentication"
ADMIN=$(ctrlplane token --secret "$DC_SECRET" --subject grpcurl-admin --role system:admin --ttl 1h)
T1=$(ctrlplane token --subject grpcurl-t1 --tenant t1 --ttl 1h) # secret from CP_AUTH_SECRET
T2=$(ctrlplane token --subject grpcurl-t2 --tenant t2 --ttl 1h)

t_token_shape() {
  [[ $ADMIN =~ ^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$ ]] || { echo "not a JWT: $ADMIN"; return 1; }
  [[ $T1 =~ ^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$ ]] || { echo "not a JWT: $T1"; return 1; }
}
check "ctrlplane token prints a JWT" t_token_shape

t_unauthenticated() {
  fails_with Unauthenticated grpcurl -plaintext -d '{}' "$ADDR" "$DC/ListDatacenters"
}
check "no token -> Unauthenticated" t_unauthenticated

t_forged() {
  local other
  other=$(ctrlplane token --secret "$(random_secret)" --subject mallory --role system:admin --ttl 1h)
  fails_with Unauthenticated grpcurl -plaintext -H "authorization: Bearer $other" -d '{}' "$ADDR" "$DC/ListDatacenters"
  fails_with Unauthenticated grpcurl -plaintext -H "authorization: Bearer not-a-jwt" -d '{}' "$ADDR" "$DC/ListDatacenters"
  fails_with Unauthenticated grpcurl -plaintext -H "authorization: Basic abc" -d '{}' "$ADDR" "$DC/ListDatacenters"
}
check "forged / malformed token -> Unauthenticated" t_forged

# --- datacenters ---------------------------------------------------------------------

header "DatacenterService"
t_create() {
  call "$ADMIN" CreateDatacenter '{
    "datacenter": {
      "tenant_id": "t1",
      "name": "Frankfurt 2",
      "provider_name": "process",
      "region": "eu-central",
      "zone": "a",
      "labels": {"env": "staging", "team": "infra"},
      "bootstrap_services": [
        {"name": "log-shipper", "services": [{"name": "vector", "image": "timberio/vector:0.40"}]}
      ]
    }
  }'
  jq_true '.datacenter.id | startswith("dc_")'
  jq_true '.datacenter.slug == "frankfurt-2"'
  jq_true '.datacenter.tenantId == "t1"'
  jq_true '.datacenter.status == "DATACENTER_STATUS_ACTIVE"'
  jq_true '(.datacenter.revision | tonumber) > 0'
  jq_true '.datacenter.labels == {"env": "staging", "team": "infra"}'
  jq_true '.datacenter.bootstrapServices[0].services[0].name == "vector"'
  jq -r .datacenter.id "$OUT" >"$WORK/id"
}
check "CreateDatacenter (admin, for tenant t1)" t_create
ID=$(cat "$WORK/id" 2>/dev/null || echo dc_missing)

t_get() {
  call "$T1" GetDatacenter "{\"id\": \"$ID\"}"
  jq_true ".datacenter.id == \"$ID\" and .datacenter.name == \"Frankfurt 2\""
  call "$ADMIN" GetDatacenterBySlug '{"slug": "frankfurt-2", "tenant_id": "t1"}'
  jq_true ".datacenter.id == \"$ID\""
}
check "GetDatacenter / GetDatacenterBySlug" t_get

t_cross_tenant() {
  fails_with NotFound grpcurl -plaintext -H "authorization: Bearer $T2" -d "{\"id\": \"$ID\"}" "$ADDR" "$DC/GetDatacenter"
}
check "another tenant's datacenter -> NotFound" t_cross_tenant

t_duplicate() {
  fails_with AlreadyExists grpcurl -plaintext -H "authorization: Bearer $T1" \
    -d '{"datacenter": {"name": "Frankfurt 2", "provider_name": "process"}}' "$ADDR" "$DC/CreateDatacenter"
}
check "same slug again in the tenant -> AlreadyExists" t_duplicate

t_list_dcs() {
  call "$T1" CreateDatacenter '{"datacenter": {"name": "Frankfurt 3", "provider_name": "docker", "region": "eu-central"}}'
  call "$T1" ListDatacenters '{"page_size": 1}'
  jq_true '(.datacenters | length) == 1 and .totalSize == 2 and (.nextPageToken | length) > 0'
  jq_true ".datacenters[0].id == \"$ID\""
  local token
  token=$(jq -r .nextPageToken "$OUT")
  call "$T1" ListDatacenters "{\"page_size\": 1, \"page_token\": \"$token\"}"
  jq_true '(.datacenters | length) == 1 and .datacenters[0].name == "Frankfurt 3" and (.nextPageToken // "") == ""'
  call "$T1" ListDatacenters '{"provider_name": "docker"}'
  jq_true '.totalSize == 1 and .datacenters[0].name == "Frankfurt 3"'
  call "$T1" ListDatacenters '{"label_selector": "env=staging,team=infra"}'
  jq_true ".totalSize == 1 and .datacenters[0].id == \"$ID\""
  call "$T2" ListDatacenters '{}'
  jq_true '(.datacenters // []) | map(select(.tenantId == "t1")) | length == 0'
}
check "ListDatacenters: pages, total_size, filters, tenant scope" t_list_dcs

t_update() {
  call "$T1" UpdateDatacenter "{
    \"datacenter\": {\"id\": \"$ID\", \"name\": \"ignored\", \"region\": \"eu-west\", \"labels\": {\"env\": \"prod\"}},
    \"update_mask\": {\"paths\": [\"region\", \"labels\"]}
  }"
  jq_true '.datacenter.region == "eu-west" and .datacenter.labels == {"env": "prod"} and .datacenter.name == "Frankfurt 2"'
  jq_true '(.datacenter.bootstrapServices | length) == 1'
  call "$T1" UpdateDatacenter "{\"datacenter\": {\"id\": \"$ID\"}, \"update_mask\": {\"paths\": [\"bootstrap_services\"]}}"
  jq_true '(.datacenter.bootstrapServices // []) | length == 0'
}
check "UpdateDatacenter with an update mask (empty bootstrap_services clears)" t_update

t_status() {
  call "$T1" SetDatacenterStatus "{\"id\": \"$ID\", \"status\": \"DATACENTER_STATUS_OFFLINE\", \"reason\": \"power work\"}"
  jq_true '.datacenter.status == "DATACENTER_STATUS_OFFLINE"'
  fails_with FailedPrecondition grpcurl -plaintext -H "authorization: Bearer $T1" \
    -d "{\"id\": \"$ID\", \"status\": \"DATACENTER_STATUS_DRAINING\"}" "$ADDR" "$DC/SetDatacenterStatus"
  grep -qi offline "$OUT" && grep -qi draining "$OUT" || { echo "the error should name both statuses"; return 1; }
  call "$T1" SetDatacenterStatus "{\"id\": \"$ID\", \"status\": \"DATACENTER_STATUS_ACTIVE\"}"
  jq_true '.datacenter.status == "DATACENTER_STATUS_ACTIVE"'
}
check "SetDatacenterStatus: allowed and forbidden transitions" t_status

t_invalid() {
  fails_with InvalidArgument grpcurl -plaintext -H "authorization: Bearer $T1" \
    -d '{"datacenter": {"name": "", "provider_name": "", "labels": {"bad key!": "x"}}}' \
    "$ADDR" "$DC/CreateDatacenter"
  contains 'datacenter.name'
  contains 'datacenter.provider_name'
  contains 'datacenter.labels[bad key!]'
}
check "invalid input -> InvalidArgument naming every bad field" t_invalid

t_events() {
  call "$T1" ListDatacenterEvents "{\"datacenter_id\": \"$ID\"}"
  jq_true '[.events[].type] == ["DATACENTER_EVENT_TYPE_CREATED", "DATACENTER_EVENT_TYPE_UPDATED", "DATACENTER_EVENT_TYPE_UPDATED", "DATACENTER_EVENT_TYPE_STATUS_CHANGED", "DATACENTER_EVENT_TYPE_STATUS_CHANGED"]'
  jq_true '[.events[].revision | tonumber] | . == sort and (unique | length) == length'
}
check "ListDatacenterEvents: one event per write, in revision order" t_events

t_watch() {
  # Replays the change log after since_revision, then waits for more; the
  # deadline ends the stream.
  run grpcurl -plaintext -max-time 3 -H "authorization: Bearer $T1" -d '{"since_revision": 1}' \
    "$ADDR" "$DC/WatchDatacenters" || true
  contains 'Code: DeadlineExceeded'
  contains '"DATACENTER_EVENT_TYPE_STATUS_CHANGED"'
  contains "\"$ID\""
}
check "WatchDatacenters streams the change log" t_watch

t_delete() {
  call "$T1" DeleteDatacenter "{\"id\": \"$ID\"}"
  jq_true '.datacenter.status == "DATACENTER_STATUS_DELETING"'
  if run grpcurl -plaintext -H "authorization: Bearer $T1" \
      -d '{"datacenter": {"name": "Frankfurt 2", "provider_name": "process"}}' "$ADDR" "$DC/CreateDatacenter"; then
    echo "re-creating a slug that is being deleted should fail"
    return 1
  fi
  grep -qE 'Code: (AlreadyExists|FailedPrecondition)' "$OUT" || { echo "expected AlreadyExists or FailedPrecondition"; return 1; }
}
check "DeleteDatacenter -> DELETING; re-create while deleting fails" t_delete

# --- restart: graceful stop, data and change log kept ---------------------------------

header "restart"
call "$T1" ListDatacenterEvents '{}' || true
EVENTS_BEFORE=$(jq '.events | length' "$OUT" 2>/dev/null || echo -1)
# Stopped here, not inside a check: the server is this shell's child.
STOP_T0=$SECONDS
kill -TERM "$DC_PID" 2>/dev/null || true
for _ in $(seq 1 75); do kill -0 "$DC_PID" 2>/dev/null || break; sleep 0.2; done
STILL_RUNNING=0
kill -0 "$DC_PID" 2>/dev/null && STILL_RUNNING=1
STOP_RC=0
[ "$STILL_RUNNING" = 1 ] && kill -KILL "$DC_PID" 2>/dev/null
wait "$DC_PID" || STOP_RC=$?
STOP_SECS=$((SECONDS - STOP_T0))
t_sigterm() {
  [ "$STILL_RUNNING" = 0 ] || { echo "server still running 15 s after SIGTERM"; return 1; }
  [ "$STOP_RC" -eq 0 ] || { echo "server exited with status $STOP_RC after SIGTERM"; tail -n 20 "$WORK/server/server.log"; return 1; }
  echo "stopped in ${STOP_SECS} s"
}
check "SIGTERM stops the server cleanly (exit 0)" t_sigterm

env "${UNSET_CP[@]}" CP_LISTEN_ADDR="$ADDR" CP_DATABASE_URL="sqlite://$WORK/server/datacenter.db" \
  CP_AUTH_SECRET="$DC_SECRET" "$CP_BIN_DIR/ctrlplane-datacenter" >>"$WORK/server/server.log" 2>&1 &
DC_PID=$!
RESTARTED=0
wait_serving "$ADDR" "$DC_PID" "$WORK/server/server.log" && RESTARTED=1
t_restart() {
  [ "$RESTARTED" = 1 ] || { echo "the server did not come back on the same database"; return 1; }
  call "$T1" GetDatacenter "{\"id\": \"$ID\"}"
  jq_true '.datacenter.status == "DATACENTER_STATUS_DELETING"'
  call "$T1" ListDatacenterEvents '{}'
  jq_true ".events | length == $EVENTS_BEFORE"
  run grpcurl -plaintext -max-time 2 -H "authorization: Bearer $T1" -d '{"since_revision": 1}' \
    "$ADDR" "$DC/WatchDatacenters" || true
  contains '"DATACENTER_EVENT_TYPE_DELETED"'
}
check "data and change log survive a restart; watch resumes from the log" t_restart

# --- configuration --------------------------------------------------------------

header "configuration"
# One environment often serves several processes: the CLI's CP_TOKEN and
# CP_DATACENTER_ADDR, another tool's CP_* variable. The server must start
# anyway (only unknown *flags* are errors).
t_foreign_env() {
  local dir=$WORK/foreign port pid rc=0
  mkdir -p "$dir"
  port=$(free_port)
  env "${UNSET_CP[@]}" CP_LISTEN_ADDR="127.0.0.1:$port" CP_DATABASE_URL="sqlite://$dir/dc.db" CP_AUTH_SECRET="$DC_SECRET" \
    CP_TOKEN=some-token CP_DATACENTER_ADDR="http://127.0.0.1:$port" CP_SOMETHING_ELSE=1 \
    "$CP_BIN_DIR/ctrlplane-datacenter" >"$dir/server.log" 2>&1 &
  pid=$!
  wait_serving "127.0.0.1:$port" "$pid" "$dir/server.log" || rc=1
  stop_pid "$pid"
  return $rc
}
check "starts with unrelated CP_* variables in the environment (CP_TOKEN, …)" t_foreign_env

t_unknown_flag() {
  if run env "${UNSET_CP[@]}" CP_AUTH_SECRET="$DC_SECRET" "$CP_BIN_DIR/ctrlplane-datacenter" --lisen-addr 127.0.0.1:0; then
    echo "a misspelt flag must be an error"
    return 1
  fi
  contains 'lisen-addr'
}
check "a misspelt flag is an error naming it" t_unknown_flag

t_short_secret() {
  if run env "${UNSET_CP[@]}" CP_AUTH_SECRET=short CP_LISTEN_ADDR=127.0.0.1:0 CP_DATA_DIR="$WORK/short" "$CP_BIN_DIR/ctrlplane-datacenter"; then
    echo "a secret shorter than 32 bytes must be refused"
    return 1
  fi
  contains 'CP_AUTH_SECRET'
  if grep -q 'short' "$OUT" && ! grep -q 'at least 32' "$OUT"; then echo "the secret leaked"; return 1; fi
}
check "a short secret is refused, naming the variable" t_short_secret

echo
if [ "$FAILED" -gt 0 ]; then
  printf 'failed: %s\n' "${FAILED_NAMES[@]}"
fi
printf 'grpcurl: %d passed, %d failed\n' "$PASSED" "$FAILED"
[ "$FAILED" -eq 0 ]
