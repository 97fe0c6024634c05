"""A residual add z = s + b whose branch b is a function of the stream s channel by channel (XCiT's local
patch interaction: a depthwise conv, a GELU, BatchNorm, a depthwise conv, a layer scale): per channel the
two terms are not independent.

gain      the branch's linear part, per channel a matrix over the positions, b_c ≈ G_c s_c + (a part
          uncorrelated with s): the product of its steps' own, a depthwise conv its taps (its output at
          each position of one-hot inputs), a slice of the tokens its rows, an activation E[f'(x_p)] at
          each position (Price: Cov(s, f(x)) = E[f'(x)] Cov(s, x) for jointly normal s and x), a norm
          γ/σ (BatchNorm's per channel, LayerNorm's (1 − 1/C) γ/σ_p, its centring), a layer scale its
          factor, positions into tokens and back the identity (row-major);
          a cat of tokens (CaiT's and XCiT's class attention blocks: x + cat(attn(x̂), x̂[:, 1:])) the
          rows of the one piece that leads back to s, the others (the class token's attention, its MLP)
          taken as independent of it
forward   Cov(z_p, z_q) = Cov(s_p, s_q) + Cov(b_p, b_q) + X(p, q) + X(q, p), X = C_s G_cᵀ (C_s the stream's
          covariance over the positions per channel): zero in expectation over the conv's random taps,
          but of either sign per channel (± 0.5 of the correlation at XCiT's init), which spreads the
          channels' variances that a BatchNorm after them divides by one by one
backward  at s the two gradients g (through the add) and G_cᵀ g (through the branch): the add's carries
          Y + Yᵀ, Y = C_g G_c, apart (``Field.cross``) and their sum at s adds it, so that s's
          covariance is (I + G_c)ᵀ C_g (I + G_c) plus the branch's own remainder; on g alone it would be
          negative where the two cancel (a depthwise conv whose taps sum below −½: a third of Twins'
          position conv's channels at timm's init, std √(2/9)) and clamped there
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.dropout import Dropout
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums
from gatepool.analysis.probe.correlated.layernorm import LayerNorm
from gatepool.analysis.probe.correlated.norms import BatchNorm, GroupNorm
from gatepool.analysis.probe.correlated.pointwise import Pointwise
from gatepool.analysis.probe.correlated.positions import covariance, lag_index
from gatepool.analysis.probe.correlated.resample import PositionMap
from gatepool.analysis.probe.correlated.scale import Scale
from gatepool.analysis.probe.correlated.shift import Shift
from gatepool.analysis.probe.correlated.steps import Identity
from gatepool.analysis.probe.correlated.stochastic_depth import StochasticDepth
from gatepool.analysis.probe.correlated.tokens import (
    FlattenPositions,
    SelectToken,
    TokenSlice,
    UnflattenPositions,
)

_MAX = 2**24  # C·P² of the largest gain kept (128 MB); a larger map's branch is taken as independent
_SAME = (Identity, Shift, Dropout, StochasticDepth, FlattenPositions, UnflattenPositions)


def step_gain(step, x: Field, out: Field) -> torch.Tensor | None:
    """(C, P_out, P_in): ``step``'s linear gain per channel from its input field ``x`` to its output
    ``out`` (positions flattened row-major); None where an output channel reads other channels, or for a
    step of unknown gain."""
    C, P = x.shape[0], x.mean[0].numel()
    Po = out.mean[0].numel()
    if out.shape[0] != C or C * P * max(P, Po) > _MAX:
        return None
    diag = None
    if isinstance(step, _SAME) and Po == P:
        diag = torch.ones((C, P), dtype=_DT)
    elif isinstance(step, Scale):
        diag = step._map(x.shape).reshape(C, P)
    elif isinstance(step, Pointwise):
        diag = step.h["df"][0].reshape(C, P)
    elif isinstance(step, LayerNorm) and not getattr(step, "channels_first", False):
        gam = torch.ones(C, dtype=_DT) if step.gamma is None else step.gamma
        diag = ((1 - 1 / C) * gam[:, None, None] / step.sigma2.sqrt()).expand(x.shape).reshape(C, P)
    elif isinstance(step, (BatchNorm, GroupNorm)):
        norm = step.norm if isinstance(step, BatchNorm) else step
        if norm is None:
            diag = step.a.expand(x.shape).reshape(C, P)
        elif norm.G == C:
            gam = torch.ones(C, dtype=_DT) if norm.gamma is None else norm.gamma
            diag = (gam / norm.sigma2.sqrt())[:, None].expand(C, P)
    elif isinstance(step, PositionMap):  # a slice of the tokens, a resize
        return step.M.expand(C, *step.M.shape) if step.M.shape == (Po, P) else None
    elif isinstance(step, TokenSlice):  # rows start … stop − 1 of the identity
        rows = torch.eye(P, dtype=_DT)[step.start : step.stop]
        return rows.expand(C, Po, P) if len(rows) == Po else None
    elif isinstance(step, SelectToken):
        row = torch.zeros((C, 1, P), dtype=_DT)
        row[:, 0, step.index % P] = 1.0
        return row
    elif isinstance(step, Conv) and step.Wd is not None and bool((step.src == torch.arange(C)).all()):
        H, W = x.shape[1:]
        eye = torch.eye(P, dtype=_DT).reshape(P, 1, H, W).expand(P, C, H, W)
        resp = F.conv2d(eye, step.weight, None, step.stride, step.padding, 1, step.groups)  # (P, C, Ho, Wo)
        return resp.flatten(2).permute(1, 2, 0) if resp[0, 0].numel() == Po else None
    return None if diag is None or Po != P else torch.diag_embed(diag)


def _signed(S: torch.Tensor, H: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(v, T): the diagonal (C, H, W) and the lag sums (C, 2H − 1, 2W − 1) of a symmetric (C, P, P)."""
    C = S.shape[0]
    T = torch.zeros((C, (2 * H - 1) * (2 * W - 1)), dtype=_DT).index_add(
        1, lag_index(H, W).flatten(), S.reshape(C, -1)
    )
    return torch.diagonal(S, dim1=1, dim2=2).reshape(C, H, W), T.reshape(C, 2 * H - 1, 2 * W - 1)


def add_cross(z: Field, s: Field, G: torch.Tensor) -> Field:
    """z = s + b (their covariances already added) with the cross term X + Xᵀ, X = C_s Gᵀ, of b's linear
    gain G on s."""
    X = covariance(s) @ G.transpose(1, 2)
    v, T = _signed(X + X.transpose(1, 2), *z.shape[1:])
    out = _field_from_sums(z.mean, z.var + v, z.lag_sums() + T)
    return Field(out.mean, out.var, out.corr, chan=z.chan, chan_dc=z.chan_dc)


def grad_cross(g: Field, G: torch.Tensor) -> Field:
    """The add's gradient g at the stream s, carrying (``Field.cross``) its cross term Y + Yᵀ, Y = C_g G,
    with the branch's gradient Gᵀ g there: the sum of the two then holds it (:func:`add.add_grads`);
    added to g alone it would be negative where the two cancel (Σ_t w_t < −½ of a depthwise conv)."""
    Y = covariance(g) @ G
    return dataclasses.replace(g, cross=_signed(Y + Y.transpose(1, 2), *g.shape[1:]))
