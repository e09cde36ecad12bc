"""The verdict of a policy against the baseline: wins, ties or loses, on goodput without shedding a tenant, or,
where the tenants have contracts, on the contracts kept and then goodput.

Without contracts, the rule, on results.json entries (evaluate/offline.py), each p-value a two-sided Wilcoxon
signed-rank test paired by seed (zero differences split) of the policy against the baseline, the first policy
evaluated:

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

**Where the tenants have contracts** (core/contract.py; the baseline's tenants carry ``contract`` and
``contract_attainment``), the promises replace the per-tenant attainment test:

- a tenant's contract is **met on a table** when its mean in-contract attainment over the table's seeds (good
  in-contract requests / in-contract arrivals, per seed, then averaged) is at least the promised
  ``attainment``. The promise is a fraction over many requests and the seeds are independent episodes of
  the same traffic, so the mean over them estimates it: one unlucky seed does not break it, a policy that
  falls short on most seeds does. (The episodes' own ``contracts_met``, averaged, is another figure: how many
  contracts one episode keeps, which a single bad burst can flip.);
- a policy **breaks a contract the baseline keeps** when the baseline meets it, the policy does not, *and* the
  policy's in-contract attainment is lower than the baseline's with p < 0.05 (the same paired test): a mean
  that lands just under the promise by noise alone (0.989 against 0.990, not significantly below the
  baseline's) does not decide a loss;
- the policy **wins** when its goodput is higher with p < 0.05 and it meets every contract the baseline meets
  (its mean at or above each such promise: a win asks for certainty, so a miss that is not significant still
  blocks it);
- it **loses** when it breaks a contract the baseline keeps (whatever its goodput: goodput bought with a
  promise is not a win) or its goodput is lower with p < 0.05;
- otherwise it **ties**.

Tenants without a contract were promised nothing and do not enter this verdict. A contract the baseline
already misses cannot be broken; a policy that keeps it is told so in the reasons, which list the goodput
change, every contract broken, every one missed without significance, every one both break where the policy's
in-contract attainment is lower than the baseline's with p < 0.05 (the same paired test; it decides nothing,
but a win or tie that sinks a promise already broken further is not hidden) and every one kept that the
baseline misses.
"""

from __future__ import annotations

from dataclasses import dataclass

from admit.core.contract import ATTAINMENT_EPS

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

