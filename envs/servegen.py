"""ServeGen per-client window statistics (Alibaba Bailian, model "m-large") as an arrival process.

ServeGen publishes no requests; for each client (tenant) it gives one row per 10-minute window over 14
days: the request rate, and a Gamma or Weibull distribution fitted to the inter-arrival times (IATs).
Following ServeGen's own generator, each window's IATs are drawn from the fitted distribution and
rescaled so that their mean is 1/rate; an idle window produces no request. Source, licence (Apache-2.0)
and columns: envs/data/servegen_m_large/README.md. Cite: Xiang et al., "ServeGen: Workload
Characterization and Generation of LLM Serving in Production", arXiv 2505.09999.

``servegen_tenant_configs`` turns clients into scenario tenants (arrivals + lognormal sizes fitted to the
client's published p50/p99 lengths); scripts use it to write the ``servegen-skewed`` scenario file.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import math
from functools import cache, lru_cache
from importlib import resources
from typing import Literal

import numpy as np
from admit.core.schema import StrictModel
from pydantic import Field

WINDOW_S = 600.0
_Z99 = 2.3263478740408408  # standard normal 99th percentile


@lru_cache(maxsize=1)
def _windows() -> dict[int, list[tuple[float, float, str, float, float]]]:
    ref = resources.files("admit.envs").joinpath("data", "servegen_m_large", "client_windows.csv.gz")
    out: dict[int, list[tuple[float, float, str, float, float]]] = {}
    with ref.open("rb") as raw, gzip.open(raw, "rt") as f:
        for r in csv.DictReader(f):
            out.setdefault(int(r["client_id"]), []).append(
                (float(r["window_start_s"]), float(r["rate"]), r["iat_dist"], float(r["shape"]), float(r["scale"]))
            )
    for rows in out.values():
        rows.sort()
    return out


@lru_cache(maxsize=1)
def _lengths() -> dict[int, list[tuple[float, float, float, float, float]]]:
    ref = resources.files("admit.envs").joinpath("data", "servegen_m_large", "client_lengths.csv")
    out: dict[int, list[tuple[float, float, float, float, float]]] = {}
    for r in csv.DictReader(ref.read_text().splitlines()):
        out.setdefault(int(r["client_id"]), []).append(
            (
                float(r["window_start_s"]),
                float(r["in_p50"]),
                float(r["in_p99"]),
                float(r["out_p50"]),
                float(r["out_p99"]),
            )
        )
    return out


@cache
def _window_starts(client_id: int) -> list[float]:
    """The start times of one client's windows, in order (``_windows`` sorts them)."""
    return [w[0] for w in _windows()[client_id]]


def client_ids() -> list[int]:
    return sorted(_windows())


def client_volume(client_id: int) -> float:
    """Total requests of a client over the 14 days."""
    return sum(rate * WINDOW_S for _, rate, _, _, _ in _windows()[client_id])


class ServeGenArrivals(StrictModel):
    """Arrivals of one ServeGen client, from ``start_s`` into its 14-day table, rates × ``rate_scale``."""

    kind: Literal["servegen"] = "servegen"
    client_id: int = Field(ge=0)
    start_s: float = Field(default=0.0, ge=0)
    rate_scale: float = Field(default=1.0, gt=0)

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        table = _windows()
        if self.client_id not in table:
            ids = client_ids()
            raise ValueError(f"ServeGen has no client {self.client_id}; clients are {ids[0]}..{ids[-1]}")
        end = self.start_s + horizon_s
        out: list[np.ndarray] = []
        rows = table[self.client_id]
        # the windows before the first that can overlap [start_s, end) draw nothing: skip them unread
        first = max(bisect.bisect_right(_window_starts(self.client_id), self.start_s - WINDOW_S) - 1, 0)
        for w0, rate, dist, shape, scale in rows[first:]:
            if w0 >= end:
                break  # rows are sorted by start: none later overlaps
            w1 = w0 + WINDOW_S
            if w1 <= self.start_s or w0 >= end or rate <= 0 or dist not in ("Gamma", "Weibull") or shape <= 0:
                continue
            lam = rate * self.rate_scale
            expected = lam * WINDOW_S
            n = int(expected + 8 * math.sqrt(expected) + 16)
            if dist == "Gamma":
                iat = rng.gamma(shape, scale, size=n)
                mean = shape * scale
            else:
                iat = scale * rng.weibull(shape, size=n)
                mean = scale * math.gamma(1 + 1 / shape)
            iat *= (1.0 / lam) / mean
            t = w0 + iat[0] * rng.random() + np.cumsum(np.concatenate([[0.0], iat[1:]]))
            t = t[(t < w1) & (t >= self.start_s) & (t < end)]
            out.append(t - self.start_s)
        return np.concatenate(out) if out else np.empty(0)


