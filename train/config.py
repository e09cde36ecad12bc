"""Training configuration: a typed schema for ``admit train``, loaded from YAML and written back resolved.

Every key has a default, so an empty file is valid; the command line's ``--algo``, ``--scenario``,
``--timesteps``, ``--n-envs``, ``--seed``, ``--vec-env``, ``--vec-workers`` and ``--set KEY=VALUE`` (any key,
dotted for nested ones: ``--set hyperparams.batch_size=1024``) override the file. ``hyperparams`` holds the chosen
algorithm's constructor arguments and is checked against that algorithm's schema below (PPOParams, ...);
a bad key or value raises ``TrainConfigError`` naming the key and what is allowed. Example::

    algo: ppo
    scenario: seed-paper
    timesteps: 200000
    n_envs: 4
    seed: 0
    vec_env: dummy        # dummy | subproc | block (admit.train.vec: envs in blocks, trainer + vec_workers) |
                          # worlds (admit.envs.vector: every env in one kernel call; mlp policy, one scenario)
    vec_workers: 1
    update_threads: 2     # optional: torch threads for the PPO update (the rollout keeps torch_threads: 1)
    hyperparams: {n_steps: 512, batch_size: 256, n_epochs: 5, learning_rate: 0.0003}
    policy: {net_arch: [64, 64], activation: tanh}   # or {kind: tenant-set, hidden: 64, activation: relu}
    eval: {freq: 20000, episodes: 4}
    checkpoint_freq: 50000
    reward: {throughput: 0, goodput: 1, slo_violation: 0}   # optional: replaces the scenario's weights
    # family: h200-mix          # optional: train across a family (needs policy: {kind: tenant-set})
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from admit.core.config import ConfigError
from admit.core.schema import StrictModel
from pydantic import Field, ValidationError, model_validator

Algo = Literal["ppo", "a2c", "dqn", "sac"]
ALGOS: tuple[str, ...] = ("ppo", "a2c", "dqn", "sac")


class TrainConfigError(ConfigError):
    """A training configuration is invalid; the message names the key and what is allowed."""


# ------------------------------------------------------------------ per-algorithm hyperparameters
class PPOParams(StrictModel):
    learning_rate: float = Field(default=3e-4, gt=0)
    n_steps: int = Field(default=512, ge=2)
    batch_size: int = Field(default=256, ge=2)
    n_epochs: int = Field(default=5, ge=1)
    gamma: float = Field(default=0.99, gt=0, le=1)
    gae_lambda: float = Field(default=0.95, ge=0, le=1)
    clip_range: float = Field(default=0.2, gt=0)
    ent_coef: float = Field(default=0.0, ge=0)
    vf_coef: float = Field(default=0.5, ge=0)
    max_grad_norm: float = Field(default=0.5, gt=0)


class A2CParams(StrictModel):
    learning_rate: float = Field(default=7e-4, gt=0)
    n_steps: int = Field(default=5, ge=1)
    gamma: float = Field(default=0.99, gt=0, le=1)
    gae_lambda: float = Field(default=1.0, ge=0, le=1)
    ent_coef: float = Field(default=0.0, ge=0)
    vf_coef: float = Field(default=0.5, ge=0)
    max_grad_norm: float = Field(default=0.5, gt=0)


class DQNParams(StrictModel):
    learning_rate: float = Field(default=1e-4, gt=0)
    buffer_size: int = Field(default=100_000, ge=1)
    learning_starts: int = Field(default=1_000, ge=0)
    batch_size: int = Field(default=64, ge=1)
    gamma: float = Field(default=0.99, gt=0, le=1)
    train_freq: int = Field(default=4, ge=1)
    gradient_steps: int = Field(default=1, ge=1)
    target_update_interval: int = Field(default=1_000, ge=1)
    exploration_fraction: float = Field(default=0.2, gt=0, le=1)
    exploration_final_eps: float = Field(default=0.05, ge=0, le=1)


class SACParams(StrictModel):
    learning_rate: float = Field(default=3e-4, gt=0)
    buffer_size: int = Field(default=100_000, ge=1)
    learning_starts: int = Field(default=1_000, ge=0)
    batch_size: int = Field(default=128, ge=1)
    gamma: float = Field(default=0.99, gt=0, le=1)
    tau: float = Field(default=0.005, gt=0, le=1)
    train_freq: int = Field(default=1, ge=1)
    gradient_steps: int = Field(default=1, ge=1)


HYPERPARAMS: dict[str, type[StrictModel]] = {"ppo": PPOParams, "a2c": A2CParams, "dqn": DQNParams, "sac": SACParams}


# ------------------------------------------------------------------ the rest of the run
class PolicyConfig(StrictModel):
    """``kind: mlp`` is SB3's MlpPolicy on the flat observation (one tenant count); ``kind: tenant-set`` is
    admit.agents.set_policy (any 1..8 tenants; PPO or A2C; ``hidden`` wide; needed for ``family``)."""

    kind: Literal["mlp", "tenant-set"] = "mlp"
    net_arch: list[int] = Field(default=[64, 64], min_length=1)
    activation: Literal["tanh", "relu"] = Field(default="tanh", description="every hidden layer's, either kind")
    hidden: int = Field(default=64, ge=4, le=1024, description="tenant-set: width of every layer")
    anchor: Literal["none", "tuned"] = Field(
        default="none", description="tenant-set: act around static:best's tuned caps (set_codec, anchored)")
    hold_bias: float = Field(default=0.0, ge=0.0, le=10.0,
                             description="tenant-set: the initial logit of 'hold' above the other choices")
    anchor_factors: Literal["narrow", "wide"] = Field(
        default="narrow", description="tenant-set anchored: the choices around the anchor, narrow (×0.5 … ×2) or "
        "wide (×0.25 … ×8; admit.agents.set_codec)")
    contract_features: bool = Field(
        default=False, description="tenant-set: each slot also reads its tenant's contract (requests/s, burst, "
        "promised attainment; admit.agents.set_codec)")

    @model_validator(mode="after")
    def _positive(self) -> PolicyConfig:
        if any(w < 1 for w in self.net_arch):
            raise ValueError(f"net_arch layer widths must be >= 1, got {self.net_arch}")
        return self


class FamilyPool(StrictModel):
    """How many instances of each split an anchored family run draws from (the first seeds of the range)."""

    train: int = Field(ge=1, le=1000)
    validation: int = Field(ge=1, le=1000)
    search_seeds: int = Field(default=5, ge=1, le=5, description="anchored: the anchors' tuning seeds, the first k "
                              "of static:best's 5 (fewer is cheaper; below 5 they are cached apart, never deployed)")


class ImitationConfig(StrictModel):
    """DAgger on static:best's caps before (or instead of) PPO (admit.train.imitation; tenant-set, family_pool)."""

    rounds: int = Field(default=3, ge=1, le=50)
    episodes: int = Field(default=48, ge=1, description="round 0: episodes following the expert")
    noise: float = Field(default=0.3, ge=0.0, le=1.0, description="round 0: share of random choices")
    dagger_episodes: int = Field(default=24, ge=1, description="later rounds: episodes of the policy so far")
    dagger_noise: float = Field(default=0.1, ge=0.0, le=1.0, description="later rounds: share of random choices")
    epochs: int = Field(default=8, ge=1, le=1000, description="passes over all data after each round")
    learning_rate: float = Field(default=1e-3, gt=0)
    batch_size: int = Field(default=512, ge=1)
    search_seeds: int = Field(default=5, ge=1, le=5, description="the targets' tuning seeds: the first k of "
                              "static:best's 5 (fewer is cheaper; below 5 they are cached apart, never deployed)")


