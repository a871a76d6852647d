#!/usr/bin/env bash
# grpcurl 1.8.6 against a started ctrlplane-datacenter (and a process
# agent), and the README's example blocks run verbatim.
#
#   bash tests/grpcurl/run.sh      (after cargo build --workspace)
#
# Starts target/debug/ctrlplane-datacenter on a free loopback port with a
# temporary SQLite file and a fresh secret, mints tokens with
# target/debug/ctrlplane, starts target/debug/ctrlplane-agent-process on
# another free port through the README's quick-start block (it joins with a
# join token), and checks: the README blocks verbatim; reflection (list,
# describe, google.rpc error details), health; the agent registry (join
# tokens admin-only and single-use, JoinAgent without a bearer token,
# idempotent retries, forged tokens, ListAgents, GetAgent, Heartbeat,
# ResolveProvider, RevokeAgent); every DatacenterService call the README
# shows, incl. "no agent for the provider"; error cases with decoded
# google.rpc.BadRequest details; the process agent's ProviderService
# (system tokens only); that the change log survives a restart; start-up
# with unrelated CP_* variables; and the README's bootstrap blocks:
# ctrlplane-bootstrap with deploy/examples/hooks/rules.json and the Python
# remote hook (deploy/examples/hooks/remote_hook.py, stubs generated with
# the venv's grpcio-tools), a datacenter both hooks match reconciled to
# RUNNING, then deleted, retired and purged with no process left. Ends
# with "grpcurl: N passed, M failed";
# exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
CP_ROOT=$(pwd)
# shellcheck source=tests/lib/common.sh
source tests/lib/common.sh

ensure_python_tools
command -v jq >/dev/null || apt_install jq
for bin in ctrlplane ctrlplane-datacenter ctrlplane-agent-process ctrlplane-agent-docker ctrlplane-bootstrap; do
  [ -x "$CP_BIN_DIR/$bin" ] || die "$CP_BIN_DIR/$bin is missing (cargo build --workspace)"
done
export PATH="$CP_BIN_DIR:$PATH"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ctrlplane-grpcurl.XXXXXX")
# `env` arguments that drop this environment's CP_* variables (such as
# CP_TEST_POSTGRES_URL) for servers started here: each test gives its own.
mapfile -t UNSET_CP < <(without_cp_env)
DC_PID=""
# The process agent the README's quick-start block starts: the bash running
# the block, the agent (its child) and the agent's state directory.
AGENT_SHELL_PID=""
AGENT_PID=""
AGENT_STATE=$WORK/readme/.data/agent-process
# The bootstrap service and the Python remote hook the README's bootstrap
# blocks start, the same way (a bash running the block, its child).
BS_SHELL_PID=""
BS_PID=""
HOOK_SHELL_PID=""
HOOK_PID=""
# The Docker agent for the README's Docker block: its own scope on the
# engine, so only what this run created is swept at the end.
DOCKER_AGENT_PID=""
DOCKER_SCOPE=cpreadme-$$
cleanup() {
  stop_pid "$DOCKER_AGENT_PID"
  sweep_docker_scope "$DOCKER_SCOPE"
  stop_pid "$HOOK_PID"
  stop_pid "$HOOK_SHELL_PID"
  stop_pid "$BS_PID"
  stop_pid "$BS_SHELL_PID"
  stop_pid "$AGENT_PID"
  stop_pid "$AGENT_SHELL_PID"
  # Workloads outlive their agent on purpose (the next start re-adopts
  # them); a test that stopped before Deprovision leaves some: end them.
  kill_workloads_under "$AGENT_STATE"
  stop_pid "$DC_PID"
  rm -rf "$WORK"
}
trap cleanup EXIT
# A timeout or Ctrl-C still cleans up (the EXIT trap runs on these exits).
trap 'exit 130' INT
trap 'exit 143' TERM

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
jq_true() { # jq_true [JQ_OPTION...] FILTER — FILTER over $OUT is true
  jq -e "$@" "$OUT" >/dev/null || { echo "expected jq filter to be true: ${*: -1}"; return 1; }
}
fails_with() { # fails_with CODE CMD... — CMD fails and prints "Code: CODE"
  local code=$1
  shift
  if run "$@"; then echo "expected the call to fail with $code, it succeeded"; return 1; fi
  contains "Code: $code"
}

DC=ctrlplane.datacenter.v1.DatacenterService
AR=ctrlplane.agent.v1.AgentRegistryService
PS=ctrlplane.provider.v1.ProviderService

# --- the server ---------------------------------------------------------------

header "starting ctrlplane-datacenter"
mkdir -p "$WORK/server"
start_datacenter "$WORK/server"
log "serving on $DC_ADDR (pid $DC_PID)"
ADDR=$DC_ADDR
export CP_AUTH_SECRET=$DC_SECRET

call() { # call TOKEN METHOD JSON — grpcurl an authenticated DatacenterService call
  local token=$1 method=$2 data=$3
  run grpcurl -plaintext -H "authorization: Bearer $token" -d "$data" "$ADDR" "$DC/$method"
}
acall() { # acall TOKEN METHOD JSON — the same for AgentRegistryService
  local token=$1 method=$2 data=$3
  run grpcurl -plaintext -H "authorization: Bearer $token" -d "$data" "$ADDR" "$AR/$method"
}

