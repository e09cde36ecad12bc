"""Step-time model, presets, calibration and the fidelity checks."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
from admit.engine import calibration as cal
from admit.engine.fidelity import build_report
from admit.engine.presets import PRESETS, get_preset
from admit.engine.steptime import StepTimeModel, prefill_pairs

H100 = get_preset("h100-llama3-8b").step
H200 = get_preset("h200-llama3-8b").step


def test_dense_is_flat_when_memory_bound_and_linear_when_compute_bound() -> None:
    assert H100.dense(1) == pytest.approx(H100.dense_floor_s, rel=0.01)
    slope = (H100.dense(8192) - H100.dense(4096)) / 4096
    assert slope == pytest.approx(H100.dense_s_per_token, rel=0.02)
    assert all(H100.dense(n) < H100.dense(n + 1) for n in range(1, 5000, 97))


def test_step_time_adds_the_terms() -> None:
    m = StepTimeModel(1e-3, 2e-3, 1e-5, 1.0, 1e-6, 1e-8, 1e-9)
    t = m.step_time(tokens=100, seqs=10, kv_read=5000, prefill_pairs=prefill_pairs(0, 90))
    assert t == pytest.approx(1e-3 + (2e-3 + 1e-3) + 10e-6 + 5e-5 + 90 * 45.5 * 1e-9)
    assert m.decode_base(10) + m.kv_read_s_per_token * 5000 == pytest.approx(m.step_time(10, 10, 5000, 0))


def test_long_contexts_and_prompts_cost_more() -> None:
    short = H100.step_time(64, 64, 64 * 200, 0)
    long = H100.step_time(64, 64, 64 * 4000, 0)
    assert long > 1.2 * short
    assert H100.step_time(4096, 1, 0, prefill_pairs(8000, 4096)) > H100.step_time(4096, 1, 0, prefill_pairs(0, 4096))


def test_h200_is_faster_where_memory_bound_and_equal_where_compute_bound() -> None:
    assert H200.dense(1) == pytest.approx(H100.dense(1) * 3.35 / 4.8, rel=1e-3)
    assert H200.kv_read_s_per_token == pytest.approx(H100.kv_read_s_per_token * 3.35 / 4.8, rel=1e-3)
    assert H200.dense(8192) == pytest.approx(H100.dense(8192), rel=0.01)


def test_presets_kv_capacity_follows_vllm_rule() -> None:
    p = get_preset("h200-llama3-8b")
    assert p.kv_block_bytes == 16 * 131_072
    assert p.num_gpu_blocks == int((0.9 * 141e9 - 16.06e9 - 3 * 2**30) // (16 * 131_072))
    assert 50_000 < p.num_gpu_blocks < 56_000  # reference/simulation.md: about 53–55k blocks
    assert get_preset("h100-llama3-8b").num_gpu_blocks < p.num_gpu_blocks / 2 + 1
    assert {p.max_num_batched_tokens for p in PRESETS.values() if p.name.startswith("h")} == {8192}


def test_bad_inputs_name_the_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"allowed: \['cpu-smollm2', 'h100-llama3-8b', 'h200-llama3-8b'\]"):
        get_preset("h200-llama3-70b")
    with pytest.raises(ValueError, match="kv_read_s_per_token must be a finite number >= 0"):
        StepTimeModel(1e-3, 1e-3, 1e-5, 1.5, 0.0, -1.0, 0.0)
    with pytest.raises(ValueError, match="overhead_s must be a finite number"):
        StepTimeModel(math.nan, 1e-3, 1e-5, 1.5, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="dense_knee must be >= 1"):
        StepTimeModel(0.0, 1e-3, 1e-5, 0.5, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="unknown step-time coefficient"):
        H100.scaled(c_kv=2.0)


def test_the_fit_reproduces_the_committed_coefficients() -> None:
    fitted = cal.fit_h100()
    for f in fields(StepTimeModel):
        got, want = getattr(fitted, f.name), getattr(H100, f.name)
        assert got == pytest.approx(want, rel=2e-3, abs=1e-9), f.name
    h200 = cal.derive_h200(H100)
    for f in fields(StepTimeModel):
        assert getattr(h200, f.name) == pytest.approx(getattr(H200, f.name), rel=2e-3), f.name


def test_vidur_profile_matches_the_readme_reference_points() -> None:
    n, t = cal.load_vidur_profile()
    assert len(n) == 261 and n[0] == 1 and n[-1] == 4096
    ref = {1: 5.6, 64: 5.9, 128: 6.4, 256: 9.2, 512: 12.0, 1024: 21.0, 2048: 40.4, 4096: 83.2}
    for k, ms in ref.items():
        assert t[n == k].mean() * 1e3 == pytest.approx(ms, abs=0.15)  # 2048 and 4096 are profiled twice


def test_fidelity_checks_pass() -> None:
    text, checks = build_report()
    assert len(checks) == 3
    for c in checks:
        assert c.passed, (c.name, c.value)
    assert "Where the model is knowingly coarse" in text


def _designed_samples(model: StepTimeModel, request_s: float) -> list[cal.StepSample]:
    """The samples `admit calibrate` measures, computed from ``model`` (what a server following it would show)."""
    out = []
    for p in (16, 64, 128, 256, 512, 768, 1024, 1536):
        q = p * (p + 1) / 2
        out.append(cal.StepSample("prefill", p, 1, 0.0, q, model.step_time(p, 1, 0.0, q) + request_s))
    for c in (32, 384, 1024):
        for b in (1, 2, 4, 8):
            kv = b * (c + 48.0)
            out.append(cal.StepSample("decode", b, b, kv, 0.0, model.step_time(b, b, kv, 0.0)))
    return out


def test_fit_measured_recovers_the_step_times_of_a_known_engine() -> None:
    truth = StepTimeModel(overhead_s=0.02, dense_floor_s=0.045, dense_s_per_token=3.5e-3, dense_knee=1.6,
                          per_seq_s=2e-3, kv_read_s_per_token=4e-6, prefill_attn_s_per_pair=1.2e-7)
    samples = _designed_samples(truth, request_s=0.03)
    fit, request_s = cal.fit_measured(samples)
    for s in samples:  # every designed point, and points between them, within 2%
        assert cal.predict_sample(fit, s, request_s) == pytest.approx(s.seconds, rel=0.02)
    for n, b, kv in ((300, 1, 0.0), (6, 6, 6 * 700.0)):
        q = n * (n + 1) / 2 if b == 1 else 0.0
        assert fit.step_time(n, b, kv, q) == pytest.approx(truth.step_time(n, b, kv, q), rel=0.05)
    with pytest.raises(ValueError, match="at least 3 prefill and 3 decode"):
        cal.fit_measured([s for s in samples if s.kind == "decode"])


def test_the_cpu_preset_is_its_calibration_file() -> None:
    import json
    from importlib import resources

    from admit.engine.presets import preset_from_calibration

    data = json.loads(resources.files("admit.engine").joinpath("data/calibration/cpu-smollm2.json").read_text())
    p = get_preset("cpu-smollm2")
    assert p.step == StepTimeModel(**data["fit"]) and p.num_gpu_blocks == data["engine"]["num_gpu_blocks"]
    assert (p.block_size, p.max_num_seqs, p.max_num_batched_tokens) == (128, 8, 2048)
    # the fit follows what was measured: the calibration run's own errors, recomputed
    samples = [cal.StepSample(**s) for s in data["samples"]]
    errs = [cal.predict_sample(p.step, s, data["request_overhead_s"]) / s.seconds - 1 for s in samples]
    assert errs == pytest.approx(data["relative_errors"], abs=1e-3)
    assert sorted(abs(e) for e in errs)[len(errs) // 2] < 0.05 and max(abs(e) for e in errs) < 0.25
    with pytest.raises(ValueError, match="not an `admit calibrate` result"):
        preset_from_calibration({"fit": data["fit"]})
