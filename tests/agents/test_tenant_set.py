"""The tenant-set encoding, policy and family training: one network for any tenant count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from admit.agents import set_codec
from admit.agents.registry import make_controller
from admit.agents.set_policy import SetExtractor, SlotCategorical, TenantSetPolicy
from admit.core.observation import Observation
from admit.core.spec import Limits
from admit.envs.family import sample_scenario
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import run_policy
from admit.train.config import TrainConfigError, load_config
from admit.train.worlds import SetEnv, Worlds, offered_rps
from gymnasium.utils.env_checker import check_env
from stable_baselines3 import PPO
from stable_baselines3.common.distributions import MultiCategoricalDistribution
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from typer.testing import CliRunner

from admit.cli import app

GOODPUT = {"throughput": 0.0, "goodput": 1.0, "slo_violation": 0.0, "drop": 1.0}


def test_set_vector_pads_slots_and_marks_them_in_the_mask() -> None:
    sc = load_scenario("h200-mixed")
    env_obs = Observation.from_vector(np.arange(Observation.vector_size(3), dtype=np.float32))
    vec = set_codec.observation_vector(env_obs, sc.control_spec().limits)
    m, g, t = set_codec.MAX_TENANTS, set_codec.N_GLOBAL, set_codec.N_TENANT
    assert vec.shape == (set_codec.set_vector_size(),) == (g + m * (t + 1),)
    flat = env_obs.to_vector()
    assert vec[:5].tolist() == flat[:5].tolist()
    assert vec[5:8].tolist() == [2.0, 256.0, 3.0]  # limits.min, limits.max, n
    assert vec[g : g + 3 * t].tolist() == flat[5:].tolist()
    assert not vec[g + 3 * t : g + m * t].any()  # padding slots are zero
    assert vec[g + m * t :].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"acts on 1\.\.8 tenants; this scenario has 9"):
        set_codec.set_vector(np.zeros(5 + 9 * t, dtype=np.float32), 9, Limits())
    with pytest.raises(ValueError, match="expected a layout-2 vector of 86 entries for 3 tenants"):
        set_codec.set_vector(flat[:-1], 3, Limits())


def test_choices_are_multiplicative_move_at_least_one_and_respect_max_step() -> None:
    lim = Limits(min=1, max=512, initial=64, max_step=16)
    hold, half, double = set_codec.HOLD, set_codec.FACTORS.index(0.5), set_codec.FACTORS.index(2.0)
    assert set_codec.to_deltas([half, double, hold], [8, 8, 8], lim) == [-4, 8, 0]
    assert set_codec.to_deltas([half, double], [400, 400], lim) == [-16, 16]  # clipped to ±max_step
    small = set_codec.FACTORS.index(1.1)
    assert set_codec.to_deltas([small, set_codec.FACTORS.index(0.9)], [2, 2], lim) == [1, -1]  # never stuck
    assert set_codec.to_deltas([double, half, 0, 0], [3, 3], lim) == [3, -1]  # 1.5 rounds to 2; padding ignored
    with pytest.raises(ValueError, match="choice 7 is out of range 0..6"):
        set_codec.to_deltas([7], [4], lim)


def _one_delta(choice: int, limit: float, k: int) -> int:
    """The codec's rule for one tenant, written out (module docstring of agents/set_codec.py)."""
    f = set_codec.FACTORS[choice]
    cur = round(limit)
    d = round(cur * f) - cur
    d = max(d, 1) if f > 1.0 else min(d, -1) if f < 1.0 else d
    return max(-k, min(k, d))


def test_delta_array_follows_the_rule_tenant_by_tenant() -> None:
    """Every choice on limits 1..600 and half-integral ones (where Python's round and numpy's rint must agree:
    half to even), for small and large max_step."""
    rng = np.random.default_rng(3)
    for k in (1, 4, 64):
        lim = Limits(min=1, max=1024, initial=4, max_step=k)
        for _ in range(200):
            n = int(rng.integers(1, 9))
            current = rng.integers(1, 600, n).astype(float)
            current[rng.random(n) < 0.3] += 0.5
            choices = rng.integers(0, len(set_codec.FACTORS), set_codec.MAX_TENANTS)
            got = set_codec.delta_array(choices, current, lim)
            assert got.dtype == np.int64
            assert got.tolist() == [_one_delta(int(c), x, k) for c, x in zip(choices[:n], current, strict=True)]


