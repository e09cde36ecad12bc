"""A Ray session: Ray joined or started on an address for a block of work, and stopped after if it was started.

Ray is an optional extra (``pip install 'admit[ray]'``); ``admit evaluate --ray`` (evaluate/ray_jobs.py),
``admit results --ray`` and ``admit tune`` (train/hpo.py) run their work inside `session`. Nothing of admit is
imported here, and Ray only when a session opens.

``address``: ``local`` starts a Ray instance inside this process for the session (on this machine's cores)
and stops it after; its workers run at this process's priority (Ray nices its workers to 15 by default, to
keep a driver responsive, and on a machine something else keeps busy they then get almost no CPU;
docs/training.md has the slowdown); ``auto`` joins the cluster that ``RAY_ADDRESS`` or a ``ray start
--head`` on this machine names; anything else — a head's ``HOST:PORT``, or ``ray://HOST:10001`` for Ray Client
— is handed to ``ray.init(address=...)``.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

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
