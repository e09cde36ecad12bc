"""Kueue's quota as the gateway's bounds (gateway/kueue.py): the mapping on a manifest (the nominal quota the
floor of a tenant's limit, nominal plus what it may borrow the ceiling), its refusals, and a real gateway
started with ``--kueue`` that neither the admin API nor the control loop can push outside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from admit.gateway.kueue import KueueError, load_with_kueue, map_quota, quantity, read_manifest
from gateway_helpers import ADMIN_TOKEN, CountingMock, GatewayProcess, tenant_cfg

# bounds a hang; a loaded 2-core machine starts a gateway in seconds
pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]

R = "admit.dev/concurrency"


def cq(name: str, nominal: object, cohort: str | None = "serving", resource: str = R, **limits: object) -> dict:
    spec: dict = {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": [resource], "flavors": [
        {"name": "default-flavor", "resources": [{"name": resource, "nominalQuota": nominal, **limits}]}]}]}
    if cohort:
        spec["cohort"] = cohort
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def lq(name: str, cluster_queue: str, namespace: str = "llm") -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue}}


FLAVOR = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}}
# chat: 8 nominal, may borrow 6; batch: 4 nominal, no borrowing limit; training: not a tenant of the gateway,
# 10 nominal of which it lends 3; gpu-only: in the cohort but holds no concurrency at all
MANIFEST = [FLAVOR, cq("chat-cq", 8, borrowingLimit=6), cq("batch-cq", "4"),
            cq("training-cq", 10, lendingLimit=3), cq("gpu-only", 2, resource="nvidia.com/gpu"),
            lq("chat", "chat-cq"), lq("batch", "batch-cq"), lq("training", "training-cq", "ml"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "llm"}}]


def test_each_tenant_gets_its_quota_as_floor_and_nominal_plus_what_the_cohort_lends_as_ceiling() -> None:
    m = map_quota(MANIFEST, ["chat", "batch"])
    got = {q.tenant: (q.local_queue, q.cluster_queue, q.cohort, q.nominal, q.borrow, q.ceiling) for q in m.tenants}
    # chat borrows min(its borrowingLimit 6, what others lend: batch 4 + training 3) = 6; batch, with no
    # borrowingLimit, borrows min(inf, chat 8 + training 3) = 11; the pool is both nominal quotas plus what
    # training lends
    assert got == {"chat": ("llm/chat", "chat-cq", "serving", 8, 6, 14),
                   "batch": ("llm/batch", "batch-cq", "serving", 4, 11, 15)}
    assert m.capacity == 8 + 4 + 3 and m.notes == ()


def test_the_config_gets_limit_and_floor_at_the_nominal_quota_and_the_ceiling_with_borrowing(tmp_path: Path) -> None:
    (tmp_path / "k.yaml").write_text(yaml.safe_dump_all(MANIFEST))
    cfg = {"capacity": 3, "tenants": [tenant_cfg("chat", limit=1, max_limit=2), tenant_cfg("batch", borrow=1)]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(cfg))
    gc, _ = load_with_kueue(tmp_path / "g.yaml", tmp_path / "k.yaml")
    got = [(t.limit, t.min_limit, t.max_limit, t.borrow) for t in gc.tenants]
    assert got == [(8, 8, 14, 6), (4, 4, 15, 11)] and gc.capacity == 15  # the file's own bounds are replaced


def test_a_borrowing_limit_beyond_what_the_cohort_lends_is_capped_by_it() -> None:
    objs = [cq("a-cq", 4, borrowingLimit="1k"), cq("b-cq", 6, lendingLimit=2), cq("c-cq", 2, borrowingLimit=1),
            lq("a", "a-cq"), lq("b", "b-cq"), lq("c", "c-cq")]
    m = map_quota(objs, ["a", "b", "c"])
    # a may borrow 1,000 but b lends 2 and c its 2: ceiling 4 + 4; b, unbounded, borrows a's 4 and c's 2;
    # c borrows at most 1
    assert [(q.nominal, q.ceiling) for q in m.tenants] == [(4, 8), (6, 12), (2, 3)] and m.capacity == 12


def test_without_a_cohort_there_is_no_borrowing_and_the_config_keeps_its_capacity() -> None:
    objs = [cq("a-cq", 5, cohort=None), cq("b-cq", 3, cohort=None), lq("a", "a-cq"), lq("b", "b-cq")]
    m = map_quota(objs, ["a", "b"])
    assert [(q.nominal, q.borrow, q.ceiling) for q in m.tenants] == [(5, 0, 5), (3, 0, 3)] and m.capacity is None


def test_a_gateway_with_redis_gets_no_borrowing_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "k.yaml").write_text(yaml.safe_dump_all(MANIFEST))
    cfg = {"redis": {"url": "redis://127.0.0.1:6379/0"}, "tenants": [tenant_cfg("chat", limit=1), tenant_cfg("batch")]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(cfg))
    gc, m = load_with_kueue(tmp_path / "g.yaml", tmp_path / "k.yaml")
    # no pool keeps the cohort within its quota: floor and ceiling are the nominal quota, the limit stays there
    got = [(t.limit, t.min_limit, t.max_limit, t.borrow) for t in gc.tenants]
    assert got == [(8, 8, 8, 0), (4, 4, 4, 0)] and gc.capacity is None
    assert len(m.notes) == 2 and all("redis has no capacity pool" in n for n in m.notes)


@pytest.mark.parametrize(("objects", "tenants", "message"), [
    ([cq("chat-cq", 8), lq("chat", "chat-cq")], ["chat", "batch"], "tenant 'batch': no LocalQueue named 'batch'"),
    ([cq("x", 8), lq("a", "x"), lq("b", "x")], ["a", "b"], "tenants a, b share ClusterQueue x"),
    ([cq("x", 8), lq("a", "x"), lq("a", "x", "other")], ["a"], "2 LocalQueues named 'a'"),
    ([lq("a", "missing")], ["a"], "its ClusterQueue 'missing' is not in the manifest"),
    ([cq("x", 8, resource="cpu"), lq("a", "x")], ["a"], "no quota of admit.dev/concurrency (it covers: cpu)"),
    ([cq("x", "500m"), lq("a", "x")], ["a"], "'500m' is not a whole number of requests"),
    ([cq("x", 1.5), lq("a", "x")], ["a"], "expected a whole number of requests"),
    ([cq("x", 2, cohort="one", borrowingLimit=1), cq("y", 2, cohort="two", borrowingLimit=1), cq("z", 2, cohort="one"),
      cq("w", 2, cohort="two"), lq("a", "x"), lq("b", "y")], ["a", "b"], "tenants borrow in cohorts one, two"),
])
def test_a_manifest_that_cannot_bound_the_tenants_is_refused_with_what_and_where(
        objects: list, tenants: list, message: str) -> None:
    with pytest.raises(KueueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        map_quota(objects, tenants)


def test_quantities_are_whole_requests_with_kubernetes_suffixes() -> None:
    assert [quantity(v, "q") for v in (8, "8", "2k", "1Ki", " 3 ")] == [8, 8, 2000, 1024, 3]
    for bad in ("1.5", "-1", "8x", True, None):
        with pytest.raises(KueueError, match="whole number"):
            quantity(bad, "q")


def test_read_manifest_keeps_kueue_objects_of_lists_and_streams_and_refuses_bad_yaml() -> None:
    text = yaml.safe_dump_all([{"apiVersion": "v1", "kind": "List", "items": [lq("a", "x")]}, None, cq("x", 1)])
    assert [o["kind"] for o in read_manifest(text)] == ["LocalQueue", "ClusterQueue"]
    with pytest.raises(KueueError, match="not valid YAML"):
        read_manifest("a: [", "k.yaml")
    with pytest.raises(KueueError, match="document 1 is not a mapping"):
        read_manifest("- 1\n", "k.yaml")


@pytest.fixture(scope="module")
def gw(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("gw-kueue")
    (tmp / "kueue.yaml").write_text(yaml.safe_dump_all(MANIFEST))
    cfg = {"tenants": [tenant_cfg("chat", limit=1), tenant_cfg("batch", limit=1)],
           "control": {"min_limit": 1, "max_limit": 32, "max_step": 16, "interval_s": 1}}
    g = GatewayProcess(tmp, mock.url, cfg, args=["--kueue", str(tmp / "kueue.yaml")])
    yield g
    g.stop()


def test_a_gateway_started_with_kueue_runs_on_the_quota(gw: GatewayProcess) -> None:
    st = gw.state()["tenants"]
    assert (st["chat"]["limit"], st["chat"]["borrow"], st["batch"]["limit"], st["batch"]["borrow"]) == (8, 6, 4, 11)
    line = ("LocalQueue llm/chat -> ClusterQueue chat-cq (cohort serving): limit = min_limit = 8, max_limit 14, "
            "borrow 6")
    assert line in gw.stderr()
    status, spec = gw.admin("GET", "/admin/spec")
    assert status == 200
    assert {t["name"]: (t["min_limit"], t["max_limit"]) for t in spec["tenants"]} == {"chat": (8, 14), "batch": (4, 15)}


def test_the_admin_api_refuses_a_limit_above_the_ceiling_and_applies_nothing_of_the_batch(gw: GatewayProcess) -> None:
    v0 = gw.state()["version"]
    status, body = gw.admin("PUT", "/admin/limits", {"limits": {"chat": 10, "batch": 16}})
    assert status == 400 and body["reason"] == "above-max-limit"
    assert "batch 16 > 15; allowed: chat 8..14, batch 4..15" in body["error"]["message"]
    st = gw.state()
    assert st["version"] == v0 and st["tenants"]["chat"]["limit"] == 8  # chat's 10 was not applied either
    assert gw.admin("PUT", "/admin/tenants/batch/limit", {"limit": 15})[0] == 200  # at the ceiling is allowed
    assert gw.admin("PUT", "/admin/tenants/batch/limit", {"limit": 4})[0] == 200


def test_the_admin_api_refuses_a_limit_below_the_floor_and_applies_nothing_of_the_batch(gw: GatewayProcess) -> None:
    v0 = gw.state()["version"]
    status, body = gw.admin("PUT", "/admin/limits", {"limits": {"chat": 12, "batch": 3}})
    assert status == 400 and body["reason"] == "below-min-limit"
    assert "min_limit (its guaranteed share" in body["error"]["message"]
    assert "batch 3 < 4; allowed: chat 8..14, batch 4..15" in body["error"]["message"]
    status, body = gw.admin("PUT", "/admin/tenants/chat/limit", {"limit": 0})
    assert status == 400 and "chat 0 < 8; allowed: chat 8..14" in body["error"]["message"]
    st = gw.state()
    assert st["version"] == v0 and (st["tenants"]["chat"]["limit"], st["tenants"]["batch"]["limit"]) == (8, 4)


@pytest.mark.parametrize(("policy", "held"), [("static:32", {"chat": 14, "batch": 15}),
                                             ("static:1", {"chat": 8, "batch": 4})])
def test_the_control_loop_is_held_between_floor_and_ceiling(gw: GatewayProcess, tmp_path: Path, policy: str,
                                                             held: dict) -> None:
    assert gw.admin("PUT", "/admin/limits", {"limits": {"chat": 10, "batch": 10}})[0] == 200
    env = {**os.environ, "ADMIT_ADMIN_TOKEN": ADMIN_TOKEN}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "admit"), "control", "--gateway", gw.url, "--policy", policy,
         "--interval", "200ms", "--spec", "gateway", "--steps", "2", "--log", str(tmp_path / "d.jsonl")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    decisions = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [d["outcome"] for d in decisions] == ["applied", "unchanged"]
    assert all(d["limits_after"] == held for d in decisions)  # asked 32 (or 1), held at the ceiling (or floor)
    st = gw.state()["tenants"]
    assert {"chat": st["chat"]["limit"], "batch": st["batch"]["limit"]} == held


def test_a_bad_kueue_manifest_stops_the_gateway_before_it_listens(mock: CountingMock, tmp_path: Path) -> None:
    (tmp_path / "kueue.yaml").write_text(yaml.safe_dump_all([cq("chat-cq", "500m"), lq("chat", "chat-cq")]))
    g = GatewayProcess(tmp_path, mock.url, {"tenants": [tenant_cfg("chat")]}, wait=False,
                       args=["--kueue", str(tmp_path / "kueue.yaml")])
    try:
        assert g.proc.wait(timeout=60) == 2
        assert "'500m' is not a whole number of requests" in g.stderr()
    finally:
        g.stop()


def test_a_saved_limit_outside_changed_bounds_comes_back_inside_them(mock: CountingMock, tmp_path: Path) -> None:
    state = {"state_file": str(tmp_path / "state.json")}
    g = GatewayProcess(tmp_path, mock.url, {**state, "tenants": [tenant_cfg("a", limit=2), tenant_cfg("b", limit=2)]})
    try:
        assert g.admin("PUT", "/admin/limits", {"limits": {"a": 7, "b": 1}})[0] == 200
    finally:
        g.stop()
    # the quotas changed: a's ceiling shrank below what was saved, b's floor grew above it
    tenants = [tenant_cfg("a", limit=2, max_limit=5), tenant_cfg("b", limit=3, min_limit=3)]
    g2 = GatewayProcess(tmp_path, mock.url, {**state, "tenants": tenants})
    try:
        st = g2.state()["tenants"]
        assert (st["a"]["limit"], st["b"]["limit"]) == (5, 3)
        assert "saved limit 7 is above its max_limit 5; 5 is used" in g2.stderr()
        assert "saved limit 1 is below its min_limit 3; 3 is used" in g2.stderr()
    finally:
        g2.stop()
