"""The spread and the lean of softmax weights over T keys whose scores are independent N(μ, s²):

    κ(s², T) = T² E[a_1²] − 1 = T E[Σ_j a_j²] − 1,   a = softmax(z),  z_j ~ N(μ, s²) i.i.d.
    ℓ(s², T) = E[Σ_j a_j (z_j − z̄)] / (s² (1 − 1/T))

κ is 0 when the scores are equal, T − 1 when one key takes all the weight. For T → ∞ the denominator
concentrates and κ → e^{s²} − 1, the log-normal limit; at finite T the denominator grows with the largest
term and κ is smaller: at s² = 3, 5.84 for T = 49 and 9.88 for T = 196, against e³ − 1 = 19.1.
ℓ is how far the weights lean towards the keys of high score, over its first order (a_j ≈ (1 + z_j − z̄)/T
gives s² (1 − 1/T)): 1 for small spreads, 1 as T → ∞ (the tilted normal's mean is s²), and at finite T
bounded by the largest score's excess, about s √(2 log T): at s² = 20, 0.48 for T = 49. Both exact
through 1/X = ∫_0^∞ e^{−tX} dt, 1/X² = ∫_0^∞ t e^{−tX} dt and the keys' independence:

    E[a_1²]    = ∫_0^∞ t E[e^{2z} e^{−t e^z}] E[e^{−t e^z}]^{T−1} dt
    E[a_1 z_1] = ∫_0^∞ E[z e^z e^{−t e^z}] E[e^{−t e^z}]^{T−1} dt     (μ = 0: E[Σ_j a_j z_j] = T E[a_1 z_1])

each expectation a trapezoid sum over a lattice of z (401 points over ±10 s), the t integral one over
log t (step 1/4; the integrand is smooth in both, so both sums converge geometrically). Tabulated once
per T on a lattice of log s² (step 1/20, from 10⁻³ to 54), the logs interpolated linearly (log κ −
log s² goes from log(1 − 1/T) to −log s² + log(T − 1) and bends little on the way); past the lattice
s² is taken as its end; below 10⁻³, κ = (e^{s²} − 1)(1 − 1/T) and ℓ = 1, the first order.
"""

from __future__ import annotations

import functools
import math

import torch

from gatepool.analysis.probe.correlated.field import _DT

_FIRST, _STEP, _N = 1e-3, 0.05, 219  # the table's lattice of log s²: log _FIRST + _STEP · (0 … _N − 1)
_LOW = math.log(_FIRST)
_TOP = math.exp(_LOW + _STEP * (_N - 1))  # its last s², about 54


def _exact(s2: float, T: int) -> tuple[float, float]:
    """κ(s², T) and ℓ(s², T) by the integrals above, for one spread and one number of keys."""
    s = math.sqrt(s2)
    x = torch.linspace(-10, 10, 401, dtype=_DT)
    w = torch.exp(-(x**2) / 2)
    w = w / w.sum()  # (401,) the standard normal's lattice weights
    lim, dtau = 10 * s + 15, 0.25
    tau = torch.arange(-lim, lim + dtau, dtau, dtype=_DT)[:, None]  # (n, 1): log t
    u = tau + s * x  # (n, 401): log(t e^z)
    decay = torch.exp(-torch.exp(u))
    L = decay @ w  # E[e^{−t e^z}]
    rest = L.clamp_min(1e-300).log().mul(T - 1).exp()  # L^{T−1}
    square = float(((torch.exp(2 * u) * decay) @ w * rest).sum()) * dtau  # E[a_1²]: t² E[e^{2z} …] L^{T−1}
    lean = float(((torch.exp(u) * decay) @ (w * s * x) * rest).sum()) * dtau  # E[a_1 z_1]: t E[z e^z …] …
    return T * T * square - 1, T * lean / (s2 * (1 - 1 / T))


@functools.lru_cache(maxsize=64)
def _log_tables(T: int) -> torch.Tensor:
    """(2, _N): log κ and log ℓ on the lattice of log s², for T keys."""
    grid = _LOW + _STEP * torch.arange(_N, dtype=_DT)
    return torch.tensor([_exact(float(v), T) for v in grid.exp()], dtype=_DT).T.log()


def _tabled(s2: torch.Tensor, T, row: int, first) -> torch.Tensor:
    """Row ``row`` of the tables at ``s2`` (elementwise, T an int or a tensor that broadcasts), ``first(s²,
    T)`` below the lattice; 0 where T < 2."""
    s2, T = torch.broadcast_tensors(s2.clamp(0, _TOP), torch.as_tensor(T).round().long())
    out = torch.zeros_like(s2)
    for t in T.unique().tolist():
        if t < 2:
            continue
        at = T == t
        v, r = s2[at], _log_tables(t)[row].to(s2.dtype)
        k = first(v, t)
        big = v > _FIRST
        pos = ((v[big].log() - _LOW) / _STEP).clamp(0, _N - 1)
        lo = pos.floor().long().clamp(max=_N - 2)
        k[big] = torch.lerp(r[lo], r[lo + 1], pos - lo).exp()
        out[at] = k
    return out


def kappa(s2: torch.Tensor, T) -> torch.Tensor:
    """κ(s², T) elementwise: ``s2`` the scores' spread, ``T`` the number of keys (an int or a tensor that
    broadcasts with ``s2``); 0 where T < 2."""
    return _tabled(s2, T, 0, lambda v, t: torch.expm1(v) * (1 - 1 / t))


def lean(s2: torch.Tensor, T) -> torch.Tensor:
    """ℓ(s², T) elementwise, as :func:`kappa` takes its arguments: the weights' lean towards the keys of
    high score over its first order; 0 where T < 2."""
    return _tabled(s2, T, 1, lambda v, t: torch.ones_like(v))
