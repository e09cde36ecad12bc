"""Kueue's quota as the gateway's bounds: each tenant's floor, ceiling and borrowing from a ClusterQueue.

Kueue admits whole workloads against quota; admit moves per-request concurrency. Where both run, the
concurrency each tenant may have at the engine is what Kueue admitted for it, and admit should move limits
only inside that. ``admit gateway --kueue FILE`` reads the same Kueue objects the cluster was given (a
multi-document YAML: LocalQueues, ClusterQueues; other kinds are ignored) and sets, for every tenant:

* its **LocalQueue** is the one named like the tenant (in any namespace; two of that name are refused), and
  that LocalQueue's ``spec.clusterQueue`` is its **ClusterQueue** (one ClusterQueue per tenant: two tenants
  on one ClusterQueue would share a quota the gateway has no pool for, and are refused);
* ``limit`` and ``min_limit`` = the ClusterQueue's ``nominalQuota`` of the concurrency resource (default
  ``admit.dev/concurrency``, summed over its flavors): the tenant starts at its guaranteed share, and
  neither the admin API nor the control loop may set its limit below it, as Kueue never takes nominal quota
  from its owner;
* ``max_limit`` = ``nominalQuota`` + what Kueue lets it borrow from its cohort: its ``borrowingLimit``
  (unbounded when absent), capped by what the cohort's other ClusterQueues can lend (their ``lendingLimit``,
  else their whole nominal quota); no cohort, nothing to borrow. That is the most the tenant may hold,
  borrowing included: the control loop may raise its limit up to it, and the pool below never lets it hold
  more;
* ``borrow`` = that same room above the nominal quota, used per request: in the gateway's capacity pool a
  tenant takes idle slots of others the moment they are idle, as Kueue admits a workload on idle quota,
  without waiting for the control loop to raise its limit; the ceiling bounds limit and borrowing together,
  so a raised limit leaves that much less to borrow;
* the gateway's ``capacity`` = the cohort's pool: the tenants' nominal quota plus what the cohort's other
  ClusterQueues lend. It is what keeps the cohort within its quota, whoever raises limits: a freed slot goes
  to tenants below their floor first (gateway/local_admission.py), so a limit raised above the nominal
  quota is served from quota its owners leave idle, as Kueue lends it. One in-process pool means the
  tenants that borrow must share one cohort, and a gateway with ``redis:`` (no capacity pool) gets no
  borrowing: ``borrow`` 0 and ``max_limit`` = ``nominalQuota``, so the limit stays at the quota (said in
  the notes), rather than limits whose sum no one keeps within the cohort's.

What the floor made redundant: before it, ``max_limit`` was the nominal quota and ``borrow`` the only way
above it, so the control loop could only lower a limit (below a share Kueue guarantees) and never borrow.
Now the limit's range is the quota's, [nominal, nominal + borrowing], and ``borrow`` is kept only as the
pool's per-request use of that same range, never room beyond it.

Quantities are Kubernetes quantities that name whole requests: ``8``, ``"8"``, ``"2k"`` (1,000s) or
``"1Ki"`` (1,024s); a fraction (``"500m"``, ``1.5``) is refused. The cohort is ``spec.cohort``
(kueue.x-k8s.io/v1beta1) or ``spec.cohortName`` (v1beta2). Every problem is a `KueueError` naming the
object and the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from admit.gateway.config import LIMIT_MAX, ConfigError, GatewayConfig, parse_config, read_config_data

RESOURCE = "admit.dev/concurrency"
_GROUP = "kueue.x-k8s.io/"
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
_QUANTITY = re.compile(r"^([0-9]+)(|k|M|G|Ki|Mi|Gi)$")


class KueueError(ConfigError):
    """A Kueue manifest that cannot bound the gateway's tenants; the message says what and where."""


@dataclass(frozen=True)
class TenantQuota:
    """What Kueue admitted for one tenant, and what the gateway takes from it (module doc)."""

    tenant: str
    local_queue: str  # namespace/name
    cluster_queue: str
    cohort: str | None
    nominal: int  # -> limit and min_limit (the floor)
    borrow: int  # what it may borrow above it: -> borrow (0 without a cohort, or with redis)

    @property
    def ceiling(self) -> int:
        """-> max_limit: the most the tenant may hold, borrowing included."""
        return self.nominal + self.borrow


@dataclass(frozen=True)
class KueueBounds:
    tenants: tuple[TenantQuota, ...]
    capacity: int | None  # the cohort's pool when any tenant borrows, else None (the config's own is kept)
    notes: tuple[str, ...]


