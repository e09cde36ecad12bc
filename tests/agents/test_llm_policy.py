"""LLM policy against a scripted OpenAI-compatible server: every failure holds and is counted, the rate
budget, the cache, decide-every-K and the request's json_schema, through real HTTP and the real client."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from admit.agents.decision_log import read_log
from admit.agents.llm_config import LLMConfig
from admit.agents.llm_policy import LLMPolicy
from admit.agents.registry import make_controller
from admit.core.controller import Controller, policy_failure, validate_deltas
from admit.core.observation import Observation, TenantObservation
from admit.core.spec import ControlSpec, Limits, TenantSpec
from llm_scripted_server import ScriptedServer, Step, reply

SPEC = ControlSpec(
    tenants=(TenantSpec("chat", slo_e2e_p99_s=12.0), TenantSpec("batch")),
    limits=Limits(min=1, max=8, initial=4, max_step=2),
    interval_s=3.0,
    window_s=6.0,
    queue_timeout_s=3.0,
)


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


def obs(i: int = 0) -> Observation:
    """A distinct observation per ``i`` (so prompts differ and the cache stays out of the way)."""
    chat = TenantObservation(
        queue_depth=i, in_flight=4, limit=4, arrivals=3, completions=2, e2e_p99=5.0, samples=2, slo_e2e_p99=12.0
    )
    batch = TenantObservation(queue_depth=0, in_flight=1, limit=4, arrivals=1, completions=1, e2e_p99=2.0, samples=1)
    return Observation(
        time_s=3.0 * i, window_s=6.0, gpu_mem_util=0.5, engine_running=5, engine_waiting=0, tenants=[chat, batch]
    )


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


def policy(url: str, **kw: object) -> LLMPolicy:
    # 10 s: the scripted server answers at once; a deadline is only meant to be missed where a test says so
    cfg = LLMConfig(base_url=url, model="scripted-model", timeout_s=10.0).model_copy(update=kw)
    p = LLMPolicy(cfg)
    p.reset(SPEC, seed=0)
    return p


def test_valid_reply_is_used_and_logged(server: ScriptedServer, tmp_path) -> None:
    server.push(reply([2, -1], "chat is queueing"))
    p = policy(server.base_url, log_path=str(tmp_path / "decisions.jsonl"))
    assert p.act(obs(1)) == [2, -1]
    assert p.stats.calls == 1 and p.stats.valid == 1 and not p.stats.holds
    rec = p.log.records[-1]
    assert (rec.source, rec.reason, rec.deltas, rec.rationale) == ("model", "ok", [2, -1], "chat is queueing")
    assert rec.latency_s is not None and rec.latency_s > 0
    assert read_log(tmp_path / "decisions.jsonl") == [rec]


def test_request_carries_schema_model_and_observation(server: ScriptedServer) -> None:
    server.push(reply([0, 0]))
    p = policy(server.base_url)
    p.act(obs(3))
    body = server.requests[0]
    assert body["model"] == "scripted-model"
    rf = body["response_format"]
    assert rf["type"] == "json_schema"
    deltas = rf["json_schema"]["schema"]["properties"]["deltas"]
    assert deltas["minItems"] == deltas["maxItems"] == 2
    assert (deltas["items"]["type"], deltas["items"]["minimum"], deltas["items"]["maximum"]) == ("integer", -2, 2)
    text = "\n".join(m["content"] for m in body["messages"])
    assert "chat | 3 | 4 | 4 |" in text  # name, queue, in-flight, limit
    assert "5.0/12.0" in text and "2.0/none" in text  # e2e p99 against each SLO
    assert "[-2, 2]" in text and "chat, batch" in text


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        (reply([1]), "wrong_length"),
        (reply([1, 1, 1]), "wrong_length"),
        (reply([3, 0]), "out_of_range"),
        (reply([1.5, 0]), "not_integer"),
        (reply([True, 0]), "not_integer"),
        (Step("I think chat needs more room."), "not_json"),
        (Step('{"rationale": "x", "deltas": [1, '), "not_json"),
        (Step('["just", "a", "list"]'), "not_object"),
        (Step(""), "empty"),
        (Step(json.dumps({"rationale": "x", "deltas": [1, 0]}), finish_reason="length"), "length"),
        (Step(status=500), "http_error"),
        (Step(status=429), "http_error"),
        (Step(raw_body=b"<html>proxy error</html>"), "bad_response"),
        (Step(reply([1, 1]).content, delay_s=60.0), "timeout"),  # cut short when the server stops
    ],
)
def test_every_bad_reply_holds_and_is_counted(server: ScriptedServer, step: Step, reason: str) -> None:
    server.push(step)
    # a short deadline only where the reply is meant to miss it (the others must not miss it on a loaded machine)
    p = policy(server.base_url, **({"timeout_s": 2.0} if reason == "timeout" else {}))
    assert p.act(obs(1)) == [0, 0]
    assert p.stats.calls == 1 and p.stats.valid == 0
    assert dict(p.stats.holds) == {reason: 1}
    assert p.last_failure == policy_failure(p) == reason  # what the live loop counts as a failure
    rec = p.log.records[-1]
    assert (rec.source, rec.reason, rec.deltas) == ("hold", reason, [0, 0])
    # the policy keeps working afterwards
    server.push(reply([1, 1]))
    assert p.act(obs(2)) == [1, 1]
    assert p.stats.calls == 2 and p.stats.valid == 1
    assert p.last_failure is None


def test_connection_refused_holds() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = policy(f"http://127.0.0.1:{port}/v1")
    assert p.act(obs(1)) == [0, 0]
    assert dict(p.stats.holds) == {"connection_error": 1}


def test_act_before_reset_holds_instead_of_raising() -> None:
    p = LLMPolicy(LLMConfig())
    assert p.act(obs(1)) == [0, 0]
    assert dict(p.stats.holds) == {"error": 1}


def test_rate_budget_holds_when_empty(server: ScriptedServer) -> None:
    now = [0.0]
    cfg = LLMConfig(base_url=server.base_url, calls_per_min=60.0, burst=2)
    p = LLMPolicy(cfg, clock=lambda: now[0])
    p.reset(SPEC)
    server.default = reply([1, 0])
    assert [p.act(obs(i)) for i in range(3)] == [[1, 0], [1, 0], [0, 0]]
    assert len(server.requests) == 2
    assert dict(p.stats.holds) == {"rate_limited": 1}
    assert p.log.records[-1].reason == "rate_limited"
    now[0] += 1.0  # one call per second refills one token
    assert p.act(obs(3)) == [1, 0]
    assert len(server.requests) == 3


def test_identical_prompt_is_answered_from_cache(server: ScriptedServer) -> None:
    server.default = reply([1, -1], "cached rationale")
    p = policy(server.base_url)
    first = p.act(obs(1))
    p.reset(SPEC)  # same observation after a reset: the same prompt
    assert p.act(obs(1)) == first == [1, -1]
    assert len(server.requests) == 1
    assert p.stats.cache_hits == 1 and p.stats.calls == 1
    assert (p.log.records[-1].source, p.log.records[-1].rationale) == ("cache", "cached rationale")


def test_failed_reply_is_not_cached(server: ScriptedServer) -> None:
    server.push(Step("garbage"), reply([2, 2]))
    p = policy(server.base_url)
    assert p.act(obs(1)) == [0, 0]
    p.reset(SPEC)
    assert p.act(obs(1)) == [2, 2]
    assert len(server.requests) == 2 and p.stats.cache_hits == 0


def test_cache_size_zero_always_calls(server: ScriptedServer) -> None:
    server.default = reply([1, 1])
    p = policy(server.base_url, cache_size=0)
    for _ in range(2):
        p.reset(SPEC)
        p.act(obs(1))
    assert len(server.requests) == 2


def test_decides_every_k_intervals_and_holds_between(server: ScriptedServer) -> None:
    server.default = reply([1, 1])
    p = policy(server.base_url, every=3)
    out = [p.act(obs(i)) for i in range(7)]
    assert out == [[1, 1], [0, 0], [0, 0], [1, 1], [0, 0], [0, 0], [1, 1]]
    assert len(server.requests) == 3
    assert (p.stats.acts, p.stats.decisions, p.stats.calls) == (7, 3, 3)
    assert [r.step for r in p.log.records] == [0, 3, 6]
    p.reset(SPEC)  # a new episode decides at once
    assert p.act(obs(9)) == [1, 1]


def test_trend_and_burst_context_reach_the_prompt(server: ScriptedServer) -> None:
    server.default = reply([0, 0])
    p = policy(server.base_url)
    quiet = obs(0)
    busy = obs(0)
    busy.tenants[0].arrivals = 30
    busy.tenants[0].e2e_p99 = 9.0
    p.act(quiet)
    p.act(busy)
    first = server.requests[0]["messages"][-1]["content"]
    second = server.requests[1]["messages"][-1]["content"]
    assert "no history yet" in first
    assert "e2e_p99 5.0->9.0 s" in second and "arrivals 0.5->5.0/s (BURST starting)" in second


def test_stats_report_counts_and_latency(server: ScriptedServer) -> None:
    server.push(reply([1, 1]), Step("nope"))
    p = policy(server.base_url)
    p.act(obs(1))
    p.act(obs(2))
    s = p.stats.as_dict()
    assert (s["calls"], s["valid"], s["valid_fraction"], s["holds"]) == (2, 1, 0.5, {"not_json": 1})
    assert 0 < s["latency_s"]["p50"] <= s["latency_s"]["max"]


def test_returned_deltas_pass_the_controller_contract(server: ScriptedServer) -> None:
    server.default = reply([-2, 2])
    p = policy(server.base_url)
    assert validate_deltas(p.act(obs(1)), SPEC) == [-2, 2]


def test_last_failure_reports_failures_only(server: ScriptedServer) -> None:
    """Set by a failed decision point; cleared by a decision, a cache hit, an interval between decision points
    and a hold of the policy's own rate budget (deliberate, not a failure)."""
    p = LLMPolicy(LLMConfig(base_url=server.base_url, timeout_s=10.0, every=2, calls_per_min=1.0, burst=4),
                  clock=lambda: 0.0)
    p.reset(SPEC)
    assert p.last_failure is None
    server.push(Step("not json"), reply([1, 0]), Step(status=503), Step("still not json"))
    assert p.act(obs(1)) == [0, 0] and p.last_failure == "not_json"
    assert p.act(obs(2)) == [0, 0] and p.last_failure is None  # not a decision point
    p.reset(SPEC)  # each reset makes the next act a decision point, with the same history as the last reset's
    assert p.act(obs(7)) == [1, 0] and p.last_failure is None
    p.reset(SPEC)
    assert p.act(obs(8)) == [0, 0] and p.last_failure == "http_error"
    p.reset(SPEC)
    assert p.act(obs(7)) == [1, 0] and p.last_failure is None  # the good reply, from the cache
    p.reset(SPEC)
    assert p.act(obs(9)) == [0, 0] and p.last_failure == "not_json"
    p.reset(SPEC)
    assert p.act(obs(10)) == [0, 0] and p.last_failure is None and policy_failure(p) is None  # the bucket is empty
    assert p.stats.cache_hits == 1 and len(server.requests) == 4
    assert dict(p.stats.holds) == {"not_json": 2, "http_error": 1, "rate_limited": 1}
    assert p.log.records[-1].reason == "rate_limited"


def test_last_failure_after_an_unforeseen_error_and_for_other_controllers() -> None:
    p = LLMPolicy(LLMConfig())
    p.act(obs(1))  # before reset(spec): an internal error, held
    assert p.last_failure == "error"
    static = make_controller("static")
    assert isinstance(static, Controller) and policy_failure(static) is None  # the attribute is optional

    class Odd:
        last_failure = 3

    with pytest.raises(TypeError, match="last_failure must be a string or None"):
        policy_failure(Odd())
