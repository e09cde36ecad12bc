"""SB3 callbacks for ``admit train``: episode metrics to TensorBoard, seeded evaluation, progress bar.

- ``EpisodeMetricsLogger`` reads the env's ``info`` (see admit.envs.env) and logs, averaged over the
  episodes that ended since the last dump: ``episode/reward`` (the raw, unnormalised return), every term of
  ``info["reward_terms"]`` summed over the episode (``episode/reward_terms/<term>``), the episode metrics
  at truncation (``episode/goodput_rps``, ``episode/attainment``, ``episode/worst_attainment``,
  ``episode/throughput_rps``, ``episode/p99_s``, ``episode/dropped``, ...) and the mean
  per-tenant limit (``episode/mean_limit``), which shows what a policy learned to do with the lever.
- ``SeededEvalCallback`` is SB3's EvalCallback, but every evaluation restarts the validation seed
  schedule (admit.train.wrappers.EpisodeSeeds), so all evaluations score the same episodes and the
  "best model" is chosen on a fixed validation set.
- ``SaveVecNormalize`` saves the normalisation statistics next to a saved best model, so the best model's
  folder loads like the final one.
- ``UpdateThreads`` gives torch one thread count while the rollout runs and another for the update: during
  a rollout the trainer shares the cores with its env workers, during the update those workers wait.
- ``RichProgress`` is a progress bar on ``rich`` (already a dependency of the command line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback

EPISODE_METRICS = (
    "goodput_rps", "attainment", "worst_attainment", "throughput_rps", "p99_s", "p50_s", "ttft_p99_s", "dropped",
    "slo_attainment", "jain_fairness",
)


class EpisodeMetricsLogger(BaseCallback):
    """Log every episode's return, reward terms, throughput, p99, drops and mean limit."""

    def _on_training_start(self) -> None:
        n = self.training_env.num_envs
        # plain Python lists and arithmetic: this runs for every env at every step, in the trainer process
        self._reward = [0.0] * n
        self._terms: list[dict[str, float]] = [{} for _ in range(n)]
        self._limit_sum = [0.0] * n
        self._steps = [0] * n

    def _on_step(self) -> bool:
        infos: list[dict[str, Any]] = self.locals["infos"]
        for i, info in enumerate(infos):
            terms = info.get("reward_terms")
            if terms is None:
                continue
            acc = self._terms[i]
            for name, value in terms.items():
                acc[name] = acc.get(name, 0.0) + value
            self._reward[i] += sum(terms.values())
            limits = info["limits"]
            self._limit_sum[i] += sum(limits) / len(limits)
            self._steps[i] += 1
            metrics = info.get("episode_metrics")
            if metrics is not None:
                self._end_episode(i, metrics)
        return True

    def _end_episode(self, i: int, metrics: dict[str, float]) -> None:
        record = self.logger.record_mean
        record("episode/reward", float(self._reward[i]))
        for name, value in self._terms[i].items():
            record(f"episode/reward_terms/{name}", value)
        for name in EPISODE_METRICS:
            if name in metrics:
                record(f"episode/{name}", float(metrics[name]))
        record("episode/mean_limit", float(self._limit_sum[i] / max(self._steps[i], 1)))
        self._reward[i] = 0.0
        self._terms[i] = {}
        self._limit_sum[i] = 0.0
        self._steps[i] = 0


class UpdateThreads(BaseCallback):
    """``torch.set_num_threads(rollout)`` when a rollout starts, ``(update)`` when it ends (the update follows)."""

    def __init__(self, rollout: int, update: int) -> None:
        super().__init__()
        if rollout < 1 or update < 1:
            raise ValueError(f"thread counts must be >= 1, got rollout={rollout}, update={update}")
        self.rollout, self.update = rollout, update

    def _on_rollout_start(self) -> None:
        torch.set_num_threads(self.rollout)

    def _on_rollout_end(self) -> None:
        torch.set_num_threads(self.update)

    def _on_training_end(self) -> None:
        torch.set_num_threads(self.rollout)

    def _on_step(self) -> bool:
        return True


class SeededEvalCallback(EvalCallback):
    """EvalCallback whose every evaluation starts the validation envs' seed schedule from the beginning."""

    def _on_step(self) -> bool:
        if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
            self.eval_env.env_method("restart")
        return super()._on_step()


class SaveVecNormalize(BaseCallback):
    """Save the VecNormalize statistics to ``path`` (used as EvalCallback's callback_on_new_best)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)

    def _on_step(self) -> bool:
        vec_normalize = self.model.get_vec_normalize_env()
        if vec_normalize is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            vec_normalize.save(str(self.path))
        return True


class RichProgress(BaseCallback):
    """A progress bar over env steps, refreshed every ``every`` calls (each call is n_envs steps)."""

    def __init__(self, every: int = 64) -> None:
        super().__init__()
        self.every = every
        self._progress: Progress | None = None

    def _on_training_start(self) -> None:
        self._progress = Progress(
            TextColumn("training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=self.locals["total_timesteps"])

    def _on_step(self) -> bool:
        if self._progress is not None and self.n_calls % self.every == 0:
            self._progress.update(self._task, completed=self.num_timesteps)
        return True

    def _on_training_end(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=self.num_timesteps)
            self._progress.stop()