ADMIN=$(ctrlplane token --secret "$DC_SECRET" --subject grpcurl-admin --role system:admin --ttl 1h)
T1=$(ctrlplane token --subject grpcurl-t1 --tenant t1 --ttl 1h) # secret from CP_AUTH_SECRET
T2=$(ctrlplane token --subject grpcurl-t2 --tenant t2 --ttl 1h)
SYSTEM=$(ctrlplane token --subject grpcurl-system --role system:service --ttl 1h)

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

# The README uses the default addresses: the datacenter service on
# localhost:7100, the process agent on 127.0.0.1:7401, the bootstrap
# service on localhost:7200 and the Python remote hook on port 9000
# (`--port 9000`, `127.0.0.1:9000`). The test processes listen on free
# ports; these rewrites are the only changes made to the blocks.
AGENT_ADDR=127.0.0.1:$(free_port)
DOCKER_AGENT_ADDR=127.0.0.1:$(free_port)
BS_ADDR=127.0.0.1:$(free_port)
HOOK_PORT=$(free_port)
rewrite_addrs() {
  sed -e "s/localhost:7100/$ADDR/g" -e "s/127\.0\.0\.1:7100/$ADDR/g" \
    -e "s/localhost:7401/$AGENT_ADDR/g" -e "s/127\.0\.0\.1:7401/$AGENT_ADDR/g" \
    -e "s/localhost:7402/$DOCKER_AGENT_ADDR/g" -e "s/127\.0\.0\.1:7402/$DOCKER_AGENT_ADDR/g" \
    -e "s/localhost:7200/$BS_ADDR/g" -e "s/127\.0\.0\.1:7200/$BS_ADDR/g" \
    -e "s/127\.0\.0\.1:9000/127.0.0.1:$HOOK_PORT/g" -e "s/--port 9000/--port $HOOK_PORT/g"
}

# The README blocks run in $WORK/readme (their $PWD): the agent's state
# directory ($PWD/.data/agent-process) ends up there. A reader runs them in
# the repository's root: the files they use (proto/, deploy/) are copied in
# (copies, not symlinks: `find proto` does not descend a symlink).
mkdir -p "$WORK/readme"
cp -R "$CP_ROOT/proto" "$CP_ROOT/deploy" "$WORK/readme/"

# run_readme_blocks NAME... — runs the named blocks one after the other in
# one bash (as a reader pastes them into one shell) against the started
# server and agent, with errexit on; a block whose name ends in "-errors" is
# made of commands that fail on purpose and runs with errexit off. Output
# goes to $OUT, each block's after a "### <name>" line.
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
    rewrite_addrs <"$WORK/block" >>"$script"
  done
  echo 'echo "### end"' >>"$script"
  echo "--- README blocks $* (addresses rewritten to $ADDR and $AGENT_ADDR):"
  cat "$script"
  # The exit status is that of the last command, which fails on purpose in
  # an -errors block: reaching the end marker is what counts.
  (cd "$WORK/readme" && PS4='+ ' bash -uo pipefail -x "$script") >"$OUT" 2>&1 || true
  grep -qx '### end' "$OUT" || { echo "the README commands stopped at an error (see the output's end)"; return 1; }
}

# section NAME — the output of one block of the last run_readme_blocks.
section() {
  awk -v start="### $1" '$0 == start { on = 1; next } /^### / { on = 0 } on' "$OUT"
}

# bad_request [FILE] — the decoded google.rpc.BadRequest detail grpcurl
# printed ("  1)<TAB>{"@type": …}") as one JSON object per line.
bad_request() {
  grep -F '"@type":"type.googleapis.com/google.rpc.BadRequest"' "${1:-$OUT}" | sed 's/^[^{]*//'
}

# agents_json — ListAgents (admin) as JSON on stdout, "{}" on failure.
agents_json() {
  grpcurl -plaintext -max-time 5 -H "authorization: Bearer $ADMIN" -d '{}' "$ADDR" "$AR/ListAgents" 2>/dev/null || echo '{}'
}

# The quick start's agent block runs in the background like the reader's
# second shell: a bash running the block verbatim, whose last command is
# the agent in the foreground. Only CP_AUTH_SECRET comes from here (the
# reader's CP_AUTH_SECRET_FILE); the block sets the rest.
header "README: the quick start's process agent"
AGENT_STARTED=0
AGENT_START_ERROR=""
start_readme_agent() {
  local i
  readme_block agent-start >"$WORK/block"
  if [ ! -s "$WORK/block" ]; then
    AGENT_START_ERROR="README.md has no block marked <!-- test: agent-start -->"
    return 1
  fi
  { echo "set -e"; rewrite_addrs <"$WORK/block"; } >"$WORK/agent-start.sh"
  log "--- README block agent-start (addresses rewritten to $ADDR and $AGENT_ADDR):"
  cat "$WORK/agent-start.sh" >&2
  (cd "$WORK/readme" && PS4='+ ' exec env "${UNSET_CP[@]}" CP_AUTH_SECRET="$DC_SECRET" \
    bash -uo pipefail -x "$WORK/agent-start.sh") >"$WORK/agent.log" 2>&1 &
  AGENT_SHELL_PID=$!
  if ! wait_serving "$AGENT_ADDR" "$AGENT_SHELL_PID" "$WORK/agent.log"; then
    AGENT_START_ERROR="the agent never served on $AGENT_ADDR"
    return 1
  fi
  AGENT_PID=$(child_pid "$AGENT_SHELL_PID" ctrlplane-agent || true)
  for i in $(seq 1 150); do
    if agents_json | jq -e --arg e "http://$AGENT_ADDR" \
        '[.agents[]? | select(.providerName == "process" and .endpoint == $e)] | length == 1' >/dev/null; then
      AGENT_STARTED=1
      log "process agent pid ${AGENT_PID:-?} on $AGENT_ADDR joined"
      return 0
    fi
    kill -0 "$AGENT_SHELL_PID" 2>/dev/null || break
    sleep 0.2
  done
  AGENT_START_ERROR="the agent on $AGENT_ADDR did not join (ListAgents does not show it)"
  return 1
}
start_readme_agent || log "$AGENT_START_ERROR"

