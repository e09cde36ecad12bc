"""The percentile definitions of core/percentiles.py: each is the one it names."""

import math

import numpy as np
import pytest
from admit.core import percentiles as pc
from hypothesis import given, settings
from hypothesis import strategies as st

samples = st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=60)


@given(samples)
def test_linear_matches_numpy_linear(values):
    got = pc.linear(sorted(values), [50, 95, 99])
    want = np.percentile(values, [50, 95, 99])
    assert np.allclose(got, want, rtol=1e-9, atol=1e-9)
    assert pc.p50_p95_p99(sorted(values)) == pytest.approx(got, rel=1e-12, abs=1e-12)
    assert pc.linear_np_many(values, [50, 95, 99]) == [pc.linear_np(values, q) for q in (50, 95, 99)]


@given(st.lists(st.one_of(st.floats(0, 1e4, allow_nan=False), st.integers(0, 50).map(float)), min_size=1,
                max_size=400),
       st.lists(st.one_of(st.sampled_from([0, 1, 25, 50, 90, 95, 99, 99.9, 100]), st.floats(0, 100)), min_size=1,
                max_size=5))
def test_linear_np_many_is_numpys_percentile_bit_for_bit(values, qs):
    """Any sizes, ties (the integer draws repeat), any q: the very numbers np.percentile returns."""
    want = [float(x) for x in np.percentile(values, qs)]
    assert pc.linear_np_many(values, qs) == want
    assert pc.linear_np(np.asarray(values), qs[0]) == want[0]


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=300), st.integers(0, 5),
       st.lists(st.one_of(st.sampled_from([0, 50, 95, 99, 100]), st.floats(0, 100)), min_size=1, max_size=4))
def test_the_one_linear_percentile_is_numpys_linear_on_any_slice(values, lo, qs):
    """linear_at reads the sorted slice v[lo:lo + n] of a larger array (as the compiled windows keep them)."""
    v = [-1e9] * lo + sorted(values) + [1e9]
    want = np.percentile(values, qs, method="linear")
    got = [pc.linear_at(v, lo, len(values), q / 100) for q in qs]
    assert np.allclose(got, want, rtol=1e-12, atol=1e-9)
    assert pc.linear(sorted(values), qs) == [pc.linear_at(sorted(values), 0, len(values), q / 100.0) for q in qs]
    assert pc.p50_p95_p99(sorted(values)) == tuple(pc.linear_at(sorted(values), 0, len(values), f)
                                                   for f in (0.5, 0.95, 0.99))


@settings(deadline=None)  # the first example compiles the kernels (or loads them from numba's cache)
@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=2, max_size=200), st.integers(0, 3))
def test_the_compiled_world_runs_the_same_percentile_bit_for_bit(values, lo):
    """envs/kernels.py compiles core/percentiles.linear_at itself: same numbers as the Python windows, to the bit."""
    from admit.envs import kernels

    v = np.array([0.0] * lo + sorted(values) + [0.0])
    out = np.zeros(5)
    kernels._p3(v, lo, len(values), out, 1)
    assert out[1:4].tolist() == list(pc.p50_p95_p99(sorted(values)))
    assert kernels._linear_at(v, lo, len(values), 0.99) == pc.linear_at(sorted(values), 0, len(values), 0.99)


def test_linear_np_refuses_what_numpy_refuses_and_keeps_nan():
    with pytest.raises(ValueError, match=r"Percentiles must be in the range \[0, 100\]"):
        pc.linear_np_many([1.0, 2.0], [50, 101])
    assert math.isnan(pc.linear_np([1.0, math.nan, 2.0], 50))


def test_empty_window_gives_zeros():
    assert pc.linear([], [50, 99]) == [0.0, 0.0]
    assert pc.p50_p95_p99([]) == (0.0, 0.0, 0.0)


@given(samples, st.sampled_from([1, 25, 50, 90, 99, 99.9, 100]))
def test_nearest_rank_is_the_sample_of_rank_ceil(values, q):
    s = sorted(values)
    assert pc.nearest_rank(values, q) == s[pc.nearest_rank_index(q, len(s)) - 1]


def test_nearest_rank_and_linear_differ_where_it_matters():
    values = [0.1] * 97 + [1.0, 2.0, 3.0]  # the tail of a bursty tenant
    assert pc.nearest_rank(values, 99) == 2.0 and pc.linear_np(values, 99) == pytest.approx(2.01)


def test_histogram_quantile_is_prometheus():
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)]
    assert pc.histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (20 - 10) / (30 - 10))
    assert pc.histogram_quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (39.6 - 30) / 10)
    assert pc.histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert pc.histogram_quantile(0.99, [(0.1, 1.0), (math.inf, 5.0)]) == 0.1  # +Inf bucket: the last bound
