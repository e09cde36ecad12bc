"""How much CPU the gateway gets beside a real vLLM engine that is decoding: the measurement behind
scripts/server_common.sh starting servers in the caller's session rather than a new one (setsid).

It starts a gateway (one tenant, limit 1) in front of ADMIT_VLLM_URL, sends 4 long streamed requests (one runs
in vLLM, three wait in the gateway), and prints each second how long the gateway's main thread ran and how
long it waited for a CPU (/proc/PID/schedstat), with the tenant's queue depth. Run it beside vLLM in a session
whose autogroup is at nice 19, as a low-priority test run would be:

    setsid bash -c 'echo 19 > /proc/self/autogroup; exec scripts/vllm_server.sh run \\
        .venv/bin/python benchmarks/gateway_cpu_share.py --seconds 12'

Linux only (schedstat, autogroup); writing /proc/self/autogroup needs no privilege for one's own session.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import yaml

MODEL = "smollm2-135m-instruct"
ADMIN = "bench-admin-token-0123456789"


def schedstat(pid: int) -> tuple[float, float]:
    run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(run) / 1e9, int(wait) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=12, help="seconds to watch (default 12)")
    ap.add_argument("--max-tokens", type=int, default=1984, help="tokens each held request asks for")
    args = ap.parse_args()
    url = os.environ.get("ADMIT_VLLM_URL", "").rstrip("/")
    if not url:
        sys.exit("ADMIT_VLLM_URL is unset: run this beside vLLM (scripts/vllm_server.sh run ...)")
    tmp = Path(tempfile.mkdtemp(prefix="gw-cpu-share-"))
    cfg = {"admin": {"token_env": "ADMIT_BENCH_ADMIN_TOKEN"}, "request_log": str(tmp / "requests.jsonl"),
           "tenants": [{"name": "solo", "api_keys": ["sk-solo-bench-key"], "limit": 1, "max_queue": 64,
                        "queue_timeout_s": 600}],
           "telemetry": {"nvml": False, "scrape_interval_s": 0.2, "stale_after_s": 10, "window_s": 600}}
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(cfg))
    gw = subprocess.Popen([sys.executable, "-m", "admit.gateway", "--backend", url.removesuffix("/v1"), "--config",
                           str(tmp / "tenants.yaml"), "--port", "0"], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "ADMIT_BENCH_ADMIN_TOKEN": ADMIN})
    try:
        assert gw.stdout is not None
        line = gw.stdout.readline()
        if not line.startswith("listening on "):
            sys.exit(f"the gateway did not start: {line!r}")
        base = "http://" + line.split()[-1]

        def queued() -> int:
            req = urllib.request.Request(base + "/admin/state", headers={"Authorization": f"Bearer {ADMIN}"})
            with urllib.request.urlopen(req, timeout=600) as r:
                return int(json.loads(r.read())["tenants"]["solo"]["queue_depth"])

        client = openai.OpenAI(base_url=base + "/v1", api_key="sk-solo-bench-key", max_retries=0, timeout=600)
        stop = threading.Event()

        def one(i: int) -> int:
            s = client.completions.create(model=MODEL, prompt=f"Request {i}: tell a story.", stream=True,
                                          max_tokens=args.max_tokens, extra_body={"ignore_eos": True})
            n = 0
            for _ in s:
                n += 1
                if stop.is_set():
                    break
            s.close()
            return n

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(one, i) for i in range(4)]
            ran0, wait0 = schedstat(gw.pid)
            t0 = time.monotonic()
            print("span_s  gateway_ran_s  gateway_waited_for_cpu_s  queued")
            for _ in range(args.seconds):
                time.sleep(1.0)  # a reporting interval; each line covers the time since the last one
                depth = queued()
                ran, wait = schedstat(gw.pid)
                t = time.monotonic()
                print(f"{t - t0:6.1f}  {ran - ran0:13.3f}  {wait - wait0:24.3f}  {depth:6d}", flush=True)
                ran0, wait0, t0 = ran, wait, t
            stop.set()
            for f in futures:
                f.result()
    finally:
        gw.terminate()
        gw.wait(30)


if __name__ == "__main__":
    main()
