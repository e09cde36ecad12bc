"""Gateway overhead and throughput: `admit loadgen` direct to the mock server vs through `admit gateway`
(and through nginx as a plain reverse proxy), all on 127.0.0.1.

* Overhead: at each rate (constant arrivals, 16-token prompts), the client-measured e2e p50/p99 through
  the gateway minus direct to the backend, for non-streamed 16-token answers (`plain`: `"stream": false`,
  timed to the end of the JSON body) and 16-token streams (`stream`).
* Max req/s: a rising ladder of rates with non-streamed answers through the gateway and through nginx
  (one worker process, keep-alive upstream, buffering off, access log off — configured in a temp dir); the
  highest rate each proxy carried: achieved ≥ 95% of requested, < 1% errors and e2e p99 ≤ 50 ms (a
  proxy whose queue grows during the stage fails the last). The CPU time of the proxy process (the
  gateway's one process, nginx's one worker) per completed request is read from /proc: it is far less
  sensitive to the machine's other load than latency is.
* ``--workers N``: also ``admit gateway --workers N`` (N processes on the port through SO_REUSEPORT, which
  the gateway allows only with its Redis backend: a ``redis-server`` is started for it) as ``gateway xN``,
  in the overhead stages and on the max-req/s ladder; its CPU column sums the N workers and redis-server.
  With ``--contract`` too, a second such gateway (its own redis-server) with the contract on its tenant runs
  beside it as ``contract xN``: the price of the shared contract envelope (gateway/redis/contracts.py, its
  Redis round trip included) in the same run. With ``--baseline`` too, the same rows of that revision run
  as ``before xN`` and ``contract before xN``.
* ``--only LABELS``: run only these rows (comma-separated, e.g. ``'gateway x2,contract x2'``) beside direct,
  to keep a run short; ``--max-rates ''`` skips the ladder.
* ``--baseline REV``: the gateway of another git revision (e.g. the commit before a change) runs beside
  the current one as ``before`` — in the overhead table and on the ladder — so a before/after comparison
  is measured in the same run, under the same load. Its code is taken with ``git archive`` into the temp
  dir and imported from there.
* ``--contract JSON``: also this gateway with a contract on its tenant (core/contract.py, e.g.
  ``'{"requests_per_s": 750, "burst": 100, "attainment": 0.9}'``) as ``contract``, beside the one without, so
  the price of classifying each request and of the two classes is measured in the same run.

At each overhead stage the proxies run one after another, in reverse order every other stage.

The backend is the project's mock server (loadgen/mockserver.py) with no delays; the gateway has one
tenant with a limit no run reaches, no request log and no envelopes. The load generator, the proxy and
the mock share the machine's cores, so the figures hold for this machine's load only: the load average is
printed with them. nginx must be installed (Debian: `apt-get install -y nginx`); without it the nginx
column is skipped.

    python benchmarks/gateway_bench.py --rates 500,1000,2000 --duration 12 --warmup 2 \
        --max-rates 250,500,750,1000,1500,2000,3000,4000,6000 --max-duration 5 [--baseline REV] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from admit.live.stack import Stack, poll

KEY = "sk-bench-tenant-key"
SHAPES = {"plain": (16, False), "stream": (16, True)}  # output tokens, streamed
PACKAGES = ("core", "envs", "controllers", "agents", "train", "loadgen", "gateway", "emulator", "live", "engine",
            "evaluate")
# runs `python -m admit.gateway` with the `admit` package of another directory first on the path
LAUNCH = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
          "runpy.run_module('admit.gateway', run_name='__main__', alter_sys=True)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nginx_conf(workdir: Path, port: int, backend: str) -> Path:
    host = backend.removeprefix("http://")
    conf = workdir / "nginx.conf"
    conf.write_text(f"""worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body;
  proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fastcgi;
  uwsgi_temp_path {workdir}/uwsgi;
  scgi_temp_path {workdir}/scgi;
  upstream backend {{ server {host}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
""")
    return conf


def cpu_s(pid: int | list[int]) -> float:
    """User + system CPU seconds of a process (or the sum over several) so far (/proc/PID/stat)."""
    if isinstance(pid, list):
        return sum(cpu_s(p) for p in pid)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def baseline_tree(rev: str, dest: Path) -> Path:
    """The project's packages at git revision ``rev`` under ``dest``, importable as ``admit``; returns the dir."""
    root = Path(__file__).resolve().parent.parent
    src = dest / "src"
    src.mkdir(parents=True)
    tree = subprocess.run(["git", "-C", str(root), "ls-tree", "--name-only", rev], check=True, capture_output=True,
                          text=True).stdout.split()
    packages = [p for p in PACKAGES if p in tree]  # an older revision has fewer folders
    archive = subprocess.run(["git", "-C", str(root), "archive", rev, "admit", *packages], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = dest / "pkg" / "admit"
    shutil.copytree(src / "admit", pkg)
    for name in packages:
        (pkg / name).symlink_to(src / name, target_is_directory=True)
    return pkg.parent


def start_gateway(stack: Stack, name: str, backend: str, config: dict[str, Any], code: Path | None,
                  extra: tuple[str, ...] = ()) -> str:
    """`admit gateway` of this checkout, or (``code``) of the package directory `baseline_tree` made."""
    if code is None and not extra:
        return stack.gateway(backend, config, name)
    path = stack.workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"admin": {"token_env": "ADMIT_STACK_ADMIN_TOKEN"}, **config}))
    run = ["-c", LAUNCH, str(code)] if code is not None else ["-m", "admit.gateway"]
    stack.spawn(name, [*run, "--backend", backend, "--config", str(path), "--host", "127.0.0.1", "--port", "0",
                       *extra])
    url = stack.wait_listening(name)
    poll(lambda: _listening(int(url.rsplit(":", 1)[1])), 30, f"{name} to listen")
    return url


