"""`admit calibrate --backend URL`: measure a running vLLM server and fit the token engine's step-time model.

A designed set of requests, one experiment at a time, each with a prompt of its own (a nonce first, so the
prefix cache never serves it):

* **prefill** — one request alone, prompt of P tokens, ``max_tokens=1``, streamed: its TTFT is one engine
  step that computes the whole prompt (N = P tokens, one sequence, P·(P+1)/2 attention pairs) plus the
  request's own overhead (HTTP, tokenising, scheduling), which the fit estimates separately;
* **decode** — B requests sent together, prompts of C tokens, ``ignore_eos``: once every prompt is in, each
  step decodes B tokens reading the B contexts; the time between a stream's tokens in the middle half of
  the steps where all B decode together (after the last first token, before the first last one) is that
  step's duration (N = S = B, K = the contexts' sum at that point). A batch whose requests went in too far
  apart for that (a busy client machine) is sent again.

The per-point medians are fitted with :func:`admit.engine.calibration.fit_measured`. The output JSON holds
the server's version, the samples, the fit, and each sample's error; the `cpu-smollm2` preset's
coefficients are that file's fit (engine/presets.py, checked by tests/engine/test_steptime.py).
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import statistics
import threading
import time
import urllib.request
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from admit.core import metrics_page
from admit.engine.calibration import StepSample, fit_measured, predict_sample
from admit.live.stack import wait_idle

WORD = " hello"  # one token in SmolLM2's (and most BPE) vocabularies; the count is read back from usage
PREFILL_TOKENS = (16, 64, 128, 256, 512, 768, 1024, 1536)
DECODE_BATCHES = (1, 2, 4, 8)
DECODE_CONTEXTS = (32, 384, 1024)
DECODE_TOKENS = 96


class Backend:
    """A vLLM server's OpenAI completions endpoint, streamed, timed at the client."""

    def __init__(self, url: str, model: str | None, timeout_s: float = 600.0) -> None:
        base = url.rstrip("/").removesuffix("/v1")
        parts = urlsplit(base)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"--backend must be an http:// URL of a vLLM server, got {url!r}")
        self.base, self.host, self.port = base, parts.hostname, parts.port or 80
        self.timeout_s = timeout_s
        with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
            models = [m["id"] for m in json.loads(r.read())["data"]]
        if model is not None and model not in models:
            raise ValueError(f"the server serves {models}, not {model!r}")
        self.model = model or models[0]
        try:
            with urllib.request.urlopen(base + "/version", timeout=10) as r:
                self.version = str(json.loads(r.read()).get("version"))
        except OSError:
            self.version = "unknown"

    def stream(self, prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
        """One streamed completion with a unique prompt; the send time, each token event's time and usage."""
        prompt = f"r{secrets.token_hex(4)}:" + WORD * prompt_tokens
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens,
                           "ignore_eos": True, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"the server answered {resp.status}: {resp.read()[:300]!r}")
            times: list[float] = []
            usage: dict[str, Any] = {}
            while line := resp.fp.readline():
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    usage = event["usage"]
                if event.get("choices"):
                    times.append(time.perf_counter())
        finally:
            conn.close()
        if not usage or usage.get("completion_tokens") != max_tokens:
            raise RuntimeError(f"expected {max_tokens} tokens and a usage event, got {usage or 'no usage'}")
        return {"t0": t0, "times": times, "prompt_tokens": int(usage["prompt_tokens"]),
                "output_tokens": int(usage["completion_tokens"])}

    def engine(self, max_num_seqs: int, max_num_batched_tokens: int) -> dict[str, Any]:
        """What the simulator's preset needs of the server: KV blocks and block size (``cache_config_info``),
        max_model_len (/v1/models), and the scheduler limits it was started with (not in /metrics: given)."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            info = metrics_page.samples(r.read().decode(), (metrics_page.CACHE_INFO,))
        if not info:
            raise RuntimeError(f"the server's /metrics has no {metrics_page.CACHE_INFO} (is it vLLM?)")
        labels = info[0].labels
        with urllib.request.urlopen(self.base + "/v1/models", timeout=10) as r:
            card = next(m for m in json.loads(r.read())["data"] if m["id"] == self.model)
        blocks, block = int(labels["num_gpu_blocks"]), int(labels["block_size"])
        return {"device": cpu_name(), "model": f"{self.model} on vLLM {self.version}", "num_gpu_blocks": blocks,
                "block_size": block, "kv_bytes_per_token": (1 << 30) // (blocks * block),  # as if 1 GiB: shown only
                "max_model_len": int(card.get("max_model_len") or 2048), "max_num_seqs": max_num_seqs,
                "max_num_batched_tokens": max_num_batched_tokens}


def cpu_name() -> str:
    """``2-core AMD EPYC (AVX2, no native bf16)``: what the fit was measured on."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((x.split(":", 1)[1].strip() for x in text.splitlines() if x.startswith("model name")), "unknown CPU")
    flags = set(next((x.split(":", 1)[1].split() for x in text.splitlines() if x.startswith("flags")), []))
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    bf16 = "native bf16" if flags & {"avx512_bf16", "amx_bf16"} else "no native bf16"
    return f"{os.cpu_count()}-core {model} ({isa}, {bf16})"


def prefill_sample(backend: Backend, tokens: int, reps: int) -> tuple[StepSample, list[float]]:
    ttfts, prompt = [], tokens
    for _ in range(reps):
        got = backend.stream(tokens, 1)
        ttfts.append(got["times"][0] - got["t0"])
        prompt = got["prompt_tokens"]
    sample = StepSample("prefill", prompt, 1, 0.0, prompt * (prompt + 1) / 2, statistics.median(ttfts))
    return sample, ttfts


