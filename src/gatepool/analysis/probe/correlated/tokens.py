"""Positions as tokens (the ViT path): a map's positions flattened into one sequence, tokens of fixed
values (a class token) set beside it, one token taken out.

flatten   (C, H, W) → (C, 1, H·W) in row-major order: the means and variances as they are; the pair
          (p, q) at map lag (d_h, d_w) is at sequence lag k = d_h W + d_w, so exactly
          T₁(k) = Σ_{d_h W + d_w = k} T(d_h, d_w)
          back: ρ(d_h, d_w) = ρ₁(d_h W + d_w) (the gradient's stationary correlation along the sequence);
          the channels' correlations (``Field.chan``, ``chan_dc``: over all the positions) kept, both ways
unflatten (C, 1, H·W) → (C, H, W) (``x.transpose(1, 2).reshape(N, C, H, W)``: PiT's patches back into a
          map): the means and variances as they are, ρ(d_h, d_w) = ρ₁(d_h W + d_w), the sequence's
          correlation at the lag that pair has in it (exact for a sequence stationary along it, where
          the attention leaves it); back: flatten's forward, the sequence's lag sums exact from the map's
cat       fields and constants (C, 1, n) along the tokens: means and variances set side by side (a
          constant: its value, variance 0); the lag sums add (the pieces independent); back: each field
          its tokens' variances and ρ(e) = T(e) / Σ_p √(v'_p v'_{p+e}) of the gradient's lag sums, v' its
          variance with a lone token's (a piece of one: a class token) capped at the longer pieces'
          mean: a class token carries the head's gradient, its own (hundreds of times a patch's,
          uncorrelated with them), which the envelope √(v_p v_q) would give its pairs with the patches
          out of the covariance they share
select    token i of a (C, 1, T) field: (C, 1, 1); back: the gradient at token i, zero elsewhere
slice     tokens a … b − 1 (``x[:, a:b]``): the means and variances cut out, ρ at the shorter sequence's
          lags (exact: Cov(p, q) = √(v_p v_q) ρ(q − p) at the kept pairs); back: the gradient padded with
          zeros (:class:`pad.Pad`); no (T, T) covariance (CoaT's 3,137 tokens of 64 channels: 5 GB)
on a map  a step of a (C, H, W) map on (C, 1, H·W) tokens: unflatten, the step, flatten (a module called
          with its tokens and their map's size: PVT's and Twins' attentions)
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.pad import Pad


def _seq_lag(H: int, W: int) -> torch.Tensor:
    """(2H−1, 2W−1): the sequence lag d_h W + d_w of each map lag, offset to index 0 … 2HW−2."""
    dh = torch.arange(-(H - 1), H)[:, None]
    dw = torch.arange(-(W - 1), W)[None, :]
    return dh * W + dw + H * W - 1


def _to_sequence(x: Field) -> Field:
    """A (C, H, W) map as its (C, 1, H·W) row-major sequence: the lag sums of the map's lags that land on
    each sequence lag, added."""
    C, H, W = x.shape
    T = torch.zeros((C, 2 * H * W - 1), dtype=_DT)
    T.index_add_(1, _seq_lag(H, W).flatten(), x.lag_sums().flatten(1))
    out = _field_from_sums(x.mean.reshape(C, 1, -1), x.var.reshape(C, 1, -1), T[:, None])
    out.chan, out.chan_dc = x.chan, x.chan_dc  # over all the positions either way
    return out


def _to_map(x: Field, H: int, W: int, mean: torch.Tensor) -> Field:
    """A (C, 1, H·W) sequence as the (C, H, W) map with ``mean``: ρ(d_h, d_w) = ρ₁(d_h W + d_w)."""
    C = x.shape[0]
    var = x.var.reshape(C, H, W)
    corr = x.corr[:, 0][:, _seq_lag(H, W)]
    s = var.clamp_min(0).sqrt()
    out = _field_from_sums(mean, var, corr * xcorr(s, s))
    out.chan, out.chan_dc = x.chan, x.chan_dc
    return out


class FlattenPositions:
    """``x.flatten(2)`` / ``x.reshape(N, C, H·W)`` of a (C, H, W) field: a (C, 1, H·W) sequence."""

    def forward(self, x: Field) -> Field:
        self.hw = x.shape[1:]
        return _to_sequence(x)

    def backward(self, g: Field) -> Field:
        H, W = self.hw
        return _to_map(g, H, W, torch.zeros((g.shape[0], H, W), dtype=g.var.dtype))


class UnflattenPositions:
    """``x.transpose(1, 2).reshape(N, C, H, W)`` of a (C, 1, H·W) sequence: a (C, H, W) map, row-major."""

    def __init__(self, H: int, W: int) -> None:
        self.hw = (H, W)

    def forward(self, x: Field) -> Field:
        C, one, T = x.shape
        H, W = self.hw
        if one != 1 or T != H * W:
            raise ValueError(f"x must be a (C, 1, {H * W}) sequence, got {x.shape}")
        return _to_map(x, H, W, x.mean.reshape(C, H, W))

    def backward(self, g: Field) -> Field:
        return _to_sequence(g)


class OnMap:
    """``step``, a step of a (C, H, W) map, on a (C, 1, H·W) sequence of its tokens; (H, W) given by the
    module's call (:meth:`bind`: ``attn(x, (H, W))``), the output's tokens as many as ``step``'s map has
    positions."""

    def __init__(self, step) -> None:
        self.step, self.hw = step, None

    def bind(self, size) -> None:
        self.hw = tuple(int(v) for v in size)

    def forward(self, x: Field) -> Field:
        if self.hw is None:
            raise NotImplementedError("a step on the tokens' map: its size not given")
        self.unflatten, self.flatten = UnflattenPositions(*self.hw), FlattenPositions()
        return self.flatten.forward(self.step.forward(self.unflatten.forward(x)))

    def backward(self, g: Field) -> Field:
        return self.unflatten.backward(self.step.backward(self.flatten.backward(g)))


class TokenCat:
    """``torch.cat`` along the tokens of (C, 1, n) pieces, each a :class:`Field` or a constant tensor."""

    def forward(self, pieces: list) -> Field:
        if not pieces or not any(isinstance(p, Field) for p in pieces):
            raise ValueError("pieces must hold at least one field")
        parts = []
        for p in pieces:
            if isinstance(p, Field):
                parts.append((p.mean, p.var, p.lag_sums()))
            else:
                c = torch.as_tensor(p).detach().to("cpu", _DT)
                parts.append((c, torch.zeros_like(c), None))
        shapes = {m.shape[:2] for m, _, _ in parts}
        if len(shapes) != 1 or next(iter(shapes))[1] != 1:
            raise ValueError(
                f"pieces must be (C, 1, n) of one C, got {[tuple(m.shape) for m, _, _ in parts]}"
            )
        self.sizes = [m.shape[-1] for m, _, _ in parts]
        self.fields = [isinstance(p, Field) for p in pieces]
        n = sum(self.sizes)
        T = torch.zeros((parts[0][0].shape[0], 1, 2 * n - 1), dtype=_DT)
        for (_, _, t), k in zip(parts, self.sizes):
            if t is not None:
                T[..., n - k : n + k - 1] += t
        mean, var = (torch.cat([part[i] for part in parts], -1) for i in (0, 1))
        return _field_from_sums(mean, var, T)

    def backward(self, g: Field) -> list[Field]:
        """One gradient field per field piece, in order: its tokens' variances, and the correlation of the
        sequence's lag sums T(e) over pairs weighted √(v'_p v'_q), v' the variance with a lone token's (a
        piece of one: a class token) capped at the longer pieces' mean (its gradient beyond a patch's is
        the head's, its own)."""
        n, out, start = sum(self.sizes), [], 0
        vp = g.var.clone()
        lone = torch.zeros(n, dtype=torch.bool)
        for k in self.sizes:
            lone[start : start + k] = k == 1
            start += k
        if bool(lone.any()) and not bool(lone.all()):
            cap = g.var[..., ~lone].mean(-1, keepdim=True)  # (C, 1, 1)
            vp[..., lone] = torch.minimum(g.var[..., lone], cap)
        s = vp.clamp_min(0).sqrt()
        corr = (g.lag_sums() / xcorr(s, s).clamp_min(1e-300)).clamp(-1, 1)
        corr[..., n - 1] = 1.0
        start = 0
        for k, is_field in zip(self.sizes, self.fields):
            if is_field:
                out.append(
                    Field(
                        g.mean[..., start : start + k],
                        g.var[..., start : start + k],
                        corr[..., n - k : n + k - 1],
                    )
                )
            start += k
        return out


