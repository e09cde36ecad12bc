"""Token-length distributions for prompts and outputs, written as short strings.

A string is a short spelling of one of core/workload.py's size models, which defines the distribution, checks
its parameters and draws it (all results are rounded and clipped to ``[1, max]``, ``max`` = 1,000,000 unless
given):

* ``N`` or ``fixed:N`` — always ``N`` (``constant``);
* ``uniform:LO:HI`` — integers uniform on ``[LO, HI]``;
* ``normal:MEAN:STD`` — a normal draw;
* ``lognormal:MEDIAN:SIGMA`` — ``MEDIAN · exp(SIGMA · Z)`` with ``Z`` standard normal, so the median is
  ``MEDIAN`` and the mean ``MEDIAN · exp(SIGMA²/2)``;
* ``exponential:MEAN`` — an exponential draw with that mean.

An optional trailing ``:max=M`` caps the draws, e.g. ``lognormal:256:0.8:max=2048``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from admit.core.workload import ConstantSize, ExponentialSize, LognormalSize, NormalSize, UniformSize
from pydantic import ValidationError

DEFAULT_MAX = 1_000_000
FORMS = "N, fixed:N, uniform:LO:HI, normal:MEAN:STD, lognormal:MEDIAN:SIGMA, exponential:MEAN (optional :max=M)"
# each kind's numbers, in order, as the fields of its model; and the model's checks, in the string's names
_FIELDS: dict[str, tuple[type[Any], tuple[str, ...]]] = {  # every size model takes max=
    "fixed": (ConstantSize, ("value",)),
    "uniform": (UniformSize, ("low", "high")),
    "normal": (NormalSize, ("mean", "std")),
    "lognormal": (LognormalSize, ("median", "sigma")),
    "exponential": (ExponentialSize, ("mean",)),
}
_RULES = {
    "fixed": "an integer N >= 1",
    "uniform": "1 <= LO <= HI (integers)",
    "normal": "MEAN > 0 and STD >= 0",
    "lognormal": "MEDIAN > 0 and SIGMA >= 0",
    "exponential": "MEAN > 0",
}
KINDS = {kind: len(names) for kind, (_, names) in _FIELDS.items()}  # how many numbers each kind takes


@dataclass(frozen=True)
class LengthDist:
    """A length spec as written (``kind``, its numbers, the cap) and the size model it stands for (``spec``).

    Building one checks it: a value the model refuses raises ``ValueError`` naming the kind's rule.
    """

    kind: str
    params: tuple[float, ...]
    max: int = DEFAULT_MAX
    spec: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        model, names = _FIELDS[self.kind]
        object.__setattr__(self, "spec", model(**dict(zip(names, self.params, strict=True)), max=self.max))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths (``int64``) in ``[1, max]``."""
        return self.spec.sample(rng, n)

    def describe(self) -> str:
        body = ":".join(f"{v:g}" for v in self.params)
        cap = f":max={self.max}" if self.max != DEFAULT_MAX else ""
        return f"{self.kind}:{body}{cap}"


def parse_length(text: str | int, what: str = "length") -> LengthDist:
    """Parse a length spec (see module docstring); errors name ``what`` and list the allowed forms."""
    if isinstance(text, bool):
        raise ValueError(f"{what}: expected one of {FORMS}, got {text!r}")
    if isinstance(text, int | float):
        text = str(int(text)) if float(text).is_integer() else str(text)
    parts = [s.strip() for s in str(text).strip().split(":")]
    cap = DEFAULT_MAX
    if parts and parts[-1].startswith("max="):
        try:
            cap = int(parts[-1][4:])
        except ValueError:
            raise ValueError(f"{what}: max must be an integer, got {parts[-1]!r}") from None
        if cap < 1:
            raise ValueError(f"{what}: max must be >= 1, got {cap}")
        parts = parts[:-1]
    if len(parts) == 1:
        parts = ["fixed", parts[0]]
    kind, raw = parts[0], parts[1:]
    if kind not in KINDS:
        raise ValueError(f"{what}: unknown distribution {kind!r}; allowed forms: {FORMS}")
    if len(raw) != KINDS[kind]:
        raise ValueError(f"{what}: {kind} takes {KINDS[kind]} number(s), got {len(raw)} in {text!r}; forms: {FORMS}")
    try:
        params = tuple(float(v) for v in raw)
    except ValueError:
        raise ValueError(f"{what}: parameters must be numbers, got {text!r}; forms: {FORMS}") from None
    try:
        return LengthDist(kind, params, cap)
    except ValidationError:  # the model's checks, said in the string's own names
        raise ValueError(f"{what}: {kind} needs {_RULES[kind]}, got {text!r}") from None
