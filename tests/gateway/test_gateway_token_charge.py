"""Token envelopes charge what the backend delivers, whatever the client does: a real gateway (in process, and
on a real redis-server) in front of the real emulator, which generates exactly what it is allowed
(``ignore_eos``) and counts what it generated (``vllm:generation_tokens_total``).

* The bypass: a chat request that names ``max_tokens: 1`` but ``max_completion_tokens: 1000`` (the field vLLM
  and the emulator honour), streamed, whose client leaves just before the end. Charged ``max_tokens`` and
  never settled, 16 of 16 got through an envelope of 1 token/s with a burst of 400; now the tokens delivered
  stay within the envelope plus one request's worth.
* Each spelling of the output limit, streamed and not, with the client reading to the end or leaving early:
  the bucket is charged the prompt and the tokens the backend delivered to the gateway — at least what the
  client read, at most what the emulator generated (and a chat stream's role event).
* A stream the backend stops mid-way, silent past ``backend_timeout_s`` or killed: charged what came.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from emulator_helpers import Emulator, start_emulator
from gateway_helpers import GatewayProcess, key, tenant_cfg, wait_for
from redis_helpers import RedisServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

CONTEXT = 4096


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator("--max-model-len", str(CONTEXT))
    yield e
    e.stop()


@pytest.fixture(params=["in-process", "redis"])
def mode(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The gateway's shared-state section: none (in process) or a fresh real redis-server."""
    if request.param == "in-process":
        yield {}
        return
    (tmp_path / "redis").mkdir()
    rs = RedisServer(tmp_path / "redis")
    try:
        yield {"redis": {"url": rs.url, "failure_mode": "closed", "poll_s": 0.05, "timeout_s": 2}}
    finally:
        rs.stop()


def gateway(tmp: Path, emu: Emulator, mode: dict[str, Any], rate: float, burst: int, **cfg: Any) -> GatewayProcess:
    env = {"target": "*", "tokens_per_s": rate, "token_burst": burst}
    return GatewayProcess(tmp, emu.url, {**mode, **cfg,
                                         "tenants": [tenant_cfg("t", limit=4, max_queue=0, envelopes=[env])]})


def model(emu: Emulator) -> str:
    return str(emu.json("GET", "/v1/models")[1]["data"][0]["id"])


def ask(g: GatewayProcess, path: str, body: dict[str, Any], leave_after: int | None = None,
        at: tuple[int, Callable[[], object]] | None = None) -> tuple[int, int, Any]:
    """One request through the gateway: (status, output tokens the client read, usage if it got one). With
    ``leave_after``, a streamed answer's client closes the connection once it has read that many tokens; with
    ``at = (k, act)``, ``act()`` runs once the client has read k tokens, and it reads on to the end."""
    host, port = g.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {key('t')}",
                                                      "Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200 or not body.get("stream"):
            data = json.loads(r.read())
            usage = data.get("usage")
            return r.status, usage["completion_tokens"] if usage else 0, usage
        read, usage = 0, None
        while line := r.readline():
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            choice = (event.get("choices") or [{}])[0]
            read += bool(choice.get("text") or choice.get("delta", {}).get("content"))
            if at is not None and read == at[0]:
                at[1]()
            if leave_after is not None and read >= leave_after:
                break
        return r.status, read, usage
    finally:
        conn.close()  # mid-stream: the client leaves


def bucket(g: GatewayProcess) -> float:
    return float(g.state()["tenants"]["t"]["envelopes"][0]["tokens"]["remaining"])


def generated(emu: Emulator) -> float:
    return emu.value("vllm:generation_tokens_total")


def test_a_client_that_leaves_cannot_take_more_tokens_than_its_envelope(
        tmp_path: Path, emu: Emulator, mode: dict[str, Any]) -> None:
    g = gateway(tmp_path, emu, mode, rate=1, burst=400)
    try:
        body = {"model": model(emu), "messages": [{"role": "user", "content": "write a long story"}],
                "max_tokens": 1, "max_completion_tokens": 1000, "ignore_eos": True, "stream": True}
        t0 = time.monotonic()
        delivered, statuses = 0, []
        for _ in range(16):
            status, read, _ = ask(g, "/v1/chat/completions", body, leave_after=990)
            statuses.append(status)
            delivered += read
        elapsed = time.monotonic() - t0
        prompt = 1 + 4 + (4 + 4)  # the gateway's estimate of this chat prompt
        allowed = 400 + 1 * elapsed + (prompt + 1000)  # the burst, the refill, one request's worth
        assert delivered <= allowed, (delivered, allowed, statuses)
        assert statuses.count(200) >= 1 and set(statuses) <= {200, 429}, statuses
        # and the envelope is in debt for what was delivered: the next request waits
        assert ask(g, "/v1/chat/completions", body, leave_after=1)[0] == 429
    finally:
        g.stop()


CASES = [  # path, the output-limit fields, streamed, the client leaves after this many tokens (None: reads it all)
    ("/v1/chat/completions", {"max_completion_tokens": 120}, True, 40),
    ("/v1/chat/completions", {"max_tokens": 1, "max_completion_tokens": 120}, True, None),
    ("/v1/chat/completions", {"max_tokens": 120}, True, 40),
    ("/v1/chat/completions", {"max_tokens": 1, "max_completion_tokens": 120}, False, None),
    ("/v1/completions", {"max_tokens": 120}, True, 40),
    ("/v1/completions", {"max_tokens": 120, "max_completion_tokens": 1}, False, None),
]


