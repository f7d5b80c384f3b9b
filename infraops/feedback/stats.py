"""Candidate-versus-baseline statistics for performance samples, and instruction-count parsers.

Pure: numpy and scipy only, no Django. Everything here is a function of its arguments (the
bootstrap takes its seed as a parameter), so a stored comparison can be recomputed exactly.

The contract of `compare` is that noise is never called a change: "improved" and "regressed"
need two tests at level alpha to agree (a bootstrap interval of the ratio of medians at level
1 - alpha that excludes 1, and a Mann-Whitney rank test below alpha); "no change" needs that
interval to lie inside the equivalence margin (the smallest meaningful effect); everything else
is "inconclusive", with the reason in words and the repeats a side that would decide it at the
observed noise, so the reader knows whether to take more samples or to measure instructions
instead of wall time.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

_NORMAL = NormalDist()  # the standard normal: its quantiles, as scipy's norm.ppf gives them

IMPROVED = "improved"
REGRESSED = "regressed"
NO_CHANGE = "no change"
INCONCLUSIVE = "inconclusive"
VERDICTS = (IMPROVED, REGRESSED, NO_CHANGE, INCONCLUSIVE)
DIRECTIONS = ("minimize", "maximize")

MIN_SAMPLES = 3
CI_LEVEL = 0.95
POWER = 0.80
# "No change" by default means "any effect lies within +-1%": a bound a short wall-time run
# rarely reaches (CV 16-29% measured on this machine class) but instruction counts do.
DEFAULT_NO_CHANGE_MARGIN = 0.01
# Beyond this, "N repeats would decide" is no advice: the probe is the wrong instrument.
MAX_ADVISED_REPEATS = 1000
MIN_RESAMPLES = 100
# 1.4826 * MAD estimates the standard deviation of a normal distribution.
_MAD_TO_SIGMA = 1.4826

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Comparison:
    """Candidate against baseline for one metric and case.

    `ratio` is candidate_median / baseline_median; `ci_low`/`ci_high` its bootstrap
    interval at `CI_LEVEL`; `p_value` the two-sided Mann-Whitney U test; `cv_*` robust
    coefficients of variation (1.4826 * MAD / median); `mde` the minimal detectable relative
    effect (0.05 = 5%). A value that cannot be computed (too few samples, a zero baseline
    median) is NaN here and None in `as_dict`. `reason` says in one sentence why the verdict;
    for "inconclusive", `repeats_needed` is the repeats a side that would decide it at this
    noise (0 when decided or unknown) and `advice` says so in words.
    """

    n_baseline: int
    n_candidate: int
    baseline_median: float
    candidate_median: float
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    cv_baseline: float
    cv_candidate: float
    mde: float
    verdict: str
    direction: str
    reason: str
    alpha: float
    margin: float
    repeats_needed: int = 0
    advice: str = ""
    # Set by `sequential_compare`: the look that gave the verdict (1-based) of how many, and
    # in words what the sequential procedure and the first-run guard did ("" for none).
    look: int = 1
    looks: int = 1
    sequence: str = ""

    def as_dict(self) -> dict[str, object]:
        """Every field by name; NaN and infinities become None, so the dict is strict JSON."""
        return {f.name: _json_safe(getattr(self, f.name)) for f in fields(self)}


def compare(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    direction: str = "minimize",
    alpha: float = 0.01,
    margin: float = DEFAULT_NO_CHANGE_MARGIN,
    resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Compare two independent samples of a non-negative metric (time, count, rate).

    Samples come from interleaved repeats (baseline and candidate alternating), which keeps
    slow drift of the machine out of the difference; they are not treated as pairs by index.

    Confidence interval: percentile bootstrap of median(candidate) / median(baseline), each side
    resampled independently with replacement, `resamples` times, from
    `numpy.random.default_rng(seed)`. Independent resampling is the conservative choice: if
    interleaved neighbours are positively correlated, a paired interval would only be narrower.
    A resample whose baseline median is 0 counts as an unbounded ratio. `ci_low`/`ci_high`
    report the `CI_LEVEL` (95%) interval; the verdict uses the decision interval at level
    1 - alpha (99% at the default alpha) from the same resamples, so both of its tests hold
    the same level: with 95% the interval added almost nothing to the rank test (A/A false
    alarms 0.82% against 0.87% for the rank test alone, 6000 trials at CV 20% and n = 20),
    with 1 - alpha it halves them (0.43%).

    Verdict, first rule that holds (m is `margin`, the smallest meaningful effect):
    1. fewer than `MIN_SAMPLES` values on a side -> "inconclusive";
    2. every value on both sides identical -> "no change" (ratio 1, interval [1, 1]);
    3. baseline median 0 -> "inconclusive" (a relative effect is undefined);
    4. the decision interval lies inside [1 - m, 1 + m] -> "no change" (any effect, even a
       real one, is smaller than m);
    5. the decision interval excludes 1 AND p < `alpha` AND |ratio - 1| >= m -> "improved"
       or "regressed", as `direction` says which way is better;
    6. otherwise "inconclusive" (the interval is too wide for the noise and n), with the
       repeats a side that would decide it (`repeats_needed`).
    Many metrics and cases compared at once multiply the false alarms: pass alpha / k.

    MDE, to first order in the CV (relative effect ~ difference of log values, robust CV ~ their
    standard deviation): (z(1 - alpha/2) + z(POWER)) * sqrt(pi/2) * sqrt(cv_b^2/n_b + cv_c^2/n_c).
    sqrt(pi/2) is the standard error of a median over that of a mean; it is larger than the
    rank test's sqrt(pi/3): at the MDE the interval test has `POWER` power and the rank test
    about 95%, so rule 4 detects such an effect about 80% of the time (74-83% simulated at
    CV 5-20%, n 20-50).

    Raises ValueError for NaN, infinite or negative values, a sample that is not
    one-dimensional, an unknown direction, alpha outside (0, 1), a margin outside (0, 1), or
    fewer than `MIN_RESAMPLES` resamples.
    """
    base = _checked_sample(baseline, "baseline")
    cand = _checked_sample(candidate, "candidate")
    _check_options(direction, alpha, margin, resamples)
    n_b, n_c = base.size, cand.size
    b_med, c_med = _median(base), _median(cand)
    cv_b, cv_c = _robust_cv(base), _robust_cv(cand)
    ratio = _ratio(c_med, b_med)
    nan = math.nan

    def result(
        verdict: str, reason: str, *, ci: tuple[float, float] = (nan, nan),
        p_value: float = nan, mde: float = nan, ratio: float = ratio,
        needed: tuple[int, str] = (0, ""),
    ) -> Comparison:
        return Comparison(
            n_baseline=n_b, n_candidate=n_c, baseline_median=b_med, candidate_median=c_med,
            ratio=ratio, ci_low=ci[0], ci_high=ci[1], p_value=p_value, cv_baseline=cv_b,
            cv_candidate=cv_c, mde=mde, verdict=verdict, direction=direction, reason=reason,
            alpha=alpha, margin=margin, repeats_needed=needed[0], advice=needed[1],
        )

    if min(n_b, n_c) < MIN_SAMPLES:
        return result(
            INCONCLUSIVE,
            f"fewer than {MIN_SAMPLES} samples a side (baseline {n_b}, candidate {n_c})",
            needed=(max(MIN_SAMPLES, min_rank_repeats(alpha)),
                    f"run at least {max(MIN_SAMPLES, min_rank_repeats(alpha))} repeats a side: "
                    f"the rank test cannot reach p < {alpha:g} with fewer"),
        )
    if np.all(base == base[0]) and np.all(cand == base[0]):
        return result(
            NO_CHANGE, "every sample on both sides is identical",
            ci=(1.0, 1.0), p_value=1.0, mde=0.0, ratio=1.0,
        )
    from scipy import stats as sps  # here, not at import: 0.4 s of every process's start

    p_value = float(sps.mannwhitneyu(cand, base, alternative="two-sided").pvalue)
    if b_med == 0.0:
        return result(
            INCONCLUSIVE, "the baseline median is 0, so a relative effect is undefined",
            p_value=p_value,
        )
    ratios = _bootstrap_ratios(base, cand, resamples, seed)
    ci = _interval(ratios, CI_LEVEL)
    decision = _interval(ratios, 1.0 - alpha)
    mde = _mde(cv_b, n_b, cv_c, n_c, alpha)
    verdict, reason = _verdict(ratio, decision, p_value, mde, direction, alpha, margin)
    needed = (0, "")
    if verdict == INCONCLUSIVE:
        needed = _advice(ratio, cv_b, cv_c, min(n_b, n_c), alpha, margin, excludes_one=(
            decision[0] > 1.0 or decision[1] < 1.0), significant=p_value < alpha)
    return result(verdict, reason, ci=ci, p_value=p_value, mde=mde, needed=needed)


