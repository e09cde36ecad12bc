"""The emulator's own bounds on a client: a head deadline, a head size, the bytes a client may queue behind an
answer, and who may inject faults when it listens beyond loopback. Real emulator processes, raw sockets."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from admit.emulator.server import loopback_only
from emulator_helpers import Emulator, start_emulator
from proc_helpers import trickle

MODEL = "m"
HEAD_TIMEOUT_S = 1.0
TOKEN = "emu-admin-token-0123456789"


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator("--model", MODEL, "--max-model-len", "4096", "--head-timeout-s", str(HEAD_TIMEOUT_S))
    yield e
    e.stop()


def _answer(s: socket.socket) -> tuple[int, dict]:
    """Read until the server closes; the status and the JSON body of its one answer."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _assert_error(status: int, doc: dict, want: int, needle: str) -> None:
    assert status == want, (status, doc)
    err = doc["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == want and needle in err["message"], err


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


# ----------------------------------------------------------------- the head deadline
def test_a_head_that_never_ends_is_answered_408(emu: Emulator) -> None:
    with socket.create_connection(emu.host_port, timeout=30) as s:  # the timeout bounds a hang
        t0 = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head goes on for ever
        status, doc = _answer(s)
        elapsed = time.monotonic() - t0
    _assert_error(status, doc, 408, "request head took longer than 1 s")
    assert elapsed >= HEAD_TIMEOUT_S * 0.95, elapsed
    assert emu.request("GET", "/health")[0] == 200


def test_a_trickling_head_still_times_out(emu: Emulator) -> None:
    """Bytes that keep coming do not extend the deadline: it runs from the head's first byte."""
    with socket.create_connection(emu.host_port, timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        data, elapsed = trickle(s, b"a", 20 * HEAD_TIMEOUT_S, every=0.2)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout"), data[:300]
    _assert_error(408, json.loads(body), 408, "head took longer")
    assert HEAD_TIMEOUT_S * 0.95 <= elapsed < 10 * HEAD_TIMEOUT_S, elapsed


def test_a_bad_head_timeout_is_refused_at_start() -> None:
    for bad in ("0", "-1", "nan", "inf", "3601"):
        with pytest.raises(RuntimeError, match="did not start"):
            start_emulator("--head-timeout-s", bad)


# ----------------------------------------------------------------- sizes
def test_a_head_over_64_kib_is_431_even_when_it_comes_whole(emu: Emulator) -> None:
    with socket.create_connection(emu.host_port, timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        status, doc = _answer(s)
    _assert_error(status, doc, 431, "larger than 65536 bytes")


def test_bytes_pipelined_behind_a_stream_are_bounded(emu: Emulator) -> None:
    """While a stream is being answered, a client sends 64 MB more on the same connection (a head that never
    ends): the emulator stops reading past 64 KiB of them instead of buffering it all."""
    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 2000, "ignore_eos": True,
                       "stream": True}).encode()
    rss0 = rss_bytes(emu.proc.pid)
    sent = 0
    with socket.create_connection(emu.host_port, timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        data = b""
        while b"data: " not in data:  # the stream has begun: the connection is busy with its answer
            chunk = s.recv(65536)
            assert chunk, data[:300]
            data += chunk
        assert emu.json("POST", "/admin/faults", {"paused": True})[0] == 200  # the stream holds until resumed
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Huge: ")
            s.settimeout(5)  # a send that waits this long: the emulator stopped reading
            chunk = b"b" * (1 << 20)
            while sent < 64 << 20:
                s.sendall(chunk)
                sent += len(chunk)
        except TimeoutError:
            pass
        finally:
            growth = rss_bytes(emu.proc.pid) - rss0
            assert emu.json("POST", "/admin/faults", {"paused": False})[0] == 200
    assert sent < 48 << 20, f"the emulator took {sent >> 20} MB behind a stream without pausing"
    assert growth < 24 << 20, f"the emulator grew by {growth >> 20} MB"
    assert emu.request("GET", "/health")[0] == 200


# ----------------------------------------------------------------- who may inject faults
@pytest.mark.parametrize(("addresses", "open_"), [
    (["127.0.0.1"], True), (["127.0.0.53", "::1"], True), (["0.0.0.0"], False), (["::"], False),
    (["127.0.0.1", "0.0.0.0"], False), (["192.0.2.2"], False), (["localhost"], False), ([], False),
])
def test_faults_are_open_without_a_token_only_on_loopback(addresses: list[str], open_: bool) -> None:
    assert loopback_only(addresses) is open_


def test_on_a_non_loopback_address_faults_need_a_token() -> None:
    """Bound to 0.0.0.0 without a token: /admin/faults and /debug/requests answer 403 and change nothing, the
    OpenAI routes and /metrics still answer. With --admin-token-env the token opens them."""
    e = start_emulator("--model", MODEL, "--max-model-len", "1024", "--host", "0.0.0.0")
    try:
        emu = Emulator(e.proc, e.url.replace("0.0.0.0", "127.0.0.1"))
        for method, path, body in (("POST", "/admin/faults", {"error_rate": 1.0}), ("GET", "/admin/faults", None),
                                   ("GET", "/debug/requests", None)):
            status, doc = emu.json(method, path, body)
            _assert_error(status, doc, 403, "non-loopback address")
            assert doc["error"]["type"] == "PermissionDeniedError" and "--admin-token-env" in doc["error"]["message"]
        status, answer = emu.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, "ignore_eos": True})
        assert status == 200 and answer["usage"]["completion_tokens"] == 2  # no fault was applied
        assert emu.request("GET", "/metrics")[0] == 200
    finally:
        e.stop()
    e = start_emulator("--model", MODEL, "--max-model-len", "1024", "--host", "0.0.0.0", "--admin-token-env",
                       "ADMIT_TEST_EMU_TOKEN", env={"ADMIT_TEST_EMU_TOKEN": TOKEN})
    try:
        emu = Emulator(e.proc, e.url.replace("0.0.0.0", "127.0.0.1"))
        assert emu.json("GET", "/admin/faults")[0] == 401
        status, faults = emu.json("GET", "/admin/faults", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and faults["error_rate"] == 0.0
    finally:
        e.stop()
