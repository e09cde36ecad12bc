import numpy as np
import pytest
from admit.loadgen.config import ConfigError, load_yaml, parse_tenant_flag
from admit.loadgen.lengths import parse_length


def test_tenant_flag_parses_every_kind_of_value():
    t = parse_tenant_flag(
        "name=a,rate=20,arrival=gamma,burstiness=0.5,prompt=uniform:10:20,output=64,api_key=sk-a,header=X-Team:blue"
    )
    assert (t.name, t.rate, t.arrival, t.burstiness, t.api_key) == ("a", 20.0, "gamma", 0.5, "sk-a")
    assert t.headers == {"X-Team": "blue"}
    assert t.prompt.kind == "uniform" and t.output.params == (64.0,)


@pytest.mark.parametrize(
    "flag, message",
    [
        ("name=a,rat=2", "unknown key 'rat'; allowed: api_key, arrival"),
        ("name=a,rate=fast", "rate: 'fast' is not valid"),
        ("name=a,prompt=zipf:3", "unknown distribution 'zipf'; allowed forms"),
        ("rate=3", "needs a 'name'"),
        ("name=a,rate", "is not key=value"),
        ("name=a,header=nocolon", "header must be Name:Value"),
    ],
)
def test_bad_tenant_flags_name_the_problem(flag, message):
    with pytest.raises(ConfigError, match=message):
        parse_tenant_flag(flag)


def test_yaml_file_with_tenants_slo_and_sweep(tmp_path):
    p = tmp_path / "load.yaml"
    p.write_text(
        "url: http://127.0.0.1:9\nduration: 5\ntenant_header: X-Tenant\nslo: {ttft_ms: 200}\n"
        "tenants:\n  - {name: a, rate: 10, output: 'lognormal:64:0.5:max=256'}\n"
        "  - {name: b, rate: 5, arrival: constant, extra: {temperature: 0}}\n"
        "sweep: {ladder: linear, start: 10, stop: 100, steps: 4}\n"
    )
    cfg = load_yaml(p).checked()
    assert [t.name for t in cfg.tenants] == ["a", "b"]
    assert cfg.slo == {"ttft_ms": 200.0} and cfg.tenants[1].extra == {"temperature": 0}
    assert cfg.sweep.rates() == [10.0, 40.0, 70.0, 100.0]
    draws = cfg.tenants[0].output.sample(np.random.default_rng(0), 1000)
    assert draws.max() <= 256 and draws.min() >= 1


@pytest.mark.parametrize(
    "body, message",
    [
        ("durration: 5\ntenants: [{name: a, rate: 1}]", "unknown key 'durration'"),
        (
            "tenants: [{name: a, rate: 1, arrival: bursty}]",
            "arrival: 'bursty' is not allowed; expected one of",
        ),
        ("tenants: [{name: a, rate: 1}, {name: a, rate: 2}]", "unique; repeated: a"),
        ("tenants: []", "no tenants"),
        (
            "api: grpc\ntenants: [{name: a, rate: 1}]",
            "api: 'grpc' is not allowed; expected one of completions, chat",
        ),
        ("slo: {ttft: 3}\ntenants: [{name: a, rate: 1}]", "slo.ttft"),
        ("sweep: {ladder: cubic}\ntenants: [{name: a, rate: 1}]", "sweep.ladder"),
        ("tenants: [{name: a, arrival: trace}]", "a CSV or JSONL path"),
        ("url: ftp://x\ntenants: [{name: a, rate: 1}]", "url must start with http"),
        ("workers: 1.5\ntenants: [{name: a, rate: 1}]", "expected an integer"),
        ("tenants: {name: a}", "tenants must be a list"),
    ],
)
def test_bad_yaml_names_key_and_allowed_values(tmp_path, body, message):
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    with pytest.raises(ConfigError, match=message):
        load_yaml(p).checked()


def test_length_forms():
    rng = np.random.default_rng(0)
    assert parse_length("7").sample(rng, 3).tolist() == [7, 7, 7]
    u = parse_length("uniform:2:4").sample(rng, 500)
    assert set(u.tolist()) == {2, 3, 4}
    ln = parse_length("lognormal:100:0.3").sample(rng, 20000)
    assert abs(np.median(ln) - 100) < 3
    with pytest.raises(ValueError, match="uniform needs 1 <= LO <= HI"):
        parse_length("uniform:5:2")


def test_tenant_slo_is_the_shared_shape(tmp_path):
    from admit.core.config import ConfigError as AnyConfigError
    from admit.loadgen.metrics import TenantMetrics
    from admit.loadgen.report import stage_summary
    from admit.loadgen.runner import StageResult

    p = tmp_path / "load.yaml"
    p.write_text("tenants:\n  - {name: a, rate: 10, slo: {e2e_p99_s: 12, ttft_p99_s: 2}}\n  - {name: b, rate: 5}\n")
    cfg = load_yaml(p).checked()
    assert cfg.tenants[0].slo.e2e_p99_s == 12 and cfg.tenants[1].slo.given() == {}
    r = StageResult(0, 15.0, 1.0, 0, 0, {"a": TenantMetrics(), "b": TenantMetrics()}, 0, 0, 1, 1, 0.0, 0, 0,
                    5.0, 0.99, per_tenant_slo={"a": cfg.tenants[0].slo.given()})
    tenants = stage_summary(r)["tenants"]
    assert tenants["a"]["slo"] == {"e2e_p99_s": 12.0, "ttft_p99_s": 2.0} and "slo" not in tenants["b"]
    p.write_text("tenants:\n  - {name: a, rate: 10, slo: {e2e_p99: 12}}\n")
    with pytest.raises(ConfigError, match=r"tenant 'a': slo\.e2e_p99: unknown key") as exc:
        load_yaml(p)
    assert isinstance(exc.value, AnyConfigError)
