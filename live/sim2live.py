"""`admit sim2live`: one scenario, one policy, the same requests — in the simulator and live — compared.

The simulator draws the scenario's requests for a seed. `admit loadgen` replays a tenant's trace from
that tenant's first request, so each tenant's draws are shifted to start at 0 and cut at the horizon;
the simulator then runs on exactly those requests (the episode's RNG streams are unchanged otherwise).
The same requests go to a JSONL file that the live run replays (`arrival=trace`, one `trace_tenant` per
tenant, `ignore_eos` so each answer has the drawn length; the prompt is written one token short because
the emulator counts the beginning-of-text token, so it sees the drawn prompt length exactly).

Live: the emulator (the scenario's preset) → a gateway whose tenants have the scenario's initial limits,
queue sizes, queue timeouts and SLOs → `admit control` with the policy and the scenario's spec. Both
sides count requests that arrived within the horizon and finished at all (the simulator is run on until
its queues drain, as the load generator waits for every answer), so throughput = completions / horizon.
e2e is arrival → last token in the simulator and send → end of stream at the client, which includes the
gateway's queueing; TTFT likewise; percentiles are nearest-rank on both sides, as the load generator's.
The live loop starts on traffic (`admit control --start-on-traffic`), so it decides at the simulator's
instants, and its decisions are matched with the simulator's interval by interval.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from admit.agents.registry import make_controller
from admit.core import percentiles
from admit.core.observation import Observation
from admit.engine.fidelity import SIM2LIVE_SECTION as SECTION
from admit.engine.request import Request
from admit.envs.scenario import Scenario, SlotEngineConfig, TokenEngineConfig, load_scenario
from admit.envs.simulation import Simulation, draw_requests
from admit.live.control import observation_summary
from admit.live.run import run_live
from admit.live.stack import Stack
from rich.console import Console
from rich.table import Table

TOLERANCE = 0.10
DRAIN_S = 120.0
METRICS = ("throughput_rps", "e2e_p99_s", "ttft_p99_s", "e2e_p50_s")


def replay_requests(scenario: Scenario, seed: int) -> list[Request]:
    """The seed's draws, each tenant shifted to start at 0 (as trace replay does) and cut at the horizon."""
    drawn = draw_requests(scenario, seed)  # the episode's draws
    first: dict[int, float] = {}
    for r in drawn:
        first.setdefault(r.tenant, r.arrival)
    kept = sorted(
        ((r.arrival - first[r.tenant], r) for r in drawn if r.arrival - first[r.tenant] < scenario.horizon_s),
        key=lambda x: (x[0], x[1].tenant),
    )
    return [Request(i, r.tenant, t, r.prompt_tokens, r.output_tokens, r.u_service) for i, (t, r) in enumerate(kept)]


