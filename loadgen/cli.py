"""``admit loadgen``: run one stage, sweep a rate ladder, or start the mock server.

Examples::

    admit loadgen run --url http://127.0.0.1:8000 \\
        --tenant name=a,rate=20,arrival=poisson,prompt=256,output=64,api_key=sk-a \\
        --tenant name=b,rate=5,arrival=gamma,burstiness=0.5 --duration 30 --out runs/lg
    admit loadgen sweep --config load.yaml --ladder geometric --start 100 --stop 8000 --steps 8 --out runs/sw
    admit loadgen mock-server --port 18000 --itl-ms 2
    admit loadgen agent --listen 0.0.0.0:7700          # on each load host, then:
    admit loadgen run --agents 10.0.0.2:7700,10.0.0.3:7700 --url http://10.0.0.9:8000 -t name=a,rate=2000 --out r
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from admit.loadgen.config import (
    SLO_KEYS,
    ConfigError,
    RunConfig,
    SweepConfig,
    load_yaml,
    parse_tenant_flag,
    updated,
)
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Open-loop multi-process load generator.")
console = Console(stderr=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML run file (see docs/loadgen.md); flags override it."),
]
UrlOpt = Annotated[
    str | None, typer.Option(help="Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000")
]
TenantOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tenant",
        "-t",
        help="Repeatable. name=N,rate=R,arrival=constant|poisson|gamma|ramp|trace,burstiness=B,rate_start=R0,"
        "prompt=LEN,output=LEN,api_key=K,header=Name:Value,model=M,trace=PATH,trace_speedup=X,trace_tenant=T",
    ),
]
ApiOpt = Annotated[str | None, typer.Option(help="completions or chat")]
ModelOpt = Annotated[str | None, typer.Option(help="model name; default: the first id from GET /v1/models")]
DurationOpt = Annotated[float | None, typer.Option(help="seconds per stage")]
SeedOpt = Annotated[int | None, typer.Option(help="seed of every random draw")]
WorkersOpt = Annotated[int | None, typer.Option(help="worker processes (default: one per usable core)")]
TimeoutOpt = Annotated[float | None, typer.Option(help="request timeout in seconds")]
TenantHeaderOpt = Annotated[str | None, typer.Option(help="send each tenant's name in this header, e.g. X-Tenant")]
SloOpt = Annotated[
    str | None, typer.Option(help=f"SLOs in ms, e.g. ttft_ms=200,tpot_ms=50; keys: {', '.join(SLO_KEYS)}")
]
RetriesOpt = Annotated[int | None, typer.Option(help="retries of a 429/503 answer (honours Retry-After)")]
BudgetOpt = Annotated[float | None, typer.Option(help="retry budget: retries per first attempt over 10 s")]
ThrottleOpt = Annotated[
    bool | None, typer.Option("--throttle/--no-throttle", help="Google SRE adaptive throttling (K=2)")
]
LagOpt = Annotated[float | None, typer.Option(help="send-lag p99 bound for a valid stage, ms")]
WarmupOpt = Annotated[float | None, typer.Option(help="seconds at the start kept out of the latency histograms")]
OutOpt = Annotated[Path, typer.Option(help="directory for the JSON, CSV and PNG reports")]
PlotOpt = Annotated[bool, typer.Option("--plot/--no-plot", help="write latency_vs_throughput.png")]
StrictOpt = Annotated[bool, typer.Option(help="exit with status 3 when a stage fails the generator self-check")]


def _fail(msg: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {msg}")
    return typer.Exit(2)


def _parse_slo(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in SLO_KEYS:
            raise ConfigError(f"--slo: {part!r} is not KEY=MS with KEY one of {', '.join(SLO_KEYS)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ConfigError(f"--slo: {key} needs a number of milliseconds, got {value!r}") from None
    return out


def build_config(
    config: Path | None, overrides: dict[str, Any], tenants: list[str] | None, slo: str | None
) -> RunConfig:
    cfg = load_yaml(config) if config else RunConfig()
    values = {key: value for key, value in overrides.items() if value is not None}
    if tenants:
        values["tenants"] = [parse_tenant_flag(t) for t in tenants]
    if slo:
        values["slo"] = _parse_slo(slo)
    return updated(cfg, values, "command line")


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), console=console, transient=True
    )


def _resolve_model(cfg: RunConfig) -> str:
    from admit.loadgen.runner import discover_model

    if cfg.model:
        return cfg.model
    if all(t.model for t in cfg.tenants):
        return cfg.tenants[0].model or ""
    return discover_model(cfg)


# Flags that override the same-named keys of the YAML config (None = not given on the command line).
_OVERRIDE_KEYS = (
    "url",
    "api",
    "model",
    "duration",
    "seed",
    "workers",
    "timeout",
    "tenant_header",
    "max_retries",
    "retry_budget",
    "throttle",
    "lag_bound_ms",
    "warmup",
)


def _overrides(args: dict) -> dict:
    """The command's override flags, by name, from its arguments."""
    return {k: args[k] for k in _OVERRIDE_KEYS if k in args}


