"""``admit train``: train an SB3 policy (PPO, A2C, DQN, SAC) on a scenario and write a loadable run folder;
``admit tune``: tune a training's hyperparameters (train/hpo.py); ``admit search-static``: search static:best's
per-tenant caps (train/static_search.py). "Tune" is hyperparameter tuning only; ``admit tune-static``, the caps
search's former name, stays a hidden alias of ``search-static`` so command lines already written keep working.

Registered in admit/cli.py; stable-baselines3 and torch are imported only when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from admit.train.config import TrainConfig


def train(
    algo: str | None = typer.Option(None, help="ppo | a2c | dqn | sac (overrides the config file; default ppo)"),
    scenario: str | None = typer.Option(None, help="bundled scenario name or path to a scenario YAML"),
    family: str | None = typer.Option(
        None, help="train across a scenario family's train seeds (bundled name or YAML path; tenant-set policy)"
    ),
    timesteps: int | None = typer.Option(None, help="env steps to train for (default 100000)"),
    n_envs: int | None = typer.Option(None, "--n-envs", help="parallel envs (default 4)"),
    seed: int | None = typer.Option(None, help="run seed: algorithm and training-workload seeds (default 0)"),
    seeds: str | None = typer.Option(
        None, help="one run per seed (A..B inclusive or A,B,C) into OUT/seed-S/, and OUT/seeds.json: each "
        "seed's validation returns and their spread (instead of --seed)"
    ),
    vec_env: str | None = typer.Option(
        None, "--vec-env", help="dummy | subproc | block | worlds (default dummy; block: envs stepped in blocks on all "
        "cores; worlds: the native vector env, an MLP policy on one scenario)"
    ),
    vec_workers: int | None = typer.Option(
        None, "--vec-workers", help="block: worker processes besides the trainer's own block (default 1)"
    ),
    sets: list[str] | None = typer.Option(
        None, "--set", help="override any config key, dotted: --set hyperparams.batch_size=1024 (repeatable)"
    ),
    config: Path | None = typer.Option(None, help="training config YAML (schema: admit.train.config)"),
    out: Path = typer.Option(..., help="run folder, e.g. runs/NAME/"),
    progress: bool = typer.Option(True, help="show a progress bar"),
) -> None:
    """Train a policy; writes model.zip, vecnormalize.pkl, config.yaml, TensorBoard logs, checkpoints."""
    from admit.envs.scenario import ScenarioError
    from admit.train.config import TrainConfigError, load_config
    from admit.train.static_search import parse_seeds

    try:
        if seeds is not None and seed is not None:
            raise TrainConfigError("give --seed (one run) or --seeds (one run per seed), not both")
        seed_list = parse_seeds(seeds) if seeds is not None else None
        cfg = load_config(
            config,
            sets=sets,
            algo=algo,
            scenario=scenario,
            family=family,
            timesteps=timesteps,
            n_envs=n_envs,
            seed=seed,
            vec_env=vec_env,
            vec_workers=vec_workers,
        )
        from admit.envs.scenario import load_scenario

        if cfg.family is not None:
            from admit.envs.family import load_family

            for fam in [cfg.family] if isinstance(cfg.family, str) else cfg.family:
                load_family(fam)  # fail before importing torch
        else:
            load_scenario(cfg.scenario)  # fail before importing torch
    except (TrainConfigError, ScenarioError, ValueError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None

    if seed_list is not None:
        _train_seeds(cfg, seed_list, out, progress)
        return
    from admit.train.trainer import train as run_train

    _say_trained(run_train(cfg, out, progress=progress), out)


def _train_seeds(cfg: TrainConfig, seeds: list[int], out: Path, progress: bool) -> None:
    from admit.train.trainer import SEEDS_FILE, train_seeds

    report = train_seeds(cfg, seeds, out, progress, on_run=lambda s, summary: _say_trained(summary, out / f"seed-{s}"))
    typer.echo(f"{len(seeds)} runs in {report['wall_s']:.0f} s")
    if "validation_return_best" in report:
        b = report["validation_return_best"]
        typer.echo(f"best validation return over the seeds: mean {b['mean']:.2f} (95% interval {b['ci95'][0]:.2f} "
                   f"to {b['ci95'][1]:.2f}), {b['min']:.2f} to {b['max']:.2f}; the best is seed {report['best_seed']}"
                   + (f"; {report['above_hold']} of {len(seeds)} above holding the anchors (0)"
                      if "above_hold" in report else ""))
    typer.echo(f"wrote {out / SEEDS_FILE}")


def _say_trained(summary: dict, out: Path) -> None:
    for r in summary["imitation"]:
        typer.echo(f"imitation round {r['round']}: {r['samples']} samples, loss {r['loss']:.3f}, "
                   f"accuracy {r['accuracy']:.3f}")
    if summary["imitation"]:
        typer.echo(f"imitated static:best's caps in {summary['imitation_s']:.1f} s "
                   f"(their search {summary['caps_tuning_s']:.1f} s)")
    if summary["timesteps"] > 0:
        typer.echo(
            f"trained {summary['algo']} on {summary['scenario']}: {summary['timesteps']} steps in "
            f"{summary['wall_s']:.1f} s ({summary['env_steps_per_s']:.0f} steps/s)"
        )
    if "validation_return_best" in summary:
        typer.echo(
            f"validation return: last {summary['validation_return_last']:.1f}, "
            f"best {summary['validation_return_best']:.1f}"
        )
    typer.echo(f"wrote {out}/ (evaluate with --policy {summary['algo']}:{out})")


def tune(
    algo: str | None = typer.Option(None, help="ppo | a2c | dqn | sac (overrides the config file; default ppo)"),
    scenario: str | None = typer.Option(None, help="bundled scenario name or path to a scenario YAML"),
    family: str | None = typer.Option(None, help="train and validate on a scenario family (tenant-set policy)"),
    trials: int = typer.Option(..., min=1, help="trials (training runs) in all"),
    timesteps: int | None = typer.Option(None, help="env steps per trial (default: the config's)"),
    config: Path | None = typer.Option(None, help="base training config YAML (admit train's schema)"),
    sets: list[str] | None = typer.Option(None, "--set", help="override a base config key, dotted (repeatable)"),
    space: Path | None = typer.Option(None, help="search space YAML (train/hpo.py); default: the algorithm's"),
    validation: int = typer.Option(4, min=1, help="validation worlds each trial is scored on (goodput)"),
    ray: str = typer.Option("local", help="Ray cluster: 'local' (this machine), 'auto' or a head's HOST:PORT"),
    concurrent: int = typer.Option(2, min=1, help="trials at once (one CPU each)"),
    seed: int = typer.Option(0, min=0, help="the search's seed (Optuna's sampler)"),
    out: Path = typer.Option(..., help="search folder: trials/, trials.json, best.yaml, best.json, ray/"),
) -> None:
    """Search training hyperparameters: Ray Tune trials of `admit train`, Optuna's proposals, each trial scored on
    validation goodput; writes the best config. The same command again resumes an interrupted search."""
    from admit.envs.scenario import ScenarioError
    from admit.train.config import TrainConfigError, load_config
    from admit.train.hpo import TuneError, load_space, run

    try:
        cfg = load_config(config, sets=sets, algo=algo, scenario=_absolute(scenario),
                          family=_absolute(family), timesteps=timesteps)
        chosen = load_space(space, cfg.algo)
        typer.echo(f"tuning {cfg.algo} on {cfg.family or cfg.scenario}: {trials} trials of {cfg.timesteps} steps, "
                   f"{len(chosen)} dimensions, {concurrent} at a time on Ray ({ray})")
        summary = run(cfg, chosen, trials, out, ray=ray, concurrent=concurrent, validation=validation, seed=seed)
    except (TrainConfigError, ScenarioError, TuneError, RuntimeError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    best = summary["best"]
    typer.echo(f"{summary['finished']} of {summary['trials']} trials finished in {summary['wall_s']:.0f} s")
    typer.echo(f"best: trial {best['trial_id']}, validation goodput {best['goodput_rps']:.3f} req/s (worst world "
               f"{best['worst_goodput_rps']:.3f}): " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                                 for k, v in best["point"].items()))
    typer.echo(f"wrote {out}/best.yaml (train it longer with: admit train --config {out}/best.yaml --out DIR)")


def search_static(
    scenario: str = typer.Option(..., help="bundled scenario name, family instance or path to a scenario YAML"),
    seeds: str = typer.Option(
        "900000..900004", help="tuning seeds, A..B inclusive (default: the range static:best tunes on)"
    ),
    workers: int = typer.Option(2, min=1, help="worker processes"),
    out: Path | None = typer.Option(None, help="where to write the JSON (default: the cache static:best reads)"),
    refine: bool = typer.Option(True, help="after the log grid, try the ×1.5 midpoints next to the best caps"),
    race_margin: float = typer.Option(
        0.02, min=0.0, max=0.5, help="after each seed, drop candidates this fraction below the leader (0: none)"
    ),
    blind: bool = typer.Option(
        False, help="search for goodput alone although the scenario has contracts (static:best's caps); by default "
        "a scenario with contracts is searched under them (static:contract's caps)"
    ),
    at_contract: bool = typer.Option(
        False, help="search the scenario with each tenant that has a contract sending exactly it (constant arrivals "
        "at the contracted rate): whether some static caps keep every promise then"
    ),
) -> None:
    """Search per-tenant static caps for the most goodput (coordinate descent over a log grid): static:best's caps,
    or, where the tenants have contracts, the most goodput among the caps that keep them all: static:contract's."""
    import shlex

    from admit.agents.static_best import cache_path
    from admit.envs.contracts import at_contract as contract_load_only
    from admit.envs.scenario import ScenarioError, load_scenario
    from admit.train.static_search import SearchGoal, format_seeds, parse_seeds, write_store
    from admit.train.static_search import search_static as search
    from rich.progress import Progress

    try:
        seed_list = parse_seeds(seeds)
        sc = load_scenario(scenario)
        if at_contract:
            sc = contract_load_only(sc)
    except (ScenarioError, ValueError) as e:
        _fail(str(e))
    names = [t.name for t in sc.tenants]
    goal: SearchGoal = "contract" if sc.has_contracts and not blind else "goodput"
    target = out if out is not None else cache_path(sc, goal)
    command = ["admit", "search-static", "--scenario", scenario, "--seeds", format_seeds(seed_list)]
    command += ["--workers", str(workers)]
    if out is not None:
        command += ["--out", str(out)]
    if not refine:
        command.append("--no-refine")
    if race_margin != 0.02:
        command += ["--race-margin", str(race_margin)]
    if blind and sc.has_contracts:
        command.append("--blind")
    if at_contract:
        command.append("--at-contract")
    under = " under the contracts" if goal == "contract" else ""
    typer.echo(f"searching static caps of {sc.name} ({', '.join(names)}){under} on seeds {format_seeds(seed_list)}")
    try:
        with Progress(transient=True) as bar:
            task = bar.add_task("episodes", total=None)
            res = search(
                sc,
                seed_list,
                workers,
                refine=refine,
                race_margin=race_margin,
                progress=lambda i: bar.update(task, completed=i),
                log=lambda line: bar.console.print(line, soft_wrap=True, highlight=False),
                objective=goal,
            )
    except ValueError as e:
        _fail(str(e))
    data = res.to_json(shlex.join(command))
    write_store(data, target)
    best, plain, ramp = data["best"], data["plain_static"], data["ramp"]
    typer.echo(f"best caps: {', '.join(f'{n}={c}' for n, c in data['caps'].items())}  ({data['policy']})")
    for label, p in (("best", best), ("plain static", plain)):
        typer.echo(
            f"  {label:<12} {p['policy']:<24} goodput {p['goodput_rps']:.3f} req/s  attainment "
            f"{p.get('attainment', float('nan')):.3f}  worst tenant {p.get('worst_attainment', float('nan')):.3f}"
        )
    if ramp.get("decisions"):
        typer.echo(
            f"  ramp from initial: {ramp['decisions']:.0f} decisions ({ramp['seconds']:.0f} s); the same caps set at "
            f"t = 0: goodput {ramp['goodput_rps_at_caps']:.3f} req/s"
        )
    for name, f in data.get("contracts", {}).items():
        kept = "kept" if f["contract_met"] else f"broken, {f['contract_shortfall']:.0f} requests short"
        typer.echo(f"  contract of {name}: {f['contract_attainment']:.3f} of {f['contract_arrived']:.0f} in-contract "
                   f"requests good (promised {f['contract']['attainment']:g}): {kept}")
    s = data["search"]
    typer.echo(f"{s['points']} points, {s['rollouts']} episodes, {data['wall_s']:.0f} s with {workers} worker(s)")
    typer.echo(f"wrote {target}")


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _absolute(name: str | None) -> str | None:
    """A scenario or family given as a file path, made absolute: Ray's trial workers start elsewhere."""
    if name is not None and Path(name).suffix in (".yaml", ".yml") and Path(name).is_file():
        return str(Path(name).resolve())
    return name