class TokenSlice:
    """``x[:, start:stop]`` of a (C, 1, T) field (0 ≤ start < stop ≤ T)."""

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop

    def forward(self, x: Field) -> Field:
        C, H, T = x.shape
        if H != 1 or not 0 <= self.start < self.stop <= T:
            raise ValueError(f"tokens {self.start}:{self.stop} of a field of {T}")
        n = self.stop - self.start
        self.pad = Pad(self.start, T - self.stop, 0, 0)
        keep = slice(self.start, self.stop)
        return Field(x.mean[..., keep], x.var[..., keep], x.corr[..., T - n : T + n - 1])

    def backward(self, g: Field) -> Field:
        return self.pad.forward(g)


class SelectToken:
    """``x[:, i]`` of a (C, 1, T) field (a class token)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def forward(self, x: Field) -> Field:
        C, H, T = x.shape
        if H != 1 or not -T <= self.index < T:
            raise ValueError(f"index must select one of the field's {T} tokens, got {self.index}")
        self.T, i = T, self.index % T
        return Field(x.mean[..., i : i + 1], x.var[..., i : i + 1], torch.ones((C, 1, 1), dtype=_DT))

    def backward(self, g: Field) -> Field:
        C, i = g.shape[0], self.index % self.T
        var = torch.zeros((C, 1, self.T), dtype=_DT)
        var[..., i] = g.var[..., 0]
        corr = torch.zeros((C, 1, 2 * self.T - 1), dtype=_DT)
        corr[..., self.T - 1] = 1.0
        return Field(torch.zeros_like(var), var, corr)
