"""One live run: a fresh gateway in front of a running backend, a control loop, and `admit loadgen` through it.

`run_live` starts the gateway with the given tenants, the control loop with the given policy (waiting
until the policy is loaded, so a slow import is not part of the measured run), replays the load, reads
the gateway's state and request log, stops the gateway and the loop, and returns one row per tenant:
completions, throughput, TTFT and e2e p99 as the client measured them (from its send, so gateway queueing
is included), 429s by reason from the gateway's request log, and the limits the loop set; and for the run,
the gateway's own overhead (`gateway_overhead`). With a warm-up in the load (``warmup`` seconds), every
figure covers the requests scheduled after it: the load generator counts the others apart, and the
gateway's log lines are taken from the stage's start on the wall clock plus the warm-up (a request
scheduled just before that edge may land past it by its send lag, a few milliseconds). Used by `admit
demo`, `admit sim2live` and `admit protocol`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from admit.core.percentiles import nearest_rank
from admit.live.stack import Stack, poll


def _p99_s(block: dict[str, Any], name: str) -> float | None:
    v = block["latency"][name]["p99"]
    return None if v is None else round(v / 1000, 4)


def _p50_s(block: dict[str, Any], name: str = "request_latency") -> float | None:
    v = block["latency"][name]["p50"]
    return None if v is None else round(v / 1000, 4)


def _more_latencies(block: dict[str, Any]) -> dict[str, float | None]:
    """TTFT p50 and TPOT p50/p99 (seconds) of a loadgen summary block."""
    return {"ttft_p50_s": _p50_s(block, "time_to_first_token"), "tpot_p50_s": _p50_s(block, "time_per_output_token"),
            "tpot_p99_s": _p99_s(block, "time_per_output_token")}


def read_decisions(decision_log: Path) -> list[dict[str, Any]]:
    """The loop's decision log (one JSON object a line, complete lines only); none if it was never written."""
    if not decision_log.is_file():
        return []
    lines = decision_log.read_text().split("\n")[:-1]  # what follows the last newline may be half-written
    return [json.loads(line) for line in lines if line.strip()]


