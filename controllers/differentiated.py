"""The published study's "differentiated surrogate": per-tenant decisions from each tenant's backlog.

It stands in for an agent that looks at tenants separately. For tenant i with queue depth q_i and limit
L_i the backlog ratio is b_i = q_i / L_i. Every decision interval, independently per tenant:

    if b_i > 1:                          L_i + 1   (more requests waiting than running: give room)
    elif p99_i > 6 s:                    L_i − 1   (its own window p99 is high: throttle it)
    elif b_i == 0:                       L_i − 1   (nothing waiting: assume spare slots, give one back)
    else:                                hold

It repairs the naive controller's worst flaw (one global signal throttles everybody) but still reacts to
a noisy short-window p99 and still gives back slots that the next burst needs, growing them back only
one step per interval — so under a 3 s queue timeout a burst meets a shrunken limit and requests drop.
That is why the study found it between naive and static.
"""

from __future__ import annotations

from admit.core.observation import Observation
from admit.core.spec import ControlSpec


class DifferentiatedController:
    name = "differentiated"

    def __init__(self, p99_threshold_s: float = 6.0, backlog_high: float = 1.0) -> None:
        self.p99_threshold_s = p99_threshold_s
        self.backlog_high = backlog_high

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        pass  # stateless

    def decision_rule(self) -> tuple[str, tuple[float, ...]] | None:
        """core.controller.decision_rule (unless ``act`` is overridden)."""
        if type(self).act is not DifferentiatedController.act:
            return None
        return "differentiated", (self.p99_threshold_s, self.backlog_high)

    def act(self, obs: Observation) -> list[int]:
        out = []
        for t in obs.tenants:
            backlog = t.queue_depth / max(t.limit, 1.0)
            if backlog > self.backlog_high:
                out.append(1)
            elif t.e2e_p99 > self.p99_threshold_s or backlog == 0:
                out.append(-1)
            else:
                out.append(0)
        return out
