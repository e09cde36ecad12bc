"""The live verbs: ``admit control`` (a policy against a gateway's admin API, live/control.py), ``admit demo``
(the whole loop on one machine, live/demo.py), ``admit protocol`` (repeats × policies live with statistics,
live/protocol.py) and ``admit sim2live`` (simulator vs live, live/sim2live.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # imported where used: `admit --help` stays fast
    from admit.core.controller import Controller
    from admit.core.spec import ControlSpec
    from admit.envs.scenario import Scenario
    from admit.live.control import GatewayClient


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
    calibration: Path | None = typer.Option(
        None, exists=True, dir_okay=False,
        help="with --scenario: an `admit calibrate` result of the backend; the policy is bound to the scenario on "
        "that fit of the engine (static:best deploys caps tuned on it) instead of the scenario's preset"),
) -> None:
    """Drive the gateway's per-tenant limits with a policy: observe, decide, clamp, apply, every interval."""
    from admit.agents.registry import make_controller
    from admit.core.wire import spec_from_json
    from admit.live.control import GatewayClient

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = admin_token or os.environ.get(admin_token_env)
    if not token:
        typer.secho(f"error: no admin token (--admin-token or ${admin_token_env})", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    if calibration is not None and scenario is None:
        typer.secho("error: --calibration binds the policy to a scenario on the calibrated engine: give --scenario",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    client = GatewayClient(gateway, token)
    engines = contextlib.ExitStack()  # the calibrated engine, in effect while the loop runs
    try:
        gw_spec = spec_from_json(client.spec())
        bound = None
        if scenario is not None:
            from admit.envs.scenario import load_scenario

            bound = load_scenario(scenario)
            if calibration is not None:
                engines.enter_context(calibrated(bound, calibration))
            cspec = bound.control_spec()
            if [t.name for t in cspec.tenants] != [t.name for t in gw_spec.tenants]:
                raise ValueError(f"scenario tenants {[t.name for t in cspec.tenants]} are not the gateway's "
                                 f"{[t.name for t in gw_spec.tenants]} (same names, same order)")
        elif spec == "gateway":
            cspec = gw_spec
        else:
            raise ValueError(f"--spec takes 'gateway' (or use --scenario NAME), got {spec!r}")
        cspec = replace(cspec, interval_s=parse_interval(interval))
        pol = make_controller(policy, scenario=bound)  # static:best and the like find the scenario's own caps
        fb = make_controller(fallback)
    except (OSError, RuntimeError, ValueError) as exc:
        engines.close()
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    timeout = parse_interval(act_timeout) if act_timeout else None
    with engines:
        _run_loop(client, pol, fb, cspec, gateway, shadow, timeout, max_failures, log, start_on_traffic, steps)


def calibrated(sc: Scenario, calibration: Path) -> contextlib.AbstractContextManager[None]:
    """Within the block the scenario's engine preset is the fit of an `admit calibrate` result (ValueError on a
    file that is not one, or a scenario without a token engine)."""
    from admit.engine.presets import overriding, preset_from_calibration
    from admit.envs.scenario import TokenEngineConfig

    if not isinstance(sc.engine, TokenEngineConfig):
        raise ValueError(f"--calibration refits a token engine's preset; {sc.name} has a {sc.engine.kind} engine")
    try:
        return overriding(preset_from_calibration(json.loads(calibration.read_text()), sc.engine.preset))
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"--calibration {calibration}: {exc}") from None


def _run_loop(client: GatewayClient, pol: Controller, fb: Controller, cspec: ControlSpec, gateway: str, shadow: bool,
              timeout: float | None, max_failures: int, log: Path | None, start_on_traffic: bool,
              steps: int | None) -> None:
    from admit.live.control import ControlLoop

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
    scenario: str | None = typer.Option(
        None, help="token-engine scenario whose tenants interfere (default h200-mix@11000; with --backend, "
        "live/scenarios/cpu-smollm2-duo.yaml)"),
    duration: float = typer.Option(45.0, min=5, help="seconds of the scenario's requests per policy, judged"),
    warmup: float = typer.Option(20.0, min=0, help="seconds of requests played before those, not judged: the "
                                 "limits walk from the operator's to where the policy holds them"),
    policy: list[str] | None = typer.Option(
        None, help="policies, the first the baseline (repeat); one that does not load is left out, with a note "
        "(default: static:contract, static:best, contract, ppo:general-untuned)"),
    out: Path = typer.Option(Path("results/demo.json"), help="where to write the JSON"),
    seed: int = typer.Option(1, help="the seed of the requests (every policy gets the same)"),
    workdir: Path | None = typer.Option(None, help="keep logs and configs here (default: a temp dir, removed)"),
    backend: str | None = typer.Option(
        None, help="a running real vLLM server (http://HOST:PORT, e.g. scripts/vllm_server.sh's) instead of the "
        "emulator"),
) -> None:
    """The live stack on 127.0.0.1 (emulator, gateway, control loop, load) per policy on the same requests of
    a scenario whose tenants interfere: the tenants' contracts each policy kept and broke, per-tenant goodput
    and attainment, and a plot of each tenant's limit and in-contract attainment over time. With --backend, in
    front of a real vLLM server instead of the emulator."""
    from admit.envs.scenario import ScenarioError
    from admit.live.demo import POLICIES, SCENARIO, run_demo
    from admit.live.stack import cli_exit
    from rich.console import Console

    console = Console()
    if console.width < 132:
        console = Console(width=132)
    policies = list(policy or POLICIES)
    try:
        with cli_exit():
            if backend is not None:
                from admit.live.fidelity_real import SCENARIO as REAL_SCENARIO

                base = backend.rstrip("/").removesuffix("/v1")
                run_demo(scenario or str(REAL_SCENARIO), duration, policies, out, seed, workdir, console, base, warmup)
            else:
                run_demo(scenario or SCENARIO, duration, policies, out, seed, workdir, console, warmup=warmup)
    except (ScenarioError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def protocol(
    scenario: str = typer.Option(..., help="the scenario whose tenants, limits, SLOs and requests are played"),
    policy: list[str] = typer.Option(..., help="a policy, repeated; the first is the baseline of every test"),
    repeats: int = typer.Option(3, min=1, help="repeats: seeds seed-base, seed-base+1, ... (same requests per seed)"),
    duration: float = typer.Option(60.0, min=1, help="seconds of the scenario's requests per run"),
    out: Path = typer.Option(Path("results/protocol.json"), help="results JSON, written after every run; "
                             "rerunning the same command resumes it"),
    backend: str | None = typer.Option(
        None, help="a running OpenAI-compatible server with vLLM's /metrics (http://HOST:PORT); default: a fresh "
        "admit emulate per run"),
    seed_base: int = typer.Option(0, min=0, help="the first repeat's seed"),
    simulate: bool = typer.Option(False, help="also run the same protocol in the simulator and print it beside"),
    plot: Path | None = typer.Option(None, help="goodput vs worst-tenant attainment (Pareto) PNG"),
    workdir: Path | None = typer.Option(None, help="keep every run's logs and configs here (default: removed)"),
    calibration: Path | None = typer.Option(
        None, exists=True, dir_okay=False,
        help="an `admit calibrate --backend` result: the policies are bound to the scenario on its fit (static:best's "
        "caps tuned on it), live and in the twin, and the twin (--simulate) simulates it"),
    warmup: float = typer.Option(0.0, help="seconds at each run's start whose requests are served but left out "
                                 "of every figure (live and simulated); must be < --duration"),
    load: float = typer.Option(1.0, help="every tenant's arrival rate times this (e.g. 2: twice the scenario's "
                               "load, where admission starts to matter)"),
) -> None:
    """The study's protocol live: every policy once per repeat on the same requests (order shuffled per repeat,
    recorded), a cool-down between runs, admit evaluate's statistics over the valid repeats."""
    from admit.envs.scenario import ScenarioError
    from admit.live.protocol import run_protocol
    from admit.live.stack import cli_exit
    from rich.console import Console

    console = Console()
    if console.width < 132:
        console = Console(width=132)
    base = None if backend is None else backend.rstrip("/").removesuffix("/v1")
    try:
        with cli_exit():
            run_protocol(scenario, policy, repeats, duration, out, console, backend=base, seed_base=seed_base,
                         simulate=simulate, plot=plot, workdir=workdir, calibration=calibration, warmup=warmup,
                         load=load)
    except (ScenarioError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def sim2live(
    scenario: str | None = typer.Option(
        None, help="token-engine scenario (bundled name or YAML path); default h200-live-small on the emulator, "
        "live/scenarios/cpu-smollm2-duo.yaml with --backend"),
    policy: list[str] = typer.Option(["static"], help="policy run on both sides; repeat for several"),
    backend: str | None = typer.Option(
        None, help="a running real vLLM server (http://HOST:PORT) instead of a fresh emulator per run: the "
        "simulator against it at each --load, errors per figure (live/fidelity_real.py)"),
    load: list[float] = typer.Option(
        [], help="with --backend: multiples of the scenario's rates; repeat for several"),
    utilisation: list[float] = typer.Option(
        [], help="with --backend, instead of --load: shares of the engine's capacity as the preset estimates it "
        "(1 = saturated; default 0.25, 0.65, 1.05: light, near the knee, overloaded), so the same on any machine"),
    calibration: Path | None = typer.Option(
        None, help="with --backend: an `admit calibrate` result of that server; the simulator uses its fit"),
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
            if backend is not None:
                from admit.live.fidelity_real import run_real

                run_real(backend, scenario, policy, load, horizon, seed, out, doc, workdir, console, calibration,
                         utilisation)
            else:
                run_sim2live(scenario or "h200-live-small", policy, horizon, seed, out, doc, workdir, repeat, console)
    except (ScenarioError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def calibrate(
    backend: str = typer.Option(..., help="a running vLLM server's URL, e.g. http://127.0.0.1:8000 (or .../v1)"),
    model: str | None = typer.Option(None, help="the served model name (default: the server's first)"),
    out: Path = typer.Option(Path("results/calibration.json"), help="where to write the samples and the fit"),
    reps: int = typer.Option(3, min=1, max=20, help="repetitions of each prefill size (the median is fitted)"),
    quick: bool = typer.Option(False, help="a smaller design (about a minute on 2 CPU cores): a check, not a preset"),
    max_num_seqs: int = typer.Option(8, min=1, help="the server's --max-num-seqs (vLLM does not export it)"),
    max_num_batched_tokens: int = typer.Option(2048, min=1, help="the server's token budget per step (CPU default)"),
) -> None:
    """Measure a vLLM server with designed requests (prefill sizes, decode batch sizes and contexts) and fit
    the token engine's step-time model to it; prints each point against the fit."""
    import json

    from admit.live.calibrate import calibrate as run

    try:
        result = run(backend, model, reps, quick, echo=typer.echo, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens)
    except (ValueError, RuntimeError, OSError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    result["command"] = f"admit calibrate --backend URL --reps {reps}" + (" --quick" if quick else "")
    out.write_text(json.dumps(result, indent=1) + "\n")
    fit = ", ".join(f"{k} {v:.4g}" for k, v in result["fit"].items())
    typer.echo(f"fit: {fit}; request overhead {1000 * result['request_overhead_s']:.1f} ms")
    typer.echo(f"relative error: median {result['median_abs_relative_error']:.1%}, "
               f"max {result['max_abs_relative_error']:.1%}; wrote {out}")
