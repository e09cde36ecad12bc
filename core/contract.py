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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from admit.core.gcra import Gcra
from admit.core.schema import StrictModel
from pydantic import Field, model_validator

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
