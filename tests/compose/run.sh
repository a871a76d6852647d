#!/usr/bin/env bash
# End to end with Docker Compose: the README's "Run with Docker Compose"
# blocks, run verbatim, and what they should have done, checked on the
# Docker engine.
#
#   bash tests/compose/run.sh
#
# Needs Docker and Compose (`docker compose`, or Compose v1's
# `docker-compose`: then a `docker` shim first on PATH maps
# `docker compose …` to `docker-compose …` and passes everything else to
# the real docker), a Rust toolchain (the README's first block runs
# deploy/build-images.sh, quick when the images are up to date), grpcurl
# (from the venv tests/run.sh makes, installed here when missing), jq and
# curl.
#
# The stack runs as its own compose project (COMPOSE_PROJECT_NAME), on free
# loopback ports (CP_*_PORT; the README's localhost:7100 and localhost:7200
# are rewritten to them: the only change made to the blocks), with a fresh
# CP_AUTH_SECRET and its own Docker agent scope (CP_DOCKER_SCOPE), so its
# workloads are told apart from any other agent's. The phases:
#   1. compose-build: deploy/build-images.sh;
#   2. compose-up: `docker compose up -d` (must neither build nor pull: the
#      containers run the local ctrlplane:dev), the admin token; then every
#      service healthy and the Docker agent joined by itself;
#   3. compose-datacenter: a datacenter on the provider docker with two
#      bootstrap services (web, ticker) on ctrlplane-testapp:dev; both reach
#      RUNNING, each with a running container carrying the agent's labels;
#   4. compose-inspect: ListBootstrapWorkloads, the CLI in the image,
#      docker ps, and web answering HTTP on its endpoint;
#   5. compose-update: web's env changed -> a new web container with the new
#      env, the old one stopped or gone, ticker's container untouched;
#   6. ticker removed from the datacenter -> its containers and network go;
#   7. compose-down: DeleteDatacenter, purge, `docker compose down -v`;
#      nothing of the project (containers, networks, volumes) and no
#      workload object of the agent's scope is left.
# Every wait polls against a deadline; a failed phase prints the compose
# logs and the last state, and the rest are skipped. The exit trap always
# takes the stack down (`down -v`) and removes the scope's leftovers. Ends
# with the timings and "compose: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/../.."
CP_ROOT=$(pwd)
# shellcheck source=tests/lib/common.sh
source tests/lib/common.sh

ensure_python_tools
command -v jq >/dev/null || apt_install jq
command -v curl >/dev/null || apt_install curl
command -v docker >/dev/null || die "docker is missing"
docker info >/dev/null 2>&1 || die "no Docker engine answers"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ctrlplane-compose.XXXXXX")

# Compose v2 is `docker compose`; with only Compose v1 here, a shim makes the
# README's `docker compose …` work unchanged.
if ! docker compose version >/dev/null 2>&1; then
  command -v docker-compose >/dev/null || die "neither \`docker compose\` nor docker-compose is installed"
  mkdir -p "$WORK/bin"
  cat >"$WORK/bin/docker" <<EOF
#!/usr/bin/env bash
# \`docker compose …\` -> \`docker-compose …\`; anything else -> the real docker.
if [ "\${1:-}" = compose ]; then
  shift
  exec docker-compose "\$@"
fi
exec $(command -v docker) "\$@"
EOF
  chmod +x "$WORK/bin/docker"
  PATH="$WORK/bin:$PATH"
  log "Compose v1 ($(docker-compose version --short)): \`docker compose\` is a shim for docker-compose"
fi
export PATH

# This run's settings, and no other CP_* variable of this environment (a
# CP_DOCKER_HOST, CP_LOG or CP_TOKEN of the caller must not reach compose).
for v in $(compgen -e); do
  case $v in CP_*) unset "$v" ;; esac