t_readme_agent() {
  echo "--- the agent block's output (log):"
  cat "$WORK/agent.log"
  [ "$AGENT_STARTED" = 1 ] || { echo "$AGENT_START_ERROR"; return 1; }
  [ -n "$AGENT_PID" ] || { echo "no ctrlplane-agent-process child of the block's shell"; return 1; }
  grep -q 'joined the control plane' "$WORK/agent.log" || { echo "the agent did not log its join"; return 1; }
  [ -f "$AGENT_STATE/identity.json" ] || { echo "no identity file at \$CP_STATE_DIR/identity.json"; return 1; }
  agents_json >"$OUT"
  jq_true --arg e "http://$AGENT_ADDR" \
    '.agents[] | select(.endpoint == $e) | .health == "AGENT_HEALTH_HEALTHY" and (.id | startswith("agt_")) and (.capabilities | index("provision"))'
}
check "README quick start: the process agent starts, joins with its join token, is healthy" t_readme_agent

header "README examples (run verbatim)"
readme_grpcurl() {
  run_readme_blocks grpcurl-quickstart grpcurl-agents grpcurl-errors
  section grpcurl-quickstart >"$WORK/quickstart.out"
  grep -qF '"slug": "berlin-1"' "$WORK/quickstart.out" || { echo "CreateDatacenter output missing"; return 1; }
  grep -qF "\"agentEndpoint\": \"http://$AGENT_ADDR\"" "$WORK/quickstart.out" \
    || { echo "ResolveProvider should name the process agent at http://$AGENT_ADDR"; return 1; }
  grep -qF '"DATACENTER_STATUS_MAINTENANCE"' "$WORK/quickstart.out" || { echo "SetDatacenterStatus output missing"; return 1; }
  grep -qF '"DATACENTER_STATUS_DELETING"' "$WORK/quickstart.out" || { echo "DeleteDatacenter output missing"; return 1; }
  section grpcurl-agents >"$WORK/agents.out"
  grep -qE '"agentId": "agt_[0-9a-z]{26}"' "$WORK/agents.out" || { echo "JoinAgent output missing"; return 1; }
  grep -qF '"credential": "' "$WORK/agents.out" || { echo "JoinAgent returns no credential"; return 1; }
  # (7402, the Docker agent's default port, is rewritten like every address.)
  grep -qF "\"endpoint\": \"http://$DOCKER_AGENT_ADDR\"" "$WORK/agents.out" || { echo "ListAgents does not show the docker agent"; return 1; }
  section grpcurl-errors >"$WORK/errors.out"
  [ "$(grep -c '^  Code: ' "$WORK/errors.out")" = 4 ] || { echo "all four error examples must fail"; return 1; }
  grep -qF 'Code: InvalidArgument' "$WORK/errors.out" || { echo "no InvalidArgument"; return 1; }
  grep -qF 'datacenter.name: is required' "$WORK/errors.out" || { echo "message as shown missing"; return 1; }
  grep -qF 'datacenter.labels[bad key!]' "$WORK/errors.out" || { echo "message as shown missing"; return 1; }
  bad_request "$WORK/errors.out" | jq -es 'length == 1 and ([.[0].fieldViolations[].field] == ["datacenter.name", "datacenter.labels[bad key!]"])' >/dev/null \
    || { echo "the decoded google.rpc.BadRequest detail as shown is missing"; return 1; }
  grep -qF 'Code: FailedPrecondition' "$WORK/errors.out" || { echo "no FailedPrecondition"; return 1; }
  grep -qF 'Message: no agent has registered for provider "nomad": start one with a join token (CreateJoinToken) before creating datacenters on it' "$WORK/errors.out" \
    || { echo "message as shown missing"; return 1; }
  grep -qF 'Code: PermissionDenied' "$WORK/errors.out" || { echo "no PermissionDenied"; return 1; }
  grep -qF 'Message: this call needs a system:admin token' "$WORK/errors.out" || { echo "message as shown missing"; return 1; }
  grep -qF 'Code: Unauthenticated' "$WORK/errors.out" || { echo "no Unauthenticated"; return 1; }
  grep -qF 'Message: missing authorization metadata (expected "authorization: Bearer <token>")' "$WORK/errors.out" \
    || { echo "message as shown missing"; return 1; }
}
check "README grpcurl blocks work verbatim" readme_grpcurl

readme_cli() {
  run_readme_blocks cli-quickstart
  contains "http://$AGENT_ADDR"
  contains 'healthy'
  contains 'paris-1'
  contains 'maintenance'
  grep -qiE 'deleting' "$OUT" || { echo "delete output missing"; return 1; }
}
check "README CLI block works verbatim" readme_cli

