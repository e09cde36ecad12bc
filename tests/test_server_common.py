"""scripts/server_common.sh, which `make test` uses to run the suite beside real vLLM and llama.cpp servers:
its ``run`` verb starts the server in a process group of its own, waits for ``/health``, runs the command with
the server's URL, and stops the whole group afterwards. Here the server is a stand-in (Python's http.server
with a ``health`` file) so that the script's own behaviour is what is checked.

The server must stay in the caller's session. Linux's autogroup scheduler weighs each session as one: a server
started with setsid (as this script once did) ran at a whole session's weight whatever the priority of the tests
beside it; with the tests' session at a low priority, vLLM's busy threads left the gateway the tests had started
runnable but waiting minutes for a CPU. And the server's own exit status (143 when SIGTERM ends it) must not
replace the command's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from admit.live.stack import alive

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]

# a caller of server_common.sh as scripts/llm_server.sh is one, serving a folder with a `health` file
SCRIPT = r"""
set -euo pipefail
die() { echo "stand-in: $*" >&2; exit 1; }
install() { :; }
PY=$1; shift
DIR=$1; shift
source scripts/server_common.sh
HEALTH_TIMEOUT_S=60
server_cmd() {
  local port
  port=$(free_port)
  URL="http://127.0.0.1:$port/v1"
  SERVER_CMD=("$PY" -c 'import os, sys; open(sys.argv[1], "w").write(str(os.getpid()))
import runpy; sys.argv = ["http.server", "--bind", "127.0.0.1", "--directory", sys.argv[2], sys.argv[3]]
runpy.run_module("http.server", run_name="__main__")' "$DIR/server.pid" "$DIR" "$port")
}
server_main STAND_IN_URL "a stand-in" "$@"
"""


def _run(tmp_path: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "health").write_text("ok")
    return subprocess.run(["bash", "-c", SCRIPT, "stand-in", sys.executable, str(tmp_path), "run", *cmd],
                          cwd=ROOT, capture_output=True, text=True, timeout=100)


def test_run_keeps_the_server_in_the_callers_session_and_stops_its_group(tmp_path: Path) -> None:
    probe = (
        "import os, sys, urllib.request; pid = int(open(sys.argv[1]).read());"
        " assert urllib.request.urlopen(os.environ['STAND_IN_URL'].removesuffix('/v1') + '/health').status == 200;"
        " print(os.getsid(pid), os.getsid(0), os.getpgid(pid), pid, os.getpgid(0))"
    )
    out = _run(tmp_path, sys.executable, "-c", probe, str(tmp_path / "server.pid"))
    assert out.returncode == 0, out.stderr
    server_sid, my_sid, server_group, pid, my_group = map(int, out.stdout.split())
    assert server_sid == my_sid == os.getsid(0), "the server left the caller's session"
    assert server_group == pid != my_group, "the server is not a process group of its own"
    assert not alive(pid), "the server outlived the command"


def test_run_returns_the_commands_status(tmp_path: Path) -> None:
    out = _run(tmp_path, "sh", "-c", "exit 3")
    assert out.returncode == 3, out.stderr
    assert not alive(int((tmp_path / "server.pid").read_text()))