# --- the sequential procedure and the first-run guard ---------------------------------------

# The share of alpha the extension looks spend; the planned look keeps the rest: 0.8 * 0.01 =
# 0.008 still lets five repeats a side decide (complete separation gives p = 2/252 = 0.0079).
EXTENSION_SHARE = 0.2
# A side's first execution is a first-run outlier (a fresh checkout's bytecode compilation, a
# cold cache) when it is worse than every later one of the planned look, by more than this
# many robust standard deviations of those later ones.
FIRST_RUN_SIGMAS = 10.0
FIRST_RUN_MIN_REST = 2  # later executions a side needed to judge the first one


def looks(repeat: int, extra: int) -> tuple[int, ...]:
    """Samples a side at each look: the planned `repeat`, then `extra` more in two stages
    (half of them, then the rest); one look when there is no budget."""
    if extra <= 0:
        return (repeat,)
    return tuple(sorted({repeat, repeat + (extra + 1) // 2, repeat + extra}))


def look_levels(count: int, alpha: float) -> tuple[float, ...]:
    """The nominal level of each of `count` looks, by alpha spending (Lan & DeMets 1983): the
    planned look spends (1 - EXTENSION_SHARE) * alpha (all of it when it is the only look);
    the extension looks spend the rest along the Pocock-type function ln(1 + (e - 1) t) of the
    extension's information fraction t. Each look's level is its increment of the spent alpha,
    so by Bonferroni the false-alarm rate over all looks is at most alpha however the looks
    correlate (conservative: exact group-sequential boundaries would be a little wider)."""
    if count <= 1:
        return (alpha,)
    first = alpha * (1.0 - EXTENSION_SHARE)
    extension = alpha * EXTENSION_SHARE
    spent = [first] + [first + extension * math.log1p((math.e - 1.0) * k / (count - 1))
                       for k in range(1, count)]
    return tuple(b - a for a, b in zip([0.0, *spent[:-1]], spent, strict=True))


def first_run_outlier(values: Sequence[float], direction: str = "minimize") -> bool:
    """Whether the first of a side's values in run order (the planned look's, `values`) is a
    first-run outlier: worse than every later one (higher, or lower for "maximize") and
    further from their median than FIRST_RUN_SIGMAS robust standard deviations of them (any
    distance when they are all equal). Needs FIRST_RUN_MIN_REST later values."""
    if len(values) < FIRST_RUN_MIN_REST + 1:
        return False
    first, rest = float(values[0]), np.asarray(values[1:], dtype=np.float64)
    worse = first > rest.max() if direction == "minimize" else first < rest.min()
    if not worse:
        return False
    median = float(np.median(rest))
    spread = _MAD_TO_SIGMA * float(np.median(np.abs(rest - median)))
    return abs(first - median) > FIRST_RUN_SIGMAS * spread


def sequential_compare(
    baseline: Sequence[float], candidate: Sequence[float], *, plan: Sequence[int],
    direction: str = "minimize", alpha: float = 0.01,
    margin: float = DEFAULT_NO_CHANGE_MARGIN, seed: int = 0, resamples: int = 2000,
) -> Comparison:
    """`compare` at each look of `plan` (samples a side, see `looks`) that both sides reached,
    at the look's nominal level (`look_levels`); the first look that decides gives the
    verdict, else the last look reached says why it stays inconclusive. Values are one per
    execution, in run order: a look reads the first n of each side. A side's first value is
    left out when it is a first-run outlier among the planned look's (`first_run_outlier`):
    the runner then ran one more repeat, so the look still has its n. With no look reached
    (fewer values than planned), everything there is is compared at the first look's level.

    Group-sequential design, alpha spending per Lan & DeMets (1983), "Discrete sequential
    boundaries for clinical trials", Biometrika 70(3):659-663, with Bonferroni-bounded
    nominal levels: the false-alarm rate over all looks stays at most `alpha`."""
    base, cand = list(baseline), list(candidate)
    left_out: list[str] = []
    if first_run_outlier(base[:plan[0]], direction):
        base, left_out = base[1:], [*left_out, "baseline"]
    if first_run_outlier(cand[:plan[0]], direction):
        cand, left_out = cand[1:], [*left_out, "candidate"]
    levels = look_levels(len(plan), alpha)
    reached = [k for k, n in enumerate(plan) if min(len(base), len(cand)) >= n]
    notes = [f"the {' and '.join(left_out)}'s first execution left out: a first-run outlier"
             ] if left_out else []
    if not reached:
        result = compare(base, cand, direction=direction, alpha=levels[0], margin=margin,
                         seed=seed, resamples=resamples)
        return dataclasses.replace(result, looks=len(plan), sequence="; ".join(notes))
    for k in reached:
        result = compare(base[:plan[k]], cand[:plan[k]], direction=direction, alpha=levels[k],
                         margin=margin, seed=seed, resamples=resamples)
        if result.verdict != INCONCLUSIVE:
            break
    if len(plan) > 1:
        notes.insert(0, f"look {k + 1} of {len(plan)} ({plan[k]} a side; level {levels[k]:.2g}"
                        f" of the overall {alpha:g}, alpha spent over the looks)")
    return dataclasses.replace(result, look=k + 1, looks=len(plan), sequence="; ".join(notes))


def more_would_decide(result: Comparison, plan: Sequence[int]) -> bool:
    """Whether the runner should take the next look: the comparison is inconclusive at a look
    before the last, and at its noise the repeats the budget allows would decide it. For an
    effect of at least the margin that noise is the robust CV, which an outlier leaves alone:
    a large effect, or one that a single execution hit by load hides from the rank test, is
    worth the repeats; a small effect in wide noise is not."""
    if result.verdict != INCONCLUSIVE or result.look >= len(plan):
        return False
    observed = abs(result.ratio - 1.0)
    if math.isfinite(observed) and observed >= result.margin:
        needed = repeats_to_detect(result.cv_baseline, result.cv_candidate, observed,
                                   result.alpha)
    else:
        needed = result.repeats_needed
    return needed is not None and 0 < needed <= plan[-1]


def _verdict(
    ratio: float, decision: tuple[float, float], p_value: float, mde: float,
    direction: str, alpha: float, margin: float,
) -> tuple[str, str]:
    """Rules 4-6 of `compare`'s docstring on the decision interval, with the reason in words."""
    low, high = decision
    interval = f"ratio {ratio:.4g}, {(1.0 - alpha) * 100:g}% interval [{low:.4g}, {high:.4g}]"
    excludes_one = low > 1.0 or high < 1.0
    significant = p_value < alpha
    if 1.0 - margin <= low and high <= 1.0 + margin:
        small = " (a real effect, but smaller than that)" if excludes_one and significant else ""
        return (NO_CHANGE, f"{interval} lies within +-{margin:.2%} of 1, the smallest "
                           f"meaningful effect{small}")
    relevant = abs(ratio - 1.0) >= margin
    if excludes_one and significant and relevant:
        better = (ratio < 1.0) == (direction == "minimize")
        return (
            IMPROVED if better else REGRESSED,
            f"{interval} excludes 1 and Mann-Whitney p={p_value:.2g} < {alpha:g}",
        )
    if not excludes_one:
        why = f"{interval} includes 1 and reaches beyond +-{margin:.2%}"
    elif not significant:
        why = f"{interval} excludes 1 but Mann-Whitney p={p_value:.2g} >= {alpha:g}"
    else:
        why = (f"{interval}: the effect is below the smallest meaningful effect "
               f"{margin:.2%} but not bounded by it")
    return INCONCLUSIVE, f"{why}; minimal detectable effect at this noise and n: {mde:.2%}"


def min_rank_repeats(alpha: float) -> int:
    """The fewest repeats a side (equal sides) at which the exact two-sided Mann-Whitney test
    can reach p < alpha at all (complete separation gives p = 2 / C(2n, n)): 5 at 0.01."""
    n = 1
    while 2.0 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def plan_can_decide(repeat: int, extra: int, alpha: float = 0.01) -> bool:
    """Whether any look of the plan (`looks(repeat, extra)`, each at its `look_levels` level)
    can call a change at all: complete separation there gives a rank-test p below the level."""
    plan = looks(repeat, extra)
    # Against the fewest repeats that can (a handful): a manifest's repeat may be any whole
    # number, and an exact C(2n, n) of a million would take a minute and overflow a float.
    return any(n >= min_rank_repeats(level)
               for n, level in zip(plan, look_levels(len(plan), alpha), strict=True))


def repeats_to_detect(cv_b: float, cv_c: float, effect: float, alpha: float) -> int | None:
    """Repeats a side at which `effect` is the minimal detectable effect (the MDE formula of
    `compare`, solved for n with equal sides), at least `min_rank_repeats`; None when the
    noise or the effect is not a finite positive number."""
    var = cv_b**2 + cv_c**2
    if not (math.isfinite(var) and math.isfinite(effect) and effect > 0):
        return None
    z = float(_NORMAL.inv_cdf(1.0 - alpha / 2) + _NORMAL.inv_cdf(POWER))
    return max(math.ceil(z * z * math.pi / 2 * var / effect**2), min_rank_repeats(alpha))


def _advice(ratio: float, cv_b: float, cv_c: float, n: int, alpha: float, margin: float, *,
            excludes_one: bool, significant: bool) -> tuple[int, str]:
    """What would decide an inconclusive comparison: (repeats a side, the advice in words)."""
    floor = min_rank_repeats(alpha)
    if excludes_one and not significant and n < floor:
        return floor, (f"the interval excludes 1 but the rank test cannot reach p < {alpha:g} "
                       f"with fewer than {floor} repeats a side: run {floor} or more")
    observed = abs(ratio - 1.0)
    noise = f"with this noise (CV {max(cv_b, cv_c):.1%})"
    if observed >= margin:
        needed = repeats_to_detect(cv_b, cv_c, observed, alpha)
        goal = f"would detect the observed {observed:.1%} effect"
        smallest = repeats_to_detect(cv_b, cv_c, margin, alpha)
        if needed is not None and smallest is not None and smallest > needed:
            goal += f" ({smallest} the smallest meaningful {margin:.1%})"
    else:  # the question is whether any effect stays within the margin
        slack = margin - observed
        z = float(_NORMAL.inv_cdf(1.0 - alpha / 2))
        var = cv_b**2 + cv_c**2
        needed = (max(math.ceil(z * z * math.pi / 2 * var / slack**2), floor)
                  if math.isfinite(var) and slack > 0 else None)
        goal = f"would show whether any effect stays within +-{margin:.1%}"
    if needed is None:
        return 0, "the noise cannot be estimated: more repeats a side are needed"
    if needed <= n:  # the robust CV says "enough" yet the interval says no: it is unreliable
        more = max(2 * n, floor)
        # A robust CV of 0 means most values are equal; above 0 it reads the middle of the
        # values only, while an outlier widens the interval.
        why = ("most values equal" if max(cv_b, cv_c) == 0
               else "it reads the middle values; an outlier widens the interval")
        return more, (f"the noise estimate is unreliable at this n (robust CV "
                      f"{max(cv_b, cv_c):.1%}, {why}) while the interval is wide: "
                      f"run more repeats a side, e.g. {more}")
    if needed > MAX_ADVISED_REPEATS:
        return needed, (f"{noise} more than {MAX_ADVISED_REPEATS} repeats a side {goal}: "
                        "measure instructions (measure = \"instructions\") or a longer probe")
    return needed, f"{noise}, {needed} repeats a side {goal}"


def _bootstrap_ratios(base: FloatArray, cand: FloatArray, resamples: int, seed: int) -> FloatArray:
    rng = np.random.default_rng(seed)
    b_meds = np.median(base[rng.integers(0, base.size, (resamples, base.size))], axis=1)
    c_meds = np.median(cand[rng.integers(0, cand.size, (resamples, cand.size))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = c_meds / b_meds
    ratios[np.isnan(ratios)] = np.inf  # 0 / 0: a zero baseline median bounds nothing
    return ratios


def _interval(ratios: FloatArray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


def _mde(cv_b: float, n_b: int, cv_c: float, n_c: int, alpha: float) -> float:
    z = float(_NORMAL.inv_cdf(1.0 - alpha / 2) + _NORMAL.inv_cdf(POWER))
    return z * math.sqrt(math.pi / 2) * math.sqrt(cv_b**2 / n_b + cv_c**2 / n_c)


def _robust_cv(values: FloatArray) -> float:
    """1.4826 * MAD / median: 0 for a constant sample, inf when the median is 0 but not the MAD."""
    if values.size == 0:
        return math.nan
    median = _median(values)
    spread = _MAD_TO_SIGMA * float(np.median(np.abs(values - median)))
    if spread == 0.0:
        return 0.0
    return spread / median if median > 0 else math.inf


def _median(values: FloatArray) -> float:
    return float(np.median(values)) if values.size else math.nan


def _ratio(numerator: float, denominator: float) -> float:
    if denominator > 0:
        return numerator / denominator
    if denominator == 0 and numerator > 0:
        return math.inf
    return math.nan


def _checked_sample(values: Sequence[float], side: str) -> FloatArray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{side}: expected a flat sequence of numbers, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{side}: NaN or infinite values")
    if np.any(array < 0):
        raise ValueError(f"{side}: negative values; ratios need a non-negative metric")
    return array


def _check_options(direction: str, alpha: float, margin: float, resamples: int) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if not (math.isfinite(margin) and 0.0 < margin < 1.0):
        raise ValueError(f"margin must be a fraction in (0, 1), got {margin!r}")
    if resamples < MIN_RESAMPLES:
        raise ValueError(f"resamples must be >= {MIN_RESAMPLES}, got {resamples!r}")


def _json_safe(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def median_interval(values: Sequence[float], *, resamples: int = 2000, seed: int = 0
                    ) -> tuple[float, float, float] | None:
    """(median, low, high): the median of one sample with its percentile bootstrap interval
    at `CI_LEVEL`, resampled `resamples` times from `numpy.random.default_rng(seed)` (a fixed
    seed: the same values give the same interval on every page). None for fewer than
    `MIN_SAMPLES` values, where an interval would claim what three numbers cannot show.
    Raises ValueError for NaN or infinite values."""
    array = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError("NaN or infinite values")
    if array.size < MIN_SAMPLES:
        return None
    rng = np.random.default_rng(seed)
    medians = np.median(array[rng.integers(0, array.size, (resamples, array.size))], axis=1)
    low, high = _interval(medians, CI_LEVEL)
    return _median(array), low, high


_CALLGRIND_EVENTS = re.compile(r"^events:(.*)$", re.MULTILINE)
_CALLGRIND_COST = re.compile(r"^(summary|totals):(.*)$", re.MULTILINE)


def parse_callgrind_total(text: str) -> int:
    """Instructions executed (event `Ir`) in a callgrind.out file.

    Reads the `summary:` line, as callgrind_annotate does, or `totals:` when there is no
    summary; the column is Ir's position on the `events:` line (a cost line may omit trailing
    zero columns). Raises ValueError when the file has no `events:` line listing Ir, no
    summary or totals, several parts (a combined dump: parse each dump's file instead), or a
    cost that is not a non-negative decimal integer.
    """
    events_lines = _CALLGRIND_EVENTS.findall(text)
    if len(events_lines) != 1:
        found = len(events_lines)
        raise ValueError(f"expected one 'events:' line in callgrind output, found {found}")
    events = events_lines[0].split()
    if "Ir" not in events:
        raise ValueError(f"callgrind output does not count Ir (events: {' '.join(events)})")
    costs: dict[str, list[str]] = {}
    for kind, rest in _CALLGRIND_COST.findall(text):
        costs.setdefault(kind, []).append(rest)
    lines = costs.get("summary") or costs.get("totals")
    if not lines:
        raise ValueError("callgrind output has no 'summary:' or 'totals:' line")
    if len(lines) > 1:
        raise ValueError("callgrind output holds several parts; parse one dump at a time")
    columns = lines[0].split()
    index = events.index("Ir")
    if not columns or not all(c.isascii() and c.isdigit() for c in columns):
        raise ValueError(f"malformed callgrind cost line: {lines[0].strip()!r}")
    return int(columns[index]) if index < len(columns) else 0


def parse_perf_stat_instructions(text: str) -> int:
    """Instructions counted by `perf stat -x, -e instructions` (its CSV output).

    A CSV line is value,unit,event,...; every line whose event is `instructions` (with
    modifiers such as `instructions:u`, or a PMU prefix such as `cpu_core/instructions/` —
    hybrid CPUs print one line per core type) is summed. `<not counted>` adds 0 (the process
    never ran on that core type) as long as one line counted; other lines (comments, other
    events, the program's own output) are ignored. Raises ValueError for `<not supported>`, no
    counted instructions line, or a value that is not a non-negative integer.
    """
    total, counted = 0, False
    for line in text.splitlines():
        parts = line.strip().split(",")
        if line.lstrip().startswith("#") or len(parts) < 3 or not _is_instructions(parts[2]):
            continue
        value = parts[0].strip()
        if value == "<not counted>":
            continue
        if value == "<not supported>":
            raise ValueError(f"perf cannot count instructions on this machine: {line.strip()!r}")
        if not (value.isascii() and value.isdigit()):
            raise ValueError(f"malformed perf stat value: {line.strip()!r}")
        total, counted = total + int(value), True
    if not counted:
        raise ValueError("no counted 'instructions' line in perf stat output")
    return total


def _is_instructions(event: str) -> bool:
    name = event.strip()
    if "/" in name:  # pmu/event/modifiers
        name = name.split("/")[1]
    return name.split(":")[0] == "instructions"
