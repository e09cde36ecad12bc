"""The verdict of a policy against the baseline: wins, ties or loses, on goodput without shedding a tenant.

The rule, on results.json entries (evaluate/offline.py), each p-value a two-sided Wilcoxon signed-rank test
paired by seed (zero differences split) of the policy against the baseline, the first policy evaluated:

- a tenant is **lower by more than one point** when its mean attainment (good requests / all its arrivals)
  is below the baseline's by more than ``MARGIN`` = 0.01 absolute *and* that difference has p < ``ALPHA``
  = 0.05;
- the policy **wins** when its mean overall goodput (good requests/s) is higher than the baseline's with
  p < 0.05 and no tenant is lower by more than one point;
- it **loses** when its goodput is lower with p < 0.05, or any tenant is lower by more than one point
  (whatever the goodput: a gain bought by shedding one tenant is not a win);
- otherwise it **ties** (the goodput difference is not significant and no tenant is significantly worse).

Every tenant's attainment is tested separately at 0.05, with no correction for multiple tests: that makes
"loses" easier to reach, not "wins". With few seeds the paired test cannot reach p < 0.05 at all (even with
every difference of one sign, two-sided p is 0.0625 at 5 seeds, 0.031 at 6), so such an evaluation can
only tie.
"""

from __future__ import annotations

from dataclasses import dataclass

ALPHA = 0.05
MARGIN = 0.01

RULE = (
    "a policy **wins** against the baseline when its mean goodput is higher at p < 0.05 and no tenant's "
    "attainment is lower by more than one point; a tenant counts as lower by more than one point when its mean "
    "attainment is below the baseline's by more than 0.01 (absolute) and that difference has p < 0.05. It "
    "**loses** when its goodput is lower at p < 0.05 or any tenant is lower by more than one point; otherwise it "
    "**ties**. Every p is a two-sided Wilcoxon signed-rank test paired by seed (zero differences split), each "
    "tenant tested on its own"
)


MIN_SEEDS = 6  # the fewest pairs at which a two-sided signed-rank test can reach p < 0.05 (2/2^6 = 0.031)


def too_few_seeds(n: int) -> str | None:
    """A sentence for a report of ``n`` seeds where no verdict but a tie is possible, else None."""
    if n >= MIN_SEEDS:
        return None
    return (
        f"With {n} seed{'s' if n != 1 else ''} no paired test can reach p < 0.05 (the two-sided signed-rank test "
        f"needs {MIN_SEEDS} even when every seed agrees), so every verdict here is a tie."
    )


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "wins", "ties" or "loses"
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.outcome}: {'; '.join(self.reasons)}" if self.reasons else self.outcome


def _p(x: float) -> str:
    return f"{x:.1e}" if x < 1e-3 else f"{x:.3f}"


def verdict(entry: dict, base: dict) -> Verdict:
    """``entry`` against ``base``: two policies' entries of one results.json, ``entry``'s ``p_value_vs_first``
    being against ``base`` (the first policy). The rule is the module's. The reasons give the goodput change
    and every tenant whose mean attainment is lower by more than one point: significant ones make a loss,
    the others are listed as not significant (a win or a tie with them is less sure than one without)."""
    g, bg = entry["goodput_rps"]["mean"], base["goodput_rps"]["mean"]
    pg = entry["p_value_vs_first"]["goodput_rps"]
    goodput_up = g > bg and pg < ALPHA
    goodput_down = g < bg and pg < ALPHA
    shed: list[str] = []
    loose: list[str] = []
    for name, t in entry["tenants"].items():
        a, ba = t["attainment"]["mean"], base["tenants"][name]["attainment"]["mean"]
        pa = t["p_value_vs_first"]["attainment"]
        if ba - a > MARGIN + 1e-9:  # "more than one point": exactly one point, give or take float noise, is not
            change = f"{name} attainment {a - ba:+.3f}, p = {_p(pa)}"
            if pa < ALPHA:
                shed.append(change)
            else:
                loose.append(change + " (not significant)")
    if pg >= 1.0 and abs(g - bg) < 1e-12:  # paired_p's 1.0 for differences that are all zero
        gain = "goodput the same on every seed"
    else:
        gain = f"goodput {g - bg:+.3f} req/s, p = {_p(pg)}" + ("" if pg < ALPHA else " (not significant)")
    if goodput_down or shed:
        return Verdict("loses", (gain, *shed))  # the goodput first even when it rose: it shows what was traded
    return Verdict("wins" if goodput_up else "ties", (gain, *loose))


def verdicts(data: dict) -> dict[str, Verdict | None]:
    """Every policy of ``data`` (results.json) against its first policy, the baseline (None for itself)."""
    names = list(data["policies"])
    base = data["policies"][names[0]]
    return {p: None if i == 0 else verdict(data["policies"][p], base) for i, p in enumerate(names)}