def quantity(value: Any, where: str) -> int:
    """A Kubernetes quantity of whole requests as an int; KueueError for a fraction or anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise KueueError(f"{where}: expected a whole number of requests (8, \"8\", \"2k\", \"1Ki\"), got {value!r}")
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise KueueError(f"{where}: {value!r} is not a whole number of requests (allowed: digits with an optional "
                         f"suffix {', '.join(s for s in _SUFFIX if s)}; no fractions such as 500m)")
    n = int(m.group(1)) * _SUFFIX[m.group(2)]
    if n > LIMIT_MAX:
        raise KueueError(f"{where}: {value!r} is more than the gateway allows ({LIMIT_MAX})")
    return n


def read_manifest(text: str, source: str = "kueue manifest") -> list[dict[str, Any]]:
    """The Kueue objects (apiVersion kueue.x-k8s.io/...) of a multi-document YAML, other kinds dropped."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise KueueError(f"{source}: not valid YAML ({exc})") from None
    objs = []
    for i, d in enumerate(docs):
        if d is None:
            continue
        if not isinstance(d, dict):
            raise KueueError(f"{source}: document {i + 1} is not a mapping (a Kubernetes object)")
        items = d.get("items") if d.get("kind") == "List" else [d]
        for o in items or []:
            if isinstance(o, dict) and str(o.get("apiVersion", "")).startswith(_GROUP):
                objs.append(o)
    return objs


def _name(o: Mapping[str, Any]) -> str:
    meta = o.get("metadata") or {}
    return str(meta.get("name", ""))


def _where(o: Mapping[str, Any]) -> str:
    meta = o.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{o.get('kind')} {ns + '/' if ns else ''}{meta.get('name', '?')}"


def _resource(cq: Mapping[str, Any], resource: str) -> tuple[int, float, float]:
    """(nominal, borrowing limit, lending limit) of ``resource`` summed over the ClusterQueue's flavors;
    ``inf`` for a limit a flavor leaves unset."""
    where = _where(cq)
    groups = (cq.get("spec") or {}).get("resourceGroups") or []
    nominal, borrowing, lending, found, covered = 0, 0.0, 0.0, False, []
    for g, group in enumerate(groups):
        for f, flavor in enumerate(group.get("flavors") or []):
            for r, res in enumerate(flavor.get("resources") or []):
                covered.append(str(res.get("name")))
                if res.get("name") != resource:
                    continue
                key = f"{where}: spec.resourceGroups[{g}].flavors[{f}].resources[{r}]"
                if "nominalQuota" not in res:
                    raise KueueError(f"{key}: no nominalQuota")
                found = True
                q = quantity(res["nominalQuota"], f"{key}.nominalQuota")
                nominal += q
                borrowing += (math.inf if res.get("borrowingLimit") is None
                              else quantity(res["borrowingLimit"], f"{key}.borrowingLimit"))
                lending += (q if res.get("lendingLimit") is None
                            else min(q, quantity(res["lendingLimit"], f"{key}.lendingLimit")))
    if not found:
        covers = ", ".join(sorted(set(covered))) or "nothing"
        raise KueueError(f"{where}: no quota of {resource} (it covers: {covers}); give the concurrency resource's "
                         "name with --kueue-resource")
    return nominal, borrowing, lending


def _cohort(cq: Mapping[str, Any]) -> str | None:
    spec = cq.get("spec") or {}
    c = spec.get("cohort", spec.get("cohortName"))
    return str(c) if c else None