readme_agent_process() {
  run_readme_blocks agent-process
  contains '"providerName": "process"'
  contains '"strategy:rolling"'
  contains '"providerRef": "process/hello-1"'
  contains '"INSTANCE_STATE_RUNNING"'
  contains '"line": "hi"'
  contains '"existed": true'
  # Deprovision ended the workload's processes.
  local left
  left=$(workloads_under "$AGENT_STATE/instances/hello-1")
  [ -z "$left" ] || { echo "processes of hello-1 still running after Deprovision: $left"; return 1; }
}
check "README process agent block works verbatim (Provision, GetStatus, StreamLogs, Deprovision)" readme_agent_process

# --- README: the Docker agent ---------------------------------------------------

header "README: the Docker agent block (run verbatim against the real engine)"
readme_agent_docker() {
  docker image inspect ctrlplane-testapp:dev >/dev/null 2>&1 ||
    { echo "the image ctrlplane-testapp:dev is missing (deploy/build-images.sh)"; return 1; }
  env "${UNSET_CP[@]}" CP_AUTH_SECRET="$CP_AUTH_SECRET" CP_LISTEN_ADDR="$DOCKER_AGENT_ADDR" \
    CP_DOCKER_SCOPE="$DOCKER_SCOPE" CP_STATE_DIR="$WORK/agent-docker" \
    "$CP_BIN_DIR/ctrlplane-agent-docker" >"$WORK/agent-docker.log" 2>&1 &
  DOCKER_AGENT_PID=$!
  wait_serving "$DOCKER_AGENT_ADDR" "$DOCKER_AGENT_PID" "$WORK/agent-docker.log" ||
    { echo "the Docker agent never served on $DOCKER_AGENT_ADDR"; return 1; }
  run_readme_blocks agent-docker
  contains '"providerRef": "'"$DOCKER_SCOPE"'.web-1"'
  section agent-docker | grep -q '"INSTANCE_STATE_RUNNING"' || { echo "web-1 not RUNNING"; return 1; }
  section agent-docker | grep -q '"readyReplicas": 2' || { echo "not two ready replicas"; return 1; }
  contains "$DOCKER_SCOPE.web-1.web.1 main Up"
  contains "$DOCKER_SCOPE.web-1.migrate.0 init Exited (0)"
  contains '"releaseId": "r2"'
  contains '"line": "migrated"'
  contains '"existed": true'
  local left
  left=$(docker ps -aq --filter "label=ctrlplane.io/scope=$DOCKER_SCOPE")
  [ -z "$left" ] || { echo "containers left after Deprovision: $left"; return 1; }
  [ -z "$(docker network ls -q --filter "label=ctrlplane.io/scope=$DOCKER_SCOPE")" ] ||
    { echo "network left after Deprovision"; return 1; }
}
check "README Docker agent block works verbatim (Provision, status, docker ps, Deploy, logs, Deprovision)" readme_agent_docker

# --- README: bootstrap services with a rule hook and a remote hook ------------

header "README: bootstrap services, rule hooks and a remote hook (run verbatim)"
# start_readme_bg NAME — runs the README block NAME in the background like
# a reader's extra shell (its last command is a server in the foreground),
# with only CP_AUTH_SECRET from here; output to $WORK/NAME.log. Sets BG_PID
# to the pid of the bash running it.
BG_PID=""
start_readme_bg() {
  local name=$1
  readme_block "$name" >"$WORK/block"
  [ -s "$WORK/block" ] || { log "README.md has no block marked <!-- test: $name -->"; return 1; }
  { echo "set -e"; rewrite_addrs <"$WORK/block"; } >"$WORK/$name.sh"
  log "--- README block $name (addresses rewritten):"
  cat "$WORK/$name.sh" >&2
  (cd "$WORK/readme" && PS4='+ ' exec env "${UNSET_CP[@]}" CP_AUTH_SECRET="$DC_SECRET" \
    bash -uo pipefail -x "$WORK/$name.sh") >"$WORK/$name.log" 2>&1 &
  BG_PID=$!
}
BS_START_ERROR="not started"
start_readme_bootstrap() {
  start_readme_bg bootstrap-start || { BS_START_ERROR="no bootstrap-start block"; return 1; }
  BS_SHELL_PID=$BG_PID
  if ! wait_serving "$BS_ADDR" "$BS_SHELL_PID" "$WORK/bootstrap-start.log"; then
    BS_START_ERROR="the bootstrap service never served on $BS_ADDR"
    return 1
  fi
  BS_PID=$(child_pid "$BS_SHELL_PID" ctrlplane-boots || true)
  BS_START_ERROR=""
  log "bootstrap service pid ${BS_PID:-?} on $BS_ADDR"
}
HOOK_START_ERROR="not started"
start_readme_hook() {
  local i
  start_readme_bg hook-start || { HOOK_START_ERROR="no hook-start block"; return 1; }
  HOOK_SHELL_PID=$BG_PID
  for i in $(seq 1 300); do
    if grep -q "listening on 127.0.0.1:$HOOK_PORT" "$WORK/hook-start.log"; then
      HOOK_PID=$(child_pid "$HOOK_SHELL_PID" python || true)
      HOOK_START_ERROR=""
      log "remote hook pid ${HOOK_PID:-?} on 127.0.0.1:$HOOK_PORT"
      return 0
    fi
    kill -0 "$HOOK_SHELL_PID" 2>/dev/null || break
    sleep 0.2
  done
  HOOK_START_ERROR="the Python hook did not start listening on 127.0.0.1:$HOOK_PORT"
  return 1
}
start_readme_bootstrap || log "$BS_START_ERROR"
start_readme_hook || log "$HOOK_START_ERROR"

