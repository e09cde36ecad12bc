"""``CompiledSimulation``: the simulated world with its event loop compiled (envs/kernels.py).

It is ``Simulation`` (envs/simulation.py) for a scenario on its own draws (token or slot engine), with the
same public surface — ``limits``, ``apply_deltas``, ``set_limits``, ``step``, ``advance``, ``observe``,
``observe_values``, ``take_interval_totals``, ``run``, ``summary``, ``tenant_summary``, ``totals``,
``requests``, ``now``, ``done`` — and the same numbers: the kernels transcribe the Python world's code, and
tests/envs/test_compiled_world.py runs both side by side and compares every observation, count and latency.
``make_simulation`` picks it wherever it applies; the Python world stays the reference, and is what runs
replayed requests (sim2live) and anything that reaches into the engine object. A controller that decides
by a built-in rule (``core.controller.decision_rule``: static caps, the study's naive and differentiated
rules) runs a whole episode in one kernel call (``run``), with the same decisions.

The first use in a fresh checkout compiles the kernels; numba caches the machine code next to the source,
so later processes load it instead of compiling again (docs/BENCHMARKS.md, "Current figures", has both times).

**Memory.** A world's state is a few arrays the size of its episode (~26 MB for an hour of servegen-skewed).
By default glibc serves an allocation that large with fresh pages from the kernel, zero-filled and faulted in
one 4 KiB page at a time as the episode first touches them, and returns them at the world's end, so every
episode pays for its memory anew: a caps search, which runs thousands of episodes, spent about a fifth of
its time in those page faults (docs/BENCHMARKS.md, "The caps search and the recipe, sharing their work").
Importing this module therefore asks glibc (``keep_freed_memory``) to serve allocations up to 32 MiB from
its heap and to keep what is freed there for the next world; elsewhere (another C library) nothing changes.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np
from admit.core.controller import Controller, decision_rule
from admit.core.loop import OnDecision, RunStats, run_loop
from admit.core.observation import NO_SLO, Observation
from admit.engine.presets import get_preset
from admit.engine.request import Request
from admit.engine.steptime import StepTimeModel
from admit.envs import kernels as K
from admit.envs.scenario import Scenario, SlotEngineConfig
from admit.envs.simulation import (
    END_EPS_S,
    Draw,
    IntervalCounts,
    RequestColumns,
    SimulatedWorld,
    Simulation,
    TenantTotals,
    decision_count,
    draw_episode,
    episode_metrics,
    tenant_metrics,
)

MMAP_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64-bit: allocations below it come from the heap
TRIM_THRESHOLD = 256 << 20  # free heap memory kept before glibc returns the top of the heap to the kernel


def _glibc_function(name: str) -> Any | None:
    """``name`` from the C library where it is glibc's (None elsewhere)."""
    import ctypes
    import ctypes.util

    lib = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(lib), name, None) if lib else None
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """glibc's ``mallopt``: allocations under `MMAP_THRESHOLD` from the heap, and up to `TRIM_THRESHOLD` of
    freed heap kept for reuse (module docstring, "Memory"). True where it took effect (glibc), else False."""
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold, TRIM_THRESHOLD))


def release_freed_memory() -> None:
    """Give the kernel back the heap memory freed so far (glibc's ``malloc_trim``). What `keep_freed_memory`
    keeps is reused by the next world, but one long job after another (``admit train --seeds``) leaves it
    scattered through the heap, where it adds up: 1.5 GB after one 1M-step recipe run, 2.3 GB after the
    second without this, 0.6 GB after each with it. A job calls it when it is done."""
    trim = _glibc_function("malloc_trim")
    if trim is not None:
        trim(0)


KEEPS_FREED_MEMORY = keep_freed_memory()


def _objective(v: float) -> float:
    return NO_SLO if v == math.inf else float(v)


_DENSE_TABLES: dict[tuple[StepTimeModel, int], np.ndarray] = {}


def _dense_table(model: StepTimeModel, max_tokens: int) -> np.ndarray:
    """One table per step-time model and token budget, shared by every world of this process (the kernels
    fill an entry the first time a step of that many tokens is timed; NaN = not yet)."""
    key = (model, max_tokens)
    if key not in _DENSE_TABLES:
        _DENSE_TABLES[key] = np.full(max_tokens + 1, math.nan)
    return _DENSE_TABLES[key]


