"""The live verbs: ``admit control`` (a policy against a gateway's admin API, live/control.py), ``admit demo``
(the whole loop on one machine, live/demo.py) and ``admit sim2live`` (simulator vs live, live/sim2live.py)."""

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
    from admit.core.wire import spec_from_json
    from admit.live.control import ControlLoop, GatewayClient

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


def demo(
    scenario: str = typer.Option("long-context-chat", help="token-engine scenario whose tenants interfere"),
    duration: float = typer.Option(45.0, min=5, help="seconds of the scenario's requests per policy"),
    policy: list[str] = typer.Option(
        ["static:best", "token:best", "ppo:general"],
        help="policies, the first the baseline (repeat); one that does not load is left out, with a note"),
    out: Path = typer.Option(Path("results/demo.json"), help="where to write the JSON"),
    seed: int = typer.Option(1, help="the seed of the requests (every policy gets the same)"),
    workdir: Path | None = typer.Option(None, help="keep logs and configs here (default: a temp dir, removed)"),
) -> None:
    """The live stack on 127.0.0.1 (emulator, gateway, control loop, load) per policy on the same requests of
    a scenario whose tenants interfere; per-tenant goodput and attainment."""
    from admit.envs.scenario import ScenarioError
    from admit.live.demo import run_demo
    from admit.live.stack import cli_exit
    from rich.console import Console

    console = Console()
    if console.width < 132:
        console = Console(width=132)
    try:
        with cli_exit():
            run_demo(scenario, duration, policy, out, seed, workdir, console)
    except (ScenarioError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def sim2live(
    scenario: str = typer.Option("h200-live-small", help="token-engine scenario (bundled name or YAML path)"),
    policy: list[str] = typer.Option(["static"], help="policy run on both sides; repeat for several"),
    horizon: float | None = typer.Option(None, min=10, help="shorten the scenario's horizon to this many seconds"),
    seed: int = typer.Option(0, help="the episode seed whose requests both sides get"),
    out: Path = typer.Option(Path("results/sim2live.json"), help="where to write the JSON"),
    doc: Path | None = typer.Option(None, help="also write the tables as the sim-to-live section of this markdown"),
    workdir: Path | None = typer.Option(None, help="keep logs, configs and the trace here"),
    repeat: int = typer.Option(1, min=1, help="live runs per policy (the simulator is deterministic): median, spread"),
) -> None:
    """Run a scenario and policies in the simulator and live on the same requests; compare throughput and p99."""
    from admit.envs.scenario import ScenarioError
    from admit.live.sim2live import run_sim2live
    from admit.live.stack import cli_exit
    from rich.console import Console

    console = Console(width=120)
    try:
        with cli_exit():
            run_sim2live(scenario, policy, horizon, seed, out, doc, workdir, repeat, console)
    except (ScenarioError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