done
SUFFIX=$(printf '%s%04x' "$$" "$RANDOM")
export COMPOSE_PROJECT_NAME="cpcompose$SUFFIX"
export CP_DOCKER_SCOPE="cpcompose-$SUFFIX"
CP_AUTH_SECRET=$(random_secret)
export CP_AUTH_SECRET
# four_ports — four distinct free loopback ports.
four_ports() {
  local ports=() p
  while [ ${#ports[@]} -lt 4 ]; do
    p=$(free_port)
    case " ${ports[*]} " in *" $p "*) ;; *) ports+=("$p") ;; esac
  done
  echo "${ports[@]}"
}
read -r DC_PORT BS_PORT SCHED_PORT AGENT_PORT < <(four_ports)
export CP_DATACENTER_PORT=$DC_PORT CP_BOOTSTRAP_PORT=$BS_PORT \
  CP_SCHEDULER_PORT=$SCHED_PORT CP_AGENT_DOCKER_PORT=$AGENT_PORT
DC_ADDR=127.0.0.1:$DC_PORT
BS_ADDR=127.0.0.1:$BS_PORT
log "project $COMPOSE_PROJECT_NAME, agent scope $CP_DOCKER_SCOPE, ports $DC_PORT $BS_PORT $SCHED_PORT $AGENT_PORT"

DCS=ctrlplane.datacenter.v1.DatacenterService
BSS=ctrlplane.bootstrap.v1.BootstrapService
AR=ctrlplane.agent.v1.AgentRegistryService
# The README blocks' shell variables carried from one block to the next (as
# when a reader pastes them into one shell).
STATE=$WORK/state.sh
ADMIN="" # the README's CP_TOKEN, once compose-up ran
DC_ID="" # the README's DC_ID, once compose-datacenter ran
STACK_UP=0
WEB_ID=""
TICKER_ID=""
WEB_CONTAINER=""
TICKER_CONTAINER=""