class CompiledSimulation:
    def __init__(self, scenario: Scenario, seed: int, draw: Draw | None = None) -> None:
        """The world of ``scenario`` at t = 0 on ``seed``'s requests: drawn here, or ``draw``, that seed's
        `draw_episode` made earlier (its arrays are only read)."""
        self.scenario = scenario
        self.spec = scenario.control_spec()
        self.seed = int(seed)
        self.horizon_s = scenario.horizon_s
        n = len(scenario.tenants)
        self.n_tenants = n
        self.draw = draw_episode(scenario, self.seed) if draw is None else draw  # read-only: a twin may share it
        times, tenant, prompt, output, u_service, inside = self.draw
        N = len(times)

        ri = np.zeros((N, K.NRI), dtype=np.int64)
        ri[:, K.TEN] = tenant
        ri[:, K.PROMPT] = prompt
        ri[:, K.OUT] = output
        # each request's class: without contracts every request is in contract (one queue per tenant)
        ri[:, K.INC] = 1 if inside is None else inside
        self._inside = inside
        rf = np.full((N, K.NRF), math.nan)
        rf[:, K.ARR] = times
        rf[:, K.USVC] = u_service
        ei = np.zeros(K.NEI, dtype=np.int64)
        ring = 1 << max(N + 1, 2).bit_length()
        ei[K.E_WMASK] = ring - 1
        ef = np.zeros(K.NEF)
        ef[K.F_END] = math.inf
        cap = N + 1
        cfg = scenario.engine
        if isinstance(cfg, SlotEngineConfig):  # SlotEngine's settings
            ei[K.E_KIND], ei[K.E_SLOTS] = K.KIND_SLOT, cfg.slots
            ei[K.E_DET] = cfg.distribution == "deterministic"
            ef[K.F_MEAN] = cfg.mean_service_s
            ei[K.E_BS] = ei[K.E_NGB] = 1
            running, block_size, dense = cfg.slots + 1, 1, np.zeros(1)
        else:  # TokenEngine's settings and checks
            p = get_preset(cfg.preset)
            mnbt = int(cfg.max_num_batched_tokens or p.max_num_batched_tokens)
            mns = int(cfg.max_num_seqs or p.max_num_seqs)
            ngb = int(p.num_gpu_blocks)
            for name, v in (("max_num_batched_tokens", mnbt), ("max_num_seqs", mns), ("num_gpu_blocks", ngb)):
                if v < 1:
                    raise ValueError(f"{name} must be >= 1, got {v}")
            if mnbt < mns:
                raise ValueError(f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs ({mns}), as vLLM requires")
            self._check_sizes(prompt, output, p.max_model_len, p.block_size, ngb)
            ei[K.E_BS] = p.block_size
            ei[K.E_MNBT] = mnbt
            ei[K.E_MNS] = mns
            ei[K.E_NGB] = ngb
            sm = p.step
            ef[K.F_OVER], ef[K.F_FLOOR], ef[K.F_PT], ef[K.F_KNEE] = (sm.overhead_s, sm.dense_floor_s,
                                                                     sm.dense_s_per_token, sm.dense_knee)
            ef[K.F_PERSEQ], ef[K.F_KV], ef[K.F_PAIR] = (sm.per_seq_s, sm.kv_read_s_per_token,
                                                        sm.prefill_attn_s_per_pair)
            # as StepTimeModel.dense: floor ** knee and 1 / knee, computed once
            ef[K.F_FLOOR_Q], ef[K.F_INV_Q] = sm.dense_floor_s**sm.dense_knee, 1.0 / sm.dense_knee
            ef[K.F_FRONT] = p.frontend_delay_s
            running, block_size = min(N, mns) + 1, p.block_size
            dense = _dense_table(sm, mnbt)  # dense-layer time by token count, filled as steps need it
        self._E = (ri, rf, ei, ef,
                   np.zeros(running, dtype=np.int64),  # run
                   np.zeros(cap, dtype=np.int64),  # part
                   np.zeros(ring, dtype=np.int64),  # wait
                   np.zeros((N + 16, 3), dtype=np.int64),  # heap
                   np.zeros(block_size, dtype=np.int64),  # cnt
                   np.zeros((cap, 3), dtype=np.int64),  # chunks
                   np.zeros((cap, 3), dtype=np.int64),  # plan
                   np.zeros(cap, dtype=np.int64),  # fin
                   np.zeros(cap, dtype=np.int64),  # scratch
                   dense,
                   np.zeros(cap, dtype=np.int64))  # front

        # ---- admission queues and telemetry windows: one region per tenant in each flat array; in the queues'
        # array, the tenant's region holds its in-contract queue and then its excess queue
        counts = np.bincount(tenant, minlength=n) if N else np.zeros(n, dtype=np.int64)
        base = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        n_inside = counts if inside is None or not N else np.bincount(tenant[inside], minlength=n)
        self._base = base
        lim = scenario.limits
        ai = np.zeros((n, K.NAI), dtype=np.int64)
        af = np.zeros(n)
        wi = np.zeros((n, K.NWI), dtype=np.int64)
        wp = np.zeros((n, K.NWP))
        for k, t in enumerate(self.spec.tenants):
            ai[k, K.A_LIMIT] = lim.initial
            ai[k, K.A_MAXQ] = scenario.max_queue(k)
            ai[k, K.A_QH] = ai[k, K.A_QT] = base[k]
            ai[k, K.A_XH] = ai[k, K.A_XT] = base[k] + n_inside[k]
            af[k] = scenario.queue_timeout(k)
            wi[k, :8] = base[k]
            wi[k, K.W_SHI] = base[k]
            wi[k, K.W_DIRTY] = 1
            wi[k, K.W_CB] = base[k]
            b_ttft, b_tpot, b_e2e = t.request_bounds
            wp[k] = (_objective(t.slo_e2e_p99_s), _objective(t.slo_ttft_p99_s), _objective(b_ttft),
                     _objective(b_tpot), _objective(b_e2e), b_ttft, b_tpot, b_e2e, t.slo_e2e_p99_s, t.slo_ttft_p99_s)
        si = np.zeros(K.NSI, dtype=np.int64)
        si[K.S_NREQ] = N
        sf = np.zeros(K.NSF)
        sf[K.S_WIN] = scenario.window_s
        self._S = (ai, af, np.zeros(N, dtype=np.int64), np.zeros(cap, dtype=np.int64), si, sf, wi,
                   np.zeros(N), np.zeros(N), np.zeros(N), np.zeros((N, K.NWC)), wp, np.zeros((n, K.NCACHE)),
                   np.zeros((n, K.NTOT), dtype=np.int64), np.zeros(n),
                   np.zeros((4, N + 1)), np.zeros((n, 2), dtype=np.int64), np.zeros(K.PW_CAP), np.zeros(K.PW_CAP),
                   np.zeros((4, N + 1), dtype=np.int64), np.zeros(N + 1), np.zeros(N + 1, dtype=np.int64),
                   np.zeros((n, K.NCT), dtype=np.int64))  # S[22]: the in-contract counts (kernels.CT_*)
        self._arrivals = np.ascontiguousarray(times, dtype=np.float64)
        self._u_service = u_service
        self._out = np.zeros(K.N_GLOBAL + K.N_TENANT * n)
        self._taken = np.zeros((n, K.NTOT), dtype=np.int64)
        self._interval = np.zeros((n, K.NTOT), dtype=np.int64)
        self._limits_buf = np.zeros(n, dtype=np.int64)
        self._agg = np.zeros(K.NAGG)
        self._ones = np.ones(n)
        self._zeros = np.zeros(n)
        self._ctaken = np.zeros((n, K.NCT), dtype=np.int64)
        self._contracted = np.array([t.contract is not None for t in scenario.tenants])
        self._lo, self._hi = lim.min, lim.max
        self._interval_s, self._horizon_s = float(scenario.interval_s), float(scenario.horizon_s)

    @staticmethod
    def _check_sizes(prompt: np.ndarray, output: np.ndarray, max_model_len: int, block_size: int, ngb: int) -> None:
        """TokenEngine.submit's checks, on every request before the episode starts."""
        need = prompt + output
        for bad, why in (((prompt < 1) | (output < 1), "prompt_tokens and output_tokens must be >= 1"),
                         (need > max_model_len, f"prompt + output exceeds max_model_len {max_model_len}"),
                         (-(-need // block_size) > ngb, f"the request can never fit in {ngb} KV blocks")):
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"request {i} ({int(prompt[i])} prompt + {int(output[i])} output tokens): {why}")

    # ------------------------------------------------------------------ control surface
    @property
    def now(self) -> float:
        return float(self._S[5][K.S_NOW])

    @property
    def limits(self) -> list[int]:
        return self._S[0][:, K.A_LIMIT].tolist()

    @property
    def done(self) -> bool:
        return self.now >= self.horizon_s - END_EPS_S

    @property
    def num_preemptions(self) -> int:
        return int(self._E[2][K.E_NPRE])

    def apply_deltas(self, deltas: Sequence[int]) -> list[int]:
        current = self.limits
        out = self.spec.limits.apply(current, deltas)
        for i, (new, cur) in enumerate(zip(out, current, strict=True)):
            if new != cur:
                K.set_limit(self._E, self._S, i, new)
        return out

    def set_limits(self, limits: Sequence[int]) -> None:
        lim = self.spec.limits
        for i, v in enumerate(limits):
            K.set_limit(self._E, self._S, i, lim.clamp(int(v)))

    def advance_interval(self, until: float | None = None) -> None:
        end = self.horizon_s if until is None else until
        self.advance(min(self.now + self.scenario.interval_s, end))

    def step(self, deltas: Sequence[int], until: float | None = None) -> list[int]:
        limits = self.apply_deltas(deltas)
        self.advance_interval(until)
        return limits

    def step_observed(self, deltas: Sequence[int]) -> tuple[list[int], np.ndarray, np.ndarray]:
        """``step(deltas)``, ``observe_values()`` and ``take_interval_totals()`` in one kernel call: returns the
        new limits, the observation values and the interval's counts (a tenants × 7 array in ``IntervalCounts``
        field order; valid until the next call)."""
        values, _, _ = self.env_step(np.asarray(deltas, dtype=np.int64), 0, self._ones)
        return self.last_limits, values, self.last_counts

    def env_step(self, action: np.ndarray, offset: int, weights: np.ndarray,
                 contract_weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, list[float]]:
        """The world's part of ``TenantAdmissionEnv.step`` in one kernel call (``kernels.env_step``): the deltas
        are ``action - offset`` (``action`` an int64 array, taken as given), ``weights`` each tenant's reward
        weight, ``contract_weights`` (float64) each tenant's in-contract miss weight (default: 0 for all). Returns
        the observation values (float64), the observation vector (float32, clipped as ``vector_from_values``
        clips it), both fresh arrays, and the sums the reward takes (``kernels.G_*`` order, as floats). The new
        limits are in ``last_limits``, the interval's counts in ``last_counts``."""
        vec = np.empty(self._out.shape[0], dtype=np.float32)
        K.env_step(self._E, self._S, self._arrivals, action, offset, self._lo, self._hi, self._interval_s,
                   self._horizon_s, weights, self._out, vec, self._taken, self._interval, self._limits_buf, self._agg,
                   self._zeros if contract_weights is None else contract_weights, self._ctaken)
        return self._out.copy(), vec, self._agg.tolist()

    def vector_state(self, weights: np.ndarray, contract_weights: np.ndarray, offset: int) -> tuple:
        """This world as one entry of ``kernels.vector_env_step``'s list: the state tuples, the buffers
        ``env_step`` fills (this object's own, so ``last_limits``, ``last_counts`` and the totals read the same
        after a vector step as after ``env_step``), a float32 vector for the observation, the reward weights and
        the parameters (limit bounds, interval, horizon and the action's ``offset``)."""
        params = np.array([self._lo, self._hi, self._interval_s, self._horizon_s, offset], dtype=np.float64)
        return (self._E, self._S, self._arrivals, self._out, np.empty(self._out.shape[0], dtype=np.float32),
                self._taken, self._interval, self._limits_buf, np.ascontiguousarray(weights, dtype=np.float64),
                np.ascontiguousarray(contract_weights, dtype=np.float64), self._ctaken, self._agg, params)

    @property
    def contract_totals(self) -> np.ndarray:
        """Each tenant's in-contract requests so far: arrived, good, missed (rejected, dropped, or completed but
        not good); a tenants × 3 int64 array, zero for a tenant without a contract (the kernels count all of
        its requests, its one queue being its in-contract queue). ``Simulation.contract_totals``'s numbers."""
        return self._S[22] * self._contracted[:, None]

    @property
    def last_limits(self) -> list[int]:
        """The limits the last ``env_step`` set."""
        return self._limits_buf.tolist()

    @property
    def last_counts(self) -> np.ndarray:
        """The last ``env_step``'s interval counts (tenants × 7, ``IntervalCounts`` order; valid until the next)."""
        return self._interval

    def advance(self, until: float) -> None:
        K.advance(self._E, self._S, self._arrivals, float(until))

    def observe_values(self) -> np.ndarray:
        """``Simulation.observe_values`` as a float64 array (a fresh one each call)."""
        out = self._out
        K.observe_all(self._E, self._S, out)
        return out.copy()

    def observe(self) -> Observation:
        return Observation.from_vector(self.observe_values(), self.now, self.scenario.window_s)

    def take_interval_totals(self) -> list[IntervalCounts]:
        tot = self._S[13]
        diff = (tot - self._taken).tolist()
        self._taken = tot.copy()
        return [IntervalCounts(*row) for row in diff]

    def run(self, controller: Controller, until: float | None = None, on_decision: OnDecision | None = None,
            name: str | None = None) -> RunStats:
        """``Simulation.run``: core/loop.py's decision loop on ``SimulatedWorld(self, until)``. A static, naive or
        differentiated controller (whose ``act`` is that class's own) runs the whole loop in one kernel call
        instead (``kernels.run_rule``, an optimisation of the same loop: the same decisions from the same values,
        tests/envs/test_compiled_world.py), unless ``on_decision`` wants to see every decision."""
        rule = _rule_of(controller, self.n_tenants) if on_decision is None else None
        if rule is None:
            return run_loop(SimulatedWorld(self, until), controller, on_decision, name)
        return self._run_rule(rule, until)

    def run_recorded(self, controller: Controller) -> np.ndarray:
        """Run the whole episode of a controller that decides by a built-in rule (static caps, say) and return
        every tenant's running totals after each decision: an int64 array, decisions × tenants × 7, the last
        axis in ``IntervalCounts`` order (arrived, completed, dropped, rejected, slo_violations, good,
        output_tokens). Row ``j`` minus row ``j − 1`` is decision ``j``'s interval, as ``take_interval_totals``
        would have given it; a twin run on the same requests is what the paired training reward compares
        against (admit.train.worlds). ValueError for a controller without such a rule."""
        rule = _rule_of(controller, self.n_tenants)
        if rule is None:
            raise ValueError(f"run_recorded needs a controller that decides by a built-in rule (static caps, naive, "
                             f"differentiated), got {getattr(controller, 'name', type(controller).__name__)!r}")
        record = np.zeros((decision_count(self.scenario), self.n_tenants, K.NTOT), dtype=np.int64)
        stats = self._run_rule(rule, None, record)
        return record[: stats.decisions]

    def _run_rule(self, rule: tuple[int, np.ndarray, np.ndarray], until: float | None,
                  record: np.ndarray | None = None, limits: np.ndarray | None = None) -> RunStats:
        """``kernels.run_rule`` from ``now`` to ``until``; ``record`` (decisions × tenants × 7) and ``limits``
        (decisions × tenants), where given, receive each decision's running totals and the limits it set."""
        code, params, targets = rule
        lim = self.spec.limits
        end = float(self.horizon_s if until is None else until)
        n = self.n_tenants
        decisions, limit_sum = K.run_rule(
            self._E, self._S, self._arrivals, code, params, targets, lim.max_step, lim.min, lim.max,
            self._interval_s, end, self._out, np.zeros(n, dtype=np.int64),
            np.zeros((0, n, K.NTOT), dtype=np.int64) if record is None else record,
            np.zeros((0, n), dtype=np.int64) if limits is None else limits)
        return RunStats(int(decisions), float(limit_sum), n)

    # ------------------------------------------------------------------ results
    @property
    def totals(self) -> list[TenantTotals]:
        """Each tenant's ``TenantTotals`` (built from the arrays on each call)."""
        tot = self._S[13]
        wc = self._S[10]
        out = []
        for k in range(self.n_tenants):
            lo = int(self._base[k])
            hi = lo + int(tot[k, K.T_COMPLETED])
            c = wc[lo:hi]
            out.append(TenantTotals(
                arrived=int(tot[k, K.T_ARRIVED]), completed=int(tot[k, K.T_COMPLETED]),
                dropped=int(tot[k, K.T_DROPPED]), rejected=int(tot[k, K.T_REJECTED]),
                slo_violations=int(tot[k, K.T_VIOL]), good=int(tot[k, K.T_GOOD]), output_tokens=int(tot[k, K.T_OUT]),
                e2e=array("d", c[:, K.C_E2E].tobytes()), ttft=array("d", c[:, K.C_TTFT].tobytes()),
                tpot=array("d", c[:, K.C_TPOT].tobytes())))
        return out

    def request_columns(self) -> RequestColumns:
        """This episode's requests as columns in arrival order (what ``requests`` holds, without the objects)."""
        ri, rf = self._E[0], self._E[1]
        return RequestColumns(ri[:, K.TEN].astype(np.int64), rf[:, K.ARR].copy(), ri[:, K.PROMPT].astype(np.int64),
                              ri[:, K.OUT].astype(np.int64), rf[:, K.FTOK].copy(), rf[:, K.FIN].copy(),
                              rf[:, K.DISP].copy(), self._inside)

    @property
    def requests(self) -> list[Request]:
        """This episode's requests in arrival order, with the timestamps a run filled in."""
        ri, rf = self._E[0], self._E[1]
        out = []
        for rid in range(len(ri)):
            a, b = ri[rid], rf[rid]
            r = Request(rid, int(a[K.TEN]), float(b[K.ARR]), int(a[K.PROMPT]), int(a[K.OUT]),
                        float(self._u_service[rid]))
            r.dispatched, r.first_scheduled, r.first_token, r.finished = (
                float(b[K.DISP]), float(b[K.FSCHED]), float(b[K.FTOK]), float(b[K.FIN]))
            r.computed, r.generated, r.preemptions = int(a[K.COMP]), int(a[K.GEN]), int(a[K.PRE])
            out.append(r)
        return out

    def summary(self) -> dict[str, float]:
        return episode_metrics(self.totals, self.horizon_s)

    def tenant_summary(self) -> dict[str, dict[str, float]]:
        return {t.name: tenant_metrics(tot, self.horizon_s) for t, tot in zip(self.spec.tenants, self.totals,
                                                                                strict=True)}


_RULE_CODES = {"static": K.RULE_STATIC, "naive": K.RULE_NAIVE, "differentiated": K.RULE_DIFFERENTIATED}


def _rule_of(controller: Controller, n: int) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The kernel rule that decides as ``controller`` does — (code, parameters, static targets) — or None
    (``core.controller.decision_rule``)."""
    rule = decision_rule(controller)
    if rule is None:
        return None
    name, params = rule
    if name == "static":
        targets = np.array(params if params else [-1.0] * n, dtype=np.float64)
        if len(targets) != n:
            raise ValueError(f"static rule: {len(targets)} targets for {n} tenants")
        return K.RULE_STATIC, np.zeros(1), targets
    return _RULE_CODES[name], np.array(params, dtype=np.float64), np.zeros(1)


World = Simulation | CompiledSimulation
WORLDS = ("compiled", "python")


def make_simulation(scenario: Scenario, seed: int, *, requests: Sequence[Request] | None = None,
                    world: str = "compiled", draw: Draw | None = None) -> World:
    """The world an episode runs in: ``CompiledSimulation`` where it applies (a token-engine scenario on its own
    draws, or on ``draw``, the seed's `draw_episode` made once for many episodes) unless ``world="python"``,
    else ``Simulation``. Both give the same numbers."""
    if world not in WORLDS:
        raise ValueError(f"world {world!r} is unknown; allowed: {', '.join(WORLDS)}")
    if world == "compiled" and requests is None:
        return CompiledSimulation(scenario, seed, draw)
    if draw is not None:
        raise ValueError("a Draw is for the compiled world on the seed's own requests: give no requests and "
                         "world='compiled', or no draw")
    return Simulation(scenario, seed, requests=requests)


def warm() -> float:
    """Compile (or load from numba's cache) every kernel by running a short episode; returns the seconds taken."""
    import time

    from admit.envs.scenario import load_scenario

    t0 = time.perf_counter()
    sim = CompiledSimulation(load_scenario("long-context-chat"), 0)  # preempts: every kernel path runs
    sim.observe_values()
    for _ in range(30):
        sim.step_observed([1] * sim.n_tenants)
    sim.set_limits([2] * sim.n_tenants)
    sim.step([0] * sim.n_tenants)
    sim.observe()
    n = sim.n_tenants  # the vector env's kernels (envs/vector.py): a list of two worlds, one replaced, one step
    state = sim.vector_state(np.ones(n), np.zeros(n), 1)
    worlds = K.vector_worlds(state)
    K.vector_append(worlds, state)
    K.vector_set(worlds, 1, CompiledSimulation(sim.scenario, 1).vector_state(np.ones(n), np.zeros(n), 1))
    K.vector_env_step(worlds, np.ones((2, n), dtype=np.int64), np.zeros((2, sim._out.shape[0]), dtype=np.float32),
                      np.zeros((2, K.NAGG)), np.zeros((2, n), dtype=np.int64), np.ones(2, dtype=np.bool_))
    return time.perf_counter() - t0


if __name__ == "__main__":  # `make setup`'s one line for the compile: what runs, then how long it took
    print("admit: compiling the simulated world's kernels (first run only, about a minute)...", end=" ", flush=True)
    print(f"ready in {warm():.1f} s")
