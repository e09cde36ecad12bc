"""A request as it travels through the simulated world."""

from __future__ import annotations

import math


class Request:
    """One request. Sizes come from the workload; timestamps are filled in as it moves.

    ``u_service`` is a uniform(0, 1) draw made by the workload, so that an engine with random service
    times (the slot engine) derives them from the episode seed: two policies run on the same seed see the
    same service times (common random numbers).
    """

    __slots__ = (
        "arrival",
        "computed",
        "dispatched",
        "finished",
        "first_scheduled",
        "first_token",
        "generated",
        "output_tokens",
        "preemptions",
        "prompt_tokens",
        "rid",
        "service_s",
        "tenant",
        "u_service",
    )

    def __init__(
        self, rid: int, tenant: int, arrival: float, prompt_tokens: int, output_tokens: int, u_service: float
    ) -> None:
        self.rid = rid
        self.tenant = tenant
        self.arrival = arrival
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.u_service = u_service
        self.dispatched = math.nan  # left the admission queue, entered the engine
        self.first_scheduled = math.nan  # first scheduled by the token engine (vLLM's queue-time end)
        self.first_token = math.nan
        self.finished = math.nan
        self.service_s = math.nan
        # token-engine progress
        self.computed = 0  # tokens whose KV is in the cache (prompt + generated so far)
        self.generated = 0
        self.preemptions = 0

    def __repr__(self) -> str:
        return f"Request(rid={self.rid}, tenant={self.tenant}, arrival={self.arrival:.3f})"
