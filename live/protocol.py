"""`admit protocol`: the published study's experimental protocol, run live — repeats × policies on the same
requests, with the statistics of `admit evaluate`.

For each repeat r (seed ``seed_base + r``) the scenario's requests for that seed are drawn once
(admit.live.sim2live's trace replay, cut to ``duration`` seconds), the policies are put in an order drawn
from the seed (recorded, so a slow drift of the machine cannot favour the policy that always runs first),
and each policy runs once on exactly those requests: common random numbers, live. A run is a fresh gateway
with the scenario's tenants, limits, queues and SLOs, `admit control` with the policy, and `admit loadgen`
replaying the requests through it (admit.live.run.run_live). The backend is either a running server
(``backend``: real vLLM or anything OpenAI-compatible with vLLM's /metrics; before each run the protocol
waits until its /metrics show nothing running or waiting: the cool-down) or, without one, a fresh
`admit emulate` per run with the scenario's preset, so no KV or prefix cache carries over.

Every finished run is written to ``out`` at once (atomically), so a crash or Ctrl-C loses only the run in
flight, and running the same command again skips the finished runs; a file written by another protocol
(other scenario, policies, duration, seeds or backend) is refused, never overwritten.

A run whose load generator fell behind its schedule (`admit loadgen`'s own validity: send lag, achieved
rate) is **invalid**: it is kept in ``runs`` with its reasons, and its repeat is excluded from the
statistics for every policy (the comparison is paired by repeat), never averaged in silently.

The statistics are `admit evaluate`'s (admit.evaluate.offline.Evaluation, repeats as seeds): per policy the
mean, standard deviation and Student-t 95 % interval of each figure, a paired two-sided Wilcoxon test of
every policy against the first on each, overall and per tenant, and evaluate/verdict.py's verdict; the
figures are those a live run measures (`METRICS`: goodput first, attainment, the worst tenant's and Jain's
index over tenants, TTFT / TPOT / e2e p50 and p99 from the client's side, queue timeouts, rejections, mean
limit, throughput). A tenant with no completion has latencies 0, as in the simulator. ``simulate`` also
runs the same protocol in the simulator (same seeds, same requests, same schema: ``simulated``) and prints
each policy's live and simulated figures side by side with the difference.

Not yet measured here (issue 16): the gateway's overhead, the backend's KV usage and preemptions over each
run, and a warm-up period excluded from the figures.
"""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from admit.engine.request import Request
from admit.envs.scenario import Scenario, TokenEngineConfig, load_scenario
from admit.envs.simulation import Simulation, jain
from admit.evaluate.offline import METRICS as ALL_METRICS
from admit.evaluate.offline import TENANT_METRICS as ALL_TENANT_METRICS
from admit.evaluate.offline import Episode, Evaluation, make_bound
from admit.live.run import run_live
from admit.live.sim2live import DRAIN_S, gateway_config, load_config, replay_requests, write_trace
from admit.live.stack import Stack
from rich.console import Console
from rich.table import Table