def _limits(decisions: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each tenant's limits after every decision of the loop."""
    out: dict[str, list[int]] = {}
    for rec in decisions:
        after = rec.get("limits_after") or rec.get("limits_before") or {}
        items = after.items() if isinstance(after, dict) else enumerate(after)
        for k, v in items:
            out.setdefault(str(k), []).append(int(v))
    return out


def read_request_log(path: Path, since_unix: float) -> list[dict[str, Any]]:
    """The gateway's request-log lines of tenants' requests that arrived at or after ``since_unix``."""
    if not path.is_file():
        return []
    rows = (json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip())
    return [r for r in rows if r.get("tenant") is not None and r["arrival"] >= since_unix]


def _ms(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (the load generator's definition) of seconds, in ms."""
    return round(nearest_rank(values, q) * 1000, 3) if values else None


def gateway_overhead(lines: list[dict[str, Any]], client_ttft_mean_ms: float | None) -> dict[str, Any]:
    """The gateway's own part of each answered request's TTFT (its log's ``overhead_s``: reading, parsing,
    charging, sending upstream and the first bytes on; queue wait and backend excluded), p50 / p99 / mean in
    ms, and ``client_gap_mean_ms``: the client's mean TTFT less the gateway's (the loopback hop and the HTTP
    stacks outside the gateway's clock), over the same requests."""
    own = [r["overhead_s"] for r in lines if r.get("overhead_s") is not None and r["outcome"] == "ok"]
    ttft = [r["ttft_s"] for r in lines if r.get("ttft_s") is not None and r["outcome"] == "ok"]
    gap = None
    if client_ttft_mean_ms is not None and ttft:
        gap = round(client_ttft_mean_ms - sum(ttft) / len(ttft) * 1000, 3)
    return {"requests": len(own), "p50_ms": _ms(own, 50), "p99_ms": _ms(own, 99),
            "mean_ms": round(sum(own) / len(own) * 1000, 3) if own else None, "client_gap_mean_ms": gap}


def run_live(
    stack: Stack,
    backend: str,
    tag: str,
    gateway_cfg: dict[str, Any],
    load_cfg: dict[str, Any],
    policy: str | None,
    interval_s: float,
    scenario: str | None = None,
    start_on_traffic: bool = False,
    calibration: Path | None = None,
) -> dict[str, Any]:
    """Run ``load_cfg`` (an `admit loadgen` run file without ``url``) through a new gateway; see module doc.

    ``start_on_traffic``: the loop decides once before the load starts (on the idle gateway) and then
    every ``interval_s`` from the first request's arrival, which is the simulator's schedule.
    ``calibration``: the loop binds its policy to ``scenario`` on that `admit calibrate` fit of the engine.
    """
    work = stack.workdir / tag
    work.mkdir(parents=True, exist_ok=True)
    gw_name, ctl_name, lg_name = f"gateway-{tag}", f"control-{tag}", f"loadgen-{tag}"
    cfg = {"request_log": str(work / "requests.jsonl"), "audit_log": str(work / "audit.jsonl"), **gateway_cfg}
    gw = stack.gateway(backend, cfg, name=gw_name)
    decisions = work / "decisions.jsonl"
    if policy is not None:
        stack.control(gw, policy, interval_s, decisions, scenario=scenario, name=ctl_name,
                      start_on_traffic=start_on_traffic, calibration=calibration)
        if start_on_traffic:  # its first decision sees the gateway idle, as the simulator's at t = 0 does
            poll(lambda: read_decisions(decisions), 60, "the control loop's first decision")
    load_path = work / "load.yaml"
    load_path.write_text(yaml.safe_dump({"url": gw, **load_cfg}, sort_keys=False))
    out = work / "loadgen"
    stack.spawn(lg_name, ["-m", "admit.cli", "loadgen", "run", "-c", str(load_path), "--out", str(out), "--no-plot"])
    duration = float(load_cfg["duration"])
    rc = stack.wait_exit(lg_name, duration + float(load_cfg.get("timeout", 60)) + 120)
    state = stack.admin(gw, "/admin/state")
    stack.stop(lg_name)
    if policy is not None:
        stack.stop(ctl_name)
    stack.stop(gw_name)
    summary_path = out / "summary.json"
    if rc != 0 or not summary_path.is_file():
        tail = stack.log(lg_name).read_text(errors="replace")[-2000:]
        raise RuntimeError(f"admit loadgen failed (status {rc}):\n{tail}")
    stage = json.loads(summary_path.read_text())["stages"][0]
    log = read_decisions(decisions)
    limits = _limits(log)
    warmup = float(load_cfg.get("warmup", 0.0))
    span = duration - warmup  # what the figures cover: the requests scheduled after the warm-up
    lines = read_request_log(work / "requests.jsonl", float(stage["started_unix"]) + warmup)
    tenants: dict[str, Any] = {}
    for name, block in stage["tenants"].items():
        gst = state["tenants"].get(name, {})
        done = block["requests"]["completed"]
        good = int(block["requests"]["good"])
        scheduled = int(block["load_summary"]["scheduled"]) - int(block.get("warmup", {}).get("scheduled", 0))
        outcomes = [r["outcome"] for r in lines if r["tenant"] == name]
        tenants[name] = {
            "scheduled": scheduled,
            "sent": block["load_summary"]["sent"],
            "completed": done,
            "good": good,
            "goodput_rps": round(good / span, 4),
            "attainment": round(good / scheduled, 4) if scheduled else None,
            "throughput_rps": round(done / span, 4),
            "ttft_p99_s": _p99_s(block, "time_to_first_token"),
            "e2e_p99_s": _p99_s(block, "request_latency"),
            "e2e_p50_s": _p50_s(block),
            **_more_latencies(block),
            "http_429": int(block["status"].get("429", 0)),
            "queue_full": outcomes.count("queue-full"),  # the gateway's log, by arrival after the warm-up
            "ttl_expired": outcomes.count("ttl-expired"),
            "errors": block["errors"],
            "final_limit": gst.get("limit"),
            "limits": limits.get(name, []),
        }
    done_all = sum(t["completed"] for t in tenants.values())
    return {
        "policy": policy or "none",
        "duration_s": duration,
        "warmup_s": warmup,
        "started_unix": float(stage["started_unix"]),  # the load's start: the warm-up ends warmup_s later
        "valid": stage["valid"],
        "invalid_reasons": stage["invalid_reasons"],
        "completed": done_all,
        "throughput_rps": round(done_all / span, 4),
        "goodput_rps": round(sum(t["good"] for t in tenants.values()) / span, 4),
        "ttft_p99_s": _p99_s(stage, "time_to_first_token"),
        "e2e_p99_s": _p99_s(stage, "request_latency"),
        "e2e_p50_s": _p50_s(stage),
        **_more_latencies(stage),
        "gateway": gateway_overhead(lines, stage["latency"]["time_to_first_token"]["mean"]),
        "decisions": len(log),
        "load": {"achieved_ratio": stage["load_summary"].get("achieved_ratio"),
                 "send_lag_p99_ms": (stage["load_summary"].get("send_lag") or {}).get("p99")},
        "decision_log": [{k: rec[k] for k in ("time", "since_traffic_s", "decision", "deltas", "limits_after",
                                               "outcome") if k in rec} for rec in log],
        "tenants": tenants,
        "workdir": str(work),
    }
