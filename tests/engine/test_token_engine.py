"""TokenEngine: vLLM V1 scheduling semantics, KV accounting, preemption, macro-step equivalence."""

from __future__ import annotations

import math
import random

import pytest
from admit.engine.presets import get_preset
from admit.engine.request import Request
from admit.engine.steptime import StepTimeModel
from admit.engine.token_engine import TokenEngine, make_token_engine, request_intervals
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_v1 import simulate

H100 = get_preset("h100-llama3-8b")


def drive(eng: TokenEngine, reqs: list[Request], check=None) -> list[Request]:
    """The simulation loop's contract: engine events first at equal times; submit at arrival."""
    reqs = sorted(reqs, key=lambda r: r.arrival)
    done: list[Request] = []
    i = 0
    while True:
        ta = reqs[i].arrival if i < len(reqs) else math.inf
        te = eng.next_event_time()
        if ta == te == math.inf:
            break
        if te <= ta:
            done += eng.process_event(te)
        else:
            eng.submit(reqs[i], ta)
            i += 1
        if check is not None:
            check(eng)
    return done


def workload(seed: int, n: int, span: float, max_prompt: int, max_out: int) -> list[Request]:
    rnd = random.Random(seed)
    return [
        Request(i, i % 3, rnd.uniform(0, span), rnd.randint(1, max_prompt), rnd.randint(1, max_out), 0.5)
        for i in range(n)
    ]


def copies(reqs: list[Request]) -> list[Request]:
    return [Request(r.rid, r.tenant, r.arrival, r.prompt_tokens, r.output_tokens, r.u_service) for r in reqs]


# ---------------------------------------------------------------- single-request timing
def test_single_request_timeline_matches_step_model() -> None:
    eng = TokenEngine(H100)
    m = H100.step
    r = Request(0, 0, 0.0, 100, 3, 0.5)
    drive(eng, [r])
    t1 = m.step_time(100, 1, 0, 100 * 101 / 2)  # prefill step, samples token 1
    t2 = m.step_time(1, 1, 101, 0)  # decode: reads 101 tokens of context
    t3 = m.step_time(1, 1, 102, 0)
    assert r.first_scheduled == 0.0
    assert r.first_token == pytest.approx(t1, rel=1e-12)
    assert r.finished == pytest.approx(t1 + t2 + t3, rel=1e-12)
    assert eng.num_steps == 3
    assert eng.prompt_tokens_total == 100 and eng.generation_tokens_total == 3
    assert eng.iteration_tokens == {100: 1, 1: 2}
    iv = request_intervals(r)
    assert iv.queue == 0.0 and iv.decode == pytest.approx(t2 + t3) and iv.prefill == pytest.approx(t1)


def test_chunked_prefill_splits_a_long_prompt_by_the_budget() -> None:
    eng = TokenEngine(H100, max_num_batched_tokens=8192)
    r = Request(0, 0, 0.0, 20_000, 1, 0.5)
    drive(eng, [r])
    assert eng.iteration_tokens == {8192: 2, 20_000 - 2 * 8192: 1}
    m = H100.step
    expect = (
        m.step_time(8192, 1, 0, 8192 * 8193 / 2)
        + m.step_time(8192, 1, 0, 8192 * (8192 + 8193 / 2))
        + m.step_time(3616, 1, 0, 3616 * (16384 + 3617 / 2))
    )
    assert r.first_token == pytest.approx(expect, rel=1e-12) and r.finished == r.first_token


def test_running_decodes_are_scheduled_before_a_new_prefill_chunk() -> None:
    eng = TokenEngine(H100, max_num_batched_tokens=64, max_num_seqs=8)
    a = Request(0, 0, 0.0, 10, 50, 0.5)
    b = Request(1, 0, 0.001, 500, 2, 0.5)
    drive(eng, [a, b])
    # every step after b arrives carries a's decode token plus a 63-token chunk of b's prompt
    assert eng.iteration_tokens.get(64, 0) >= 7
    assert max(eng.iteration_tokens) <= 64