def write_trace(scenario: Scenario, requests: list[Request], path: Path) -> None:
    names = [t.name for t in scenario.tenants]
    with path.open("w") as fh:
        for r in requests:
            fh.write(json.dumps({"tenant": names[r.tenant], "arrival": round(r.arrival, 6),
                                 "prompt_tokens": max(1, r.prompt_tokens - 1),
                                 "output_tokens": r.output_tokens}) + "\n")


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile (the sample of rank ceil(q/100 · n)), the definition `admit loadgen` reports.

    numpy's default interpolates between samples; for a p99 of 185 requests that lies between the third and
    the second slowest, and in a bursty tenant those can be half a second apart, so the two sides must use
    one definition.
    """
    return round(percentiles.nearest_rank(values, q), 4) if values else None


def simulate(scenario: Scenario, requests: list[Request], policy: str, seed: int) -> dict[str, Any]:
    """The policy on exactly ``requests``; run until drained after the horizon (no arrivals then)."""
    ctrl = make_controller(policy)
    ctrl.reset(scenario.control_spec(), seed)
    sim = Simulation(scenario, seed, requests=requests)  # the replayed draws (copied: a run fills them in)
    names = [tc.name for tc in scenario.tenants]
    decisions: list[dict[str, Any]] = []

    def log(t: float, obs: Observation, deltas: list[int], after: list[int]) -> None:
        if t < scenario.horizon_s:  # the load's span: what the live decision log is compared with
            before = [int(x.limit) for x in obs.tenants]
            decisions.append({"t": round(t, 3), "observation": observation_summary(obs, names, {}),
                              "deltas": list(deltas), "limits_before": dict(zip(names, before, strict=True)),
                              "limits_after": dict(zip(names, after, strict=True))})

    sim.run(ctrl, until=scenario.horizon_s + DRAIN_S, on_decision=log, name=policy)
    tenants = {}
    for tc, tot in zip(scenario.tenants, sim.totals, strict=True):
        tenants[tc.name] = {"sent": tot.arrived, "completed": tot.completed,
                            "throughput_rps": round(tot.completed / scenario.horizon_s, 4),
                            "goodput_rps": round(tot.good / scenario.horizon_s, 4),
                            "e2e_p99_s": nearest_rank(tot.e2e, 99), "ttft_p99_s": nearest_rank(tot.ttft, 99),
                            "e2e_p50_s": nearest_rank(tot.e2e, 50), "ttft_p50_s": nearest_rank(tot.ttft, 50),
                            "tpot_p50_s": nearest_rank(tot.tpot, 50), "tpot_p99_s": nearest_rank(tot.tpot, 99),
                            "dropped": tot.dropped + tot.rejected}
    per_request: dict[str, list[float | None]] = {n: [] for n in names}  # e2e in arrival order, None if not served
    for r in sim.requests:
        per_request[names[r.tenant]].append(None if np.isnan(r.finished) else r.finished - r.arrival)
    e2e = [x for tot in sim.totals for x in tot.e2e]
    ttft = [x for tot in sim.totals for x in tot.ttft]
    tpot = [x for tot in sim.totals for x in tot.tpot]
    done = sum(tot.completed for tot in sim.totals)
    good = sum(tot.good for tot in sim.totals)
    return {"completed": done, "throughput_rps": round(done / scenario.horizon_s, 4),
            "goodput_rps": round(good / scenario.horizon_s, 4),
            "e2e_p99_s": nearest_rank(e2e, 99), "ttft_p99_s": nearest_rank(ttft, 99),
            "e2e_p50_s": nearest_rank(e2e, 50), "ttft_p50_s": nearest_rank(ttft, 50),
            "tpot_p50_s": nearest_rank(tpot, 50), "tpot_p99_s": nearest_rank(tpot, 99),
            "tenants": tenants, "decisions": decisions, "per_request_e2e": per_request}


def gateway_config(scenario: Scenario) -> dict[str, Any]:
    tenants = []
    for i, tc in enumerate(scenario.tenants):
        t: dict[str, Any] = {"name": tc.name, "api_keys": [f"sk-s2l-{tc.name}-key"], "limit": scenario.limits.initial,
                             "max_queue": scenario.max_queue(i)}
        if np.isfinite(scenario.queue_timeout(i)):
            t["queue_timeout_s"] = scenario.queue_timeout(i)
        if tc.slo.given():
            t["slo"] = tc.slo.given()  # one SLO shape in the scenario and the gateway (core/slo.py)
        if tc.contract is not None:  # the gateway classifies each request on it, as the simulator does
            t["contract"] = tc.contract.model_dump(exclude_none=True)
        tenants.append(t)
    lim = scenario.limits
    return {"telemetry": {"scrape_interval_s": 1, "stale_after_s": 5, "window_s": scenario.window_s},
            "control": {"min_limit": lim.min, "max_limit": lim.max, "max_step": lim.max_step,
                        "interval_s": scenario.interval_s},
            "tenants": tenants}


def load_config(scenario: Scenario, trace: Path) -> dict[str, Any]:
    return {"api": "completions", "duration": scenario.horizon_s, "seed": 0, "workers": 1, "timeout": 120,
            "lag_bound_ms": 50, "ignore_eos": True, "unique_prompts": False,
            "tenants": [{"name": tc.name, "arrival": "trace", "trace": str(trace), "trace_tenant": tc.name,
                         "api_key": f"sk-s2l-{tc.name}-key", **({"slo": tc.slo.given()} if tc.slo.given() else {})}
                        for tc in scenario.tenants]}


def compare(sim: dict[str, Any], lives: list[dict[str, Any]]) -> dict[str, Any]:
    """Live vs simulator per metric, overall and per tenant, over one or more live repetitions.

    ``live`` is the median of the repetitions (the value itself for one), ``rel_diff`` = (live − sim) / sim
    of that median and ``within`` whether it is within TOLERANCE; ``live_min``/``live_max`` and
    ``reps_within`` (how many single repetitions were within TOLERANCE) give the spread.
    """

    def rows(s: dict[str, Any], lvs: list[dict[str, Any]]) -> dict[str, Any]:
        out = {}
        for m in METRICS:
            a = s.get(m)
            vals: list[float] = [float(v) for lv in lvs if (v := lv.get(m)) is not None]
            b = round(float(np.median(vals)), 4) if vals else None
            rel = None if not a or b is None else round((b - a) / a, 4)
            singles = [round((v - a) / a, 4) for v in vals] if a else []
            out[m] = {"sim": a, "live": b, "live_min": min(vals, default=None), "live_max": max(vals, default=None),
                      "rel_diff": rel, "within": rel is not None and abs(rel) <= TOLERANCE, "rel_diffs": singles,
                      "reps_within": sum(abs(x) <= TOLERANCE for x in singles)}
        return out

    return {"all": rows(sim, lives),
            **{n: rows(sim["tenants"][n], [lv["tenants"][n] for lv in lives]) for n in sim["tenants"]}}


def per_request_gap(sim_e2e: dict[str, list[float | None]], request_log: Path) -> dict[str, Any]:
    """Each tenant's requests matched in arrival order: gateway e2e − simulated e2e (median, p90, max, s).

    The gateway's e2e runs from the request's arrival at the gateway to its last byte there, so the gap is
    what the live path adds per request (HTTP hops, the emulator running late, queueing behind that),
    without the client's own send and read time.
    """
    text = request_log.read_text() if request_log.is_file() else ""
    lines = [json.loads(x) for x in text.split("\n")[:-1] if x.strip()]
    out: dict[str, Any] = {}
    for name, sims in sim_e2e.items():
        live = sorted((r for r in lines if r.get("tenant") == name and r.get("path", "").endswith("completions")),
                      key=lambda r: r["arrival"])
        gaps = [lv["e2e_s"] - s for s, lv in zip(sims, live, strict=False)
                if s is not None and lv.get("outcome") == "ok" and lv.get("e2e_s") is not None]
        if len(live) != len(sims) or not gaps:
            out[name] = {"matched": 0, "note": f"{len(live)} live requests for {len(sims)} simulated"}
            continue
        out[name] = {"matched": len(gaps), "median_s": round(float(np.median(gaps)), 4),
                     "p90_s": round(percentiles.linear_np(gaps, 90), 4), "max_s": round(max(gaps), 4)}
    return out


def align_decisions(sim_decisions: list[dict[str, Any]], live_log: list[dict[str, Any]],
                    interval_s: float) -> dict[str, Any]:
    """The live loop's decisions matched to the simulator's, interval by interval.

    The live loop decides once before the load and then every interval from the first arrival
    (`admit control --start-on-traffic`, ``since_traffic_s`` in its log); decision k after the first
    arrival is matched with the simulator's at t = k · interval, the one before the load with t = 0.
    """
    live_at: dict[int, dict[str, Any]] = {}
    for rec in live_log:
        if "limits_after" not in rec:  # a tick whose observation could not be read decided nothing
            continue
        k = round(rec["since_traffic_s"] / interval_s) if "since_traffic_s" in rec else 0
        live_at.setdefault(k, rec)
    rows = []
    for k, d in enumerate(sim_decisions):
        got = live_at.get(k)
        off = None if got is None or "since_traffic_s" not in got else round(got["since_traffic_s"] - d["t"], 3)
        rows.append({"t": d["t"], "sim": d["limits_after"], "live": None if got is None else got["limits_after"],
                     "offset_s": off})
    offsets = [abs(r["offset_s"]) for r in rows if r["offset_s"] is not None]
    gaps = [abs(r["live"][n] - v) for r in rows if r["live"] is not None for n, v in r["sim"].items()]
    return {"decisions": len(rows), "same_limits": sum(r["live"] == r["sim"] for r in rows),
            "first_difference_t": next((r["t"] for r in rows if r["live"] != r["sim"]), None),
            "max_limit_gap": max(gaps, default=None), "max_offset_s": max(offsets, default=None), "rows": rows}


NOTES = """\
How: the simulator draws the scenario's requests for the seed; each tenant's draws are shifted to start
at 0 (as `admit loadgen`'s trace replay does) and written as a JSONL trace; the simulator runs the policy
on exactly those requests and the live stack replays them: `admit emulate` (the same token engine and
preset, against the wall clock) ← `admit gateway` (the scenario's limits, queues, timeouts, SLOs and
window) ← `admit control --start-on-traffic` (the policy, the scenario's spec and interval) ← `admit
loadgen` (`ignore_eos`, so each answer has its drawn length); every live run gets a fresh emulator,
gateway and loop. Both sides decide on one schedule: the simulator at t = 0, interval, 2 × interval, ...
from its first arrival; the live loop once on the idle gateway, then every interval from the first
request's arrival at the gateway. Each live decision is matched with the simulator's at the same time
since the first arrival ("decisions with the simulator's limits"; the offset is how far the live
decision's instant was from the simulator's). Both sides count every request that arrived within the
horizon and finished; e2e and TTFT are arrival → last/first token in the simulator and send → end of
stream/first token at the client, so the live figures include the gateway, three HTTP hops and the CPU
the parts share. Percentiles are nearest-rank on both sides (the sample of rank ⌈q/100 · n⌉, which
`admit loadgen` reports from its histogram within 0.8%). "Gateway e2e − simulated e2e" matches every
request with itself (same tenant, same arrival order): what the live path adds per request. Throughput
agrees by construction when nothing is dropped (the same requests all finish); the latency tails are the
real test. A tenant's p99 is its second or third slowest request, which sits in a burst where requests
queue behind one another, so it moves with the CPU time the live parts get at that moment; repeated
live runs of the same requests show by how much.
"""


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:g}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:+.1f}%"


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{SECTION}\n",
             f"Generated by `{result['command']}` (live/sim2live.py); relative difference = (live − sim) / sim",
             f"of the median live run, tolerance {TOLERANCE:.0%}. Scenario `{result['scenario']}`: "
             f"{result['requests']} requests of seed {result['seed']} in {result['horizon_s']:g} s; load average "
             f"at the start {result['loadavg'][0]:.2f} (other engineers' jobs share the 2 cores).\n"]
    for run in result["runs"]:
        lives, n = run["lives"], run["repeat"]
        loads = ", ".join(f"{a:.1f}→{b:.1f}" for a, b in (lv["loadavg_1m"] for lv in lives))
        late = run.get("emulator_lateness_p99_ms")
        same = ", ".join(f"{sch['same_limits']}/{sch['decisions']}" + (
            "" if sch["first_difference_t"] is None else
            f" (from t = {sch['first_difference_t']:g} s, at most {sch['max_limit_gap']} apart)")
            for sch in (lv["schedule"] for lv in lives))
        offs = [lv["schedule"]["max_offset_s"] for lv in lives if lv["schedule"]["max_offset_s"] is not None]
        lines += [f"**{run['policy']}**, {n} live run{'s' if n > 1 else ''} (load average, 1 min, at start→end: "
                  f"{loads}; emulator event lateness p99 ≤ {_fmt(late)} ms). Live decisions with the simulator's "
                  f"limits: {same}; largest offset of a live decision from the simulator's instant "
                  f"{_fmt(max(offs, default=None))} s; live limits {_limit_span(lives)}.\n",
                  f"Gateway e2e − simulated e2e of the same request, median/p90 in ms: {_gaps(lives)}.\n",
                  "| scope | metric | simulator | live (median) | live min–max | difference | within 10% "
                  "| runs within 10% |", "|---|---|---|---|---|---|---|---|"]
        for scope, rows in run["comparison"].items():
            for m, r in rows.items():
                lines.append(f"| {scope} | {m} | {_fmt(r['sim'])} | {_fmt(r['live'])} | {_fmt(r['live_min'])}–"
                             f"{_fmt(r['live_max'])} | {_pct(r['rel_diff'])} | {'yes' if r['within'] else 'no'} "
                             f"| {r['reps_within']} of {len(r['rel_diffs'])} |")
        off = [f"{scope} {m} ({_pct(r['rel_diff'])})" for scope, rows in run["comparison"].items()
               for m, r in rows.items() if not r["within"]]
        lines.append("\nMedian outside 10%: " + (", ".join(off) if off else "none") + ".\n")
    return "\n".join(lines) + "\n" + NOTES


def _gaps(lives: list[dict[str, Any]]) -> str:
    runs = []
    for lv in lives:
        g = lv.get("per_request_gap", {})
        runs.append(", ".join(f"{n} {1000 * t['median_s']:+.0f}/{1000 * t['p90_s']:+.0f}" if t.get("matched")
                              else f"{n} n/a" for n, t in g.items()))
    return "; ".join(runs)


def _limit_span(lives: list[dict[str, Any]]) -> str:
    parts = []
    for name in lives[0]["tenants"]:
        lim = [x for lv in lives for x in lv["tenants"][name]["limits"]]
        parts.append(f"{name} {min(lim)}–{max(lim)}" if lim else f"{name} {lives[0]['tenants'][name]['final_limit']}")
    return ", ".join(parts)


def replace_section(doc: Path, header: str, body: str) -> None:
    """Put ``body`` (which starts with the ``header`` line) in ``doc`` in place of the section under ``header``,
    up to the next ``## `` heading (later sections are kept), or at the end when there is none."""
    text = doc.read_text() if doc.is_file() else ""
    m = re.search(rf"^{re.escape(header)}[ \t]*$", text, flags=re.M)
    if m is None:
        head = text.rstrip("\n")
        doc.write_text((head + "\n\n" if head else "") + body)
        return
    nxt = re.search(r"^## ", text[m.end():], flags=re.M)
    tail = text[m.end() + nxt.start():] if nxt else ""
    head = text[: m.start()].rstrip("\n")
    doc.write_text((head + "\n\n" if head else "") + body.rstrip("\n") + "\n" + ("\n" + tail if tail else ""))


def write_section(doc: Path, section: str) -> None:
    """Put ``section`` in ``doc``, replacing an earlier sim-to-live section (the sections after it stay)."""
    replace_section(doc, SECTION, section)


def _lateness_p99_ms(stack: Stack, emu: str) -> float | None:
    try:
        return round(float(stack.admin(emu, "/debug/requests", timeout=30)["event_lateness_s"]["p99"]) * 1000, 2)
    except (OSError, KeyError, TypeError, ValueError):
        return None


def run_policy(sc: Scenario, scenario: str, requests: list[Request], policy: str, seed: int, workdir: Path,
               console: Console, repeat: int = 1) -> dict[str, Any]:
    """The simulator once (it is deterministic) and ``repeat`` live runs, each on a fresh emulator and gateway."""
    import os

    assert isinstance(sc.engine, TokenEngineConfig), "run_sim2live refuses slot-engine scenarios"

    sim = simulate(sc, requests, policy, seed)
    console.print(f"{policy}, simulator: {sim['completed']} of {len(requests)} requests, "
                  f"{sim['throughput_rps']} req/s, e2e p99 {sim['e2e_p99_s']} s")
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", policy)
    lives = []
    for rep in range(repeat):
        with Stack(workdir / tag / f"rep{rep}") as stack:
            trace = stack.workdir / "requests.jsonl"
            write_trace(sc, requests, trace)
            emu = stack.emulator("--preset", sc.engine.preset, "--seed", str(seed))
            load_before = os.getloadavg()[0]
            console.print(f"{policy}, live {rep + 1}/{repeat}: replaying {len(requests)} requests over "
                          f"{sc.horizon_s:g} s (load average {load_before:.2f}) ...")
            live = run_live(stack, emu, "live", gateway_config(sc), load_config(sc, trace), policy, sc.interval_s,
                            scenario=scenario, start_on_traffic=True)
            live["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]  # at its start and end
            live["emulator_lateness_p99_ms"] = _lateness_p99_ms(stack, emu)
            live["schedule"] = align_decisions(sim["decisions"], live.pop("decision_log"), sc.interval_s)
            live["per_request_gap"] = per_request_gap(sim["per_request_e2e"], Path(live["workdir"]) / "requests.jsonl")
        lives.append(live)
    sim.pop("per_request_e2e")
    late = [lv["emulator_lateness_p99_ms"] for lv in lives if lv["emulator_lateness_p99_ms"] is not None]
    return {"policy": policy, "repeat": repeat, "emulator_lateness_p99_ms": max(late, default=None), "sim": sim,
            "lives": lives, "comparison": compare(sim, lives)}


def print_run(run: dict[str, Any], console: Console) -> None:
    n = run["repeat"]
    table = Table(title=f"sim2live: {run['policy']} ({n} live run{'s' if n > 1 else ''})")
    for col in ("scope", "metric", "simulator", "live (median)", "live min–max", "diff", "≤10%", "runs ≤10%"):
        table.add_column(col)
    for scope, rows in run["comparison"].items():
        for m, r in rows.items():
            table.add_row(scope, m, _fmt(r["sim"]), _fmt(r["live"]), f"{_fmt(r['live_min'])}–{_fmt(r['live_max'])}",
                          _pct(r["rel_diff"]), "yes" if r["within"] else "no", f"{r['reps_within']}/{n}")
    console.print(table)
    for lv in run["lives"]:
        sch = lv["schedule"]
        console.print(f"  live run: load average {lv['loadavg_1m'][0]:.2f}→{lv['loadavg_1m'][1]:.2f}, "
                      f"decisions with the simulator's limits {sch['same_limits']}/{sch['decisions']} "
                      f"(first difference at t={sch['first_difference_t']}, at most {sch['max_limit_gap']} apart), "
                      f"largest offset {sch['max_offset_s']} s")


def run_sim2live(scenario: str, policies: list[str], horizon: float | None, seed: int, out: Path, doc: Path | None,
                 workdir: Path | None, repeat: int, console: Console) -> dict[str, Any]:
    """Run a scenario and policies in the simulator and live on the same requests; write and return the JSON."""
    import os

    sc = load_scenario(scenario, **({"horizon_s": horizon} if horizon else {}))
    if isinstance(sc.engine, SlotEngineConfig):
        raise ValueError("sim2live needs a token-engine scenario (the emulator runs the token engine)")
    requests = replay_requests(sc, seed)
    loadavg = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="admit-s2l-") as tmp:
        for pol in policies:
            runs.append(run_policy(sc, scenario, requests, pol, seed, workdir or Path(tmp), console, repeat))
            print_run(runs[-1], console)
    cmd = f"admit sim2live --scenario {scenario} " + " ".join(f"--policy {p}" for p in policies) + f" --seed {seed}"
    cmd += (f" --horizon {horizon:g}" if horizon else "") + (f" --repeat {repeat}" if repeat > 1 else "")
    result = {"command": cmd, "scenario": scenario, "seed": seed, "horizon_s": sc.horizon_s,
              "requests": len(requests), "loadavg": loadavg, "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {out}")
    if doc is not None:
        write_section(doc, markdown(result))
        console.print(f"wrote the '{SECTION}' section of {doc}")
    return result
