import numpy as np
import pytest
from admit.loadgen.arrivals import NS, ArrivalSpec, arrival_times


def rng(seed=1):
    return np.random.default_rng(seed)


def test_constant_is_an_exact_grid():
    t = arrival_times(ArrivalSpec("constant", 4.0), 2.0, rng())
    assert t.tolist() == [0, NS // 4, NS // 2, 3 * NS // 4, NS, 5 * NS // 4, 3 * NS // 2, 7 * NS // 4]


def test_poisson_count_and_gap_dispersion():
    t = arrival_times(ArrivalSpec("poisson", 1000.0), 20.0, rng()) / NS
    assert abs(len(t) - 20_000) < 4 * np.sqrt(20_000)
    gaps = np.diff(t)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.03
    assert t.min() >= 0 and t.max() < 20.0 and np.all(np.diff(t) >= 0)


@pytest.mark.parametrize("k", [0.25, 4.0])
def test_gamma_burstiness_sets_squared_cv(k):
    t = arrival_times(ArrivalSpec("gamma", 500.0, burstiness=k), 40.0, rng()) / NS
    gaps = np.diff(t)
    assert abs(len(t) / 40.0 - 500.0) < 0.06 * 500
    assert abs((gaps.std() / gaps.mean()) ** 2 - 1.0 / k) < 0.15 / k


def test_ramp_rate_grows_linearly():
    t = arrival_times(ArrivalSpec("ramp", 300.0, rate_start=100.0), 10.0, rng()) / NS
    # expected counts: first half (100→200) = 750, second half (200→300) = 1250
    first, second = (t < 5).sum(), (t >= 5).sum()
    assert abs(first - 750) < 4 * np.sqrt(750)
    assert abs(second - 1250) < 4 * np.sqrt(1250)


def test_same_seed_same_schedule_other_seed_differs():
    spec = ArrivalSpec("poisson", 50.0)
    a = arrival_times(spec, 5.0, rng(3))
    assert np.array_equal(a, arrival_times(spec, 5.0, rng(3)))
    assert not np.array_equal(a, arrival_times(spec, 5.0, rng(4)))


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"process": "zipf"}, "allowed: constant, poisson, gamma, ramp"),
        ({"rate": 0.0}, "rate"),
        ({"burstiness": 0.0}, "burstiness"),
    ],
)
def test_bad_specs_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ArrivalSpec(**kwargs)
