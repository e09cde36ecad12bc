"""Bad requests get OpenAI-style 400s; a client that goes away frees its KV; injected faults take effect;
with an admin token configured, the fault and debug endpoints answer only to it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import openai
import pytest
from emulator_helpers import Emulator, start_emulator

MODEL = "m"


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator("--model", MODEL, "--max-model-len", "1024", "--num-gpu-blocks", "64", "--max-num-seqs", "1")
    yield e
    e.stop()


@pytest.mark.parametrize(
    ("path", "raw", "param", "needle"),
    [
        ("/v1/completions", b"{not json", None, "not valid JSON"),
        ("/v1/completions", b"[1, 2]", None, "JSON object"),
        ("/v1/completions", b'{"max_tokens": 5}', "prompt", "prompt"),
        ("/v1/chat/completions", b'{"max_tokens": 5}', "messages", "messages"),
        ("/v1/chat/completions", b'{"messages": []}', "messages", "non-empty"),
        ("/v1/chat/completions", b'{"messages": [{"content": "x"}]}', "messages", "role"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": "ten"}', "max_tokens", "integer"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens", "at least 1"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 1023}', "max_tokens", "1024"),
        ("/v1/completions", b'{"prompt": 7}', "prompt", "prompt"),
        ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "stream", "boolean"),
        ("/v1/completions", b'{"prompt": "x", "stream_options": {"include_usage": true}}', "stream_options", "stream"),
        ("/v1/completions", b'{"prompt": "x", "n": 2}', "n", "n=1"),
        ("/v1/completions", b'{"prompt": ["a", "b"]}', "prompt", "one prompt"),
    ],
)
def test_bad_request_is_an_openai_400(emu: Emulator, path: str, raw: bytes, param: str | None, needle: str) -> None:
    status, body = emu.request("POST", path, raw=raw)
    assert status == 400
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == 400 and err["type"] == "BadRequestError" and err["param"] == param
    assert needle in err["message"]


def test_unknown_route_and_wrong_method(emu: Emulator) -> None:
    status, body = emu.json("GET", "/v1/nothing")
    assert status == 404 and body["error"]["code"] == 404
    status, body = emu.json("GET", "/v1/completions")
    assert status == 405 and "POST" in body["error"]["message"]


def _open_stream(emu: Emulator, max_tokens: int) -> socket.socket:
    s = socket.create_connection(emu.host_port, timeout=10)
    body = json.dumps({"model": MODEL, "prompt": "hello " * 30, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True}).encode()  # fmt: skip
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return s


def _read_until(s: socket.socket, needle: bytes) -> bytes:
    data = b""
    while needle not in data:
        chunk = s.recv(65536)
        assert chunk, "connection closed early"
        data += chunk
    return data


def test_disconnect_aborts_and_frees_the_slot(emu: Emulator) -> None:
    aborts = emu.value("admit_emulator_client_aborts_total")
    finished = emu.value("vllm:request_success_total", finished_reason="abort")
    s = _open_stream(emu, 900)  # about 5 s of tokens on the H200 preset
    _read_until(s, b'"text":"')  # the first token arrived
    assert emu.value("vllm:num_requests_running") == 1
    assert emu.value("vllm:kv_cache_usage_perc") > 0
    s.close()
    emu.wait_for(lambda: emu.value("vllm:num_requests_running") == 0, what="the aborted request to leave")
    assert emu.value("vllm:kv_cache_usage_perc") == 0
    assert emu.value("admit_emulator_client_aborts_total") == aborts + 1
    # as real vLLM 0.32: a client's abort is no finished request of any reason
    assert emu.value("vllm:request_success_total", finished_reason="abort") == finished
    # max_num_seqs is 1: the freed slot serves the next request at once
    status, body = emu.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 3, "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 3


def test_error_rate_fault(emu: Emulator) -> None:
    client = openai.OpenAI(base_url=emu.url + "/v1", api_key="x", max_retries=0)
    try:
        assert emu.json("POST", "/admin/faults", {"error_rate": 1.0, "error_status": 500})[0] == 200
        with pytest.raises(openai.InternalServerError):
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        emu.json("POST", "/admin/faults", {"error_status": 503})
        status, body = emu.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 503 and body["error"]["code"] == 503
    finally:
        emu.json("POST", "/admin/faults", {"error_rate": 0.0})
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens >= 1


def test_fault_settings_are_validated(emu: Emulator) -> None:
    for body, param in (({"latency": 2}, "latency"), ({"latency_multiplier": 0}, "latency_multiplier"),
                        ({"error_rate": 1.5}, "error_rate"), ({"error_status": 404}, "error_status"),
                        ({"paused": "yes"}, "paused")):  # fmt: skip
        status, err = emu.json("POST", "/admin/faults", body)
        assert status == 400 and err["error"]["param"] == param, body
    _, faults = emu.json("GET", "/admin/faults")
    assert faults == {"latency_multiplier": 1.0, "error_rate": 0.0, "error_status": 503, "paused": False,
                      "startup_delay_s": 0.0}  # fmt: skip


def _model_tpot(emu: Emulator, output: int) -> float:
    status, body = emu.json("POST", "/v1/completions", {"prompt": "hello " * 50, "max_tokens": output,
                                                        "ignore_eos": True})  # fmt: skip
    assert status == 200
    _, dbg = emu.json("GET", "/debug/requests")
    row = dict(zip(dbg["fields"], dbg["rows"][-1], strict=True))
    return (row["finished"] - row["first_token"]) / (row["output_tokens"] - 1)


def test_latency_multiplier_scales_step_times(emu: Emulator) -> None:
    base = _model_tpot(emu, 20)
    try:
        emu.json("POST", "/admin/faults", {"latency_multiplier": 3.0})
        t0 = time.monotonic()
        slow = _model_tpot(emu, 20)
        wall = time.monotonic() - t0
    finally:
        emu.json("POST", "/admin/faults", {"latency_multiplier": 1.0})
    assert slow / base == pytest.approx(3.0, rel=1e-6)  # the same steps, each 3x longer on the wall clock
    assert wall >= 19 * slow  # and the client really waited for them


def test_pause_stops_tokens_and_resume_finishes(emu: Emulator) -> None:
    # about 3 s of tokens: the stream must still be running when the pause lands, even on a loaded machine
    s = _open_stream(emu, 600)
    try:
        got = _read_until(s, b'"text":"')
        emu.json("POST", "/admin/faults", {"paused": True})
        gen = emu.value("vllm:generation_tokens_total")
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):  # drain what was sent before the pause; then nothing may arrive
            while True:
                got += s.recv(65536)
        assert b"[DONE]" not in got
        assert emu.value("vllm:generation_tokens_total") == gen
        emu.json("POST", "/admin/faults", {"paused": False})
        s.settimeout(10)
        while b"data: [DONE]" not in got:
            chunk = s.recv(65536)
            assert chunk
            got += chunk
        assert got.count(b'"text":" ') == 600
    finally:
        emu.json("POST", "/admin/faults", {"paused": False})
        s.close()


def test_slow_startup_reports_not_ready() -> None:
    # 3 s, not 1: the two 503s below must be asked for before the delay ends, however slow the machine is
    # between the emulator printing its address and answering
    e = start_emulator("--startup-delay", "3.0", wait_ready=False)
    try:
        status, body = e.json("GET", "/health")
        assert status == 503
        assert e.json("POST", "/v1/completions", {"prompt": "x"})[0] == 503
        e.wait_for(lambda: e.request("GET", "/health")[0] == 200, 30.0, "start-up to finish")
        e.json("POST", "/admin/faults", {"startup_delay_s": 30})
        assert e.request("GET", "/health")[0] == 503
        e.json("POST", "/admin/faults", {"startup_delay_s": 0})
        assert e.request("GET", "/health")[0] == 200
    finally:
        e.stop()


def test_expect_100_continue(emu: Emulator) -> None:
    body = b'{"prompt": "x", "max_tokens": 2, "ignore_eos": true}'
    with socket.create_connection(emu.host_port, timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
                  % len(body))  # fmt: skip
        assert _read_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body)
        assert _read_until(s, b'"completion_tokens": 2').startswith(b"HTTP/1.1 200 OK")


TOKEN = "emu-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEFAULT_FAULTS = {"latency_multiplier": 1.0, "error_rate": 0.0, "error_status": 503, "paused": False,
                  "startup_delay_s": 0.0}  # fmt: skip


@pytest.fixture(scope="module")
def guarded() -> Iterator[Emulator]:
    e = start_emulator("--model", MODEL, "--max-model-len", "1024", "--admin-token-env", "ADMIT_TEST_EMU_TOKEN",
                       env={"ADMIT_TEST_EMU_TOKEN": TOKEN})
    yield e
    e.stop()


@pytest.mark.parametrize(
    "headers",
    [None, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Bearer {TOKEN[:-1]}"},
     {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"},
     {"Authorization": "Bearer "}],
    ids=["none", "wrong", "prefix", "longer", "no-scheme", "basic", "empty"],
)
def test_with_a_token_faults_and_debug_need_it(guarded: Emulator, headers: dict[str, str] | None) -> None:
    for method, path, body in (("POST", "/admin/faults", {"error_rate": 1.0, "paused": True}),
                               ("GET", "/admin/faults", None), ("GET", "/debug/requests", None)):  # fmt: skip
        status, head, raw = guarded.request_full(method, path, body, headers=headers)
        assert status == 401, (method, path)
        assert head["content-type"] == "application/json" and head["www-authenticate"] == "Bearer"
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert (err["code"], err["type"]) == (401, "AuthenticationError") and "admin token" in err["message"]
        assert TOKEN not in raw.decode()
    assert guarded.json("GET", "/admin/faults", headers=AUTH) == (200, DEFAULT_FAULTS)  # nothing was applied
    # the OpenAI routes, health and metrics stay open: the token guards only the test knobs
    status, answer = guarded.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, "ignore_eos": True})
    assert status == 200 and answer["usage"]["completion_tokens"] == 2
    assert guarded.request("GET", "/health")[0] == 200 and guarded.request("GET", "/metrics")[0] == 200


def test_with_the_right_token_faults_apply(guarded: Emulator) -> None:
    try:
        status, faults = guarded.json("POST", "/admin/faults", {"error_rate": 1.0, "error_status": 500}, headers=AUTH)
        assert status == 200 and (faults["error_rate"], faults["error_status"]) == (1.0, 500)
        assert guarded.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 500
        # the scheme is case-insensitive, as in HTTP
        lower = {"Authorization": f"bearer {TOKEN}"}
        assert guarded.json("POST", "/admin/faults", {"error_rate": 0.0}, headers=lower)[0] == 200
        assert guarded.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
        status, dbg = guarded.json("GET", "/debug/requests", headers=AUTH)
        assert status == 200 and dbg["rows"] and "event_lateness_s" in dbg
        # a bad value with the right token is still a 400 naming the key
        status, err = guarded.json("POST", "/admin/faults", {"error_rate": 2}, headers=AUTH)
        assert status == 400 and err["error"]["param"] == "error_rate"
    finally:
        guarded.json("POST", "/admin/faults", {"error_rate": 0.0, "error_status": 503}, headers=AUTH)
    assert guarded.json("GET", "/admin/faults", headers=AUTH) == (200, DEFAULT_FAULTS)


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--admin-token-env", "ADMIT_TEST_EMU_UNSET"], {}, "ADMIT_TEST_EMU_UNSET is not set"),
        (["--admin-token-env", "ADMIT_TEST_EMU_TOKEN"], {"ADMIT_TEST_EMU_TOKEN": "short"}, "at least 16 characters"),
        (["--admin-token", "has a space in it, 16+"], {}, "visible ASCII"),
        (["--admin-token", TOKEN, "--admin-token-env", "ADMIT_TEST_EMU_TOKEN"], {"ADMIT_TEST_EMU_TOKEN": TOKEN},
         "not both"),
    ],
    ids=["unset", "short", "space", "both"],
)
def test_a_bad_admin_token_stops_start_up(args: list[str], env: dict[str, str], needle: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ADMIT_TEST_EMU_")}
    out = subprocess.run([sys.executable, "-m", "admit.emulator", "--port", "0", *args], capture_output=True,
                         text=True, env={**base, **env}, timeout=60)  # fmt: skip
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert "listening on" not in out.stdout
    for value in env.values():
        assert value not in out.stderr  # the token is never echoed
