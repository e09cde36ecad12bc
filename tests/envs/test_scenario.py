import pytest
from admit.envs.scenario import ScenarioError, bundled_scenarios, load_scenario, parse_scenario


def test_seed_paper_is_bundled_and_valid():
    assert "seed-paper" in bundled_scenarios()
    sc = load_scenario("seed-paper")
    assert sc.interval_s == 3 and sc.horizon_s == 1800
    assert sc.engine.kind == "slot" and sc.engine.mean_service_s == 2.5
    assert sc.admission.queue_timeout_s == 3


def test_unknown_scenario_lists_the_allowed_ones():
    with pytest.raises(ScenarioError, match="unknown scenario 'nope'.*seed-paper"):
        load_scenario("nope")


def _base():
    return load_scenario("seed-paper").model_dump()


def test_unknown_key_is_named():
    d = _base()
    d["tenants"][0]["colour"] = "red"
    with pytest.raises(ScenarioError, match=r"tenants\.0\.colour: unknown key"):
        parse_scenario(d)


def test_bad_value_is_named():
    d = _base()
    d["engine"]["slots"] = 0
    with pytest.raises(ScenarioError, match=r"engine\.slot\.slots: Input should be greater than or equal to 1"):
        parse_scenario(d)


def test_unknown_arrival_kind_lists_allowed_kinds():
    d = _base()
    d["tenants"][1]["arrival"] = {"kind": "weibull", "rate": 1}
    with pytest.raises(ScenarioError, match="poisson.*mmpp"):
        parse_scenario(d)


def test_limits_must_be_ordered():
    d = _base()
    d["limits"] = {"min": 5, "max": 4, "initial": 4, "max_step": 1}
    with pytest.raises(ScenarioError, match="min <= initial <= max"):
        parse_scenario(d)


def test_non_trace_tenant_needs_sizes_and_names_unique():
    d = _base()
    del d["tenants"][0]["prompt_tokens"]
    with pytest.raises(ScenarioError, match="prompt_tokens and output_tokens are required"):
        parse_scenario(d)
    d = _base()
    d["tenants"][1]["name"] = d["tenants"][0]["name"]
    with pytest.raises(ScenarioError, match="unique"):
        parse_scenario(d)


def test_yaml_file_path_and_bad_yaml(tmp_path):
    import yaml

    p = tmp_path / "mine.yaml"
    d = _base()
    d["name"] = "mine"
    p.write_text(yaml.safe_dump(d))
    assert load_scenario(str(p)).name == "mine"
    q = tmp_path / "broken.yaml"
    q.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(str(q))
