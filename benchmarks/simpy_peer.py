"""The seed-paper world written the straightforward way a competent SimPy user would write it: the peer that
benchmarks/seed_paper_speed.py measures admit's simulator against.

One process per request; each tenant's admission gate is a ``simpy.Resource`` whose capacity is the tenant's
limit (the controller sets it; SimPy has no public setter, so the capacity attribute is assigned and the
waiting requests are woken, as SimPy users do); a request waits for the gate or for its queue timeout,
whichever comes first, then holds its slot for its service time. The controller is the same object admit's
``--policy`` makes, called every ``interval_s`` on an ``Observation`` built from plain lists: completions are
appended in time order, so the window is a ``bisect`` away, and its percentiles come from one ``sorted`` list
(numpy's linear method; ``numpy.percentile`` itself costs about 25 µs a call on these few values, which would
make the peer several times slower than it need be).
The arrivals and service draws are admit's own (``draw_tenant`` on the same seed streams), so both sides
serve exactly the same requests and their means can be compared digit for digit.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right

import numpy as np
import simpy
from admit.agents.registry import make_controller
from admit.core.observation import NO_SLO, Observation, TenantObservation
from admit.envs.scenario import Scenario
from admit.envs.simulation import TenantTotals, episode_metrics
from admit.envs.workload import draw_tenant


def _pct(s: list[float], q: float) -> float:
    """Percentile ``q`` of the sorted ``s``, linear interpolation (numpy's default method)."""
    x = (len(s) - 1) * q / 100.0
    i = int(x)
    return s[i] if i + 1 >= len(s) else s[i] + (s[i + 1] - s[i]) * (x - i)


def simpy_rollout(sc: Scenario, policy: str, seed: int) -> dict[str, float]:
    env = simpy.Environment()
    n = len(sc.tenants)
    streams = np.random.SeedSequence(seed).spawn(n)
    draws = [
        draw_tenant(t.arrival, t.prompt_tokens, t.output_tokens, np.random.default_rng(s), sc.horizon_s)
        for t, s in zip(sc.tenants, streams, strict=True)
    ]
    spec = sc.control_spec()
    lim = spec.limits
    gates = [simpy.Resource(env, capacity=lim.initial) for _ in range(n)]
    arrivals: list[list[float]] = [[] for _ in range(n)]
    drops: list[list[float]] = [[] for _ in range(n)]
    finished: list[list[float]] = [[] for _ in range(n)]
    e2e: list[list[float]] = [[] for _ in range(n)]
    waits: list[list[float]] = [[] for _ in range(n)]
    mean, timeout = sc.engine.mean_service_s, sc.admission.queue_timeout_s

    def request(k: int, u: float):
        t0 = env.now
        arrivals[k].append(t0)
        with gates[k].request() as req:
            got = yield req | env.timeout(timeout)
            if req not in got:
                drops[k].append(env.now)
                return
            wait = env.now - t0
            yield env.timeout(-mean * math.log(1.0 - u))
        finished[k].append(env.now)
        e2e[k].append(env.now - t0)
        waits[k].append(wait)

    def source(k: int):
        for at, u in zip(draws[k].times, draws[k].u_service, strict=True):
            yield env.timeout(at - env.now)
            env.process(request(k, u))

    def observe() -> Observation:
        since = env.now - sc.window_s
        tenants = []
        for k, ts in enumerate(spec.tenants):
            lo = bisect_right(finished[k], since)
            recent = sorted(e2e[k][lo:])
            tenants.append(TenantObservation(
                queue_depth=len(gates[k].queue),
                in_flight=gates[k].count,
                limit=gates[k].capacity,
                arrivals=len(arrivals[k]) - bisect_right(arrivals[k], since),
                completions=len(recent),
                drops=len(drops[k]) - bisect_right(drops[k], since),
                e2e_p50=_pct(recent, 50) if recent else 0.0,
                e2e_p95=_pct(recent, 95) if recent else 0.0,
                e2e_p99=_pct(recent, 99) if recent else 0.0,
                samples=len(recent),
                queue_wait_p99=_pct(sorted(waits[k][lo:]), 99) if recent else 0.0,
                slo_e2e_p99=ts.slo_e2e_p99_s if ts.slo_e2e_p99_s < math.inf else NO_SLO,
            ))
        busy = sum(g.count for g in gates)
        return Observation(env.now, sc.window_s, busy / sc.engine.slots, busy, 0, tenants)

    controller = make_controller(policy)
    controller.reset(spec, seed)

    def control():
        while True:
            for gate, d in zip(gates, controller.act(observe()), strict=True):
                gate._capacity = lim.clamp(gate.capacity + d)  # no public setter in SimPy
                gate._trigger_put(None)  # a raised limit admits whoever waits
            yield env.timeout(sc.interval_s)

    for k in range(n):
        env.process(source(k))
    env.process(control())
    env.run(until=sc.horizon_s)
    totals = [
        TenantTotals(arrived=len(arrivals[k]), completed=len(e2e[k]), dropped=len(drops[k]), e2e=array("d", e2e[k]))
        for k in range(n)
    ]
    return episode_metrics(totals, sc.horizon_s)
