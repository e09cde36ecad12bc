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
(other scenario, policies, duration, seeds, backend, warm-up, load or calibration) is refused, never
overwritten. A line before each run and a progress bar (`RunProgress`) tell how far it is and the time left.

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

Where the scenario's tenants have contracts (core/contract.py), each run's gateway classifies every request
at its arrival on its tenant's contract (admit.live.sim2live.gateway_config passes them), and the run's
contract figures are read from its request log (`live_contracts`: the gateway's classes, each request good by
the simulator's test, envs/contracts.py's arithmetic); so are every tenant's excess goodput and its mean
concurrency borrowed beyond its nominal share and lent of it (`live_lending`: each request in flight from its
admission to its end, at the control loop's decisions, by envs/contracts.py's ``lending_figures``); the twin gets
them offline, the statistics summarise them with each tenant's contract, and the verdicts by the contracts are in
the JSON (``verdicts``) as in the table. Without contracts none of this appears.

``calibration`` (an `admit calibrate` result of the backend) replaces the scenario's engine preset by its fit
wherever a model of the engine is used: the policies are bound to the scenario on it, in this process (where
static:best is tuned, before the first run, if it has no caps for that engine yet: agents/static_best.py's
fingerprint takes the fit in) and in every run's `admit control --calibration`, so the live baseline deploys
caps tuned for the engine it runs on; and the twin simulates it.

Live-only figures, per run (``runs`` in the JSON) and per policy in the printed table: the load
generator's own validity (achieved / requested rate, send-lag p99), the backend's KV usage (mean, peak),
preemptions and peak requests in the engine, scraped from its /metrics every second while the run is in
flight (`BackendSampler`), every tenant's limit after each decision, and the gateway's own overhead
(admit.live.run.gateway_overhead: its part of each request's TTFT, queue wait and backend excluded, p50 / p99,
and the client's mean TTFT less the gateway's).