def _policy(env: SetEnv, hidden: int = 16) -> TenantSetPolicy:
    torch.manual_seed(0)
    model = PPO(TenantSetPolicy, env, n_steps=32, batch_size=32, device="cpu", policy_kwargs={"hidden": hidden})
    return model.policy  # type: ignore[return-value]


def test_policy_is_permutation_equivariant_and_ignores_padding() -> None:
    env = SetEnv(Worlds(scenario=load_scenario("h200-mixed")))
    policy = _policy(env)
    # nudge the head off its tiny initial gain so that the tenants' logits differ measurably
    with torch.no_grad():
        policy.action_net.out.weight.mul_(300.0)
    g, t, m = set_codec.N_GLOBAL, set_codec.N_TENANT, set_codec.MAX_TENANTS
    rng = np.random.default_rng(0)
    vec = np.zeros((1, set_codec.set_vector_size()), dtype=np.float32)
    vec[0, :g] = rng.uniform(0, 50, g)
    vec[0, g : g + 3 * t] = rng.uniform(0, 200, 3 * t)
    vec[0, g + m * t : g + m * t + 3] = 1.0
    perm = vec.copy()
    blocks = vec[0, g : g + 3 * t].reshape(3, t)
    perm[0, g : g + 3 * t] = blocks[[2, 0, 1]].reshape(-1)

    def logits(x: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            dist = policy.get_distribution(torch.as_tensor(x))
        return dist.logp[0]  # (m, choices), normalised

    a, b = logits(vec), logits(perm)
    assert not torch.allclose(a[0], a[1], atol=1e-4)  # tenants are told apart by their features
    assert torch.allclose(b[:3], a[[2, 0, 1]], atol=1e-5)  # permuting tenants permutes their choices
    # padding slots: "hold" with near certainty, whatever garbage sits in their features
    junk = vec.copy()
    junk[0, g + 3 * t : g + m * t] = 999.0
    c = logits(junk)
    assert torch.allclose(c[:3], a[:3], atol=1e-5)
    assert (c[3:].argmax(dim=1) == set_codec.HOLD).all() and (c[3:].exp()[:, set_codec.HOLD] > 0.999999).all()


def test_set_env_passes_the_gymnasium_and_sb3_checkers_and_draws_family_instances() -> None:
    env = SetEnv(Worlds(family="h200-mix", reward=GOODPUT))
    check_env(env, skip_render_check=True)
    sb3_check_env(env)
    worlds = set()
    for s in (1_000_000, 1_000_001, 1_000_002):
        _, info = env.reset(seed=s)
        worlds.add(info["world"])
        seed = int(info["world"].split("@")[1])
        assert 0 <= seed <= 9999  # the family's train range
        sc = sample_scenario("h200-mix", seed)
        assert env.scale == pytest.approx(1.0 / offered_rps(sc))
        total = 0.0
        for _ in range(20):
            _, reward, _, _, info = env.step(np.full(set_codec.MAX_TENANTS, set_codec.HOLD))
            terms = info["reward_terms"]
            assert reward == pytest.approx(sum(terms.values()))
            assert terms["throughput"] == 0.0 and terms["slo_violation"] == 0.0  # the reward override applies
            total += terms["goodput"]
        assert total > 0
    assert len(worlds) == 3
    # the same episode seed, the same instance and trajectory
    a, _ = env.reset(seed=1_000_001)
    b, _ = SetEnv(Worlds(family="h200-mix", reward=GOODPUT)).reset(seed=1_000_001)
    assert np.array_equal(a, b)
    val = SetEnv(Worlds(family="h200-mix", split="validation"))
    _, info = val.reset(seed=500_000)
    assert 10_000 <= int(info["world"].split("@")[1]) <= 10_999


def test_family_training_writes_a_policy_that_acts_on_any_tenant_count(tmp_path: Path) -> None:
    cfg = tmp_path / "set.yaml"
    cfg.write_text(yaml.safe_dump({
        "family": "h200-mix",
        "policy": {"kind": "tenant-set", "hidden": 8},
        "hyperparams": {"n_steps": 32, "batch_size": 32, "n_epochs": 1},
        "reward": GOODPUT,
        "reward_per_offered_load": True,
        "timesteps": 64,
        "n_envs": 2,
        "eval": {"freq": 64, "episodes": 1},
        "checkpoint_freq": 64,
    }))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(cfg), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    for f in ("model.zip", "vecnormalize.pkl", "config.yaml", "summary.json", "checkpoints", "tb", "best"):
        assert (out / f).exists(), f
    assert not (out / "scenario.yaml").exists()  # a family run is not bound to one scenario
    assert "h200-mix@0-9999 (train)" in (out / "summary.json").read_text()
    # one network, scenarios of 2, 3 and 8 tenants and max_step 1, 4 and 16
    for name, horizon in (("seed-paper", 60.0), ("h200-mixed", 40.0), ("servegen-skewed", 20.0)):
        sc = load_scenario(name, horizon_s=horizon)
        ep = run_policy(sc, f"ppo:{out}", seed=0)
        assert ep["completed"] > 0 and len(ep["tenants"]) == len(sc.tenants)
    controller = make_controller(f"ppo:{out}")
    spec = load_scenario("seed-paper").control_spec()
    controller.reset(spec, 0)
    obs = Observation.from_vector(np.ones(Observation.vector_size(2), dtype=np.float32) * 4)
    deltas = controller.act(obs)
    assert len(deltas) == 2 and all(abs(d) <= spec.limits.max_step for d in deltas)


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("family: h200-mix", "family: a family's instances have 2..8 tenants; train them with policy.kind tenant-set"),
        ("algo: dqn\npolicy: {kind: tenant-set}", "policy.kind tenant-set needs algo ppo or a2c, got 'dqn'"),
        ("policy: {kind: deepsets}", "policy.kind: Input should be 'mlp' or 'tenant-set'"),
        # the anchored policy (tests/agents/test_anchored.py) and imitation (tests/train/test_imitation.py)
        ("family: h200-mix\npolicy: {kind: tenant-set, anchor: tuned}",
         "policy.anchor tuned on a family needs family_pool"),
        ("family_pool: {train: 4, validation: 2}", "family_pool: only for a family run"),
        ("policy: {anchor: tuned}", "policy.anchor: only the tenant-set policy acts around anchors"),
        ("policy: {kind: tenant-set, anchor: best}", "policy.anchor: Input should be 'none' or 'tuned'"),
        ("timesteps: 0", "timesteps: 0 trains nothing; it is allowed only after imitation"),
        ("family: h200-mix\npolicy: {kind: tenant-set}\nimitation: {}", "imitation on a family needs family_pool"),
        ("imitation: {}", "imitation: needs policy.kind tenant-set without an anchor"),
        ("policy: {kind: tenant-set}\nimitation: {rounds: 0}", "imitation.rounds"),
        ("policy: {kind: tenant-set}\nimitation: {search_seeds: 6}",
         "imitation.search_seeds: Input should be less than or equal to 5"),
    ],
)
def test_tenant_set_config_errors_name_what_is_allowed(tmp_path: Path, yaml_text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(TrainConfigError) as err:
        load_config(path)
    assert needle in str(err.value)


def test_unknown_family_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--family", "no-such", "--set", "policy.kind=tenant-set",
                                      "--out", str(out)])
    assert result.exit_code == 2 and "unknown family 'no-such'" in result.output
    assert not out.exists()


