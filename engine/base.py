"""The engine interface: what the simulation loop needs from a model of the serving engine.

An engine receives requests the admission core has dispatched (``submit``), owns their execution, and
reports finished requests. It is event-driven: the simulation asks for ``next_event_time()`` and, when
that time comes, calls ``process_event(now)``, which returns the requests that finished at ``now``
(their ``first_token`` and ``finished`` timestamps set). Two engines implement it:

* ``SlotEngine`` (engine/slot_engine.py): a pool of identical slots with random service times, the
  published study's model;
* ``TokenEngine`` (engine/token_engine.py): a token-level engine following vLLM V1's scheduler (token
  budget, chunked prefill, KV blocks, recompute preemption), timed by the step-time model
  (engine/steptime.py) of a preset (engine/presets.py).

The simulator (envs/simulation.py) runs an engine in simulated time; the emulator (emulator/) runs the
token engine in wall-clock time behind a vLLM-compatible HTTP API. An engine never reads a global clock:
time is what the caller passes in.
"""

from __future__ import annotations

from typing import Protocol

from admit.engine.request import Request


class Engine(Protocol):
    def submit(self, req: Request, now: float) -> None:
        """Take a dispatched request at time ``now``."""

    def next_event_time(self) -> float:
        """Time of the engine's next internal event, ``math.inf`` when idle."""

    def process_event(self, now: float) -> list[Request]:
        """Handle the event due at ``now`` (== ``next_event_time()``); return the requests finished."""

    def sync(self, now: float) -> None:
        """Bring gauges and counters up to ``now`` (an engine may batch internal work between events)."""

    def memory_utilisation(self) -> float:
        """GPU-memory signal in [0, 1]: slot occupancy (slot engine) or KV-cache usage (token engine)."""

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    num_preemptions: int  # cumulative, as vLLM's num_preemptions_total

    def tenant_tokens(self, n_tenants: int) -> tuple[list[float], list[float]]:
        """Per tenant, over its requests in the engine (running or waiting): the prompt tokens of those with no
        first token yet, and the prompt + generated-so-far tokens of all (core/observation.py's
        ``prefill_tokens`` and ``tokens_in_flight``). Call ``sync(now)`` first."""
