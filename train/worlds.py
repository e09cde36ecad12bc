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
comes with its static:best caps (admit.agents.static_best.tuned_caps: tuned on the tuning seeds 900000..900004,
which no training episode uses), the env's vector carries them and its action is set_codec's anchored one.
Searching the caps of every instance of a 10,000-seed range is out of reach, so an anchored family run draws from a
``pool``: the first ``pool`` seeds of the split, searched once before training (`search_pool`, cached like any
static:best tuning). ``pool_caps`` are these training targets: static:best's own caps on its 5 tuning seeds, or
the same search on fewer of them, cached apart.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from admit.agents import set_codec
from admit.agents.static_best import TunedCaps, cache_dir, to_stderr, tuned_caps
from admit.core.observation import FEATURE_MAX
from admit.envs.env import TenantAdmissionEnv
from admit.envs.family import load_family, mean_rate, sample_scenario
from admit.envs.scenario import Scenario
from admit.train.static_search import SEARCH_SEEDS, fingerprint, format_seeds, search_static, write_store

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
    """One scenario, or the instances of ``family``'s ``split`` seed range (picklable, for worker processes).

    ``family`` may name several families (a tuple, or ``"a+b"``): an episode then draws one of them with equal
    probability and an instance of its range (its first ``pool`` seeds, with a pool) from the same stream."""

    scenario: Scenario | None = None
    family: str | tuple[str, ...] | None = None
    split: Split = "train"
    reward: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    anchored: bool = False
    pool: int | None = None
    search_seeds: int = 5  # anchored: the anchors' tuning seeds, the first k of static:best's 5 (`anchors_for`)

    def __post_init__(self) -> None:
        if not 1 <= self.search_seeds <= 5:
            raise ValueError(f"search_seeds must be 1..5 (the first k of static:best's tuning seeds), got "
                             f"{self.search_seeds}")
        if isinstance(self.family, str):
            object.__setattr__(self, "family", tuple(self.family.split("+")))
        if (self.scenario is None) == (self.family is None):
            raise ValueError("Worlds needs exactly one of scenario and family")
        if self.family is not None:
            if not self.family or len(set(self.family)) != len(self.family):
                raise ValueError(f"family: name each family once, got {'+'.join(self.family)!r}")
            for fam in self.family:
                rng = getattr(load_family(fam).seeds, self.split)  # a bad name fails here, naming the families
                if self.pool is not None and not 1 <= self.pool <= rng.last - rng.first + 1:
                    raise ValueError(f"pool must be 1..{rng.last - rng.first + 1} instances of {fam}'s "
                                     f"{self.split} seeds, got {self.pool}")
        elif self.pool is not None:
            raise ValueError("pool is for a family's instances, not one scenario")

    @property
    def families(self) -> tuple[str, ...]:
        fam = self.family
        return fam if isinstance(fam, tuple) else ()

    def family_seeds(self, family: str) -> range:
        """``family``'s instance seeds episodes draw from (the split's range, or its first ``pool`` seeds)."""
        rng = getattr(load_family(family).seeds, self.split)
        last = rng.last if self.pool is None else rng.first + self.pool - 1
        return range(rng.first, last + 1)

    def seeds(self) -> range:
        """The instance seeds of a one-family run (``family_seeds`` of it)."""
        if len(self.families) != 1:
            raise ValueError(f"seeds() is for one family; these worlds draw from {'+'.join(self.families)}")
        return self.family_seeds(self.families[0])

    def names(self) -> list[str]:
        """Every instance the episodes can draw, ``FAMILY@SEED``, family by family."""
        return [f"{fam}@{s}" for fam in self.families for s in self.family_seeds(fam)]

    def instance(self, seed: int, family: str | None = None) -> Scenario:
        return with_reward(_instance(family or self.families[0], seed), self.reward)

    def pick(self, episode_seed: int) -> Scenario:
        if self.scenario is not None:
            return with_reward(self.scenario, self.reward)
        rng = np.random.default_rng([episode_seed, 0x5E7])
        fams = self.families
        fam = fams[0] if len(fams) == 1 else fams[int(rng.integers(len(fams)))]
        seeds = self.family_seeds(fam)
        return self.instance(int(rng.integers(seeds.start, seeds.stop)), fam)

    def describe(self) -> str:
        if self.scenario is not None:
            return self.scenario.name
        parts = []
        for fam in self.families:
            seeds = self.family_seeds(fam)
            parts.append(f"{fam}@{seeds.start}-{seeds.stop - 1}")
        return f"{' + '.join(parts)} ({self.split})"


def pool_path(scenario: Scenario, seeds: Sequence[int]) -> Path:
    """Where `pool_caps` keeps a tuning on seeds other than `SEARCH_SEEDS`: pool_caps/ beside the cache's
    static_best/, so that no static:best lookup (which reads static_best/ only) ever finds it."""
    safe = re.sub(r"[^A-Za-z0-9._@-]+", "_", scenario.name) or "scenario"
    return cache_dir().parent / "pool_caps" / f"{safe}-{fingerprint(scenario)[:16]}-s{format_seeds(seeds)}.json"