readme_hooks() {
  echo "--- bootstrap-start block's output:"
  cat "$WORK/bootstrap-start.log"
  echo "--- hook-start block's output:"
  cat "$WORK/hook-start.log"
  [ -z "$BS_START_ERROR" ] || { echo "$BS_START_ERROR"; return 1; }
  [ -z "$HOOK_START_ERROR" ] || { echo "$HOOK_START_ERROR"; return 1; }
  [ "$AGENT_STARTED" = 1 ] || { echo "the README's process agent is not running"; return 1; }
  run_readme_blocks hooks-quickstart
  section hooks-quickstart >"$WORK/hooks.out"
  local want
  for want in \
      '"kind": "HOOK_KIND_REMOTE"' \
      '"kind": "HOOK_KIND_RULE"' \
      '"selector": "provider=process"' \
      '"type": "ACTION_TYPE_PROVISION"' \
      '{"name":"node-agent","source":"node-agent","state":"BOOTSTRAP_STATE_RUNNING"}' \
      '{"name":"log-shipper","source":"log-shipper","state":"BOOTSTRAP_STATE_RUNNING"}' \
      '"DATACENTER_STATUS_DELETING"' \
      '"purged": true' \
      'node agent on oslo-1 (eu-north)' \
      '"DC": "oslo-1"'; do
    grep -qF -- "$want" "$WORK/hooks.out" || { echo "expected the hooks block's output to contain: $want"; return 1; }
  done
  # The cert-manager rule (provider kubernetes) does not match.
  if grep -qF '{"name":"cert-manager"' "$WORK/hooks.out"; then echo "cert-manager should not be installed on a process datacenter"; return 1; fi
  # The CLI's table shows both running.
  grep -qE '^bws_[0-9a-z]{26} +log-shipper +running +log-shipper' "$WORK/hooks.out" || { echo "bootstrap list should show log-shipper running"; return 1; }
  grep -qE '^bws_[0-9a-z]{26} +node-agent +running +node-agent' "$WORK/hooks.out" || { echo "bootstrap list should show node-agent running"; return 1; }
  # Purged: the datacenter is gone, and so are its workloads' processes.
  fails_with NotFound grpcurl -plaintext -H "authorization: Bearer $ADMIN" -d '{"slug": "oslo-1"}' "$ADDR" "$DC/GetDatacenterBySlug"
  local left
  left=$(workloads_under "$AGENT_STATE/instances")
  [ -z "$left" ] || { echo "workload processes still running after the datacenter was purged: $left"; return 1; }
}
check "README bootstrap blocks work verbatim: rules.json + Python remote hook -> node-agent and log-shipper RUNNING; delete -> retired, purged, no process left" readme_hooks

# --- reflection and health ------------------------------------------------------

