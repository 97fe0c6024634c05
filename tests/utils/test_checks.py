"""gatepool.utils.checks: the one int / number check every argument goes through."""

import numpy as np
import pytest

from gatepool.utils.checks import check_int, check_number


@pytest.mark.parametrize("value", [1, 7, np.int64(3)])
def test_int_accepts_integers_and_returns_plain_int(value):
    out = check_int(value, "n")
    assert out == value and type(out) is int


@pytest.mark.parametrize("value", [0, -1, True, False, 1.0, "2", None, np.float32(2)])
def test_int_refuses_naming_the_argument_and_range(value):
    with pytest.raises(ValueError, match=r"^stride must be an integer >= 1, got "):
        check_int(value, "stride")


def test_int_bounds_and_optional():
    assert check_int(0, "retries", low=0) == 0
    assert check_int(None, "seed", optional=True) is None
    assert check_int(4, "k", 1, 4) == 4
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 4\], got 5"):
        check_int(5, "k", 1, 4)
    with pytest.raises(ValueError, match=r"integer >= 1 or None"):
        check_int(0, "seed", optional=True)
    assert check_int(-5, "offset", low=None) == -5


@pytest.mark.parametrize("value", [0.5, 1, np.float32(0.25)])
def test_number_accepts_reals(value):
    out = check_number(value, "p", 0, 1)
    assert out == pytest.approx(float(value)) and type(out) is float


@pytest.mark.parametrize("value", [0, 1, float("nan"), float("inf"), True, "0.5", None])
def test_number_open_interval(value):
    with pytest.raises(ValueError, match=r"^confidence must be a finite number in \(0, 1\), got "):
        check_number(value, "confidence", 0, 1, low_open=True, high_open=True)


def test_number_half_bounds_and_optional():
    assert check_number(3.0, "lr", 0, low_open=True) == 3.0
    with pytest.raises(ValueError, match=r"lr must be a finite number > 0, got 0"):
        check_number(0, "lr", 0, low_open=True)
    with pytest.raises(ValueError, match=r"x must be a finite number <= 2, got 3"):
        check_number(3, "x", high=2)
    with pytest.raises(ValueError, match=r"x must be a finite number, got nan"):
        check_number(float("nan"), "x")
    assert check_number(None, "x", optional=True) is None
