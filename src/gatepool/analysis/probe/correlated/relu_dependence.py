"""The gradient's dependence on the value (``Field.dependence``) through a ReLU, in closed form.

As for the other activations (:mod:`pointwise`), a depthwise conv after a ReLU makes the gradient at its
output depend on its own value y = ReLU(x): one input moves the few outputs it reaches, and with them the
gates of the activation after them. In y's standardized units η = (y − m_y)/s_y,
E[g² | y] = E[g²] (1 + β₁ η + β₂ (η² − 1)) = E[g²] (a₀ + a₁ y + a₂ y²)
(:func:`pointwise.dependence_weights`), so through the gate 1[x > 0]

    E[1[x > 0] g²] = E[g²] (a₀ P(x > 0) + a₁ E[ReLU x] + a₂ E[(ReLU x)²])

where the plain rule has E[g²] P(x > 0). With x = m + s z, a = m/s, the moments of the normal truncated
to z > −a, M_j = E[z^j 1[z > −a]] (M₀ = Φ(a), M₁ = φ(a), M_j = (j − 1) M_{j−2} + (−a)^{j−1} φ(a)),
give the gradient's own dependence at x in closed form: K(z) = 1[z > −a] (k₀ + k₁ z + k₂ z²), k the
a's in z, β₁' = E[K He₁]/E[K], β₂' = E[K He₂]/(2 E[K]), and the gate's alone r₁ = M₁/M₀,
r₂ = (M₂ − M₀)/(2 M₀) (what a depthwise conv before this ReLU reads, :mod:`conv`).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.pointwise import dependence_weights
from gatepool.analysis.probe.correlated.relu_shape import gated, standardized, truncated


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    ok = den.abs() > 1e-300
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), 0.0)


def relu_dependence(mean: torch.Tensor, var: torch.Tensor, dependence: tuple | None,
                    skew: torch.Tensor | None = None, kurt: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, tuple]:  # fmt: skip
    """For x ~ N(mean, var) per position and the output gradient's ``dependence`` (β₁, β₂, …: None, g
    independent of y): E[1[x > 0] (a₀ + a₁ x + a₂ x²)], the factor of E[g²] at the input (P(x > 0)
    without a dependence), and the input gradient's (β₁, β₂, r₁, r₂) (see the module docstring)."""
    s, t = standardized(mean, var)
    M = truncated(t, 6)
    if dependence is None:
        a0, a1, a2 = torch.ones_like(mean), torch.zeros_like(mean), torch.zeros_like(mean)
    else:  # y = ReLU(x): E[y] = E[1[z > −a] (m + s z)], E[y²] = E[1[z > −a] (m + s z)²]
        mean_y = gated([mean, s], M, skew, kurt)
        e2_y = gated([mean * mean, 2 * mean * s, var.clamp_min(0)], M, skew, kurt)
        a0, a1, a2 = dependence_weights(dependence, mean_y, e2_y)
    k0, k1, k2 = a0 + a1 * mean + a2 * mean * mean, (a1 + 2 * a2 * mean) * s, a2 * s * s
    ek = gated([k0, k1, k2], M, skew, kurt)  # under x's Gram–Charlier density where it is skewed
    en = gated([k0, k1, k2], M, None, None)  # the dependence's own shape: the normal's (as the pointwise's)
    ek1 = k0 * M[1] + k1 * M[2] + k2 * M[3]  # E[K He₁]
    ek2 = k0 * (M[2] - M[0]) + k1 * (M[3] - M[1]) + k2 * (M[4] - M[2])  # E[K He₂]
    dep = (_ratio(ek1, en), _ratio(ek2, 2 * en), _ratio(M[1], M[0]), _ratio(M[2] - M[0], 2 * M[0]))
    return ek, dep