header "reflection and health (no token)"
t_list() {
  run grpcurl -plaintext "$ADDR" list
  contains "$DC"
  contains "$AR"
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

t_describe_registry() {
  run grpcurl -plaintext "$ADDR" describe "$AR"
  local m
  for m in CreateJoinToken JoinAgent Heartbeat ListAgents GetAgent RevokeAgent CheckAgents; do
    contains "rpc $m ("
  done
}
check "describe AgentRegistryService" t_describe_registry

t_describe_error_details() {
  # Served so that clients (grpcurl among them) decode error details.
  run grpcurl -plaintext "$ADDR" describe google.rpc.BadRequest
  contains 'google.rpc.BadRequest is a message:'
  contains 'repeated .google.rpc.BadRequest.FieldViolation field_violations = 1;'
}
check "reflection serves google/rpc/error_details.proto (google.rpc.BadRequest)" t_describe_error_details

t_health() {
  run grpcurl -plaintext "$ADDR" grpc.health.v1.Health/Check
  jq_true '.status == "SERVING"'
  run grpcurl -plaintext -d "{\"service\": \"$DC\"}" "$ADDR" grpc.health.v1.Health/Check
  jq_true '.status == "SERVING"'
}
check "health SERVING (overall and DatacenterService)" t_health

# --- authentication ---------------------------------------------------------------

header "authentication"

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

# --- the agent registry -------------------------------------------------------------

header "AgentRegistryService"

# join_body TOKEN PROVIDER KEY [ENDPOINT] — a JoinAgent request. Nothing
# listens at the default endpoint (port 9, "discard"): these agents are
# registry entries only.
join_body() {
  jq -nc --arg t "$1" --arg p "$2" --arg k "$3" --arg e "${4:-http://127.0.0.1:9}" \
    '{token: $t, provider_name: $p, endpoint: $e, version: "grpcurl-test", capabilities: ["provision", "logs"], idempotency_key: $k}'
}
# join TOKEN PROVIDER KEY [ENDPOINT] — JoinAgent without an authorization
# header, output in $OUT.
join() {
  run grpcurl -plaintext -d "$(join_body "$@")" "$ADDR" "$AR/JoinAgent"
}
# mint PROVIDER [MAX_USES] — a join token (admin), printed.
mint() {
  grpcurl -plaintext -H "authorization: Bearer $ADMIN" \
    -d "{\"provider_name\": \"$1\", \"ttl\": \"600s\", \"max_uses\": ${2:-1}}" "$ADDR" "$AR/CreateJoinToken" | jq -er .token
}
# A datacenter of tenant t3 (created by the admin) on PROVIDER.
create_dc_on() { # create_dc_on NAME PROVIDER
  call "$ADMIN" CreateDatacenter "{\"datacenter\": {\"tenant_id\": \"t3\", \"name\": \"$1\", \"provider_name\": \"$2\"}}"
}

t_join_token_admin_only() {
  fails_with PermissionDenied grpcurl -plaintext -H "authorization: Bearer $T1" -d '{"provider_name": "docker"}' "$ADDR" "$AR/CreateJoinToken"
  contains 'system:admin'
  fails_with PermissionDenied grpcurl -plaintext -H "authorization: Bearer $SYSTEM" -d '{"provider_name": "docker"}' "$ADDR" "$AR/CreateJoinToken"
  fails_with Unauthenticated grpcurl -plaintext -d '{"provider_name": "docker"}' "$ADDR" "$AR/CreateJoinToken"
  acall "$ADMIN" CreateJoinToken '{"provider_name": "docker", "ttl": "600s"}'
  jq_true '.token | test("^jtk_[0-9a-z]{26}\\.[A-Za-z0-9_-]{20,}$")'
  jq_true '.joinToken.id == (.token | split(".")[0]) and .joinToken.providerName == "docker" and .joinToken.maxUses == 1 and (.joinToken.uses // 0) == 0'
  jq -r .token "$OUT" >"$WORK/docker-token"
}
check "CreateJoinToken: system:admin only (tenant, service -> PermissionDenied; none -> Unauthenticated)" t_join_token_admin_only
DOCKER_TOKEN=$(cat "$WORK/docker-token" 2>/dev/null || echo jtk_missing.x)

t_join_without_bearer() {
  join "$DOCKER_TOKEN" docker grpcurl-docker-1 http://127.0.0.1:7499
  jq_true '.agentId | test("^agt_[0-9a-z]{26}$")'
  jq_true '.credential | test("^[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]+$")'
  jq_true '.heartbeatInterval | test("^[0-9.]+s$")'
  jq -r .agentId "$OUT" >"$WORK/docker-agent"
  jq -r .credential "$OUT" >"$WORK/docker-credential"
}
check "JoinAgent with a join token and no authorization header" t_join_without_bearer
DOCKER_AGENT=$(cat "$WORK/docker-agent" 2>/dev/null || echo agt_missing)
DOCKER_CREDENTIAL=$(cat "$WORK/docker-credential" 2>/dev/null || echo missing)

t_join_retry() {
  join "$DOCKER_TOKEN" docker grpcurl-docker-1 http://127.0.0.1:7499
  jq_true ".agentId == \"$DOCKER_AGENT\""
}
check "JoinAgent retried with the same idempotency key -> the same agent" t_join_retry

t_join_reuse() {
  fails_with PermissionDenied grpcurl -plaintext -d "$(join_body "$DOCKER_TOKEN" docker grpcurl-docker-2)" "$ADDR" "$AR/JoinAgent"
  contains 'no uses left'
}
check "a single-use join token used again (another key) -> PermissionDenied" t_join_reuse

t_join_forged() {
  local id=${DOCKER_TOKEN%%.*}
  fails_with Unauthenticated grpcurl -plaintext -d "$(join_body "$id.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" docker forged-1)" "$ADDR" "$AR/JoinAgent"
  contains 'invalid join token'
  fails_with Unauthenticated grpcurl -plaintext -d "$(join_body "not-a-join-token" docker forged-2)" "$ADDR" "$AR/JoinAgent"
  fails_with Unauthenticated grpcurl -plaintext -d "$(join_body "jtk_01h455vb4pex5vsknk084sn02q.secret" docker forged-3)" "$ADDR" "$AR/JoinAgent"
  # A bearer token (even an admin's) is not a join token.
  fails_with Unauthenticated grpcurl -plaintext -d "$(join_body "$ADMIN" docker forged-4)" "$ADDR" "$AR/JoinAgent"
}
check "a forged or unknown join token -> Unauthenticated" t_join_forged

t_join_invalid() {
  local token
  token=$(mint docker)
  fails_with InvalidArgument grpcurl -plaintext -d "$(join_body "$token" "Not A Label" bad-1 "ftp://x")" "$ADDR" "$AR/JoinAgent"
  bad_request | jq -es '[.[0].fieldViolations[].field] | index("provider_name") and index("endpoint")' >/dev/null \
    || { echo "expected decoded field violations for provider_name and endpoint"; return 1; }
  # A token for docker does not admit a process agent.
  fails_with PermissionDenied grpcurl -plaintext -d "$(join_body "$token" process bad-2)" "$ADDR" "$AR/JoinAgent"
  contains 'docker'
}
check "JoinAgent: bad fields -> InvalidArgument (decoded); another provider -> PermissionDenied" t_join_invalid

t_join_multi_use() {
  local token
  token=$(mint process 2)
  join "$token" process grpcurl-process-1
  join "$token" process grpcurl-process-2
  fails_with PermissionDenied grpcurl -plaintext -d "$(join_body "$token" process grpcurl-process-3)" "$ADDR" "$AR/JoinAgent"
}
check "a join token with max_uses 2 admits two agents, not three" t_join_multi_use

t_list_agents() {
  acall "$ADMIN" ListAgents '{"provider_name": "docker"}'
  jq_true ".agents | map(select(.id == \"$DOCKER_AGENT\")) | length == 1"
  jq_true ".agents[] | select(.id == \"$DOCKER_AGENT\") | .providerName == \"docker\" and .endpoint == \"http://127.0.0.1:7499\" and .version == \"grpcurl-test\" and .capabilities == [\"provision\", \"logs\"] and .health == \"AGENT_HEALTH_HEALTHY\""
  jq_true 'all(.agents[]; .providerName == "docker")'
  acall "$ADMIN" ListAgents '{"page_size": 1}'
  jq_true '(.agents | length) == 1 and (.nextPageToken | length) > 0'
  acall "$ADMIN" GetAgent "{\"id\": \"$DOCKER_AGENT\"}"
  jq_true ".agent.id == \"$DOCKER_AGENT\""
  fails_with PermissionDenied grpcurl -plaintext -H "authorization: Bearer $T1" -d '{}' "$ADDR" "$AR/ListAgents"
  fails_with NotFound grpcurl -plaintext -H "authorization: Bearer $ADMIN" -d '{"id": "agt_01h455vb4pex5vsknk084sn02q"}' "$ADDR" "$AR/GetAgent"
}
check "ListAgents / GetAgent show the agent (admin only)" t_list_agents

t_heartbeat() {
  acall "$DOCKER_CREDENTIAL" Heartbeat "{\"agent_id\": \"$DOCKER_AGENT\"}"
  jq_true '.leaseExpireTime | length > 0'
  # Only the agent's own credential.
  fails_with PermissionDenied grpcurl -plaintext -H "authorization: Bearer $ADMIN" -d "{\"agent_id\": \"$DOCKER_AGENT\"}" "$ADDR" "$AR/Heartbeat"
}
check "Heartbeat with the agent's credential (not with another token)" t_heartbeat

t_resolve() {
  local token agent credential dc
  token=$(mint resolve-test)
  join "$token" resolve-test grpcurl-resolve-1 http://127.0.0.1:7498
  agent=$(jq -r .agentId "$OUT")
  credential=$(jq -r .credential "$OUT")
  create_dc_on "Resolve 1" resolve-test
  dc=$(jq -r .datacenter.id "$OUT")
  acall "$credential" Heartbeat "{\"agent_id\": \"$agent\"}" # a fresh lease
  call "$T3" ResolveProvider "{\"datacenter_id\": \"$dc\"}"
  jq_true ".providerName == \"resolve-test\" and .agentId == \"$agent\" and .agentEndpoint == \"http://127.0.0.1:7498\""
}
T3=$(ctrlplane token --subject grpcurl-t3 --tenant t3 --ttl 1h)
check "ResolveProvider returns the provider's joined agent" t_resolve

t_revoke() {
  local token agent credential dc
  token=$(mint revoke-test)
  join "$token" revoke-test grpcurl-revoke-1
  agent=$(jq -r .agentId "$OUT")
  credential=$(jq -r .credential "$OUT")
  create_dc_on "Revoke 1" revoke-test
  dc=$(jq -r .datacenter.id "$OUT")
  fails_with PermissionDenied grpcurl -plaintext -H "authorization: Bearer $T3" -d "{\"id\": \"$agent\"}" "$ADDR" "$AR/RevokeAgent"
  acall "$ADMIN" RevokeAgent "{\"id\": \"$agent\"}"
  jq_true ".agent.id == \"$agent\" and .agent.health == \"AGENT_HEALTH_REVOKED\""
  # Its credential stops working at once; its join cannot be replayed.
  fails_with Unauthenticated grpcurl -plaintext -H "authorization: Bearer $credential" -d "{\"agent_id\": \"$agent\"}" "$ADDR" "$AR/Heartbeat"
  fails_with Unauthenticated grpcurl -plaintext -d "$(join_body "$token" revoke-test grpcurl-revoke-1)" "$ADDR" "$AR/JoinAgent"
  # Nothing serves the provider any more.
  fails_with Unavailable grpcurl -plaintext -H "authorization: Bearer $T3" -d "{\"datacenter_id\": \"$dc\"}" "$ADDR" "$DC/ResolveProvider"
  fails_with FailedPrecondition grpcurl -plaintext -H "authorization: Bearer $T3" \
    -d '{"datacenter": {"name": "Revoke 2", "provider_name": "revoke-test"}}' "$ADDR" "$DC/CreateDatacenter"
  contains 'no agent has registered for provider "revoke-test"'
  acall "$ADMIN" GetAgent "{\"id\": \"$agent\"}"
  jq_true '.agent.health == "AGENT_HEALTH_REVOKED"'
}
check "RevokeAgent: credential refused, join not replayable, provider unresolvable" t_revoke

t_unregistered_provider() {
  fails_with FailedPrecondition grpcurl -plaintext -H "authorization: Bearer $T1" \
    -d '{"datacenter": {"name": "Kube 1", "provider_name": "kubernetes"}}' "$ADDR" "$DC/CreateDatacenter"
  contains 'no agent has registered for provider "kubernetes"'
  # Moving a datacenter to such a provider fails the same way.
  create_dc_on "Move Me" docker
  local dc
  dc=$(jq -r .datacenter.id "$OUT")
  fails_with FailedPrecondition grpcurl -plaintext -H "authorization: Bearer $T3" \
    -d "{\"datacenter\": {\"id\": \"$dc\", \"provider_name\": \"kubernetes\"}, \"update_mask\": {\"paths\": [\"provider_name\"]}}" \
    "$ADDR" "$DC/UpdateDatacenter"
  contains '"kubernetes"'
}
check "CreateDatacenter / UpdateDatacenter onto a provider without an agent -> FailedPrecondition naming it" t_unregistered_provider

t_provider_service_auth() {
  [ "$AGENT_STARTED" = 1 ] || { echo "the README's process agent is not running"; return 1; }
  run grpcurl -plaintext -H "authorization: Bearer $SYSTEM" "$AGENT_ADDR" "$PS/CheckHealth"
  fails_with PermissionDenied grpcurl -plaintext -H "authorization: Bearer $T1" "$AGENT_ADDR" "$PS/GetInfo"
  fails_with Unauthenticated grpcurl -plaintext "$AGENT_ADDR" "$PS/GetInfo"
  acall "$ADMIN" CheckAgents '{}'
  jq_true --arg e "http://$AGENT_ADDR" '.agents[] | select(.endpoint == $e) | .health == "AGENT_HEALTH_HEALTHY" and (.lastCheckedAt | length) > 0'
  jq_true ".agents[] | select(.id == \"$DOCKER_AGENT\") | .health == \"AGENT_HEALTH_UNHEALTHY\" and (.lastError | length) > 0"
}
check "the process agent: ProviderService takes system tokens only; CheckAgents probes it healthy" t_provider_service_auth

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
  # grpcurl decodes the google.rpc.BadRequest detail (reflection serves its
  # proto): one violation per bad field, each with a description.
  contains '"@type":"type.googleapis.com/google.rpc.BadRequest"'
  bad_request >"$WORK/bad.json"
  jq -es 'length == 1' "$WORK/bad.json" >/dev/null || { echo "expected exactly one BadRequest detail"; return 1; }
  jq -e '[.fieldViolations[].field] | sort == (["datacenter.labels[bad key!]", "datacenter.name", "datacenter.provider_name"] | sort)' "$WORK/bad.json" >/dev/null \
    || { echo "expected field violations for exactly datacenter.name, .provider_name, .labels[bad key!]"; cat "$WORK/bad.json"; return 1; }
  jq -e 'all(.fieldViolations[]; (.description | length) > 0)' "$WORK/bad.json" >/dev/null \
    || { echo "every violation needs a description"; return 1; }
}
check "invalid input -> InvalidArgument naming every bad field, decoded google.rpc.BadRequest details" t_invalid

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
# CP_DATACENTER_ADDR, the tests' CP_TEST_POSTGRES_URL, another tool's CP_*
# variable. The server must start anyway (only unknown *flags* are errors).
t_foreign_env() {
  local dir=$WORK/foreign port pid rc=0
  mkdir -p "$dir"
  port=$(free_port)
  env "${UNSET_CP[@]}" CP_LISTEN_ADDR="127.0.0.1:$port" CP_DATABASE_URL="sqlite://$dir/dc.db" CP_AUTH_SECRET="$DC_SECRET" \
    CP_TOKEN=some-token CP_DATACENTER_ADDR="http://127.0.0.1:$port" CP_SOMETHING_ELSE=1 \
    CP_TEST_POSTGRES_URL="postgres://nobody@127.0.0.1:1/none" \
    "$CP_BIN_DIR/ctrlplane-datacenter" >"$dir/server.log" 2>&1 &
  pid=$!
  wait_serving "127.0.0.1:$port" "$pid" "$dir/server.log" || rc=1
  stop_pid "$pid"
  return $rc
}
check "starts with unrelated CP_* variables in the environment (CP_TOKEN, CP_TEST_POSTGRES_URL, …)" t_foreign_env

