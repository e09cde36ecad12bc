"""The one base of every configuration schema in admit, and its one rule for numbers that are not finite.

Every pydantic model of admit (the scenario, family, training, gateway, load generator and LLM policy
configurations, the admission queues' settings, the SLO, the workload models) derives from
:class:`StrictModel`, so they all treat input alike:

* **unknown keys are errors** (``extra="forbid"``): a misspelt key names itself instead of being ignored;
* **frozen**: a parsed configuration is a value that nothing changes behind its reader's back;
* **finite numbers only**: NaN and ±infinity are refused with "Input should be a finite number". Such a value
  is a typo or an overflow, and it would reach the simulator, the request path, Redis or a strict JSON
  parser as an error far from the file that held it.

A field where infinity is meaningful ("no bound", as a queue timeout that never fires) is typed
:data:`Unbounded`: it takes ``.inf`` (YAML) or ``math.inf``, and still refuses NaN. Its other bounds
(``gt=0``, ...) are written on the field as on any other.

This module is apart from core/config.py (the errors every configuration raises) because it imports
pydantic: the emulator reads its settings (a plain dataclass) with core/config.py and starts without it.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """A configuration schema: unknown keys refused, immutable, finite numbers only (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _not_nan(x: float) -> float:
    if math.isnan(x):
        raise ValueError("NaN is not allowed; write .inf for no bound")
    return x


Unbounded = Annotated[float, Field(allow_inf_nan=True), AfterValidator(_not_nan)]
"""A float that may be infinite, meaning "no bound"; NaN refused. The one exception to finite numbers only."""
