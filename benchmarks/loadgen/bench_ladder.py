"""Side-by-side load-generator benchmark: the mock server on one core, each generator on another.

For each rate of the ladder, every tool still in the race runs one stage against
``admit.loadgen.mockserver`` (fixed TTFT, whole stream written at once when ``--itl-ms 0``), one tool after
the other, so that all tools at one rate see the machine in the same state. Tools:

* ``admit``: this checkout (``admit.loadgen.cli run``), one worker per client core;
* ``admit-base``: the same command run from another source tree (``--baseline-src``, e.g. an export of an
  older commit) for before/after figures in the same run;
* ``inference-perf`` and ``guidellm``: the peers, each from its own throwaway virtualenv
  (``--inference-perf-venv``, ``--guidellm-venv``), offline, with a local tokenizer (``--tokenizer``).

Per stage it records, from the server: requests received and the achieved rate
``received / max(duration, last arrival - first arrival)`` (the same definition as admit's own); from the
tool's report: its send lag (admit ``send_lag``, inference-perf ``schedule_delay``, guidellm
``request_dispatch_delay``) and TTFT, whose median minus the server's known TTFT is the latency bias; and
the generator's CPU: the whole process tree (``/proc``, children included), in total and while requests
were arriving at the server (the steady-state cost, start-up excluded), per 1,000 requests.

``--nice -10`` runs the server and the generators at a higher scheduling priority, so that other
work on a shared machine delays them less (all tools alike); ``--rt 1`` runs them under SCHED_FIFO,
ahead of every normal process (use briefly: it takes the cores from other users' work).

A tool leaves the ladder after a stage where it clearly fell behind (achieved < 90 % of asked or
send-lag p99 > 1 s). Usage (repository root)::

    python benchmarks/loadgen/bench_ladder.py --tools admit,admit-base,inference-perf,guidellm \\
        --rates 100,200,500,1000,2000,3000,4000,6000,8000 --duration 10 --ttft-ms 5 --itl-ms 0 \\
        --baseline-src /tmp/lg-baseline --inference-perf-venv /tmp/peer-iperf312 \\
        --guidellm-venv /tmp/peer-guidellm --tokenizer /tmp/peer-tok --out runs/bench_loadgen
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

PROMPT, OUTPUT = 32, 16
CLK_TCK = os.sysconf("SC_CLK_TCK")
POLL_S = 0.1


NICE = 0  # --nice: scheduling priority of the server and the generators (negative needs root)
RT = 0  # --rt: SCHED_FIFO priority instead (needs root; the kernel's RT throttle keeps 5 % for others)


def pinned(cmd: list[str], cpu: str | None) -> list[str]:
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpu, *cmd]
    if RT:
        return ["chrt", "-f", str(RT), *cmd]
    return ["nice", "-n", str(NICE), *cmd] if NICE else cmd


def start_server(cpu: str | None, ttft_ms: float, itl_ms: float) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "admit.loadgen.mockserver", "--port", "0", "--ttft-ms", str(ttft_ms)]
    proc = subprocess.Popen(pinned([*cmd, "--itl-ms", str(itl_ms)], cpu), stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""  # the server prints one line once it listens
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, "http://" + line.split()[-1]


def server_stats(url: str, reset: bool = False) -> dict[str, int]:
    with urllib.request.urlopen(url + ("/stats?reset" if reset else "/stats"), timeout=10) as r:
        return json.loads(r.read())


def tree_cpu_s(root: int) -> float:
    """utime+stime (+ reaped children's) of ``root`` and all its live descendants, from /proc."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)] = int(fields[1])
        ticks[int(d)] = sum(int(x) for x in fields[11:15])
    total, todo = 0, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total / CLK_TCK


def run_tool(
    cmd: list[str], env: dict[str, str], url: str, timeout_s: float, cwd: Path | None = None
) -> dict[str, Any]:
    """Run one stage; sample the tree's CPU meanwhile; return CPU figures and the server's view."""
    server_stats(url, reset=True)
    samples: list[tuple[int, float]] = []
    t_start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.monotonic_ns(), tree_cpu_s(proc.pid)))
            stop.wait(POLL_S)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        _, err = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        timed_out = True
    stop.set()
    th.join()
    before = resource_children()
    total_cpu = before - run_tool.children_cpu  # type: ignore[attr-defined]
    run_tool.children_cpu = before  # type: ignore[attr-defined]
    st = server_stats(url)

    def cpu_at(t: int) -> float:  # linear interpolation of the sampled CPU series
        prev = samples[0]
        for s in samples:
            if s[0] >= t:
                span = s[0] - prev[0]
                return prev[1] if span <= 0 else prev[1] + (s[1] - prev[1]) * (t - prev[0]) / span
            prev = s
        return samples[-1][1]

    steady = None
    if samples and st["requests"] > 1 and st["last_ns"] > st["first_ns"]:
        steady = (cpu_at(st["last_ns"]) - cpu_at(st["first_ns"])) / (st["requests"] - 1) * 1000
    return {
        "rc": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(time.monotonic() - t_start, 1),
        "stderr_tail": (err or "")[-600:],
        "received": st["requests"],
        "streams_done": st["streams_done"],
        "span_s": (st["last_ns"] - st["first_ns"]) / 1e9 if st["requests"] else 0.0,
        "cpu_s_total": round(total_cpu, 2),
        "cpu_s_per_1k_total": round(total_cpu / max(st["requests"], 1) * 1000, 3),
        "cpu_s_per_1k_steady": None if steady is None else round(steady, 3),
    }