# The same without the clean-environment workaround: everything this script
# has (under tests/run.sh that includes the real CP_TEST_POSTGRES_URL and
# CP_AUTH_SECRET) plus a CLI token, as when a user starts the server from
# the shell the README's examples ran in. Its log goes to a file, so it must
# have no colour codes.
t_inherited_env() {
  local dir=$WORK/inherited port pid rc=0
  mkdir -p "$dir"
  port=$(free_port)
  env CP_TOKEN="$T1" CP_TEST_POSTGRES_URL="${CP_TEST_POSTGRES_URL:-postgres://nobody@127.0.0.1:1/none}" \
    CP_LISTEN_ADDR="127.0.0.1:$port" CP_DATABASE_URL="sqlite://$dir/dc.db" CP_AUTH_SECRET="$DC_SECRET" \
    "$CP_BIN_DIR/ctrlplane-datacenter" >"$dir/server.log" 2>&1 &
  pid=$!
  wait_serving "127.0.0.1:$port" "$pid" "$dir/server.log" || rc=1
  stop_pid "$pid"
  [ $rc -eq 0 ] || return 1
  if grep -q $'\x1b' "$dir/server.log"; then
    echo "the log written to a file has ANSI escape codes:"
    grep -m 3 $'\x1b' "$dir/server.log" | cat -v
    return 1
  fi
  grep -q 'serving gRPC' "$dir/server.log" || { echo "no 'serving gRPC' line in the log"; cat "$dir/server.log"; return 1; }
}
check "starts with this shell's whole environment plus CP_TOKEN and CP_TEST_POSTGRES_URL; plain log" t_inherited_env

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
