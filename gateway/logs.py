"""The gateway process's own log (stderr): every line passes one rate limit, uvicorn's lines included.

Anyone who reaches the port can make a server write a line: uvicorn warns for every request with an
``Upgrade`` header it will not serve and for every request that is not HTTP, before any key is checked. So
no line is written unmetered. `LineLimit` is a logging filter on the process's one handler, which every
logger propagates to (uvicorn's too: the server is started with ``log_config=None``, so uvicorn installs no
handler of its own). Lines of one *kind* — logger, level and message template, not the formatted text —
share a GCRA bucket (core/gcra.py) of ``per_s`` lines a second with a burst of ten times that, so a flood
of one warning never silences another. A line over its bucket is dropped and counted
(``admit_gateway_log_lines_suppressed_total``); the next line of its kind that passes ends with how many
were left out since the last one. Past ``MAX_KINDS`` kinds (templates are the code's own, so only a bug
gets there) new kinds share one bucket, which keeps the filter's memory bounded.

Python's warnings are routed into the log (``logging.captureWarnings``). What does not go through it:
``listening on HOST:PORT`` on stdout once at start, a configuration error before the gateway starts, and the
thread stacks an operator asks for with SIGUSR1 (gateway/cli.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from admit.core.gcra import Gcra

MAX_KINDS = 1024
_OTHER = ("", 0, "(other kinds)")

Kind = tuple[str, int, str]


class LineLimit(logging.Filter):
    """Drop lines of a kind past ``per_s`` a second (burst ``10 * per_s``); count what was dropped."""

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.per_s = per_s
        self.burst = max(1, round(10 * per_s))
        self._clock = clock
        self._buckets: dict[Kind, Gcra] = {}
        self._left_out: dict[Kind, int] = {}
        self.suppressed = 0  # lines dropped since start

    def _kind(self, record: logging.LogRecord) -> Kind:
        template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        kind = (record.name, record.levelno, template)
        if kind not in self._buckets and len(self._buckets) >= MAX_KINDS:
            return _OTHER
        return kind

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        kind = self._kind(record)
        bucket = self._buckets.get(kind)
        if bucket is None:
            bucket = self._buckets[kind] = Gcra(self.per_s, self.burst, now)
        if not bucket.spend(1, now).allowed:
            self.suppressed += 1
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            return False
        left = self._left_out.pop(kind, 0)
        if left:
            record.msg = f"{record.getMessage()} [{left} more line(s) like this left out by the log's rate limit]"
            record.args = ()
        return True


def configure(per_s: float) -> LineLimit | None:
    """The process log as the gateway writes it: one stderr handler on the root logger, at INFO, behind a
    `LineLimit` of ``per_s`` lines a second per kind (none when ``per_s`` is 0). Returns the limit."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)
    if per_s <= 0:
        return None
    limit = LineLimit(per_s)
    for handler in logging.getLogger().handlers:
        handler.addFilter(limit)
    return limit
