"""``FailSafe``: a controller that wraps a policy so that no failure of it reaches the decision loop.

Every ``act`` asks the policy in a worker thread with a deadline (``act_timeout_s``) and validates its
answer. A policy that raises (``raised``), misses the deadline (``timeout``; a call still running at the
next decision counts as ``busy`` and is not re-entered), returns garbage (wrong length, not integers,
beyond ±max_step: ``garbage``) or reports that it could not decide (``last_failure``, core/controller.py:
the LLM policy holds when its model times out or answers nonsense; counted as ``policy:<reason>``) is held:
the decision's deltas are all zero and ``held`` names the failure, so the world keeps the last good limits
(the live world changes nothing at all for a held decision). After ``max_failures`` consecutive failures
the fallback policy (``static``: hold the limits) takes over for good. Failures are counted by kind.

The live control loop (live/control.py) drives its policy through this; the loop itself (core/loop.py)
knows nothing of failures. The shape is Netflix concurrency-limits' limit that wraps a limit, as
controllers/around.py's.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from admit.core.controller import Controller, policy_failure, validate_deltas
from admit.core.observation import Observation
from admit.core.spec import ControlSpec

log = logging.getLogger("admit.control")


class FailSafe:
    """``policy`` behind a deadline, with ``fallback`` after ``max_failures`` failures in a row (none: keep
    holding). After each ``act``: ``decided_by`` is the name of the policy that was asked, ``held`` the kind
    of failure that held the decision (None when the policy decided) and ``fell_back`` whether this decision
    switched to the fallback."""

    def __init__(self, policy: Controller, fallback: Controller | None = None, *, act_timeout_s: float,
                 max_failures: int = 3) -> None:
        if not act_timeout_s > 0:
            raise ValueError(f"act_timeout_s must be > 0, got {act_timeout_s}")
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        self.policy = policy
        self.name = policy.name  # the policy that decides now (the fallback's once it took over)
        self.fallback = fallback
        self.act_timeout_s = act_timeout_s
        self.max_failures = max_failures
        self.failures: Counter[str] = Counter()  # raised, timeout, busy, garbage, policy:<reason>
        self.consecutive_failures = 0
        self.fallbacks = 0
        self.decided_by = policy.name
        self.held: str | None = None
        self.fell_back = False
        self._spec: ControlSpec | None = None
        self._seed: int | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="policy")
        self._pending: concurrent.futures.Future[Any] | None = None

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self._spec, self._seed = spec, seed
        self.policy.reset(spec, seed)

    def close(self) -> None:
        """Leave a call stuck past its deadline behind (the worker thread ends with it)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def act(self, obs: Observation) -> Sequence[int]:
        spec = self._spec
        if spec is None:
            raise RuntimeError("FailSafe.act before reset")
        self.decided_by, self.fell_back = self.policy.name, False
        deltas, failure = self._ask(obs, spec)
        if deltas is not None:
            self.held = None
            self.consecutive_failures = 0
            return deltas
        self.held = failure
        self.failures[failure] += 1
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.max_failures and self.fallback is not None:
            log.warning("policy %s failed %d times in a row: falling back to %s", self.policy.name,
                        self.consecutive_failures, self.fallback.name)
            self.policy, self.fallback = self.fallback, None
            self.name = self.policy.name
            self.policy.reset(spec, self._seed)
            self.close()
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="policy")
            self._pending = None
            self.fallbacks += 1
            self.consecutive_failures = 0
            self.fell_back = True
        return [0] * spec.n_tenants

    def _ask(self, obs: Observation, spec: ControlSpec) -> tuple[list[int] | None, str]:
        """The policy's validated deltas, or None and the kind of failure."""
        if self._pending is not None and not self._pending.done():
            return None, "busy"  # the last call is still running past its deadline: do not pile calls up
        self._pending = self._pool.submit(self.policy.act, obs)
        try:
            raw = self._pending.result(timeout=self.act_timeout_s)
        except concurrent.futures.TimeoutError:
            return None, "timeout"
        except Exception as exc:
            log.warning("policy %s raised %s: %s", self.policy.name, type(exc).__name__, exc)
            return None, "raised"
        try:
            deltas = validate_deltas(list(raw) if not isinstance(raw, list) else raw, spec)
            reason = policy_failure(self.policy)  # read after act() returned: no other call is running
        except (TypeError, ValueError) as exc:
            log.warning("policy %s returned garbage: %s", self.policy.name, str(exc)[:200])
            return None, "garbage"
        if reason is not None:  # it held because it could not decide (an LLM that did not answer): a failure
            log.warning("policy %s could not decide: %s", self.policy.name, reason[:200])
            return None, f"policy:{reason[:64]}"
        return deltas, ""
