"""``admit gateway``: the per-tenant admission gateway in front of an OpenAI-compatible backend."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
from pathlib import Path

import typer


def gateway(
    backend: str = typer.Option(..., help="base URL of the OpenAI-compatible backend, e.g. http://127.0.0.1:8000"),
    config: Path = typer.Option(..., help="tenants YAML (see docs/gateway.md)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8080, help="TCP port; 0 picks a free one (printed as 'listening on HOST:PORT')"),
    backend_key_env: str | None = typer.Option(
        None, help="environment variable holding an API key to send to the backend"
    ),
    workers: int = typer.Option(
        1, min=1, help="processes on one port (SO_REUSEPORT); more than 1 needs the 'redis:' section (shared state)"
    ),
    kueue: Path | None = typer.Option(
        None, help="Kueue objects (LocalQueues, ClusterQueues; YAML): each tenant's limit, min_limit, max_limit and "
        "borrow, and the capacity, from its ClusterQueue's quota (gateway/kueue.py, docs/deploy.md)"),
    kueue_resource: str = typer.Option(
        "admit.dev/concurrency", help="the Kueue resource whose quota counts a tenant's concurrent requests"),
) -> None:
    """Run the admission gateway: per-tenant limits, queues, rate envelopes, admin API, /metrics."""
    from admit.gateway import logs
    from admit.gateway.app import Gateway
    from admit.gateway.config import ConfigError, load_config
    from admit.gateway.server import run, run_workers

    logs.configure(0)  # the start-up lines; the configuration's rate limit applies once it is read
    # `kill -USR1 PID` writes every thread's stack to stderr: where a gateway that stopped answering is stuck
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        if kueue is None:
            cfg = load_config(config)
        else:
            from admit.gateway.kueue import load_with_kueue

            cfg, bounds = load_with_kueue(config, kueue, kueue_resource)
            log = logging.getLogger("admit.gateway.kueue")
            for q in bounds.tenants:
                log.info("tenant %s: LocalQueue %s -> ClusterQueue %s%s: limit = min_limit = %d, max_limit %d, "
                         "borrow %d", q.tenant, q.local_queue, q.cluster_queue,
                         f" (cohort {q.cohort})" if q.cohort else "", q.nominal, q.ceiling, q.borrow)
            if bounds.capacity is not None:
                log.info("capacity %d (the cohort's pool)", bounds.capacity)
            for note in bounds.notes:
                log.warning("%s", note)
    except ConfigError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if not backend.startswith(("http://", "https://")):
        typer.secho("error: --backend must be an http:// or https:// URL", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    key = os.environ.get(backend_key_env) if backend_key_env else None
    limit = logs.configure(cfg.log_lines_per_s)

    def make_app() -> Gateway:
        app = Gateway(cfg, backend, key)
        if limit is not None:
            app.metrics.counter("log_lines_suppressed", "process-log lines left out by its rate limit "
                                "(gateway/logs.py)", lambda: limit.suppressed)
        return app

    if workers > 1:
        if cfg.redis is None:
            typer.secho(
                f"error: --workers {workers} needs a 'redis:' section in the config: the worker processes share "
                "no memory, so limits, queues' leases and rate envelopes must live in Redis (see docs/gateway.md)",
                fg=typer.colors.RED, err=True,
            )
            raise typer.Exit(2)
        raise typer.Exit(run_workers(make_app, host, port, workers))
    run(make_app(), host, port)