def loadgen(stack: Stack, url: str, tag: str, rate: float, output: int, duration: float,
            warmup: float = 0.0, proxy: int | list[int] | None = None, stream: bool = True) -> dict[str, Any]:
    """One `admit loadgen` stage; with ``proxy`` (a pid) also that process's CPU time per completed request."""
    work = stack.workdir / tag
    work.mkdir(parents=True, exist_ok=True)
    cfg = {"url": url, "api": "completions", "model": "mock", "duration": duration, "seed": 1, "workers": 1,
           "timeout": 30, "lag_bound_ms": 5, "warmup": warmup, "stream": stream,
           "tenants": [{"name": "t", "rate": rate, "arrival": "constant", "prompt": "16", "output": str(output),
                        "api_key": KEY}]}
    (work / "load.yaml").write_text(yaml.safe_dump(cfg))
    name = f"loadgen-{tag}"
    cpu0 = cpu_s(proxy) if proxy else 0.0
    stack.spawn(name, ["-m", "admit.cli", "loadgen", "run", "-c", str(work / "load.yaml"), "--out", str(work),
                       "--no-plot"])
    rc = stack.wait_exit(name, duration + 120)
    proxy_cpu = cpu_s(proxy) - cpu0 if proxy else None
    stack.stop(name)
    if rc != 0:
        raise RuntimeError(f"loadgen {tag} failed:\n{stack.log(name).read_text()[-2000:]}")
    s = json.loads((work / "summary.json").read_text())["stages"][0]
    lat = s["latency"]["request_latency"]
    sent = s["load_summary"]["sent"]  # the whole stage, as the proxy's CPU time is: the warm-up's requests too
    warm = s.get("warmup", {})
    errors = sum(s["errors"].values()) + warm.get("failed", 0)
    done = s["requests"]["completed"] + warm.get("completed", 0)
    return {"rate": rate, "output": output, "p50_ms": lat["p50"], "p99_ms": lat["p99"],
            "achieved_rate": s["load_summary"]["achieved_rate"],
            "achieved_ratio": s["load_summary"]["achieved_ratio"], "completed": s["requests"]["completed"],
            "error_ratio": errors / max(sent, 1), "errors": s["errors"], "valid": s["valid"],
            "invalid": s["invalid_reasons"],
            "send_lag_p99_ms": s["load_summary"]["send_lag"]["p99"],
            "proxy_cpu_ms_per_request": None if proxy_cpu is None
            else round(1000 * proxy_cpu / max(done, 1), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="500,1000,2000")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds kept out of the overhead latencies")
    ap.add_argument("--max-rates", default="250,500,750,1000,1500,2000,3000,4000,6000")
    ap.add_argument("--max-duration", type=float, default=5.0)
    ap.add_argument("--max-p99-ms", type=float, default=50.0, help="a carried rate keeps e2e p99 under this")
    ap.add_argument("--baseline", help="a git revision whose gateway runs beside this one as 'before'")
    ap.add_argument("--contract", type=json.loads, help="also this gateway with this contract on its tenant (JSON)")
    ap.add_argument("--workers", type=int, default=0, help="also a gateway with this many worker processes (Redis)")
    ap.add_argument("--only", help="run only these rows beside direct (comma-separated labels)")
    ap.add_argument("--out", type=Path, default=Path("results/gateway_bench.json"))
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",") if x]
    ladder = [float(x) for x in args.max_rates.split(",") if x]
    nginx = shutil.which("nginx") or (Path("/usr/sbin/nginx") if Path("/usr/sbin/nginx").exists() else None)
    result: dict[str, Any] = {"loadavg_start": os.getloadavg(), "cpus": os.cpu_count(), "overhead": [],
                              "max_rate": {}}
    with tempfile.TemporaryDirectory(prefix="admit-gwbench-") as tmp, Stack(Path(tmp)) as stack:
        stack.spawn("mock", ["-m", "admit.loadgen.mockserver", "--host", "127.0.0.1", "--port", "0"])
        mock = stack.wait_listening("mock")
        tenant: dict[str, Any] = {"name": "t", "api_keys": [KEY], "limit": 100000, "max_queue": 100000}
        gw_cfg = {"telemetry": {"nvml": False, "scrape_interval_s": 60}, "tenants": [tenant]}
        only = None if args.only is None else {x.strip() for x in args.only.split(",") if x.strip()}

        def wanted(label: str) -> bool:
            return only is None or label in only

        proxies = {"direct": mock}
        if wanted("gateway"):
            proxies["gateway"] = start_gateway(stack, "gateway", mock, gw_cfg, None)
        contract_cfg = {**gw_cfg, "tenants": [{**tenant, "contract": args.contract}]}
        if args.contract:
            result["contract"] = args.contract
            if wanted("contract"):
                proxies["contract"] = start_gateway(stack, "contract", mock, contract_cfg, None)
        code = None
        if args.baseline:
            code = baseline_tree(args.baseline, Path(tmp) / "baseline")
            result["baseline"] = args.baseline
            if wanted("before"):
                proxies["before"] = start_gateway(stack, "before", mock, gw_cfg, code)
        pids: dict[str, int | list[int] | None] = {k: stack.procs[k].pid if k != "direct" else None for k in proxies}
        redis_server = shutil.which("redis-server")
        if args.workers > 1 and redis_server is not None:
            n = args.workers
            rows: dict[str, tuple[str, dict[str, Any], Path | None]] = {f"gateway x{n}": ("workers", gw_cfg, None)}
            if args.contract:
                rows[f"contract x{n}"] = ("workers-contract", contract_cfg, None)
            if code is not None:
                rows[f"before x{n}"] = ("workers-before", gw_cfg, code)
                if args.contract:
                    rows[f"contract before x{n}"] = ("workers-contract-before", contract_cfg, code)
            for label, (name, cfg, rev) in rows.items():
                if not wanted(label):
                    continue
                rport = free_port()  # a redis-server each, so that its CPU is this row's alone
                (Path(tmp) / f"redis-{name}").mkdir()
                stack.spawn(f"redis-{name}", ["--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                              "--appendonly", "no", "--dir", str(Path(tmp) / f"redis-{name}"),
                                              "--daemonize", "no"], program=redis_server)
                poll(lambda port=rport: _listening(port), 20, "redis-server to listen")
                wcfg = {**cfg, "redis": {"url": f"redis://127.0.0.1:{rport}/0"}}
                proxies[label] = start_gateway(stack, name, mock, wcfg, rev, ("--workers", str(n)))
                pids[label] = [*_children(stack.procs[name].pid), stack.procs[f"redis-{name}"].pid]
        targets = {k: v for k, v in proxies.items() if k != "direct"}
        if nginx is not None and wanted("nginx"):
            port = free_port()
            conf = nginx_conf(Path(tmp), port, mock)
            stack.spawn("nginx", ["-p", tmp, "-c", str(conf), "-g", "daemon off;"], program=str(nginx))
            targets["nginx"] = f"http://127.0.0.1:{port}"
            pids["nginx"] = _nginx_worker(Path(tmp) / "nginx.pid")
            poll(lambda: _listening(port), 20, "nginx to listen")
        for shape, (output, stream) in SHAPES.items():
            for rate in rates:
                row: dict[str, Any] = {"shape": shape, "rate": rate}
                # direct first, then the proxies in turn, in reverse order every other stage so that the
                # machine's drifting load does not always favour the same one
                order = list(proxies)[1:]
                stage = len(result["overhead"])
                for label in ["direct", *(order[::-1] if stage % 2 else order)]:
                    tag = f"{shape}-{rate:g}-{label}"
                    row[label] = loadgen(stack, proxies[label], tag, rate, output, args.duration, args.warmup,
                                         pids[label], stream)
                direct = row["direct"]
                for label in proxies:
                    if label == "direct":
                        continue
                    r = row[label]
                    r["added_p50_ms"] = round(r["p50_ms"] - direct["p50_ms"], 3)
                    r["added_p99_ms"] = round(r["p99_ms"] - direct["p99_ms"], 3)
                    print(f"{shape:6s} {rate:6g}/s {label:8s} direct p50 {direct['p50_ms']:.2f} p99 "
                          f"{direct['p99_ms']:.2f}  via p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} "
                          f"(CPU {r['proxy_cpu_ms_per_request']} ms/req)  added p50 {r['added_p50_ms']:+.2f} ms "
                          f"p99 {r['added_p99_ms']:+.2f} ms  (achieved {r['achieved_ratio']:.3f}, "
                          f"valid {r['valid']})", flush=True)
                result["overhead"].append(row)
        for label, url in targets.items() if ladder else ():  # --max-rates '': no ladder
            steps = []
            for rate in ladder:
                r = loadgen(stack, url, f"max-{label}-{rate:g}", rate, 16, args.max_duration, proxy=pids[label],
                            stream=False)
                steps.append(r)
                ok = carried(r, args.max_p99_ms)
                print(f"max {label:8s} {rate:6g}/s achieved {r['achieved_rate']:.0f}/s ratio "
                      f"{r['achieved_ratio']:.3f} errors {r['error_ratio']:.3%} {r['errors'] or ''} "
                      f"p99 {r['p99_ms']} ms "
                      f"CPU {r['proxy_cpu_ms_per_request']} ms/req "
                      f"valid {r['valid']} {r['invalid']}", flush=True)
                if not ok:
                    break
            good = [s["rate"] for s in steps if carried(s, args.max_p99_ms)]
            result["max_rate"][label] = {"carried": max(good) if good else 0.0, "steps": steps}
    result["loadavg_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v["carried"] for k, v in result["max_rate"].items()}), "loadavg", result["loadavg_start"],
          "→", result["loadavg_end"])
    print(f"wrote {args.out}")


def carried(r: dict[str, Any], max_p99_ms: float) -> bool:
    """The proxy kept up: ≥ 95% of the requested rate sent, < 1% errors, and no queue building (p99 bound)."""
    return r["achieved_ratio"] >= 0.95 and r["error_ratio"] < 0.01 and (r["p99_ms"] or 1e9) <= max_p99_ms


def _nginx_worker(pidfile: Path) -> int | None:
    """The pid of nginx's one worker process (the master only supervises)."""
    master = int(poll(lambda: pidfile.is_file() and pidfile.read_text().strip(), 20, "nginx.pid"))
    children = Path(f"/proc/{master}/task/{master}/children")
    kids = children.read_text().split() if children.is_file() else []
    return int(kids[0]) if kids else master


def _children(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
