"""Policies by name, as the command line spells them: ``static``, ``static:6``, ``static:best``, ``naive``, ...

``make_controller("NAME[:ARG]")`` builds a fresh controller: the hand-written ones of controllers/, the
shipped and trained ones of agents/ (``static:best``, agents/static_best.py: static caps tuned for goodput on
seeds disjoint from the evaluation's; ``static:contract``, the same under the tenants' contracts; ``ppo:PATH``
and friends; ``llm:URL``). It lives in agents/ because it makes agents' policies; the heavy ones (torch, the
openai client) are imported only when one is made.
A policy that acts around static:best's caps (``ledger:best``, an anchored tenant-set policy such as
``ppo:general``) is that policy wrapped around ``BestStatic`` (controllers/around.py). A policy that needs more
of its world than the ``ControlSpec`` it gets at ``reset`` (static:best needs the scenario's workload to find
its caps) exposes ``bind_scenario(scenario)``; ``make_controller(text, scenario=S)`` calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from admit.agents.static_best import BestStatic, ContractStatic
from admit.controllers.aimd import AIMDController
from admit.controllers.around import AroundBase
from admit.controllers.contract import ContractController
from admit.controllers.contracts_field import (
    ApfController,
    KueueBorrowController,
    LitellmReservedController,
    ShareStaticController,
    VtcController,
)
from admit.controllers.differentiated import DifferentiatedController
from admit.controllers.envoy import EnvoyGradientController
from admit.controllers.field import (
    DynamoWdrrController,
    LlmdShedController,
    LlmdSoftController,
    VllmTokenCapController,
)
from admit.controllers.gradient2 import Gradient2Controller
from admit.controllers.ledger import LedgerController
from admit.controllers.naive import NaiveController
from admit.controllers.robust import RobustController
from admit.controllers.saturation import SaturationGateController
from admit.controllers.static import StaticController
from admit.core.controller import Controller

if TYPE_CHECKING:
    from admit.envs.scenario import Scenario


def _static(arg: str | None) -> Controller:
    if arg is None:
        return StaticController()
    if arg == "share":  # caps in proportion to the tenants' contracts (controllers/contracts_field.py)
        return ShareStaticController()
    if arg == "best":
        return BestStatic()
    if arg == "contract":  # the caps with the most goodput that keep every contract
        return ContractStatic()
    if arg == "contract-stale":  # static:contract's caps tuned on last week's traffic (envs/family.py last_week)
        from admit.agents.static_best import StaleContractStatic

        return StaleContractStatic()
    try:
        caps = [int(x) for x in arg.split(",")]
    except ValueError:
        raise ValueError(
            "static:ARG takes an integer cap, comma-separated caps per tenant, 'best', 'contract', "
            f"'contract-stale' or 'share', got {arg!r}"
        ) from None
    c = StaticController(caps[0] if len(caps) == 1 else caps)
    c.name = f"static:{arg}"
    return c


def _ledger(arg: str | None) -> Controller:
    if arg is None:
        return LedgerController()
    if arg == "best":  # static:best's caps as quotas: borrow above them, give back first
        return AroundBase(LedgerController(), BestStatic(), name="ledger:best")
    raise ValueError(f"policy 'ledger' takes no argument or 'best', got {arg!r}")


def _no_arg(cls: Any) -> Callable[[str | None], Controller]:  # a controller class with a name
    def make(arg: str | None) -> Controller:
        if arg is not None:
            raise ValueError(f"policy {cls.name!r} takes no argument, got {arg!r}")
        return cls()

    return make


# robust and its ablations: each one switches one requirement off (controllers/robust.py: the study's four and
# the interference gate)
_ROBUST_ABLATIONS = {
    "robust": {},
    "robust-no-confidence": {"confidence": False},
    "robust-global": {"per_tenant": False},
    "robust-symmetric": {"asymmetric": False},
    "robust-no-context": {"context": False},
    "robust-no-interference": {"interference": False},
}


def _robust(name: str) -> Callable[[str | None], Controller]:
    def make(arg: str | None) -> Controller:
        if arg is not None:
            raise ValueError(f"policy {name!r} takes no argument, got {arg!r}")
        c = RobustController(**_ROBUST_ABLATIONS[name])
        c.name = name
        return c

    return make


_FACTORIES: dict[str, Callable[[str | None], Controller]] = {
    "static": _static,
    "naive": _no_arg(NaiveController),
    "differentiated": _no_arg(DifferentiatedController),
    "aimd": _no_arg(AIMDController),
    "gradient2": _no_arg(Gradient2Controller),
    "envoy": _no_arg(EnvoyGradientController),
    "saturation": _no_arg(SaturationGateController),
    "llmd-shed": _no_arg(LlmdShedController),
    "llmd-soft": _no_arg(LlmdSoftController),
    "vllm-tokencap": _no_arg(VllmTokenCapController),
    "dynamo-wdrr": _no_arg(DynamoWdrrController),
    # contract baselines (controllers/contracts_field.py)
    "apf": _no_arg(ApfController),
    "kueue-borrow": _no_arg(KueueBorrowController),
    "litellm-reserved": _no_arg(LitellmReservedController),
    "vtc": _no_arg(VtcController),
    "contract": _no_arg(ContractController),  # keeps the contracts, lends the rest (controllers/contract.py)
    "ledger": _ledger,
    **{name: _robust(name) for name in _ROBUST_ABLATIONS},
}


# names a policy had before, and its name now: an old name is refused with the new one in the error
RENAMED = {"token": "ledger"}


def register_prefix(name: str, factory: Callable[[str | None], Controller]) -> None:
    _FACTORIES[name] = factory


def available() -> list[str]:
    return sorted(_FACTORIES)


def make_controller(text: str, scenario: Scenario | None = None) -> Controller:
    """A fresh controller named by ``text``; given ``scenario``, one that can use it is bound to it."""
    name, _, arg = text.partition(":")
    factory = _FACTORIES.get(name)
    if factory is None:
        if name in RENAMED:
            raise ValueError(f"policy {name!r} is now called {RENAMED[name]!r}: "
                             f"use {RENAMED[name] + text[len(name):]!r} (docs/controllers.md)")
        raise ValueError(f"unknown policy {text!r}; available: {', '.join(available())} (some take ':ARG')")
    ctrl = factory(arg or None)
    bind = getattr(ctrl, "bind_scenario", None)
    if scenario is not None and bind is not None:
        bind(scenario)
    return ctrl


def _llm(arg: str | None) -> Controller:
    from admit.agents.llm_policy import make_llm_policy  # imported on use: it needs the openai client

    return make_llm_policy(arg)


register_prefix("llm", _llm)


def _sb3(algo: str) -> Callable[[str | None], Controller]:
    def make(arg: str | None) -> Controller:
        from admit.agents.sb3_policy import make_sb3_policy  # imported on use: it needs torch

        policy = make_sb3_policy(algo, arg)
        if policy.anchored:  # it acts around static:best's caps
            return AroundBase(policy, BestStatic())
        return policy

    return make


for _algo in ("ppo", "a2c", "dqn", "sac"):
    register_prefix(_algo, _sb3(_algo))
