"""Kueue's quota as the gateway's bounds (gateway/kueue.py): the mapping on a manifest, its refusals, and a
real gateway started with ``--kueue`` that neither the admin API nor the control loop can push past it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from admit.core.spec import ControlSpec, Limits, TenantSpec
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


def test_each_tenant_gets_its_quota_as_limit_and_ceiling_and_borrows_what_the_cohort_lends() -> None:
    m = map_quota(MANIFEST, ["chat", "batch"])
    got = {q.tenant: (q.local_queue, q.cluster_queue, q.cohort, q.nominal, q.borrow) for q in m.tenants}
    # chat borrows min(its limit 6, what others lend: batch 4 + training 3) = 6; batch, unlimited, borrows
    # min(inf, chat 8 + training 3) = 11; the pool is both nominal quotas plus what training lends
    assert got == {"chat": ("llm/chat", "chat-cq", "serving", 8, 6),
                   "batch": ("llm/batch", "batch-cq", "serving", 4, 11)}
    assert m.capacity == 8 + 4 + 3 and m.notes == ()


def test_without_a_cohort_there_is_no_borrowing_and_the_config_keeps_its_capacity() -> None:
    objs = [cq("a-cq", 5, cohort=None), cq("b-cq", 3, cohort=None), lq("a", "a-cq"), lq("b", "b-cq")]
    m = map_quota(objs, ["a", "b"])
    assert [(q.nominal, q.borrow) for q in m.tenants] == [(5, 0), (3, 0)] and m.capacity is None


def test_a_gateway_with_redis_gets_no_borrowing_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "k.yaml").write_text(yaml.safe_dump_all(MANIFEST))
    cfg = {"redis": {"url": "redis://127.0.0.1:6379/0"}, "tenants": [tenant_cfg("chat", limit=1), tenant_cfg("batch")]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(cfg))
    gc, m = load_with_kueue(tmp_path / "g.yaml", tmp_path / "k.yaml")
    assert [(t.limit, t.max_limit, t.borrow) for t in gc.tenants] == [(8, 8, 0), (4, 4, 0)] and gc.capacity is None
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


def test_the_control_specs_apply_keeps_each_tenant_under_its_ceiling() -> None:
    spec = ControlSpec((TenantSpec("a", max_limit=3), TenantSpec("b")), Limits(min=1, max=16, initial=2, max_step=4))
    assert spec.apply([2, 2], [4, 4]) == [3, 6]
    assert spec.apply([3, 6], [-4, -4]) == [1, 2]


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
    line = "LocalQueue llm/chat -> ClusterQueue chat-cq (cohort serving): limit = max_limit = 8, borrow 6"
    assert line in gw.stderr()
    status, spec = gw.admin("GET", "/admin/spec")
    assert status == 200 and {t["name"]: t["max_limit"] for t in spec["tenants"]} == {"chat": 8, "batch": 4}


def test_the_admin_api_refuses_a_limit_above_the_quota_and_applies_nothing_of_the_batch(gw: GatewayProcess) -> None:
    v0 = gw.state()["version"]
    status, body = gw.admin("PUT", "/admin/limits", {"limits": {"chat": 2, "batch": 5}})
    assert status == 400 and body["reason"] == "above-max-limit" and "batch 5 > 4" in body["error"]["message"]
    st = gw.state()
    assert st["version"] == v0 and st["tenants"]["chat"]["limit"] == 8  # chat's 2 was not applied either
    assert gw.admin("PUT", "/admin/tenants/batch/limit", {"limit": 3})[0] == 200
    assert gw.admin("PUT", "/admin/tenants/batch/limit", {"limit": 4})[0] == 200  # at the ceiling is allowed


def test_the_control_loop_asks_for_more_and_gets_the_quota(gw: GatewayProcess, tmp_path: Path) -> None:
    assert gw.admin("PUT", "/admin/limits", {"limits": {"chat": 2, "batch": 1}})[0] == 200
    env = {**os.environ, "ADMIT_ADMIN_TOKEN": ADMIN_TOKEN}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "admit"), "control", "--gateway", gw.url, "--policy", "static:32",
         "--interval", "200ms", "--spec", "gateway", "--steps", "2", "--log", str(tmp_path / "d.jsonl")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    decisions = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [d["outcome"] for d in decisions] == ["applied", "unchanged"]
    assert all(d["limits_after"] == {"chat": 8, "batch": 4} for d in decisions)  # asked 32, held at the quota
    st = gw.state()["tenants"]
    assert (st["chat"]["limit"], st["batch"]["limit"]) == (8, 4)


def test_a_bad_kueue_manifest_stops_the_gateway_before_it_listens(mock: CountingMock, tmp_path: Path) -> None:
    (tmp_path / "kueue.yaml").write_text(yaml.safe_dump_all([cq("chat-cq", "500m"), lq("chat", "chat-cq")]))
    g = GatewayProcess(tmp_path, mock.url, {"tenants": [tenant_cfg("chat")]}, wait=False,
                       args=["--kueue", str(tmp_path / "kueue.yaml")])
    try:
        assert g.proc.wait(timeout=60) == 2
        assert "'500m' is not a whole number of requests" in g.stderr()
    finally:
        g.stop()


def test_a_saved_limit_above_a_shrunken_ceiling_comes_back_at_the_ceiling(mock: CountingMock, tmp_path: Path) -> None:
    state = {"state_file": str(tmp_path / "state.json")}
    g = GatewayProcess(tmp_path, mock.url, {**state, "tenants": [tenant_cfg("a", limit=2)]})
    try:
        assert g.admin("PUT", "/admin/limits", {"limits": {"a": 7}})[0] == 200
    finally:
        g.stop()
    g2 = GatewayProcess(tmp_path, mock.url, {**state, "tenants": [tenant_cfg("a", limit=2, max_limit=5)]})
    try:
        assert g2.state()["tenants"]["a"]["limit"] == 5
        assert "saved limit 7 is above its max_limit 5; 5 is used" in g2.stderr()
    finally:
        g2.stop()
