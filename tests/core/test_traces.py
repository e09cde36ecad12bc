"""core/traces.py: the one reader of trace CSVs, shared by the simulator's replay and the load generator's."""

from __future__ import annotations

import hashlib
from importlib import resources

import numpy as np
import pytest
from admit.core import traces
from admit.envs.workload import BUILTIN_TRACES, load_trace
from admit.loadgen.traces import read_trace

# sha256 (first 16 hex digits) of the arrays each side produced for the bundled traces before the two readers
# became one: the simulator's (offsets, prompt, output), the load generator's (the same, then offsets in ns)
BEFORE = {
    "azure-2023-code": ("ac7230340cce6975", "8345912c82151188"),
    "azure-2023-conv": ("f831b0df51a4b52a", "aab472f6a65e367d"),
}


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(BUILTIN_TRACES))
def test_both_sides_replay_the_bundled_traces_as_before(name):
    sim = load_trace(name)
    path = resources.files("admit.envs").joinpath("data", *BUILTIN_TRACES[name].split("/"))
    lg = read_trace(str(path))
    assert [a.dtype for a in sim] == [np.float64, np.int64, np.int64]
    assert (digest(*sim), digest(lg.arrivals, lg.prompt_tokens, lg.output_tokens, lg.offsets_ns())) == BEFORE[name]
    assert all(np.array_equal(a, b) for a, b in zip(sim, (lg.arrivals, lg.prompt_tokens, lg.output_tokens),
                                                    strict=True))


def test_every_fractional_digit_counts_and_equal_times_keep_the_file_order():
    t, p, o = traces.read_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                              "2023-11-16 18:15:46.6805907,1,0\n"
                              "2023-11-16 18:15:46.6805900,2,5\n"
                              "2023-11-16 18:15:46.6805907,3,6\n", "t")
    assert p.tolist() == [2, 1, 3] and o.tolist() == [5, 1, 6]  # stable order; no output still asks for one
    assert t[0] == 0.0 and t[1] == pytest.approx(7e-7, abs=2.5e-7) and t[1] == t[2]


def test_date_times_in_any_iso_form_and_plain_seconds():
    iso = traces.read_csv("time,input_tokens,generated_tokens\n"
                          "2023-11-16T18:15:46.5Z,1,1\n2023-11-16T19:15:46.75+01:00,1,1\n", "iso")
    assert iso[0].tolist() == [0.0, 0.25]  # one instant an hour apart in two zones
    secs = traces.read_csv("arrival,prompt_tokens,output_tokens\n10.5,1,1\n 12 ,2,2\n", "secs")
    assert secs[0].tolist() == [0.0, 1.5]


def test_the_load_generator_reads_the_simulators_column_names(tmp_path):
    f = tmp_path / "trace.csv"
    f.write_text("arrival,prompt_tokens,output_tokens\n2,20,2\n1,10,1\n")
    tr = read_trace(f)
    assert tr.arrivals.tolist() == [0.0, 1.0] and tr.prompt_tokens.tolist() == [10, 20]
    assert [a.tolist() for a in load_trace(str(f))] == [[0.0, 1.0], [10, 20], [1, 2]]


@pytest.mark.parametrize(("text", "why"), [
    ("TIMESTAMP,Tokens\n1,2\n", r"trace t: missing column\(s\) ContextTokens, GeneratedTokens .*found TIMESTAMP, "
                                r"Tokens"),
    ("", r"missing column\(s\) TIMESTAMP, ContextTokens, GeneratedTokens .*found no header"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", r"trace t has no requests"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\nyesterday,2,3\n",
     r"trace t, line 3: TIMESTAMP 'yesterday' is neither seconds nor a date-time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2.5,3\n",
     r"trace t, line 2: ContextTokens and GeneratedTokens must be integers, got '2.5' and '3'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2\n", r"trace t, line 2: .* must be integers, got '2' and None"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n\n", r"trace t has no requests"),
])
def test_a_bad_trace_says_what_and_where(text, why):
    with pytest.raises(ValueError, match=why):
        traces.read_csv(text, "t")
