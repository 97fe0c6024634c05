"""A re-parameterisable block (timm's MobileOne, RepVGG and FastViT blocks at training time): parallel
branches of one input, each a conv and a BatchNorm (and a BatchNorm alone: the identity branch), added,
then the activation. The branches are functions of one tensor, so their sum is not that of independent
terms (a depthwise conv's few taps make the cross terms large at one init): it is one conv.

fold      BN_b(conv_b(x)) = a_b conv_b(x) + c_b, a_b = γ_b/σ_b, c_b = β_b − a_b µ_b (per channel), with
          µ_b and σ_b² the branch's batch statistics at their expectation (training: the conv's predicted
          output, µ = mean_p m, σ² = mean_p (v + m²) − µ² + eps; eval: the running ones), so
          Σ_b BN_b(conv_b(x)) = conv(x, Σ_b a_b W_b) + Σ_b c_b, the kernels centred in the largest
          (a 1×1 branch, the identity a 1×1 kernel δ_io)
forward   the folded conv's rule (:class:`conv.Conv`), then the squeeze-and-excitation's
          (:mod:`squeeze_excite`) and the activation's
backward  the same steps back (the BatchNorms' divisors as constants: their fluctuation over B·H·W
          values and the gradient's projections on their means and on x̂ left out)

FastViT's ``RepMixer`` ``x + γ (mixer(x) − norm(x))`` (two such blocks without activation and a layer
scale γ) is the fold of δ + γ (mixer's − norm's) kernels: registered (its branch scaled by γ = 1e-5 at
init, the projections left out are of that). A block whose activation gates on the sum (MobileOne,
RepVGG) is not: the ReLU makes the gradient correlated with each branch's x̂, whose projection the
walk's own BatchNorm rule carries (``yy``) and the fold does not (MobileOne-S0's first stage 1.4–1.5×
high backward); traced, such blocks keep it (``Reparam(_branches(m), act=_act(m))`` is the fold, for a
block where that projection is small).

RepViT's token mixer ``bn(conv(x) + conv1(x) + x)`` (a depthwise conv and its BatchNorm, a 1 × 1 depthwise
conv with a bias and no norm, the identity) is the fold of its three terms, then the BatchNorm of their sum
(the walk's rule, over the batch's statistics): registered. Taken as independent terms, the sum's variance
misses the terms' covariances (1 × 1 and identity are the same map of x up to a scale), so the BatchNorm
after it divides by the wrong σ, per channel.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.registry import register_named_rule, rule_for
from gatepool.analysis.probe.correlated.squeeze_excite import SqueezeExcite
from gatepool.analysis.probe.correlated.steps import Steps


def _conv_of(m: nn.Module):
    """(weight, stride, padding, groups) of a plain zero-padded Conv2d."""
    if type(m) is not nn.Conv2d or m.padding_mode != "zeros" or tuple(m.dilation) != (1, 1):
        raise NotImplementedError(f"a re-parameterisable branch's {type(m).__name__}: a plain Conv2d only")
    if isinstance(m.padding, str):
        raise NotImplementedError("a re-parameterisable branch's conv padded by name")
    return m.weight, tuple(m.stride), tuple(m.padding), m.groups, m.bias


def _bn_of(m: nn.Module) -> nn.BatchNorm2d:
    """The BatchNorm of a branch, whose timm norm-act must apply nothing after it."""
    if not isinstance(m, nn.BatchNorm2d):
        raise NotImplementedError(f"a re-parameterisable branch's norm {type(m).__name__}")
    for part in (getattr(m, "drop", None), getattr(m, "act", None)):
        if part is not None and not isinstance(part, nn.Identity):
            raise NotImplementedError("a re-parameterisable branch's norm with an activation")
    return m


def _affine(bn: nn.BatchNorm2d, f: Field) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, c): BN(y) = a y + c per channel, from the predicted field ``f`` of y (training) or the running
    statistics (eval)."""
    if bn.training or bn.running_var is None:
        mu = f.mean.mean((1, 2))
        sigma2 = (f.var + f.mean**2).mean((1, 2)) - mu * mu + bn.eps
    else:
        mu, sigma2 = bn.running_mean.to(_DT), bn.running_var.to(_DT) + bn.eps
    g = bn.weight.detach().to(_DT) if bn.affine else torch.ones_like(mu)
    b = bn.bias.detach().to(_DT) if bn.affine else torch.zeros_like(mu)
    a = g / sigma2.clamp_min(1e-300).sqrt()
    return a, b - a * mu