class PairedReward(StrictModel):
    """The anchored run's paired reward (admit.train.worlds.Paired): the policy's good requests less those of its
    anchors' static caps on the same requests, a tenant short of the anchors' count costing ``1 +
    tenant_penalty`` per request."""

    tenant_penalty: float = Field(default=4.0, ge=0.0, le=100.0)
    tolerance: float = Field(default=0.0, ge=0.0, le=0.1, description="a tenant's shortfall free of the penalty, "
                             "as a share of its arrivals so far (timing noise, not a loss)")


class NormalizeConfig(StrictModel):
    """VecNormalize: running mean/std of observations (kept with the policy) and of returns (training only)."""

    obs: bool = True
    reward: bool = True
    clip_obs: float = Field(default=10.0, gt=0)


class EvalConfig(StrictModel):
    """The EvalCallback: every ``freq`` env steps, ``episodes`` episodes on validation seeds."""

    freq: int = Field(default=20_000, ge=0, description="env steps between evaluations; 0 = off")
    episodes: int = Field(default=4, ge=1)
    seed_base: int = Field(default=500_000, ge=20)


class RewardOverride(StrictModel):
    """Reward weights that replace the scenario's own for this training (envs.scenario.RewardConfig; a key
    left out keeps the scenario's weight). ``{throughput: 0, goodput: 1, slo_violation: 0}`` trains on goodput,
    what ``admit evaluate`` judges by. ``{contract_miss: 4, goodput: 1, ...}`` is the contract-first reward: each
    in-contract request that is not good costs 4 (per tenant, times its tier's weight in ``contract_tiers``),
    each good request earns 1 (envs/env.py's Rewards; docs/training.md)."""

    throughput: float | None = None
    goodput: float | None = None
    slo_violation: float | None = None
    drop: float | None = None
    cost: float | None = None
    change: float | None = None
    tenant_weights: bool | None = None
    contract_miss: float | None = None
    contract_tiers: dict[Literal["interactive", "standard", "batch"], float] | None = Field(
        default=None, description="per SLO tier, an in-contract miss's weight (1 for a tier not named)")

    @model_validator(mode="after")
    def _tiers(self) -> RewardOverride:
        if self.contract_tiers and any(v < 0 for v in self.contract_tiers.values()):
            raise ValueError(f"contract_tiers: weights must be >= 0, got {self.contract_tiers}")
        return self

    def weights(self) -> dict[str, Any]:
        """The weights this override sets."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class TrainConfig(StrictModel):
    algo: Algo = "ppo"
    scenario: str = "seed-paper"
    timesteps: int = Field(default=100_000, ge=0, description="PPO env steps (0: imitation only)")
    n_envs: int = Field(default=4, ge=1, le=256)
    seed: int = Field(default=0, ge=0, le=1_000_000)
    vec_env: Literal["dummy", "subproc", "block", "worlds"] = "dummy"
    vec_workers: int = Field(
        default=1, ge=0, le=16, description="vec_env block: worker processes besides the trainer's own block"
    )
    torch_threads: int = Field(default=1, ge=1)
    update_threads: int | None = Field(
        default=None, ge=1, description="torch threads for the policy update (rollouts keep torch_threads): the "
        "block workers idle while the trainer updates, so 2 here uses both cores; null = torch_threads")
    hyperparams: dict[str, Any] = Field(default_factory=dict, description="checked against HYPERPARAMS[algo]")
    policy: PolicyConfig = PolicyConfig()
    normalize: NormalizeConfig = NormalizeConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint_freq: int = Field(default=50_000, ge=0, description="env steps between checkpoints; 0 = off")
    reward: RewardOverride | None = Field(default=None, description="reward weights replacing the scenario's")
    family: str | list[str] | None = Field(
        default=None, description="train on this family's train seeds (not `scenario`); a list: several families, "
        "an episode's family drawn with equal probability")
    paired_reward: PairedReward | None = Field(
        default=None, description="anchored: reward the policy's good requests against its anchors' own on the same "
        "requests (replaces the reward's weights)")
    reward_per_offered_load: bool = Field(
        default=False, description="tenant-set: divide the reward by the instance's offered requests/s"
    )
    imitation: ImitationConfig | None = Field(
        default=None, description="imitate static:best's caps first (tenant-set; a family needs family_pool)")
    family_pool: FamilyPool | None = Field(
        default=None, description="draw a family's episodes from the first N seeds of each split (anchored runs "
        "need it: every instance is tuned before training)")

    @model_validator(mode="after")
    def _set_policy(self) -> TrainConfig:
        if self.family is not None and self.policy.kind != "tenant-set":
            raise ValueError("family: a family's instances have 2..8 tenants; train them with policy.kind tenant-set")
        if self.policy.kind == "tenant-set" and self.algo not in ("ppo", "a2c"):
            raise ValueError(f"policy.kind tenant-set needs algo ppo or a2c, got {self.algo!r}")
        if self.policy.anchor != "none" and self.policy.kind != "tenant-set":
            raise ValueError("policy.anchor: only the tenant-set policy acts around anchors (policy.kind tenant-set)")
        if self.policy.contract_features and self.policy.kind != "tenant-set":
            raise ValueError("policy.contract_features: only the tenant-set policy reads them (policy.kind tenant-set)")
        if self.family_pool is not None and self.family is None:
            raise ValueError("family_pool: only for a family run (set family)")
        if self.timesteps == 0 and self.imitation is None:
            raise ValueError("timesteps: 0 trains nothing; it is allowed only after imitation")
        if self.imitation is not None:
            if self.policy.kind != "tenant-set" or self.policy.anchor != "none":
                raise ValueError("imitation: needs policy.kind tenant-set without an anchor (it learns the caps)")
            if self.family is not None and self.family_pool is None:
                raise ValueError("imitation on a family needs family_pool: {train: N, validation: M}, the "
                                 "instances whose static:best caps are imitated")
        if self.paired_reward is not None and self.policy.anchor != "tuned":
            raise ValueError("paired_reward compares the policy with its anchors: it needs policy.anchor tuned")
        if self.policy.anchor_factors != "narrow" and self.policy.anchor != "tuned":
            raise ValueError("policy.anchor_factors: only an anchored policy (policy.anchor tuned) has them")
        if isinstance(self.family, list) and (not self.family or len(set(self.family)) != len(self.family)):
            raise ValueError(f"family: name each family once, got {self.family}")
        if self.policy.anchor == "tuned" and self.family is not None and self.family_pool is None:
            raise ValueError("policy.anchor tuned on a family needs family_pool: {train: N, validation: M}, the "
                             "instances tuned before training (tuning all 10,000 is out of reach)")
        return self

    def algo_params(self) -> dict[str, Any]:
        """The algorithm's hyperparameters with defaults filled in."""
        return HYPERPARAMS[self.algo].model_validate(self.hyperparams).model_dump()

    def resolved(self) -> dict[str, Any]:
        """Everything, defaults included, as plain data (what ``config.yaml`` in the run folder holds)."""
        data = self.model_dump(mode="json")
        data["hyperparams"] = self.algo_params()
        return data


