"""``admit control``: run a policy live against a gateway's admin API (gateway/control.py)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from pathlib import Path

import typer


def parse_interval(text: str) -> float:
    """``3s``, ``500ms``, ``1.5`` (seconds) -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise typer.BadParameter(f"expected a positive duration like 3s or 500ms, got {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]


def control(
    gateway: str = typer.Option(..., help="gateway base URL, e.g. http://127.0.0.1:8080"),
    policy: str = typer.Option("static", help="static | robust | aimd | ppo:DIR | llm:URL | ... (admit scenarios)"),
    interval: str = typer.Option("3s", help="time between decisions: 3s, 500ms"),
    admin_token: str | None = typer.Option(None, help="the gateway's admin token (or --admin-token-env)"),
    admin_token_env: str = typer.Option("ADMIT_ADMIN_TOKEN", help="environment variable holding the admin token"),
    scenario: str | None = typer.Option(None, help="take the ControlSpec (tenants, SLOs, bounds) from a scenario"),
    spec: str = typer.Option("gateway", help="'gateway': the ControlSpec from the gateway's config (GET /admin/spec)"),
    shadow: bool = typer.Option(False, help="log decisions without applying them"),
    act_timeout: str | None = typer.Option(None, help="deadline for one act() call (default: half the interval)"),
    max_failures: int = typer.Option(3, min=1, help="consecutive policy failures before falling back"),
    fallback: str = typer.Option("static", help="policy used after max-failures failures"),
    log: Path | None = typer.Option(None, help="JSONL decision log"),
    steps: int | None = typer.Option(None, min=1, help="stop after this many decisions (default: run until killed)"),
    start_on_traffic: bool = typer.Option(
        False, help="decide once now, then every interval from the first request's arrival (the simulator's clock)"),
) -> None:
    """Drive the gateway's per-tenant limits with a policy: observe, decide, clamp, apply, every interval."""
    from admit.controllers.registry import make_controller
    from admit.gateway.control import ControlLoop, GatewayClient
    from admit.gateway.telemetry import spec_from_json

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = admin_token or os.environ.get(admin_token_env)
    if not token:
        typer.secho(f"error: no admin token (--admin-token or ${admin_token_env})", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    client = GatewayClient(gateway, token)
    try:
        gw_spec = spec_from_json(client.spec())
        if scenario is not None:
            from admit.envs.scenario import load_scenario

            cspec = load_scenario(scenario).control_spec()
            if [t.name for t in cspec.tenants] != [t.name for t in gw_spec.tenants]:
                raise ValueError(f"scenario tenants {[t.name for t in cspec.tenants]} are not the gateway's "
                                 f"{[t.name for t in gw_spec.tenants]} (same names, same order)")
        elif spec == "gateway":
            cspec = gw_spec
        else:
            raise ValueError(f"--spec takes 'gateway' (or use --scenario NAME), got {spec!r}")
        cspec = replace(cspec, interval_s=parse_interval(interval))
        pol = make_controller(policy)
        fb = make_controller(fallback)
    except (OSError, RuntimeError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    timeout = parse_interval(act_timeout) if act_timeout else None
    loop = ControlLoop(client, pol, cspec, shadow=shadow, act_timeout_s=timeout, max_failures=max_failures,
                       fallback=fb, log_path=log, start_on_traffic=start_on_traffic)
    typer.echo(f"controlling {gateway} with {pol.name} every {cspec.interval_s:g} s"
               f"{' from the first request' if start_on_traffic else ''}{' (shadow)' if shadow else ''}", err=True)
    try:
        stats = loop.run(steps)
    except KeyboardInterrupt:
        stats = loop.stats
    finally:
        loop.close()
    typer.echo(f"decisions {stats.decisions}, applied {stats.applied}, unchanged {stats.unchanged}, "
               f"shadow {stats.shadow}, failures {dict(stats.failures)}, fallbacks {stats.fallbacks}, "
               f"fetch errors {stats.fetch_errors}, apply errors {stats.apply_errors}")
