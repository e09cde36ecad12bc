"""A tenant's contract: the load it is promised service for, which of its requests that covers, and whether
the promise was kept.

Written the same way wherever a tenant is described (a scenario's tenant, a family's block, the gateway's
tenant)::

    contract: {requests_per_s: 4.0, burst: 20, attainment: 0.99}     # or tokens_per_s: prompt + output

**In contract.** A request is in contract when, at its arrival, it conforms to a GCRA envelope of the
contract's rate and burst (core/gcra.py) that only the tenant's in-contract requests charge: a request beyond
the envelope is *excess* and costs the envelope nothing, so a tenant that sends more than its contract still
has its contracted rate in contract. The decision reads the arrivals and their sizes only, never what the
server did with them, so on one seed the same requests are in contract under every policy (the common random
numbers of a comparison hold), and the gateway classifies live with this same class as the simulator does
offline. The envelope starts full at the tenant's first arrival.

**Cost.** One per request for ``requests_per_s``; for ``tokens_per_s`` the prompt tokens plus the output
tokens the request asks for (``max_tokens`` as sent; in the simulator, its output length, which a replayed
request asks for), known at arrival.

**The promise.** At least ``attainment`` of the in-contract requests are good (complete within every
per-request objective of the tenant, core/slo.py). A tenant with no in-contract arrival keeps it trivially.
Its *shortfall* is the number of in-contract requests short of the promise,
``max(0, ceil(attainment · n_in) − good_in)``: 0 when the contract is met.

Whether a set of contracts can be kept together depends on the engine and on the tenants' request sizes; the
scenario checks it (envs/scenario.py), since core knows neither.

**Nominal concurrency, borrowed and lent.** A contract also gives its tenant a share of the deployment's
concurrency (``contract_shares``, ``nominal_caps``: the conventions are controllers/contracts_field.py's module
docstring, where the baselines that use them live). A contracted tenant's *nominal* (``nominal_concurrency``) is
its share of the total, exactly the cap ``static:share`` deploys (Kueue's ``nominalQuota``); a tenant without a
contract has nominal 0. With ``inflight_i`` the tenant's admitted requests in flight (what its admission limit
governs), ``lending`` gives ``borrowed_i = max(0, inflight_i − nominal_i)``, what it runs beyond its share, and
``lent_i = idle_i · min(1, B / Σ idle)`` with ``idle_i = max(0, nominal_i − inflight_i)`` and ``B = Σ borrowed``:
the part of its idle share the borrowers actually use, divided in proportion to the idle shares (Σ lent =
``min(B, Σ idle)``; 0 when nobody borrows). The simulator reads them at each decision (envs/contracts.py), the
gateway at each scrape of /metrics, both by these functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
from admit.core.gcra import Gcra
from admit.core.schema import StrictModel
from pydantic import Field, model_validator

if TYPE_CHECKING:  # core/spec.py imports this module for TenantSpec.contract
    from admit.core.spec import ControlSpec

ATTAINMENT_EPS = 1e-9  # float slack when an attainment of exactly the promise is compared


class Contract(StrictModel):
    """The load a tenant is promised service for, and the share of it that must be good."""

    requests_per_s: float | None = Field(default=None, gt=0, le=1e6)
    tokens_per_s: float | None = Field(default=None, gt=0, le=1e9)
    burst: float = Field(ge=1, le=1e12)  # in the contract's unit: requests, or tokens
    attainment: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _one_rate(self) -> Contract:
        if (self.requests_per_s is None) == (self.tokens_per_s is None):
            raise ValueError("a contract gives exactly one of requests_per_s and tokens_per_s (tokens: prompt + "
                             f"output), got {'both' if self.requests_per_s is not None else 'neither'}")
        return self

    @property
    def unit(self) -> Literal["requests", "tokens"]:
        return "requests" if self.requests_per_s is not None else "tokens"

    @property
    def rate(self) -> float:
        """Units per second: requests, or tokens."""
        return self.requests_per_s if self.requests_per_s is not None else float(self.tokens_per_s or 0.0)

    def cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """What one request charges the envelope: 1, or its prompt and asked-for output tokens."""
        return 1.0 if self.requests_per_s is not None else float(prompt_tokens + output_tokens)

    def requests_per_s_at(self, mean_tokens: float) -> float:
        """The contract as requests per second, for requests of ``mean_tokens`` (prompt + output) on average."""
        return self.rate if self.unit == "requests" else self.rate / max(mean_tokens, 1.0)


class ContractMeter:
    """Classifies one tenant's requests at their arrival, in arrival order (the gateway's and the simulator's
    one implementation)."""

    __slots__ = ("contract", "gcra")

    def __init__(self, contract: Contract) -> None:
        self.contract = contract
        self.gcra: Gcra | None = None  # made at the first arrival: the envelope starts full then

    def arrive(self, now: float, prompt_tokens: int, output_tokens: int) -> bool:
        """Whether the request arriving at ``now`` is in contract; only an in-contract one charges the envelope."""
        c = self.contract
        if self.gcra is None:
            self.gcra = Gcra(c.rate, max(1, math.ceil(c.burst)), now)
        return self.gcra.spend(c.cost(prompt_tokens, output_tokens), now).allowed


def classify(contract: Contract, arrivals: Sequence[float] | np.ndarray,
             prompt_tokens: Sequence[int] | np.ndarray, output_tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Per request of one tenant (arrivals non-decreasing), whether it is in contract: a boolean array."""
    t = np.asarray(arrivals, dtype=np.float64)
    if t.size > 1 and bool(np.any(np.diff(t) < 0)):
        raise ValueError("contract classification needs a tenant's arrivals in order (non-decreasing times)")
    p = np.asarray(prompt_tokens, dtype=np.int64)
    o = np.asarray(output_tokens, dtype=np.int64)
    if not (len(p) == len(o) == len(t)):
        raise ValueError(f"arrivals ({len(t)}), prompt_tokens ({len(p)}) and output_tokens ({len(o)}) differ in "
                         "length")
    meter = ContractMeter(contract)
    return np.fromiter((meter.arrive(float(a), int(x), int(y)) for a, x, y in zip(t, p, o, strict=True)),
                       dtype=bool, count=len(t))


