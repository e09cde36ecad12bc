"""Live telemetry → the same `Observation` the simulator builds (core/telemetry.py's `build_observation`).

Three sources:

* **the gateway's own per-tenant windows** — `TenantWindows` fed with the simulator's four events from the
  gateway's request outcomes: an *arrival* when a parsed request of a known tenant is offered to admission,
  a *completion* (e2e, TTFT = arrival to the answer's first byte, queue wait) when it ends ``ok``, a
  *drop* on ``ttl-expired`` and a *rejection* on ``queue-full``, ``envelope-empty`` or ``backend-busy`` (the
  backend's own admission refused it, e.g. vLLM's ``--max-num-queued-reqs``). Other backend failures and
  clients that leave are none of these (the simulator has no such events) and do not enter the windows.
* **the backend's /metrics** (vLLM, or the emulator that mimics it), scraped every ``scrape_interval_s`` and
  parsed with core/metrics_page.py: ``vllm:kv_cache_usage_perc`` → ``gpu_mem_util`` (the token
  engine's KV usage, the same meaning as in the simulator), ``vllm:num_requests_running`` /
  ``vllm:num_requests_waiting`` → ``engine_running`` / ``engine_waiting`` (summed over engines, KV usage the
  mean), ``vllm:num_preemptions_total`` → ``preemptions`` in the window (the counter's growth), and
  ``vllm:time_to_first_token_seconds`` → the engine's TTFT p50/p99 between two scrapes (reported beside the
  Observation, not in it: the vector stays the simulator's).
* **the gateway's own requests** for the token footprints (core/observation.py): prompt tokens of the
  requests waiting for admission, of the admitted ones with no first byte yet, and prompt + streamed tokens
  of every admitted one, from the gateway's prompt estimate (gateway/body.py) and the events it streamed
  (a non-streamed answer counts its tokens when it ends); the app hands them over (`TenantTokens`).
  Completions carry their output tokens (the backend's ``usage``, else the streamed events), so the windows
  give TPOT, output tokens/s and goodput exactly as the simulator's. With Redis these are this replica's.
* **NVML** (nvidia-ml-py) for GPU memory used/total per device, reported beside the Observation and used as
  ``gpu_mem_util`` only when the backend exports no KV usage. Without a GPU or driver the state is
  ``{"available": false, "reason": ...}``, logged once; nothing fails.

**Stale is saturated.** When the last good scrape is older than ``stale_after_s`` (or there never was one),
the engine gauges are reported as a saturated server — ``gpu_mem_util = 1`` and ``engine_waiting =
max(stale_waiting, last value)`` — never as an idle one, so no policy opens the gates on missing data.
Per-tenant figures are the gateway's own and are never stale. Tenant ``in_flight`` is the count across all
replicas when the admission state is shared (Redis), else this gateway's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from admit.core.metrics_page import KV, PREEMPTIONS, RUNNING, TTFT, WAITING, samples
from admit.core.observation import Observation
from admit.core.percentiles import histogram_quantile
from admit.core.slo import is_good, tpot
from admit.core.spec import ControlSpec, Limits, TenantSpec
from admit.core.telemetry import PreemptionWindow, TenantTokens, TenantWindows, build_observation
from admit.gateway.config import GatewayConfig

log = logging.getLogger("admit.gateway.telemetry")

ENGINE_SERIES = frozenset({KV, RUNNING, WAITING, PREEMPTIONS, TTFT + "_bucket"})  # what a scrape reads
REJECTIONS = frozenset({"queue-full", "envelope-empty", "backend-busy"})
DROPS = frozenset({"ttl-expired"})


def gateway_spec(cfg: GatewayConfig) -> ControlSpec:
    """The ControlSpec a gateway's configuration implies (``admit control --spec gateway``)."""
    c = cfg.control
    tenants = tuple(
        TenantSpec(t.name, t.slo.e2e_p99_bound, t.slo.ttft_p99_bound, t.weight, t.priority, t.slo.ttft_bound,
                   t.slo.tpot_bound, t.slo.e2e_bound, t.max_limit, t.contract, min_limit=t.min_limit)
        for t in cfg.tenants
    )
    lo = min(c.min_limit, c.max_limit)
    initial = min(max(lo, min(t.limit for t in cfg.tenants)), c.max_limit)
    limits = Limits(min=lo, max=c.max_limit, initial=initial, max_step=c.max_step)
    return ControlSpec(tenants, limits, c.interval_s, cfg.telemetry.window_s)


