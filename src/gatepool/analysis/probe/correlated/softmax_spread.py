"""The spread of softmax weights over T keys whose scores are independent N(μ, s²):

    κ(s², T) = T² E[a_1²] − 1 = T E[Σ_j a_j²] − 1,   a = softmax(z),  z_j ~ N(μ, s²) i.i.d.

0 when the scores are equal, T − 1 when one key takes all the weight. For T → ∞ the denominator
concentrates and κ → e^{s²} − 1, the log-normal limit; at finite T the denominator grows with the largest
term and κ is smaller: at s² = 3, 5.84 for T = 49 and 9.88 for T = 196, against e³ − 1 = 19.1. Exact
through 1/X² = ∫_0^∞ t e^{−tX} dt and the keys' independence:

    E[a_1²] = ∫_0^∞ t E[e^{2z} e^{−t e^z}] E[e^{−t e^z}]^{T−1} dt,

each expectation a trapezoid sum over a lattice of z (401 points over ±10 s), the t integral one over
log t (step 1/4; the integrand is smooth in both, so both sums converge geometrically). Tabulated once
per T on a lattice of log s² (step 1/20, from 10⁻³ to 54), log κ interpolated linearly (log κ −
log s² goes from log(1 − 1/T) to −log s² + log(T − 1) and bends little on the way); past the lattice
s² is taken as its end; below 10⁻³, κ = (e^{s²} − 1)(1 − 1/T), the first order of a_j ≈ (1 + z_j − z̄)/T.
"""

from __future__ import annotations

import functools
import math

import torch

from gatepool.analysis.probe.correlated.field import _DT

_FIRST, _STEP, _N = 1e-3, 0.05, 219  # the table's lattice of log s²: log _FIRST + _STEP · (0 … _N − 1)
_LOW = math.log(_FIRST)
_TOP = math.exp(_LOW + _STEP * (_N - 1))  # its last s², about 54


def _exact(s2: float, T: int) -> float:
    """κ(s², T) by the integral above, for one spread and one number of keys."""
    s = math.sqrt(s2)
    x = torch.linspace(-10, 10, 401, dtype=_DT)
    w = torch.exp(-(x**2) / 2)
    w = w / w.sum()  # (401,) the standard normal's lattice weights
    lim, dtau = 10 * s + 15, 0.25
    tau = torch.arange(-lim, lim + dtau, dtau, dtype=_DT)[:, None]  # (n, 1): log t
    u = tau + s * x  # (n, 401): log(t e^z)
    decay = torch.exp(-torch.exp(u))
    L = decay @ w  # E[e^{−t e^z}]
    f = (torch.exp(2 * u) * decay) @ w * L.clamp_min(1e-300).log().mul(T - 1).exp()  # t² E[…] L^{T−1}
    return T * T * float(f.sum()) * dtau - 1


@functools.lru_cache(maxsize=64)
def _log_kappas(T: int) -> torch.Tensor:
    """log κ on the lattice of log s², for T keys."""
    grid = _LOW + _STEP * torch.arange(_N, dtype=_DT)
    return torch.tensor([_exact(float(v), T) for v in grid.exp()], dtype=_DT).log()


def kappa(s2: torch.Tensor, T) -> torch.Tensor:
    """κ(s², T) elementwise: ``s2`` the scores' spread, ``T`` the number of keys (an int or a tensor that
    broadcasts with ``s2``); 0 where T < 2."""
    s2, T = torch.broadcast_tensors(s2.clamp(0, _TOP), torch.as_tensor(T).round().long())
    out = torch.zeros_like(s2)
    for t in T.unique().tolist():
        if t < 2:
            continue
        at = T == t
        v, r = s2[at], _log_kappas(t).to(s2.dtype)
        k = torch.expm1(v) * (1 - 1 / t)  # below the lattice
        big = v > _FIRST
        pos = ((v[big].log() - _LOW) / _STEP).clamp(0, _N - 1)
        lo = pos.floor().long().clamp(max=_N - 2)
        k[big] = torch.lerp(r[lo], r[lo + 1], pos - lo).exp()
        out[at] = k
    return out