FORMAT = "admit-protocol/1"
# What a live run measures of `admit evaluate`'s figures; the seed study's legacy ones are left out.
METRICS = tuple(m for m in ALL_METRICS if m not in ("p99_s", "p50_s", "slo_attainment", "jain_fairness"))
TENANT_METRICS = tuple(m for m in ALL_TENANT_METRICS if m != "output_tokens_per_s")
SIDE_BY_SIDE = ("goodput_rps", "attainment", "worst_attainment", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s")


class ProtocolError(ValueError):
    """A protocol that cannot run as asked (what was wrong, what is allowed)."""


def run_order(policies: Sequence[str], seed: int) -> list[str]:
    """The policies in the order repeat ``seed`` runs them: a shuffle drawn from the seed alone."""
    order = list(policies)
    random.Random(f"admit-protocol-{seed}").shuffle(order)
    return order


def _lat(v: float | None) -> float:
    return 0.0 if v is None else float(v)


def live_episode(run: dict[str, Any]) -> Episode:
    """One live run (admit.live.run.run_live's record) as an Episode of `METRICS` and `TENANT_METRICS`."""
    tenants: dict[str, dict[str, float]] = {}
    for name, t in run["tenants"].items():
        sched = int(t["scheduled"])
        tenants[name] = {
            "goodput_rps": float(t["goodput_rps"]),
            "attainment": t["good"] / sched if sched else 1.0,
            "throughput_rps": float(t["throughput_rps"]),
            **{m: _lat(t.get(m)) for m in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
                                           "e2e_p99_s")},
            "timeouts": float(t["ttl_expired"]),
            "rejected": float(t["queue_full"]),
            "arrived": float(sched),
            "completed": float(t["completed"]),
            "good": float(t["good"]),
        }
    arrived = sum(t["arrived"] for t in tenants.values())
    good = sum(t["good"] for t in tenants.values())
    seen = [t["attainment"] for t in tenants.values() if t["arrived"] > 0]
    limits = [sum(t["limits"]) / len(t["limits"]) for t in run["tenants"].values() if t["limits"]]
    return {
        "goodput_rps": float(run["goodput_rps"]),
        "attainment": good / arrived if arrived else 1.0,
        "worst_attainment": min(seen, default=1.0),
        "jain_attainment": jain(seen),
        **{m: _lat(run.get(m)) for m in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
                                         "e2e_p99_s")},
        "timeouts": sum(t["timeouts"] for t in tenants.values()),
        "rejected": sum(t["rejected"] for t in tenants.values()),
        "mean_limit": sum(limits) / len(limits) if limits else 0.0,
        "throughput_rps": float(run["throughput_rps"]),
        "dropped": sum(t["timeouts"] + t["rejected"] for t in tenants.values()),
        "tenants": tenants,
    }


def sim_episode(sc: Scenario, requests: list[Request], policy: str, seed: int,
                bound: Scenario | None = None) -> Episode:
    """The policy on exactly ``requests`` in the simulator (drained after the horizon, as a live run's load
    generator waits for its answers), as an Episode of the same figures. ``bound``: the scenario a policy that
    needs one (static:best) is bound to — the whole scenario, as the live control loop binds it, not ``sc``
    cut to the protocol's duration (whose caps nobody tuned)."""
    ctrl = make_bound(policy, bound or sc)
    ctrl.reset(sc.control_spec(), seed)
    sim = Simulation(sc, seed, requests=requests)
    stats = sim.run(ctrl, until=sc.horizon_s + DRAIN_S, name=policy)
    summary = sim.summary()
    ep: Episode = {m: float(v) for m, v in summary.items() if m in METRICS}
    ep["e2e_p50_s"], ep["e2e_p99_s"] = float(summary["p50_s"]), float(summary["p99_s"])
    ep["mean_limit"] = float(stats.mean_limit)
    ep["tenants"] = {n: {m: float(v) for m, v in t.items() if m in TENANT_METRICS}
                     for n, t in sim.tenant_summary().items()}
    return ep


def _identity(scenario: str, policies: Sequence[str], duration: float, seed_base: int, backend: str | None) -> dict:
    return {"format": FORMAT, "scenario": scenario, "policies": list(policies), "duration_s": duration,
            "seed_base": seed_base, "backend": backend or "admit emulate (a fresh one per run)"}


def _load_state(out: Path, ident: dict[str, Any]) -> dict[str, Any]:
    """The finished runs of an earlier, interrupted run of this very protocol; {} when there is none."""
    if not out.is_file():
        return {}
    try:
        data = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProtocolError(f"{out} exists but is not a protocol's JSON ({e}); give another --out or remove "
                            "it") from None
    old = data.get("protocol", {}) if isinstance(data, dict) else {}
    diff = [f"{k} {old.get(k)!r} (asked: {v!r})" for k, v in ident.items() if old.get(k) != v]
    if diff:
        raise ProtocolError(f"{out} holds another protocol ({'; '.join(diff)}); give another --out to keep both, "
                            "or remove it to start again")
    return dict(data.get("runs", {}))


def _write(out: Path, data: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, out)


def statistics(name: str, duration: float, policies: Sequence[str], seeds: Sequence[int],
               episodes: dict[str, dict[int, Episode]]) -> dict[str, Any] | None:
    """`admit evaluate`'s JSON over ``seeds`` (the valid repeats); None when there is no valid repeat."""
    if not seeds:
        return None
    per_seed = {p: [episodes[p][s] for s in seeds] for p in policies}
    return Evaluation(name, list(seeds), list(policies), per_seed, duration, METRICS, TENANT_METRICS).to_json()


