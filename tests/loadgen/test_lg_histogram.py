import math

import numpy as np
from admit.loadgen.histogram import SIG_BITS, Histogram, bucket_bounds, bucket_index
from hypothesis import given, settings
from hypothesis import strategies as st

REL = 2.0 ** -(SIG_BITS - 1)


def test_buckets_are_contiguous_and_contain_their_values():
    prev_high = 0
    for idx in range(0, 40 * (1 << (SIG_BITS - 1))):
        low, high = bucket_bounds(idx)
        assert low == prev_high
        assert bucket_index(low) == idx and bucket_index(high - 1) == idx
        prev_high = high


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 10**11), min_size=1, max_size=400),
    st.sampled_from([50.0, 90.0, 99.0, 99.9, 100.0]),
)
def test_percentile_within_bucket_precision_of_exact(values, q):
    h = Histogram()
    for v in values:
        h.record(v)
    exact = float(np.percentile(values, q, method="inverted_cdf"))
    got = h.percentile(q)
    assert abs(got - exact) <= max(1.0, exact * REL)
    assert h.count == len(values) and h.total == sum(values)
    assert h.min == min(values) and h.max == max(values)
    assert math.isclose(h.mean, sum(values) / len(values))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 10**9)), st.lists(st.integers(0, 10**9)))
def test_merge_equals_recording_everything_in_one(a, b):
    ha, hb, hall = Histogram(), Histogram(), Histogram()
    for v in a:
        ha.record(v)
        hall.record(v)
    for v in b:
        hb.record(v)
        hall.record(v)
    merged = ha.merge(hb)
    assert merged.counts == hall.counts
    assert (merged.count, merged.total, merged.min, merged.max) == (
        hall.count,
        hall.total,
        hall.min,
        hall.max,
    )


def test_roundtrip_through_dict_and_empty_histogram():
    h = Histogram()
    assert math.isnan(h.percentile(50)) and math.isnan(h.mean)
    for v in (5, 1_000, 123_456_789):
        h.record(v)
    again = Histogram.from_dict(h.to_dict())
    assert again == h
    h.record(-3)  # negative samples clamp to zero
    assert h.min == 0
