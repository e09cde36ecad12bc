"""What the gateway keeps per request served must not grow with the requests served.

The live telemetry windows are summarised only when the Observation is read, which a gateway without a
control loop never does; they must still hold only the last window of events (benchmarks/gateway_soak.py
measures the whole process over a long run: docs/BENCHMARKS.md, "Gateway memory under a soak").
"""

from __future__ import annotations

import itertools

from admit.gateway.config import parse_config
from admit.gateway.telemetry import LiveTelemetry
from gateway_helpers import tenant_cfg


def test_the_live_windows_hold_one_window_when_nobody_reads_the_observation() -> None:
    cfg = parse_config({"telemetry": {"window_s": 6.0, "nvml": False},
                        "tenants": [tenant_cfg("alpha"), tenant_cfg("beta")]})
    tel = LiveTelemetry(cfg, "http://127.0.0.1:1")
    now = 0.0
    tel.clock = lambda: now
    tel.t0 = 0.0
    outcomes = itertools.cycle(["ok", "ok", "ok", "queue-full", "ttl-expired", "client-disconnect"])
    for i in range(12_000):  # 200 requests a second over 60 s: ten windows, the Observation never read
        now = i * 0.005
        tenant = i % 2
        tel.arrival(tenant)
        tel.finished(tenant, next(outcomes), 0.05, 0.01, 0.0, 8)
    per_window = 6.0 / 0.005 / 2  # each tenant's events in one window
    for w in tel.windows:  # the deques themselves: what a reader of the Observation would have pruned
        held = len(w._arrivals), len(w._done), len(w._drops), len(w._rejections)
        assert held[0] <= per_window + 1 and sum(held[1:]) <= per_window + 1, held
    # and what they hold is the last window, as the Observation reads it
    snap = {"tenants": {n: {"queue_depth": 0, "in_flight": 0, "limit": 4} for n in ("alpha", "beta")}}
    obs, _ = tel.observation(snap)
    assert all(abs(t.arrivals - per_window) <= 1 for t in obs.tenants), obs.tenants  # up to a boundary's rounding