def _message(e: Mapping[str, Any]) -> str:  # a pydantic ErrorDetails
    if e["type"] == "extra_forbidden":
        return "unknown key"
    return str(e["msg"]).removeprefix("Value error, ")


def _allowed_keys(loc: tuple[Any, ...]) -> str:
    """The keys allowed next to an unknown key at ``loc`` (top level or one of the nested sections)."""
    sections: dict[tuple[Any, ...], type[StrictModel]] = {
        (): TrainConfig,
        ("policy",): PolicyConfig,
        ("normalize",): NormalizeConfig,
        ("eval",): EvalConfig,
        ("reward",): RewardOverride,
        ("paired_reward",): PairedReward,
    }
    model = sections.get(tuple(loc[:-1]))
    return f"; allowed: {', '.join(model.model_fields)}" if model is not None else ""


def _format_errors(err: ValidationError, prefix: tuple[str, ...] = ()) -> list[str]:
    lines = []
    for e in err.errors():
        msg = _message(e)
        if e["type"] == "extra_forbidden" and not prefix:
            msg += _allowed_keys(e["loc"])
        lines.append(f"  {'.'.join(str(x) for x in (*prefix, *e['loc'])) or '(top level)'}: {msg}")
    return lines


def _hyperparam_errors(cfg: TrainConfig) -> list[str]:
    schema = HYPERPARAMS[cfg.algo]
    allowed = ", ".join(schema.model_fields)
    try:
        schema.model_validate(cfg.hyperparams)
    except ValidationError as e:
        return [
            line + (f" for algo {cfg.algo!r}; allowed: {allowed}" if line.endswith("unknown key") else "")
            for line in _format_errors(e, ("hyperparams",))
        ]
    return []


