"""TenantAdmission-v1: per-tenant admission concurrency in front of a simulated multi-tenant LLM server.

``TenantAdmissionEnv``'s class docstring is the env's documentation, in Gymnasium's sections (``help(env)``
shows it; its examples run as doctests under pytest). ``FEATURES`` gives every observation feature its unit
and range; the docstring's Observation Space table is ``observation_table()``'s output, checked by a test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from admit.core.observation import (
    FEATURE_MAX,
    GLOBAL_FEATURES,
    LAYOUT_VERSION,
    LAYOUTS,
    NO_SLO,
    TENANT_FEATURES,
    Observation,
    vector_from_values,
)
from admit.envs import kernels as K
from admit.envs.compiled import WORLDS, CompiledSimulation, World, make_simulation
from admit.envs.scenario import Scenario, load_scenario
from admit.envs.simulation import decision_count

_E2E_P99 = TENANT_FEATURES.index("e2e_p99")


def _num(x: float) -> str:
    return f"{x:.0e}".replace("e+0", "e")  # 1e6, 1e4: how the docs write FEATURE_MAX and NO_SLO


_MAX = _num(FEATURE_MAX)

# feature -> (unit, min, max) of the values it takes, for the class docstring's table; the layout itself
# (order, names) is admit.core.observation's, the units are those of its module docstring. "window": the
# scenario's telemetry window (window_s); percentiles are over the completions in it.
FEATURES: dict[str, tuple[str, str, str]] = {
    "gpu_mem_util": ("fraction of slots / KV cache in use", "0", "1"),
    "engine_running": ("requests running in the engine", "0", _MAX),
    "engine_waiting": ("requests waiting inside the engine", "0", _MAX),
    "prefill_tokens_waiting": ("tokens: Σ over tenants of prefill_tokens", "0", _MAX),
    "preemptions": ("engine preemptions in the window", "0", _MAX),
    "queue_depth": ("requests in tenant i's admission queue", "0", _MAX),
    "in_flight": ("tenant i's requests admitted, not finished", "0", _MAX),
    "limit": ("requests: tenant i's concurrency limit", "limits.min", "limits.max"),
    "arrivals": ("requests arrived in the window", "0", _MAX),
    "completions": ("requests completed in the window", "0", _MAX),
    "drops": ("queue-timeout drops in the window", "0", _MAX),
    "rejections": ("queue-full rejections in the window", "0", _MAX),
    "e2e_p50": ("s, arrival → last token", "0", _MAX),
    "e2e_p95": ("s, arrival → last token", "0", _MAX),
    "e2e_p99": ("s, arrival → last token", "0", _MAX),
    "ttft_p50": ("s, arrival → first token", "0", _MAX),
    "ttft_p95": ("s, arrival → first token", "0", _MAX),
    "ttft_p99": ("s, arrival → first token", "0", _MAX),
    "samples": ("completions behind the percentiles", "0", _MAX),
    "queue_wait_p99": ("s waited in the admission queue", "0", _MAX),
    "slo_e2e_p99": (f"s, the e2e p99 objective ({_num(NO_SLO)} = none)", "> 0", _MAX),
    "slo_ttft_p99": (f"s, the TTFT p99 objective ({_num(NO_SLO)} = none)", "> 0", _MAX),
    "output_tokens_per_s": ("tokens/s of the window's completions", "0", _MAX),
    "tpot_p50": ("s per output token after the first", "0", _MAX),
    "tpot_p99": ("s per output token after the first", "0", _MAX),
    "goodput": ("good completions/s in the window", "0", _MAX),
    "slo_ttft": (f"s, per-request TTFT objective ({_num(NO_SLO)} = none)", "> 0", _MAX),
    "slo_tpot": (f"s, per-request TPOT objective ({_num(NO_SLO)} = none)", "> 0", _MAX),
    "slo_e2e": (f"s, per-request e2e objective ({_num(NO_SLO)} = none)", "> 0", _MAX),
    "prompt_tokens_queued": ("tokens: prompts in tenant i's queue", "0", _MAX),
    "prefill_tokens": ("tokens: prompts with no first token yet", "0", _MAX),
    "tokens_in_flight": ("tokens held: prompt + generated, unfinished", "0", _MAX),
}


def observation_table() -> str:
    """The Num / Feature / Unit / Min / Max table of the observation vector, from the layout and ``FEATURES``.

    Raises KeyError naming a feature of the layout that ``FEATURES`` does not describe.
    """
    n_global, per = len(GLOBAL_FEATURES), len(TENANT_FEATURES)
    rows = [(str(j), name) for j, name in enumerate(GLOBAL_FEATURES)]
    rows += [(f"{n_global} + {per}·i + {j}", name) for j, name in enumerate(TENANT_FEATURES)]
    missing = [name for _, name in rows if name not in FEATURES]
    if missing:
        raise KeyError(f"observation features without a unit and range in envs/env.py FEATURES: {missing}")
    table = [("Num", "Feature", "Unit", "Min", "Max"), *((num, f"`{name}`", *FEATURES[name]) for num, name in rows)]
    widths = [max(len(r[c]) for r in table) for c in range(5)]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) + " |" for r in table]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def reward_terms(w: Any, dt: Any, cost_scale: Any, counted: Sequence[Any], limit_sum: Any, changed: Any,
                 contract_misses: Any = 0.0) -> dict[str, Any]:
    """The reward's terms from an interval's (weighted) completions, good completions, violations and lost
    requests (``counted``, in that order), the limits' sum, the sum of their absolute changes and the (weighted)
    contract misses; ``w`` has ``RewardConfig``'s weights, ``dt`` is the interval and ``cost_scale`` tenants ×
    ``limits.max``. Plain floats for one env; for envs/vector.py's worlds each argument may be an array with a
    value per world (the same arithmetic in the same order, so the same numbers)."""
    return {
        "throughput": w.throughput * counted[0] / dt,
        "goodput": w.goodput * counted[1] / dt,
        "slo_violation": -w.slo_violation * counted[2] / dt,
        "drop": -w.drop * counted[3] / dt,
        "cost": -w.cost * limit_sum / cost_scale,
        "change": -w.change * changed,
        "contract_miss": -w.contract_miss * contract_misses / dt,
    }


def step_info(terms: dict[str, float], limits: list[int], now: float, completions: int, lost: int, violations: int,
              p99: float) -> dict[str, Any]:
    """A step's info dict (the keys the class docstring lists; ``contract_misses`` and ``episode_metrics`` are
    added where they apply)."""
    return {
        "reward_terms": terms,
        "limits": limits,
        "time_s": now,
        "completions": completions,
        "drops": lost,
        "slo_violations": violations,
        "p99_s": p99,
    }


def unresolved_misses(sim: World, cweights: np.ndarray, misses: float, weighted: float) -> tuple[float, float]:
    """``misses`` and ``weighted`` (the last interval's contract misses, plain and times ``cweights``) with the
    in-contract requests still queued or running at the horizon added: the episode's end counts them not good."""
    ct = sim.contract_totals
    for c, left in zip(cweights.tolist(), (ct[:, 0] - ct[:, 1] - ct[:, 2]).tolist(), strict=True):
        if c != 0.0:
            misses += left
            weighted += c * left
    return misses, weighted


def contract_weights(scenario: Scenario) -> np.ndarray:
    """Each tenant's weight of an in-contract miss in the reward (``c_i`` of the Rewards section): 0 without a
    contract, else its SLO tier's weight in ``reward.contract_tiers`` (1 for a tier not named), times its
    ``weight`` under ``reward.tenant_weights``."""
    w = scenario.reward
    by_tier = {str(k): float(v) for k, v in w.contract_tiers.items()}
    if by_tier:
        from admit.envs.family import slo_tier  # the tier names: only where a config weighs tiers

        tiers = [slo_tier(t.slo.model_dump(exclude_none=True)) for t in scenario.tenants]
    else:
        tiers = [""] * len(scenario.tenants)
    return np.array([
        0.0 if t.contract is None else
        by_tier.get(tier, 1.0) * (t.weight if w.tenant_weights else 1.0)
        for t, tier in zip(scenario.tenants, tiers, strict=True)])


class TenantAdmissionEnv(gym.Env[np.ndarray, np.ndarray]):
    """Per-tenant admission concurrency in front of a simulated multi-tenant LLM server.

    ## Description

    Several tenants send requests to one shared server: a slot engine (a pool of identical slots with
    random service times) or a token-level engine (vLLM-style continuous batching over a KV cache). In
    front of the server each tenant has an admission queue and a concurrency limit: at most ``limit`` of
    its requests run at once, the rest wait in FIFO order, dropped after the scenario's queue timeout and
    rejected when the queue is full. Every ``interval_s`` seconds of simulated time the agent moves each
    tenant's limit. A scenario (``admit scenarios`` lists the bundled ones, envs/scenarios/*.yaml) names
    the tenants (arrivals, request sizes, SLOs), the engine, the queues, the limit bounds, the interval,
    the horizon and the reward weights. The same decisions drive the live gateway (``admit control``):
    the observation is the one it serves, the clamp the one it applies.

    ## Action Space

    The action is a `ndarray` with shape ``(n,)`` for n tenants, in ``MultiDiscrete([2k + 1] * n)`` with
    k = the scenario's ``limits.max_step``: entry ``a_i`` moves tenant i's limit by ``a_i - k``. With k = 1
    (seed-paper):

    - 0: lower the tenant's limit by 1
    - 1: hold it
    - 2: raise it by 1

    The new limit is clamped to ``[limits.min, limits.max]`` (``Limits.apply``). An action of another
    shape, not integral or out of range raises ValueError naming the allowed values.

    ## Observation Space

    The observation is a float32 `ndarray` with shape ``(5 + 27·n,)``: five global features, then 27 for
    each tenant i in the scenario's order (layout 2 of ``admit.core.observation``, the vector the live
    gateway serves too). Counts are over the scenario's telemetry window (``window_s``); percentiles over
    the completions in it; token features are the tenant's footprint now (core/observation.py defines
    them). ``layout=1`` (what ``-v0`` ids use) gives the first layout, ``(3 + 17·n,)``: the rows 0–2 and
    the first 17 per-tenant rows below.

    | Num           | Feature                  | Unit                                        | Min        | Max        |
    |---------------|--------------------------|---------------------------------------------|------------|------------|
    | 0             | `gpu_mem_util`           | fraction of slots / KV cache in use         | 0          | 1          |
    | 1             | `engine_running`         | requests running in the engine              | 0          | 1e6        |
    | 2             | `engine_waiting`         | requests waiting inside the engine          | 0          | 1e6        |
    | 3             | `prefill_tokens_waiting` | tokens: Σ over tenants of prefill_tokens    | 0          | 1e6        |
    | 4             | `preemptions`            | engine preemptions in the window            | 0          | 1e6        |
    | 5 + 27·i + 0  | `queue_depth`            | requests in tenant i's admission queue      | 0          | 1e6        |
    | 5 + 27·i + 1  | `in_flight`              | tenant i's requests admitted, not finished  | 0          | 1e6        |
    | 5 + 27·i + 2  | `limit`                  | requests: tenant i's concurrency limit      | limits.min | limits.max |
    | 5 + 27·i + 3  | `arrivals`               | requests arrived in the window              | 0          | 1e6        |
    | 5 + 27·i + 4  | `completions`            | requests completed in the window            | 0          | 1e6        |
    | 5 + 27·i + 5  | `drops`                  | queue-timeout drops in the window           | 0          | 1e6        |
    | 5 + 27·i + 6  | `rejections`             | queue-full rejections in the window         | 0          | 1e6        |
    | 5 + 27·i + 7  | `e2e_p50`                | s, arrival → last token                     | 0          | 1e6        |
    | 5 + 27·i + 8  | `e2e_p95`                | s, arrival → last token                     | 0          | 1e6        |
    | 5 + 27·i + 9  | `e2e_p99`                | s, arrival → last token                     | 0          | 1e6        |
    | 5 + 27·i + 10 | `ttft_p50`               | s, arrival → first token                    | 0          | 1e6        |
    | 5 + 27·i + 11 | `ttft_p95`               | s, arrival → first token                    | 0          | 1e6        |
    | 5 + 27·i + 12 | `ttft_p99`               | s, arrival → first token                    | 0          | 1e6        |
    | 5 + 27·i + 13 | `samples`                | completions behind the percentiles          | 0          | 1e6        |
    | 5 + 27·i + 14 | `queue_wait_p99`         | s waited in the admission queue             | 0          | 1e6        |
    | 5 + 27·i + 15 | `slo_e2e_p99`            | s, the e2e p99 objective (1e4 = none)       | > 0        | 1e6        |
    | 5 + 27·i + 16 | `slo_ttft_p99`           | s, the TTFT p99 objective (1e4 = none)      | > 0        | 1e6        |
    | 5 + 27·i + 17 | `output_tokens_per_s`    | tokens/s of the window's completions        | 0          | 1e6        |
    | 5 + 27·i + 18 | `tpot_p50`               | s per output token after the first          | 0          | 1e6        |
    | 5 + 27·i + 19 | `tpot_p99`               | s per output token after the first          | 0          | 1e6        |
    | 5 + 27·i + 20 | `goodput`                | good completions/s in the window            | 0          | 1e6        |
    | 5 + 27·i + 21 | `slo_ttft`               | s, per-request TTFT objective (1e4 = none)  | > 0        | 1e6        |
    | 5 + 27·i + 22 | `slo_tpot`               | s, per-request TPOT objective (1e4 = none)  | > 0        | 1e6        |
    | 5 + 27·i + 23 | `slo_e2e`                | s, per-request e2e objective (1e4 = none)   | > 0        | 1e6        |
    | 5 + 27·i + 24 | `prompt_tokens_queued`   | tokens: prompts in tenant i's queue         | 0          | 1e6        |
    | 5 + 27·i + 25 | `prefill_tokens`         | tokens: prompts with no first token yet     | 0          | 1e6        |
    | 5 + 27·i + 26 | `tokens_in_flight`       | tokens held: prompt + generated, unfinished | 0          | 1e6        |

    **Note:** the space is ``Box(0, 1e6)`` for every entry (``FEATURE_MAX``; every value is clipped to
    it); Min and Max above are the ranges the values take. Percentiles of an empty window are 0 with
    ``samples`` = 0. The slot engine's first token is its service start, so TTFT there is the time to
    service. A tenant without an SLO reads ``NO_SLO`` = 1e4. ``env.unwrapped.last_observation`` is the
    same observation as an ``Observation`` object.

    ## Rewards

    Per interval of Δ = ``interval_s`` seconds, with weights ``w`` from the scenario's ``reward`` block:

        w.throughput · completions / Δ + w.goodput · good / Δ − w.slo_violation · slo_violations / Δ
        − w.drop · (drops + rejections) / Δ − w.cost · Σ limits / (n · limits.max)
        − w.change · Σ |new limit − old limit| − w.contract_miss · Σ_i c_i · contract_misses_i / Δ

    With ``reward.tenant_weights`` each tenant's counts are multiplied by its ``weight`` first.
    A completion over its tenant's e2e or TTFT objective is a violation; a *good* request completed within
    every per-request objective of its tenant (``ttft_s``, ``tpot_s``, ``e2e_s``: what goodput counts).
    ``goodput`` weighs 0 unless the scenario or the training config sets it. seed-paper weighs throughput 1,
    violations 0.5, drops 1, cost and change 0. Every term is in ``info["reward_terms"]``; ``info`` also
    has ``limits``, ``time_s``, ``completions``, ``drops``, ``slo_violations`` and ``p99_s`` (the largest
    tenant e2e p99 of the window).

    **The contract-first term** (``contract_miss``, weight 0 unless set): tenant i's *contract misses* in the
    interval are its in-contract requests (classified at arrival, envs/simulation.py ``in_contract``) that
    were rejected, dropped or completed but not good in it; at the truncating step its in-contract requests
    still queued or running count as well, as the episode's contract figures count them not good. So an
    episode's misses sum, per tenant, to exactly ``contract_arrived − contract_good`` of its figures
    (envs/contracts.py ``episode_contracts``). ``c_i`` is 0 for a tenant without a contract, else its SLO
    tier's weight in ``reward.contract_tiers`` (1 for a tier not named), times its ``weight`` under
    ``reward.tenant_weights``. With ``goodput`` beside it, a policy is paid first for keeping promises and
    then for the requests it serves well (docs/training.md, "The contract-first reward"). Where the scenario
    has contracts, ``info["contract_misses"]`` is the interval's misses of the tenants with ``c_i`` > 0,
    unweighted. Without contracts the term is −0.0 and the reward is as before it, bit for bit.

    ## Starting State

    ``reset(seed=s)`` starts at t = 0 with empty queues, an idle engine and every limit at
    ``limits.initial``: the observation is zero but for the limits and the SLOs. The whole episode's
    workload (arrival times, request sizes, service draws) is drawn from s, so the same seed and actions
    give the same trajectory, and ``admit evaluate`` on seed s sees exactly the same requests (common
    random numbers). Without a seed one is drawn from the env's ``np_random``; ``info["episode_seed"]``
    says which. ``options`` are not used.

    ## Episode End

    The episode is never terminated. It is truncated when simulated time reaches ``horizon_s``: after
    ``env.unwrapped.max_episode_steps`` = ⌈horizon_s / interval_s⌉ steps (seed-paper: 1800 s / 3 s = 600),
    the last interval cut short where the interval does not divide the horizon. The truncating step's
    ``info["episode_metrics"]`` holds the episode's metrics (throughput, p99, drops, SLO attainment,
    Jain's fairness). Call ``reset()`` then.

    ``admit/TenantAdmission-v1`` takes any scenario, so it has no ``TimeLimit`` (one step count would cut
    a longer scenario short): the env truncates at its own horizon. Each bundled scenario also has an id
    of its own, ``admit/TenantAdmission-<scenario>-v1`` (e.g. ``admit/TenantAdmission-seed-paper-v1``),
    registered with the scenario bound and ``max_episode_steps`` = its step count, so that tools reading
    ``env.spec.max_episode_steps`` see it; its ``TimeLimit`` truncates at exactly the step the env does.

    ## Arguments

    ```python
    >>> import admit.envs, gymnasium
    >>> import numpy as np
    >>> env = gymnasium.make("admit/TenantAdmission-v1", scenario="seed-paper")
    >>> env
    <OrderEnforcing<PassiveEnvChecker<TenantAdmissionEnv<admit/TenantAdmission-v1>>>>
    >>> obs, info = env.reset(seed=0)
    >>> obs.shape, obs.dtype, env.action_space
    ((59,), dtype('float32'), MultiDiscrete([3 3]))
    >>> info
    {'episode_seed': 0, 'limits': [4, 4], 'time_s': 0.0}
    >>> obs, reward, terminated, truncated, info = env.step(np.array([1, 0]))  # hold, lower
    >>> info["limits"], info["time_s"], terminated, truncated
    ([4, 3], 3.0, False, False)
    >>> env.unwrapped.max_episode_steps, env.spec.max_episode_steps is None
    (600, True)
    >>> bound = gymnasium.make("admit/TenantAdmission-seed-paper-v1")
    >>> bound.spec.max_episode_steps, bound.spec.kwargs
    (600, {'scenario': 'seed-paper', 'layout': 2})

    ```

    | Parameter     | Type                | Default        | Description                                          |
    |---------------|---------------------|----------------|------------------------------------------------------|
    | `scenario`    | **str**, `Scenario` | `"seed-paper"` | a bundled scenario's name, a YAML path or a Scenario |
    | `render_mode` | **None**            | `None`         | no rendering; anything else raises ValueError        |

    A per-scenario id binds ``scenario``: run another scenario through the generic id, whose length
    follows the scenario (passing ``scenario=`` to a per-scenario id keeps that id's ``TimeLimit``).

    ## Vectorized environment

    The ``-v1`` ids have a native vector env (``vector_entry_point``, envs/vector.py): N worlds, each its own
    scenario and seed, stepped by one compiled call, with Gymnasium 1.x's next-step autoreset; world i's
    episodes are bit-identical to a single env's seeded alike,

    ```python
    >>> envs = gymnasium.make_vec("admit/TenantAdmission-seed-paper-v1", num_envs=2,
    ...                           vectorization_mode="vector_entry_point")
    >>> envs
    TenantAdmissionVectorEnv(admit/TenantAdmission-seed-paper-v1, num_envs=2)
    >>> envs.reset(seed=0)[0].shape
    (2, 59)
    >>> envs.close()

    ```

    and ``admit.train.vec.WorldsVecEnv`` runs it as an SB3 ``VecEnv``. Gymnasium's own vectorizers work
    too (``vectorization_mode="sync"``: a SyncVectorEnv over single envs), and so do SB3's ``DummyVecEnv``
    and ``SubprocVecEnv``. ``admit train`` uses ``admit.train.vec.BlockVecEnv``, which steps blocks of
    envs in worker processes: a step (~0.1 ms) costs less than the pipe round trip a process per env would add.

    ## Version History

    * v1: the observation gains the token footprints, TPOT, goodput and the per-request objectives
      (layout 2: ``5 + 27·n``); actions, rewards and the simulated world are v0's. ``admit/TenantAdmission-v1``
      and ``admit/TenantAdmission-<scenario>-v1``. Later, the ``contract_miss`` term (``reward_terms`` always
      has it: −0.0 unless its weight is set and some tenant has a contract, so every reward is as it was)
      and, where tenants have contracts, ``info["contract_misses"]``; later still, the native vector env
      (``vector_entry_point``), which changes nothing a single env does.
    * v0: Initial version (layout 1, ``3 + 17·n``), still registered as ``admit/TenantAdmission-v0`` and
      ``admit/TenantAdmission-<scenario>-v0`` (``layout=1``) for what was trained on it. Later additions
      changed none of its behaviour (spaces, rewards and trajectories are bit-identical): the
      ``max_episode_steps`` property and one id per bundled scenario, with ``max_episode_steps`` in its
      registration.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium convention)

    def __init__(self, scenario: str | Scenario = "seed-paper", render_mode: str | None = None,
                 layout: int = LAYOUT_VERSION, world: str = "compiled") -> None:
        if world not in WORLDS:
            raise ValueError(f"world {world!r} is unknown; allowed: {', '.join(WORLDS)}")
        self.world = world
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported; allowed: None")
        if layout not in LAYOUTS:
            raise ValueError(f"observation layout {layout!r} is unknown; allowed: {', '.join(map(str, LAYOUTS))}")
        self.layout = layout
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        self.spec_ = self.scenario.control_spec()
        self.n = len(self.scenario.tenants)
        self.k = self.scenario.limits.max_step
        self.action_space = gym.spaces.MultiDiscrete(np.full(self.n, 2 * self.k + 1, dtype=np.int64))
        size = Observation.vector_size(self.n, layout)
        self.observation_space = gym.spaces.Box(0.0, FEATURE_MAX, shape=(size,), dtype=np.float32)
        # an older layout is a selection of the current vector's entries (core/observation.py LAYOUTS)
        self._select = None if layout == LAYOUT_VERSION else Observation.layout_index(self.n, layout)
        self.sim: World | None = None
        # the last observation as flat values; the Observation object is built only when asked for
        self._values: list[float] | np.ndarray | None = None
        self._values_time = 0.0
        self._observation: Observation | None = None
        self._p99_index = [len(GLOBAL_FEATURES) + i * len(TENANT_FEATURES) + _E2E_P99 for i in range(self.n)]
        # each tenant's reward weight (1 unless the scenario's reward weighs tenants), for the compiled step
        weighted = self.scenario.reward.tenant_weights
        self._weights = np.array([tc.weight if weighted else 1.0 for tc in self.scenario.tenants])
        self._cweights = contract_weights(self.scenario)
        self._contracts = self.scenario.has_contracts
        self._ctaken = np.zeros((self.n, 3), dtype=np.int64)  # the Python world's in-contract counts at the last step

    @property
    def max_episode_steps(self) -> int:
        """Steps from reset to truncation: ⌈horizon_s / interval_s⌉ decisions (600 for seed-paper)."""
        return decision_count(self.scenario)

    @property
    def last_observation(self) -> Observation | None:
        """The Observation behind the last vector returned (None before the first reset)."""
        if self._observation is None and self._values is not None:
            self._observation = Observation.from_vector(self._values, self._values_time, self.scenario.window_s)
        return self._observation

    def _vector(self, values: list[float] | np.ndarray) -> np.ndarray:
        vec = vector_from_values(values)
        return vec if self._select is None else vec[self._select]

    def _observe(self) -> list[float] | np.ndarray:
        assert self.sim is not None
        values = self.sim.observe_values()
        self._values, self._values_time, self._observation = values, self.sim.now, None
        return values

    # --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        episode_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self.sim = make_simulation(self.scenario, episode_seed, world=self.world)
        self._ctaken = np.zeros((self.n, 3), dtype=np.int64)
        info = {"episode_seed": episode_seed, "limits": self.sim.limits, "time_s": 0.0}
        return self._vector(self._observe()), info

    def _deltas(self, action: Any) -> list[int]:
        k = self.k
        # fast path: what a policy or a VecEnv passes (an integer array of the right shape), checked in Python
        if type(action) is np.ndarray and action.dtype.kind in "iu" and action.shape == (self.n,):
            vals = action.tolist()
            if min(vals) >= 0 and max(vals) <= 2 * k:
                return [v - k for v in vals]
        a = np.asarray(action)
        allowed = f"an integer array of shape ({self.n},) with values in 0..{2 * k} (delta = value − {k})"
        if a.shape != (self.n,):
            raise ValueError(f"action has shape {a.shape}; expected {allowed}")
        if not np.issubdtype(a.dtype, np.integer):
            if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
                raise ValueError(f"action {a.tolist()} is not integral; expected {allowed}")
            a = a.astype(np.int64)
        if a.min() < 0 or a.max() > 2 * k:
            raise ValueError(f"action {a.tolist()} is out of range; expected {allowed}")
        return (a.astype(np.int64) - k).tolist()

    def step(self, action: Any):
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        if type(self.sim) is CompiledSimulation:
            return self._step_compiled(self.sim, action)
        deltas = self._deltas(action)
        sim = self.sim
        sc = self.scenario
        before = sim.limits
        limits = sim.step(deltas)
        totals = sim.take_interval_totals()
        completed = [t.completed for t in totals]
        goods = [t.good for t in totals]
        viol = [t.slo_violations for t in totals]
        losts = [t.dropped + t.rejected for t in totals]
        completions, good, violations, lost = sum(completed), sum(goods), sum(viol), sum(losts)
        counted: tuple[float, ...] = (completions, good, violations, lost)
        if sc.reward.tenant_weights:  # the same counts, each tenant's times its weight
            counted = tuple(
                sum(tc.weight * x for tc, x in zip(sc.tenants, xs, strict=True))
                for xs in (completed, goods, viol, losts)
            )
        changed = sum(abs(a - b) for a, b in zip(limits, before, strict=True))
        misses, weighted = 0.0, 0.0
        if self._contracts:  # the interval's in-contract misses, as the compiled step sums them
            ct = sim.contract_totals
            missed = (ct[:, 2] - self._ctaken[:, 2]).tolist()
            self._ctaken = ct
            for c, m in zip(self._cweights.tolist(), missed, strict=True):
                if c != 0.0:
                    misses += m
                    weighted += c * m
        done = sim.done
        if done and self._contracts:
            misses, weighted = self._unresolved(sim, misses, weighted)
        terms = self._reward_terms(counted, sum(limits), changed, weighted)
        values = self._observe()
        info = step_info(terms, limits, sim.now, completions, lost, violations,
                          float(max(values[j] for j in self._p99_index)))
        if self._contracts:
            info["contract_misses"] = misses
        if done:
            info["episode_metrics"] = sim.summary()
        return self._vector(values), float(sum(terms.values())), False, done, info

    def _step_compiled(self, sim: CompiledSimulation, action: Any):
        """``step`` on the compiled world: the kernel sets the limits, runs the interval, observes, counts and
        sums what the reward needs (``CompiledSimulation.env_step``); the same numbers as the general path."""
        k = self.k
        if type(action) is np.ndarray and action.dtype == np.int64 and action.shape == (self.n,):
            vals = action.tolist()
            act = action if min(vals) >= 0 and max(vals) <= 2 * k else None
        else:
            act = None
        if act is None:  # anything else is checked and converted (or refused) the general way
            act, offset = np.array(self._deltas(action), dtype=np.int64), 0
        else:
            offset = k
        values, vec, g = sim.env_step(act, offset, self._weights, self._cweights)
        truncated = sim.done
        misses, weighted = g[K.G_CMISS], g[K.G_W_CMISS]
        if truncated and self._contracts:
            misses, weighted = self._unresolved(sim, misses, weighted)
        terms = self._reward_terms((g[K.G_W_COMPLETED], g[K.G_W_GOOD], g[K.G_W_VIOL], g[K.G_W_LOST]),
                                   g[K.G_LIMIT_SUM], g[K.G_CHANGE], weighted)
        now = g[K.G_NOW]
        self._values, self._values_time, self._observation = values, now, None
        info = step_info(terms, sim.last_limits, now, int(g[K.G_COMPLETED]), int(g[K.G_LOST]), int(g[K.G_VIOL]),
                          g[K.G_P99])
        if self._contracts:
            info["contract_misses"] = misses
        if truncated:
            info["episode_metrics"] = sim.summary()
        return vec if self._select is None else vec[self._select], float(sum(terms.values())), False, truncated, info

    def _unresolved(self, sim: World, misses: float, weighted: float) -> tuple[float, float]:
        return unresolved_misses(sim, self._cweights, misses, weighted)

    def _reward_terms(self, counted: tuple[float, ...], limit_sum: float,
                      changed: float, contract_misses: float = 0.0) -> dict[str, float]:
        sc = self.scenario
        return reward_terms(sc.reward, sc.interval_s, self.n * sc.limits.max, counted, limit_sum, changed,
                            contract_misses)
