"""Small statistics for comparing trainings over seeds: Welch's difference of means with its interval.

For samples a (n_a values) and b (n_b values), with sample variances s²_a, s²_b (ddof = 1):

    d   = mean(a) − mean(b)
    se  = sqrt(s²_a/n_a + s²_b/n_b)
    ν   = se⁴ / ( (s²_a/n_a)²/(n_a − 1) + (s²_b/n_b)²/(n_b − 1) )     Welch–Satterthwaite
    CI  = d ± t_{ν, 1 − α/2} · se                                     (t: Student's t quantile)

which is ``scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(1 − α)``. With both
variances 0 (every seed of each sample the same number, e.g. nets collapsed to one class) se is 0 and
the t statistic is undefined: the seeds carry no information on the spread, so the comparison is *not
judged* (``low``, ``high`` and ``df`` are None, ``judged`` is False, ``differs`` is None), never an
interval of width 0 that would call any nonzero difference significant.

``differs`` reads an interval: the two means differ at that confidence when it excludes 0. Comparing
k gates with one reference at family-wise confidence 1 − α takes each interval at 1 − α/k (Bonferroni;
:func:`bonferroni`), so that "some gate differs" is wrong with probability at most α when none does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

from gatepool.utils.checks import check_int, check_number


@dataclass(frozen=True)
class Difference:
    """``mean(a) − mean(b)`` with its Welch interval at ``confidence`` (None where se = 0: not judged)."""

    diff: float
    low: float | None
    high: float | None
    se: float
    df: float | None
    confidence: float
    n_a: int
    n_b: int

    @property
    def judged(self) -> bool:
        """False when both samples have zero variance: no interval, no verdict."""
        return self.low is not None and self.high is not None

    @property
    def differs(self) -> bool | None:
        """True when the interval excludes 0; None when the comparison is not judged."""
        if self.low is None or self.high is None:
            return None
        return self.low > 0 or self.high < 0


def _sample(x: Sequence[float], name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or len(a) < 2:
        raise ValueError(f"{name} must be a 1-d sequence of ≥ 2 values (one per seed), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite numbers, got {a.tolist()}")
    return a


def welch_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Difference:
    """Welch's interval for ``mean(a) − mean(b)`` (see the module docstring)."""
    check_number(confidence, "confidence", 0, 1, low_open=True, high_open=True)
    xa, xb = _sample(a, "a"), _sample(b, "b")
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)  # squared standard errors
    diff = float(xa.mean() - xb.mean())
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Difference(diff, None, None, 0.0, None, float(confidence), len(xa), len(xb))  # not judged
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2, df)) * se
    return Difference(diff, diff - half, diff + half, se, float(df), float(confidence), len(xa), len(xb))


def bonferroni(confidence: float, comparisons: int) -> float:
    """Per-comparison confidence that keeps the family-wise confidence ``confidence`` over ``comparisons``."""
    check_int(comparisons, "comparisons")
    check_number(confidence, "confidence", 0, 1, low_open=True, high_open=True)
    return 1 - (1 - confidence) / comparisons