def resource_children() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


run_tool.children_cpu = 0.0  # type: ignore[attr-defined]


# -- tools --------------------------------------------------------------------------------------------
def admit_stage(args: argparse.Namespace, url: str, rate: float, out: Path, src: str | None) -> dict[str, Any]:
    cmd = [sys.executable, "-c", "from admit.loadgen.cli import app; app()", "run", "--url", url, "--model", "mock"]
    cmd += ["--duration", str(args.duration), "--workers", str(args.workers), "--no-plot", "--out", str(out)]
    cmd += ["--tenant", f"name=a,rate={rate / 2},arrival=poisson,prompt={PROMPT},output={OUTPUT}"]
    cmd += ["--tenant", f"name=b,rate={rate / 2},arrival=poisson,prompt={PROMPT},output={OUTPUT}"]
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    # run outside the checkout: with ``-c``/``-m`` the working directory comes first on sys.path, and the
    # checkout's own admit/ would shadow the tree named by PYTHONPATH
    out.mkdir(parents=True, exist_ok=True)
    row = run_tool(pinned(cmd, args.client_cpu), env, url, args.duration + 120, cwd=out)
    row["admit_source"] = src or "checkout"
    try:
        s = json.loads((out / "stage_0.json").read_text())
    except (OSError, ValueError):
        return row
    load, lat = s["load_summary"], s["latency"]
    row.update(
        tool_achieved=load["achieved_rate"],
        lag_p50_ms=load["send_lag"]["p50"],
        lag_p99_ms=load["send_lag"]["p99"],
        ttft_p50_ms=lat["time_to_first_token"]["p50"],
        ttft_p99_ms=lat["time_to_first_token"]["p99"],
        completed=s["requests"]["completed"],
        failed=s["requests"]["failed"],
    )
    return row


