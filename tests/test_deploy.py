"""The Kubernetes manifests in deploy/ (docs/deploy.md), checked offline.

Every kustomization under deploy/ is rendered with the ``kubectl`` on PATH (``make test`` installs Debian's
kubernetes-client when there is none; the manifests keep to what its kustomize v2.0.3 reads, and current
kubectl renders them too). The objects are validated against Kubernetes' own schemas (kubernetes-validate);
the custom resources it has no schema for (Kueue, KubeRay, Prometheus Operator) are checked field by field
here. The gateway configuration inside the rendered ConfigMap must load with admit's own loader, and the
Grafana dashboard may only query metrics that the gateway or vLLM really export.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBECTL = shutil.which("kubectl")

NO_KUBECTL = (
    "kubectl is not on PATH, so deploy/ cannot be rendered (make test installs it: apt-get install kubernetes-client)"
)

# every kustomization under deploy/, relative to it (a new one must be added here, with what it renders)
KUSTOMIZATIONS = ("base", "overlays/dev", "overlays/gpu", "monitoring", "kueue", "ray")
CRD_KINDS = {"ResourceFlavor", "ClusterQueue", "LocalQueue", "RayJob", "ServiceMonitor"}
NAMESPACE = "llm"
K8S_VERSION = kubernetes_validate.latest_version()

_APP = {
    ("Namespace", "llm"),
    ("Deployment", "admit-gateway"),
    ("Service", "admit-gateway"),
    ("StatefulSet", "redis"),
    ("Service", "redis"),
    ("Deployment", "admit-control"),
    ("ConfigMap", "admit-config"),
}
_QUEUES = {
    ("ResourceFlavor", "default-flavor"),
    ("ClusterQueue", "chat"),
    ("ClusterQueue", "batch"),
    ("LocalQueue", "chat"),
    ("LocalQueue", "batch"),
}
# (kind, name without a generator's hash suffix) of everything each kustomization renders, and no more
EXPECTED = {
    "base": _APP,
    "overlays/dev": _APP | {("Secret", "admit-secrets"), ("Deployment", "vllm"), ("Service", "vllm")},
    "overlays/gpu": _APP | {("Deployment", "vllm"), ("Service", "vllm")},
    "monitoring": {
        ("ServiceMonitor", "admit-gateway"),
        ("ServiceMonitor", "vllm"),
        ("ConfigMap", "admit-grafana-dashboard"),
    },
    "kueue": {("Namespace", "llm")} | _QUEUES,
    "ray": {("RayJob", "admit-results")},
}
GENERATED = {"admit-config", "admit-secrets"}  # names that get a content-hash suffix


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


def _read_env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            pairs[k] = v
    return pairs


DEV_SECRETS = _read_env_file(DEPLOY / "overlays/dev/secrets.env")


@functools.cache
def render(path: str) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl kustomize deploy/<path>` prints (stderr carries only deprecation warnings); the
    test that asks is skipped, with the reason, when there is no kubectl (and only then)."""
    if KUBECTL is None:
        pytest.skip(NO_KUBECTL)
    proc = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize deploy/{path} failed:\n{proc.stderr}"
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d is not None)
    assert docs, f"deploy/{path} renders nothing"
    return docs


def base_name(obj: dict[str, Any]) -> str:
    name = obj["metadata"]["name"]
    stem, _, suffix = name.rpartition("-")
    return stem if stem in GENERATED and re.fullmatch(r"[a-z0-9]{10}", suffix) else name


def find(path: str, kind: str, name: str) -> dict[str, Any]:
    hits = [o for o in render(path) if o["kind"] == kind and base_name(o) == name]
    assert len(hits) == 1, f"deploy/{path}: expected one {kind} {name}, found {len(hits)}"
    return hits[0]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def workloads(path: str) -> list[dict[str, Any]]:
    return [o for o in render(path) if o["kind"] in ("Deployment", "StatefulSet")]