@pytest.mark.parametrize("batch", [1, 16, 512])
def test_slot_categorical_computes_what_sb3s_multicategorical_does(batch: int) -> None:
    """The same samples from the same seed, the same log-probabilities, entropies, modes and gradients,
    value for value: the distribution changes how the numbers are computed, not which."""
    m, a = set_codec.MAX_TENANTS, len(set_codec.FACTORS)
    gen = torch.Generator().manual_seed(batch)
    logits = (3.0 * torch.randn(batch, m * a, generator=gen)).requires_grad_(True)
    ours, sb3 = SlotCategorical(m, a), MultiCategoricalDistribution([a] * m)
    drawn = []
    for dist in (ours, sb3):
        torch.manual_seed(7)
        dist.proba_distribution(logits)
        drawn.append(dist.sample())
    assert torch.equal(drawn[0], drawn[1]) and drawn[0].shape == (batch, m)
    assert len(set(drawn[0].flatten().tolist())) > 1
    acts = drawn[0]
    assert torch.equal(ours.log_prob(acts), sb3.log_prob(acts))
    assert torch.equal(ours.entropy(), sb3.entropy())
    assert torch.equal(ours.mode(), sb3.mode())
    grads = [torch.autograd.grad((d.log_prob(acts) * 1.7 - 0.01 * d.entropy()).sum(), logits)[0] for d in (ours, sb3)]
    assert torch.equal(grads[0], grads[1]) and grads[0].abs().sum() > 0