CONTRACT_RULE = (
    "where the tenants have contracts, a tenant's contract is **met** on a table when its mean in-contract "
    "attainment over the seeds is at least the promised attainment; a policy **wins** against the baseline when "
    "its mean goodput is higher at p < 0.05 and it meets every contract the baseline meets; it **loses** when its "
    "goodput is lower at p < 0.05 or it breaks a contract the baseline keeps (the baseline meets it, the policy "
    "does not, and the policy's in-contract attainment is lower than the baseline's at p < 0.05, so noise alone "
    "does not decide); otherwise it **ties**. Tenants without a contract do not enter the verdict"
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


def promises(entry: dict) -> dict[str, float]:
    """``{tenant: promised attainment}`` of an entry's tenants that have a contract and its figures (empty
    without contracts, or where the contract figures were not measured)."""
    return {n: float(t["contract"]["attainment"]) for n, t in entry.get("tenants", {}).items()
            if "contract" in t and "contract_attainment" in t}


def has_contracts(data: dict) -> bool:
    """Whether a results.json's tenants have contracts, judged on its first policy (the baseline)."""
    pols = data["policies"]
    return bool(pols) and bool(promises(next(iter(pols.values()))))


def meets(tenant: dict) -> bool:
    """Whether a tenant's contract is met on the table: its mean in-contract attainment over the seeds is at
    least the promise."""
    return tenant["contract_attainment"]["mean"] >= tenant["contract"]["attainment"] - ATTAINMENT_EPS


def contracts_met(entry: dict) -> tuple[int, int]:
    """(how many of the entry's contracts are met on the table, how many there are)."""
    tenants = entry["tenants"]
    names = promises(entry)
    return sum(meets(tenants[n]) for n in names), len(names)


def _gain(entry: dict, base: dict) -> tuple[str, bool, bool]:
    """The goodput change in words, and whether it is significantly up, or down."""
    g, bg = entry["goodput_rps"]["mean"], base["goodput_rps"]["mean"]
    pg = entry["p_value_vs_first"]["goodput_rps"]
    if pg >= 1.0 and abs(g - bg) < 1e-12:  # paired_p's 1.0 for differences that are all zero
        gain = "goodput the same on every seed"
    else:
        gain = f"goodput {g - bg:+.3f} req/s, p = {_p(pg)}" + ("" if pg < ALPHA else " (not significant)")
    return gain, g > bg and pg < ALPHA, g < bg and pg < ALPHA


def contract_verdict(entry: dict, base: dict) -> Verdict:
    """``entry`` against ``base`` where the baseline's tenants have contracts: the module's rule with contracts.
    The reasons give the goodput change, then every contract broken (a loss), missed without significance (no
    win), broken by both with the policy's in-contract attainment lower than the baseline's at p < 0.05 (no
    loss, but said) and kept where the baseline misses it."""
    gain, goodput_up, goodput_down = _gain(entry, base)
    broken: list[str] = []
    missed: list[str] = []
    lower: list[str] = []
    kept: list[str] = []
    for name, promise in promises(base).items():
        t, bt = entry["tenants"][name], base["tenants"][name]
        a, ba = t["contract_attainment"]["mean"], bt["contract_attainment"]["mean"]
        if meets(bt) and not meets(t):
            pa = t["p_value_vs_first"]["contract_attainment"]
            change = (f"{name}'s contract broken: in-contract attainment {a:.3f} < {promise:g} (baseline "
                      f"{ba:.3f}), p = {_p(pa)}")
            if a < ba and pa < ALPHA:
                broken.append(change)
            else:
                missed.append(change.replace("contract broken", "contract missed") + " (not significant)")
        elif meets(t) and not meets(bt):
            kept.append(f"{name}'s contract kept: in-contract attainment {a:.3f} ≥ {promise:g} (baseline {ba:.3f})")
        elif not meets(t) and not meets(bt):  # no loss (the baseline breaks it too), but a worse one is said
            pa = t["p_value_vs_first"]["contract_attainment"]
            if a < ba and pa < ALPHA:
                lower.append(f"{name}'s contract broken by both, lower: in-contract attainment {a:.3f} < baseline "
                             f"{ba:.3f} (promise {promise:g}), p = {_p(pa)}")
    if goodput_down or broken:
        return Verdict("loses", (gain, *broken, *missed, *lower, *kept))
    return Verdict("wins" if goodput_up and not missed else "ties", (gain, *missed, *lower, *kept))


def verdict(entry: dict, base: dict) -> Verdict:
    """``entry`` against ``base``: two policies' entries of one results.json, ``entry``'s ``p_value_vs_first``
    being against ``base`` (the first policy). The rule is the module's: with contracts where the baseline's
    tenants have them (`contract_verdict`), else on goodput and each tenant's attainment, whose reasons give
    the goodput change and every tenant whose mean attainment is lower by more than one point: significant
    ones make a loss, the others are listed as not significant (a win or a tie with them is less sure than one
    without)."""
    if promises(base):
        return contract_verdict(entry, base)
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
    gain = _gain(entry, base)[0]
    if goodput_down or shed:
        return Verdict("loses", (gain, *shed))  # the goodput first even when it rose: it shows what was traded
    return Verdict("wins" if goodput_up else "ties", (gain, *loose))


def verdicts(data: dict) -> dict[str, Verdict | None]:
    """Every policy of ``data`` (results.json) against its first policy, the baseline (None for itself)."""
    names = list(data["policies"])
    base = data["policies"][names[0]]
    return {p: None if i == 0 else verdict(data["policies"][p], base) for i, p in enumerate(names)}
