"""The tenant-set policy's contract features: each slot reads its tenant's contract, in training and deployed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from admit.agents import set_codec
from admit.agents.registry import make_controller
from admit.agents.set_policy import TenantSetPolicy
from admit.core.contract import MEAN_TOKENS
from admit.core.spec import Limits
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import run_policy
from admit.train.worlds import SetEnv, Worlds
from gymnasium.utils.env_checker import check_env
from stable_baselines3 import PPO
from typer.testing import CliRunner

from admit.cli import app
from tests.contract_helpers import with_contracts

LIMITS = Limits(min=1, max=512, initial=64, max_step=16)


def test_contract_features_are_each_tenants_contract_in_requests_and_zero_without_one() -> None:
    sc = with_contracts("h200-mixed", {"chat": {"requests_per_s": 2.0, "burst": 10, "attainment": 0.95},
                                       "batch": {"tokens_per_s": 4000.0, "burst": 8000, "attainment": 0.9}})
    names = [t.name for t in sc.tenants]
    feats = set_codec.contract_features(sc.control_spec())
    assert feats.shape == (len(names), set_codec.N_CONTRACT)
    assert list(feats[names.index("chat")]) == pytest.approx([2.0, 10.0, 0.95])
    assert list(feats[names.index("batch")]) == pytest.approx([4000.0 / MEAN_TOKENS, 8000.0 / MEAN_TOKENS, 0.9])
    others = [i for i, n in enumerate(names) if n not in ("chat", "batch")]
    assert others and not feats[others].any()


@pytest.mark.parametrize("anchors", [None, [4, 9]])
def test_contract_features_sit_after_the_mask_and_anchors_and_the_size_names_the_layout(
        anchors: list[int] | None) -> None:
    flat = np.zeros(5 + 2 * set_codec.N_TENANT, dtype=np.float32)
    feats = np.array([[2.0, 10.0, 0.95], [0.0, 0.0, 0.0]], dtype=np.float32)
    vec = set_codec.set_vector(flat, 2, LIMITS, anchors=anchors, contracts=feats)
    m, c = set_codec.MAX_TENANTS, set_codec.N_CONTRACT
    assert vec.shape == (set_codec.set_vector_size(anchored=anchors is not None, contracted=True),)
    assert list(vec[-m * c :][: 2 * c]) == pytest.approx([2.0, 10.0, 0.95, 0, 0, 0])
    assert not vec[-m * c + 2 * c :].any()  # padding slots carry no contract
    if anchors is not None:
        assert list(vec[-m * c - m :][:3]) == [4, 9, 0]
    assert set_codec.set_layout_of(vec.size) == (anchors is not None, True)
    with pytest.raises(ValueError, match=r"contract features must be 2 rows of 3 \(contract_rps, contract_burst"):
        set_codec.set_vector(flat, 2, LIMITS, contracts=feats[:1])
    with pytest.raises(ValueError, match="with contract features"):
        set_codec.set_layout_of(vec.size + 1)


def test_the_network_reads_the_contract_features() -> None:
    """Two tenants identical but for their contracts get different choices: the features reach φ."""
    sc = with_contracts("h200-mixed", {"chat": {"requests_per_s": 2.0, "burst": 10, "attainment": 0.95}})
    env = SetEnv(Worlds(scenario=sc), contracted=True)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    assert obs.shape == env.observation_space.shape == (set_codec.set_vector_size(contracted=True),)
    torch.manual_seed(0)
    policy = PPO(TenantSetPolicy, env, n_steps=32, batch_size=32, device="cpu", policy_kwargs={"hidden": 16}).policy
    assert policy.contracted and not policy.anchored
    with torch.no_grad():
        policy.action_net.out.weight.mul_(300.0)
    g, t, m, c = set_codec.N_GLOBAL, set_codec.N_TENANT, set_codec.MAX_TENANTS, set_codec.N_CONTRACT
    vec = np.zeros((1, obs.size), dtype=np.float32)
    vec[0, g : g + 2 * t] = np.tile(np.arange(1, t + 1, dtype=np.float32), 2)  # two identical tenants
    vec[0, g + m * t : g + m * t + 2] = 1.0
    same = vec.copy()
    vec[0, -m * c : -m * c + c] = (2.0, 10.0, 0.95)  # only the first has a contract

    def logits(x: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            return policy.get_distribution(torch.as_tensor(x)).logp[0]

    a, b = logits(same), logits(vec)
    assert torch.allclose(a[0], a[1], atol=1e-6)
    assert not torch.allclose(b[0], b[1], atol=1e-4)


def test_a_policy_trained_with_contract_features_deploys_reading_the_contracts_of_the_spec(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "family": "h200-drift",
        "policy": {"kind": "tenant-set", "hidden": 8, "contract_features": True},
        "hyperparams": {"n_steps": 32, "batch_size": 32, "n_epochs": 1},
        "reward": {"throughput": 0, "goodput": 1, "slo_violation": 0, "drop": 0, "contract_miss": 4},
        "timesteps": 64,
        "n_envs": 2,
        "eval": {"freq": 0},
        "checkpoint_freq": 0,
    }))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(cfg), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    sc = load_scenario("h200-drift@11000", horizon_s=30.0)
    controller = make_controller(f"ppo:{out}", sc)
    controller.reset(sc.control_spec(), 0)
    assert controller.contracted  # type: ignore[attr-defined]
    np.testing.assert_array_equal(controller.contracts,  # type: ignore[attr-defined]
                                  set_codec.contract_features(sc.control_spec()))
    ep = run_policy(sc, f"ppo:{out}", seed=0)  # it acts on the contract-carrying vector it was trained on
    assert ep["completed"] > 0 and "contracts_met" in ep


def test_contract_features_need_the_tenant_set_policy(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("policy: {contract_features: true}")
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code != 0
    assert "policy.contract_features: only the tenant-set policy reads them" in result.output
