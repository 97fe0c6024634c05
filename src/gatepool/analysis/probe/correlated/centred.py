"""A gradient's mean over the batch, where a BatchNorm's backward has taken it out.

BatchNorm in training removes from its input's gradient the mean over the batch and the positions,
m_c = (1/(S n)) Σ_s Σ_p g_{s,p}: its rule takes E[m_c²] = E[Ḡ_c²]/S with Ḡ_c = (1/n) Σ_p g_p the
per-sample spatial mean, E[Ḡ²] = Σ_e T(e)/n², the samples' gradients independent. Below the first
BatchNorm of a backward pass they are not: its output's m_c is 0 exactly (the samples' Ḡ sum to zero),
and the steps below keep most of that. Taking E[m²] = E[Ḡ²]/S again at each BatchNorm removes a mean that
is not there: timm's EfficientNet-B0, whose gradient is constant over the positions from its global pool
(E[Ḡ²] ≈ E[g²]), lost up to 1/S of it at each of its 49 norms, and its input's E[g²] came out 0.80 of the
measured (0.91 carried; 32 images 64 × 64, seed 0).

``Field.centred`` (C,) carries the part of E[Ḡ²] whose batch mean cancels, C = Σ_e T(e)/n² after a
BatchNorm's backward, so E[m²] = (E[Ḡ²] − C)/S. Through a step, with Ḡ's parts independent:

    conv ᵀ      Ḡ_in,i ≈ (n_out/n_in) Σ_o a_oi Ḡ_out,o, a_oi = Σ_u W[o, i, u] (the border's taps aside):
                C_in,i = (n_out/n_in)² Σ_o a_oi² C_out,o
    g · f'(x)   an activation's (or a gate's) factor, E[f'] = μ_c per channel and f' independent of g
                over the samples: Σ_s μ_s Ḡ_s = μ Σ_s Ḡ_s + Σ_s (μ_s − μ) Ḡ_s, the first cancelling:
                C_out = μ² C_in
    a + b       C_a + C_b (the two independent)

Any other step leaves None (no part cancels: the seed, a pool's backward, a gate's ∂L/∂s).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import Field


def spatial_mean2(f: Field) -> torch.Tensor:
    """E[Ḡ_c²] = Σ_e T_c(e) / n² (C,): the per-sample spatial mean's second moment."""
    H, W = f.shape[1:]
    return f.lag_sums().sum((1, 2)) / (H * W) ** 2


def cancelled(f: Field) -> torch.Tensor:
    """The part of :func:`spatial_mean2` whose batch mean is zero (C,): ``f.centred``, 0 where None,
    at most the whole."""
    if f.centred is None:
        return torch.zeros(f.shape[0], dtype=f.var.dtype)
    return torch.minimum(f.centred, spatial_mean2(f))


def through_factor(g: Field, mu: torch.Tensor) -> torch.Tensor | None:
    """C of g · f' for f' of channel mean ``mu`` (C,) or a map (C, H, W) (its mean over the positions)."""
    if g.centred is None:
        return None
    m = mu.flatten(1).mean(1) if mu.dim() > 1 else mu
    return cancelled(g) * m * m


def through_conv(g: Field, weight: torch.Tensor, groups: int, n_in: int) -> torch.Tensor | None:
    """C at a conv's input from C at its output ``g``: the weight in the grouped form (Co, Ci/groups, kh,
    kw), ``n_in`` the input's positions."""
    if g.centred is None:
        return None
    Co, ci_g = weight.shape[:2]
    a2 = weight.sum((2, 3)) ** 2  # (Co, Ci/groups)
    c = (a2 * cancelled(g)[:, None]).reshape(groups, Co // groups, ci_g).sum(1).flatten()  # (Ci,)
    return c * (g.shape[1] * g.shape[2] / n_in) ** 2


def added(a: Field, b: Field) -> torch.Tensor | None:
    """C of the sum of two independent gradients."""
    if a.centred is None and b.centred is None:
        return None
    return cancelled(a) + cancelled(b)
