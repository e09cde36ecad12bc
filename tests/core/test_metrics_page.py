"""core/metrics_page.py: the one reader of a /metrics page reads what prometheus_client's parser reads, and
refuses what is not Prometheus text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from admit.core import metrics_page as mp
from admit.gateway.telemetry import parse_engine_metrics
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

VLLM_PAGE = (Path(__file__).parents[1] / "data" / "vllm-0.32.0" / "metrics.txt").read_text()


def reference(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample as prometheus_client's parser reads it."""
    return [(s.name, s.labels, float(s.value)) for f in text_string_to_metric_families(text) for s in f.samples]


def read(text: str, names: set[str] | None = None) -> list[tuple[str, dict[str, str], float]]:
    return [tuple(s) for s in mp.samples(text, names)]  # type: ignore[misc]


def same(a: list[tuple[str, dict[str, str], float]], b: list[tuple[str, dict[str, str], float]]) -> bool:
    return len(a) == len(b) and all(
        x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2]))) for x, y in zip(a, b, strict=True))


def test_a_real_vllm_page_reads_as_prometheus_client_reads_it():
    got = read(VLLM_PAGE)
    assert len(got) == 445 and same(got, reference(VLLM_PAGE))
    (info,) = mp.samples(VLLM_PAGE, {mp.CACHE_INFO})
    assert info.labels["num_gpu_blocks"] == "364" and info.labels["kv_cache_dtype_skip_layers"] == "[]"


label_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(label_values, st.floats(allow_nan=True), st.floats(0, 1e6)), min_size=1, max_size=4))
def test_any_page_prometheus_client_writes_reads_back_the_same(rows):
    """Label values with quotes, backslashes, newlines, braces and commas; NaN, ±Inf; counters and histograms."""
    reg = CollectorRegistry()
    g = Gauge("vllm:g", "a gauge", ["engine", "model_name"], registry=reg)
    c = Counter("vllm:c", "a counter", ["engine"], registry=reg)
    h = Histogram("vllm:h_seconds", "a histogram", ["engine"], buckets=(0.1, 1.0, 10.0), registry=reg)
    for i, (label, value, seen) in enumerate(rows):
        g.labels(str(i), label).set(value)
        c.labels(label).inc(seen)
        h.labels(label).observe(seen)
    page = generate_latest(reg).decode()
    assert same(read(page), reference(page))


def test_what_the_format_allows_beside_what_prometheus_client_writes():
    page = "\n".join([
        "# a comment, then a blank line",
        "",
        '  vllm:a{engine="0",} 1 1700000000000  ',  # a trailing comma, a timestamp, white space around
        'vllm:a { engine = "1" , model_name="x}y,z" } +Inf',
        "vllm:b NaN",
        'vllm:c{q="a\\\\b\\"c\\nd\\t"}\t-1.5e3',  # the three escapes; any other backslash is kept
        "vllm:d{} 0",
    ])
    assert same(read(page), reference(page))
    assert read(page)[3] == ("vllm:c", {"q": 'a\\b"c\nd\\t'}, -1500.0)


def test_only_the_samples_asked_for_come_back_and_sums_add_over_engines():
    two = VLLM_PAGE.replace('vllm:num_requests_running{engine="0",model_name="smollm2-135m-instruct"} 0.0',
                            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
                            'vllm:num_requests_running{engine="1",model_name="m"} 3.0')
    assert [s.name for s in mp.samples(two, {mp.RUNNING, mp.KV})] == [mp.RUNNING, mp.RUNNING, mp.KV]
    assert mp.sums(two, (mp.RUNNING, mp.WAITING, "vllm:absent")) == {mp.RUNNING: 5.0, mp.WAITING: 0.0}
    assert mp.in_engine(two) == 5.0 and mp.in_engine(VLLM_PAGE) == 0.0
    assert mp.in_engine("vllm:num_requests_running 4\nvllm:num_requests_waiting 1") == 5.0  # no labels: counted
    assert mp.in_engine("") == 0.0


@pytest.mark.parametrize(("page", "why"), [
    ("<html><body>502 Bad Gateway</body></html>", r"line 1: not a Prometheus sample"),
    ("vllm:a 1\nvllm:b", r"line 2: not a Prometheus sample"),
    ("vllm:a one", r"line 1: value 'one' is not a number"),
    ("vllm:a 1_000", r"line 1: value '1_000' is not a number"),
    ("vllm:a 1 noon", r"line 1: timestamp 'noon' is not a number"),
    ('vllm:a{x="1",x="2"} 1', r"line 1: label 'x' given twice"),
    ('vllm:a{x=1} 1', r"line 1: labels \{x=1\} are not"),
    ('vllm:a{x="1" y="2"} 1', r"line 1: labels .* are not"),
    ('vllm:a{x="1} 1', r"line 1: not a Prometheus sample"),
    ("9vllm 1", r"line 1: not a Prometheus sample"),
])
def test_what_is_not_prometheus_text_is_refused_with_its_line(page, why):
    with pytest.raises(mp.MetricsPageError, match=why):
        mp.samples(page)
    with pytest.raises(ValueError):
        reference(page)  # prometheus_client refuses it too


def test_the_gateway_reads_kv_as_the_mean_and_counts_as_sums_over_engines():
    page = "\n".join([
        '# TYPE vllm:kv_cache_usage_perc gauge',
        'vllm:kv_cache_usage_perc{engine="0"} 0.25',
        'vllm:kv_cache_usage_perc{engine="1"} 0.75',
        'vllm:num_requests_running{engine="0"} 3',
        'vllm:num_requests_running{engine="1"} 4',
        'vllm:num_preemptions_total{engine="0"} 2',
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5"} 1',
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5"} 2',
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 4',
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 5',
    ])
    assert parse_engine_metrics(page) == {"kv": 0.5, "running": 7.0, "waiting": None, "preemptions": 2.0,
                                          "ttft_buckets": [(0.5, 3.0), (math.inf, 9.0)]}
    got = parse_engine_metrics(VLLM_PAGE)
    assert (got["kv"], got["running"], got["waiting"], got["preemptions"]) == (0.0, 0.0, 0.0, 0.0)
    assert got["ttft_buckets"][-1] == (math.inf, 4.0) and len(got["ttft_buckets"]) == 23
