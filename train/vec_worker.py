"""The env side of ``admit.train.vec.BlockVecEnv``: a block of envs stepped in one process, and its worker loop.

Kept apart from admit.train.vec (which subclasses SB3's VecEnv) so that a worker process imports only the
env, gymnasium and numpy — never torch or stable-baselines3.

An ``EnvBlock`` steps its envs one after another with SB3's VecEnv semantics (those of DummyVecEnv):
``info["TimeLimit.truncated"] = truncated and not terminated``; a finished env is reset at once (without a
seed: the env's own schedule decides), its last observation goes to ``info["terminal_observation"]`` and
its reset info to ``reset_infos``. Observations, rewards (float32, as DummyVecEnv) and dones are written
into the rows of the caller's arrays, which for a worker are shared memory: only the actions and the infos
cross the pipe, once per block and step.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np


class EnvBlock:
    """Envs ``env_fns`` whose observations, rewards and dones live in rows of ``obs``, ``rew``, ``done``."""

    def __init__(
        self, env_fns: Sequence[Callable[[], gym.Env]], obs: np.ndarray, rew: np.ndarray, done: np.ndarray
    ) -> None:
        self.envs = [fn() for fn in env_fns]
        self.obs, self.rew, self.done = obs, rew, done
        self.reset_infos: list[dict[str, Any]] = [{} for _ in self.envs]

    def reset(self, seeds: Sequence[int | None], options: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        for j, env in enumerate(self.envs):
            maybe_options = {"options": options[j]} if options[j] else {}
            self.obs[j], self.reset_infos[j] = env.reset(seed=seeds[j], **maybe_options)
        return self.reset_infos

    def step(self, actions: np.ndarray) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
        """Step every env with its row of ``actions``; returns the infos and the reset infos of envs reset."""
        infos = []
        resets: dict[int, dict[str, Any]] = {}
        obs, rew, done = self.obs, self.rew, self.done
        for j, env in enumerate(self.envs):
            o, r, terminated, truncated, info = env.step(actions[j])
            d = terminated or truncated
            info["TimeLimit.truncated"] = truncated and not terminated
            if d:
                info["terminal_observation"] = o
                o, resets[j] = env.reset()
                self.reset_infos[j] = resets[j]
            obs[j] = o
            rew[j] = r
            done[j] = d
            infos.append(info)
        return infos, resets

    # ------------------------------------------------------------------ what VecEnv forwards to the envs
    def get_attr(self, idx: Sequence[int], name: str) -> list[Any]:
        return [self.envs[j].get_wrapper_attr(name) for j in idx]

    def set_attr(self, idx: Sequence[int], name: str, value: Any) -> None:
        for j in idx:
            setattr(self.envs[j], name, value)

    def env_method(self, idx: Sequence[int], name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        return [self.envs[j].get_wrapper_attr(name)(*args, **kwargs) for j in idx]

    def is_wrapped(self, idx: Sequence[int], wrapper: type[gym.Wrapper]) -> list[bool]:
        out = []
        for j in idx:
            env: Any = self.envs[j]
            found = False
            while isinstance(env, gym.Wrapper):
                if isinstance(env, wrapper):
                    found = True
                    break
                env = env.env
            out.append(found)
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


def worker(remote: Connection, parent_remote: Connection, env_fns: bytes, buffers: tuple[Any, ...], meta: Any) -> None:
    """A worker process: build an EnvBlock on rows ``lo:hi`` of the shared buffers and serve the pipe.

    ``env_fns`` is the block's env constructors, cloudpickled (closures and lambdas are allowed);
    ``meta`` is ``(lo, hi, obs_shape, obs_dtype)``. Every request is answered with ``("ok", result)`` or
    ``("error", traceback)``.
    """
    parent_remote.close()
    lo, hi, obs_shape, obs_dtype = meta
    raw_obs, raw_rew, raw_done = buffers
    obs = np.frombuffer(raw_obs, dtype=obs_dtype).reshape(-1, *obs_shape)[lo:hi]
    rew = np.frombuffer(raw_rew, dtype=np.float32)[lo:hi]
    done = np.frombuffer(raw_done, dtype=np.bool_)[lo:hi]
    block: EnvBlock | None = None
    while True:
        try:
            cmd, data = remote.recv()
        except (EOFError, KeyboardInterrupt):
            break
        try:
            if cmd == "step":
                assert block is not None
                result: Any = block.step(data)
            elif cmd == "init":
                block = EnvBlock(pickle.loads(env_fns), obs, rew, done)
                result = None
            elif cmd == "reset":
                assert block is not None
                result = block.reset(*data)
            elif cmd == "close":
                if block is not None:
                    block.close()
                remote.send(("ok", None))
                break
            else:  # get_attr, set_attr, env_method, is_wrapped
                assert block is not None
                result = getattr(block, cmd)(*data)
        except Exception:  # sent to the trainer, which raises it
            remote.send(("error", traceback.format_exc()))
            continue
        remote.send(("ok", result))
    remote.close()
