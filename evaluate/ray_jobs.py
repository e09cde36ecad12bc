"""Evaluation episodes as Ray tasks: ``admit evaluate --ray ADDRESS`` (Ray is an optional extra,
``pip install 'admit[ray]'``; nothing else needs it).

Each (policy, seed) episode of an evaluation is one Ray task running the very function a local worker runs
(evaluate/offline.py's ``_job``), and the results come back in the order the local run builds them, so an
evaluation on Ray is the local one, figure for figure: an episode is a function of its scenario, policy
and seed alone (each seed's draws come from the seed, the common random numbers of the comparison), not
of where it ran. The scenario is put in Ray's object store once and shared by every task.

``address``: ``local`` starts a Ray instance inside this process for the evaluation (on this machine's cores)
and stops it after; its workers run at this process's priority (Ray nices its workers to 15 by default, to
keep a driver responsive, and on a machine something else keeps busy they then get almost no CPU: an `admit
tune` took 7x longer beside two busy loops); ``auto`` joins the cluster that ``RAY_ADDRESS`` or a ``ray start
--head`` on this machine names; anything else — a head's ``HOST:PORT``, or ``ray://HOST:10001`` for Ray Client
— is handed to ``ray.init(address=...)``. Ray's workers must import admit: on one machine they run the
driver's Python; on a cluster install admit (the same version) on every node, or start the job with a
runtime_env that does. A policy that looks its tuned caps up (static:best) looks them up on the worker as a
local run does, shipped ones first; a node that has neither the shipped nor the cached caps tunes them itself,
on the same seeds, to the same caps.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from admit.envs.scenario import Scenario
from admit.evaluate.offline import Episode, _job

INSTALL = "pip install 'admit[ray]'"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError(f"--ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def _check_reachable(address: str) -> None:
    """A head's HOST:PORT (or ray://HOST:PORT) must accept a connection; Ray itself retries an unreachable one for
    minutes before it gives up."""
    if address in ("local", "auto"):
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise RuntimeError(f"--ray {address!r}: expected 'local', 'auto', HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise RuntimeError(f"--ray {address}: nothing accepts connections there ({exc}); is `ray start --head` "
                           "running, and is that its address?") from None


def _episode(sc: Scenario, policy: str, seed: int) -> Episode:
    """One task: exactly what a local worker runs for (policy, seed)."""
    return _job((sc, policy, seed))


@contextlib.contextmanager
def session(address: str) -> Iterator[Any]:
    """Ray, joined or started on ``address`` (module doc) for the body, and shut down after it if this call
    started it; inside an existing session (``ray.is_initialized()``) it joins nothing and stops nothing, so
    that a sweep over many evaluations (``admit results --ray``) pays Ray's start-up once. RuntimeError,
    saying what was wrong, when Ray is missing or the cluster cannot be reached."""
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        _check_reachable(address)
        opts: dict[str, Any] = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": False}
        try:
            if address == "local":  # workers at the driver's priority, not Ray's default nice 15 (module doc)
                ray.init(**opts, _system_config={"worker_niceness": 0})
            else:
                ray.init(address=address, **opts)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RuntimeError(f"--ray {address}: could not start or join a Ray cluster there ({exc}); give "
                               "'local', 'auto' or a head's HOST:PORT") from None
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


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