@app.command()
def run(
    out: OutOpt,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    tenant: TenantOpt = None,
    api: ApiOpt = None,
    model: ModelOpt = None,
    duration: DurationOpt = None,
    seed: SeedOpt = None,
    workers: WorkersOpt = None,
    timeout: TimeoutOpt = None,
    tenant_header: TenantHeaderOpt = None,
    slo: SloOpt = None,
    max_retries: RetriesOpt = None,
    retry_budget: BudgetOpt = None,
    throttle: ThrottleOpt = None,
    lag_bound_ms: LagOpt = None,
    warmup: WarmupOpt = None,
    plot: PlotOpt = True,
    strict: StrictOpt = False,
    agents: Annotated[
        str | None,
        typer.Option(help="HOST:PORT,HOST:PORT of `admit loadgen agent`s: split the stage across them "
                     "(--workers is then per agent)"),
    ] = None,
    max_clock_offset_ms: Annotated[
        float, typer.Option(help="with --agents: refuse to run when an agent's clock is off by more (ms)")
    ] = 50.0,
) -> None:
    """Run one open-loop stage against a server and write the reports."""
    from admit.loadgen.report import console_table, hosts_table, stage_summary, write_reports
    from admit.loadgen.runner import StageError, run_stage

    overrides = _overrides(locals())
    try:
        cfg = build_config(config, overrides, tenant, slo).checked()
        model_name = _resolve_model(cfg)
        with _progress() as prog:
            task = prog.add_task(f"{cfg.total_rate:g} req/s for {cfg.duration:g} s", total=1.0)
            if agents:
                from admit.loadgen.coordinator import parse_agents, run_stage_on_agents

                result = run_stage_on_agents(cfg, model_name, parse_agents(agents), max_clock_offset_ms,
                                             on_tick=lambda f: prog.update(task, completed=f))
            else:
                result = run_stage(cfg, model_name, on_tick=lambda f: prog.update(task, completed=f))
    except (ConfigError, ValueError) as exc:
        raise _fail(str(exc)) from None
    except StageError as exc:
        raise _fail(f"the stage could not run: {exc}") from None
    summary = stage_summary(result)
    paths = write_reports(out, [summary], {"model": model_name, "url": cfg.url}, plot=plot)
    Console().print(console_table([summary]))
    if summary.get("hosts"):
        Console().print(hosts_table(summary))
    console.print(f"reports in {out} ({', '.join(p.name for p in paths.values())})")
    if strict and not summary["valid"]:
        raise typer.Exit(3)