def map_quota(objects: Iterable[Mapping[str, Any]], tenants: Sequence[str], resource: str = RESOURCE,
              pool: bool = True) -> KueueBounds:
    """Each tenant's quota from Kueue's objects (module doc). ``pool``: the gateway can have a capacity pool
    (False with redis: no borrowing)."""
    objs = list(objects)
    lqs: dict[str, list[Mapping[str, Any]]] = {}
    cqs: dict[str, Mapping[str, Any]] = {}
    for o in objs:
        if o.get("kind") == "LocalQueue":
            lqs.setdefault(_name(o), []).append(o)
        elif o.get("kind") == "ClusterQueue":
            if _name(o) in cqs:
                raise KueueError(f"ClusterQueue {_name(o)} is given twice")
            cqs[_name(o)] = o
    chosen: dict[str, tuple[str, str]] = {}  # tenant -> (local queue, cluster queue)
    for t in tenants:
        found = lqs.get(t, [])
        if not found:
            raise KueueError(f"tenant {t!r}: no LocalQueue named {t!r} (LocalQueues: "
                             f"{', '.join(sorted(lqs)) or 'none'}); each tenant is bound by the LocalQueue of its name")
        if len(found) > 1:
            raise KueueError(f"tenant {t!r}: {len(found)} LocalQueues named {t!r} ({', '.join(map(_where, found))}); "
                             "keep one per tenant name")
        cq = str((found[0].get("spec") or {}).get("clusterQueue") or "")
        if not cq:
            raise KueueError(f"{_where(found[0])}: no spec.clusterQueue")
        if cq not in cqs:
            raise KueueError(f"{_where(found[0])}: its ClusterQueue {cq!r} is not in the manifest "
                             f"(ClusterQueues: {', '.join(sorted(cqs)) or 'none'})")
        chosen[t] = (_where(found[0]).removeprefix("LocalQueue "), cq)
    by_cq: dict[str, list[str]] = {}
    for t, (_, cq) in chosen.items():
        by_cq.setdefault(cq, []).append(t)
    shared = {cq: ts for cq, ts in by_cq.items() if len(ts) > 1}
    if shared:
        cq, ts = next(iter(sorted(shared.items())))
        raise KueueError(f"tenants {', '.join(ts)} share ClusterQueue {cq}: its quota would bound their sum, which "
                         "the gateway cannot enforce; give each tenant a ClusterQueue of its own (one cohort lets "
                         "them borrow from each other)")
    quota = {name: _resource(cqs[name], resource) for name in by_cq}
    cohorts = {_cohort(cqs[c]) for c in by_cq} - {None}
    for name, other in cqs.items():  # the cohorts' other ClusterQueues lend what they hold of the resource
        if name not in quota and _cohort(other) in cohorts:
            try:
                quota[name] = _resource(other, resource)
            except KueueError:
                quota[name] = (0, 0.0, 0.0)  # it holds none of it (a GPU-only queue, say): it lends none
    notes: list[str] = []
    out = []
    for t in tenants:
        lq, cq = chosen[t]
        nominal, borrowing, _ = quota[cq]
        cohort = _cohort(cqs[cq])
        borrow = 0
        if cohort is not None:
            lendable = sum(quota[o][2] for o in quota if o != cq and _cohort(cqs[o]) == cohort)
            borrow = int(min(borrowing, lendable))
            if borrow and not pool:
                notes.append(f"tenant {t!r}: Kueue lets it borrow {borrow} from cohort {cohort}, but a gateway with "
                             "redis has no capacity pool to keep the cohort within its quota: borrow 0 and max_limit "
                             f"{nominal}, its nominal quota (the limit stays at it)")
                borrow = 0
        out.append(TenantQuota(t, lq, cq, cohort, nominal, borrow))
    borrowers = {q.cohort for q in out if q.borrow}
    capacity = None
    if borrowers:
        if len(borrowers) > 1:
            raise KueueError(f"tenants borrow in cohorts {', '.join(sorted(c for c in borrowers if c))}: the gateway "
                             "has one capacity pool, so the tenants that borrow must share one cohort")
        cohort = next(iter(borrowers))
        ours = {q.cluster_queue for q in out}
        capacity = (sum(q.nominal for q in out)
                    + int(sum(quota[o][2] for o in quota if o not in ours and _cohort(cqs[o]) == cohort)))
        outside = [q.tenant for q in out if q.cohort != cohort]
        if outside:
            notes.append(f"tenant(s) {', '.join(outside)} outside cohort {cohort} take part in its pool with their "
                         "nominal quota only (borrow 0)")
    return KueueBounds(tuple(out), capacity, tuple(notes))


def apply_quota(data: Mapping[str, Any], mapping: KueueBounds) -> dict[str, Any]:
    """The gateway configuration ``data`` (the YAML's mapping) with each tenant's limit, min_limit, max_limit
    and borrow, and the capacity when borrowing, set from ``mapping``."""
    by = {q.tenant: q for q in mapping.tenants}
    tenants = []
    for t in data.get("tenants") or []:
        q = by[t["name"]]
        tenants.append({**t, "limit": q.nominal, "min_limit": q.nominal, "max_limit": q.ceiling, "borrow": q.borrow})
    out = {**data, "tenants": tenants}
    if mapping.capacity is not None:
        out["capacity"] = mapping.capacity
    return out


def load_with_kueue(config: str | Path, kueue: str | Path, resource: str = RESOURCE,
                    ) -> tuple[GatewayConfig, KueueBounds]:
    """The gateway configuration at ``config`` bounded by the Kueue manifest at ``kueue`` (module doc), and
    the mapping it took; ConfigError (KueueError) saying what was wrong."""
    cpath, kpath = Path(config), Path(kueue)
    data = read_config_data(cpath)
    if not kpath.is_file():
        raise ConfigError(f"Kueue manifest {kpath} does not exist")
    if not isinstance(data, dict) or not isinstance(data.get("tenants"), list):
        parse_config(data, str(cpath))  # the loader's own message
        raise ConfigError(f"{cpath}: expected a 'tenants' list")
    names = [str(t.get("name")) for t in data["tenants"] if isinstance(t, dict)]
    if len(names) != len(data["tenants"]):
        parse_config(data, str(cpath))
    objs = read_manifest(kpath.read_text(), str(kpath))
    mapping = map_quota(objs, names, resource, pool=data.get("redis") is None)
    return parse_config(apply_quota(data, mapping), f"{cpath} bounded by {kpath}"), mapping
