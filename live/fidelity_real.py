"""`admit sim2live --backend URL`: the simulator against a REAL vLLM server, on the same requests, at several loads.

For each load (a multiple of the scenario's arrival rates) the simulator draws the scenario's requests for
the seed (each tenant shifted to start at 0 and cut at the horizon, as `admit loadgen` replays them) and runs
the policy on them with the scenario's preset — for the CI engine that is `cpu-smollm2`, fitted to it by
`admit calibrate`. The same requests then go through a fresh gateway (the scenario's limits, queues, SLOs)
and `admit control` with the same policy to the running server, by `admit loadgen` (``ignore_eos``, so
each answer has its drawn length; each prompt starts with its request number and every run salts vLLM's prefix
cache with a token of its own, so the prefix cache, which the simulator does not model, serves nothing; the
prompt is written two tokens short for the number).

Per tenant and overall: throughput and goodput (requests/s meeting the tenant's TTFT and TPOT objectives),
TTFT, TPOT and e2e p50/p99 — nearest-rank on both sides. The simulator's error on a figure is
(sim − real) / real. The targets, at each load: the median absolute error over the scopes of
throughput and the TTFT/TPOT p50s ≤ 15%, of the p99s ≤ 25%. The live limits are matched with the
simulator's decision by decision (sim2live.align_decisions): the same controller's trajectory in both.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import statistics
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from admit.engine.presets import overriding, preset_from_calibration
from admit.envs.family import scenario_load
from admit.envs.scenario import Scenario, TokenEngineConfig, load_scenario
from admit.live.run import run_live
from admit.live.sim2live import (
    align_decisions,
    gateway_config,
    load_config,
    replace_section,
    replay_requests,
    simulate,
)
from admit.live.stack import Stack, wait_idle
from rich.console import Console
from rich.table import Table

SECTION = "## Simulator vs real vLLM"
SCENARIO = Path(__file__).parent / "scenarios" / "cpu-smollm2-duo.yaml"
METRICS = ("throughput_rps", "goodput_rps", "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "ttft_p99_s", "tpot_p99_s",
           "e2e_p99_s")
CENTRAL = ("throughput_rps", "ttft_p50_s", "tpot_p50_s")  # target: median |error| <= 15%
TAILS = ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s")  # target: median |error| <= 25%
TARGETS = {"central": 0.15, "tails": 0.25}
PROMPT_NUMBER_TOKENS = 2  # the request number that starts each prompt: 1-3 digits, one token each


# what multiplies an arrival process's rate: its rates (a burst process's on and off rates, a ramp's ends), or a
# trace's speed-up
_RATE_FIELDS = ("rate", "rate_start", "rate_on", "rate_off", "speedup")


def scaled(sc: Scenario, load: float) -> Scenario:
    """The scenario with every tenant's arrival rate times ``load``: each rate of its arrival process (Poisson,
    constant, gamma, diurnal, ramp; both of an MMPP's), a trace's speed-up; the shape is kept."""
    if load <= 0:
        raise ValueError(f"a load must be > 0, got {load:g}")
    tenants = []
    for t in sc.tenants:
        a = t.arrival
        update = {f: getattr(a, f) * load for f in _RATE_FIELDS if isinstance(getattr(a, f, None), int | float)}
        if not update:
            raise ValueError(f"--load scales arrival rates; tenant {t.name!r} has {a.kind} arrivals, which have none")
        tenants.append(t.model_copy(update={"arrival": a.model_copy(update=update)}))
    return sc.model_copy(update={"tenants": tenants, "name": f"{sc.name}@{load:g}"})


def write_trace(sc: Scenario, requests: list[Any], path: Path) -> None:
    names = [t.name for t in sc.tenants]
    with path.open("w") as fh:
        for r in requests:
            fh.write(json.dumps({"tenant": names[r.tenant], "arrival": round(r.arrival, 6),
                                 "prompt_tokens": max(1, r.prompt_tokens - PROMPT_NUMBER_TOKENS),
                                 "output_tokens": r.output_tokens}) + "\n")


def real_load_config(sc: Scenario, trace: Path) -> dict[str, Any]:
    """sim2live's load for a real vLLM server: numbered prompts, so no request's prompt is another's prefix, and
    a ``cache_salt`` of this run's own (vLLM's prefix-cache isolation), so no run reads what an earlier one of the
    same requests left in the cache; the simulator models no prefix cache."""
    cfg = {**load_config(sc, trace), "unique_prompts": True, "timeout": 300}
    salt = secrets.token_hex(8)
    cfg["tenants"] = [{**t, "extra": {**t.get("extra", {}), "cache_salt": salt}} for t in cfg["tenants"]]
    return cfg


def errors(sim: dict[str, Any], real: dict[str, Any]) -> dict[str, Any]:
    """Per scope (``all`` and each tenant) and metric: sim, real and (sim − real) / real."""

    def rows(s: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for m in METRICS:
            a, b = s.get(m), r.get(m)
            err = None if a is None or not b else round((a - b) / b, 4)
            out[m] = {"sim": a, "real": b, "error": err}
        return out

    return {"all": rows(sim, real), **{n: rows(sim["tenants"][n], real["tenants"][n]) for n in sim["tenants"]}}


def summary(errs: dict[str, Any]) -> dict[str, Any]:
    """Median absolute error of the central figures and of the tails, over every scope, against the targets."""
    out = {}
    for group, metrics in (("central", CENTRAL), ("tails", TAILS)):
        vals = [abs(row[m]["error"]) for row in errs.values() for m in metrics if row[m]["error"] is not None]
        med = round(statistics.median(vals), 4) if vals else None
        out[group] = {"median_abs_error": med, "target": TARGETS[group],
                      "met": med is not None and med <= TARGETS[group], "figures": len(vals)}
    return out


def run_load(sc: Scenario, scenario: str, load: float, policy: str, seed: int, backend: str, workdir: Path,
             console: Console) -> dict[str, Any]:
    scl = scaled(sc, load)
    util = round(scenario_load(scl), 3)  # the preset's capacity estimate (engine/capacity.py): 1 = saturated
    requests = replay_requests(scl, seed)
    sim = simulate(scl, requests, policy, seed)
    sim.pop("per_request_e2e")
    wait_idle(backend)
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{policy}-x{load:g}")
    with Stack(workdir / tag) as stack:
        trace = stack.workdir / "requests.jsonl"
        write_trace(scl, requests, trace)
        load_cfg = real_load_config(scl, trace)
        before = os.getloadavg()[0]
        console.print(f"{policy} at load {load:g} (estimated utilisation {util:g}): {len(requests)} requests over "
                      f"{scl.horizon_s:g} s; simulator "
                      f"{sim['throughput_rps']} req/s; live (load average {before:.2f}) ...")
        live = run_live(stack, backend, "live", gateway_config(scl), load_cfg, policy, scl.interval_s,
                        scenario=str(scenario), start_on_traffic=True)
        live["loadavg_1m"] = [round(before, 2), round(os.getloadavg()[0], 2)]
        live["schedule"] = align_decisions(sim.pop("decisions"), live.pop("decision_log"), scl.interval_s)
    rows = live["schedule"]["rows"]
    live["schedule"]["compared"] = sum(r["live"] is not None for r in rows)  # the live loop stops with the load
    errs = errors(sim, live)
    return {"load": load, "utilisation": util, "policy": policy, "requests": len(requests), "sim": sim,
            "real": live, "errors": errs,
            "summary": summary(errs)}


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:+.1f}%"


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:g}"


def print_load(run: dict[str, Any], console: Console) -> None:
    t = Table(title=f"sim vs real vLLM: {run['policy']} at load {run['load']:g}")
    for col in ("scope", "metric", "simulator", "real vLLM", "error"):
        t.add_column(col)
    for scope, rows in run["errors"].items():
        for m, r in rows.items():
            t.add_row(scope, m, _fmt(r["sim"]), _fmt(r["real"]), _pct(r["error"]))
    console.print(t)
    s, sch = run["summary"], run["real"]["schedule"]
    console.print(f"  median |error|: central {_pct(s['central']['median_abs_error'])} (target 15%), tails "
                  f"{_pct(s['tails']['median_abs_error'])} (target 25%); limits equal at {sch['same_limits']} of "
                  f"{sch['compared']} decisions both sides made (at most {sch['max_limit_gap']} apart)")


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{SECTION}\n",
             f"Generated by `{result['command']}` (live/fidelity_real.py) against {result['server']}; "
             f"scenario `{result['scenario']}` (live/scenarios/), seed {result['seed']}, {result['horizon_s']:g} s "
             f"of requests per load; preset `{result['preset']}`. Error = (simulator − real) / real; nearest-rank "
             "percentiles on both sides; real figures are measured at the load generator (through the gateway). "
             "Estimated utilisation: the offered requests' share of what the preset's capacity estimate says the "
             "engine sustains on this mix (engine/capacity.py; 1 = saturated).\n",
             "| load | est. utilisation | policy | requests | central: median abs error (≤ 15%) | tails: median abs "
             "error (≤ 25%) | limits equal / decisions both made | live limits |",
             "|---|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        s, sch = run["summary"], run["real"]["schedule"]
        span = ", ".join(f"{n} {min(t['limits'])}–{max(t['limits'])}" if t["limits"] else f"{n} —"
                         for n, t in run["real"]["tenants"].items())
        lines.append(f"| {run['load']:g} | {run.get('utilisation', '—')} | {run['policy']} | {run['requests']} | "
                     f"{_pct(s['central']['median_abs_error'])} {'met' if s['central']['met'] else 'missed'} | "
                     f"{_pct(s['tails']['median_abs_error'])} {'met' if s['tails']['met'] else 'missed'} | "
                     f"{sch['same_limits']}/{sch['compared']} | {span} |")
    lines.append("")
    for run in result["runs"]:
        scopes = list(run["errors"])
        lines += [f"**{run['policy']} at load {run['load']:g}** (load average {run['real']['loadavg_1m'][0]:.2f}"
                  f"→{run['real']['loadavg_1m'][1]:.2f}); simulator / real / error:\n",
                  "| metric | " + " | ".join(scopes) + " |", "|---|" + "---|" * len(scopes)]
        for m in METRICS:
            cells = [f"{_fmt(run['errors'][sc][m]['sim'])} / {_fmt(run['errors'][sc][m]['real'])} / "
                     f"{_pct(run['errors'][sc][m]['error'])}" for sc in scopes]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


DEFAULT_UTILISATIONS = (0.25, 0.65, 1.05)  # light, near the knee, overloaded


def loads_for(sc: Scenario, utilisations: list[float]) -> list[float]:
    """The multiples of ``sc``'s rates at which the preset's capacity estimate (engine/capacity.py) puts the
    engine at each utilisation: machine-independent loads, since a faster engine's preset is faster too."""
    if any(not u > 0 for u in utilisations):
        raise ValueError(f"a utilisation must be > 0 (1 = the engine's estimated capacity), got {utilisations}")
    at_one = scenario_load(sc)
    return [float(f"{u / at_one:.3g}") for u in utilisations]


