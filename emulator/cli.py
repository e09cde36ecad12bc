"""``admit emulate``: start the emulator and serve until interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

import typer
from admit.core.config import ConfigError
from admit.emulator.config import EmulatorConfig
from admit.emulator.http import HEAD_TIMEOUT_S


async def run_server(config: EmulatorConfig, announce: bool = True) -> None:
    """Serve ``config`` until SIGINT/SIGTERM (or cancellation); prints ``listening on HOST:PORT``."""
    from admit.emulator.http import serve
    from admit.emulator.server import EmulatorApp

    app = EmulatorApp(config)
    app.start()
    server = await serve(app, config.host, config.port, head_timeout_s=config.head_timeout_s)
    app.listening(s.getsockname()[0] for s in server.sockets)
    if config.admin_token is None and not app.admin_open:
        print("note: /admin/faults and /debug/requests answer 403: the emulator listens on a non-loopback address "
              "without --admin-token-env", file=sys.stderr, flush=True)
    host, port = server.sockets[0].getsockname()[:2]
    if announce:
        print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        server.close()
        await app.loop.stop()


def _admin_token(token: str | None, env_var: str | None) -> str | None:
    """The token from ``--admin-token`` or the variable ``--admin-token-env`` names; None when neither is given."""
    if token is not None and env_var is not None:
        raise ConfigError("give --admin-token or --admin-token-env, not both")
    if env_var is None:
        return token
    value = os.environ.get(env_var)
    if not value:
        raise ConfigError(f"--admin-token-env: environment variable {env_var} is not set")
    return value


def emulate(
    preset: str = typer.Option("h200-llama3-8b", help="token-engine preset (h200-llama3-8b, h100-llama3-8b)"),
    port: int = typer.Option(8000, help="TCP port; 0 picks a free one (printed as 'listening on HOST:PORT')"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    model: str | None = typer.Option(None, help="served model name (default: the preset's model id)"),
    max_model_len: int | None = typer.Option(None, help="context length (default: the preset's)"),
    seed: int = typer.Option(0, help="seed of output-length and fault draws"),
    num_gpu_blocks: int | None = typer.Option(None, help="KV-cache blocks (default: from the preset's memory)"),
    max_num_seqs: int | None = typer.Option(None, help="vLLM max_num_seqs (default: the preset's)"),
    max_num_batched_tokens: int | None = typer.Option(None, help="vLLM max_num_batched_tokens (default: preset)"),
    output_median: float = typer.Option(200.0, help="median drawn output length when ignore_eos is off"),
    output_sigma: float = typer.Option(0.8, help="log-space sigma of the drawn output length"),
    startup_delay: float = typer.Option(0.0, help="seconds /health answers 503 after start (slow start-up)"),
    latency_multiplier: float = typer.Option(1.0, help="engine steps take this many times longer (fault)"),
    head_timeout_s: float = typer.Option(
        HEAD_TIMEOUT_S, help="seconds a request head may take from its first byte (then 408, connection closed)"),
    admin_token_env: str | None = typer.Option(
        None, help="environment variable holding a token (>= 16 characters) that /admin/faults and /debug/requests "
        "then require as 'Authorization: Bearer <token>'; without a token they are open only on a loopback "
        "--host (127.0.0.1, the default) and answer 403 on any other"),
    admin_token: str | None = typer.Option(
        None, help="the token itself (visible in the process list: prefer --admin-token-env)"),
) -> None:
    """Serve a vLLM-compatible OpenAI API whose timing comes from the token engine, in wall-clock time."""
    import uvloop

    try:
        token = _admin_token(admin_token, admin_token_env)
        config = EmulatorConfig(
            preset=preset, host=host, port=port, model=model, max_model_len=max_model_len, seed=seed,
            num_gpu_blocks=num_gpu_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            output_median=output_median, output_sigma=output_sigma, startup_delay_s=startup_delay,
            latency_multiplier=latency_multiplier, head_timeout_s=head_timeout_s, admin_token=token,
        )  # fmt: skip
        config.build_engine()  # fail before binding the port
    except ValueError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    try:
        uvloop.run(run_server(config))
    except OSError as e:
        typer.secho(f"error: cannot listen on {host}:{port}: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
