"""`admit demo`: the whole live loop on one machine, static limits first, then a trained policy.

On 127.0.0.1: the emulator (token engine, h200-llama3-8b), then twice a fresh gateway with two tenants
(`bursty`: gamma arrivals, squared CV 10; `steady`: Poisson), the control loop and `admit loadgen`
driving the same seeded two-tenant load — once with `static` (the limits stay as configured), once
with the policy. Prints a before/after table and writes it as JSON. Every process is stopped on exit,
error, Ctrl-C or SIGTERM; the run is bounded by ~2 × (duration + start-up).

The tenants mirror the seed-paper scenario the shipped PPO policy was trained on (names, limits 1–4,
step 1, 3 s decisions, 6 s windows, 3 s queue timeout, e2e SLO 12 s), so it acts on the features it
knows; the load is scaled so a burst overruns the limits. Both runs start from the same configured limit
(``--limit``, default 2): static holds it, the policy moves it — which is what the table compares.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from admit.live.run import run_live
from admit.live.stack import Stack
from rich.console import Console
from rich.table import Table

DEFAULT_POLICY = "ppo:agents/pretrained/ppo-seed-paper"
FALLBACK_POLICY = "robust"
TENANTS = ("bursty", "steady")


def gateway_config(limit: int) -> dict[str, Any]:
    return {
        "telemetry": {"scrape_interval_s": 1, "stale_after_s": 5, "window_s": 6},
        "control": {"min_limit": 1, "max_limit": 4, "max_step": 1, "interval_s": 3},
        "tenants": [
            {"name": n, "api_keys": [f"sk-demo-{n}-key"], "limit": limit, "max_queue": 64, "queue_timeout_s": 3,
             "slo": {"e2e_s": 12, "e2e_p99_s": 12}}
            for n in TENANTS
        ],
    }


def load_config(duration: float, seed: int, bursty_rps: float, steady_rps: float) -> dict[str, Any]:
    common = {"prompt": "512", "output": "128"}
    return {
        "api": "completions",
        "duration": duration,
        "seed": seed,
        "workers": 1,
        "timeout": 60,
        "lag_bound_ms": 50,
        "tenants": [
            {"name": "bursty", "rate": bursty_rps, "arrival": "gamma", "burstiness": 0.1,
             "api_key": "sk-demo-bursty-key", **common},
            {"name": "steady", "rate": steady_rps, "arrival": "poisson", "api_key": "sk-demo-steady-key", **common},
        ],
    }


def policy_loads(policy: str) -> str | None:
    """None if ``policy`` can be built and reset for seed-paper, else why not."""
    try:
        from admit.controllers.registry import make_controller
        from admit.envs.scenario import load_scenario

        make_controller(policy).reset(load_scenario("seed-paper").control_spec())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _fmt(v: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "—" if v is None else f"{v * scale:.{digits}f}"


def print_table(result: dict[str, Any], console: Console) -> None:
    runs = result["runs"]
    table = Table(title=f"admit demo: static limits vs {runs['policy']['policy']} ({result['duration_s']:g} s each)")
    for col in ("run", "tenant", "done", "req/s", "TTFT p99 s", "e2e p99 s", "429 full", "429 TTL (drops)",
                "limits (decisions)"):
        left = col in ("run", "tenant", "limits (decisions)")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for label, run in runs.items():
        for name, t in run["tenants"].items():
            lim = t["limits"]
            span = f"{lim[0]}→{lim[-1]} (mean {sum(lim) / len(lim):.1f})" if lim else str(t["final_limit"])
            table.add_row(label if name == TENANTS[0] else "", name, str(t["completed"]), _fmt(t["throughput_rps"]),
                          _fmt(t["ttft_p99_s"]), _fmt(t["e2e_p99_s"]), str(t["queue_full"]), str(t["ttl_expired"]),
                          span)
        table.add_row("", "all", str(run["completed"]), _fmt(run["throughput_rps"]), _fmt(run["ttft_p99_s"]),
                      _fmt(run["e2e_p99_s"]), str(sum(t["queue_full"] for t in run["tenants"].values())),
                      str(sum(t["ttl_expired"] for t in run["tenants"].values())), "", end_section=True)
    console.print(table)


def run_demo(duration: float, policy: str, out: Path, seed: int, bursty_rps: float, steady_rps: float, limit: int,
             workdir: Path | None, console: Console) -> dict[str, Any]:
    note = None
    why = policy_loads(policy)
    if why is not None:
        note = f"policy {policy} did not load ({why}); using {FALLBACK_POLICY} instead"
        console.print(f"[yellow]{note}[/yellow]")
        policy = FALLBACK_POLICY
    with tempfile.TemporaryDirectory(prefix="admit-demo-") as tmp, Stack(workdir or Path(tmp)) as stack:
        console.print("starting the emulator (h200-llama3-8b) on 127.0.0.1 ...")
        emu = stack.emulator("--preset", "h200-llama3-8b", "--max-model-len", "8192", "--seed", str(seed))
        load = load_config(duration, seed, bursty_rps, steady_rps)
        runs = {}
        for label, pol in (("static", "static"), ("policy", policy)):
            console.print(f"run '{label}': gateway + control loop ({pol}) + admit loadgen for {duration:g} s ...")
            cfg = gateway_config(limit)
            runs[label] = run_live(stack, emu, label, cfg, load, pol, 3.0, scenario="seed-paper", start_on_traffic=True)
        lateness = _emulator_lateness(stack, emu)
    result = {"duration_s": duration, "seed": seed, "policy": policy, "initial_limit": limit, "note": note,
              "backend": "admit emulate",
              "load": load, "emulator_lateness": lateness, "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result, console)
    if lateness is not None:
        console.print(f"emulator lateness p99 {lateness['p99_ms']:.1f} ms (seconds would mean the CPU was short)")
    console.print(f"wrote {out}")
    return result


def _emulator_lateness(stack: Stack, emu: str) -> dict[str, float] | None:
    """The emulator loop's event lateness (p50/p90/p99, ms): seconds mean the CPU could not keep up."""
    try:
        q = stack.admin(emu, "/debug/requests", timeout=30)["event_lateness_s"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return {f"{k}_ms": round(float(v) * 1000, 2) for k, v in q.items()}