def run_real(backend: str, scenario: str | None, policies: list[str], loads: list[float], horizon: float | None,
             seed: int, out: Path, doc: Path | None, workdir: Path | None, console: Console,
             calibration: Path | None = None, utilisations: list[float] | None = None) -> dict[str, Any]:
    """Every policy at every load against the server at ``backend``; write and return the JSON.

    ``loads`` are multiples of the scenario's rates; ``utilisations`` (instead) are shares of the engine's
    estimated capacity, turned into loads with the preset in use (:func:`loads_for`); neither: the
    default utilisations. ``calibration``: an `admit calibrate` result of this server, whose fit the
    simulator uses in place of the scenario's committed preset (the same engine on another machine is
    another engine)."""
    base = backend.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        served = [m["id"] for m in json.loads(r.read())["data"]]
    name = scenario or str(SCENARIO)
    sc = load_scenario(name, **({"horizon_s": horizon} if horizon else {}))
    if not isinstance(sc.engine, TokenEngineConfig):
        raise ValueError("sim2live --backend needs a token-engine scenario")
    if loads and utilisations:
        raise ValueError("give --load (multiples of the scenario's rates) or --utilisation (shares of the engine's "
                         "estimated capacity), not both")
    runs = []
    fitted: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if calibration is not None:
        fitted = overriding(preset_from_calibration(json.loads(calibration.read_text()), sc.engine.preset))
    with tempfile.TemporaryDirectory(prefix="admit-real-") as tmp, fitted:
        if not loads:
            loads = loads_for(sc, list(utilisations or DEFAULT_UTILISATIONS))
        for load in loads:
            for pol in policies:
                runs.append(run_load(sc, name, load, pol, seed, base, workdir or Path(tmp), console))
                print_load(runs[-1], console)
    shown = ("" if scenario is None else f" --scenario {scenario}") + (" --calibration FILE" if calibration else "")
    how = (" ".join(f"--utilisation {u:g}" for u in utilisations) if utilisations
           else " ".join(f"--load {x:g}" for x in loads))
    cmd = (f"admit sim2live --backend URL{shown} " + " ".join(f"--policy {p}" for p in policies) + " " + how
           + f" --seed {seed}"
           + (f" --horizon {horizon:g}" if horizon else ""))
    preset = sc.engine.preset + (f" (refitted: {calibration.name})" if calibration else "")
    result = {"command": cmd, "server": f"{served[0]} on vLLM", "scenario": sc.name, "preset": preset,
              "seed": seed, "horizon_s": sc.horizon_s, "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {out}")
    if doc is not None:
        replace_section(doc, SECTION, markdown(result))
        console.print(f"wrote the '{SECTION}' section of {doc}")
    return result
