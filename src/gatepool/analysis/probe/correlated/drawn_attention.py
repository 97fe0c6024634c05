"""An attention's moments over draws of its queries, keys and values from the state, for attentions that
no expansion holds: few positions, weights that are a ratio of random sums.

draws     per group of channels (a head's q, k, v of widths (d_q, d_k, d_v) before any activation
          the attention applies, or the head's input that its own affine maps make them of)
          ``DRAWS`` draws of fixed seeds, ``CHUNK`` at a time, each chunk half antithetic (−z beside
          z): each channel its mean map and its positions' covariance √(v_p v_q) ρ(q − p)
          (:func:`positions.covariance`), the channels independent (the state's)
forward   o = attend(q, k, v) (or attend(u)) per draw (the attention as its module computes it, on
          (n, T, d) tensors); the output's state the draws' mean and covariance over the positions
          (:func:`positions.from_covariance`): exact on the state's law up to the draws' error, about
          √(2/DRAWS) ≈ 1.6% on a position's second moment
backward  the gradient G at o drawn from its state beside them, independent of the values (the walk's
          unit-noise backward); per draw ∂L/∂(q, k, v) (or ∂L/∂u) of L = Σ o·G (autograd through
          ``attend``), their second moments over the positions the gradient's state (mean 0)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gatepool.analysis.probe.correlated.cat import Cat
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.positions import covariance, from_covariance
from gatepool.analysis.probe.correlated.split import ChannelSlice

DRAWS = 8192
CHUNK = 2048  # draws at a time (memory: a window of 128 channels and 49 positions through four heads)


def _normal(n: int, C: int, T: int, seed: int) -> torch.Tensor:
    """(n, C, T) standard normal draws of a fixed seed, the second half the first's negatives."""
    z = torch.randn((n // 2, C, T), generator=torch.Generator().manual_seed(seed), dtype=_DT)
    return torch.cat([z, -z])


def factor(f: Field) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean (C, T), L (C, T, T)) of the field ``f`` (C, H, W): L Lᵀ the positions' covariance (its
    negative eigenvalues, where the stencil is not positive semi-definite, dropped)."""
    lam, vec = torch.linalg.eigh(covariance(f))
    return f.mean.reshape(f.shape[0], -1), vec * lam.clamp_min(0).sqrt()[:, None, :]


def draw(f: tuple[torch.Tensor, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """(n, C, T) draws of a field of :func:`factor` ``f`` from standard normal ``z`` (n, C, T): mean + L z."""
    mean, L = f
    return mean[None] + torch.einsum("ctu,ncu->nct", L, z)


def moments(chunks, hw: tuple[int, int], centred: bool) -> Field:
    """The state of draws (an iterable of (n_i, C, T) chunks of them): their mean and covariance over the
    positions (or, not ``centred``, their second moments about a mean of 0: a gradient's)."""
    n, s1, s2 = 0, 0.0, 0.0
    for t in chunks:
        n, s1, s2 = n + t.shape[0], s1 + t.sum(0), s2 + torch.einsum("nct,ncu->ctu", t, t)
    mean = s1 / n if centred else torch.zeros_like(s1)
    return from_covariance(mean.reshape(mean.shape[0], *hw), s2 / n - mean[:, :, None] * mean[:, None, :])


class DrawnAttention:
    """``attend(*parts)`` ((n, T, d) each, to (n, T, d_out)) of groups of channels, each group a head's
    parts of ``widths`` one after another (q, k, v; or one, its input), on a (groups·Σ widths, H, W)
    map, to the (groups·d_out, H, W) map of the heads' outputs, group after group."""

    def __init__(self, widths: tuple[int, ...], attend: Callable, draws: int = DRAWS, seed: int = 0):
        if min(widths) < 1 or draws < 2 or draws % 2:
            raise ValueError(f"widths must be ≥ 1 and draws even and ≥ 2, got {widths}, {draws}")
        self.widths, self.attend, self.n, self.seed = tuple(widths), attend, draws, seed

    def _chunks(self) -> range:
        return range(0, self.n, CHUNK)

    def _outputs(self, g: int, c: int) -> torch.Tensor:
        """(n, d_out, T) the outputs of group g's draws from draw c on (its channels ``self.leaf``)."""
        w, n = sum(self.widths), min(CHUNK, self.n - c)
        z = _normal(n, w, self.hw[0] * self.hw[1], self.seed + g + 7919 * c)
        self.leaf = draw(self.parts[g], z).requires_grad_(torch.is_grad_enabled())
        return self.attend(*(t.transpose(1, 2) for t in self.leaf.split(self.widths, 1))).transpose(1, 2)

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        w = sum(self.widths)
        if C % w:
            raise ValueError(f"x must have a multiple of {w} channels (parts {self.widths}), got {C}")
        self.hw, self.groups = (H, W), C // w
        self.parts = [factor(ChannelSlice(w * g, w * (g + 1)).forward(x)) for g in range(self.groups)]
        with torch.no_grad():
            outs = [
                moments((self._outputs(g, c) for c in self._chunks()), (H, W), True)
                for g in range(self.groups)
            ]
        self.d_out = outs[0].shape[0]
        return Cat().forward(outs)

    def backward(self, g: Field) -> Field:
        (H, W), d = self.hw, self.d_out
        if g.shape != (self.groups * d, H, W):
            raise ValueError(f"g must be ({self.groups * d}, {H}, {W}), got {tuple(g.shape)}")
        return Cat().forward([moments(self._grads(g, i), (H, W), False) for i in range(self.groups)])

    def _grads(self, g: Field, i: int):
        """Group i's gradients at its draws, chunk by chunk, from G drawn of ``g``'s rows beside them."""
        (H, W), d = self.hw, self.d_out
        gi = factor(ChannelSlice(d * i, d * (i + 1)).forward(g))
        for c in self._chunks():
            z = _normal(min(CHUNK, self.n - c), d, H * W, self.seed + 10**6 + i + 7919 * c)
            G = draw(gi, z)
            with torch.enable_grad():
                o = self._outputs(i, c)
                (gx,) = torch.autograd.grad((o * G).sum(), self.leaf)
            yield gx
