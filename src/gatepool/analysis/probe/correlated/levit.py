"""LeViT's Linear-BatchNorm and its two attentions (timm's ``levit``, its token form: ``use_conv=False``).

LinearNorm   y = BN(W x) on (N, T, C) tokens, the BatchNorm1d over the batch and the tokens
             (``bn(x.flatten(0, 1))``): on the (C, 1, T) tokens' field a 1×1 conv, then BatchNorm over B
             samples of T positions each (:class:`norms.BatchNorm`'s rule, the walk's batch). Its gain
             a = γ/σ per channel makes the step one affine map W' = diag(a) W, the attention's
             projection weight (``W``)
Attention    q, k, v = LinearNorm(x) read head by head as (key_dim, key_dim, val_dim) channels
             (``view(B, N, heads, −1).split``), the scores scaled by key_dim^−½ plus a relative position
             bias (zeros at init: nothing added), softmax, the heads' values through Hardswish and a
             LinearNorm: the attention rule (:class:`attention.Attention`) on those projections, its
             out-projection the activation and the LinearNorm
Downsample   AttentionDownsample: keys and values from the T tokens (``kv`` read head by head as
             (key_dim, val_dim)), the queries from the tokens of the map subsampled by the stride
             (``x.view(B, H, W, C)[:, ::s, ::s]``: a fixed selection of the positions, exact on the
             whole covariance, :class:`resample.PositionMap`) through their LinearNorm: the attention
             rule with T/s² queries over T keys
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.attention import Attention
from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.field import _DT
from gatepool.analysis.probe.correlated.norms import BatchNorm
from gatepool.analysis.probe.correlated.registry import register_named_rule, rule_for
from gatepool.analysis.probe.correlated.resample import PositionMap
from gatepool.analysis.probe.correlated.steps import Steps


def _gain(bn: BatchNorm, channels: int) -> torch.Tensor:
    """(C,) a = γ/σ of a BatchNorm step at the statistics of its last forward (ones before any)."""
    norm = getattr(bn, "norm", None)
    if norm is not None:  # the batch's own statistics
        gam = torch.ones(channels, dtype=_DT) if norm.gamma is None else norm.gamma
        return gam / norm.sigma2.clamp_min(1e-300).sqrt()
    a = getattr(bn, "a", None)
    return torch.ones(channels, dtype=_DT) if a is None else a[:, 0, 0]


class LinearNorm(Steps):
    """A Linear over the channels of (N, T, C) tokens then a BatchNorm over the batch and the tokens."""

    takes_tokens = True  # the walk: a step of (N, T, C) tokens

    def __init__(self, weight: torch.Tensor, bn: BatchNorm) -> None:
        super().__init__(Conv(weight.detach()[:, :, None, None], None, (1, 1), (0, 0)), bn)

    @property
    def W(self) -> torch.Tensor:
        """(C_out, C_in, 1, 1): the affine map's weight diag(a) W at the last forward's statistics."""
        conv, bn = self.steps
        return conv.W * _gain(bn, conv.W.shape[0])[:, None, None, None]


class _Then(Steps):
    """Steps ending in a :class:`LinearNorm` (an activation, then it): its weight is the LinearNorm's."""

    @property
    def W(self) -> torch.Tensor:
        return self.steps[-1].W


def linear_norm(m: nn.Module, rows=None) -> LinearNorm:
    """timm's ``LinearNorm`` (``m.linear``, ``m.bn``), or the output channels ``rows`` of it (an index)."""
    bn = m.bn
    rows = torch.arange(m.linear.out_features) if rows is None else torch.as_tensor(rows)
    running = not bn.training and bn.running_var is not None

    def pick(t):
        return None if t is None else t.detach()[rows]

    step = BatchNorm(
        pick(bn.weight) if bn.affine else None,
        pick(bn.bias) if bn.affine else None,
        bn.eps,
        pick(bn.running_mean) if running else None,
        pick(bn.running_var) if running else None,
    )
    return LinearNorm(m.linear.weight.detach()[rows], step)


def _head_rows(heads: int, widths: list[int]) -> list[torch.Tensor]:
    """The channels of each part when every head's channels are its parts' (``widths``) one after another:
    part i of head h at h·Σw + Σ_{j<i} w_j …"""
    width = sum(widths)
    starts = [sum(widths[:i]) for i in range(len(widths))]
    return [
        torch.cat([torch.arange(h * width + s, h * width + s + w) for h in range(heads)])
        for s, w in zip(starts, widths)
    ]


def _check(m: nn.Module) -> None:
    if getattr(m, "use_conv", False):
        raise NotImplementedError(f"LeViT {type(m).__name__} on a map (use_conv): the token form only")
    if bool(m.attention_biases.detach().any()):
        raise NotImplementedError(f"LeViT {type(m).__name__} with a position bias that is not zero")
    if not isinstance(m.proj, nn.Sequential) or list(dict(m.proj.named_children())) != ["act", "ln"]:
        raise NotImplementedError(f"LeViT {type(m).__name__} whose proj is not (act, ln)")


def _proj(m: nn.Module) -> _Then:
    make = rule_for(m.proj.act)
    if make is None:
        raise NotImplementedError(f"no correlated rule for {type(m.proj.act).__name__}")
    return _Then(make(m.proj.act), linear_norm(m.proj.ln))


@register_named_rule("timm.models.levit.LinearNorm")
def linear_norm_rule(m: nn.Module) -> LinearNorm:
    return linear_norm(m)


@register_named_rule("timm.models.levit.Attention")
def levit_attention_rule(m: nn.Module) -> Attention:
    """timm's LeViT ``Attention``: the qkv LinearNorm read head by head, Hardswish and a LinearNorm out."""
    _check(m)
    h, dk, dv = m.num_heads, m.key_dim, m.val_dim
    q, k, v = (linear_norm(m.qkv, rows) for rows in _head_rows(h, [dk, dk, dv]))
    return Attention.of(q, k, v, _proj(m), h, m.scale)


class Subsample(PositionMap):
    """Tokens of an (H, W) map, row-major, to those of its positions (i·s, j·s): ``x.view(B, H, W, C)[:,
    ::s, ::s].reshape(B, −1, C)``."""

    def __init__(self, hw: tuple[int, int], stride: int) -> None:
        H, W = hw
        keep = torch.arange(H * W).reshape(H, W)[::stride, ::stride]
        super().__init__(torch.eye(H * W, dtype=_DT)[keep.flatten()], (1, keep.numel()))


@register_named_rule("timm.models.levit.AttentionDownsample")
def levit_attention_downsample_rule(m: nn.Module) -> Attention:
    """timm's LeViT ``AttentionDownsample``: keys and values from the kv LinearNorm read head by head, the
    queries the subsampled tokens' LinearNorm (its heads one after another), Hardswish and a LinearNorm
    out."""
    _check(m)
    down = m.q.down
    if getattr(down, "pool", None) is not None:
        raise NotImplementedError("LeViT AttentionDownsample with an average pool (use_pool)")
    h, dk, dv = m.num_heads, m.key_dim, m.val_dim
    k, v = (linear_norm(m.kv, rows) for rows in _head_rows(h, [dk, dv]))
    queries = Subsample(tuple(down.resolution), down.stride)
    return Attention.of(linear_norm(m.q.ln), k, v, _proj(m), h, m.scale, queries=queries)