class Reparam:
    """Σ_b BN_b(conv_b(x)) (+ BN(x)), each branch a (conv, bn), (conv, None) or (None, bn), times
    ``scale`` per channel and plus ``x`` where ``residual`` (FastViT's RepMixer), as one conv, then
    ``act`` (a step or None)."""

    def __init__(self, branches: list, signs: list[float] | None = None, scale=None, residual: bool = False,
                 act=None) -> None:  # fmt: skip
        if not branches:
            raise NotImplementedError("a re-parameterisable block without branches")
        self.branches, self.signs = branches, signs or [1.0] * len(branches)
        self.scale = None if scale is None else scale.detach().to(_DT).flatten()
        self.residual, self.act = residual, act

    def forward(self, x: Field) -> Field:
        convs = [_conv_of(c) for c, _ in self.branches if c is not None]
        if not convs:
            raise NotImplementedError("a re-parameterisable block of identity branches only")
        (Co, ci_g), groups = convs[0][0].shape[:2], convs[0][3]
        stride, reach = convs[0][1], {(w.shape[-1] - 1) // 2 - p[1] for w, _, p, _, _ in convs}
        reach |= {(w.shape[-2] - 1) // 2 - p[0] for w, _, p, _, _ in convs}
        if any(c[1] != stride or c[3] != groups for c in convs) or len(reach) != 1:
            raise NotImplementedError("re-parameterisable branches of unlike strides, groups or centres")
        k = max(max(w.shape[-2:]) for w, *_ in convs)
        W, bias = torch.zeros((Co, ci_g, k, k), dtype=_DT), torch.zeros(Co, dtype=_DT)
        for (conv, bn), sign in zip(self.branches, self.signs):
            if conv is None:  # the identity: a 1×1 kernel δ_io through its BatchNorm
                if stride != (1, 1) or Co != x.shape[0] or Co != ci_g * groups:
                    raise NotImplementedError("an identity branch of a block that changes the map")
                w = torch.zeros((Co, ci_g, 1, 1), dtype=_DT)
                w[torch.arange(Co), torch.arange(Co) % ci_g] = 1.0
                f = x
            else:
                w0, s, p, g, b0 = _conv_of(conv)
                w = w0.detach().to(_DT)
                f = Conv(w0, b0, s, p, g).forward(x)
                if b0 is not None:
                    bias += sign * (1.0 if bn is None else _affine(_bn_of(bn), f)[0]) * b0.detach().to(_DT)
            if bn is None:  # a conv without a norm (RepViT's 1×1): its own weights
                a, c = torch.ones(Co, dtype=_DT), torch.zeros(Co, dtype=_DT)
            else:
                a, c = _affine(_bn_of(bn), f)
            kh, kw = w.shape[-2:]
            oh, ow = (k - kh) // 2, (k - kw) // 2
            W[:, :, oh : oh + kh, ow : ow + kw] += sign * a[:, None, None, None] * w
            bias += sign * c
        if self.scale is not None:
            W, bias = W * self.scale[:, None, None, None], bias * self.scale
        if self.residual:
            if stride != (1, 1) or Co != x.shape[0]:
                raise NotImplementedError("a residual around a block that changes the map")
            W[torch.arange(Co), torch.arange(Co) % ci_g, k // 2, k // 2] += 1.0
        pad = (k - 1) // 2 - next(iter(reach))
        conv = Conv(W, bias, stride, (pad, pad), groups)
        self.steps = Steps(conv, self.act) if self.act is not None else conv
        return self.steps.forward(x)

    def backward(self, g: Field) -> Field:
        return self.steps.backward(g)


def _act(m: nn.Module):
    """The steps after the branches' sum (None for none): the block's squeeze-and-excitation (timm's
    ``SEModule``), its activation."""
    steps = []
    for name in ("attn", "se"):
        part = getattr(m, name, None)
        if part is None or isinstance(part, nn.Identity):
            continue
        if type(part).__name__ != "SEModule":
            raise NotImplementedError(f"a re-parameterisable block with {name} {type(part).__name__}")
        steps.append(SqueezeExcite(part))
    act = getattr(m, "act", None)
    if act is not None and not isinstance(act, nn.Identity):
        make = rule_for(act)
        if make is None:
            raise NotImplementedError(f"no correlated rule for {type(act).__name__}")
        steps.append(make(act))
    return None if not steps else steps[0] if len(steps) == 1 else Steps(*steps)


def _branches(m: nn.Module) -> list:
    """MobileOneBlock's and RepVggBlock's branches: (conv, bn) pairs and (None, bn) for the identity."""
    if getattr(m, "reparam_conv", None) is not None:
        raise NotImplementedError("a re-parameterised block: its conv's rule")
    for name in ("drop_path", "drop_block"):
        part = getattr(m, name, None)
        if part is not None and not isinstance(part, nn.Identity):
            raise NotImplementedError(f"a re-parameterisable block with {name}")
    out = []
    for name in ("conv_kxk", "conv_scale", "conv_1x1", "identity"):
        part = getattr(m, name, None)
        if part is None:
            continue
        for p in part if isinstance(part, nn.ModuleList) else [part]:
            out.append((None, p) if isinstance(p, nn.BatchNorm2d) else (p.conv, p.bn))
    return out


@register_named_rule("timm.models.fastvit.RepMixer")
def repmixer_rule(m: nn.Module) -> Reparam:
    """FastViT's ``RepMixer``: ``x + γ (mixer(x) − norm(x))``, mixer and norm MobileOne blocks without
    activation, γ the layer scale's (C, 1, 1)."""
    if getattr(m, "reparam_conv", None) is not None:
        raise NotImplementedError("a re-parameterised RepMixer: its conv's rule")
    if _act(m.mixer) is not None or _act(m.norm) is not None:
        raise NotImplementedError("a RepMixer whose blocks have an activation")
    mixer, norm = _branches(m.mixer), _branches(m.norm)
    gamma = getattr(m.layer_scale, "gamma", None)
    if gamma is None:
        raise NotImplementedError("a RepMixer without its layer scale's gamma")
    signs = [1.0] * len(mixer) + [-1.0] * len(norm)
    return Reparam(mixer + norm, signs, scale=gamma, residual=True)


@register_named_rule("timm.models.repvit.RepVggDw")
def repvggdw_rule(m: nn.Module):
    """RepViT's token mixer ``bn(conv(x) + conv1(x) + x)``: a depthwise conv and its BatchNorm, a 1 × 1
    depthwise conv (with its own BatchNorm where ``legacy``) and the identity, folded into one depthwise
    conv, then the BatchNorm after their sum (the walk's, over the batch's statistics)."""
    conv1 = (m.conv1.c, m.conv1.bn) if isinstance(m.conv1, nn.Sequential) else (m.conv1, None)
    fold = Reparam([(m.conv.c, m.conv.bn), conv1], residual=True)
    make = rule_for(m.bn)
    if make is None:
        raise NotImplementedError(f"RepVggDw: no correlated rule for {type(m.bn).__name__}")
    return Steps(fold, make(m.bn))