``warmup`` seconds at the start of every run are served but left out of every figure, live (the load
generator counts those requests apart; the gateway's log is cut at the same instant) and simulated
(`Simulation`'s ``warmup_s``). ``load`` multiplies every tenant's arrival rate (admit.live.fidelity_real.scaled),
for the live runs, the twin and the scenario a policy is bound to alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from admit.agents.registry import make_controller
from admit.core import metrics_page
from admit.core.metrics_page import E2E, KV, PREEMPTIONS, RUNNING, WAITING
from admit.core.slo import is_good, tpot
from admit.engine.presets import overriding, preset_from_calibration
from admit.engine.request import Request
from admit.envs.contracts import (
    contract_figures,
    contract_json,
    episode_contracts,
    episode_lending,
    lending_figures,
    request_classes,
)
from admit.envs.scenario import Scenario, TokenEngineConfig, load_scenario
from admit.envs.simulation import Simulation, decision_times, in_flight_at, jain
from admit.evaluate.offline import METRICS as ALL_METRICS
from admit.evaluate.offline import TENANT_METRICS as ALL_TENANT_METRICS
from admit.evaluate.offline import Episode, Evaluation, check_policies
from admit.live.run import read_request_log, run_live
from admit.live.sim2live import DRAIN_S, gateway_config, load_config, replay_requests, write_trace
from admit.live.stack import Stack, wait_idle
from rich.console import Console
from rich.table import Table

# 2: runs with contracts carry the lending figures (run["lending"]); a file of format 1 is not resumed, since its
# runs lack them and the statistics summarise every run alike
FORMAT = "admit-protocol/2"
# What a live run measures of `admit evaluate`'s figures; the seed study's legacy ones are left out.
METRICS = tuple(m for m in ALL_METRICS if m not in ("p99_s", "p50_s", "slo_attainment", "jain_fairness"))
TENANT_METRICS = tuple(m for m in ALL_TENANT_METRICS if m != "output_tokens_per_s")
SIDE_BY_SIDE = ("goodput_rps", "attainment", "worst_attainment", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s")
SIDE_BY_SIDE_CONTRACTS = ("contracts_met", "contract_shortfall", "jain_share")  # beside them, where measured


class ProtocolError(ValueError):
    """A protocol that cannot run as asked (what was wrong, what is allowed)."""


def run_order(policies: Sequence[str], seed: int) -> list[str]:
    """The policies in the order repeat ``seed`` runs them: a shuffle drawn from the seed alone."""
    order = list(policies)
    random.Random(f"admit-protocol-{seed}").shuffle(order)
    return order


def _lat(v: float | None) -> float:
    return 0.0 if v is None else float(v)


def line_good(r: dict[str, Any], bounds: tuple[float, float, float]) -> bool:
    """Whether a gateway request-log line was good, as the gateway and the simulator judge it: outcome ok within
    each of the tenant's per-request objectives ``bounds`` (core/slo.py's ``is_good`` on the gateway's TTFT,
    TPOT and e2e, from the request's arrival at the gateway)."""
    if r["outcome"] != "ok" or r.get("e2e_s") is None:
        return False
    e2e = float(r["e2e_s"])
    ttft = e2e if r.get("ttft_s") is None else float(r["ttft_s"])  # an unstreamed answer: its first token last
    return is_good(ttft, tpot(e2e, ttft, int(r.get("output_tokens") or 0)), e2e, bounds)


@dataclass(frozen=True)
class ContractLines:
    """The requests of a live run that the gateway classified on a tenant's contract, as columns: the request
    log's lines with ``contract_at`` set (a line it never classified, such as the load generator's GET
    /v1/models or a body it could not read, was no request offered to the tenant's contract)."""

    arrival: np.ndarray  # the gateway's arrival, unix seconds
    tenant: np.ndarray  # the tenant's index in the scenario
    inside: np.ndarray  # in contract, as the gateway classified it at arrival (``in_contract``)
    good: np.ndarray  # `line_good`
    prompt: np.ndarray
    output: np.ndarray


def contract_lines(sc: Scenario, lines: list[dict[str, Any]]) -> ContractLines:
    """`ContractLines` of the gateway's request-log ``lines`` (admit.live.run.read_request_log's) for the
    scenario's tenants that have a contract (only their lines are classified)."""
    index = {t.name: k for k, t in enumerate(sc.tenants) if t.contract is not None}
    rows = [r for r in lines if r["tenant"] in index and r.get("contract_at") is not None]
    bounds = [t.request_bounds for t in sc.control_spec().tenants]
    return ContractLines(
        arrival=np.array([float(r["arrival"]) for r in rows], dtype=np.float64),
        tenant=np.array([index[r["tenant"]] for r in rows], dtype=np.int64),
        inside=np.array([r.get("in_contract") is True for r in rows], dtype=bool),
        good=np.array([line_good(r, bounds[index[r["tenant"]]]) for r in rows], dtype=bool),
        prompt=np.array([int(r["prompt_tokens"]) for r in rows], dtype=np.int64),
        output=np.array([int(r["output_tokens"]) for r in rows], dtype=np.int64),
    )


def live_contracts(sc: Scenario, lines: list[dict[str, Any]]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """A live run's contract figures (envs/contracts.py's, both empty without contracts) from the gateway's
    request log (admit.live.run.read_request_log's lines, cut at the warm-up): the requests the gateway
    classified (`contract_lines`), each in contract as the gateway classified it at arrival, good as the gateway
    and the simulator judge it (`line_good`), by envs/contracts.py's ``contract_figures``, the simulator's
    arithmetic."""
    if not sc.has_contracts:
        return {}, {}
    c = contract_lines(sc, lines)
    return contract_figures(sc, c.tenant, c.inside, c.good, c.prompt, c.output)


def live_decisions(decision_log: list[dict[str, Any]], started_unix: float, duration_s: float, interval_s: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(Unix times, seconds on the simulator's clock) of a live run's decisions within its load's ``duration_s``:
    the control loop's (its decision log, admit.live.run.run_live's ``decision_log``: the first on the idle
    gateway, the simulator's t = 0, then ``since_traffic_s`` from the first request), or, where the log has none,
    one every ``interval_s`` from the load's start ``started_unix``."""
    recs = [d for d in decision_log if "decision" in d]  # a fetch error is logged, but decides nothing
    if recs:
        times = np.array([float(d["time"]) for d in recs], dtype=np.float64)
        clock = np.array([float(d.get("since_traffic_s", 0.0)) for d in recs], dtype=np.float64)
    else:
        clock = np.arange(0.0, duration_s, interval_s, dtype=np.float64)
        times = started_unix + clock
    keep = clock < duration_s
    return times[keep], clock[keep]


def live_lending(sc: Scenario, lines: list[dict[str, Any]], times: np.ndarray, after: np.ndarray,
                 since_unix: float, span_s: float) -> dict[str, dict[str, float]]:
    """A live run's per tenant ``excess_goodput``, ``borrowed`` and ``lent`` (envs/contracts.py's
    ``lending_figures``, `episode_lending`'s arithmetic; empty without contracts) from the gateway's request log
    ``lines`` (every line of the run: a request admitted in the warm-up is still in flight after it) at the
    decisions' Unix ``times``, of which ``after`` count (`live_decisions`). A request is in flight from its
    admission (its arrival plus its queue wait; a line without a queue wait was never admitted) to its end (its
    arrival plus its e2e); it counts for the excess when it arrived at or after ``since_unix``, in contract as the
    gateway classified it, good as `line_good` judges it; ``excess_goodput`` is a rate over ``span_s``."""
    if not sc.has_contracts:
        return {}
    index = {t.name: k for k, t in enumerate(sc.tenants)}
    rows = [r for r in lines if r["tenant"] in index and r.get("queue_wait_s") is not None]
    bounds = [t.request_bounds for t in sc.control_spec().tenants]
    arrival = np.array([float(r["arrival"]) for r in rows], dtype=np.float64)
    tenant = np.array([index[r["tenant"]] for r in rows], dtype=np.int64)
    admitted = arrival + np.array([float(r["queue_wait_s"]) for r in rows], dtype=np.float64)
    end = arrival + np.array([np.nan if r.get("e2e_s") is None else float(r["e2e_s"]) for r in rows],
                             dtype=np.float64)
    per, _ = lending_figures(
        sc, tenant,
        inside=np.array([r.get("in_contract") is True for r in rows], dtype=bool),
        good=np.array([line_good(r, bounds[index[r["tenant"]]]) for r in rows], dtype=bool),
        counted=arrival >= since_unix,
        in_flight=in_flight_at(tenant, admitted, end, len(sc.tenants), times),
        times=times, after=after, span_s=span_s)
    return per


def live_episode(run: dict[str, Any]) -> Episode:
    """One live run (admit.live.run.run_live's record) as an Episode of `METRICS` and `TENANT_METRICS`, and
    where the tenants have contracts their figures (``run["contracts"]``: `live_contracts`; ``run["lending"]``:
    `live_lending`)."""
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
    per, overall = run.get("contracts", ({}, {}))
    for name, f in per.items():
        tenants[name].update(f)
    for name, f in run.get("lending", {}).items():
        tenants[name].update(f)
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
        **overall,
        "tenants": tenants,
    }


def sim_episode(sc: Scenario, requests: list[Request], policy: str, seed: int,
                bound: Scenario | None = None, warmup_s: float = 0.0) -> Episode:
    """The policy on exactly ``requests`` in the simulator (drained after the horizon, as a live run's load
    generator waits for its answers), as an Episode of the same figures. ``bound``: the scenario a policy that
    needs one (static:best) is bound to — the whole scenario, as the live control loop binds it, not ``sc``
    cut to the protocol's duration (whose caps nobody tuned). ``warmup_s``: requests arriving before it are
    served but left out of the figures, as the live run's load generator leaves them out."""
    ctrl = make_controller(policy, bound or sc)
    ctrl.reset(sc.control_spec(), seed)
    sim = Simulation(sc, seed, requests=requests, warmup_s=warmup_s)
    stats = sim.run(ctrl, until=sc.horizon_s + DRAIN_S, name=policy)
    summary = sim.summary()
    ep: Episode = {m: float(v) for m, v in summary.items() if m in METRICS}
    ep["e2e_p50_s"], ep["e2e_p99_s"] = float(summary["p50_s"]), float(summary["p99_s"])
    ep["mean_limit"] = float(stats.mean_limit)
    ep["tenants"] = {n: {m: float(v) for m, v in t.items() if m in TENANT_METRICS}
                     for n, t in sim.tenant_summary().items()}
    if sc.has_contracts:  # the same figures as rollout's, counted after the same warm-up
        cols = sim.request_columns()
        classes = request_classes(sc, cols)
        per, overall = episode_contracts(sc, cols, warmup_s, classes)
        lend, _ = episode_lending(sc, cols, decision_times(sc), warmup_s, classes=classes)
        ep.update(overall)
        for name, f in per.items():
            ep["tenants"][name].update(f)
        for name, f in lend.items():
            ep["tenants"][name].update(f)
    return ep


# what a protocol file written before a field existed means by its absence
_IDENTITY_DEFAULTS = {"warmup_s": 0.0, "load": 1.0, "calibration": None}


def _identity(scenario: str, policies: Sequence[str], duration: float, seed_base: int, backend: str | None,
              warmup: float = 0.0, load: float = 1.0, calibration: str | None = None) -> dict:
    return {"format": FORMAT, "scenario": scenario, "policies": list(policies), "duration_s": duration,
            "seed_base": seed_base, "backend": backend or "admit emulate (a fresh one per run)", "warmup_s": warmup,
            "load": load, "calibration": calibration}


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
    diff = [f"{k} {old.get(k, _IDENTITY_DEFAULTS.get(k))!r} (asked: {v!r})" for k, v in ident.items()
            if old.get(k, _IDENTITY_DEFAULTS.get(k)) != v]
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
               episodes: dict[str, dict[int, Episode]], contracts: dict[str, dict] | None = None
               ) -> dict[str, Any] | None:
    """`admit evaluate`'s JSON over ``seeds`` (the valid repeats); None when there is no valid repeat.
    ``contracts``: each tenant's contract as given (envs/contracts.py's ``contract_json``), where there are
    contracts: the contract figures are then summarised too and the verdict judges by them."""
    if not seeds:
        return None
    per_seed = {p: [episodes[p][s] for s in seeds] for p in policies}
    return Evaluation(name, list(seeds), list(policies), per_seed, duration, METRICS, TENANT_METRICS,
                      contracts=contracts or {}).to_json()


def verdict_json(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    """evaluate/verdict.py's verdict of every policy against the first (outcome and reasons; None for the
    first), or None without statistics."""
    if stats is None:
        return None
    from admit.evaluate.verdict import verdicts

    return {p: None if v is None else {"outcome": v.outcome, "reasons": list(v.reasons)}
            for p, v in verdicts(stats).items()}


def aggregate(name: str, duration: float, policies: Sequence[str], seeds: Sequence[int], runs: dict[str, Any],
              simulate: bool, contracts: dict[str, dict] | None = None) -> dict[str, Any]:
    """The statistics over the repeats whose every run was valid (a repeat with one invalid run is excluded for
    every policy: the tests are paired by repeat), what was excluded and why, and the simulated twin's
    statistics over every repeat (the simulator cannot fall behind). Where the tenants have ``contracts``
    (`statistics`), ``verdicts`` too: evaluate/verdict.py's, by the contracts, live and of the twin."""
    valid = [s for s in seeds if all(runs[f"{s}/{p}"]["valid"] for p in policies)]
    excluded = [{"seed": s, "reasons": [f"{p}: {r}" for p in policies for r in runs[f"{s}/{p}"]["invalid_reasons"]]}
                for s in seeds if s not in valid]
    live_eps = {p: {s: runs[f"{s}/{p}"]["episode"] for s in seeds} for p in policies}
    out: dict[str, Any] = {"valid_repeats": valid, "excluded": excluded,
                           "results": statistics(name, duration, policies, valid, live_eps, contracts)}
    if simulate:
        sim_eps = {p: {s: runs[f"{s}/{p}"]["simulated"] for s in seeds} for p in policies}
        out["simulated"] = statistics(name, duration, policies, seeds, sim_eps, contracts)
    if contracts:
        out["verdicts"] = {"results": verdict_json(out["results"]),
                           **({"simulated": verdict_json(out["simulated"])} if simulate else {})}
    return out


class BackendSampler:
    """The backend's /metrics scraped every ``every_s`` seconds in a thread while a run is in flight: the KV
    cache's usage (``vllm:kv_cache_usage_perc``, its mean and peak over the samples), preemptions
    (``vllm:num_preemptions_total``, the increase), requests running and waiting at once (peak) and the
    backend's own request latency (``vllm:e2e_request_latency_seconds``: sum and count increases, so a mean
    over the requests it finished). A scrape that fails (no answer, or not Prometheus text) is counted, never
    fatal."""

    SERIES = (KV, PREEMPTIONS, RUNNING, WAITING, E2E + "_sum", E2E + "_count")

    def __init__(self, url: str, every_s: float = 1.0) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.every_s = every_s
        self.samples: list[dict[str, float]] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="backend-sampler", daemon=True)

    def scrape(self) -> dict[str, float] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as r:
                return metrics_page.sums(r.read().decode(), self.SERIES)  # summed over engines and models
        except (OSError, UnicodeDecodeError, metrics_page.MetricsPageError):  # unreachable, or not a /metrics page
            self.failures += 1
            return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            got = self.scrape()
            if got is not None:
                self.samples.append(got)
            self._stop.wait(self.every_s)

    def __enter__(self) -> BackendSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        got = self.scrape()  # the last word: counters after the run
        if got is not None:
            self.samples.append(got)

    def figures(self) -> dict[str, Any]:
        def col(k: str) -> list[float]:
            return [x[k] for x in self.samples if k in x]

        kv = col(KV)
        pre, e2s, e2n = col(PREEMPTIONS), col(E2E + "_sum"), col(E2E + "_count")
        busy = [x.get(RUNNING, 0.0) + x.get(WAITING, 0.0) for x in self.samples]
        done = e2n[-1] - e2n[0] if len(e2n) > 1 else 0.0
        return {"samples": len(self.samples), "scrape_failures": self.failures,
                "kv_usage_mean": round(sum(kv) / len(kv), 4) if kv else None,
                "kv_usage_peak": round(max(kv), 4) if kv else None,
                "preemptions": round(pre[-1] - pre[0]) if len(pre) > 1 else None,
                "in_engine_peak": max(busy, default=None),
                "backend_e2e_mean_s": round((e2s[-1] - e2s[0]) / done, 4) if done > 0 else None,
                "backend_finished": round(done)}


def _one_live(sc: Scenario, scenario: str, requests: list[Request], policy: str, seed: int, backend: str | None,
              root: Path, tag: str, warmup: float = 0.0, calibration: Path | None = None) -> dict[str, Any]:
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
            wait_idle(backend)  # the cool-down: the previous run's stragglers are done
            target = backend
        load["warmup"] = warmup
        with BackendSampler(target) as sampler:
            run = run_live(stack, target, "live", gateway_config(sc), load, policy, sc.interval_s,
                           scenario=scenario, start_on_traffic=True, calibration=calibration)
        run["backend"] = sampler.figures()
    work = Path(run.pop("workdir"))
    if sc.has_contracts:  # the gateway's request log from the load's start after the warm-up, as run_live reads it
        started = float(json.loads((work / "loadgen" / "summary.json").read_text())["stages"][0]["started_unix"])
        lines = read_request_log(work / "requests.jsonl", 0.0)  # a fresh gateway: every line is this run's
        run["contracts"] = live_contracts(sc, [r for r in lines if r["arrival"] >= started + warmup])
        times, clock = live_decisions(run["decision_log"], started, float(run["duration_s"]), sc.interval_s)
        run["lending"] = live_lending(sc, lines, times, clock >= warmup, started + warmup,
                                      float(run["duration_s"]) - warmup)
    return run


class RunProgress:
    """A progress bar over the protocol's runs, advanced every half second while a run is in flight (by its
    elapsed time, up to its duration of requests), with the time left estimated from the runs done so far (or
    from the duration and about 15 s of start-up and cool-down before the first is done)."""

    def __init__(self, console: Console, runs: int, duration: float) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.runs, self.duration = runs, duration
        self.progress = Progress(TextColumn("protocol"), BarColumn(), TextColumn("{task.fields[left]}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.task = self.progress.add_task("runs", total=max(runs, 1) * duration, left="")
        self.done = 0
        self.walls: list[float] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def start_run(self, walls: list[float]) -> None:
        self.done, self.walls, self.t0 = len(walls), list(walls), time.monotonic()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            elapsed = time.monotonic() - self.t0
            per_run = sum(self.walls) / len(self.walls) if self.walls else self.duration + 15.0
            left = max(0.0, per_run * (self.runs - self.done) - elapsed)
            self.progress.update(self.task, completed=self.done * self.duration + min(elapsed, self.duration),
                                 left=f"about {left:.0f} s left")

    def __enter__(self) -> RunProgress:
        self.progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self.progress.stop()


def run_protocol(scenario: str, policies: Sequence[str], repeats: int, duration: float, out: Path,
                 console: Console, *, backend: str | None = None, seed_base: int = 0, simulate: bool = False,
                 plot: Path | None = None, workdir: Path | None = None,
                 calibration: Path | None = None, warmup: float = 0.0, load: float = 1.0) -> dict[str, Any]:
    """Run (or resume) the protocol; write ``out`` after every run and return the final JSON (module doc).
    ``calibration``: an `admit calibrate` result of the backend: the policies are bound to the scenario on its
    fit, live and in the twin (static:best deploys caps tuned on it), and the twin simulates it, in place of
    the scenario's preset. ``warmup``: each run's first seconds, served but
    left out of every figure, live and simulated. ``load``: every tenant's arrival rate times this."""
    check_policies(policies)
    if repeats < 1:
        raise ProtocolError(f"--repeats must be >= 1, got {repeats}")
    if not duration > 0:
        raise ProtocolError(f"--duration must be > 0 seconds, got {duration}")
    if not 0 <= warmup < duration:
        raise ProtocolError(f"--warmup must be >= 0 and < --duration ({duration:g} s), got {warmup:g}")
    if not load > 0:
        raise ProtocolError(f"--load must be > 0 (a multiple of the scenario's rates), got {load:g}")
    sc = load_scenario(scenario, horizon_s=duration)
    full = load_scenario(scenario)  # what the live control loop binds its policy to (`sim_episode`)
    if load != 1.0:
        from admit.live.fidelity_real import scaled

        try:
            sc, full = scaled(sc, load), scaled(full, load)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
    if calibration is not None and not isinstance(sc.engine, TokenEngineConfig):
        raise ProtocolError(f"--calibration refits a token engine's preset; {scenario} has a {sc.engine.kind} engine")
    if backend is None and not isinstance(sc.engine, TokenEngineConfig):
        raise ProtocolError(f"without --backend the protocol runs the emulator, which needs a token-engine "
                            f"scenario; {scenario} has a {sc.engine.kind} engine")
    fit = None  # read now, so that a bad file fails before the runs, not after them
    if calibration is not None:
        assert isinstance(sc.engine, TokenEngineConfig)
        try:
            fit = preset_from_calibration(json.loads(calibration.read_text()), sc.engine.preset)
        except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise ProtocolError(f"--calibration {calibration}: {exc}") from None
    with contextlib.nullcontext() if fit is None else overriding(fit):
        for p in policies:  # a bad name fails here, before any run; static:best is tuned now if it must be
            make_controller(p, full).reset(sc.control_spec(), seed_base)
    cal_id = None if calibration is None else f"sha256:{hashlib.sha256(calibration.read_bytes()).hexdigest()[:16]}"
    ident = _identity(scenario, policies, duration, seed_base, backend, warmup, load, cal_id)
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
    with tempfile.TemporaryDirectory(prefix="admit-protocol-") as tmp, RunProgress(console, len(todo), duration) as bar:
        root = workdir or Path(tmp)
        bound_to = scenario  # how the live control loop finds the scenario its policy is bound to
        if load != 1.0:  # the scaled scenario, as a file `admit control --scenario` reads
            root.mkdir(parents=True, exist_ok=True)
            bound_to = str(root / "scenario.yaml")
            Path(bound_to).write_text(yaml.safe_dump(full.model_dump(mode="json", exclude_unset=True), sort_keys=False))
        requests_of: dict[int, list[Request]] = {}
        for i, (s, p) in enumerate(todo):
            requests = requests_of.setdefault(s, replay_requests(sc, s))
            eta = f", about {sum(walls) / len(walls) * (len(todo) - i):.0f} s left" if walls else ""
            console.print(f"[{i + 1}/{len(todo)}{eta}] repeat {s - seed_base + 1}/{repeats} (seed {s}), "
                          f"{p}: {len(requests)} requests over {duration:g} s ...")
            t0 = time.monotonic()
            bar.start_run(walls)
            live = _one_live(sc, bound_to, requests, p, s, backend, root, f"{s}-{re.sub(r'[^A-Za-z0-9_.-]', '_', p)}",
                             warmup, calibration.resolve() if calibration is not None else None)
            rec: dict[str, Any] = {"seed": s, "policy": p, "position": orders[s].index(p), "valid": live["valid"],
                                   "invalid_reasons": live["invalid_reasons"], "episode": live_episode(live),
                                   "limits": {n: t["limits"] for n, t in live["tenants"].items()},
                                   "http_429": {n: t["http_429"] for n, t in live["tenants"].items()},
                                   "errors": {n: t["errors"] for n, t in live["tenants"].items()},
                                   "decisions": live["decisions"], "backend": live["backend"],
                                   "load": live["load"], "gateway": live["gateway"],
                                   "wall_s": round(time.monotonic() - t0, 2)}
            runs[f"{s}/{p}"] = rec
            walls.append(rec["wall_s"])
            if not rec["valid"]:
                console.print(f"[yellow]  invalid: {'; '.join(rec['invalid_reasons'])}; repeat {s - seed_base + 1} "
                              "is left out of the statistics[/yellow]")
            _write(out, snapshot())
    if simulate:  # the twin of every run, computed now (the simulator is cheap), with this command's preset
        with contextlib.nullcontext() if fit is None else overriding(fit):
            for s in seeds:
                requests = replay_requests(sc, s)
                for p in policies:
                    runs[f"{s}/{p}"]["simulated"] = sim_episode(sc, requests, p, s, full, warmup)
    data = {**snapshot(), **aggregate(sc.name, duration, policies, seeds, runs, simulate, contract_json(sc))}
    stats = data["results"]
    _write(out, data)
    print_protocol(data, console)
    if plot is not None and stats is not None:
        from admit.evaluate.report import pareto_plot

        pareto_plot(stats, plot)
        console.print(f"wrote {plot}")
    console.print(f"wrote {out}")
    return data


def _f(v: float | None, digits: int) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def print_protocol(data: dict[str, Any], console: Console) -> None:
    """`admit evaluate`'s tables for the valid repeats, what was excluded, and the simulated twin beside."""
    from admit.evaluate.report import print_table

    proto = data["protocol"]
    extra = "".join([f", load × {proto['load']:g}" if proto.get("load", 1.0) != 1.0 else "",
                     f", first {proto['warmup_s']:g} s a warm-up" if proto.get("warmup_s") else ""])
    console.print(f"admit protocol: {proto['scenario']}, {proto['repeats']} repeats × {len(proto['policies'])} "
                  f"policies, {proto['duration_s']:g} s each{extra}, on {proto['backend']}; valid repeats "
                  f"{len(data['valid_repeats'])} of {proto['repeats']}", highlight=False, markup=False)
    for ex in data["excluded"]:
        console.print(f"excluded: seed {ex['seed']}: {'; '.join(ex['reasons'])}", highlight=False, markup=False)
    if data["results"] is None:
        console.print("no valid repeat: no statistics", highlight=False, markup=False)
    else:
        print_table(data["results"], console)
    live = Table(title="live only, over every run of each policy (valid or not)")
    for col in ("policy", "runs", "invalid", "achieved rate (min)", "send lag p99 ms (max)", "KV usage mean",
                "KV peak", "preemptions", "in engine (peak)", "gateway ms p50", "gateway ms p99 (max)"):
        live.add_column(col, justify="left" if col == "policy" else "right")
    for p in proto["policies"]:
        recs = [r for r in data["runs"].values() if r["policy"] == p]
        ach = [r["load"]["achieved_ratio"] for r in recs if r["load"]["achieved_ratio"] is not None]
        lag = [r["load"]["send_lag_p99_ms"] for r in recs if r["load"]["send_lag_p99_ms"] is not None]
        kvm = [r["backend"]["kv_usage_mean"] for r in recs if r["backend"]["kv_usage_mean"] is not None]
        kvp = [r["backend"]["kv_usage_peak"] for r in recs if r["backend"]["kv_usage_peak"] is not None]
        pre = [r["backend"]["preemptions"] for r in recs if r["backend"]["preemptions"] is not None]
        eng = [r["backend"]["in_engine_peak"] for r in recs if r["backend"]["in_engine_peak"] is not None]
        gw = [r["gateway"] for r in recs if r.get("gateway", {}).get("p50_ms") is not None]  # older files: none
        g50 = sorted(g["p50_ms"] for g in gw)
        live.add_row(p, str(len(recs)), str(sum(not r["valid"] for r in recs)), _f(min(ach, default=None), 3),
                     _f(max(lag, default=None), 1), _f(sum(kvm) / len(kvm) if kvm else None, 3),
                     _f(max(kvp, default=None), 3), str(sum(pre)) if pre else "—", _f(max(eng, default=None), 0),
                     _f(g50[len(g50) // 2] if g50 else None, 2), _f(max((g["p99_ms"] for g in gw), default=None), 2))
    console.print(live)
    sim = data.get("simulated")
    if sim is None or data["results"] is None:
        return
    table = Table(title="live against its simulated twin (means over the valid repeats; simulator over all)")
    for col in ("policy", "figure", "live", "simulated", "difference"):
        table.add_column(col, justify="left" if col in ("policy", "figure") else "right")
    for p, e in data["results"]["policies"].items():
        figs = [*SIDE_BY_SIDE, *(m for m in SIDE_BY_SIDE_CONTRACTS if m in e and m in sim["policies"][p])]
        for i, m in enumerate(figs):
            a, b = e[m]["mean"], sim["policies"][p][m]["mean"]
            diff = f"{(b - a) / a:+.1%}" if a else "—"
            table.add_row(p if i == 0 else "", m, f"{a:.3f}", f"{b:.3f}", diff, end_section=i == len(figs) - 1)
    console.print(table)
