"""A trained stable-baselines3 policy as a Controller: ``--policy ppo:runs/NAME/`` (also a2c, dqn, sac).

The argument is a run folder written by ``admit train`` (``model.zip`` + ``vecnormalize.pkl``; a
``best/`` folder with ``best_model.zip`` works too), a path to a model zip with ``vecnormalize.pkl``
next to it, or the short name of a policy shipped in admit/agents/pretrained (``ppo:seed-paper`` is
``agents/pretrained/ppo-seed-paper``).

At every decision the Observation is turned into the env's exact observation vector
(``Observation.to_vector``) in the layout the policy was trained on, found from its input size and the
scenario's tenant count at ``reset``: layout 1 (``3 + 17·n``, the first shipped policies) or the current
one (core/observation.py); any other size is an error naming both. The vector is normalised with the
training run's VecNormalize statistics (frozen: the statistics are never updated here), and the policy
acts deterministically. Its action is decoded with admit.agents.action_codec — the same code the training
wrappers use — into integer deltas in ±max_step.
A tenant-set policy (``policy.kind: tenant-set``, admit.agents.set_policy) takes any scenario of 1..8 tenants
and any ``max_step``: its input is admit.agents.set_codec's padded vector and its action one multiplicative
choice per tenant, decoded by the same module. An anchored tenant-set policy (``policy.anchor: tuned``) acts
around static:best's caps for the scenario: ``reset`` takes them as ``anchors``, which the registry's wrapper
(controllers/around.py, around ``BestStatic`` as ``ledger:best`` is) hands it.
Loaded models are cached per process, so ``admit evaluate`` loads a run once, not once per seed.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from admit.agents import set_codec
from admit.agents.action_codec import kind_of, to_deltas
from admit.core.observation import LAYOUT_VERSION, LAYOUTS, Observation, layout_of
from admit.core.spec import ControlSpec, Limits
from stable_baselines3 import A2C, DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import VecNormalize

ALGORITHMS: dict[str, type[BaseAlgorithm]] = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "sac": SAC}
MODEL_FILES = ("model.zip", "best_model.zip")
VECNORMALIZE_FILE = "vecnormalize.pkl"

# Schedules are pickled closures in the zip; inference does not need them, and replacing them keeps the
# zip loadable across Python versions.
_CUSTOM_OBJECTS: dict[str, Any] = {
    "learning_rate": 0.0,
    "lr_schedule": lambda _: 0.0,
    "clip_range": lambda _: 0.0,
    "exploration_schedule": lambda _: 0.0,
}


def pretrained_dir() -> Path:
    return Path(str(resources.files("admit.agents").joinpath("pretrained")))


def pretrained_names(algo: str) -> list[str]:
    folder = pretrained_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name[len(algo) + 1 :] for p in folder.iterdir() if p.is_dir() and p.name.startswith(f"{algo}-"))


def resolve(algo: str, arg: str | None) -> tuple[Path, Path]:
    """The model zip and VecNormalize file for ``ALGO:ARG``; ValueError saying what is allowed."""
    shipped = pretrained_names(algo)
    usage = f"{algo}:RUN_DIR (written by 'admit train'), {algo}:PATH/model.zip" + (
        f", or a shipped policy: {', '.join(f'{algo}:{n}' for n in shipped)}" if shipped else ""
    )
    if not arg:
        raise ValueError(f"policy {algo!r} needs an argument: {usage}")
    path = Path(arg)
    if path.is_file() and path.suffix == ".zip":
        model, folder = path, path.parent
    else:
        if not path.is_dir():
            if arg not in shipped:
                raise ValueError(f"policy {algo}:{arg}: no such run folder or model; use {usage}")
            path = pretrained_dir() / f"{algo}-{arg}"
        model = next((path / m for m in MODEL_FILES if (path / m).is_file()), path / MODEL_FILES[0])
        folder = path
        if not model.is_file():
            raise ValueError(f"policy {algo}:{arg}: {path} holds no {' or '.join(MODEL_FILES)}; use {usage}")
    norm = folder / VECNORMALIZE_FILE
    if not norm.is_file():
        raise ValueError(f"policy {algo}:{arg}: {norm} is missing (admit train writes it next to the model)")
    _check_algo(algo, arg, folder)
    return model, norm


def _check_algo(algo: str, arg: str, folder: Path) -> None:
    """A run folder records its algorithm in config.yaml; refuse to load it as another one."""
    for cfg_path in (folder / "config.yaml", folder.parent / "config.yaml"):
        if cfg_path.is_file():
            trained = (yaml.safe_load(cfg_path.read_text()) or {}).get("algo")
            if trained is not None and trained != algo:
                raise ValueError(f"policy {algo}:{arg} was trained with {trained}; use --policy {trained}:{arg}")
            return


def _trained_max_step(folder: Path) -> int | None:
    for sc_path in (folder / "scenario.yaml", folder.parent / "scenario.yaml"):
        if sc_path.is_file():
            data = yaml.safe_load(sc_path.read_text()) or {}
            return int(data.get("limits", {}).get("max_step", 1))
    return None


@functools.lru_cache(maxsize=16)
def _load(algo: str, model_path: str, norm_path: str, _mtime_ns: int) -> tuple[BaseAlgorithm, VecNormalize]:
    torch.set_num_threads(1)
    model = ALGORITHMS[algo].load(model_path, device="cpu", custom_objects=_CUSTOM_OBJECTS)
    with open(norm_path, "rb") as f:
        norm = pickle.load(f)  # a VecNormalize without its env: only its statistics are used
    if not isinstance(norm, VecNormalize):
        raise ValueError(f"{norm_path} holds a {type(norm).__name__}, expected VecNormalize statistics")
    norm.training = False
    return model, norm


class SB3Policy:
    """A trained SB3 model acting deterministically on the Observation; see the module docstring."""

    def __init__(self, algo: str, arg: str | None) -> None:
        if algo not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algo!r}; allowed: {', '.join(ALGORITHMS)}")
        model_path, norm_path = resolve(algo, arg)
        self.name = f"{algo}:{arg}"
        self.model, self.norm = _load(algo, str(model_path), str(norm_path), model_path.stat().st_mtime_ns)
        self.kind = kind_of(self.model.action_space)
        shape = self.model.observation_space.shape
        assert shape is not None, "an SB3 policy's observation space has a shape"
        self.obs_size = int(shape[0])
        self.trained_k = _trained_max_step(model_path.parent)
        self.n = 0
        self.k = 0
        self.layout = LAYOUT_VERSION
        from admit.agents.set_policy import TenantSetPolicy

        self.tenant_set = isinstance(self.model.policy, TenantSetPolicy)
        self.anchored = bool(self.tenant_set and getattr(self.model.policy, "anchored", False))
        self.anchors: list[int] | None = None
        self.contracted = bool(self.tenant_set and getattr(self.model.policy, "contracted", False))
        self.contracts: np.ndarray | None = None  # the contract features of a policy that reads them (set_codec)
        self.limits = Limits()

    def reset(self, spec: ControlSpec, seed: int | None = None, anchors: Sequence[int] | None = None) -> None:
        """Start an episode; an anchored policy needs ``anchors``, the caps it acts around (one per tenant)."""
        n, k = spec.n_tenants, spec.limits.max_step
        if anchors is not None and not self.anchored:
            raise ValueError(f"policy {self.name} does not act around caps; it was given anchors {list(anchors)}")
        if self.tenant_set:  # any tenant count up to the policy's slots, any max_step (set_codec)
            policy: Any = self.model.policy
            set_codec.check_tenants(n, policy.set_max_tenants)
            self.n, self.k, self.limits = n, k, spec.limits
            self.contracts = set_codec.contract_features(spec) if self.contracted else None
            if self.anchored:
                if anchors is None:
                    raise ValueError(f"policy {self.name} acts around tuned caps and was given none (make it with "
                                     "admit.agents.registry.make_controller, which wraps it around static:best)")
                self.anchors = [int(c) for c in anchors]
                set_codec.check_anchors(self.anchors, n, spec.limits)
            return
        layout = layout_of(self.obs_size, n)
        if layout is None:
            fits = [((self.obs_size - len(g)) // len(t), v) for v, (g, t) in LAYOUTS.items()
                    if self.obs_size > len(g) and (self.obs_size - len(g)) % len(t) == 0]
            trained = " or ".join(f"{m} tenants" for m, _ in fits) or "no tenant count of a known layout"
            raise ValueError(
                f"policy {self.name} was trained on {trained}; this scenario has {n} (its input: {self.obs_size} "
                f"features, observation layout {' or '.join(str(v) for _, v in fits) or '?'}; layout "
                f"{LAYOUT_VERSION} for {n} tenants is {Observation.vector_size(n)})"
            )
        self.layout = layout
        if self.trained_k is not None and self.trained_k != k:
            raise ValueError(f"policy {self.name} was trained with max_step {self.trained_k}; this scenario has {k}")
        space: Any = self.model.action_space  # MultiDiscrete, Discrete or Box, as kind_of read it
        if self.kind == "multidiscrete":
            fits = space.nvec.tolist() == [2 * k + 1] * n
        elif self.kind == "discrete":
            fits = space.n == (2 * k + 1) ** n
        else:
            fits = space.shape == (n,)
        if not fits:
            raise ValueError(f"policy {self.name}'s action space {space} does not fit {n} tenants with max_step {k}")
        self.n, self.k = n, k

    def act(self, obs: Observation) -> list[int]:
        if self.tenant_set:
            policy: Any = self.model.policy
            vec = self.norm.normalize_obs(
                set_codec.observation_vector(obs, self.limits, policy.set_max_tenants, self.anchors,
                                             self.contracts)[None])
            choices, _ = self.model.predict(np.asarray(vec, dtype=np.float32), deterministic=True)
            current = [t.limit for t in obs.tenants]
            if self.anchors is not None:
                factors = set_codec.factor_set(getattr(policy, "set_factors", "narrow"))
                return set_codec.anchored_delta_list(choices[0], current, self.anchors, self.limits, factors)
            return set_codec.to_deltas(choices[0], current, self.limits)
        vec = self.norm.normalize_obs(obs.to_vector(self.layout)[None, :])
        action, _ = self.model.predict(np.asarray(vec, dtype=np.float32), deterministic=True)
        return to_deltas(action[0], self.kind, self.n, self.k)


def make_sb3_policy(algo: str, arg: str | None) -> SB3Policy:
    return SB3Policy(algo, arg)