@pytest.mark.parametrize("path, limits, stream, leave_after", CASES)
def test_the_settled_charge_is_what_the_backend_delivered(
        tmp_path: Path, emu: Emulator, mode: dict[str, Any], path: str, limits: dict[str, int], stream: bool,
        leave_after: int | None) -> None:
    burst, rate = 100_000, 0.001  # a bucket that refills by nothing a test can see
    g = gateway(tmp_path, emu, mode, rate=rate, burst=burst)
    try:
        chat = path.endswith("chat/completions")
        body: dict[str, Any] = {"model": model(emu), **limits, "ignore_eos": True, "stream": stream}
        if chat:
            body["messages"] = [{"role": "user", "content": "hello"}]
            prompt = 1 + 4 + (4 + 1)
        else:
            body["prompt"] = [1, 2, 3, 4, 5, 6, 7, 8]
            prompt = 8
        if stream:
            body["stream_options"] = {"include_usage": True}
        before = generated(emu)
        status, read, usage = ask(g, path, body, leave_after)
        assert status == 200
        wait_for(lambda: emu.value("vllm:num_requests_running") == 0, 30, "the emulator to end the request")
        made = generated(emu) - before
        if leave_after is None:  # read to the end: exactly its usage
            assert usage is not None and made == usage["completion_tokens"] == 120, (made, usage)
            want = lambda charged: charged == prompt + 120  # noqa: E731
        else:  # left early: at least what the client read, at most what the backend made (and the role event)
            assert read == leave_after and made < 120, (read, made)
            want = lambda charged: prompt + read <= charged <= prompt + made + chat  # noqa: E731
        charged = wait_for(lambda: c if want(c := round(burst - bucket(g))) else None, 30, "the settled charge")
        assert want(charged), (charged, prompt, read, made)
    finally:
        g.stop()


def test_a_chat_request_naming_no_limit_is_charged_the_context_until_it_ends(tmp_path: Path, emu: Emulator) -> None:
    """vLLM lets such a request generate up to the rest of its context, so that is what it must find room for;
    the gateway reads the context from the backend's GET /v1/models."""
    g = gateway(tmp_path, emu, {}, rate=0.001, burst=100_000)
    try:
        wait_for(lambda: f"context length: {CONTEXT} tokens" in g.stderr(), 30, "the gateway to read the context")
        host, port = g.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        body = {"model": model(emu), "messages": [{"role": "user", "content": "hello"}], "stream": True,
                "stream_options": {"include_usage": True}}
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Authorization": f"Bearer {key('t')}", "Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data: ")
        # while it runs, the whole context is spent (the refill of a test's length is below half a token)
        assert round(100_000 - bucket(g)) == CONTEXT
        usage = None
        while line := r.readline():
            if line.startswith(b"data: {") and b'"usage":{' in line:
                usage = json.loads(line[6:])["usage"]
        conn.close()
        assert usage is not None
        used = usage["prompt_tokens"] + usage["completion_tokens"]
        wait_for(lambda: round(100_000 - bucket(g)) == used, 30, f"the charge to be settled to {used}")
    finally:
        g.stop()


STOPPED = {"model": "", "messages": [{"role": "user", "content": "hello"}], "max_completion_tokens": 2000,
           "ignore_eos": True, "stream": True}
STOPPED_PROMPT = 1 + 4 + (4 + 1)


def test_a_stream_the_backend_leaves_silent_is_charged_what_came(
        tmp_path: Path, emu: Emulator, mode: dict[str, Any]) -> None:
    g = gateway(tmp_path, emu, mode, rate=0.001, burst=100_000, backend_timeout_s=1)
    try:
        before = generated(emu)
        pause = lambda: emu.json("POST", "/admin/faults", {"paused": True})  # noqa: E731
        status, read, _ = ask(g, "/v1/chat/completions", {**STOPPED, "model": model(emu)}, at=(20, pause))
        assert status == 200 and 20 <= read < 2000  # the gateway ended the stream: the backend was silent
        made = generated(emu) - before
        lo, hi = STOPPED_PROMPT + read, STOPPED_PROMPT + made + 1
        wait_for(lambda: lo <= round(100_000 - bucket(g)) <= hi, 30, f"the charge to be settled within [{lo}, {hi}]")
        assert [x["outcome"] for x in g.request_log()] == ["backend-broken"]
    finally:
        emu.json("POST", "/admin/faults", {"paused": False})
        g.stop()


def test_a_stream_whose_backend_dies_is_charged_what_came(tmp_path: Path, mode: dict[str, Any]) -> None:
    doomed = start_emulator("--max-model-len", str(CONTEXT))
    g = gateway(tmp_path, doomed, mode, rate=0.001, burst=100_000)
    try:
        status, read, _ = ask(g, "/v1/chat/completions", {**STOPPED, "model": model(doomed)},
                              at=(20, doomed.proc.kill))
        assert status == 200 and 20 <= read < 2000
        upfront = STOPPED_PROMPT + 2000
        charged = wait_for(lambda: c if (c := round(100_000 - bucket(g))) < upfront else None, 30,
                           "the up-front charge to be settled")
        assert STOPPED_PROMPT + read <= charged, (charged, read)
        assert [x["outcome"] for x in g.request_log()] == ["backend-broken"]
    finally:
        g.stop()
        doomed.stop()
