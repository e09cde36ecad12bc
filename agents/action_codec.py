"""How an RL algorithm's action maps to per-tenant limit deltas, for each action space an algorithm sees.

The env's own action is ``MultiDiscrete([2k+1] * n)``: entry ``a_i`` means delta ``a_i − k``. PPO and A2C
use it directly. DQN needs one ``Discrete`` action and SAC a continuous ``Box``, so training wraps the
env (admit.train.wrappers) and the deployed policy (admit.agents.sb3_policy) decodes with the same
functions here, so training and deployment cannot disagree:

- ``multidiscrete``: ``MultiDiscrete([2k+1]*n)``; delta_i = a_i − k.
- ``discrete``: ``Discrete((2k+1)**n)``; the index is the mixed-radix (C order) number of the
  MultiDiscrete vector, i.e. ``np.unravel_index(index, [2k+1]*n)``; (2k+1)**n actions, so this is for
  few tenants (3 tenants with k=4: 729 actions).
- ``box``: ``Box(-1, 1, (n,))``; delta_i = round(k · clip(a_i, −1, 1)) (round half to even, so ±0.5/k
  boundaries go to the even delta; the boundaries have measure zero for SAC's continuous actions).
"""

from __future__ import annotations

from typing import Literal

import gymnasium as gym
import numpy as np

ActionKind = Literal["multidiscrete", "discrete", "box"]

MAX_DISCRETE_ACTIONS = 100_000


def discrete_size(n_tenants: int, k: int) -> int:
    size = (2 * k + 1) ** n_tenants
    if size > MAX_DISCRETE_ACTIONS:
        raise ValueError(
            f"flattening {n_tenants} tenants × {2 * k + 1} deltas gives {size} discrete actions "
            f"(more than {MAX_DISCRETE_ACTIONS}); use ppo, a2c or sac for this scenario"
        )
    return size


def action_space(kind: ActionKind, n_tenants: int, k: int) -> gym.Space:
    """The action space an algorithm sees for ``kind``."""
    if kind == "multidiscrete":
        return gym.spaces.MultiDiscrete(np.full(n_tenants, 2 * k + 1, dtype=np.int64))
    if kind == "discrete":
        return gym.spaces.Discrete(discrete_size(n_tenants, k))
    if kind == "box":
        return gym.spaces.Box(-1.0, 1.0, shape=(n_tenants,), dtype=np.float32)
    raise ValueError(f"unknown action kind {kind!r}; allowed: multidiscrete, discrete, box")


def kind_of(space: gym.Space) -> ActionKind:
    """Which encoding an algorithm's action space uses."""
    if isinstance(space, gym.spaces.MultiDiscrete):
        return "multidiscrete"
    if isinstance(space, gym.spaces.Discrete):
        return "discrete"
    if isinstance(space, gym.spaces.Box):
        return "box"
    raise ValueError(f"unsupported action space {space}; expected MultiDiscrete, Discrete or Box")


def to_deltas(action: np.ndarray | int, kind: ActionKind, n_tenants: int, k: int) -> list[int]:
    """Decode one (unbatched) action of ``kind`` into n integer deltas in [−k, k]."""
    if kind == "multidiscrete":
        a = np.asarray(action, dtype=np.int64).reshape(n_tenants)
        return [int(x) - k for x in a]
    if kind == "discrete":
        index = int(np.asarray(action).reshape(()))
        digits = np.unravel_index(index, (2 * k + 1,) * n_tenants)
        return [int(x) - k for x in digits]
    if kind == "box":
        box = np.asarray(action, dtype=np.float64).reshape(n_tenants)
        return [int(x) for x in np.rint(k * np.clip(box, -1.0, 1.0))]
    raise ValueError(f"unknown action kind {kind!r}; allowed: multidiscrete, discrete, box")


def to_env_action(action: np.ndarray | int, kind: ActionKind, n_tenants: int, k: int) -> np.ndarray:
    """Decode one action of ``kind`` into the env's MultiDiscrete action (deltas + k)."""
    return np.asarray(to_deltas(action, kind, n_tenants, k), dtype=np.int64) + k