scope_filter=(--filter "label=ctrlplane.io/scope=$CP_DOCKER_SCOPE")
project_filter=(--filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")

# --- clean-up -------------------------------------------------------------------

# remove_scope_leftovers — every container, network and volume of this run's
# agent scope, removed by force.
remove_scope_leftovers() {
  local ids
  ids=$(docker ps -aq "${scope_filter[@]}")
  [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
  ids=$(docker network ls -q "${scope_filter[@]}")
  [ -z "$ids" ] || docker network rm $ids >/dev/null 2>&1 || true
  ids=$(docker volume ls -q "${scope_filter[@]}")
  [ -z "$ids" ] || docker volume rm -f $ids >/dev/null 2>&1 || true
}

cleanup() {
  local rc=$?
  if [ "$STACK_UP" = 1 ]; then
    # The workloads first, the way the README says (the datacenter deleted
    # while its agent still runs), for at most 60 s.
    if [ -n "$DC_ID" ] && [ -n "$ADMIN" ]; then
      grpcurl -plaintext -max-time 5 -H "authorization: Bearer $ADMIN" -d "{\"id\": \"$DC_ID\"}" \
        "$DC_ADDR" "$DCS/DeleteDatacenter" >/dev/null 2>&1 || true
      for _ in $(seq 1 60); do
        [ -z "$(docker ps -aq "${scope_filter[@]}")" ] && break
        sleep 1
      done
    fi
    docker compose down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  remove_scope_leftovers
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the README's blocks ----------------------------------------------------------

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

rewrite_addrs() {
  sed -e "s/localhost:7100/$DC_ADDR/g" -e "s/localhost:7200/$BS_ADDR/g"
}

# run_block NAME — runs the README block NAME verbatim (addresses rewritten)
# in the repository's root with errexit, in a bash that starts with the
# variables the earlier blocks set and saves them for the next. Its output
# (traced) goes to $WORK/NAME.out and is printed.
run_block() {
  local name=$1 script=$WORK/$1.sh rc=0
  readme_block "$name" >"$WORK/block"
  [ -s "$WORK/block" ] || { echo "README.md has no block marked <!-- test: $name -->"; return 1; }
  {
    echo "set -e"
    echo "[ ! -f '$STATE' ] || source '$STATE'"
    echo "echo '### $name'"
    rewrite_addrs <"$WORK/block"
    echo "declare -p CP_TOKEN DC_ID PORT >'$STATE' 2>/dev/null || true"
    echo "echo '### end'"
  } >"$script"
  echo "--- README block $name (localhost:7100 -> $DC_ADDR, localhost:7200 -> $BS_ADDR):"
  rewrite_addrs <"$WORK/block" | sed 's/^/    /'
  (PS4='+ ' timeout 600 bash -uo pipefail -x "$script") >"$WORK/$name.out" 2>&1 || rc=$?
  echo "--- its output:"
  sed 's/^/    | /' "$WORK/$name.out"
  grep -qx '### end' "$WORK/$name.out" || { echo "the block stopped at an error (exit $rc)"; return 1; }
  # The variables it set, for the checks below.
  ADMIN=$(bash -c "source '$STATE' 2>/dev/null; printf '%s' \"\${CP_TOKEN:-}\"")
  DC_ID=$(bash -c "source '$STATE' 2>/dev/null; printf '%s' \"\${DC_ID:-}\"")
}

# --- helpers ----------------------------------------------------------------------

LAST=$WORK/last.txt # what the last poll saw, shown when a wait times out

# wait_for SECONDS DESCRIPTION CMD... — polls CMD every second until it
# succeeds; fails with DESCRIPTION and the last thing CMD printed after
# SECONDS.
wait_for() {
  local secs=$1 desc=$2 t0=$SECONDS
  shift 2
  while true; do
    if "$@" >"$LAST" 2>&1; then
      echo "    $desc: after $((SECONDS - t0)) s"
      return 0
    fi
    if [ $((SECONDS - t0)) -ge "$secs" ]; then
      echo "timed out after $secs s waiting for: $desc; last seen:"
      sed 's/^/    | /' "$LAST"
      return 1
    fi
    sleep 1
  done
}

# workloads — ListBootstrapWorkloads of the datacenter as JSON (also kept in
# $WORK/workloads.json for the diagnostics).
workloads() {
  grpcurl -plaintext -max-time 5 -H "authorization: Bearer $ADMIN" -d "{\"datacenter_id\": \"$DC_ID\"}" \
    "$BS_ADDR" "$BSS/ListBootstrapWorkloads" | tee "$WORK/workloads.json"
}

# instance_of NAME — the instance id (bws_…) of the datacenter's bootstrap
# workload NAME, from the last workloads call.
instance_of() {
  jq -r --arg n "$1" '[.workloads[]? | select(.name == $n) | .id][0] // empty' "$WORK/workloads.json"
}

# containers [FILTER...] — ids of the running containers of this run's
# agent scope matching the filters.
containers() {
  docker ps -q "${scope_filter[@]}" "$@"
}

container_env() { # container_env ID — its environment, one VAR=value a line
  docker inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$1"
}

# --- phases ------------------------------------------------------------------------

PASSED=0
FAILED=0
TIMINGS=()
T_START=$SECONDS

diagnostics() {
  echo "=== docker compose ps"
  docker compose ps 2>&1 | sed 's/^/    /' || true
  echo "=== docker compose logs (last 150 lines per service)"
  docker compose logs --no-color --tail=150 2>&1 | sed 's/^/    /' || true
  echo "=== containers of scope $CP_DOCKER_SCOPE"
  docker ps -a "${scope_filter[@]}" --format '    {{.ID}} {{.Names}} {{.Status}} {{.Labels}}' || true
  if [ -s "$WORK/workloads.json" ]; then
    echo "=== last ListBootstrapWorkloads"
    jq -c '.workloads[]? | {name, id, state, attempts, lastError, services: [.services[]? | {name, env}]}' \
      "$WORK/workloads.json" | sed 's/^/    /' || true
  fi
}

# phase NAME FUNCTION — one phase; a failure shows the diagnostics and ends
# the run (later phases depend on it).
# Each runs in a subshell with errexit (so any failing command fails it);
# the variables later phases and the clean-up need are saved on its exit
# and read back here.
PHASE_VARS=(ADMIN DC_ID STACK_UP WEB_ID TICKER_ID WEB_CONTAINER TICKER_CONTAINER)
phase() {
  local name=$1 t0=$SECONDS rc
  shift
  header "$name"
  set +e
  (
    trap 'for v in "${PHASE_VARS[@]}"; do printf "%s=%q\n" "$v" "${!v}"; done >"$WORK/vars.sh"' EXIT
    set -e
    "$@"
  )
  rc=$?
  set -e
  # shellcheck disable=SC1091
  [ ! -f "$WORK/vars.sh" ] || source "$WORK/vars.sh"
  TIMINGS+=("$(printf '%5d s  %s' "$((SECONDS - t0))" "$name")")
  if [ "$rc" -eq 0 ]; then
    PASSED=$((PASSED + 1))
    printf '  PASS  %s (%d s)\n' "$name" "$((SECONDS - t0))"
  else
    FAILED=$((FAILED + 1))
    printf '  FAIL  %s (%d s)\n' "$name" "$((SECONDS - t0))"
    diagnostics
    finish
  fi
}

finish() {
  echo
  echo "timings:"
  printf '  %s\n' "${TIMINGS[@]}"
  printf '  %5d s  total\n' "$((SECONDS - T_START))"
  printf 'compose: %d passed, %d failed\n' "$PASSED" "$FAILED"
  [ "$FAILED" -eq 0 ] && exit 0
  exit 1
}

# 1. Images.
p_build() {
  run_block compose-build
  docker image inspect ctrlplane:dev ctrlplane-testapp:dev >/dev/null
}
phase "README compose-build: deploy/build-images.sh" p_build

# 2. The stack.
all_healthy() {
  local svc id status ok=0
  for svc in datacenter bootstrap scheduler agent-docker; do
    id=$(docker compose ps -q "$svc")
    if [ -z "$id" ]; then
      echo "$svc: no container"
      ok=1
      continue
    fi
    status=$(docker inspect --format '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id")
    echo "$svc: $status"
    [ "$status" = "running healthy" ] || ok=1
  done
  return $ok
}
agent_joined() {
  grpcurl -plaintext -max-time 5 -H "authorization: Bearer $ADMIN" -d '{"provider_name": "docker"}' \
    "$DC_ADDR" "$AR/ListAgents" | tee /dev/stderr \
    | jq -e '[.agents[]? | select(.endpoint == "http://agent-docker:7402" and .health == "AGENT_HEALTH_HEALTHY")] | length == 1' >/dev/null
}
p_up() {
  STACK_UP=1
  run_block compose-up
  [ -n "$ADMIN" ] || { echo "the block set no CP_TOKEN"; return 1; }
  if grep -qE '^(\+ )?(Building|Pulling)|Step [0-9]+/' "$WORK/compose-up.out"; then
    echo "docker compose up built or pulled an image; it must use the local ctrlplane:dev"
    return 1
  fi
  wait_for 120 "all four services running and healthy" all_healthy
  sed 's/^/      /' "$LAST"
  local image id svc
  image=$(docker image inspect --format '{{.Id}}' ctrlplane:dev)
  for svc in datacenter bootstrap scheduler agent-docker; do
    id=$(docker compose ps -q "$svc")
    [ "$(docker inspect --format '{{.Image}}' "$id")" = "$image" ] \
      || { echo "$svc does not run the local ctrlplane:dev ($image)"; return 1; }
  done
  wait_for 60 "the Docker agent joined by itself (ListAgents: provider docker, healthy)" agent_joined
}
phase "README compose-up: up -d, admin token; all healthy, the agent joined" p_up

# 3. A datacenter on the provider docker.
both_running() {
  workloads | jq -e '[.workloads[]? | select(.state == "BOOTSTRAP_STATE_RUNNING") | .name] | sort == ["ticker", "web"]' >/dev/null \
    || { jq -c '.workloads[]? | {name, state, lastError}' "$WORK/workloads.json"; return 1; }
  local name id n
  for name in web ticker; do
    id=$(instance_of "$name")
    n=$(containers --filter "label=ctrlplane.io/instance=$id" | wc -l)
    echo "$name ($id): $n running container(s)"
    [ "$n" -eq 1 ] || return 1
  done
}
p_datacenter() {
  run_block compose-datacenter
  [[ $DC_ID == dc_* ]] || { echo "the block set no DC_ID (got '$DC_ID')"; return 1; }
  wait_for 120 "web and ticker RUNNING, one container each" both_running
  WEB_ID=$(instance_of web)
  TICKER_ID=$(instance_of ticker)
  WEB_CONTAINER=$(containers --filter "label=ctrlplane.io/instance=$WEB_ID")
  TICKER_CONTAINER=$(containers --filter "label=ctrlplane.io/instance=$TICKER_ID")
  # The labels the agent puts on every container.
  local labels
  labels=$(docker inspect --format '{{json .Config.Labels}}' "$WEB_CONTAINER")
  echo "    web's labels: $labels"
  jq -e --arg id "$WEB_ID" --arg scope "$CP_DOCKER_SCOPE" '
    .["ctrlplane.io/instance"] == $id and .["ctrlplane.io/service"] == "web"
    and .["ctrlplane.io/role"] != null and .["ctrlplane.io/replica"] != null
    and has("ctrlplane.io/tenant")
    and .["ctrlplane.io/agent"] == "ctrlplane-agent-docker"
    and .["ctrlplane.io/managed-by"] == "bootstrap"
    and .["ctrlplane.io/scope"] == $scope' <<<"$labels" >/dev/null \
    || { echo "web's container lacks the agent's labels"; return 1; }
  [ "$(docker inspect --format '{{.Config.Image}}' "$WEB_CONTAINER")" = ctrlplane-testapp:dev ] \
    || { echo "web does not run ctrlplane-testapp:dev"; return 1; }
  container_env "$WEB_CONTAINER" | grep -qx 'GREETING=hello' || { echo "web lacks GREETING=hello"; return 1; }
}
phase "README compose-datacenter: web and ticker running as containers" p_datacenter

# 4. Looking at it.
p_inspect() {
  run_block compose-inspect
  local out=$WORK/compose-inspect.out
  grep -q 'BOOTSTRAP_STATE_RUNNING' "$out" || { echo "ListBootstrapWorkloads shows nothing running"; return 1; }
  # The CLI's table: web and ticker, running.
  grep -qE '^bws_[^ ]+ +web +running' "$out" && grep -qE '^bws_[^ ]+ +ticker +running' "$out" \
    || { echo "\`ctrlplane bootstrap list\` does not show web and ticker running"; return 1; }
  grep -q "ctrlplane-testapp:dev" "$out" || { echo "docker ps shows no workload container"; return 1; }
  # curl's "ok" (the trace of the next command may follow it on its line).
  grep -qE '^ok(\+ echo)?$' "$out" || { echo "web did not answer ok over HTTP"; return 1; }
}
phase "README compose-inspect: bootstrap list, docker ps, web answers HTTP" p_inspect

# 5. web's env changes: a new container replaces the old one.
web_updated() {
  workloads >/dev/null
  local id ids c
  id=$(instance_of web)
  jq -e '[.workloads[]? | select(.name == "web" and .state == "BOOTSTRAP_STATE_RUNNING")
          | .services[0].env.GREETING] == ["bonjour"]' "$WORK/workloads.json" >/dev/null \
    || { echo "web is not RUNNING with GREETING=bonjour yet:"; jq -c '.workloads[]? | select(.name == "web") | {id, state, lastError}' "$WORK/workloads.json"; return 1; }
  # The old container is gone or stopped (the agent may keep the previous
  # release's container, stopped, for a rollback).
  if [ "$(docker inspect --format '{{.State.Running}}' "$WEB_CONTAINER" 2>/dev/null)" = true ]; then
    echo "the old web container $WEB_CONTAINER still runs"
    return 1
  fi
  ids=$(containers --filter "label=ctrlplane.io/instance=$id")
  [ "$(wc -w <<<"$ids")" -eq 1 ] || { echo "web ($id) has containers: ${ids:-none}"; return 1; }
  c=$ids
  container_env "$c" | grep -qx 'GREETING=bonjour' || { echo "web's container $c lacks GREETING=bonjour"; return 1; }
  echo "web ($id) runs in $c"
}
p_update() {
  run_block compose-update
  wait_for 120 "web's container replaced by one with GREETING=bonjour" web_updated
  WEB_ID=$(instance_of web)
  WEB_CONTAINER=$(containers --filter "label=ctrlplane.io/instance=$WEB_ID")
  [ "$(containers --filter "label=ctrlplane.io/instance=$TICKER_ID")" = "$TICKER_CONTAINER" ] \
    || { echo "ticker's container changed too (it should be untouched)"; return 1; }
}
phase "README compose-update: web recreated with the new env (old one stopped), ticker untouched" p_update

# 6. ticker removed.
ticker_gone() {
  workloads | jq -e '[.workloads[]?.name] == ["web"]' >/dev/null \
    || { echo "workloads: $(jq -c '[.workloads[]? | {name, state}]' "$WORK/workloads.json")"; return 1; }
  local left
  left=$(docker ps -aq "${scope_filter[@]}" --filter "label=ctrlplane.io/instance=$TICKER_ID")
  [ -z "$left" ] || { echo "ticker's containers are still there: $left"; return 1; }
  left=$(docker network ls -q "${scope_filter[@]}" --filter "label=ctrlplane.io/instance=$TICKER_ID")
  [ -z "$left" ] || { echo "ticker's network is still there: $left"; return 1; }
}
p_remove() {
  jq -n --arg id "$DC_ID" '{
    datacenter: {id: $id, bootstrap_services: [
      {name: "web", services: [{name: "web", image: "ctrlplane-testapp:dev",
        args: ["serve"], ports: [{container: 8080}], env: {GREETING: "bonjour"}}]}
    ]},
    update_mask: {paths: ["bootstrap_services"]}
  }' | grpcurl -plaintext -max-time 10 -H "authorization: Bearer $ADMIN" -d @ "$DC_ADDR" "$DCS/UpdateDatacenter" >/dev/null
  wait_for 120 "ticker retired: no row, no container, no network" ticker_gone
  [ "$(containers --filter "label=ctrlplane.io/instance=$WEB_ID")" = "$WEB_CONTAINER" ] \
    || { echo "web's container changed (it should be untouched)"; return 1; }
}
phase "ticker removed from the datacenter: its container and network go" p_remove

# 7. Delete and take down.
nothing_left() {
  local kind left rc=0
  for kind in container network volume; do
    case $kind in
      container) left=$(docker ps -a --format '{{.Names}}' "${project_filter[@]}"; docker ps -a --format '{{.Names}}' "${scope_filter[@]}") ;;
      network) left=$(docker network ls --format '{{.Name}}' "${project_filter[@]}"; docker network ls --format '{{.Name}}' "${scope_filter[@]}") ;;
      volume) left=$(docker volume ls --format '{{.Name}}' "${project_filter[@]}"; docker volume ls --format '{{.Name}}' "${scope_filter[@]}") ;;
    esac
    if [ -n "$left" ]; then
      echo "${kind}s left: $(tr '\n' ' ' <<<"$left")"
      rc=1
    fi
  done
  return $rc
}
p_down() {
  run_block compose-down
  STACK_UP=0
  # The purge came after every workload object was removed; down -v removed
  # the project's containers, network and volumes.
  wait_for 30 "no container, network or volume of the project or of the agent's scope" nothing_left
}
phase "README compose-down: delete, purge, down -v; nothing left" p_down

finish