def lognormal_from_p50_p99(p50: float, p99: float, cap: int) -> dict:
    """A lognormal with the given median and 99th percentile, as a scenario size spec."""
    p50 = max(p50, 1.0)
    sigma = max(math.log(max(p99, p50) / p50) / _Z99, 0.0)
    return {"kind": "lognormal", "median": round(p50, 1), "sigma": round(sigma, 4), "min": 1, "max": cap}


def servegen_tenant_configs(
    clients: list[int], start_s: float, rate_scale: float, max_tokens: int = 8192
) -> list[dict]:
    """Scenario tenant blocks for ServeGen clients; sizes from the 6-hour length summary covering start_s."""
    lengths = _lengths()
    tenants = []
    for c in clients:
        if c not in lengths:
            raise ValueError(f"ServeGen client {c} has no published length summary; pick another client")
        rows = sorted(lengths[c])
        row = next((r for r in reversed(rows) if r[0] <= start_s), rows[0])
        _, in50, in99, out50, out99 = row
        tenants.append(
            {
                "name": f"client-{c}",
                "arrival": {"kind": "servegen", "client_id": c, "start_s": start_s, "rate_scale": rate_scale},
                "prompt_tokens": lognormal_from_p50_p99(in50, in99, max_tokens),
                "output_tokens": lognormal_from_p50_p99(out50, out99, max_tokens // 2),
            }
        )
    return tenants


# The bundled servegen-skewed scenario: the 8 heaviest clients that have length summaries, from 14:00 on
# day 1 (a busy afternoon), rates scaled so that one H200 runs near its knee.
SKEWED_CLIENTS = [61, 143, 104, 34, 78, 20, 116, 91]
SKEWED_START_S = 50400.0
SKEWED_RATE_SCALE = 0.6


def skewed_scenario() -> dict:
    """The ``servegen-skewed`` scenario as a dict (what envs/scenarios/servegen-skewed.yaml holds), each
    tenant with the contract the bundled scenarios' rule gives it (envs/family.py `typical_contracts`)."""
    from admit.envs.family import typical_contracts  # the family module reads this one's table
    from admit.envs.scenario import parse_scenario

    tenants = servegen_tenant_configs(SKEWED_CLIENTS, SKEWED_START_S, SKEWED_RATE_SCALE)
    for t in tenants:
        t["slo"] = {"ttft_s": 2.0, "tpot_s": 0.1, "ttft_p99_s": 2.0, "e2e_p99_s": 60.0}
    data = _skewed_without_contracts(tenants)
    contracts, _ = typical_contracts(parse_scenario(data, "servegen-skewed"))
    for t, c in zip(tenants, contracts, strict=True):
        if c:
            t["contract"] = c
    return data


def _skewed_without_contracts(tenants: list[dict]) -> dict:
    return {
        "name": "servegen-skewed",
        "description": (
            "Eight tenants drawn from ServeGen's production table (Alibaba Bailian, model m-large): the eight "
            "heaviest clients with published length statistics, from 14:00 on day 1, each with its own "
            "per-10-minute rate and fitted inter-arrival law (often far burstier than Poisson) and lognormal "
            "prompt/output sizes fitted to its published p50/p99. Traffic is skewed: the first client carries "
            "about as much as the other seven together. Rates are scaled by 0.6 so that one H200 serving "
            "Llama-3-8B runs near its knee. Generated by `python -m admit.envs.servegen`."
        ),
        "horizon_s": 1800,
        "interval_s": 2,
        "window_s": 10,
        "engine": {"kind": "token", "preset": "h200-llama3-8b"},
        "admission": {"queue_timeout_s": 30, "max_queue": 2000},
        "limits": {"min": 2, "max": 256, "initial": 32, "max_step": 4},
        "reward": {"throughput": 1.0, "slo_violation": 1.0, "drop": 2.0, "cost": 0.0},
        "tenants": tenants,
    }


def main() -> None:
    import sys

    import yaml

    yaml.safe_dump(skewed_scenario(), sys.stdout, sort_keys=False, width=100)


if __name__ == "__main__":
    main()