def parse_engine_metrics(text: str) -> dict[str, Any]:
    """The gauges and the TTFT histogram's cumulative buckets from a Prometheus text page."""
    kv: list[float] = []
    running = waiting = preemptions = 0.0
    seen: set[str] = set()
    buckets: dict[float, float] = {}
    for s in samples(text, ENGINE_SERIES):
        if s.name == KV:
            kv.append(s.value)
        elif s.name == RUNNING:
            running += s.value
        elif s.name == WAITING:
            waiting += s.value
        elif s.name == PREEMPTIONS:
            preemptions += s.value
        else:
            le = float(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + s.value
        seen.add(s.name)
    return {
        "kv": sum(kv) / len(kv) if kv else None,
        "running": running if RUNNING in seen else None,
        "waiting": waiting if WAITING in seen else None,
        "preemptions": preemptions if PREEMPTIONS in seen else None,
        "ttft_buckets": sorted(buckets.items()),
    }


class Nvml:
    """GPU memory through NVML, or a clear "no NVML" state (reported once) when there is no GPU or driver."""

    def __init__(self, enabled: bool) -> None:
        self.available = False
        self.reason = "disabled in the configuration" if not enabled else ""
        self._handles: list[Any] = []
        if not enabled:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nv = pynvml
            self.available = bool(self._handles)
            self.reason = "" if self._handles else "NVML found no GPU"
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
            self.reason = f"no NVML: {type(exc).__name__}: {exc}".strip()
        if not self.available:
            log.info("GPU memory telemetry off (%s); gpu_mem_util comes from the backend's KV usage", self.reason)

    def read(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        devices = []
        try:
            for h in self._handles:
                m = self._nv.nvmlDeviceGetMemoryInfo(h)
                devices.append({"used_bytes": int(m.used), "total_bytes": int(m.total),
                                "util": float(m.used) / float(m.total) if m.total else 0.0})
        except Exception as exc:
            return {"available": False, "reason": f"NVML read failed: {type(exc).__name__}"}
        return {"available": True, "devices": devices}


class _Counts:
    """The admission snapshot with the three methods `build_observation` reads from an admission core."""

    def __init__(self, snap: dict[str, Any], names: Sequence[str]) -> None:
        ts = snap["tenants"]
        self._rows = [ts[n] for n in names]

    def queue_depth(self, i: int) -> int:
        return int(self._rows[i]["queue_depth"])

    def in_flight(self, i: int) -> int:
        row = self._rows[i]
        return int(row.get("shared_in_flight", row["in_flight"]))

    def limit(self, i: int) -> int:
        return int(self._rows[i]["limit"])


class LiveTelemetry:
    def __init__(self, cfg: GatewayConfig, backend_url: str) -> None:
        self.cfg = cfg.telemetry
        self.spec = gateway_spec(cfg)
        self.names = [t.name for t in cfg.tenants]
        self.windows = [TenantWindows(self.cfg.window_s, (t.slo_e2e_p99_s, t.slo_ttft_p99_s), t.request_bounds)
                        for t in self.spec.tenants]
        self._bounds = [t.request_bounds for t in self.spec.tenants]
        self._preemptions = PreemptionWindow(self.cfg.window_s)
        self.url = self.cfg.metrics_url or backend_url.rstrip("/") + "/metrics"
        self.clock = time.monotonic
        self.t0 = self.clock()
        self.last_ok: float | None = None
        self.engine: dict[str, Any] = {"kv": None, "running": None, "waiting": None, "preemptions": None,
                                       "ttft_buckets": []}
        self.engine_ttft: dict[str, float | None] = {"p50": None, "p99": None}
        self.scrapes = self.scrape_errors = self.stale_reads = 0
        self.last_error = ""
        self._stale_logged = False
        self.nvml: Nvml | None = None
        self.gpu: dict[str, Any] = {"available": False, "reason": "not read yet"}
        self._task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- gateway events
    # Events are stamped on the Observation's clock (seconds since start), the one the windows are pruned
    # with: stamped with the raw monotonic clock they were never older than the window and never left it.
    def arrival(self, tenant: int) -> None:
        now = self.clock() - self.t0
        w = self.windows[tenant]
        w.on_arrival(now)
        # the windows are summarised only when the Observation is read (a control loop may never ask): pruned
        # here, at each arrival, they hold one window of events, plus the ends of requests still in flight
        w.prune(now)

    def finished(self, tenant: int, outcome: str, e2e_s: float, ttft_s: float | None, wait_s: float | None,
                 output_tokens: int = 0) -> bool:
        """Enter a request's end into its tenant's windows; True when it was good (core/slo.py)."""
        now = self.clock() - self.t0
        w = self.windows[tenant]
        good = False
        if outcome == "ok":
            ttft = e2e_s if ttft_s is None else ttft_s
            per_token = tpot(e2e_s, ttft, output_tokens)
            good = is_good(ttft, per_token, e2e_s, self._bounds[tenant])
            w.on_completion(now, e2e_s, ttft, wait_s or 0.0, per_token, output_tokens, good)
        elif outcome in DROPS:
            w.on_drop(now)
        elif outcome in REJECTIONS:
            w.on_rejection(now)
        return good

    # ----------------------------------------------------------------- scraping
    async def start(self) -> None:
        self.nvml = await asyncio.to_thread(Nvml, self.cfg.nvml)
        self._task = asyncio.ensure_future(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(0.5, min(self.cfg.stale_after_s, 5.0)))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.scrape(session)
                await asyncio.sleep(self.cfg.scrape_interval_s)

    async def scrape(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.url) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = await resp.text()
            got = parse_engine_metrics(text)
        except Exception as exc:  # unreachable, timed out, not Prometheus text: stale from now on
            self.scrape_errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:200]
        else:
            prev = self.engine["ttft_buckets"]
            cur = got["ttft_buckets"]
            if prev and len(prev) == len(cur):
                delta = [(le, n - p) for (le, n), (_, p) in zip(cur, prev, strict=True)]
                # percentiles.HISTOGRAM: Prometheus's histogram_quantile, as a dashboard would read the engine
                self.engine_ttft = {"p50": histogram_quantile(0.5, delta), "p99": histogram_quantile(0.99, delta)}
            self.engine = got
            self.scrapes += 1
            self.last_ok = self.clock()
            if got["preemptions"] is not None:
                self._preemptions.add(self.last_ok - self.t0, float(got["preemptions"]))
        if self.nvml is not None:
            self.gpu = self.nvml.read()

    # ----------------------------------------------------------------- the Observation
    def stale(self, now: float) -> bool:
        return self.last_ok is None or now - self.last_ok > self.cfg.stale_after_s

    def observation(self, snapshot: dict[str, Any],
                    tokens: TenantTokens | None = None) -> tuple[Observation, dict[str, Any]]:
        """The Observation now, from the admission ``snapshot``, the gateway's ``tokens`` footprints and the
        last scrape; and what the scrape looked like (``info``)."""
        now = self.clock()
        e = self.engine
        running = float(e["running"] or 0.0)
        waiting = float(e["waiting"] or 0.0)
        if e["kv"] is not None:
            mem, source = float(e["kv"]), KV
        elif self.gpu.get("available"):
            mem, source = max(d["util"] for d in self.gpu["devices"]), "nvml"
        else:
            mem, source = 0.0, "none"
        stale = self.stale(now)
        if stale:
            self.stale_reads += 1
            mem, waiting, source = 1.0, max(self.cfg.stale_waiting, waiting), "stale"
            if not self._stale_logged:
                log.warning("engine telemetry is stale (%s): reporting the server as saturated", self.last_error)
                self._stale_logged = True
        else:
            self._stale_logged = False
        preemptions = self._preemptions.count(now - self.t0)
        obs = build_observation(now - self.t0, self.spec, self.windows, _Counts(snapshot, self.names),
                                mem, running, waiting, tokens, preemptions)
        info = {
            "stale": stale,
            "age_s": None if self.last_ok is None else now - self.last_ok,
            "gpu_mem_source": source,
            "metrics_url": self.url,
            "scrapes": self.scrapes,
            "scrape_errors": self.scrape_errors,
            "stale_reads": self.stale_reads,
            "last_error": self.last_error,
            "engine_ttft_s": self.engine_ttft,
            "gpu": self.gpu,
        }
        return obs, info
