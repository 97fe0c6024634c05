"""Welch's interval against scipy on known cases, and the argument checks."""

import math

import pytest
from scipy import stats

from gatepool.lab.stats import bonferroni, welch_difference

A = [99.1, 98.7, 99.4]
B = [97.9, 98.6, 98.1, 97.5]


@pytest.mark.parametrize("confidence", [0.95, 0.99])
def test_matches_scipy(confidence):
    d = welch_difference(A, B, confidence)
    ref = stats.ttest_ind(A, B, equal_var=False)
    ci = ref.confidence_interval(confidence)
    assert d.diff == pytest.approx(sum(A) / 3 - sum(B) / 4, abs=1e-12)
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high), abs=1e-10)
    assert d.df == pytest.approx(ref.df, rel=1e-12)
    assert d.diff / d.se == pytest.approx(ref.statistic, rel=1e-12)


def test_hand_computed_case():
    # a = (1, 2, 3), b = (2, 4, 6): d = −2, s²_a/3 = 1/3, s²_b/3 = 4/3, se² = 5/3,
    # ν = (5/3)² / ((1/9)/2 + (16/9)/2) = (25/9) / (17/18) = 50/17
    d = welch_difference([1, 2, 3], [2, 4, 6])
    assert d.diff == -2 and d.se == pytest.approx(math.sqrt(5 / 3)) and d.df == pytest.approx(50 / 17)
    half = stats.t.ppf(0.975, 50 / 17) * math.sqrt(5 / 3)
    assert (d.low, d.high) == pytest.approx((-2 - half, -2 + half))
    assert not d.differs  # the interval holds 0


def test_differs_and_zero_spread_is_not_judged():
    d = welch_difference([10.0, 10.1, 9.9], [1.0, 1.1, 0.9])
    assert d.judged and d.differs is True
    for a, b in (([1.0, 1.0], [1.0, 1.0]), ([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])):  # both variances 0
        z = welch_difference(a, b)
        assert not z.judged and z.differs is None and z.se == 0.0
        assert (z.low, z.high, z.df) == (None, None, None)  # no point interval, no infinite ν
        assert z.diff == sum(a) / len(a) - sum(b) / len(b)
        assert not math.isfinite(stats.ttest_ind(a, b, equal_var=False).statistic)  # scipy: t is ±inf/nan
    one = welch_difference([2.0, 2.0, 2.0], [1.0, 1.2, 0.8])  # one variance 0: still an interval
    ref = stats.ttest_ind([2.0, 2.0, 2.0], [1.0, 1.2, 0.8], equal_var=False)
    assert one.judged and (one.low, one.high) == pytest.approx(tuple(ref.confidence_interval(0.95)))
    assert math.isfinite(one.df)


def test_bonferroni():
    assert bonferroni(0.95, 5) == pytest.approx(0.99)
    assert bonferroni(0.95, 1) == 0.95
    with pytest.raises(ValueError, match="comparisons"):
        bonferroni(0.95, 0)


@pytest.mark.parametrize(
    "a, b, conf, match",
    [([1.0], [1.0, 2.0], 0.95, "a must be"), ([1.0, 2.0], [[1.0, 2.0]], 0.95, "b must be"),
     ([1.0, float("nan")], [1.0, 2.0], 0.95, "finite"), ([1.0, 2.0], [1.0, 2.0], 1.0, "confidence")],
)
def test_errors_name_the_argument(a, b, conf, match):
    with pytest.raises(ValueError, match=match):
        welch_difference(a, b, conf)