def _set_batch(batch: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = 5.0 * torch.rand(batch, set_codec.set_vector_size(), generator=gen)
    n = torch.randint(1, set_codec.MAX_TENANTS + 1, (batch, 1), generator=gen)
    x[:, -set_codec.MAX_TENANTS:] = (torch.arange(set_codec.MAX_TENANTS) < n).float()
    return x


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_psi_on_the_shared_context_once_is_the_concatenated_layer(activation: str) -> None:
    """ψ's first layer computed as W_e·e_i + (W_c·c + b) is the layer applied to [e_i, c], to float rounding."""
    torch.manual_seed(1)
    ext = SetExtractor(hidden=32, max_tenants=set_codec.MAX_TENANTS, activation=activation)
    x = _set_batch(64, 2)
    with torch.no_grad():
        got = ext.forward_actor(x)
        ctx, e, _, mask = ext._context(x)
        want = ext.psi(torch.cat([e, ctx.unsqueeze(1).expand(-1, ext.m, -1)], dim=-1))
    assert torch.allclose(got[:, : ext.m * ext.hidden], want.flatten(1), rtol=0, atol=2e-6)
    assert torch.equal(got[:, ext.m * ext.hidden :], mask)
    assert want.abs().max() > 0.05  # a real signal, not a layer of zeros


def test_activation_is_saved_with_the_model_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    env = SetEnv(Worlds(scenario=load_scenario("h200-mixed")))
    model = PPO(TenantSetPolicy, env, n_steps=32, batch_size=32, device="cpu",
                policy_kwargs={"hidden": 8, "activation": "relu"})
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", device="cpu")
    acts = {type(m).__name__ for m in loaded.policy.mlp_extractor.modules()}
    assert "ReLU" in acts and "Tanh" not in acts
    assert isinstance(_policy(env).mlp_extractor.psi[1], torch.nn.Tanh)  # the default, as models saved before
    with pytest.raises(ValueError, match=r"activation must be one of \['relu', 'tanh'\], got 'gelu'"):
        SetExtractor(hidden=8, max_tenants=2, activation="gelu")


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_a_row_without_tenants_pools_to_zero(activation: str) -> None:
    """The pool of no real tenant is zero, not the masked max's sentinel (which a ReLU critic would pass on)."""
    torch.manual_seed(0)
    ext = SetExtractor(hidden=16, max_tenants=set_codec.MAX_TENANTS, activation=activation)
    x = _set_batch(4, 3)
    x[1, -set_codec.MAX_TENANTS:] = 0.0
    with torch.no_grad():
        ctx, _, _, _ = ext._context(x)
        _, value_latent = ext(x)
    assert torch.equal(ctx[1], torch.zeros_like(ctx[1]))
    assert ctx[0].abs().sum() > 0 and torch.isfinite(value_latent).all()
