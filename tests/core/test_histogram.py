"""core/histogram.py: the one scrape-time Prometheus histogram, which the gateway and the emulator both use."""

from admit.core.histogram import BucketHistogram
from admit.emulator.histogram import Hist
from admit.gateway.metrics import Histograms
from prometheus_client import CollectorRegistry, generate_latest


def test_the_gateway_and_the_emulator_share_the_class():
    reg = CollectorRegistry(auto_describe=False)
    h = Histograms("x_seconds", "doc", (0.5, 1), reg)
    h.observe("a", 0.5)
    h.observe("a", 3.0)
    assert Hist is BucketHistogram and isinstance(h.series["a"], BucketHistogram)
    assert generate_latest(reg).decode().splitlines()[2:] == [
        'x_seconds_bucket{le="0.5",tenant="a"} 1.0',  # a value on a bound is in that bound's bucket
        'x_seconds_bucket{le="1.0",tenant="a"} 1.0',
        'x_seconds_bucket{le="+Inf",tenant="a"} 2.0',
        'x_seconds_count{tenant="a"} 2.0',
        'x_seconds_sum{tenant="a"} 3.5',
    ]
