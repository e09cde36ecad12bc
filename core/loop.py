"""The decision loop, written once: observe → act → apply, for any world and any controller.

A ``World`` is what a controller acts on: the simulator (envs/simulation.py's ``SimulatedWorld``, over the Python
or the compiled world) or the gateway in front of a real server (live/control.py's ``GatewayWorld``, whose
observe and apply are the admin API's calls). ``run_loop`` drives one: while a decision is due, observe, ask
the controller, validate its deltas, apply them, show the decision to ``on_decision``, and let the world move
on to its next decision. How a world keeps time (one simulated interval; the live loop's fixed-phase ticks)
and what it does when it cannot be observed is its own. The loop knows nothing of failing policies either:
a policy that must never stop the loop is wrapped in ``FailSafe`` (controllers/failsafe.py), a controller
that holds the limits when the policy raises, overruns its deadline or answers garbage.

The shape is Stable-Baselines3's ``collect_rollouts`` (one loop over the environment's steps, observed through
callbacks; https://github.com/DLR-RM/stable-baselines3, stable_baselines3/common/on_policy_algorithm.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from admit.core.controller import Controller, validate_deltas
from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class World(Protocol):
    """What the decision loop drives. ``spec`` is the control spec its limits obey."""

    spec: ControlSpec

    @property
    def now(self) -> float:
        """The world's time (simulated seconds; the live world's wall clock), read before each observation."""
        ...

    def due(self) -> bool:
        """Whether another decision is due (the simulator: before its end; the live world: steps left)."""
        ...

    def observe(self) -> Observation | None:
        """The Observation a decision is made on, or None when there is none this time (the world says why
        in its own way): no decision is made, and the world moves on."""
        ...

    def apply(self, deltas: list[int]) -> list[int]:
        """Apply a decision's validated deltas; returns the limits they set."""
        ...

    def advance(self) -> None:
        """Move on to the next decision (run one interval; wait for the next tick)."""
        ...


OnDecision = Callable[[float, Observation, list[int], list[int]], None]
"""``on_decision(time_s, observation, deltas, new_limits)``, called by ``run_loop`` once a decision is applied
(before the world moves on); the limits before it are the observation's."""


@dataclass
class RunStats:
    """What ``run_loop`` reports: how many decisions it made and the limits they set."""

    decisions: int
    limit_sum: float  # Σ over decisions of Σ over tenants of the limit set by that decision
    n_tenants: int

    @property
    def mean_limit(self) -> float:
        """The limit set per tenant per decision, on average (0 without decisions)."""
        return self.limit_sum / max(self.decisions, 1) / self.n_tenants


def run_loop(world: World, controller: Controller, on_decision: OnDecision | None = None,
             name: str | None = None) -> RunStats:
    """Drive ``world`` with ``controller`` (already ``reset``) while a decision is due: observe → act →
    ``validate_deltas`` → apply → ``on_decision`` → advance.

    A controller that raises ValueError or returns bad deltas raises ValueError naming the policy (``name``,
    default the controller's) and the decision's time.
    """
    spec = world.spec
    limit_sum = 0.0
    decisions = 0
    while world.due():
        t = world.now
        obs = world.observe()
        if obs is not None:
            try:
                deltas = validate_deltas(controller.act(obs), spec)
            except ValueError as e:
                label = name if name is not None else getattr(controller, "name", type(controller).__name__)
                raise ValueError(f"policy {label!r} at t={t:.1f}s: {e}") from None
            limits = world.apply(deltas)
            if on_decision is not None:
                on_decision(t, obs, deltas, limits)
            limit_sum += sum(limits)
            decisions += 1
        world.advance()
    return RunStats(decisions, limit_sum, spec.n_tenants)