def aggregate(name: str, duration: float, policies: Sequence[str], seeds: Sequence[int], runs: dict[str, Any],
              simulate: bool) -> dict[str, Any]:
    """The statistics over the repeats whose every run was valid (a repeat with one invalid run is excluded for
    every policy: the tests are paired by repeat), what was excluded and why, and the simulated twin's
    statistics over every repeat (the simulator cannot fall behind)."""
    valid = [s for s in seeds if all(runs[f"{s}/{p}"]["valid"] for p in policies)]
    excluded = [{"seed": s, "reasons": [f"{p}: {r}" for p in policies for r in runs[f"{s}/{p}"]["invalid_reasons"]]}
                for s in seeds if s not in valid]
    live_eps = {p: {s: runs[f"{s}/{p}"]["episode"] for s in seeds} for p in policies}
    out = {"valid_repeats": valid, "excluded": excluded,
           "results": statistics(name, duration, policies, valid, live_eps)}
    if simulate:
        sim_eps = {p: {s: runs[f"{s}/{p}"]["simulated"] for s in seeds} for p in policies}
        out["simulated"] = statistics(name, duration, policies, seeds, sim_eps)
    return out


def _one_live(sc: Scenario, scenario: str, requests: list[Request], policy: str, seed: int, backend: str | None,
              root: Path, tag: str) -> dict[str, Any]:
    with Stack(root / tag) as stack:
        trace = stack.workdir / "requests.jsonl"
        if backend is None:
            assert isinstance(sc.engine, TokenEngineConfig)
            write_trace(sc, requests, trace)
            load = load_config(sc, trace)
            target = stack.emulator("--preset", sc.engine.preset, "--seed", str(seed))
        else:
            from admit.live import fidelity_real

            fidelity_real.write_trace(sc, requests, trace)
            load = fidelity_real.real_load_config(sc, trace)
            fidelity_real.wait_idle(backend)  # the cool-down: the previous run's stragglers are done
            target = backend
        run = run_live(stack, target, "live", gateway_config(sc), load, policy, sc.interval_s, scenario=scenario,
                       start_on_traffic=True)
    run.pop("workdir", None)
    return run


