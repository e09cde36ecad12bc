"""The tenant-set encoding: one observation and action layout for any scenario with 1..``MAX_TENANTS`` tenants.

A policy trained on the flat layout (core/observation.py) is bound to one tenant count and one ``max_step``.
The tenant-set policy (admit.agents.set_policy) is not: it reads this fixed-size vector and answers with one
multiplicative choice per tenant slot, so one network acts on every scenario. Training (admit.train.family)
and the deployed policy (admit.agents.sb3_policy) both encode and decode with the functions here, so they
cannot disagree.

Observation, ``set_vector_size()`` = 5 + 3 + 27·M + M entries for M = ``MAX_TENANTS`` slots:

- the 5 global features of layout 2 (GLOBAL_FEATURES);
- the scenario's limit bounds ``limits.min``, ``limits.max`` and the tenant count ``n``;
- M slots of the 27 per-tenant features of layout 2 (TENANT_FEATURES), tenants in scenario order, the
  slots past ``n`` zero;
- the mask: 1 for the ``n`` real slots, 0 for the padding.

Action: ``MultiDiscrete([len(FACTORS)] * M)``; choice ``c`` of a tenant with limit ``L`` asks for
``round(L · FACTORS[c])``, at least one step away from ``L`` when the factor is not 1 (so a limit of 1 or 2
can move), and the delta is clipped to ``±max_step`` (the scenario's own bound, which the simulator and the
live loop enforce). Choices in padding slots are ignored. Multiplicative steps mean the same action halves a
limit of 8 or of 400, which is what lets one policy serve scenarios whose caps differ by two orders of
magnitude.

**Anchored** (``anchored=True``; the policy config's ``anchor: tuned``): the policy acts around given
per-tenant caps ``A`` (static:best's, tuned offline for the scenario). The vector gains M more entries, each
slot's anchor (0 in padding), after the mask; a choice ``c`` then asks for the target ``A · FACTORS[c]`` (or
``A · WIDE_FACTORS[c]``: ×¼ … ×8, for a policy trained with ``policy.anchor_factors: wide``)
(at least one away from ``A`` when the factor is not 1, clipped to the limit bounds), and the delta moves
the current limit towards that target by at most ``max_step``. "Hold" holds the anchor, so a policy that
always holds *is* static:best, and every other choice is a bounded, non-cumulative deviation from it: the
next decision's target is again relative to the anchor, not to wherever the last one left the limit.

**Contract features** (``contracts=``; the policy config's ``contract_features: true``): M × ``len(CONTRACT_FEATURES)``
more entries, after the anchors when there are any: per slot, the tenant's contracted requests/s (a token
contract's at ``MEAN_TOKENS`` tokens a request, core/contract.py), its burst in requests (the same conversion)
and the promised attainment — all 0 for a tenant without a contract and in padding. They come from the
contracts themselves (``ControlSpec``), which the simulator and the live gateway both know; what a tenant sends
against its contract is in the observation already (its arrivals per window).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from admit.core.contract import MEAN_TOKENS
from admit.core.observation import GLOBAL_FEATURES, LAYOUT_VERSION, TENANT_FEATURES, Observation
from admit.core.spec import ControlSpec, Limits

MAX_TENANTS = 8
FACTORS: tuple[float, ...] = (0.5, 0.75, 0.9, 1.0, 1.1, 1.33, 2.0)
HOLD = FACTORS.index(1.0)
# The anchored policy's other choice set (``policy.anchor_factors: wide``): whole steps away from the anchor,
# up to eight times it, so a tenant held at a cap of 1 beside a tenant that has gone quiet can be lent 8
# slots in one choice. "hold" keeps its index, so the network's head is the same either way.
WIDE_FACTORS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 2.0, 4.0, 8.0)
FACTOR_SETS: dict[str, tuple[float, ...]] = {"narrow": FACTORS, "wide": WIDE_FACTORS}
assert all(fs.index(1.0) == HOLD and len(fs) == len(FACTORS) for fs in FACTOR_SETS.values())


def factor_set(name: str) -> tuple[float, ...]:
    """The choice set called ``name`` (``FACTOR_SETS``); ValueError naming the allowed ones."""
    if name not in FACTOR_SETS:
        raise ValueError(f"factor set {name!r} is unknown; allowed: {', '.join(FACTOR_SETS)}")
    return FACTOR_SETS[name]
N_GLOBAL = len(GLOBAL_FEATURES) + 3
N_TENANT = len(TENANT_FEATURES)
CONTRACT_FEATURES = ("contract_rps", "contract_burst", "contract_attainment")
N_CONTRACT = len(CONTRACT_FEATURES)


def set_vector_size(max_tenants: int = MAX_TENANTS, anchored: bool = False, contracted: bool = False) -> int:
    return (N_GLOBAL + max_tenants * (N_TENANT + 1) + (max_tenants if anchored else 0)
            + (max_tenants * N_CONTRACT if contracted else 0))


def set_layout_of(size: int, max_tenants: int = MAX_TENANTS) -> tuple[bool, bool]:
    """(anchored, contracted) of a tenant-set input of ``size`` entries; ValueError for any other size."""
    for anchored in (False, True):
        for contracted in (False, True):
            if size == set_vector_size(max_tenants, anchored, contracted):
                return anchored, contracted
    raise ValueError(f"a tenant-set input for {max_tenants} slots has {set_vector_size(max_tenants)} entries "
                     f"(or {set_vector_size(max_tenants, True)} with anchors, "
                     f"{set_vector_size(max_tenants, False, True)} with contract features, "
                     f"{set_vector_size(max_tenants, True, True)} with both), got {size}")


def anchored_of(size: int, max_tenants: int = MAX_TENANTS) -> bool:
    """Whether a tenant-set input of ``size`` entries carries anchors; ValueError for a size of no layout."""
    return set_layout_of(size, max_tenants)[0]


def contract_features(spec: ControlSpec) -> np.ndarray:
    """Per tenant, ``CONTRACT_FEATURES`` of its contract (zeros without one): an (n, N_CONTRACT) array."""
    out = np.zeros((spec.n_tenants, N_CONTRACT), dtype=np.float32)
    for i, t in enumerate(spec.tenants):
        c = t.contract
        if c is not None:
            per_request = 1.0 if c.unit == "requests" else MEAN_TOKENS
            out[i] = (c.requests_per_s_at(MEAN_TOKENS), c.burst / per_request, c.attainment)
    return out


def check_tenants(n: int, max_tenants: int = MAX_TENANTS) -> None:
    if not 1 <= n <= max_tenants:
        raise ValueError(f"the tenant-set policy acts on 1..{max_tenants} tenants; this scenario has {n}")


def set_vector(flat: np.ndarray, n: int, limits: Limits, max_tenants: int = MAX_TENANTS,
               anchors: Sequence[int] | None = None, contracts: np.ndarray | None = None) -> np.ndarray:
    """The tenant-set vector from a layout-2 flat vector of ``n`` tenants (``Observation.to_vector()``);
    with ``anchors`` (one cap per tenant) the anchored layout; with ``contracts`` (``contract_features``) the
    contract features."""
    check_tenants(n, max_tenants)
    if anchors is not None:
        check_anchors(anchors, n, limits)
    if contracts is not None and np.shape(contracts) != (n, N_CONTRACT):
        raise ValueError(f"contract features must be {n} rows of {N_CONTRACT} ({', '.join(CONTRACT_FEATURES)}), "
                         f"got shape {np.shape(contracts)}")
    g = len(GLOBAL_FEATURES)
    if flat.shape != (g + n * N_TENANT,):
        raise ValueError(f"expected a layout-{LAYOUT_VERSION} vector of {g + n * N_TENANT} entries for {n} tenants, "
                         f"got shape {flat.shape}")
    out = np.zeros(set_vector_size(max_tenants, anchors is not None, contracts is not None), dtype=np.float32)
    out[:g] = flat[:g]
    out[g:N_GLOBAL] = (limits.min, limits.max, n)
    out[N_GLOBAL : N_GLOBAL + n * N_TENANT] = flat[g:]
    mask0 = N_GLOBAL + max_tenants * N_TENANT
    out[mask0 : mask0 + n] = 1.0
    a0 = mask0 + max_tenants
    if anchors is not None:
        out[a0 : a0 + n] = anchors
        a0 += max_tenants
    if contracts is not None:
        out[a0 : a0 + n * N_CONTRACT] = np.asarray(contracts, dtype=np.float32).reshape(-1)
    return out


def check_anchors(anchors: Sequence[int], n: int, limits: Limits) -> None:
    if len(anchors) != n or any(not limits.min <= int(a) <= limits.max for a in anchors):
        raise ValueError(f"anchors must be {n} caps within the limits {limits.min}..{limits.max}, got {list(anchors)}")


def observation_vector(obs: Observation, limits: Limits, max_tenants: int = MAX_TENANTS,
                       anchors: Sequence[int] | None = None, contracts: np.ndarray | None = None) -> np.ndarray:
    return set_vector(obs.to_vector(), obs.n_tenants, limits, max_tenants, anchors, contracts)


def delta_list(choices: Sequence[int] | np.ndarray, current: Sequence[float] | np.ndarray,
               limits: Limits) -> list[int]:
    """Per-tenant deltas (within ±max_step) for the first ``len(current)`` slots' choices.

    Written tenant by tenant in Python: at most eight of them, where a dozen numpy calls on tiny arrays cost
    several times the arithmetic (this runs at every training step). Python's ``round`` of a float rounds
    half to even, as ``np.rint`` does; a choice given as a float is truncated, as ``int()`` does."""
    n = len(current)
    if len(choices) < n:
        raise ValueError(f"{len(choices)} choices for {n} tenants")
    vals = choices.tolist() if isinstance(choices, np.ndarray) else list(choices)
    cur_vals = current.tolist() if isinstance(current, np.ndarray) else current
    k = limits.max_step
    out = []
    for i in range(n):
        c = int(vals[i])
        if not 0 <= c < len(FACTORS):
            raise ValueError(f"choice {c} is out of range 0..{len(FACTORS) - 1}")
        f = FACTORS[c]
        cur = round(float(cur_vals[i]))
        d = round(cur * f) - cur
        if f > 1.0:
            d = max(d, 1)
        elif f < 1.0:
            d = min(d, -1)
        out.append(-k if d < -k else k if d > k else d)
    return out


def delta_array(choices: Sequence[int] | np.ndarray, current: Sequence[float] | np.ndarray,
                limits: Limits) -> np.ndarray:
    """``delta_list`` as an int64 array."""
    return np.array(delta_list(choices, current, limits), dtype=np.int64)


def to_deltas(choices: Sequence[int] | np.ndarray, current: Sequence[float], limits: Limits) -> list[int]:
    """``delta_list`` (the deployed policy's name for it)."""
    return delta_list(choices, current, limits)


def anchored_delta_list(choices: Sequence[int] | np.ndarray, current: Sequence[float] | np.ndarray,
                        anchors: Sequence[int], limits: Limits,
                        factors: tuple[float, ...] = FACTORS) -> list[int]:
    """Per-tenant deltas (within ±max_step) towards each choice's target around the anchors (the module
    docstring's anchored action), the choices indexing ``factors`` (``FACTORS``, or ``WIDE_FACTORS`` for a
    policy trained with them); tenant by tenant in Python, as ``delta_list``."""
    n = len(current)
    if len(choices) < n or len(anchors) != n:
        raise ValueError(f"{len(choices)} choices and {len(anchors)} anchors for {n} tenants")
    vals = choices.tolist() if isinstance(choices, np.ndarray) else list(choices)
    cur_vals = current.tolist() if isinstance(current, np.ndarray) else current
    k, lo, hi = limits.max_step, limits.min, limits.max
    out = []
    for i in range(n):
        c = int(vals[i])
        if not 0 <= c < len(factors):
            raise ValueError(f"choice {c} is out of range 0..{len(factors) - 1}")
        f, a = factors[c], int(anchors[i])
        t = round(a * f)
        if f > 1.0:
            t = max(t, a + 1)
        elif f < 1.0:
            t = min(t, a - 1)
        t = lo if t < lo else hi if t > hi else t
        d = t - round(float(cur_vals[i]))
        out.append(-k if d < -k else k if d > k else d)
    return out
