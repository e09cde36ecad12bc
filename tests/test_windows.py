import numpy as np
from admit.core.windows import EventWindow, LatencyWindow, percentiles
from hypothesis import given
from hypothesis import strategies as st


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=60))
def test_percentiles_match_numpy_linear(values):
    got = percentiles(sorted(values), [50, 95, 99])
    want = np.percentile(values, [50, 95, 99])
    assert np.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_empty_window_gives_zeros():
    assert percentiles([], [50, 99]) == [0.0, 0.0]


def test_windows_forget_old_samples():
    w = LatencyWindow(6.0)
    e = EventWindow(6.0)
    for t, v in [(0.0, 100.0), (3.0, 1.0), (5.0, 2.0)]:
        w.add(t, v)
        e.add(t)
    assert w.percentiles(5.0, [100])[0] == 100.0
    assert w.percentiles(6.5, [100])[0] == 2.0  # the sample at t=0 left the window
    assert e.count(6.5) == 2
    assert e.count(100.0) == 0
