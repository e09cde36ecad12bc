"""Training across worlds: an env whose every episode may be a different scenario, in the tenant-set encoding.

``Worlds`` says where episodes come from: one scenario, or a family's seed range (envs/family.py: train on
``train``, validate on ``validation``, report on ``test``). ``SetEnv`` presents them all through one
observation and action space (admit.agents.set_codec), so one policy can learn on 2..8 tenants at once.

Episode ``s`` (the seed ``reset`` gets; admit.train.wrappers.EpisodeSeeds keeps those disjoint from the
evaluation and validation seeds) draws its instance seed uniformly from the range with
``numpy.random.default_rng([s, 0x5E7])`` and runs that instance's workload seed ``s``: reproducible, and
independent of the order the vector envs happen to reset in.

The reward is the instance's own reward (the scenario's weights, or the training config's ``reward:``
block), divided by the instance's offered load in requests/s when ``per_offered_load`` is set: a goodput
reward then reads as the fraction of arriving requests served within their objectives, on the same scale
for an instance of 5 req/s and one of 80 req/s. Every term of ``info["reward_terms"]`` is scaled alike, and
``info["world"]`` names the instance.

**Anchored** (``Worlds(anchored=True)``, the config's ``policy.anchor: tuned``): each episode's instance
comes with its static:best caps (admit.evaluate.tune.tuned_caps: tuned on the tuning seeds 900000..900004,
which no training episode uses), the env's vector carries them and its action is set_codec's anchored one.
Tuning every instance of a 10,000-seed range is out of reach, so an anchored family run draws from a
``pool``: the first ``pool`` seeds of the split, tuned once before training (`tune_pool`, cached like any
static:best tuning).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from admit.agents import set_codec
from admit.core.observation import FEATURE_MAX
from admit.envs.env import TenantAdmissionEnv
from admit.envs.family import load_family, mean_rate, sample_scenario
from admit.envs.scenario import Scenario

Split = Literal["train", "validation", "test"]


@lru_cache(maxsize=512)
def _instance(family: str, seed: int) -> Scenario:
    return sample_scenario(family, seed)


def with_reward(scenario: Scenario, weights: dict[str, Any] | None) -> Scenario:
    """``scenario`` with the reward weights ``weights`` (those it names) in place of its own."""
    if not weights:
        return scenario
    return scenario.model_copy(update={"reward": scenario.reward.model_copy(update=weights)})


def offered_rps(scenario: Scenario) -> float:
    """Mean arriving requests/s over the horizon, all tenants (envs.family.mean_rate)."""
    return float(sum(mean_rate(t.arrival, scenario.horizon_s) for t in scenario.tenants))


@dataclass(frozen=True)
class Worlds:
    """One scenario, or the instances of ``family``'s ``split`` seed range (picklable, for worker processes)."""

    scenario: Scenario | None = None
    family: str | None = None
    split: Split = "train"
    reward: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    anchored: bool = False
    pool: int | None = None

    def __post_init__(self) -> None:
        if (self.scenario is None) == (self.family is None):
            raise ValueError("Worlds needs exactly one of scenario and family")
        if self.family is not None:
            rng = getattr(load_family(self.family).seeds, self.split)  # a bad name fails here, naming the families
            if self.pool is not None and not 1 <= self.pool <= rng.last - rng.first + 1:
                raise ValueError(f"pool must be 1..{rng.last - rng.first + 1} instances of {self.family}'s "
                                 f"{self.split} seeds, got {self.pool}")
        elif self.pool is not None:
            raise ValueError("pool is for a family's instances, not one scenario")

    def seeds(self) -> range:
        """The instance seeds episodes draw from (the split's range, or its first ``pool`` seeds)."""
        rng = getattr(load_family(self.family or "").seeds, self.split)
        last = rng.last if self.pool is None else rng.first + self.pool - 1
        return range(rng.first, last + 1)

    def instance(self, seed: int) -> Scenario:
        return with_reward(_instance(self.family or "", seed), self.reward)

    def pick(self, episode_seed: int) -> Scenario:
        if self.scenario is not None:
            return with_reward(self.scenario, self.reward)
        seeds = self.seeds()
        s = int(np.random.default_rng([episode_seed, 0x5E7]).integers(seeds.start, seeds.stop))
        return self.instance(s)

    def describe(self) -> str:
        if self.scenario is not None:
            return self.scenario.name
        seeds = self.seeds()
        return f"{self.family}@{seeds.start}-{seeds.stop - 1} ({self.split})"