MIN_WINDOW_STEPS = 8  # a decode sample needs at least this many tokens per stream while all B decode together
DECODE_TRIES = 3  # a batch whose streams overlap too little (a loaded client started them apart) is sent again


def decode_window(runs: list[dict[str, Any]]) -> tuple[list[float], float] | None:
    """The steps in which every stream of one batch decodes: after the last first token (every prompt is in)
    and up to the first stream's last token (none has finished). Per stream, the mean time between its tokens
    in the middle half of that window, and the contexts' sum at its middle; None when the window holds fewer
    than `MIN_WINDOW_STEPS` tokens of some stream (its prompts went in too far apart to time a B-wide step)."""
    start = max(r["times"][0] for r in runs)
    end = min(r["times"][-1] for r in runs)
    gaps, kv = [], 0.0
    for r in runs:
        inside = [i for i, t in enumerate(r["times"]) if start < t <= end]
        if len(inside) < 2 * MIN_WINDOW_STEPS:
            return None
        lo, hi = inside[len(inside) // 4], inside[(3 * len(inside)) // 4]
        gaps.append((r["times"][hi] - r["times"][lo]) / (hi - lo))
        kv += r["prompt_tokens"] + (lo + hi) / 2
    return gaps, kv


def send_batch(backend: Backend, batch: int, context: int, tokens: int) -> list[dict[str, Any]]:
    """``batch`` streamed requests released together (a barrier); each one's timings."""
    results: list[dict[str, Any] | BaseException] = [RuntimeError("not run")] * batch
    start = threading.Barrier(batch)

    def one(i: int) -> None:
        try:
            start.wait()
            results[i] = backend.stream(context, tokens)
        except BaseException as exc:  # reported below, with the others' results
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = [r for r in results if isinstance(r, dict)]
    if len(runs) != batch:
        raise RuntimeError(f"decode batch {batch}: {next(r for r in results if not isinstance(r, dict))}")
    if any(len(r["times"]) != tokens for r in runs):
        raise RuntimeError("the server merged tokens into fewer stream events; cannot time its steps")
    return runs


def decode_sample(backend: Backend, batch: int, context: int, tokens: int) -> tuple[StepSample, dict[str, Any]]:
    for _ in range(DECODE_TRIES):
        got = decode_window(send_batch(backend, batch, context, tokens))
        if got is not None:
            gaps, kv = got
            return StepSample("decode", batch, batch, kv, 0.0, statistics.median(gaps)), {"per_request_s": gaps}
    raise RuntimeError(f"decode batch {batch}: in {DECODE_TRIES} tries its {batch} requests never decoded together "
                       f"for {2 * MIN_WINDOW_STEPS} tokens (their prompts went in too far apart: is this machine or "
                       "the server busy with other work?)")


def calibrate(url: str, model: str | None = None, reps: int = 3, quick: bool = False, echo: Any = print,
              max_num_seqs: int = 8, max_num_batched_tokens: int = 2048) -> dict[str, Any]:
    """Run the designed requests against ``url`` and fit; the JSON-ready result (see the module docstring)."""
    backend = Backend(url, model)
    engine = backend.engine(max_num_seqs, max_num_batched_tokens)
    wait_idle(url, 120)  # calibrate an idle server: the samples time one designed load at a time
    prefills = (16, 128, 512, 1024) if quick else PREFILL_TOKENS
    batches = (1, 4, 8) if quick else DECODE_BATCHES
    contexts = (32, 384) if quick else DECODE_CONTEXTS
    backend.stream(32, 8)  # warm-up: the first request after start pays one-off costs
    samples: list[StepSample] = []
    raw: list[dict[str, Any]] = []
    for p in prefills:
        s, ttfts = prefill_sample(backend, p, reps)
        samples.append(s)
        raw.append({"kind": "prefill", "prompt_tokens": s.tokens, "ttft_s": [round(x, 5) for x in ttfts]})
        echo(f"prefill {s.tokens:5d} tokens: TTFT median {1000 * s.seconds:8.1f} ms")
    for c in contexts:
        for b in batches:
            s, extra = decode_sample(backend, b, c, DECODE_TOKENS)
            samples.append(s)
            raw.append({"kind": "decode", "batch": b, "context": c,
                        "per_request_s": [round(x, 6) for x in extra["per_request_s"]]})
            echo(f"decode batch {b} context {c:5d}: step {1000 * s.seconds:7.2f} ms")
    model_fit, req_s = fit_measured(samples)
    errors = [predict_sample(model_fit, s, req_s) / s.seconds - 1 for s in samples]
    return {
        "server": {"version": backend.version, "model": backend.model},
        "engine": engine,
        "measured": datetime.now(UTC).strftime("%Y-%m-%d"),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "design": {"reps": reps, "quick": quick, "prefill_tokens": list(prefills), "decode_batches": list(batches),
                   "decode_contexts": list(contexts), "decode_tokens": DECODE_TOKENS},
        "samples": [asdict(s) for s in samples],
        "raw": raw,
        "fit": asdict(model_fit),
        "request_overhead_s": req_s,
        "relative_errors": [round(e, 4) for e in errors],
        "max_abs_relative_error": round(max(abs(e) for e in errors), 4),
        "median_abs_relative_error": round(statistics.median(abs(e) for e in errors), 4),
    }