def pool_caps(
    scenario: Scenario,
    seeds: Sequence[int] = SEARCH_SEEDS,
    *,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> TunedCaps:
    """Tuned caps used as *training targets* (imitation's expert). On `SEARCH_SEEDS` these are static:best's own
    (`tuned_caps`). On fewer seeds (``seeds`` must be a non-empty prefix of them) the search is the same but
    cheaper — 2 seeds instead of 5 and no ramp measurement (what that saves and what it costs in goodput:
    docs/training.md, "cheaper targets") — and the result is cached apart (`pool_path`), never deployed as
    static:best."""
    seeds = tuple(int(s) for s in seeds)
    if seeds == SEARCH_SEEDS:
        return tuned_caps(scenario, workers=workers, log=log)
    if not seeds or seeds != SEARCH_SEEDS[: len(seeds)]:
        raise ValueError(f"pool tuning seeds must be a non-empty prefix of {format_seeds(SEARCH_SEEDS)}, got "
                         f"{format_seeds(seeds) if seeds else 'none'}")
    key = (fingerprint(scenario), format_seeds(seeds), str(cache_dir()))
    if key in _POOL:
        return _POOL[key]
    path = pool_path(scenario, seeds)
    found = None
    if path.exists():
        try:
            found = TunedCaps.load(path)
        except ValueError as e:  # a damaged file is searched again and replaced, and said so
            (log or to_stderr)(f"pool caps: {e}; searching again")
    if found is None or found.fingerprint != fingerprint(scenario) or found.seeds != seeds:
        w = workers if workers is not None else int(os.environ.get("ADMIT_SEARCH_WORKERS", min(4, os.cpu_count() or 1)))
        result = search_static(scenario, seeds, w, measure_ramp=False)
        write_store(result.to_json(f"(pool caps, training targets) search_static on seeds {format_seeds(seeds)}, "
                                   "measure_ramp=False"), path)
        found = TunedCaps.load(path)
    _POOL[key] = found
    return found


_POOL: dict[tuple[str, str, str], TunedCaps] = {}


def anchors_for(scenario: Scenario, search_seeds: int = 5) -> list[int]:
    """static:best's caps for ``scenario`` (tuned now and cached when no store has them); with ``search_seeds``
    below 5, the same search on the first ``search_seeds`` of its seeds (`pool_caps`)."""
    import multiprocessing

    # an env in a vector env's worker (a daemonic process, which may not start a pool of its own) tunes an
    # instance nobody tuned before in this process; `search_pool` ahead of the envs avoids that
    workers = 1 if multiprocessing.current_process().daemon else None
    return list(pool_caps(scenario, SEARCH_SEEDS[:search_seeds], workers=workers).caps)


def search_pool(worlds: Worlds, workers: int, log: Any = None, search_seeds: int = 5) -> dict[str, list[int]]:
    """Search (or find) the caps for every instance ``worlds`` can draw (`anchors_for`), before the envs start,
    so worker processes find them in the cache instead of each searching the same instance."""
    seeds = SEARCH_SEEDS[:search_seeds]
    scenarios = ([worlds.scenario] if worlds.scenario is not None else
                 [worlds.instance(s, fam) for fam in worlds.families for s in worlds.family_seeds(fam)])
    if workers > 1 and len(scenarios) > 1:
        # one instance per process, each searching alone: a search's sweeps are a few candidates on two seeds,
        # so a pool of its own idles at every sweep's end (docs/training.md, "cheaper targets", has the timing);
        # each process writes its tuning to the cache, read back below
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_search_one, [(sc, seeds) for sc in scenarios]))
    return {sc.name: list(pool_caps(sc, seeds, workers=workers, log=log).caps) for sc in scenarios}


def _search_one(args: tuple[Scenario, tuple[int, ...]]) -> None:
    pool_caps(args[0], args[1], workers=1)


@dataclass(frozen=True)
class Paired:
    """The paired reward of an anchored run (module docstring): each episode also runs its anchors' static caps
    on the same requests, and the reward is what the policy's good completions add to theirs, with a tenant
    whose running total falls below the anchors' own costing ``1 + tenant_penalty`` per request it is short."""

    tenant_penalty: float = 4.0
    tolerance: float = 0.0  # a tenant may be short by this share of its arrivals so far before it costs more

    def __post_init__(self) -> None:
        if not 0 <= self.tenant_penalty <= 100:
            raise ValueError(f"tenant_penalty must be in [0, 100], got {self.tenant_penalty}")
        if not 0 <= self.tolerance <= 0.1:
            raise ValueError(f"tolerance must be in [0, 0.1], got {self.tolerance}")

    def potential(self, diff: np.ndarray, arrived: np.ndarray | None = None) -> float:
        """Φ of the tenants' running differences (policy's good requests − the anchors' good requests), each
        tenant's shortfall beyond ``tolerance`` × its arrivals so far (``arrived``) weighted ``tenant_penalty``
        more."""
        short = np.minimum(diff, 0.0) if arrived is None or self.tolerance == 0 else \
            np.minimum(diff + self.tolerance * arrived, 0.0)
        return float(diff.sum() + self.tenant_penalty * short.sum())


