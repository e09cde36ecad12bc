"""``BlockVecEnv``: an SB3 VecEnv that steps its envs in blocks, one block per process, the trainer's included.

SB3's DummyVecEnv steps every env in the trainer process (one core) and deep-copies the infos at every
step; SubprocVecEnv gives every env its own process and pays a pipe round trip and the pickling of an
observation and an info dict per env per step — more than the env step itself costs here (~0.1 ms). This
runner splits the ``n`` envs into ``workers + 1`` contiguous blocks (sizes differ by at most one): block 0
is stepped in the trainer process, block b ≥ 1 in worker process b. One ``step``:

1. ``step_async`` sends each worker its block's rows of the actions (one pipe message per worker);
2. ``step_wait`` steps block 0 in the trainer while the workers step theirs, then collects one reply per
   worker (the block's infos and the reset infos of the envs that were reset). Observations, rewards
   (float32) and dones are written by every block straight into shared-memory arrays, from which the
   trainer returns copies.

So both cores step envs during a rollout while the policy's forward pass stays one batched call over all
envs. With ``workers=0`` everything runs in the trainer (a DummyVecEnv without the per-step deep copy).
``trainer_block=False`` leaves the trainer only the policy: the envs are split over the workers alone.

Semantics are DummyVecEnv's (admit.train.vec_worker.EnvBlock): auto-reset with
``info["terminal_observation"]`` and ``info["TimeLimit.truncated"]``, ``reset_infos``, ``seed()`` and
``set_options()`` applied at the next ``reset()``, ``get_attr``/``set_attr``/``env_method``/
``env_is_wrapped`` routed to the process holding each env. Which process steps an env changes nothing it
computes, so a training run is bit-identical to the same run on DummyVecEnv (tested). Infos are not deep-
copied: an env must return fresh info dicts (TenantAdmissionEnv does).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from admit.train.vec_worker import EnvBlock, worker
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering 0..n, sizes differing by at most one (larger ones first)."""
    size, extra = divmod(n, parts)
    out, lo = [], 0
    for b in range(parts):
        hi = lo + size + (1 if b < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


class BlockVecEnv(VecEnv):
    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        workers: int = 1,
        trainer_block: bool = True,
        start_method: str | None = None,
    ) -> None:
        n = len(env_fns)
        if n < 1:
            raise ValueError("BlockVecEnv needs at least one env")
        if workers < 0 or (workers == 0 and not trainer_block):
            raise ValueError(f"workers must be >= 0 (>= 1 without the trainer block), got {workers}")
        blocks = split(n, workers + (1 if trainer_block else 0))
        blocks = [b for b in blocks if b[1] > b[0]]  # fewer envs than processes: drop the empty blocks
        local_range = blocks.pop(0) if trainer_block else None
        self.waiting = False
        self.closed = False

        # the spaces (and the obs buffer's shape) come from one env built here: the trainer's first env
        probe = env_fns[0]()
        obs_space, act_space = probe.observation_space, probe.action_space
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"BlockVecEnv needs a Box observation space, got {obs_space}")
        if local_range is None:
            probe.close()
        ctx: Any = mp.get_context(  # a SpawnContext or ForkServerContext (BaseContext has no Process)
            start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"))
        shape, dtype = obs_space.shape, np.dtype(obs_space.dtype)
        raw = (
            ctx.RawArray("b", max(n * int(np.prod(shape)) * dtype.itemsize, 1)),
            ctx.RawArray("b", n * 4),
            ctx.RawArray("b", n),
        )
        self._obs = np.frombuffer(raw[0], dtype=dtype)[: n * int(np.prod(shape))].reshape(n, *shape)
        self._rew = np.frombuffer(raw[1], dtype=np.float32)
        self._done = np.frombuffer(raw[2], dtype=np.bool_)

        # where each env lives: (block, row in the block); block 0 = the trainer's, if any
        self._local: EnvBlock | None = None
        self._ranges: list[tuple[int, int]] = []  # per worker
        self._remotes: list[Any] = []
        self.processes: list[Any] = []
        if local_range is not None:
            lo, hi = local_range  # lo == 0: the probe is env 0
            fns = [lambda: probe, *env_fns[1:hi]]
            self._local = EnvBlock(fns, self._obs[lo:hi], self._rew[lo:hi], self._done[lo:hi])
            self._local_range = local_range
        for lo, hi in blocks:
            remote, work_remote = ctx.Pipe()
            args = (work_remote, remote, cloudpickle.dumps(list(env_fns[lo:hi])), raw, (lo, hi, shape, dtype))
            process = ctx.Process(target=worker, args=args, daemon=True)
            process.start()
            work_remote.close()
            self._remotes.append(remote)
            self._ranges.append((lo, hi))
            self.processes.append(process)
        try:
            for remote in self._remotes:
                remote.send(("init", None))
            self._gather()
        except Exception:
            self.close()
            raise
        self._owner: list[tuple[int, int]] = [(-1, 0)] * n  # env index → (worker or -1 = trainer, row)
        if self._local is not None:
            lo, hi = self._local_range
            for i in range(lo, hi):
                self._owner[i] = (-1, i - lo)
        for w, (lo, hi) in enumerate(self._ranges):
            for i in range(lo, hi):
                self._owner[i] = (w, i - lo)
        self._actions: np.ndarray | None = None
        super().__init__(n, obs_space, act_space)

    # ------------------------------------------------------------------ pipe helpers
    def _gather(self, remotes: Iterable[Any] | None = None) -> list[Any]:
        out = []
        errors = []
        for remote in self._remotes if remotes is None else remotes:
            try:
                tag, payload = remote.recv()
            except (EOFError, OSError) as e:
                tag, payload = "error", f"the worker process exited ({type(e).__name__})"
            if tag == "error":
                errors.append(payload)
            out.append(payload)
        if errors:
            raise RuntimeError("BlockVecEnv worker failed:\n" + "\n".join(errors))
        return out

    # ------------------------------------------------------------------ VecEnv
    def _local_then_gather(self, local: Callable[[], Any] | None, remotes: list[Any] | None = None) -> tuple:
        """Run ``local`` (the trainer's block) while the workers work, then collect every worker's reply —
        also when ``local`` raised, so that no reply is left in a pipe; then raise its error."""
        result, error = None, None
        if local is not None:
            try:
                result = local()
            except Exception as e:  # re-raised below, after the workers answered
                error = e
        replies = self._gather(remotes)
        if error is not None:
            raise error
        return result, replies

    def reset(self) -> VecEnvObs:
        for remote, (lo, hi) in zip(self._remotes, self._ranges, strict=True):
            remote.send(("reset", (self._seeds[lo:hi], self._options[lo:hi])))
        local = None
        if self._local is not None:
            block, (lo, hi) = self._local, self._local_range
            local = lambda: block.reset(self._seeds[lo:hi], self._options[lo:hi])  # noqa: E731
        infos, replies = self._local_then_gather(local)
        if infos is not None:
            self.reset_infos[lo:hi] = infos
        for (lo, hi), infos in zip(self._ranges, replies, strict=True):
            self.reset_infos[lo:hi] = infos
        self._reset_seeds()
        self._reset_options()
        return self._obs.copy()

    def step_async(self, actions: np.ndarray) -> None:
        for remote, (lo, hi) in zip(self._remotes, self._ranges, strict=True):
            remote.send(("step", actions[lo:hi]))
        self._actions = actions
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        infos: list[dict[str, Any]] = [{}] * self.num_envs
        actions = self._actions
        assert actions is not None, "step_wait() without step_async()"
        self.waiting = False
        self._actions = None
        local = None
        if self._local is not None:
            block, (lo, hi) = self._local, self._local_range
            local = lambda: block.step(actions[lo:hi])  # noqa: E731
        mine, replies = self._local_then_gather(local)
        if mine is not None:
            replies = [mine, *replies]
        ranges = [self._local_range, *self._ranges] if mine is not None else self._ranges
        for (lo, hi), (block_infos, resets) in zip(ranges, replies, strict=True):
            infos[lo:hi] = block_infos
            for j, info in resets.items():
                self.reset_infos[lo + j] = info
        return self._obs.copy(), self._rew.copy(), self._done.copy(), infos

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for remote in self._remotes:
            try:
                remote.send(("close", None))
            except (BrokenPipeError, OSError):
                continue
        for remote in self._remotes:
            with contextlib.suppress(EOFError, OSError):
                remote.recv()
            remote.close()
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
        if self._local is not None:
            self._local.close()

    # ------------------------------------------------------------------ forwarding to the envs
    def _route(self, indices: VecEnvIndices, cmd: str, *data: Any) -> list[Any]:
        """Run ``cmd`` on the envs ``indices`` wherever they live; results in the order of ``indices``."""
        idx = list(self._get_indices(indices))
        by_owner: dict[int, list[int]] = {}
        for i in idx:
            by_owner.setdefault(self._owner[i][0], []).append(i)
        results: dict[int, Any] = {}
        asked = [w for w in by_owner if w >= 0]
        for w in asked:
            self._remotes[w].send((cmd, ([self._owner[i][1] for i in by_owner[w]], *data)))
        local = None
        if -1 in by_owner:
            block, rows = self._local, [self._owner[i][1] for i in by_owner[-1]]
            assert block is not None
            local = lambda: getattr(block, cmd)(rows, *data) or [None] * len(rows)  # noqa: E731
        mine, replies = self._local_then_gather(local, [self._remotes[w] for w in asked])
        if mine is not None:
            results.update(zip(by_owner[-1], mine, strict=True))
        for w, out in zip(asked, replies, strict=True):
            results.update(zip(by_owner[w], out or [None] * len(by_owner[w]), strict=True))
        return [results[i] for i in idx]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._route(indices, "get_attr", attr_name)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._route(indices, "set_attr", attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any):
        return self._route(indices, "env_method", method_name, method_args, method_kwargs)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return self._route(indices, "is_wrapped", wrapper_class)


class WorldsVecEnv(VecEnv):
    """The native vector env (admit.envs.vector: N compiled worlds, one kernel call a step) as an SB3 ``VecEnv``.

    SB3's semantics, as ``DummyVecEnv`` over N ``TenantAdmissionEnv`` gives them: a world whose episode ends is
    reset in the same step (without a seed: its own generator draws the next, as a single env's ``reset()``
    does), its last observation in ``info["terminal_observation"]``, ``info["TimeLimit.truncated"]`` true (false
    in every other step's info) and its
    reset info in ``reset_infos``; ``seed()`` and ``set_options()`` apply at the next ``reset()``; rewards are
    float32. Each world's info is the single env's dict (envs/env.py ``step_info``, with ``contract_misses``
    and ``episode_metrics`` where it has them), so the episodes, rewards and infos are those of the DummyVecEnv
    (tests/train/test_worlds_vec_env.py). ``seed_bases`` (one per world) gives each world the episode seeds of
    admit.train.wrappers.EpisodeSeeds: world i's episode j runs seed ``seed_bases[i] + seed_stride·j``, whatever
    ``seed()`` says, as ``admit train`` seeds its envs. ``get_attr`` reads the vector env's attribute
    (``scenarios`` and ``n_tenants`` per world); no world is wrapped."""

    def __init__(self, venv: Any, seed_bases: Sequence[int] | None = None, seed_stride: int = 1) -> None:
        from admit.envs.vector import TenantAdmissionVectorEnv

        if not isinstance(venv, TenantAdmissionVectorEnv):
            raise ValueError(f"WorldsVecEnv runs a TenantAdmissionVectorEnv, got {type(venv).__name__}")
        if seed_bases is not None and (len(seed_bases) != venv.num_envs or min(seed_bases) < 0 or seed_stride < 1):
            raise ValueError(f"seed_bases needs one base >= 0 per world ({venv.num_envs}) and seed_stride >= 1, got "
                             f"{len(seed_bases)} bases, stride {seed_stride}")
        self.venv = venv
        self._bases = None if seed_bases is None else [int(b) for b in seed_bases]
        self._stride = int(seed_stride)
        self._episode = [0] * venv.num_envs
        self._all = np.ones(venv.num_envs, dtype=np.bool_)
        self._actions: np.ndarray | None = None
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    def reset(self) -> VecEnvObs:
        v = self.venv
        if any(o for o in self._options):
            raise ValueError("WorldsVecEnv takes no reset options")
        seeds: list[int | None] | None = self._seeds if any(s is not None for s in self._seeds) else None
        if self._bases is not None:
            self._episode = [0] * self.num_envs
            seeds = [self._next_seed(i) for i in range(self.num_envs)]
        _, infos = v.reset(seed=seeds)
        for i in range(self.num_envs):
            self.reset_infos[i] = {"episode_seed": int(infos["episode_seed"][i]),
                                   "limits": infos["limits"][i, :v.n_tenants[i]].tolist(), "time_s": 0.0}
        self._reset_seeds()
        self._reset_options()
        return v.obs.copy()

    def _next_seed(self, i: int) -> int | None:
        if self._bases is None:
            return None
        seed = self._bases[i] + self._stride * self._episode[i]
        self._episode[i] += 1
        return seed

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = self.venv.check_actions(actions)

    def step_wait(self) -> VecEnvStepReturn:
        from admit.envs import kernels as K
        from admit.envs.env import step_info

        v, actions = self.venv, self._actions
        assert actions is not None, "step_wait() without step_async()"
        self._actions = None
        r = v.step_worlds(actions, self._all)
        g = r.aggs
        keys = list(r.terms)
        rows = list(zip(*(r.terms[k].tolist() for k in keys), strict=True))
        limits, sizes = r.limits.tolist(), v.n_tenants.tolist()
        now, p99 = g[:, K.G_NOW].tolist(), g[:, K.G_P99].tolist()
        comp, lost, viol = (g[:, c].astype(np.int64).tolist() for c in (K.G_COMPLETED, K.G_LOST, K.G_VIOL))
        cm, miss = v.has_contracts.tolist(), r.contract_misses.tolist()
        infos = []
        for i in range(self.num_envs):
            info = step_info(dict(zip(keys, rows[i], strict=True)), limits[i][:sizes[i]], now[i], comp[i], lost[i],
                             viol[i], p99[i])
            if cm[i]:
                info["contract_misses"] = miss[i]
            info["TimeLimit.truncated"] = False  # as DummyVecEnv: truncated and not terminated (never terminated)
            infos.append(info)
        out = r.obs.copy()
        for i in np.flatnonzero(r.ended).tolist():
            info = infos[i]
            if r.at_horizon[i]:
                info["episode_metrics"] = v.world(i).summary()
            info["TimeLimit.truncated"] = True
            info["terminal_observation"] = out[i].copy()
            self.reset_infos[i] = v.reset_world(i, self._next_seed(i))
            out[i] = v.obs[i]
        return out, r.reward.astype(np.float32), r.ended.copy(), infos

    def close(self) -> None:
        self.venv.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        value = getattr(self.venv, attr_name)
        per_world = attr_name in ("scenarios", "n_tenants")
        return [value[i] if per_world else value for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise AttributeError(f"WorldsVecEnv cannot set {attr_name!r} per world; set it on the vector env")

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any):
        raise AttributeError(f"WorldsVecEnv has no per-world env to call {method_name!r} on")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]