def secret_data(path: str) -> dict[str, str]:
    secret = find(path, "Secret", "admit-secrets")
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_every_kustomization_is_listed() -> None:
    found = sorted(str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob("kustomization.yaml"))
    assert found == sorted(KUSTOMIZATIONS)


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_renders_the_expected_objects(path: str) -> None:
    objs = render(path)
    got = [(o["kind"], base_name(o)) for o in objs]
    assert len(got) == len(set(got)), f"an object is rendered twice: {got}"
    assert set(got) == EXPECTED[path]
    for o in objs:  # everything namespaced lives in llm; cluster-scoped objects carry no namespace
        ns = o["metadata"].get("namespace")
        if o["kind"] in ("Namespace", "ResourceFlavor", "ClusterQueue"):
            assert ns is None, f"{o['kind']} {o['metadata']['name']} is cluster-scoped but has namespace {ns}"
        else:
            assert ns == NAMESPACE, f"{o['kind']} {o['metadata']['name']} is in namespace {ns!r}"


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_objects_validate_against_the_kubernetes_schemas(path: str) -> None:
    unchecked = set()
    for o in render(path):
        where = f"deploy/{path}: {o['kind']} {o['metadata']['name']}"
        try:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            # a custom resource: no schema ships with kubernetes-validate; test_*_resources below check them
            assert o["kind"] in CRD_KINDS, f"{where}: no schema for this kind (a typo in apiVersion or kind?)"
            unchecked.add(o["kind"])
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{where} is invalid at {'.'.join(map(str, err.path))}: {err.message}")
    assert unchecked <= CRD_KINDS


# ----------------------------------------------------------------------------- the app: base and overlays
GATEWAY_COMMAND = [
    "admit",
    "gateway",
    "--backend",
    "http://vllm:8000",
    "--config",
    "/etc/admit/tenants.yaml",
    "--host",
    "0.0.0.0",
    "--port",
    "8080",
    "--workers",
    "1",
    "--kueue",
    "/etc/admit/kueue.yaml",
]
CONTROL_COMMAND = [
    "admit",
    "control",
    "--gateway",
    "http://admit-gateway:8080",
    "--policy",
    "ledger:best",
    "--spec",
    "gateway",
    "--interval",
    "3s",
]