def shortfall(contract: Contract, in_contract: int, good_in_contract: int) -> int:
    """In-contract requests short of the promise: ``max(0, ceil(attainment · n_in) − good_in)``."""
    need = math.ceil(contract.attainment * in_contract - ATTAINMENT_EPS)
    return max(0, need - good_in_contract)


def figures(contract: Contract | None, in_contract: int, good_in_contract: int) -> dict[str, float]:
    """A tenant's contract figures for an episode's metrics (empty without a contract): in-contract arrivals and
    good requests, their attainment, whether the promise was kept (1.0 or 0.0) and the shortfall."""
    if contract is None:
        return {}
    short = shortfall(contract, in_contract, good_in_contract)
    return {
        "contract_arrived": float(in_contract),
        "contract_good": float(good_in_contract),
        "contract_attainment": good_in_contract / in_contract if in_contract else 1.0,
        "contract_met": 1.0 if short == 0 else 0.0,
        "contract_shortfall": float(short),
    }


# ---------------------------------------------------------------------------- shares of the concurrency
MEAN_TOKENS = 1000.0  # tokens per request at which a token contract counts as requests when no load is known


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def contract_shares(spec: ControlSpec, mean_tokens: float = MEAN_TOKENS) -> tuple[list[float], str]:
    """Each tenant's share of the concurrency being divided (the shares sum to 1), and its basis: ``"capacity"``
    (the contracts' loads, the rest ``1 − Σ loads`` shared equally by the tenants without one; when every tenant
    has one, the loads normalised), ``"requests"`` (no loads known: proportional to the contracted requests/s, 0
    without a contract) or ``"equal"`` (no contract: 1/n each)."""
    tenants = spec.tenants
    n = len(tenants)
    contracted = [i for i, t in enumerate(tenants) if t.contract is not None]
    if not contracted:
        return [1.0 / n] * n, "equal"
    if all(tenants[i].contract_load is not None for i in contracted):
        shares = [float(t.contract_load or 0.0) if t.contract is not None else 0.0 for t in tenants]
        others = n - len(contracted)
        if others:
            rest = max(0.0, 1.0 - sum(shares)) / others
            shares = [s if t.contract is not None else rest for s, t in zip(shares, tenants, strict=True)]
        total = sum(shares)  # < 1 only when every tenant has a contract: C is divided whole, in proportion
        return [s / total for s in shares], "capacity"
    rps = [t.contract.requests_per_s_at(mean_tokens) if t.contract is not None else 0.0 for t in tenants]
    total = sum(rps)
    return [r / total for r in rps], "requests"


def total_concurrency(spec: ControlSpec) -> int:
    """``C``: the sum of the scenario's initial caps, the concurrency the operator runs before any baseline."""
    return spec.n_tenants * spec.limits.initial


def ceiling(spec: ControlSpec, i: int) -> int:
    """The most tenant ``i``'s limit can be: ``limits.max``, or its own ``max_limit`` when lower."""
    m = spec.tenants[i].max_limit
    return spec.limits.max if m is None else min(spec.limits.max, m)


def nominal_caps(spec: ControlSpec, shares: Sequence[float]) -> list[int]:
    """``max(limits.min, round(C · share))`` per tenant, at most its ceiling."""
    c = total_concurrency(spec)
    return [min(ceiling(spec, i), max(spec.limits.min, round_half_up(c * s))) for i, s in enumerate(shares)]


def nominal_concurrency(spec: ControlSpec) -> list[int]:
    """Each tenant's nominal concurrency: a contracted tenant's ``nominal_caps`` of ``contract_shares`` (what
    ``static:share`` deploys), 0 for a tenant without a contract (all it runs, it borrows)."""
    if not any(t.contract is not None for t in spec.tenants):
        return [0] * spec.n_tenants
    caps = nominal_caps(spec, contract_shares(spec)[0])
    return [c if t.contract is not None else 0 for c, t in zip(caps, spec.tenants, strict=True)]


def lending(in_flight: Sequence[float] | np.ndarray, nominal: Sequence[float] | np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """(borrowed, lent) per tenant from the tenants' requests in flight and their nominal concurrency (the last
    axis is the tenants'; leading axes, such as one row per decision, are kept): ``borrowed = max(0, in_flight −
    nominal)``, ``lent = idle · min(1, B / Σ idle)`` with ``idle = max(0, nominal − in_flight)`` and ``B = Σ
    borrowed`` (module docstring). Floats."""
    x = np.asarray(in_flight, dtype=np.float64)
    nom = np.asarray(nominal, dtype=np.float64)
    borrowed = np.maximum(0.0, x - nom)
    idle = np.maximum(0.0, nom - x)
    b = borrowed.sum(axis=-1, keepdims=True)
    s = idle.sum(axis=-1, keepdims=True)
    used = np.where(s > b, b / np.where(s > 0.0, s, 1.0), 1.0)  # min(1, B / Σ idle); Σ idle = 0 lends nothing
    return borrowed, idle * used