def run_protocol(scenario: str, policies: Sequence[str], repeats: int, duration: float, out: Path,
                 console: Console, *, backend: str | None = None, seed_base: int = 0, simulate: bool = False,
                 plot: Path | None = None, workdir: Path | None = None) -> dict[str, Any]:
    """Run (or resume) the protocol; write ``out`` after every run and return the final JSON (module doc)."""
    if not policies:
        raise ProtocolError("give at least one --policy (the first is the baseline)")
    if len(set(policies)) != len(policies):
        raise ProtocolError(f"policies must be distinct, got {list(policies)}")
    if repeats < 1:
        raise ProtocolError(f"--repeats must be >= 1, got {repeats}")
    if not duration > 0:
        raise ProtocolError(f"--duration must be > 0 seconds, got {duration}")
    sc = load_scenario(scenario, horizon_s=duration)
    if backend is None and not isinstance(sc.engine, TokenEngineConfig):
        raise ProtocolError(f"without --backend the protocol runs the emulator, which needs a token-engine "
                            f"scenario; {scenario} has a {sc.engine.kind} engine")
    full = load_scenario(scenario)  # what the live control loop binds its policy to (`sim_episode`)
    for p in policies:  # a bad name fails here, before any run
        make_bound(p, full).reset(sc.control_spec(), seed_base)
    ident = _identity(scenario, policies, duration, seed_base, backend)
    runs = _load_state(out, ident)
    seeds = [seed_base + r for r in range(repeats)]
    orders = {s: run_order(policies, s) for s in seeds}
    todo = [(s, p) for s in seeds for p in orders[s] if f"{s}/{p}" not in runs]
    if len(todo) < repeats * len(policies):
        console.print(f"resuming {out}: {repeats * len(policies) - len(todo)} runs done earlier, {len(todo)} to go")

    def snapshot() -> dict[str, Any]:
        return {"protocol": {**ident, "repeats": repeats, "orders": {str(s): orders[s] for s in seeds}},
                "runs": runs}

    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="admit-protocol-") as tmp:
        root = workdir or Path(tmp)
        requests_of: dict[int, list[Request]] = {}
        for i, (s, p) in enumerate(todo):
            requests = requests_of.setdefault(s, replay_requests(sc, s))
            eta = f", about {sum(walls) / len(walls) * (len(todo) - i):.0f} s left" if walls else ""
            console.print(f"[{i + 1}/{len(todo)}{eta}] repeat {s - seed_base + 1}/{repeats} (seed {s}), "
                          f"{p}: {len(requests)} requests over {duration:g} s ...")
            t0 = time.monotonic()
            live = _one_live(sc, scenario, requests, p, s, backend, root, f"{s}-{re.sub(r'[^A-Za-z0-9_.-]', '_', p)}")
            rec: dict[str, Any] = {"seed": s, "policy": p, "position": orders[s].index(p), "valid": live["valid"],
                                   "invalid_reasons": live["invalid_reasons"], "episode": live_episode(live),
                                   "limits": {n: t["limits"] for n, t in live["tenants"].items()},
                                   "http_429": {n: t["http_429"] for n, t in live["tenants"].items()},
                                   "errors": {n: t["errors"] for n, t in live["tenants"].items()},
                                   "decisions": live["decisions"], "wall_s": round(time.monotonic() - t0, 2)}
            if simulate:
                rec["simulated"] = sim_episode(sc, requests, p, s, full)
            runs[f"{s}/{p}"] = rec
            walls.append(rec["wall_s"])
            if not rec["valid"]:
                console.print(f"[yellow]  invalid: {'; '.join(rec['invalid_reasons'])}; repeat {s - seed_base + 1} "
                              "is left out of the statistics[/yellow]")
            _write(out, snapshot())
    if simulate:  # runs finished before --simulate was asked for get their twin now (the simulator is cheap)
        for s in seeds:
            for p in policies:
                rec = runs[f"{s}/{p}"]
                if "simulated" not in rec:
                    rec["simulated"] = sim_episode(sc, replay_requests(sc, s), p, s, full)
    data = {**snapshot(), **aggregate(sc.name, duration, policies, seeds, runs, simulate)}
    stats = data["results"]
    _write(out, data)
    print_protocol(data, console)
    if plot is not None and stats is not None:
        from admit.evaluate.report import pareto_plot

        pareto_plot(stats, plot)
        console.print(f"wrote {plot}")
    console.print(f"wrote {out}")
    return data


def print_protocol(data: dict[str, Any], console: Console) -> None:
    """`admit evaluate`'s tables for the valid repeats, what was excluded, and the simulated twin beside."""
    from admit.evaluate.report import print_table

    proto = data["protocol"]
    console.print(f"admit protocol: {proto['scenario']}, {proto['repeats']} repeats × {len(proto['policies'])} "
                  f"policies, {proto['duration_s']:g} s each, on {proto['backend']}; valid repeats "
                  f"{len(data['valid_repeats'])} of {proto['repeats']}", highlight=False, markup=False)
    for ex in data["excluded"]:
        console.print(f"excluded: seed {ex['seed']}: {'; '.join(ex['reasons'])}", highlight=False, markup=False)
    if data["results"] is None:
        console.print("no valid repeat: no statistics", highlight=False, markup=False)
    else:
        print_table(data["results"], console)
    sim = data.get("simulated")
    if sim is None or data["results"] is None:
        return
    table = Table(title="live against its simulated twin (means over the valid repeats; simulator over all)")
    for col in ("policy", "figure", "live", "simulated", "difference"):
        table.add_column(col, justify="left" if col in ("policy", "figure") else "right")
    for p, e in data["results"]["policies"].items():
        for i, m in enumerate(SIDE_BY_SIDE):
            a, b = e[m]["mean"], sim["policies"][p][m]["mean"]
            diff = f"{(b - a) / a:+.1%}" if a else "—"
            table.add_row(p if i == 0 else "", m, f"{a:.3f}", f"{b:.3f}", diff, end_section=i == len(SIDE_BY_SIDE) - 1)
    console.print(table)
