"""`admit demo`: the live stack on a workload whose tenants interfere, the strongest static caps against the
adaptive policies, per-tenant goodput.

On 127.0.0.1, for each policy on a fresh emulator (the scenario's preset, so no KV or prefix cache carries
over between runs): a gateway with the scenario's tenants, limits, queues and SLOs, `admit control` driving
it with the policy, and `admit loadgen` replaying the same requests — the scenario's draws for ``--seed``,
cut to ``--duration`` seconds (admit.live.sim2live's trace replay). The default scenario is
long-context-chat: a long-context tenant (prompts of thousands up to 100k tokens) beside an interactive chat
tenant, where the scenario's default caps thrash the KV cache.

The default policies: ``static:best`` (per-tenant caps tuned for goodput offline on seeds 900000–900004,
shipped in evaluate/static_best/; never the demo's seed), the best hand-written controller on this scenario
in docs/RESULTS.md (``token:best``), and ``ppo:general`` (the one learned policy for every scenario, acting
around static:best's caps) when it is shipped. A request is good when it completes within every per-request
objective of its tenant (the load generator checks them as the simulator does); a tenant's attainment is its
good requests over all its arrivals. Every process is stopped on exit, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from admit.envs.scenario import TokenEngineConfig, load_scenario
from admit.live.run import run_live
from admit.live.sim2live import gateway_config, load_config, replay_requests, write_trace
from admit.live.stack import Stack
from rich.console import Console
from rich.table import Table

SCENARIO = "long-context-chat"
POLICIES = ("static:best", "token:best", "ppo:general")


def policy_loads(policy: str, scenario: str) -> str | None:
    """None if ``policy`` can be built and reset on ``scenario``'s control spec, else why not."""
    try:
        from admit.controllers.registry import make_controller

        sc = load_scenario(scenario)
        make_controller(policy, scenario=sc).reset(sc.control_spec(), 0)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _fmt(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def print_table(result: dict[str, Any], console: Console) -> None:
    runs = result["runs"]
    table = Table(title=f"admit demo: {result['scenario']}, {result['requests']} requests over "
                        f"{result['duration_s']:g} s, the same for every policy (seed {result['seed']})")
    for col in ("policy", "tenant", "arrived", "good", "goodput req/s", "attainment", "TTFT p99 s", "e2e p99 s",
                "drops", "mean limit"):
        table.add_column(col, justify="left" if col in ("policy", "tenant") else "right", no_wrap=True)
    for pol, run in runs.items():
        first = True
        for name, t in run["tenants"].items():
            lim = t["limits"]
            table.add_row(pol if first else "", name, str(t["scheduled"]), str(t["good"]), _fmt(t["goodput_rps"], 3),
                          _fmt(t["attainment"], 3), _fmt(t["ttft_p99_s"]), _fmt(t["e2e_p99_s"]),
                          str(t["ttl_expired"] + t["queue_full"]), _fmt(sum(lim) / len(lim) if lim else None, 1))
            first = False
        tot = run["tenants"].values()
        sched = sum(t["scheduled"] for t in tot)
        good = sum(t["good"] for t in tot)
        table.add_row("", "all", str(sched), str(good), _fmt(good / run["duration_s"], 3),
                      _fmt(good / sched if sched else None, 3), _fmt(run["ttft_p99_s"]), _fmt(run["e2e_p99_s"]),
                      str(sum(t["ttl_expired"] + t["queue_full"] for t in tot)), "", end_section=True)
    console.print(table)
    base = next(iter(runs))
    g0 = runs[base]["goodput_rps"]
    for pol, run in list(runs.items())[1:]:
        ratio = f"{run['goodput_rps'] / g0:.3f}×" if g0 else "—"
        console.print(f"{pol}: goodput {run['goodput_rps']:.3f} req/s against {base}'s {g0:.3f} ({ratio}); "
                      "one seed, live: docs/RESULTS.md has the 20-seed verdicts")


def run_demo(scenario: str, duration: float, policies: list[str], out: Path, seed: int, workdir: Path | None,
             console: Console, backend: str | None = None) -> dict[str, Any]:
    """``backend``: a running real vLLM server in place of a fresh emulator per policy (the requests are then
    written as live/fidelity_real.py writes them: numbered, so its prefix cache serves none, and the policies
    run one after another on one server, each once it is idle)."""
    sc = load_scenario(scenario, horizon_s=duration)
    if not isinstance(sc.engine, TokenEngineConfig):
        raise ValueError(f"the demo needs a token-engine scenario (the emulator runs the token engine); "
                         f"{scenario} has a {sc.engine.kind} engine")
    notes, chosen = [], []
    for pol in policies:
        why = policy_loads(pol, scenario)
        if why is None:
            chosen.append(pol)
        else:
            notes.append(f"{pol} is left out: it did not load ({why})")
            console.print(f"[yellow]{notes[-1]}[/yellow]")
    if not chosen:
        raise ValueError("no policy of " + ", ".join(policies) + " loads")
    requests = replay_requests(sc, seed)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="admit-demo-") as tmp:
        root = workdir or Path(tmp)
        for i, pol in enumerate(chosen):
            with Stack(root / f"run{i}") as stack:
                trace = stack.workdir / "requests.jsonl"
                load = load_config(sc, trace)
                if backend is None:
                    write_trace(sc, requests, trace)
                    console.print(f"{pol}: emulator ({sc.engine.preset}) + gateway + control loop + admit loadgen, "
                                  f"{len(requests)} requests over {duration:g} s ...")
                    target = stack.emulator("--preset", sc.engine.preset, "--seed", str(seed))
                else:
                    from admit.live import fidelity_real

                    fidelity_real.write_trace(sc, requests, trace)
                    load = fidelity_real.real_load_config(sc, trace)
                    fidelity_real.wait_idle(backend)
                    console.print(f"{pol}: real vLLM at {backend} + gateway + control loop + admit loadgen, "
                                  f"{len(requests)} requests over {duration:g} s ...")
                    target = backend
                runs[pol] = run_live(stack, target, "live", gateway_config(sc), load, pol,
                                     sc.interval_s, scenario=scenario, start_on_traffic=True)
                runs[pol].pop("decision_log", None)
    result = {"scenario": scenario, "duration_s": duration, "seed": seed, "requests": len(requests),
              "policies": chosen, "notes": notes, "runs": runs,
              "backend": "admit emulate" if backend is None else f"vLLM at {backend}"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result, console)
    console.print(f"wrote {out}")
    return result