@pytest.mark.parametrize(("path", "replicas"), [("base", 2), ("overlays/dev", 1), ("overlays/gpu", 2)])
def test_gateway_deployment(path: str, replicas: int) -> None:
    gw = find(path, "Deployment", "admit-gateway")
    assert gw["spec"]["replicas"] == replicas
    pod = gw["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == GATEWAY_COMMAND
    assert c["image"] == "admit:latest"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": 8080}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and {"cpu", "memory"} <= set(c["resources"]["limits"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    # the generated ConfigMap (hash suffix and all) is what is mounted at /etc/admit
    cm = find(path, "ConfigMap", "admit-config")["metadata"]["name"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    (vol,) = [v for v in pod["volumes"] if v["name"] == mounts["/etc/admit"]]
    assert vol["configMap"]["name"] == cm
    svc = find(path, "Service", "admit-gateway")
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("http", 8080)]
    assert svc["spec"]["selector"].items() <= pod_labels(gw).items()


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("path", ["base", "overlays/dev", "overlays/gpu"])
def test_control_loop_is_a_single_writer(path: str) -> None:
    ctl = find(path, "Deployment", "admit-control")
    assert ctl["spec"]["replicas"] == 1
    assert ctl["spec"]["strategy"] == {"type": "Recreate"}  # never two loops, not even during a rollout
    (c,) = ctl["spec"]["template"]["spec"]["containers"]
    assert c["command"] == CONTROL_COMMAND
    assert [e["name"] for e in c["env"] if "valueFrom" in e] == ["ADMIT_ADMIN_TOKEN"]


@pytest.mark.parametrize("path", ["base", "overlays/dev", "overlays/gpu"])
def test_redis(path: str) -> None:
    sts = find(path, "StatefulSet", "redis")
    assert sts["spec"]["replicas"] == 1
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "redis:7"
    assert c["command"] == ["redis-server", "--appendonly", "yes"]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert {"mountPath": "/data", "name": claim["metadata"]["name"]} in c["volumeMounts"]
    svc = find(path, "Service", "redis")
    assert svc["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in svc["spec"]["ports"]] == [6379]


@pytest.mark.parametrize(
    ("path", "command"),
    [
        ("overlays/dev", ["admit", "emulate", "--host", "0.0.0.0", "--port", "8000"]),
        ("overlays/gpu", None),
    ],
)
def test_vllm_backend(path: str, command: list[str] | None) -> None:
    dep = find(path, "Deployment", "vllm")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    if command is not None:
        assert c["command"] == command
    else:
        assert c["image"] == "vllm/vllm-openai:v0.11.0"
        args = c["args"]
        assert args[args.index("--port") + 1] == "8000" and "--model" in args
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert dep["spec"]["template"]["spec"]["nodeSelector"] and dep["spec"]["template"]["spec"]["tolerations"]
    svc = find(path, "Service", "vllm")
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("http", 8000)]
    assert svc["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert svc["spec"]["selector"].items() <= pod_labels(dep).items()


def _secret_refs(path: str) -> list[tuple[str, str, str]]:
    """(workload, secret name, key) of every secretKeyRef and (workload, name, '*') of every secretRef."""
    refs = []
    for w in workloads(path):
        for c in containers(w):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.append((w["metadata"]["name"], ref["name"], ref["key"]))
            for src in c.get("envFrom", []):
                if "secretRef" in src:
                    refs.append((w["metadata"]["name"], src["secretRef"]["name"], "*"))
    return refs


@pytest.mark.parametrize("path", ["base", "overlays/dev", "overlays/gpu"])
def test_secret_references(path: str) -> None:
    refs = _secret_refs(path)
    assert {w for w, _, _ in refs} == {"admit-gateway", "admit-control"}
    secrets = [o for o in render(path) if o["kind"] == "Secret"]
    if path == "overlays/dev":  # generated here: every reference carries the generated name
        (secret,) = secrets
        assert secret["metadata"]["name"] != "admit-secrets"
        assert {name for _, name, _ in refs} == {secret["metadata"]["name"]}
        keys = set(secret["data"])
    else:  # created outside git under its plain name (deploy/base/secrets.example.env)
        assert secrets == []
        assert {name for _, name, _ in refs} == {"admit-secrets"}
        keys = set(_read_env_file(DEPLOY / "base/secrets.example.env"))
    assert {k for _, _, k in refs} <= keys
    # the example documents exactly the keys the dev overlay fills in
    assert set(_read_env_file(DEPLOY / "base/secrets.example.env")) == set(DEV_SECRETS)


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_no_secret_value_in_a_configmap(path: str) -> None:
    values = {v for raw in DEV_SECRETS.values() for v in [raw, *raw.split(",")] if v}
    for o in render(path):
        if o["kind"] == "ConfigMap":
            text = json.dumps(o)
            leaked = [v for v in values if v in text]
            assert not leaked, f"deploy/{path}: ConfigMap {o['metadata']['name']} holds secret values"


def test_dev_secrets_are_obviously_fake() -> None:
    assert "change-me" in DEV_SECRETS["admin-token"]
    assert all("-dev-" in k for name in ("chat-keys", "batch-keys") for k in DEV_SECRETS[name].split(","))
    assert secret_data("overlays/dev") == DEV_SECRETS


def test_tenants_yaml_loads_with_the_gateway_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    from admit.gateway.config import parse_config

    path = "overlays/dev"
    data = find(path, "ConfigMap", "admit-config")["data"]
    assert set(data) == {"tenants.yaml", "kueue.yaml"}
    assert data["tenants.yaml"] == (DEPLOY / "base/tenants.yaml").read_text()
    # the environment the gateway's container gets: its secretKeyRefs resolved against the dev Secret
    secret = secret_data(path)
    (c,) = find(path, "Deployment", "admit-gateway")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: secret[e["valueFrom"]["secretKeyRef"]["key"]] for e in c["env"] if "valueFrom" in e}
    assert {"ADMIT_ADMIN_TOKEN", "CHAT_KEYS", "BATCH_KEYS"} <= set(env)
    for name in ("ADMIT_ADMIN_TOKEN", "CHAT_KEYS", "BATCH_KEYS"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    raw = yaml.safe_load(data["tenants.yaml"])
    cfg = parse_config(raw, "deploy/base/tenants.yaml")
    names = [t.name for t in cfg.tenants]
    assert names == ["chat", "batch"]
    assert cfg.auth.mode == "api_key" and cfg.redis is not None and cfg.redis.url == "redis://redis:6379/0"
    assert cfg.admin.resolve() == secret["admin-token"]
    for t, tenant_raw in zip(cfg.tenants, raw["tenants"], strict=True):
        assert set(t.api_keys) == set(env[tenant_raw["api_keys_env"]].split(","))
    # each tenant has its LocalQueue of the same name, and the quotas agree with the starting limits
    queues = list(yaml.safe_load_all(data["kueue.yaml"]))
    local = {q["metadata"]["name"]: q["spec"]["clusterQueue"] for q in queues if q["kind"] == "LocalQueue"}
    assert sorted(local) == sorted(names)
    cqs = {q["metadata"]["name"]: q for q in queues if q["kind"] == "ClusterQueue"}
    for t in cfg.tenants:
        (quota,) = cqs[local[t.name]]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
        assert quota["nominalQuota"] == t.limit


# ----------------------------------------------------------------------------- Kueue
def test_the_gateway_loads_its_configmap_with_kueue(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What `admit gateway --config /etc/admit/tenants.yaml --kueue /etc/admit/kueue.yaml` loads in the pod."""
    from admit.gateway.kueue import load_with_kueue

    data = find("overlays/dev", "ConfigMap", "admit-config")["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    secret = secret_data("overlays/dev")
    for var, key in (("ADMIT_ADMIN_TOKEN", "admin-token"), ("CHAT_KEYS", "chat-keys"), ("BATCH_KEYS", "batch-keys")):
        monkeypatch.setenv(var, secret[key])
    cfg, bounds = load_with_kueue(tmp_path / "tenants.yaml", tmp_path / "kueue.yaml")
    got = {t.name: (t.limit, t.min_limit, t.max_limit, t.borrow) for t in cfg.tenants}
    assert got == {"chat": (8, 8, 8, 0), "batch": (4, 4, 4, 0)}  # the nominal quotas; no borrowing with redis
    assert cfg.capacity is None and cfg.redis is not None
    assert {q.tenant: (q.local_queue, q.cluster_queue, q.cohort) for q in bounds.tenants} == {
        "chat": ("llm/chat", "chat", "llm-serving"),
        "batch": ("llm/batch", "batch", "llm-serving"),
    }
    assert len(bounds.notes) == 2 and all("borrow 0" in n for n in bounds.notes)


def test_kueue_copy_is_byte_identical() -> None:
    assert (DEPLOY / "base/kueue.yaml").read_bytes() == (DEPLOY / "kueue/queues.yaml").read_bytes()


def test_kueue_resources() -> None:
    path = "kueue"
    for o in render(path):
        if o["kind"] in CRD_KINDS:
            assert o["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert find(path, "ResourceFlavor", "default-flavor")
    quotas = {"chat": (8, 8), "batch": (4, 12)}
    for name, (nominal, borrowing) in quotas.items():
        spec = find(path, "ClusterQueue", name)["spec"]
        assert spec["cohort"] == "llm-serving"
        (group,) = spec["resourceGroups"]
        assert group["coveredResources"] == ["admit.dev/concurrency"]
        (flavor,) = group["flavors"]
        assert flavor["name"] == "default-flavor"
        assert flavor["resources"] == [
            {"name": "admit.dev/concurrency", "nominalQuota": nominal, "borrowingLimit": borrowing}
        ]
        lq = find(path, "LocalQueue", name)
        assert lq["metadata"]["namespace"] == NAMESPACE
        assert lq["spec"] == {"clusterQueue": name}


# ----------------------------------------------------------------------------- KubeRay
def test_rayjob() -> None:
    job = find("ray", "RayJob", "admit-results")
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    assert spec["entrypoint"] == "admit results --ray auto --seeds 20 --out /tmp/RESULTS.md"
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    groups = [head, *cluster["workerGroupSpecs"]]
    assert len(groups) >= 2
    for g in groups:
        assert isinstance(g["rayStartParams"], dict)
        assert all(isinstance(v, str) for v in g["rayStartParams"].values())  # KubeRay wants strings
        (c,) = g["template"]["spec"]["containers"]
        assert c["image"] == "admit:latest"
    for w in cluster["workerGroupSpecs"]:
        assert w["groupName"] and w["minReplicas"] <= w["replicas"] <= w["maxReplicas"]
    # the Ray in the image is the one the ray extra pins
    pins = re.findall(r'"ray\[[^\]]*\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pins == [cluster["rayVersion"]]


# ----------------------------------------------------------------------------- monitoring
def test_service_monitors_select_the_services() -> None:
    services = {
        "admit-gateway": find("overlays/dev", "Service", "admit-gateway"),
        "vllm": find("overlays/dev", "Service", "vllm"),
    }
    for name, svc in services.items():
        sm = find("monitoring", "ServiceMonitor", name)
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        port_names = {p["name"] for p in svc["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in port_names and ep["path"] == "/metrics"
        assert [ep["port"] for ep in sm["spec"]["endpoints"]] == ["http"]


def test_dashboard_configmap() -> None:
    cm = find("monitoring", "ConfigMap", "admit-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["grafana-dashboard.json"] == (DEPLOY / "monitoring/grafana-dashboard.json").read_text()


def _gateway_metric_names() -> set[str]:
    """Every sample name a gateway with Redis exposes on /metrics: its own registry (gateway/metrics.py and
    what gateway/app.py adds to it) and the Redis backend's collector, each family expanded to its samples."""
    from admit.gateway.app import Gateway
    from admit.gateway.config import parse_config
    from admit.gateway.local_admission import LocalAdmission
    from admit.gateway.redis.admission import RedisAdmission
    from admit.gateway.redis.metrics import RedisCollector
    from prometheus_client.parser import text_string_to_metric_families

    async def families() -> str:
        cfg = parse_config({"auth": {"mode": "trusted_header"}, "tenants": [{"name": "chat"}]})
        gw = Gateway(cfg, "http://127.0.0.1:9")
        gw._admission = LocalAdmission(cfg.tenants)  # what startup() sets; the gauges read its snapshot
        shared = parse_config(
            {
                "auth": {"mode": "trusted_header"},
                "redis": {"url": "redis://127.0.0.1:9/0"},
                "tenants": [{"name": "chat"}],
            }
        )
        assert shared.redis is not None
        gw.metrics.registry.register(RedisCollector(RedisAdmission(shared.tenants, shared.redis)))  # not started
        return gw.metrics.render().decode()

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for fam in text_string_to_metric_families(asyncio.run(families())):
        names.update(fam.name + s for s in suffixes[fam.type])
    return names


def _vllm_metric_names() -> set[str]:
    """The vLLM metrics the gateway itself reads (gateway/telemetry.py), so certain to exist on vLLM's /metrics
    (tests/gateway/test_vllm_real.py reads them from a real vLLM engine)."""
    from admit.gateway import telemetry

    ttft = telemetry.TTFT
    return {
        telemetry.KV,
        telemetry.RUNNING,
        telemetry.WAITING,
        telemetry.PREEMPTIONS,
        ttft + "_bucket",
        ttft + "_sum",
        ttft + "_count",
    }


_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
}


def promql_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, label matchers, grouping and ranges left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?", e):
        if m.group(2) is None and m.group(1).lower() not in _PROMQL_WORDS:
            names.add(m.group(1))
    return names


def test_promql_metrics_helper() -> None:
    assert promql_metrics(
        'histogram_quantile(0.99, sum by (tenant, le) (rate(a_bucket{tenant=~"$t"}[$__rate_interval])))'
    ) == {"a_bucket"}
    assert promql_metrics("sum(vllm:num_requests_running) / on (x) b_total * 1e3") == {
        "vllm:num_requests_running",
        "b_total",
    }


def test_dashboard_queries_only_exported_metrics() -> None:
    dash = json.loads((DEPLOY / "monitoring/grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs and all(exprs)
    used = set().union(*map(promql_metrics, exprs))
    for var in dash["templating"]["list"]:  # label_values(metric, label) of the variables
        q = var.get("query")
        if isinstance(q, dict):
            used |= set(re.findall(r"label_values\(\s*([A-Za-z_:][\w:]*)", q["query"]))
    gateway, vllm = _gateway_metric_names(), _vllm_metric_names()
    unknown = sorted(used - gateway - vllm)
    assert not unknown, f"the dashboard queries metrics nobody exports: {unknown}"
    # what the brief of the dashboard promises is there
    for name in (
        "admit_gateway_requests_total",
        "admit_gateway_good_requests_total",
        "admit_gateway_limit",
        "admit_gateway_queue_depth",
        "admit_gateway_deferred_total",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ):
        assert name in used, name
    assert {p["id"] for p in dash["panels"]} == set(range(1, len(dash["panels"]) + 1))
