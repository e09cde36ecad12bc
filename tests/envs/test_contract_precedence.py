"""Episodes with a contract: the tenant's in-contract requests take precedence over its excess in its queue.

h200-mixed's chat tenant sends 3.6 req/s against a contract of 1.2 (three times its contract) at a fixed limit
it cannot serve all of at once. The same requests (one seed: the contract changes no draw) run once with the
contract, where the admission core queues the excess behind the in-contract requests, and once without it,
one FIFO queue; the in-contract requests are the same in both (classified on the arrivals alone).
"""

from __future__ import annotations

import numpy as np
import pytest
from admit.envs.compiled import make_simulation
from admit.envs.simulation import in_contract
from contract_helpers import with_contracts, without_contracts

HORIZON_S = 900.0
LIMIT = 8
CHAT = {"requests_per_s": 1.2, "burst": 4, "attainment": 0.9}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_contract_requests_of_a_tenant_sending_three_times_its_contract_are_served_first(seed: int) -> None:
    contracted = with_contracts("h200-mixed", {"chat": CHAT}, horizon_s=HORIZON_S)
    plain = without_contracts("h200-mixed", horizon_s=HORIZON_S)
    k = [t.name for t in contracted.tenants].index("chat")
    bounds = [t.request_bounds for t in contracted.control_spec().tenants]
    got = {}
    for label, sc in (("precedence", contracted), ("fifo", plain)):
        sim = make_simulation(sc, seed)
        sim.set_limits([LIMIT] * len(sc.tenants))
        sim.advance(HORIZON_S)
        cols = sim.request_columns()
        inside = in_contract(contracted, cols.tenant, cols.arrival, cols.prompt, cols.output)
        mine = cols.tenant == k
        assert 2.5 < mine.sum() / (mine & inside).sum() < 3.5  # about three times its contract
        dispatched = np.array([r.dispatched for r in sim.requests])
        good = cols.good(bounds)
        got[label] = (good[mine & inside].mean(), good[mine & ~inside].mean(),
                      _overtakes(cols.arrival, dispatched, mine & inside, mine & ~inside))
    (in_p, ex_p, over_p), (in_f, ex_f, over_f) = got["precedence"], got["fifo"]
    # the class is the only difference: the same requests, limits and engine
    assert over_p == 0 and over_f > 0
    # at this limit chat's queue is rarely empty: FIFO leaves its promised requests behind the excess (almost
    # none within the objectives), precedence serves them first (most within them)
    assert in_f < 0.05 and in_p > 0.3 and in_p > 10 * in_f
    assert ex_p <= ex_f + 0.01  # what the promised requests gain, the excess pays (it was already nearly all late)


def _overtakes(arrival: np.ndarray, dispatched: np.ndarray, inside: np.ndarray, excess: np.ndarray) -> int:
    """Excess requests dispatched at a time when an in-contract request of the same tenant that arrived strictly
    earlier was still waiting (it was dispatched strictly later): what precedence rules out."""
    d_x = dispatched[excess]
    d_x = d_x[np.isfinite(d_x)]
    a_c, d_c = arrival[inside], dispatched[inside]
    waiting = np.isfinite(d_c)
    a_c, d_c = a_c[waiting], d_c[waiting]
    return int(((a_c[None, :] < d_x[:, None]) & (d_x[:, None] < d_c[None, :])).any(axis=1).sum())