@app.command()
def sweep(
    out: OutOpt,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    tenant: TenantOpt = None,
    api: ApiOpt = None,
    model: ModelOpt = None,
    duration: DurationOpt = None,
    seed: SeedOpt = None,
    workers: WorkersOpt = None,
    timeout: TimeoutOpt = None,
    tenant_header: TenantHeaderOpt = None,
    slo: SloOpt = None,
    lag_bound_ms: LagOpt = None,
    warmup: WarmupOpt = None,
    ladder: Annotated[str | None, typer.Option(help="linear or geometric")] = None,
    start: Annotated[float | None, typer.Option(help="first total rate, req/s")] = None,
    stop: Annotated[float | None, typer.Option(help="last total rate, req/s")] = None,
    steps: Annotated[int | None, typer.Option(help="number of stages")] = None,
    min_achieved: Annotated[float | None, typer.Option(help="stop when achieved/requested falls below this")] = None,
    max_error_rate: Annotated[float | None, typer.Option(help="stop when failed/sent exceeds this")] = None,
    plot: PlotOpt = True,
) -> None:
    """Step the total rate over a ladder (tenants keep their proportions) until saturation; find the knee."""
    from admit.loadgen.report import console_table, stage_summary, write_reports
    from admit.loadgen.runner import StageError
    from admit.loadgen.sweep import run_sweep

    overrides = _overrides(locals())
    try:
        cfg = build_config(config, overrides, tenant, slo)
        ladder_flags = dict(
            ladder=ladder,
            start=start,
            stop=stop,
            steps=steps,
            min_achieved=min_achieved,
            max_error_rate=max_error_rate,
        )
        sw = updated(cfg.sweep or SweepConfig(), {k: v for k, v in ladder_flags.items() if v is not None},
                     "command line: sweep")
        cfg = updated(cfg, {"sweep": sw}, "command line")
        cfg.checked()
        model_name = _resolve_model(cfg)
        summaries: list[dict] = []
        with _progress() as prog:
            rates = sw.rates()
            tasks = [prog.add_task(f"stage {i}: {r:.0f} req/s", total=1.0) for i, r in enumerate(rates)]

            def on_stage(r, reasons):
                summaries.append(stage_summary(r))
                note = "; ".join(reasons) if reasons else "ok"
                rates = f"asked {r.target_rate:.0f}, achieved {r.achieved_rate:.0f} req/s"
                prog.console.print(f"stage {r.stage}: {rates} — {note}")

            res = run_sweep(cfg, model_name, on_stage, lambda i, f: prog.update(tasks[i], completed=f))
    except (ConfigError, ValueError) as exc:
        raise _fail(str(exc)) from None
    except StageError as exc:
        raise _fail(f"a stage could not run: {exc}") from None
    extra = {
        "model": model_name,
        "url": cfg.url,
        "stop_reason": res.stop_reason,
        "max_sustainable_rate": res.max_sustainable_rate,
        "knee_rate": res.knee_rate,
    }
    write_reports(out, summaries, extra, plot=plot)
    Console().print(console_table(summaries, title="admit loadgen sweep"))
    console.print(f"max sustainable rate: {res.max_sustainable_rate}; knee: {res.knee_rate}; stop: {res.stop_reason}")
    console.print(f"reports in {out}")


@app.command("mock-server")
def mock_server(
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 18000,
    host: str = "127.0.0.1",
    ttft_ms: Annotated[float, typer.Option(help="delay before the first token")] = 0.0,
    itl_ms: Annotated[float, typer.Option(help="delay between tokens")] = 0.0,
    retry_after: Annotated[float, typer.Option(help="Retry-After seconds on injected 429/503")] = 0.0,
) -> None:
    """Serve a fast OpenAI-compatible streaming mock with fixed delays (for tests and benchmarks)."""
    from admit.loadgen.mockserver import main

    main(
        [
            "--host",
            host,
            "--port",
            str(port),
            "--ttft-ms",
            str(ttft_ms),
            "--itl-ms",
            str(itl_ms),
            "--retry-after",
            str(retry_after),
        ]
    )


@app.command()
def agent(
    listen: Annotated[str, typer.Option(help="HOST:PORT to accept a coordinator on (port 0 picks a free one)")],
    clock_skew_ms: Annotated[
        float, typer.Option(help="TEST ONLY: pretend this host's wall clock is off by this much", hidden=True)
    ] = 0.0,
    delay_start_ms: Annotated[
        float, typer.Option(help="TEST ONLY: start the workers this much after the agreed start", hidden=True)
    ] = 0.0,
) -> None:
    """Run the shares of stages that a coordinator (`admit loadgen run --agents ...`) sends to this host."""
    from admit.loadgen.agent import serve

    try:
        serve(listen, clock_skew_ms, delay_start_ms)
    except (ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
