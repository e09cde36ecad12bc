import numpy as np
import pytest
from admit.loadgen.config import RunConfig, parse_tenant_flag, tenant_from_mapping
from admit.loadgen.schedule import build_schedule
from admit.loadgen.traces import read_trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:46.1805900,100,10
2023-11-16 18:15:48.6805900,50,5
2023-11-16 18:15:51.0000000,8,0
"""


def test_azure_csv_sorted_relative_and_windowed(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text(AZURE)
    tr = read_trace(p)
    assert np.allclose(tr.arrivals, [0.0, 0.5, 2.5, 4.8194100])
    assert tr.prompt_tokens.tolist() == [100, 374, 50, 8]
    assert tr.output_tokens.tolist() == [10, 44, 5, 1]  # zero generated tokens still asks for one
    w = tr.window(3.0, speedup=2.0)
    assert np.allclose(w.arrivals, [0.0, 0.25, 1.25, 2.40970500])


def test_jsonl_log_filters_by_tenant_and_reports_bad_lines(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text(
        '{"tenant":"a","arrival":10.0,"prompt_tokens":5,"output_tokens":3}\n'
        '{"tenant":"b","arrival":10.5,"prompt_tokens":6,"output_tokens":4}\n'
        '{"tenant":"a","arrival":11.0,"prompt_tokens":7,"output_tokens":2}\n'
    )
    tr = read_trace(p, tenant="a")
    assert tr.arrivals.tolist() == [0.0, 1.0] and tr.output_tokens.tolist() == [3, 2]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tenant":"a","arrival":1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing key\(s\) prompt_tokens, output_tokens"):
        read_trace(bad)
    csv = tmp_path / "c.csv"
    csv.write_text("TIMESTAMP,Tokens\n1,2\n")
    with pytest.raises(ValueError, match="missing column\\(s\\) ContextTokens, GeneratedTokens"):
        read_trace(csv)


def test_schedule_merges_tenants_and_strides_workers(tmp_path):
    cfg = RunConfig(
        duration=10.0,
        seed=5,
        tenants=[parse_tenant_flag("name=a,rate=50"), parse_tenant_flag("name=b,rate=20,arrival=constant")],
    )
    s = build_schedule(cfg)
    assert np.all(np.diff(s.offset_ns) >= 0)
    assert s.count_by_tenant(2)[1] == 200
    shares = [s.share(k, 3) for k in range(3)]
    assert sum(len(x) for x in shares) == len(s)
    assert np.array_equal(np.sort(np.concatenate([x.offset_ns for x in shares])), s.offset_ns)
    # adding a tenant leaves the others' draws unchanged (one stream per tenant)
    cfg.tenants.append(parse_tenant_flag("name=c,rate=5"))
    s2 = build_schedule(cfg)
    assert np.array_equal(s2.offset_ns[s2.tenant == 0], s.offset_ns[s.tenant == 0])
    # a sweep scale multiplies the rate
    assert abs(len(build_schedule(cfg, scale=4.0)) / len(s2) - 4.0) < 0.3


def test_trace_tenant_in_schedule(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text(AZURE)
    t = tenant_from_mapping({"name": "replay", "arrival": "trace", "trace": str(p), "trace_speedup": 2.0})
    cfg = RunConfig(duration=2.0, tenants=[t]).checked()
    s = build_schedule(cfg)
    assert (s.offset_ns / 1e9).round(3).tolist() == [0.0, 0.25, 1.25]
    assert s.prompt_tokens.tolist() == [100, 374, 50]
