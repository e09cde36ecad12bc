"""Token-length distributions for prompts and outputs, written as short strings.

Accepted forms (all results are rounded and clipped to ``[1, max]``, ``max`` = 1,000,000 unless given):

* ``N`` or ``fixed:N`` — always ``N``;
* ``uniform:LO:HI`` — integers uniform on ``[LO, HI]``;
* ``normal:MEAN:STD`` — a normal draw;
* ``lognormal:MEDIAN:SIGMA`` — ``MEDIAN · exp(SIGMA · Z)`` with ``Z`` standard normal, so the median is
  ``MEDIAN`` and the mean ``MEDIAN · exp(SIGMA²/2)``;
* ``exponential:MEAN`` — an exponential draw with that mean.

An optional trailing ``:max=M`` caps the draws, e.g. ``lognormal:256:0.8:max=2048``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2, "exponential": 1}
DEFAULT_MAX = 1_000_000
FORMS = "N, fixed:N, uniform:LO:HI, normal:MEAN:STD, lognormal:MEDIAN:SIGMA, exponential:MEAN (optional :max=M)"


@dataclass(frozen=True)
class LengthDist:
    kind: str
    params: tuple[float, ...]
    max: int = DEFAULT_MAX

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths (``int64``) in ``[1, max]``."""
        p = self.params
        if self.kind == "fixed":
            x = np.full(n, p[0], dtype=np.float64)
        elif self.kind == "uniform":
            x = rng.integers(int(p[0]), int(p[1]) + 1, n).astype(np.float64)
        elif self.kind == "normal":
            x = rng.normal(p[0], p[1], n)
        elif self.kind == "lognormal":
            x = p[0] * np.exp(p[1] * rng.standard_normal(n))
        else:
            x = rng.exponential(p[0], n)
        return np.clip(np.rint(x), 1, self.max).astype(np.int64)

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
    if kind in ("fixed", "exponential") and params[0] < 1:
        raise ValueError(f"{what}: {kind} needs a value >= 1, got {params[0]:g}")
    if kind == "uniform" and not 1 <= params[0] <= params[1]:
        raise ValueError(f"{what}: uniform needs 1 <= LO <= HI, got {params[0]:g}:{params[1]:g}")
    if kind in ("normal", "lognormal") and (params[0] < 1 or params[1] < 0):
        raise ValueError(f"{what}: {kind} needs a centre >= 1 and a spread >= 0, got {text!r}")
    return LengthDist(kind, params, cap)
