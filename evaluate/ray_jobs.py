"""Evaluation episodes as Ray tasks: ``admit evaluate --ray ADDRESS`` (Ray is an optional extra,
``pip install 'admit[ray]'``; nothing else needs it).

Each (policy, seed) episode of an evaluation is one Ray task running the very function a local worker runs
(evaluate/offline.py's ``_job``), and the results come back in the order the local run builds them, so an
evaluation on Ray is the local one, figure for figure: an episode is a function of its scenario, policy
and seed alone (each seed's draws come from the seed, the common random numbers of the comparison), not
of where it ran. The scenario is put in Ray's object store once and shared by every task.

``address`` is `admit.core.ray_session.session`'s: ``local``, ``auto``, a head's ``HOST:PORT`` or
``ray://HOST:10001``. Ray's workers must import admit: on one machine they run the driver's Python; on a
cluster install admit (the same version) on every node, or start the job with a runtime_env that does. A
policy that looks its tuned caps up (static:best) looks them up on the worker as a local run does, shipped
ones first; a node that has neither the shipped nor the cached caps tunes them itself, on the same seeds, to
the same caps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from admit.core.ray_session import session
from admit.envs.scenario import Scenario
from admit.evaluate.offline import Episode, _job


def _episode(sc: Scenario, policy: str, seed: int) -> Episode:
    """One task: exactly what a local worker runs for (policy, seed)."""
    return _job((sc, policy, seed))


def run_episodes(sc: Scenario, jobs: Sequence[tuple[str, int]], address: str,
                 progress: Callable[[int, int], None] | None = None) -> list[Episode]:
    """The episodes of ``jobs`` ((policy, seed) pairs), run as Ray tasks on ``address`` (module doc; within a
    `session` when one is open), in the order of ``jobs``. RuntimeError when Ray is missing or the cluster
    cannot be reached; a task that fails raises its error here."""
    with session(address) as ray:
        task = ray.remote(num_cpus=1)(_episode)
        shared = ray.put(sc)
        refs = [task.remote(shared, p, s) for p, s in jobs]
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            done += len(ready)
            if progress:
                progress(done, len(refs))
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayTaskError as exc:  # the task's own error, as a local run would raise it
            raise exc.as_instanceof_cause() from None
