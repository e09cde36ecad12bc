"""``admit train``: train an SB3 policy (PPO, A2C, DQN, SAC) on a scenario and write a loadable run folder.

Registered in admit/cli.py; stable-baselines3 and torch are imported only when the command runs.
"""

from __future__ import annotations

from pathlib import Path

import typer


def train(
    algo: str | None = typer.Option(None, help="ppo | a2c | dqn | sac (overrides the config file; default ppo)"),
    scenario: str | None = typer.Option(None, help="bundled scenario name or path to a scenario YAML"),
    family: str | None = typer.Option(
        None, help="train across a scenario family's train seeds (bundled name or YAML path; tenant-set policy)"
    ),
    timesteps: int | None = typer.Option(None, help="env steps to train for (default 100000)"),
    n_envs: int | None = typer.Option(None, "--n-envs", help="parallel envs (default 4)"),
    seed: int | None = typer.Option(None, help="run seed: algorithm and training-workload seeds (default 0)"),
    vec_env: str | None = typer.Option(
        None, "--vec-env", help="dummy | subproc | block (default dummy; block: envs stepped in blocks on all cores)"
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

    try:
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

            load_family(cfg.family)  # fail before importing torch
        else:
            load_scenario(cfg.scenario)  # fail before importing torch
    except (TrainConfigError, ScenarioError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None

    from admit.train.trainer import train as run_train

    summary = run_train(cfg, out, progress=progress)
    for r in summary["imitation"]:
        typer.echo(f"imitation round {r['round']}: {r['samples']} samples, loss {r['loss']:.3f}, "
                   f"accuracy {r['accuracy']:.3f}")
    if summary["imitation"]:
        typer.echo(f"imitated static:best's caps in {summary['imitation_s']:.1f} s "
                   f"(tuning {summary['caps_tuning_s']:.1f} s)")
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
