"""``TenantAdmissionVectorEnv``: N compiled worlds stepped by one kernel call.

The env's ``vector_entry_point`` (``gymnasium.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point")``).
Each world is a ``CompiledSimulation`` with its own scenario and seed; one ``step`` sets every world's limits,
runs its interval, observes it and sums what its reward needs in ``kernels.vector_env_step``, one compiled
call for all N (the worlds cross into it as one typed List, so the per-world cost of a call, which is most of
a small world's step, is paid once). The rewards, the info and the resets use the single env's own functions
(envs/env.py ``reward_terms``, ``unresolved_misses``, ``step_info``), so world i's episodes are
bit-identical to those of a ``TenantAdmissionEnv`` seeded alike: the same observations, rewards, truncations and
info values (tests/envs/test_vector_env.py against ``SyncVectorEnv`` and against single envs).

* **Worlds of different sizes.** ``scenario`` is one scenario for every world or one per world. Every
  observation row is laid out for ``n_max`` tenants, the most any world has (``5 + 27·n_max``, layout 2): a
  world with fewer fills its first ``5 + 27·n`` entries and leaves the rest 0; its actions are read from the
  first ``n`` entries of its row (the rest ignored). ``n_tenants`` says how many each world has. All worlds
  must share ``limits.max_step`` (the action space's size).
* **Autoreset** is Gymnasium 1.x's ``NEXT_STEP`` (``metadata["autoreset_mode"]``): the step after a world's
  episode ends resets it (its action is ignored; reward 0, not terminated or truncated) and returns its first
  observation and reset info. A world's next episode seed is drawn from its own generator, as a single env's
  ``reset()`` without a seed draws it. ``reset(options={"reset_mask": mask})`` resets only the worlds masked.
* **Info** is Gymnasium's vector form: every key of the single env's info is an array with a row per world
  and a ``_key`` mask of the worlds it holds for; ``limits`` is an ``(N, n_max)`` int64 array (0 past a
  world's tenants), ``reward_terms`` and ``episode_metrics`` dicts of such arrays.
* SB3: ``admit.train.vec.WorldsVecEnv`` runs this env as an SB3 ``VecEnv`` (SB3's autoreset in the same step).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from admit.core.observation import FEATURE_MAX, LAYOUT_VERSION, Observation, vector_from_values
from admit.envs import kernels as K
from admit.envs.compiled import CompiledSimulation
from admit.envs.env import contract_weights, reward_terms, unresolved_misses
from admit.envs.scenario import Scenario, load_scenario
from admit.envs.simulation import END_EPS_S
from gymnasium.utils import seeding
from gymnasium.vector.utils import batch_space

try:  # Gymnasium >= 1.1 names the modes; 1.0 had only next-step
    from gymnasium.vector import AutoresetMode

    _NEXT_STEP: Any = AutoresetMode.NEXT_STEP
except ImportError:  # pragma: no cover
    _NEXT_STEP = "NextStep"

SEED_MAX = 2**31 - 1  # a single env's reset draws an episode seed below it (TenantAdmissionEnv.reset)
_REWARD_FIELDS = ("throughput", "goodput", "slo_violation", "drop", "cost", "change", "contract_miss")


class WorldsStep(NamedTuple):
    """What ``step_worlds`` gives: arrays with a row per world (rows of inactive worlds as they were, or 0)."""

    obs: np.ndarray  # (N, 5 + 27·n_max) float32: the env's own buffer, overwritten by the next step or reset
    terms: dict[str, np.ndarray]  # each reward term, float64
    reward: np.ndarray  # their sum, float64
    ended: np.ndarray  # bool: the episode ended (the horizon, or max_episode_steps)
    at_horizon: np.ndarray  # bool: it ended at the horizon (the info then has episode_metrics)
    contract_misses: np.ndarray  # float64: the info's contract_misses (unfinished ones added at the horizon)
    aggs: np.ndarray  # (N, kernels.NAGG): each world's env_step sums (kernels.G_*)
    limits: np.ndarray  # (N, n_max) int64: the limits set (0 past a world's tenants)


def _scenarios(scenario: str | Scenario | Sequence[str | Scenario], num_envs: int) -> list[Scenario]:
    if isinstance(scenario, (str, Scenario)):
        one = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        return [one] * num_envs
    items = list(scenario)
    if len(items) != num_envs:
        raise ValueError(f"scenario: {len(items)} scenarios given for num_envs={num_envs}; give one scenario or "
                         f"exactly one per world")
    cache: dict[str, Scenario] = {}
    return [s if isinstance(s, Scenario) else cache.setdefault(s, load_scenario(s)) for s in items]


class TenantAdmissionVectorEnv(gym.vector.VectorEnv):
    """N worlds of ``TenantAdmissionEnv`` (layout 2) stepped together; see the module docstring."""

    metadata = {"autoreset_mode": _NEXT_STEP, "render_modes": []}  # noqa: RUF012 (gymnasium convention)

    def __init__(self, num_envs: int = 1, scenario: str | Scenario | Sequence[str | Scenario] = "seed-paper",
                 layout: int = LAYOUT_VERSION, max_episode_steps: int | None = None,
                 render_mode: str | None = None) -> None:
        if not isinstance(num_envs, (int, np.integer)) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
        if layout != LAYOUT_VERSION:
            raise ValueError(f"the vector env has observation layout {LAYOUT_VERSION} only (the -v1 ids), got "
                             f"layout {layout!r}; run a -v0 id with vectorization_mode='sync'")
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported; allowed: None")
        if max_episode_steps is not None and (not isinstance(max_episode_steps, (int, np.integer))
                                              or max_episode_steps < 1):
            raise ValueError(f"max_episode_steps must be an integer >= 1 or None, got {max_episode_steps!r}")
        self.num_envs = int(num_envs)
        self.scenarios = _scenarios(scenario, self.num_envs)
        steps = sorted({sc.limits.max_step for sc in self.scenarios})
        if len(steps) > 1:
            raise ValueError(f"every world must share limits.max_step (the action space); these scenarios have "
                             f"{', '.join(map(str, steps))}")
        self.k = steps[0]
        self.max_episode_steps = None if max_episode_steps is None else int(max_episode_steps)
        self.n_tenants = np.array([len(sc.tenants) for sc in self.scenarios], dtype=np.int64)
        self.n_max = int(self.n_tenants.max())
        size = Observation.vector_size(self.n_max, LAYOUT_VERSION)
        self.single_observation_space = gym.spaces.Box(0.0, FEATURE_MAX, shape=(size,), dtype=np.float32)
        self.single_action_space = gym.spaces.MultiDiscrete(np.full(self.n_max, 2 * self.k + 1, dtype=np.int64))
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = None

        n = self.num_envs
        self._sims: list[CompiledSimulation | None] = [None] * n
        self._worlds: Any = None  # the kernel's typed List, built at the first reset
        self._first: list[Any] = [None] * n  # the worlds' states until then
        self._rngs: list[np.random.Generator | None] = [None] * n
        self._obs = np.zeros((n, size), dtype=np.float32)
        self._aggs = np.zeros((n, K.NAGG))
        self._limits = np.zeros((n, self.n_max), dtype=np.int64)
        self._active = np.ones(n, dtype=np.bool_)
        self._steps = np.zeros(n, dtype=np.int64)
        self._ended = np.zeros(n, dtype=np.bool_)  # the last step ended the world's episode: reset it next
        self._ever_reset = False
        self._set_reward_arrays()

    def _set_reward_arrays(self) -> None:
        """The per-world constants the reward takes, as arrays over the worlds (``reward_terms`` with arrays)."""
        scs = self.scenarios
        self._rw = SimpleNamespace(**{f: np.array([getattr(sc.reward, f) for sc in scs]) for f in _REWARD_FIELDS})
        self._dt = np.array([sc.interval_s for sc in scs])
        self._cost_scale = np.array([len(sc.tenants) * sc.limits.max for sc in scs], dtype=np.int64)
        self._horizon = np.array([sc.horizon_s for sc in scs])
        self._weights = [np.array([tc.weight if sc.reward.tenant_weights else 1.0 for tc in sc.tenants])
                         for sc in scs]
        self._cweights = [contract_weights(sc) for sc in scs]
        self.has_contracts = np.array([sc.has_contracts for sc in scs], dtype=np.bool_)

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None)
        name = spec.id if spec is not None else ", ".join(dict.fromkeys(sc.name for sc in self.scenarios))
        return f"{type(self).__name__}({name}, num_envs={self.num_envs})"

    # ------------------------------------------------------------------ worlds
    def set_scenario(self, i: int, scenario: str | Scenario) -> None:
        """World i runs ``scenario`` from its next reset on (same ``max_step``, at most ``n_max`` tenants)."""
        sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if sc.limits.max_step != self.k or len(sc.tenants) > self.n_max:
            raise ValueError(f"world {i}: scenario {sc.name!r} has max_step {sc.limits.max_step} and "
                             f"{len(sc.tenants)} tenants; this env takes max_step {self.k} and at most "
                             f"{self.n_max} tenants")
        self.scenarios[i] = sc
        self.n_tenants[i] = len(sc.tenants)
        self._set_reward_arrays()

    def reset_world(self, i: int, seed: int | None) -> dict[str, Any]:
        """World i's ``TenantAdmissionEnv.reset(seed=seed)``: its observation into row i; returns its info."""
        if seed is not None:
            self._rngs[i], _ = seeding.np_random(int(seed))
            episode_seed = int(seed)
        else:
            if self._rngs[i] is None:
                self._rngs[i], _ = seeding.np_random()
            rng = self._rngs[i]
            assert rng is not None
            episode_seed = int(rng.integers(0, SEED_MAX))
        sc = self.scenarios[i]
        sim = CompiledSimulation(sc, episode_seed)
        self._sims[i] = sim
        state = sim.vector_state(self._weights[i], self._cweights[i], self.k)
        if self._worlds is None:
            self._first[i] = state
        else:
            K.vector_set(self._worlds, i, state)
        vec = vector_from_values(sim.observe_values())
        self._obs[i, :vec.shape[0]] = vec
        self._obs[i, vec.shape[0]:] = 0.0
        self._steps[i] = 0
        self._ended[i] = False
        return {"episode_seed": episode_seed, "limits": sim.limits, "time_s": 0.0}

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"seed: {len(seeds)} seeds given for {self.num_envs} worlds; give an int, None, or "
                             f"one per world")
        return [None if s is None else int(s) for s in seeds]

    # ------------------------------------------------------------------ Gymnasium API
    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        seeds = self._seeds(seed)
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = np.asarray(options["reset_mask"])
            if mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
                raise ValueError(f"options['reset_mask'] must be a bool array of shape ({self.num_envs},), got "
                                 f"{mask.dtype} {mask.shape}")
            if not self._ever_reset and not mask.all():
                raise ValueError("the first reset must reset every world (options['reset_mask'] all True)")
        infos: dict[str, Any] = {}
        for i in np.flatnonzero(mask).tolist():
            self._add(infos, i, self.reset_world(i, seeds[i]))
        if self._worlds is None:  # the first reset reset every world
            self._worlds = K.vector_worlds(self._first[0])
            for state in self._first[1:]:
                K.vector_append(self._worlds, state)
            self._first = []
        self._ever_reset = True
        return self._obs.copy(), infos

    def check_actions(self, actions: Any) -> np.ndarray:
        """``actions`` as the kernel takes them (int64, C order), or a ValueError saying what is allowed."""
        shape = (self.num_envs, self.n_max)
        top = 2 * self.k
        allowed = (f"an integer array of shape {shape} with values in 0..{top} (delta = value − {self.k}; entries "
                   f"past a world's tenants are ignored)")
        a = actions
        if not (type(a) is np.ndarray and a.dtype == np.int64):
            a = np.asarray(a)
            if a.shape != shape:
                raise ValueError(f"actions have shape {a.shape}; expected {allowed}")
            if not np.issubdtype(a.dtype, np.integer) and (
                    a.dtype.kind not in "fb" or not np.all(np.isfinite(a)) or not np.all(a == np.round(a))):
                raise ValueError(f"actions are not integral; expected {allowed}")
            a = a.astype(np.int64)
        elif a.shape != shape:
            raise ValueError(f"actions have shape {a.shape}; expected {allowed}")
        used = np.arange(self.n_max)[None, :] < self.n_tenants[:, None]
        if (a[used] < 0).any() or (a[used] > top).any():
            bad = np.argwhere(used & ((a < 0) | (a > top)))[0]
            raise ValueError(f"actions[{bad[0]}, {bad[1]}] = {a[bad[0], bad[1]]} is out of range; expected {allowed}")
        return np.ascontiguousarray(a)

    def step_worlds(self, actions: np.ndarray, active: np.ndarray) -> WorldsStep:
        """One interval of every world in ``active`` (the others left as they are; their reward 0), in one kernel
        call, with no autoreset: ``step`` and admit.train.vec.WorldsVecEnv each reset the ended worlds their
        way. ``actions`` as ``check_actions`` returns them."""
        if self._worlds is None:
            raise RuntimeError("call reset() before step()")
        self._active[:] = active
        K.vector_env_step(self._worlds, actions, self._obs, self._aggs, self._limits, self._active)
        g = self._aggs
        misses, weighted = g[:, K.G_CMISS].copy(), g[:, K.G_W_CMISS].copy()
        done = active & (g[:, K.G_NOW] >= self._horizon - END_EPS_S)
        for i in np.flatnonzero(done & self.has_contracts).tolist():
            sim = self._sims[i]
            assert sim is not None
            misses[i], weighted[i] = unresolved_misses(sim, self._cweights[i], float(misses[i]), float(weighted[i]))
        terms = reward_terms(self._rw, self._dt, self._cost_scale,
                             (g[:, K.G_W_COMPLETED], g[:, K.G_W_GOOD], g[:, K.G_W_VIOL], g[:, K.G_W_LOST]),
                             g[:, K.G_LIMIT_SUM], g[:, K.G_CHANGE], weighted)
        reward = np.zeros(self.num_envs)
        for v in terms.values():
            reward = reward + v
        reward[~active] = 0.0
        self._steps[active] += 1
        ended = done.copy()
        if self.max_episode_steps is not None:
            ended |= active & (self._steps >= self.max_episode_steps)
        return WorldsStep(self._obs, terms, reward, ended, done, misses, self._aggs, self._limits)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        a = self.check_actions(actions)
        resetting = self._ended.copy()
        r = self.step_worlds(a, ~resetting)
        infos: dict[str, Any] = {}
        stepped = ~resetting
        if stepped.any():
            self._add_step_infos(infos, stepped, r.terms, r.contract_misses, r.at_horizon)
        for i in np.flatnonzero(resetting).tolist():
            self._add(infos, i, self.reset_world(i, None))
        self._ended = r.ended
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        return r.obs.copy(), r.reward, terminated, r.ended.copy(), infos

    # ------------------------------------------------------------------ infos
    def _add_step_infos(self, infos: dict[str, Any], stepped: np.ndarray, terms: dict[str, np.ndarray],
                        misses: np.ndarray, done: np.ndarray) -> None:
        """The step's info of the worlds ``stepped`` (a bool mask; the others' rows are 0), in vector form."""
        idle = ~stepped
        some_idle = bool(idle.any())
        g = self._aggs
        values = {"time_s": g[:, K.G_NOW].copy(), "completions": g[:, K.G_COMPLETED].astype(np.int64),
                  "drops": g[:, K.G_LOST].astype(np.int64), "slo_violations": g[:, K.G_VIOL].astype(np.int64),
                  "p99_s": g[:, K.G_P99].copy(), "limits": self._limits.copy()}
        rt: dict[str, Any] = {}
        for key, v in terms.items():
            if some_idle:
                v[idle] = 0.0
            rt[key], rt[f"_{key}"] = v, stepped.copy()
        infos["reward_terms"], infos["_reward_terms"] = rt, stepped.copy()
        for key, v in values.items():
            if some_idle:
                v[idle] = 0
            infos[key], infos[f"_{key}"] = v, stepped.copy()
        cm = stepped & self.has_contracts
        if cm.any():
            infos["contract_misses"], infos["_contract_misses"] = np.where(cm, misses, 0.0), cm
        for i in np.flatnonzero(done).tolist():
            self._add(infos, i, {"episode_metrics": self.world(i).summary()})

    def _add(self, infos: dict[str, Any], i: int, info: dict[str, Any]) -> None:
        """Gymnasium's vector info form: ``info``'s values into row i of an array per key (and its ``_key``)."""
        n = self.num_envs
        for key, value in info.items():
            if isinstance(value, dict):
                self._add(infos.setdefault(key, {}), i, value)
            elif key == "limits":
                rows = infos.get(key)
                if rows is None:
                    rows = infos[key] = np.zeros((n, self.n_max), dtype=np.int64)
                rows[i, :len(value)] = value
                rows[i, len(value):] = 0
            else:
                column = infos.get(key)
                if column is None:
                    dtype = np.int64 if isinstance(value, (int, np.integer)) else np.float64
                    column = infos[key] = np.zeros(n, dtype=dtype)
                column[i] = value
            m = infos.get(f"_{key}")
            if m is None:
                m = infos[f"_{key}"] = np.zeros(n, dtype=np.bool_)
            m[i] = True

    # ------------------------------------------------------------------ the worlds, read
    def world(self, i: int) -> CompiledSimulation:
        """World i's simulation (after a reset)."""
        sim = self._sims[i]
        if sim is None:
            raise RuntimeError("call reset() first")
        return sim

    @property
    def obs(self) -> np.ndarray:
        """The last observations (the env's buffer: copy what you keep)."""
        return self._obs

    def close_extras(self, **kwargs: Any) -> None:
        self._worlds = None
        self._sims = [None] * self.num_envs


def make_vector_env(num_envs: int = 1, **kwargs: Any) -> TenantAdmissionVectorEnv:
    """The env's ``vector_entry_point``: what ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``
    calls with the id's kwargs (``scenario``, ``layout``, ``max_episode_steps``)."""
    return TenantAdmissionVectorEnv(num_envs=num_envs, **kwargs)