def parse_config(data: object, origin: str = "<dict>") -> TrainConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TrainConfigError(f"training config {origin}: expected a mapping, got {type(data).__name__}")
    try:
        cfg = TrainConfig.model_validate(data)
    except ValidationError as e:
        raise TrainConfigError(f"training config {origin} is invalid:\n" + "\n".join(_format_errors(e))) from None
    errors = _hyperparam_errors(cfg)
    if errors:
        raise TrainConfigError(f"training config {origin} is invalid:\n" + "\n".join(errors))
    return cfg


def apply_sets(data: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    """Apply ``KEY=VALUE`` overrides (``--set``): KEY a dotted path such as ``hyperparams.batch_size``,
    VALUE parsed as YAML (``1024``, ``true``, ``[64, 64]``). Returns a new dict; the schema checks the result."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise TrainConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. hyperparams.batch_size=1024")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise TrainConfigError(f"--set {item!r}: the value is not valid YAML: {e}") from None
        *parents, last = key.strip().split(".")
        node = out
        for name in parents:
            child = node.get(name)
            if child is None:
                child = node[name] = {}
            elif not isinstance(child, dict):
                raise TrainConfigError(f"--set {item!r}: {name} is not a section")
            else:
                child = node[name] = dict(child)
            node = child
        node[last] = value
    return out


def load_config(path: str | Path | None = None, sets: list[str] | None = None, **overrides: Any) -> TrainConfig:
    """Read a YAML file (or start from defaults), apply the ``sets`` (``KEY=VALUE``, see ``apply_sets``), then
    the non-None ``overrides`` (top-level keys)."""
    data: Any = {}
    origin = "<defaults>"
    if path is not None:
        origin = str(path)
        p = Path(path)
        if not p.is_file():
            raise TrainConfigError(f"training config {origin}: no such file")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise TrainConfigError(f"training config {origin}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise TrainConfigError(f"training config {origin}: expected a mapping, got {type(data).__name__}")
    if sets:
        data = apply_sets(data, sets)
    data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    return parse_config(data, origin)


def write_config(cfg: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.resolved(), sort_keys=False))