class SetEnv(gym.Env):
    """Episodes from ``worlds`` in the tenant-set encoding; see the module docstring."""

    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium convention)

    def __init__(self, worlds: Worlds, per_offered_load: bool = True, max_tenants: int = set_codec.MAX_TENANTS,
                 factors: str = "narrow", paired: Paired | None = None, contracted: bool = False) -> None:
        self.worlds = worlds
        self.contracted = contracted  # the vector carries each slot's contract features (set_codec)
        self.per_offered_load = per_offered_load
        self.max_tenants = max_tenants
        self.anchored = worlds.anchored
        self.factors = set_codec.factor_set(factors)
        if factors != "narrow" and not self.anchored:
            raise ValueError(f"factors {factors!r}: only an anchored policy acts with another choice set")
        if paired is not None and not self.anchored:
            raise ValueError("the paired reward compares the policy with its anchors: it needs anchored worlds")
        self.paired = paired
        self.observation_space = gym.spaces.Box(
            0.0, FEATURE_MAX, (set_codec.set_vector_size(max_tenants, self.anchored, contracted),), dtype=np.float32)
        self.anchors: list[int] | None = None
        self.action_space = gym.spaces.MultiDiscrete(np.full(max_tenants, len(self.factors), dtype=np.int64))
        self._twin_good = np.zeros((0, 0))  # the anchors' episode: each tenant's good requests after each decision
        self._twin_arrived = np.zeros((0, 0))  # ... and its arrivals (the same in both worlds)
        self._good = np.zeros(0)
        self._phi = self._total = 0.0
        self._decision = 0
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
        self.anchors = anchors_for(sc, self.worlds.search_seeds) if self.anchored else None
        if self.paired is not None:
            self._twin_good = self._anchor_episode(sc, seed)
            self._good = np.zeros(self.inner.n)
            self._phi, self._total, self._decision = 0.0, 0.0, 0
        # the episode's vector layout, checked once: set_vector of a zero observation is the template
        contracts = set_codec.contract_features(sc.control_spec()) if self.contracted else None
        self._template = set_codec.set_vector(np.zeros_like(flat), self.inner.n, self.limits, self.max_tenants,
                                              self.anchors, contracts)
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
            deltas = set_codec.anchored_delta_list(choices, inner.sim.limits, self.anchors, self.limits, self.factors)
        flat, reward, terminated, truncated, info = inner.step(np.array([d + k for d in deltas], dtype=np.int64))
        if self.paired is not None:
            reward = self._paired_reward(info)
        if self.scale != 1.0:
            reward *= self.scale
            info["reward_terms"] = {key: v * self.scale for key, v in info["reward_terms"].items()}
        info["world"] = inner.scenario.name
        return self._vec(flat), float(reward), terminated, truncated, info

    def _anchor_episode(self, sc: Scenario, seed: int) -> np.ndarray:
        """Each tenant's good requests so far after every decision of the anchors' own episode on this seed
        (static caps at the anchors, ramped from the initial limits as static:best is: one kernel call)."""
        from admit.controllers.static import StaticController
        from admit.envs.compiled import CompiledSimulation
        from admit.envs.kernels import T_ARRIVED, T_GOOD

        assert self.anchors is not None
        ctrl = StaticController(self.anchors)
        ctrl.reset(sc.control_spec(), seed)
        sim = self.inner.sim if self.inner is not None else None
        # the env's own world on this seed has the same requests: drawn once
        draw = sim.draw if isinstance(sim, CompiledSimulation) and sim.seed == seed else None
        record = CompiledSimulation(sc, seed, draw).run_recorded(ctrl)
        self._twin_arrived = record[:, :, T_ARRIVED].astype(np.float64)
        return record[:, :, T_GOOD].astype(np.float64)

    def _paired_reward(self, info: dict[str, Any]) -> float:
        """This decision's change of the paired potential (``Paired``), per second of the interval; the terms
        go to ``info["reward_terms"]`` (the plain reward's terms are replaced)."""
        from admit.envs.compiled import CompiledSimulation
        from admit.envs.kernels import T_GOOD

        assert self.paired is not None and self.inner is not None
        sim = self.inner.sim
        if type(sim) is not CompiledSimulation:
            raise TypeError("the paired reward needs the compiled world (TenantAdmissionEnv(world='compiled'))")
        self._good += sim.last_counts[:, T_GOOD]
        row = min(self._decision, len(self._twin_good) - 1)
        self._decision += 1
        diff = self._good - self._twin_good[row]
        phi, total = self.paired.potential(diff, self._twin_arrived[row]), float(diff.sum())
        dt = self.inner.scenario.interval_s
        reward = (phi - self._phi) / dt
        gained = (total - self._total) / dt
        info["reward_terms"] = {"paired_goodput": gained, "tenant_shortfall": reward - gained}
        self._phi, self._total = phi, total
        return reward