def iperf_stage(args: argparse.Namespace, url: str, rate: float, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    cfg = {
        "api": {"type": "completion", "streaming": True},
        "data": {
            "type": "random",
            "input_distribution": {"min": PROMPT, "max": PROMPT, "mean": PROMPT, "std_dev": 0, "type": "fixed"},
            "output_distribution": {"min": OUTPUT, "max": OUTPUT, "mean": OUTPUT, "std_dev": 0, "type": "fixed"},
        },
        "load": {
            "type": "poisson",
            "stages": [{"rate": rate, "duration": int(args.duration)}],
            "num_workers": args.workers,
        },
        "server": {"type": "vllm", "model_name": "mock", "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": args.tokenizer},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "use_server_output_tokens": True}},
        "storage": {"local_storage": {"path": str(out / "report")}},
    }
    (out / "cfg.json").write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    cmd = [str(Path(args.inference_perf_venv) / "bin" / "inference-perf"), "-c", str(out / "cfg.json")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    row = run_tool(pinned(cmd, args.client_cpu), env, url, args.duration * 12 + 120)
    try:
        s = json.loads((out / "report" / "stage_0_lifecycle_metrics.json").read_text())
    except (OSError, ValueError):
        return row
    load, ok = s["load_summary"], s["successes"]
    row.update(
        tool_achieved=load["achieved_rate"],
        lag_p50_ms=load["schedule_delay"]["median"] * 1e3,
        lag_p99_ms=load["schedule_delay"]["p99"] * 1e3,
        ttft_p50_ms=ok["latency"]["time_to_first_token"]["median"] * 1e3,
        ttft_p99_ms=ok["latency"]["time_to_first_token"]["p99"] * 1e3,
        completed=ok["count"],
        failed=s["failures"]["count"],
    )
    return row


def guidellm_stage(args: argparse.Namespace, url: str, rate: float, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(Path(args.guidellm_venv) / "bin" / "guidellm"), "run"]
    cmd += ["--backend", f"kind=openai_http,target={url},model=mock,request_format=/v1/completions"]
    cmd += ["--data", f"kind=synthetic_text,prompt_tokens={PROMPT},output_tokens={OUTPUT}"]
    cmd += ["--tokenizer", f"kind=huggingface_auto,model={args.tokenizer}"]
    cmd += ["--profile", f"kind=poisson,rate={rate:g}", "--constraint", f"kind=max_duration,seconds={args.duration:g}"]
    cmd += ["--output", f"kind=json,path={out / 'out.json'}", "--disable-progress"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    row = run_tool(pinned(cmd, args.client_cpu), env, url, args.duration * 12 + 180)
    try:
        m = json.loads((out / "out.json").read_text())["benchmarks"][0]["metrics"]
    except (OSError, ValueError, KeyError, IndexError):
        return row

    def pct(name: str, q: str) -> float:
        return m[name]["successful"]["percentiles"][q]

    totals = m["request_totals"]
    row.update(
        lag_p50_ms=pct("request_dispatch_delay", "p50") * 1e3,
        lag_p99_ms=pct("request_dispatch_delay", "p99") * 1e3,
        ttft_p50_ms=pct("time_to_first_token_ms", "p50"),
        ttft_p99_ms=pct("time_to_first_token_ms", "p99"),
        completed=totals.get("successful"),
        failed=totals.get("errored"),
        cancelled=totals.get("cancelled"),
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", default="admit")
    ap.add_argument("--rates", default="100,200,500,1000,2000,3000,4000,6000,8000")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--workers", type=int, default=1, help="generator processes (one per client core)")
    ap.add_argument("--baseline-src", default=None, help="source tree for admit-base (holds admit/loadgen)")
    ap.add_argument("--inference-perf-venv", default="/tmp/peer-iperf312")
    ap.add_argument("--guidellm-venv", default="/tmp/peer-guidellm")
    ap.add_argument("--tokenizer", default="/tmp/peer-tok", help="local tokenizer directory for the peers")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_loadgen"))
    ap.add_argument("--nice", type=int, default=0, help="nice value for server and generators (e.g. -10)")
    ap.add_argument("--rt", type=int, default=0, help="SCHED_FIFO priority for server and generators (e.g. 1)")
    args = ap.parse_args()
    args.out = args.out.resolve()
    global NICE, RT
    NICE, RT = args.nice, args.rt
    tools = args.tools.split(",")
    server, url = start_server(args.server_cpu, args.ttft_ms, args.itl_ms)
    run_tool.children_cpu = resource_children()  # type: ignore[attr-defined]
    rows: list[dict[str, Any]] = []
    racing = set(tools)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for rate in (float(r) for r in args.rates.split(",")):
            for tool in tools:
                if tool not in racing:
                    continue
                out = args.out / f"{tool}_{rate:g}"
                shutil.rmtree(out, ignore_errors=True)
                t_load = os.getloadavg()[0]
                if tool == "admit":
                    row = admit_stage(args, url, rate, out, None)
                elif tool == "admit-base":
                    row = admit_stage(args, url, rate, out, args.baseline_src)
                elif tool == "inference-perf":
                    row = iperf_stage(args, url, rate, out)
                elif tool == "guidellm":
                    row = guidellm_stage(args, url, rate, out)
                else:
                    raise SystemExit(f"unknown tool {tool!r}")
                achieved = row["received"] / max(args.duration, row["span_s"])
                row = {"tool": tool, "asked": rate, "achieved": round(achieved, 1), **row}
                row["ratio"] = round(achieved / rate, 3)
                row["load_avg_1m"] = t_load
                if "ttft_p50_ms" in row:
                    row["ttft_bias_ms"] = round(row["ttft_p50_ms"] - args.ttft_ms, 3)
                lag99 = row.get("lag_p99_ms")
                row["on_schedule"] = bool(row["ratio"] >= 0.99 and lag99 is not None and lag99 <= 5.0)
                if row["ratio"] < 0.9 or lag99 is None or lag99 > 1000 or row["timed_out"]:
                    racing.discard(tool)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "stderr_tail"}), flush=True)
                (args.out / "results.json").write_text(json.dumps(rows, indent=2))
            if not racing:
                break
    finally:
        server.terminate()
        server.wait()
    for tool in tools:
        ok = [r["asked"] for r in rows if r["tool"] == tool and r["on_schedule"]]
        print(f"{tool}: highest rate on schedule (achieved >= 99 %, lag p99 <= 5 ms): {max(ok) if ok else None}")


if __name__ == "__main__":
    main()
