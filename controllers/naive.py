"""The published study's naive dynamic controller (its failure case), reconstructed.

Every decision interval (3 s in the study) it reads two global signals and moves BOTH tenants' limits
together by one step:

* p99 = the p99 latency over the last telemetry window (6 s). One number for the whole server: here the
  largest of the tenants' window p99s, so the worst tenant decides for everybody.
* memory = the study's GPU-memory proxy, slot occupancy: the share of the granted slots that are busy,
  Σ in_flight / Σ limit. (In the study's slot model the server has no capacity beyond the slots the
  tenants are granted — service time does not depend on load — so granted slots are the pool.)

Rule (thresholds: the study's 6 s, and memory bands of 0.9 and 0.5, reconstructed):

    if p99 > 6 s or memory >= 0.9:     every limit −1   (throttle: slow, or memory nearly full)
    elif memory < 0.5:                 every limit +1   (half the slots idle: room to grow)
    else:                              hold

A window with no completions has p99 = 0 ("not slow"). This is the design the study found to lose to
static caps. Two flaws feed each other: a p99 over a handful of exponential service times exceeds 6 s
by chance alone (P(S > 6 s) = e^(−6/2.5) ≈ 9% per request), and occupancy rises as limits fall, so a
throttle makes the next throttle likelier; under a 3 s queue timeout every throttle turns into drops.
"""

from __future__ import annotations

from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class NaiveController:
    name = "naive"

    def __init__(self, p99_threshold_s: float = 6.0, memory_high: float = 0.9, memory_low: float = 0.5) -> None:
        if not 0 <= memory_low <= memory_high:
            raise ValueError(f"need 0 <= memory_low <= memory_high, got {memory_low}, {memory_high}")
        self.p99_threshold_s = p99_threshold_s
        self.memory_high = memory_high
        self.memory_low = memory_low

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        pass  # stateless; the study moves by exactly one step whatever max_step is

    def decision_rule(self) -> tuple[str, tuple[float, ...]] | None:
        """core.controller.decision_rule (unless ``act`` is overridden)."""
        if type(self).act is not NaiveController.act:
            return None
        return "naive", (self.p99_threshold_s, self.memory_high, self.memory_low)

    @staticmethod
    def slot_occupancy(obs: Observation) -> float:
        granted = sum(t.limit for t in obs.tenants)
        return sum(t.in_flight for t in obs.tenants) / granted if granted > 0 else 1.0

    def act(self, obs: Observation) -> list[int]:
        p99 = max(t.e2e_p99 for t in obs.tenants)
        memory = self.slot_occupancy(obs)
        if p99 > self.p99_threshold_s or memory >= self.memory_high:
            d = -1
        elif memory < self.memory_low:
            d = 1
        else:
            d = 0
        return [d] * obs.n_tenants
