"""The gateway as an OpenAI-compatible proxy: the official client, streaming, logs, disconnects, no backend."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from admit.loadgen.traces import read_jsonl
from gateway_helpers import CountingMock, GatewayProcess, MockProcess, http, key, tenant_cfg, wait_for

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    m = CountingMock(ttft_ms=0, itl_ms=10)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def gw(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    g = GatewayProcess(tmp_path_factory.mktemp("gw"), mock.url, {"tenants": [tenant_cfg("alpha", limit=4)]})
    yield g
    g.stop()


def client(gw: GatewayProcess, tenant: str = "alpha") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key(tenant), max_retries=0, timeout=20)


def test_openai_client_completions_and_models(gw: GatewayProcess) -> None:
    c = client(gw)
    r = c.completions.create(model="mock", prompt="one two three", max_tokens=7)
    assert r.choices[0].text == " tok" * 7
    assert r.usage is not None and r.usage.completion_tokens == 7
    chat = c.chat.completions.create(model="mock", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.choices[0].message.content == " tok" * 3
    assert [m.id for m in c.models.list()] == ["mock"]


def test_streaming_passes_chunks_through_as_they_come(gw: GatewayProcess) -> None:
    c = client(gw)
    t0 = time.monotonic()
    arrivals = []
    stream = c.chat.completions.create(
        model="mock", messages=[{"role": "user", "content": "hi"}], max_tokens=100, stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    texts = []
    for ch in stream:
        arrivals.append(time.monotonic() - t0)
        if ch.choices:
            texts.append(ch.choices[0].delta.content)
        if ch.usage is not None:
            usage = ch.usage
    assert texts == [" tok"] * 100
    assert usage is not None and usage.completion_tokens == 100
    # 100 tokens 10 ms apart (1 s, so that a stall of this process for a few hundred ms cannot bunch them up):
    # a proxy that buffered the answer would deliver every chunk at the end
    assert arrivals[-1] - arrivals[0] > 0.15
    assert arrivals[0] < 0.5 * arrivals[-1]


def test_wrong_key_is_401_json_and_logged_without_the_key(gw: GatewayProcess) -> None:
    bad = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-not-a-real-key-xyz", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        bad.completions.create(model="mock", prompt="x", max_tokens=2)
    assert exc.value.status_code == 401
    assert exc.value.response.headers["x-admit-reason"] == "unauthorized"
    status, _, _ = http("POST", gw.url + "/v1/completions", {"model": "mock", "prompt": "x"})  # no key at all
    assert status == 401
    lines = wait_for(lambda: [x for x in gw.request_log() if x["outcome"] == "unauthorized"], what="401 log lines")
    assert all(x["tenant"] is None for x in lines)
    text = gw.request_log_path.read_text() + gw.stderr()
    assert "sk-not-a-real-key-xyz" not in text and key("alpha") not in text


def test_request_log_lines_are_complete_and_replayable(gw: GatewayProcess, tmp_path: Path) -> None:
    c = client(gw)
    for _ in c.with_options(default_headers={"x-admit-step-id": "step-42"}).completions.create(
        model="mock", prompt="a b c d", max_tokens=5, stream=True
    ):
        pass
    c.completions.create(model="mock", prompt="a b c d", max_tokens=6)
    lines = wait_for(lambda: [x for x in gw.request_log() if x["path"] == "/v1/completions" and x["outcome"] == "ok"],
                     what="log lines")
    streamed = next(x for x in lines if x["step_id"] == "step-42")
    assert streamed["stream"] is True and streamed["output_tokens"] == 5 and streamed["status"] == 200
    assert 0 <= streamed["queue_wait_s"] <= streamed["ttft_s"] <= streamed["e2e_s"]
    plain = next(x for x in lines if x["step_id"] is None and x["output_tokens"] == 6)
    assert plain["prompt_tokens"] == 4  # the backend's usage count wins over the gateway's estimate
    assert plain["tenant"] == "alpha" and plain["model"] == "mock"
    trace = read_jsonl(gw.request_log_path, tenant="alpha")  # `admit loadgen` reads the log as a trace
    assert len(trace.arrivals) >= 2 and (trace.arrivals >= 0).all()


def test_the_log_splits_ttft_into_queue_wait_backend_and_the_gateways_own_part(tmp_path: Path) -> None:
    """A backend 300 ms to its first token and a limit of 1: a second request sent once the backend holds the
    first waits for it. Each line's ``backend_ttft_s`` holds the backend's 300 ms, ``queue_wait_s`` the wait, and
    ``overhead_s`` only what is left of the TTFT (the gateway's own work), far below either."""
    slow = CountingMock(ttft_ms=300, itl_ms=1)
    g = GatewayProcess(tmp_path, slow.url, {"tenants": [tenant_cfg("alpha", limit=1)]})
    try:
        c = client(g)

        def one(tag: str) -> None:
            for _ in c.with_options(default_headers={"x-admit-step-id": tag}).completions.create(
                    model="mock", prompt="a b", max_tokens=3, stream=True):
                pass

        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(one, "first")
            wait_for(lambda: slow.counter.started >= 1 or first.done(), 10, "the backend holding the first request")
            second = pool.submit(one, "second")
            first.result(), second.result()
        lines = wait_for(lambda: ls if len(ls := g.request_log()) == 2 else [], 10, "two log lines")
        for x in lines:
            # the mock times its 300 ms on its event loop's clock (whole milliseconds, read once per loop turn):
            # it can answer a few ms early by the gateway's precise clock
            assert x["outcome"] == "ok" and 0.28 <= x["backend_ttft_s"] < x["ttft_s"]
            assert x["overhead_s"] == pytest.approx(x["ttft_s"] - x["queue_wait_s"] - x["backend_ttft_s"], abs=3e-6)
            assert x["overhead_s"] < 0.1  # neither the wait nor the backend in it
        a, b = (next(x for x in lines if x["step_id"] == tag) for tag in ("first", "second"))
        # the second goes upstream only once the first has its answer: its admission (arrival + wait) comes after
        # the first's first token, however late the second was sent
        assert b["arrival"] + b["queue_wait_s"] >= a["arrival"] + a["ttft_s"] - 1e-3
        assert b["ttft_s"] == pytest.approx(b["queue_wait_s"] + b["backend_ttft_s"] + b["overhead_s"], abs=3e-6)
    finally:
        g.stop()
        slow.stop()


def test_sigusr1_writes_the_gateways_stacks_and_it_keeps_serving(gw: GatewayProcess) -> None:
    """An operator's (and a failing test's) look inside a gateway that stopped answering."""
    assert "File " in gw.stacks() and 'in run' in gw.stderr()  # uvloop's run: the event loop's frame
    assert gw.proc.poll() is None
    assert client(gw).completions.create(model="mock", prompt="a", max_tokens=2).choices


def test_log_line_exists_when_the_client_has_the_answer(gw: GatewayProcess) -> None:
    """No waiting: the line is written before the answer's last byte (streamed, whole, and an error)."""
    c = client(gw)
    tag = {"x-admit-step-id": f"now-{time.monotonic_ns()}"}
    for _ in c.with_options(default_headers=tag).completions.create(model="mock", prompt="a", max_tokens=3,
                                                                    stream=True):
        pass
    assert [x["outcome"] for x in gw.request_log() if x["step_id"] == tag["x-admit-step-id"]] == ["ok"]
    tag = {"x-admit-step-id": f"now-{time.monotonic_ns()}"}
    c.with_options(default_headers=tag).completions.create(model="mock", prompt="a", max_tokens=3)
    assert [x["output_tokens"] for x in gw.request_log() if x["step_id"] == tag["x-admit-step-id"]] == [3]
    tag = {"x-admit-step-id": f"now-{time.monotonic_ns()}"}
    with pytest.raises(openai.BadRequestError):
        c.with_options(default_headers=tag).completions.create(model="mock", prompt="a", max_tokens=-1)
    assert [x["status"] for x in gw.request_log() if x["step_id"] == tag["x-admit-step-id"]] == [400]


async def _read_first_chunk_then_leave(url: str, api_key: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b'{"model":"mock","prompt":"x","max_tokens":500,"stream":true}'
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + api_key.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    got = await asyncio.wait_for(reader.readuntil(b"data:"), 10)
    writer.transport.abort()  # RST: the client is gone mid-stream
    return got


def test_client_disconnect_mid_stream_frees_the_slot_and_cancels_upstream(
    gw: GatewayProcess, mock: CountingMock
) -> None:
    lost_before = mock.counter.lost
    head = asyncio.run(_read_first_chunk_then_leave(gw.url, key("alpha")))
    assert head.startswith(b"HTTP/1.1 200")
    # 500 tokens at 10 ms would stream for 5 s. `lost` counts only a connection closed while its stream was
    # running (a stream that ends by itself leaves its pooled connection open), so it proves the cancellation
    # exactly and the deadlines can be generous
    wait_for(lambda: mock.counter.lost > lost_before, 20, "the upstream stream to be cancelled")
    wait_for(lambda: gw.state()["tenants"]["alpha"]["in_flight"] == 0, 20, "the slot to be free")
    line = wait_for(lambda: [x for x in gw.request_log() if x["outcome"] == "client-disconnect"], 20, "log line")
    assert line[-1]["status"] == 499 and line[-1]["tenant"] == "alpha"


def test_backend_down_is_503_no_backend(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    g = GatewayProcess(tmp_path, f"http://127.0.0.1:{port}", {"tenants": [tenant_cfg("alpha")]})
    try:
        c = client(g)
        with pytest.raises(openai.InternalServerError) as exc:
            c.completions.create(model="mock", prompt="x", max_tokens=2)
        assert exc.value.status_code == 503
        headers = exc.value.response.headers
        assert headers["x-admit-reason"] == "no-backend" and "retry-after" in headers
        assert exc.value.response.json()["reason"] == "no-backend"
        with pytest.raises(openai.InternalServerError):
            c.models.list()
        assert g.state()["tenants"]["alpha"]["in_flight"] == 0
        line = wait_for(lambda: [x for x in g.request_log() if x["path"] == "/v1/completions"], what="log")
        assert line[0]["outcome"] == "no-backend" and line[0]["status"] == 503
    finally:
        g.stop()


def test_backend_restart_is_served_again(tmp_path: Path) -> None:
    m = MockProcess(itl_ms=0)
    g = GatewayProcess(tmp_path, m.url, {"tenants": [tenant_cfg("alpha")]})
    try:
        c = client(g)
        assert c.completions.create(model="mock", prompt="x", max_tokens=2).choices
        m.kill()
        with pytest.raises(openai.InternalServerError):
            c.completions.create(model="mock", prompt="x", max_tokens=2)
        m.restart()
        # the pooled keep-alive connection died with the old process; the gateway must not answer 503 now
        assert c.completions.create(model="mock", prompt="x", max_tokens=2).choices
    finally:
        g.stop()
        m.stop()


class _HeldTerminator:
    """A streaming backend that sends a whole SSE answer, [DONE] included, as one chunk and holds back the
    chunked encoding's terminator until ``release``: as llama.cpp's server may, in a later write."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._srv.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:  # stopped
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                if not (got := conn.recv(65536)):
                    return
                head += got
            if not head.startswith(b"POST /v1/completions"):  # the gateway's probes of its backend
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                return
            events = b"".join(b'data: {"choices":[{"index":0,"text":"t%d"}]}\n\n' % i for i in range(3))
            events += b"data: [DONE]\n\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n" % (len(events), events))
            self.release.wait(30)
            conn.sendall(b"0\r\n\r\n")

    def stop(self) -> None:
        self.release.set()
        self._srv.close()


def test_a_client_that_hangs_up_at_done_is_logged_ok(tmp_path: Path) -> None:
    """The official client stops reading at [DONE] and closes; if the backend's last bytes come later the
    request is still complete: outcome ok with its tokens, not a client disconnect (CI caught this race
    with llama.cpp)."""
    backend = _HeldTerminator()
    g = GatewayProcess(tmp_path, backend.url, {"tenants": [tenant_cfg("alpha", limit=1)]})
    try:
        c = client(g)
        stream = c.completions.create(model="m", prompt="hi", max_tokens=3, stream=True)
        assert [ch.choices[0].text for ch in stream] == ["t0", "t1", "t2"]
        stream.close()
        line = wait_for(lambda: g.request_log(), 10, "the request's log line")[0]
        assert (line["outcome"], line["status"], line["output_tokens"]) == ("ok", 200, 3)
        backend.release.set()
        wait_for(lambda: g.state()["tenants"]["alpha"]["in_flight"] == 0, 10, "the lease to come back")
    finally:
        backend.stop()
        g.stop()
