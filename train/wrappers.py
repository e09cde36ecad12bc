"""Gymnasium wrappers used for training: action encodings per algorithm and disjoint episode seeds.

``AlgoAction`` presents the env's MultiDiscrete action as Discrete (DQN) or Box (SAC), decoding with
admit.agents.action_codec so the deployed policy decodes exactly as training did.

``EpisodeSeeds`` fixes which workload every episode draws: episode j of this env uses seed
``base + stride·j``. Training envs use ``base = 1_000_000 + 1000·seed + env_index`` and
``stride = n_envs``, so no training episode ever sees an evaluation seed (``admit evaluate`` uses 0..19
by default) or a validation seed (the EvalCallback's, from 500_000). Seeds passed to ``reset`` from
outside (SB3 calls ``VecEnv.seed(seed)`` when the algorithm is seeded) are ignored: the schedule alone
decides, which is what makes the workload reproducible and disjoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from admit.agents.action_codec import ActionKind, action_space, to_env_action
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import Scenario
from admit.train.worlds import Paired, SetEnv, Worlds

TRAIN_SEED_BASE = 1_000_000
VALIDATION_SEED_BASE = 500_000


def train_episode_seed_base(seed: int, env_index: int) -> int:
    """First episode seed of training env ``env_index`` in a run seeded with ``seed``."""
    if not 0 <= env_index < 1000:
        raise ValueError(f"env_index must be in 0..999, got {env_index}")
    return TRAIN_SEED_BASE + 1000 * seed + env_index


class AlgoAction(gym.ActionWrapper):
    """Expose the env's MultiDiscrete([2k+1]*n) action as ``kind`` (see admit.agents.action_codec)."""

    def __init__(self, env: gym.Env, kind: ActionKind) -> None:
        super().__init__(env)
        inner = env.action_space
        if not isinstance(inner, gym.spaces.MultiDiscrete) or len(set(inner.nvec.tolist())) != 1:
            raise ValueError(f"AlgoAction wraps a MultiDiscrete([2k+1]*n) env, got {inner}")
        self.kind = kind
        self.n = len(inner.nvec)
        self.k = int(inner.nvec[0]) // 2
        self.action_space = action_space(kind, self.n, self.k)

    def action(self, action: Any) -> np.ndarray:
        return to_env_action(action, self.kind, self.n, self.k)


class EpisodeSeeds(gym.Wrapper):
    """Episode j uses workload seed ``base + stride·j``; ``restart()`` goes back to episode 0."""

    def __init__(self, env: gym.Env, base: int, stride: int = 1) -> None:
        super().__init__(env)
        if base < 0 or stride < 1:
            raise ValueError(f"EpisodeSeeds needs base >= 0 and stride >= 1, got {base}, {stride}")
        self.base = base
        self.stride = stride
        self.episode = 0

    def restart(self) -> None:
        self.episode = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        s = self.base + self.stride * self.episode
        self.episode += 1
        return self.env.reset(seed=s, options=options)


@dataclass(frozen=True)
class MakeEnv:
    """A picklable constructor of one training env: the env, ``AlgoAction`` unless ``kind`` is the env's own
    MultiDiscrete, then ``EpisodeSeeds(base, stride)``. Worker processes rebuild it without torch or SB3."""

    scenario: Scenario
    kind: ActionKind
    seed_base: int
    seed_stride: int = 1

    def __call__(self) -> gym.Env:
        env: gym.Env = TenantAdmissionEnv(self.scenario)
        if self.kind != "multidiscrete":
            env = AlgoAction(env, self.kind)
        return EpisodeSeeds(env, self.seed_base, self.seed_stride)


@dataclass(frozen=True)
class MakeSetEnv:
    """A picklable constructor of one tenant-set training env: ``SetEnv(worlds)`` then ``EpisodeSeeds``."""

    worlds: Worlds
    per_offered_load: bool
    seed_base: int
    seed_stride: int = 1
    factors: str = "narrow"
    paired: Paired | None = None
    contracted: bool = False

    def __call__(self) -> gym.Env:
        env = SetEnv(self.worlds, self.per_offered_load, factors=self.factors, paired=self.paired,
                     contracted=self.contracted)
        return EpisodeSeeds(env, self.seed_base, self.seed_stride)