# ---------------------------------------------------------------- limits
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    budget=st.sampled_from([16, 64, 512, 8192]),
    seqs=st.sampled_from([1, 4, 16]),
    blocks=st.sampled_from([40, 200, 5000]),
)
def test_invariants_hold_under_random_load(seed: int, budget: int, seqs: int, blocks: int) -> None:
    eng = TokenEngine(H100, max_num_batched_tokens=budget, max_num_seqs=seqs, num_gpu_blocks=blocks)
    reqs = workload(seed, 40, 2.0, 300, 60)

    def check(e: TokenEngine) -> None:
        assert e.num_running <= seqs
        assert 0 <= e.kv_blocks_used <= blocks
        assert 0.0 <= e.memory_utilisation() <= 1.0

    done = drive(eng, reqs, check)
    assert sorted(r.rid for r in done) == list(range(40))  # every request finishes exactly once
    for r in reqs:
        assert r.finished >= r.first_token >= r.first_scheduled >= r.dispatched >= r.arrival
        assert r.generated == r.output_tokens
    assert max(eng.iteration_tokens) <= budget
    assert eng.kv_blocks_used == 0 and eng.num_running == eng.num_waiting == 0
    if sum(-(-(r.prompt_tokens + r.output_tokens) // 16) for r in reqs) <= blocks:
        assert eng.num_preemptions == 0  # everything fits at once: preemption is impossible


def test_max_num_seqs_caps_the_batch_and_admission_is_fcfs() -> None:
    eng = TokenEngine(H100, max_num_seqs=3)
    reqs = [Request(i, 0, 0.0001 * i, 50, 20, 0.5) for i in range(10)]
    seen: list[int] = []
    drive(eng, reqs, lambda e: seen.append(e.num_running))
    assert max(seen) == 3
    order = sorted(reqs, key=lambda r: r.first_scheduled)
    assert [r.rid for r in order] == list(range(10))


# ---------------------------------------------------------------- KV blocks and preemption
def test_blocks_are_allocated_as_tokens_grow() -> None:
    eng = TokenEngine(H100, num_gpu_blocks=100, macro_steps=False)
    r = Request(0, 0, 0.0, 30, 40, 0.5)
    eng.submit(r, 0.0)
    eng.process_event(0.0)  # schedules the prefill step: 30 tokens -> 2 blocks
    assert eng.kv_blocks_used == 2 and eng.memory_utilisation() == pytest.approx(0.02)
    assert eng.kv_bytes_used == 2 * 16 * 131_072
    assert eng.gpu_memory_bytes_used == H100.weights_bytes + H100.activation_bytes + eng.kv_bytes_used
    while True:
        eng.process_event(eng.next_event_time())
        if eng.next_event_time() == math.inf:
            break
        g = eng.running()[0].generated
        # the step in flight writes the KV of token 30 + g (the last sampled one): ceil((30 + g) / 16) blocks
        assert eng.kv_blocks_used == -(-(30 + g) // 16)
    assert eng.kv_blocks_used == 0 and r.generated == 40


def test_preemption_happens_exactly_when_blocks_run_out() -> None:
    # two requests of 16-token prompts; 4 blocks in all. A and B each hold 1 block after prefill and need a
    # second one at their 17th token; the cache has room for both second blocks, so no preemption until
    # the third blocks (token 33) — A takes block 4... B cannot: B (the later) is preempted.
    eng = TokenEngine(H100, num_gpu_blocks=5, macro_steps=False)
    a = Request(0, 0, 0.0, 16, 40, 0.5)
    b = Request(1, 0, 0.0, 16, 40, 0.5)
    eng.submit(a, 0.0)
    eng.submit(b, 0.0)
    history = []
    while eng.next_event_time() < math.inf:
        eng.process_event(eng.next_event_time())
        history.append((eng.kv_blocks_used, eng.num_preemptions))
    first = next(i for i, (_, p) in enumerate(history) if p)
    assert all(used <= 5 for used, _ in history)
    assert history[first - 1][0] == 4  # both hold 2 blocks; both need a 3rd at token 33 and only 1 is free
    assert b.preemptions == 1 and a.preemptions == 0  # the most recently admitted one goes
    assert a.finished < b.finished


def test_preempted_request_recomputes_prompt_and_output_from_the_front_of_waiting() -> None:
    eng = TokenEngine(H100, num_gpu_blocks=8)
    a = Request(0, 0, 0.0, 40, 60, 0.5)  # 100 tokens: 7 blocks at the end
    b = Request(1, 0, 0.001, 40, 30, 0.5)  # joins at a's second step, so runs one token behind a
    c = Request(2, 0, 0.2, 10, 5, 0.5)  # arrives after the preemption; 1 block would fit, but b is ahead
    drive(eng, [a, b, c])
    # a reaches token 65 (its 5th block) while b holds 64 tokens in 4 blocks: 4 + 4 = 8 = all, b goes
    assert eng.num_preemptions == 1 and b.preemptions == 1 and a.preemptions == 0
    # recompute: b's second prefill covers its prompt and the 24 tokens it had generated
    assert eng.prefill_tokens_computed == 40 + 40 + (40 + 24) + 10
    assert eng.prompt_tokens_total == 90  # the counter counts each prompt once
    assert c.first_scheduled >= a.finished  # FCFS: c waits behind b at the front of the queue


def test_no_admission_in_a_step_with_preemption() -> None:
    reqs = workload(3, 30, 0.5, 200, 80)
    model = H100.step
    a = copies(reqs)
    eng = TokenEngine(H100, num_gpu_blocks=30, max_num_batched_tokens=256, max_num_seqs=8)
    drive(eng, a)
    b = sorted(copies(reqs), key=lambda r: r.arrival)
    pre = simulate(b, model, 256, 8, 30)
    assert pre == eng.num_preemptions > 0
    for x, y in zip(sorted(a, key=lambda r: r.rid), sorted(b, key=lambda r: r.rid), strict=True):
        assert x.finished == pytest.approx(y.finished, rel=1e-9)


# ---------------------------------------------------------------- macro-steps = step mode = naive loop
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    budget=st.sampled_from([64, 512, 8192]),
    seqs=st.sampled_from([2, 8, 64]),
    blocks=st.sampled_from([40, 120, 100_000]),
)
def test_macro_steps_equal_step_mode_and_a_naive_scheduler(seed: int, budget: int, seqs: int, blocks: int) -> None:
    reqs = workload(seed, 50, 3.0, 400, 120)
    runs = []
    for macro in (True, False):
        rr = copies(reqs)
        eng = TokenEngine(
            H100, max_num_batched_tokens=budget, max_num_seqs=seqs, num_gpu_blocks=blocks, macro_steps=macro
        )
        drive(eng, rr)
        runs.append((rr, eng))
    naive = sorted(copies(reqs), key=lambda r: r.arrival)
    pre = simulate(naive, H100.step, budget, seqs, blocks)
    naive.sort(key=lambda r: r.rid)
    (m, em), (s, es) = runs
    assert em.num_preemptions == es.num_preemptions == pre
    assert em.num_steps == es.num_steps
    assert em.iteration_tokens == es.iteration_tokens
    assert em.generation_tokens_total == es.generation_tokens_total == sum(r.output_tokens for r in reqs)
    for x, y, z in zip(m, s, naive, strict=True):
        assert x.first_token == pytest.approx(y.first_token, rel=1e-9) == z.first_token
        assert x.finished == pytest.approx(y.finished, rel=1e-9)
        assert x.finished == pytest.approx(z.finished, rel=1e-9)


def test_submit_inside_a_macro_step_joins_at_the_next_step_boundary() -> None:
    long = Request(0, 0, 0.0, 10, 2000, 0.5)
    late = Request(1, 0, 1.2345, 10, 1, 0.5)
    res = []
    for macro in (True, False):
        a, b = copies([long, late])
        eng = TokenEngine(H100, macro_steps=macro)
        drive(eng, [a, b])
        res.append((a, b, eng.num_steps))
    (a1, b1, n1), (a2, b2, n2) = res
    assert b1.first_scheduled == pytest.approx(b2.first_scheduled, rel=1e-12)
    assert b1.first_scheduled > late.arrival  # the step in progress at 1.2345 s finished first
    assert b1.finished == pytest.approx(b2.finished, rel=1e-12) and a1.finished == pytest.approx(a2.finished)
    assert n1 == n2


def test_sync_inside_a_macro_step_reports_the_steps_done() -> None:
    macro = TokenEngine(H100)
    step = TokenEngine(H100, macro_steps=False)
    for eng in (macro, step):
        eng.submit(Request(0, 0, 0.0, 100, 1000, 0.5), 0.0)
    t = 3.0
    for eng in (macro, step):
        while eng.next_event_time() <= t:
            eng.process_event(eng.next_event_time())
    macro.sync(t)
    assert macro.generation_tokens_total == step.generation_tokens_total
    assert macro.num_steps == step.num_steps
    assert macro.kv_blocks_used == step.kv_blocks_used
    assert macro.running()[0].generated == step.running()[0].generated


# ---------------------------------------------------------------- the front end
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    delay=st.sampled_from([0.0625, 0.069, 0.5]),
    seqs=st.sampled_from([2, 64]),
    blocks=st.sampled_from([40, 100_000]),
    macro=st.booleans(),
)
def test_a_front_end_delay_is_submitting_that_much_later(seed: int, delay: float, seqs: int, blocks: int,
                                                          macro: bool) -> None:
    """With a front-end delay d every step, token and finish is where an engine without one puts them for
    requests submitted d later, to the bit (preemptions, macro-steps cut by a request reaching the queue)."""
    reqs = workload(seed, 50, 3.0, 400, 120)
    late = copies(reqs)
    for r in late:
        r.arrival += delay
    delayed = TokenEngine(H100, max_num_batched_tokens=512, max_num_seqs=seqs, num_gpu_blocks=blocks,
                          macro_steps=macro, frontend_delay_s=delay)
    plain = TokenEngine(H100, max_num_batched_tokens=512, max_num_seqs=seqs, num_gpu_blocks=blocks,
                        macro_steps=macro)
    a, b = copies(reqs), late
    drive(delayed, a)
    drive(plain, b)
    assert (delayed.num_steps, delayed.num_preemptions, delayed.iteration_tokens) == (
        plain.num_steps, plain.num_preemptions, plain.iteration_tokens)
    for x, y in zip(a, b, strict=True):
        assert (x.first_scheduled, x.first_token, x.finished, x.preemptions) == (
            y.first_scheduled, y.first_token, y.finished, y.preemptions)
        assert x.dispatched == x.arrival  # dispatched into the front end; in the queue d later


def test_a_request_in_the_front_end_holds_nothing_and_can_be_aborted() -> None:
    eng = TokenEngine(H100, frontend_delay_s=0.069)
    a, b = Request(0, 1, 0.0, 300, 5, 0.5), Request(1, 0, 0.0, 40, 5, 0.5)
    eng.submit(a, 0.0)
    eng.submit(b, 0.01)
    assert eng.next_event_time() == 0.069
    # in the front end: not in vLLM's waiting gauge, no KV; its whole prompt is still to be computed
    assert (eng.num_waiting, eng.num_running, eng.kv_blocks_used) == (0, 0, 0)
    assert eng.tenant_tokens(2) == ([40.0, 300.0], [40.0, 300.0])
    assert eng.abort(b, 0.02) and not eng.abort(b, 0.02)
    assert drive(eng, []) == [a] and math.isnan(b.first_scheduled)
    assert a.first_scheduled == 0.069
    assert a.first_token == 0.069 + H100.step.step_time(300, 1, 0, 300 * 301 / 2)
    with pytest.raises(ValueError, match="frontend_delay_s must be a finite number >= 0"):
        TokenEngine(H100, frontend_delay_s=-0.1)


def test_the_cpu_preset_carries_the_measured_request_overhead() -> None:
    import json
    from importlib import resources

    data = json.loads(resources.files("admit.engine").joinpath("data/calibration/cpu-smollm2.json").read_text())
    assert get_preset("cpu-smollm2").frontend_delay_s == data["request_overhead_s"] > 0
    assert get_preset("h200-llama3-8b").frontend_delay_s == 0.0  # the GPU sources time engine steps only


# ---------------------------------------------------------------- hooks
def test_on_tokens_streams_every_token_and_abort_frees_blocks() -> None:
    eng = TokenEngine(H100)
    got: dict[int, list[float]] = {}
    eng.on_tokens = lambda r, n, now: got.setdefault(r.rid, []).extend([now] * n)
    a = Request(0, 0, 0.0, 50, 30, 0.5)
    b = Request(1, 0, 0.0, 70, 500, 0.5)
    eng.submit(a, 0.0)
    eng.submit(b, 0.0)
    while eng.next_event_time() < 0.3:
        eng.process_event(eng.next_event_time())
    assert len(got[0]) == 30 and got[0][0] == a.first_token and got[0][-1] == a.finished
    assert got[0] == sorted(got[0])
    used = eng.kv_blocks_used
    assert eng.abort(b, 0.3) and not eng.abort(b, 0.3)
    assert eng.kv_blocks_used < used and eng.num_running == 0
    eng.process_event(eng.next_event_time())  # the step in progress ends; nothing left
    assert eng.next_event_time() == math.inf and eng.kv_blocks_used == 0
    assert math.isnan(b.finished)


def test_abort_of_a_waiting_request() -> None:
    eng = TokenEngine(H100, max_num_seqs=1)
    a, b = Request(0, 0, 0.0, 10, 100, 0.5), Request(1, 0, 0.0, 10, 5, 0.5)
    eng.submit(a, 0.0)
    eng.process_event(0.0)
    eng.submit(b, 0.001)
    assert eng.num_waiting == 1 and eng.abort(b, 0.002) and eng.num_waiting == 0
    done = drive(eng, [])
    assert done == [a]


# ---------------------------------------------------------------- inputs
def test_bad_inputs_give_clear_errors() -> None:
    with pytest.raises(ValueError, match="allowed: \\['cpu-smollm2', 'h100-llama3-8b', 'h200-llama3-8b'"):
        TokenEngine("a100-llama3-8b")
    with pytest.raises(ValueError, match="must be >= max_num_seqs"):
        TokenEngine(H100, max_num_batched_tokens=64, max_num_seqs=128)
    eng = TokenEngine(H100, num_gpu_blocks=4)
    with pytest.raises(ValueError, match="never fit"):
        eng.submit(Request(0, 0, 0.0, 60, 10, 0.5), 0.0)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.submit(Request(0, 0, 0.0, 131_000, 1000, 0.5), 0.0)
    with pytest.raises(ValueError, match=">= 1"):
        eng.submit(Request(0, 0, 0.0, 0, 10, 0.5), 0.0)


def test_make_token_engine_reads_a_scenario_config() -> None:
    class Cfg:
        preset = "h100-llama3-8b"
        max_num_batched_tokens = 2048
        max_num_seqs = 256

    eng = make_token_engine(Cfg())
    assert eng.preset.name == "h100-llama3-8b"
    assert (eng.max_num_batched_tokens, eng.max_num_seqs) == (2048, 256)
    assert eng.num_gpu_blocks == H100.num_gpu_blocks


def test_custom_step_model_is_used() -> None:
    flat = StepTimeModel(0.01, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
    eng = TokenEngine(H100, step_model=flat)
    r = Request(0, 0, 0.0, 500, 10, 0.5)
    drive(eng, [r])
    assert r.finished == pytest.approx(0.1)
