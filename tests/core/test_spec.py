"""ControlSpec.apply keeps each tenant between its own floor and ceiling (core/spec.py), the wire carries both,
and a spec without a floor hashes as it did before the floor existed (train/static_search.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace

from admit.core.spec import ControlSpec, Limits, TenantSpec
from admit.core.wire import spec_from_json, spec_json
from admit.train.static_search import spec_fingerprint

LIMITS = Limits(min=1, max=16, initial=2, max_step=4)


def test_apply_keeps_each_tenant_under_its_ceiling() -> None:
    spec = ControlSpec((TenantSpec("a", max_limit=3), TenantSpec("b")), LIMITS)
    assert spec.apply([2, 2], [4, 4]) == [3, 6]
    assert spec.apply([3, 6], [-4, -4]) == [1, 2]


def test_apply_keeps_each_tenant_at_or_above_its_floor() -> None:
    # a: floor 4, ceiling 10 (Kueue: nominal 4, borrowing 6); b: the global bounds only
    spec = ControlSpec((TenantSpec("a", min_limit=4, max_limit=10), TenantSpec("b")), LIMITS)
    assert spec.apply([5, 5], [-4, -4]) == [4, 1]  # a cut to 1 is held at its floor, b goes to the global min
    assert spec.apply([8, 14], [4, 4]) == [10, 16]  # a stops at its ceiling, b at the global max
    assert spec.apply([4, 3], [1, 0]) == [5, 3]  # inside the bounds a decision is taken as given


def test_a_floor_above_the_global_max_is_still_the_tenants() -> None:
    spec = ControlSpec((TenantSpec("a", min_limit=20, max_limit=24),), LIMITS)
    assert spec.apply([20], [-4]) == [20] and spec.apply([20], [4]) == [20]


def test_the_wire_carries_floor_and_ceiling_and_reads_a_spec_without_them() -> None:
    spec = ControlSpec((TenantSpec("a", min_limit=4, max_limit=10), TenantSpec("b")), LIMITS)
    data = spec_json(spec)
    assert [(t["min_limit"], t["max_limit"]) for t in data["tenants"]] == [(4, 10), (None, None)]
    assert spec_from_json(data) == spec
    for t in data["tenants"]:  # a gateway older than the floor sends none
        del t["min_limit"]
    assert [t.min_limit for t in spec_from_json(data).tenants] == [None, None]


def test_a_spec_without_a_floor_keeps_its_fingerprint() -> None:
    spec = ControlSpec((TenantSpec("a", max_limit=10), TenantSpec("b")), LIMITS)
    data = asdict(spec)
    for t in data["tenants"]:  # the spec as it was hashed before contracts and floors existed
        for k in ("contract", "contract_load", "min_limit"):
            del t[k]
    before = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert spec_fingerprint(spec) == before
    floored = replace(spec, tenants=(replace(spec.tenants[0], min_limit=4), spec.tenants[1]))
    assert spec_fingerprint(floored) != before  # a floor changes what a tuning was searched under
