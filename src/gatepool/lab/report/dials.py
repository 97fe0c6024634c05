"""The page's interactive figures, in Python: what each dial shows at a setting (the browser tests hold the
page's JavaScript to these numbers).

* τ dial: the lecture's window ``v``; gates ``g = softmax(v/τ)`` and the output ``out = g · v`` (max as
  τ → 0, mean as τ → ∞). The closed form is the soft-gate experiment's ``softmax_theory`` (float64).
* √d dial: ``queries`` queries, each with ``tokens`` fresh keys, entries N(0, 1) of dimension d, drawn in
  the page from a counter-based generator (below) so Python draws the very same numbers:

      u_i = (lowbias32((i + lowbias32(seed)) mod 2³²) + ½) / 2³²          (i = 0, 1, …)
      z_n = √(−2 ln u_{2n}) · cos(2π u_{2n+1})                           (Box–Muller, cosine half)

  query ``a``'s vector is z at [(a·(t+1))·d, …), its key ``m``'s at [(a·(t+1) + 1 + m)·d, …); the dial
  shows std(q·k) (sample std over all a, m: ≈ √d) and the mean largest gate of softmax(q·k) and of
  softmax(q·k/√d).
* padding map: ``padding_variance_map`` of the probe's theory (share of the k² taps that land on the map).
* attention explorer: a query token's row of the saved gates (argmax key, largest gate, top-k share).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gatepool.utils.checks import check_int, check_number

TAU_RANGE = (0.01, 100.0)  # the τ slider's ends (log scale)
SQRT_D_CHOICES = (1, 4, 16, 64, 256)
KERNELS = (1, 3, 5, 7)


def tau_dial(window: list[float], tau: float) -> dict[str, Any]:
    """Gates and output of ``softmax(v/τ) · v`` on ``window``; its limits max and mean."""
    from gatepool.lab.common.soft_window import softmax_theory  # lazy: the page needs no torch

    check_number(tau, "tau", 0, low_open=True)
    v = np.asarray(window, dtype=np.float64)
    gates, out, _ = softmax_theory(v, float(tau))
    return {"gates": gates.tolist(), "out": out, "max": float(v.max()), "mean": float(v.mean())}


def _lowbias32(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer hash (Chris Wellons' lowbias32): uint32 → uint32, a bijection."""
    x = np.asarray(x, dtype=np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def normals(seed: int, count: int) -> np.ndarray:
    """(count,) float64: the page's N(0, 1) draws for ``seed`` (see the module docstring)."""
    key = int(_lowbias32(np.array([seed % 2**32]))[0])
    i = (np.arange(2 * count, dtype=np.uint64) + key) % 2**32  # (2·count,)
    u = (_lowbias32(i.astype(np.uint32)).astype(np.float64) + 0.5) / 2.0**32
    return np.sqrt(-2.0 * np.log(u[0::2])) * np.cos(2.0 * math.pi * u[1::2])


def sqrt_d_dial(d: int, *, seed: int = 0, queries: int = 200, tokens: int = 144) -> dict[str, float]:
    """std(q·k), the mean largest gate unscaled and scaled by 1/√d, on the page's sample."""
    check_int(d, "d")
    check_int(queries, "queries", 2)
    check_int(tokens, "tokens", 2)
    z = normals(seed, queries * (tokens + 1) * d).reshape(queries, tokens + 1, d)  # (Q, 1 + t, d)
    scores = np.einsum("ad,amd->am", z[:, 0], z[:, 1:])  # (Q, t)

    def largest_gate(s: np.ndarray) -> float:  # mean over queries of max softmax = 1 / Σ exp(s − max)
        return float((1.0 / np.exp(s - s.max(1, keepdims=True)).sum(1)).mean())

    return {
        "std": float(scores.std(ddof=1)),
        "max_gate": largest_gate(scores),
        "max_gate_scaled": largest_gate(scores / math.sqrt(d)),
    }


def padding_map(size: int, kernel: int, padding: int) -> list[list[float]]:
    """(H_out, W_out) share of a k×k kernel's taps on a ``size``×``size`` map padded by ``padding``."""
    from gatepool.analysis.probe.theory import padding_variance_map  # lazy: the page needs no torch

    return padding_variance_map(size, size, kernel, padding).tolist()


def explorer_readout(explorer: dict[str, Any], row: int, col: int, k: int = 3) -> dict[str, Any]:
    """What the attention explorer shows for query token (row, col): its largest gate and where, the
    top-``k`` share."""
    gh, gw = explorer["grid"]
    if not (0 <= row < gh and 0 <= col < gw):
        raise ValueError(f"token ({row}, {col}) is off the {gh}×{gw} grid")
    gates = np.asarray(explorer["rows"][row * gw + col], dtype=np.float64)  # (t,)
    top = int(gates.argmax())
    return {"key": list(divmod(top, gw)), "gate": float(gates[top]),
            "share": float(np.sort(gates)[::-1][:k].sum())}