def anchors_for(scenario: Scenario, tune_seeds: int = 5) -> list[int]:
    """static:best's caps for ``scenario`` (tuned now and cached when no store has them); with ``tune_seeds``
    below 5, the same search on the first ``tune_seeds`` of its seeds (admit.evaluate.tune.pool_caps)."""
    from admit.evaluate.tune import TUNING_SEEDS, pool_caps  # imported on use: the anchored runs only

    return list(pool_caps(scenario, TUNING_SEEDS[:tune_seeds]).caps)


def tune_pool(worlds: Worlds, workers: int, log: Any = None, tune_seeds: int = 5) -> dict[str, list[int]]:
    """Tune (or find) the caps for every instance ``worlds`` can draw (`anchors_for`), before the envs start,
    so worker processes find them in the cache instead of each tuning the same instance."""
    from admit.evaluate.tune import TUNING_SEEDS, pool_caps

    seeds = TUNING_SEEDS[:tune_seeds]
    scenarios = [worlds.scenario] if worlds.scenario is not None else [worlds.instance(s) for s in worlds.seeds()]
    return {sc.name: list(pool_caps(sc, seeds, workers=workers, log=log).caps) for sc in scenarios}


class SetEnv(gym.Env):
    """Episodes from ``worlds`` in the tenant-set encoding; see the module docstring."""

    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium convention)

    def __init__(self, worlds: Worlds, per_offered_load: bool = True, max_tenants: int = set_codec.MAX_TENANTS) -> None:
        self.worlds = worlds
        self.per_offered_load = per_offered_load
        self.max_tenants = max_tenants
        self.anchored = worlds.anchored
        self.observation_space = gym.spaces.Box(
            0.0, FEATURE_MAX, (set_codec.set_vector_size(max_tenants, self.anchored),), dtype=np.float32)
        self.anchors: list[int] | None = None
        self.action_space = gym.spaces.MultiDiscrete(np.full(max_tenants, len(set_codec.FACTORS), dtype=np.int64))
        self._envs: OrderedDict[str, TenantAdmissionEnv] = OrderedDict()  # a few built worlds, reused
        self.inner: TenantAdmissionEnv | None = None
        self.scale = 1.0

    def _env_for(self, sc: Scenario) -> TenantAdmissionEnv:
        key = sc.name
        env = self._envs.pop(key, None)
        if env is None:
            set_codec.check_tenants(len(sc.tenants), self.max_tenants)
            env = TenantAdmissionEnv(sc)
        self._envs[key] = env
        while len(self._envs) > 8:
            self._envs.popitem(last=False)
        return env

    def _vec(self, flat: np.ndarray) -> np.ndarray:
        """``set_codec.set_vector(flat, n, limits)``, from the episode's template (bounds, n and mask already
        in place): two slice copies instead of the checks and zero-fill at every step."""
        out = self._template.copy()
        g = self._g
        out[:g] = flat[:g]
        out[set_codec.N_GLOBAL : set_codec.N_GLOBAL + len(flat) - g] = flat[g:]
        return out

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31))
        sc = self.worlds.pick(seed)
        if self.inner is not None:
            self.inner.sim = None  # its finished episode's world (arrays the size of the episode's requests) goes
        self.inner = self._env_for(sc)
        self.limits = sc.control_spec().limits
        self.scale = 1.0 / max(offered_rps(sc), 1e-9) if self.per_offered_load else 1.0
        flat, info = self.inner.reset(seed=seed)
        self.anchors = anchors_for(sc) if self.anchored else None
        # the episode's vector layout, checked once: set_vector of a zero observation is the template
        self._template = set_codec.set_vector(np.zeros_like(flat), self.inner.n, self.limits, self.max_tenants,
                                              self.anchors)
        self._g = len(flat) - self.inner.n * set_codec.N_TENANT
        info["world"] = sc.name
        return self._vec(flat), info

    def step(self, action: Any):
        inner = self.inner
        if inner is None or inner.sim is None:
            raise RuntimeError("call reset() before step()")
        k = self.limits.max_step
        choices = np.asarray(action).reshape(-1)
        if self.anchors is None:
            deltas = set_codec.delta_list(choices, inner.sim.limits, self.limits)
        else:
            deltas = set_codec.anchored_delta_list(choices, inner.sim.limits, self.anchors, self.limits)
        flat, reward, terminated, truncated, info = inner.step(np.array([d + k for d in deltas], dtype=np.int64))
        if self.scale != 1.0:
            reward *= self.scale
            info["reward_terms"] = {key: v * self.scale for key, v in info["reward_terms"].items()}
        info["world"] = inner.scenario.name
        return self._vec(flat), float(reward), terminated, truncated, info
