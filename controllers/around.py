"""A policy that acts around a base policy's caps: the one way "anchored on the tuned caps" is wired.

``AroundBase(inner, base)`` is one controller made of two. At ``reset`` it resets ``base`` with the same spec
and seed, takes the caps the base holds (``base.cap``: an int for every tenant or one per tenant) and resets
``inner`` with them as its anchors, ``inner.reset(spec, seed, anchors=caps)``; every decision is then the
inner's. The inner controller decides what the anchors mean: ``ledger:best`` is the ledger controller
(controllers/ledger.py) treating static:best's caps as quotas it lends above, an anchored tenant-set policy
(``ppo:general``, admit.agents.sb3_policy) acts in steps around them. A base that needs its scenario
(``bind_scenario``, as static:best does to find its tuned caps) is bound through the wrapper.

The shape is Netflix concurrency-limits' limit that wraps a limit (``WindowedLimit`` wraps a delegate
``Limit``; https://github.com/Netflix/concurrency-limits): the wrapper owns the composition, so neither the
base nor the inner controller knows of the other.
"""

from __future__ import annotations

from typing import Any

from admit.core.controller import Controller
from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class AroundBase:
    """``inner`` acting around the caps of ``base`` (see the module docstring); named ``name`` (default: the
    inner controller's name)."""

    def __init__(self, inner: Any, base: Controller, name: str | None = None) -> None:
        self.inner = inner
        self.base = base
        self.name = name if name is not None else str(getattr(inner, "name", type(inner).__name__))
        self.anchors: list[int] | None = None  # the base's caps at the last reset

    def bind_scenario(self, scenario: Any) -> None:
        """Name the scenario (the registry's ``make_controller(..., scenario=S)``): the base's caps are then the
        ones it holds for that scenario."""
        bind = getattr(self.base, "bind_scenario", None)
        if bind is not None:
            bind(scenario)

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.base.reset(spec, seed)
        cap = getattr(self.base, "cap", None)
        if cap is None:
            raise ValueError(f"{self.name}: its base {getattr(self.base, 'name', self.base)!r} holds no caps to act "
                             "around")
        self.anchors = [int(c) for c in ([cap] * spec.n_tenants if isinstance(cap, int) else cap)]
        self.inner.reset(spec, seed, anchors=self.anchors)

    def act(self, obs: Observation) -> list[int]:
        return self.inner.act(obs)

    @property
    def last_failure(self) -> str | None:
        """The inner controller's reason its last decision failed, if it reports one (core.controller)."""
        return getattr(self.inner, "last_failure", None)
