"""The percentile definitions of core/percentiles.py: each is the one it names."""

import math

import numpy as np
import pytest
from admit.core import percentiles as pc
from hypothesis import given
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
